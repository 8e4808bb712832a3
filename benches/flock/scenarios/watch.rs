//! Scenario 8: FLOCK.WATCH against FLOCK.ACQUIRE ... BLOCK: how fast one watcher is told of a
//! release against how fast one waiter is granted by it (from the RELEASE sent to the reply
//! read, alternated round by round), how fast 1,000 watchers of one key are all told (first
//! and last reply), how fast 10,000 watchers of 10,000 keys are told by one pipeline of
//! 10,000 RELEASEs (against the same pipeline with nobody watching), and what an idle watcher
//! costs in memory against an idle waiter (each a blocked connection less an idle one, from
//! settled used_memory on fresh servers: the median of several passes). Both include what
//! Redis keeps for any blocked module client (two temporary clients, some 35 KB), the same for
//! both; docs/MEMORY.md counts the module's own share struct by struct.

use crate::config::*;
use crate::format::*;
use crate::measure::*;
use crate::report::*;
use flock_testkit::*;
use std::io::{Read, Write};
use std::net::TcpStream;
use std::thread::sleep;
use std::time::{Duration, Instant};

const TTL: &str = "600000";

/// What a connection sends to block (or not), given its index.
type Send<'a> = &'a dyn Fn(usize, &mut RawConn);

fn stat(c: &mut RawConn, name: &str) -> i64 {
    info_i64(c, "flock", &format!("flock_{name}"))
}

/// Wait until `name` in INFO flock reads `n`.
fn wait_stat(c: &mut RawConn, name: &str, n: i64) {
    let ok = poll_until(Duration::from_secs(60), || stat(c, name) == n);
    assert!(ok, "flock_{name} never reached {n}");
}

fn token(c: &mut RawConn, key: &str, owner: &str) -> String {
    match c.call(&["FLOCK.ACQUIRE", key, owner, TTL]) {
        Ok(Reply::Int(t)) => t.to_string(),
        other => panic!("ACQUIRE {key} {owner}: {other:?}"),
    }
}

/// One round: a holder's grant, then one client blocked on it (a watcher of the grant, or a
/// waiter for the key); µs from sending RELEASE to reading the blocked client's reply.
fn one_round(port: u16, c: &mut RawConn, watcher: bool) -> u64 {
    let t = token(c, "one", "holder");
    let mut b = RawConn::connect(port).expect("connect");
    if watcher {
        b.send(&["FLOCK.WATCH", "0", "one", &t]).expect("send");
        wait_stat(c, "watchers", 1);
    } else {
        b.send(&["FLOCK.ACQUIRE", "one", "next", TTL, "BLOCK", "0"])
            .expect("send");
        wait_stat(c, "blocked_clients", 1);
    }
    let t0 = Instant::now();
    c.send(&["FLOCK.RELEASE", "one", "holder"]).expect("send");
    let r = b.read_reply().expect("reply");
    let took = t0.elapsed().as_micros() as u64;
    assert!(
        matches!(r, Reply::Array(_) | Reply::Int(_)),
        "the blocked client's reply: {r:?}"
    );
    assert_eq!(c.read_reply().expect("RELEASE"), Reply::Int(1));
    if !watcher {
        assert_eq!(
            c.call(&["FLOCK.RELEASE", "one", "next"]).expect("RELEASE"),
            Reply::Int(1)
        );
    }
    took
}

/// `n` keys, each granted to `holder` (pipelined): their tokens.
fn grant_many(c: &mut RawConn, keys: &[String]) -> Vec<String> {
    for k in keys {
        c.send(&["FLOCK.ACQUIRE", k, "holder", TTL]).expect("send");
    }
    keys.iter()
        .map(|k| match c.read_reply() {
            Ok(Reply::Int(t)) => t.to_string(),
            other => panic!("ACQUIRE {k}: {other:?}"),
        })
        .collect()
}

/// A bare connection for one of many watchers: one socket, no read buffer (a RawConn holds
/// two descriptors and 64 KB each, too many for 10,000 of them under a 20,000 file limit).
fn bare(port: u16, args: &[&str]) -> TcpStream {
    let mut s = TcpStream::connect(("127.0.0.1", port)).expect("connect");
    s.set_nodelay(true).expect("nodelay");
    let mut out = format!("*{}\r\n", args.len());
    for a in args {
        out.push_str(&format!("${}\r\n{a}\r\n", a.len()));
    }
    s.write_all(out.as_bytes()).expect("send");
    s
}

/// Read one reply off a bare connection: a WATCH's `[key, event, owner, token]` is 8 lines
/// starting `*`, a granted ACQUIRE's token one line starting `:`.
fn bare_reply(s: &mut TcpStream, first: u8, lines: usize) -> Vec<u8> {
    let mut buf = Vec::with_capacity(128);
    let mut chunk = [0u8; 256];
    while buf.windows(2).filter(|w| w == b"\r\n").count() < lines {
        let n = s.read(&mut chunk).expect("read a blocked client's reply");
        assert!(n > 0, "a blocked client's connection closed: {buf:?}");
        buf.extend_from_slice(&chunk[..n]);
        assert!(
            buf[0] == first,
            "a blocked client's reply: {:?}",
            String::from_utf8_lossy(&buf)
        );
    }
    buf
}

/// Send a RELEASE of every key in one pipeline; (ms until the last reply was read, the
/// watchers' replies read one connection after the other: ms until the first and the last).
fn release_all(
    c: &mut RawConn,
    keys: &[String],
    blocked: &mut [TcpStream],
    watchers: bool,
) -> (f64, f64, f64) {
    let t0 = Instant::now();
    for k in keys {
        c.send(&["FLOCK.RELEASE", k, "holder"]).expect("send");
    }
    let mut first = None;
    for b in blocked.iter_mut() {
        if watchers {
            bare_reply(b, b'*', 8);
        } else {
            bare_reply(b, b':', 1);
        }
        first.get_or_insert(t0.elapsed());
    }
    let last_watcher = t0.elapsed();
    for k in keys {
        assert_eq!(
            c.read_reply().expect("RELEASE"),
            Reply::Int(1),
            "RELEASE {k}"
        );
    }
    let released = t0.elapsed();
    let ms = |d: Duration| d.as_secs_f64() * 1e3;
    (
        ms(released),
        ms(first.unwrap_or_default()),
        ms(last_watcher),
    )
}

/// `n` connections blocked as `send` makes them, once `name` in INFO flock reads `n`.
fn blocked(port: u16, c: &mut RawConn, n: usize, name: &str, send: Send<'_>) -> Vec<RawConn> {
    let mut conns = Vec::with_capacity(n);
    for i in 0..n {
        let mut b = RawConn::connect(port).expect("connect");
        send(i, &mut b);
        conns.push(b);
    }
    wait_stat(c, name, n as i64);
    conns
}

/// used_memory once it has settled: read after every connection has been idle for more than
/// 2 s and clientsCron has visited each since (it shrinks an idle connection's query buffer
/// then: 1,000 connections at hz 10 are all visited within a second), and modulesCron has
/// trimmed the pool of temporary clients (by half a second), until two reads a second apart
/// differ by less than 2 KB (2 B a connection).
fn settled_memory(c: &mut RawConn) -> f64 {
    sleep(Duration::from_millis(3500));
    let mut last = info_i64(c, "memory", "used_memory");
    for _ in 0..10 {
        sleep(Duration::from_secs(1));
        let now = info_i64(c, "memory", "used_memory");
        let still = (now - last).abs() < 2048;
        last = now;
        if still {
            break;
        }
    }
    last as f64
}

/// One pass on a fresh server (so that no table of the module, nor Redis's pool of temporary
/// clients, was grown before for either kind): bytes per connection of `m` idle PING
/// connections, then of `m` connections blocked by `send` until `name` in INFO flock reads
/// `m` (given the token of the holder's grant of `mem`), each from a settled used_memory to
/// a settled used_memory.
fn memory_pass(m: usize, name: &str, send: &dyn Fn(usize, &mut RawConn, &str)) -> (f64, f64) {
    let srv = Server::builder()
        .arg("maxclients", &(m + 1000).to_string())
        .start();
    let port = srv.port();
    let mut c = RawConn::connect(port).expect("connect");
    c.set_read_timeout(Duration::from_secs(60))
        .expect("timeout");
    let t = token(&mut c, "mem", "holder");
    let mut per = [0.0f64; 2];
    for (k, blocked) in [false, true].into_iter().enumerate() {
        let ok = poll_until(Duration::from_secs(30), || {
            info_i64(&mut c, "clients", "connected_clients") == 1
        });
        assert!(ok, "connections closed");
        let base = settled_memory(&mut c);
        let mut conns = Vec::with_capacity(m);
        for i in 0..m {
            let mut b = RawConn::connect(port).expect("connect");
            if blocked {
                send(i, &mut b, &t);
            } else {
                b.send(&["PING"]).expect("send");
            }
            conns.push(b);
        }
        if blocked {
            wait_stat(&mut c, name, m as i64);
        } else {
            for b in &mut conns {
                assert_eq!(b.read_reply().expect("PONG"), Reply::Status("PONG".into()));
            }
        }
        let after = settled_memory(&mut c);
        per[k] = (after - base) / m as f64;
        drop(conns);
    }
    (per[0], per[1])
}

/// The median of `v` (sorted in place).
fn median(v: &mut [f64]) -> f64 {
    v.sort_by(f64::total_cmp);
    match v.len() {
        0 => f64::NAN,
        n if n % 2 == 1 => v[n / 2],
        n => (v[n / 2 - 1] + v[n / 2]) / 2.0,
    }
}

/// Memory per idle watcher and per idle BLOCK waiter, each less an idle PING connection's
/// measured on the same server: the median of several passes, alternated, each on a fresh
/// server. (per watcher, per waiter, per connection.)
fn memory(cfg: &Cfg) -> (f64, f64, f64) {
    let m = 1_000;
    let passes = if cfg.quick { 3 } else { 5 };
    let (mut w, mut b, mut conn) = (Vec::new(), Vec::new(), Vec::new());
    for pass in 0..passes {
        for kind in 0..2 {
            // Alternated: watchers first in even passes, waiters first in odd ones.
            let watcher = (kind + pass) % 2 == 0;
            let (per_conn, per_blocked) = if watcher {
                memory_pass(m, "watchers", &|_, b, t| {
                    b.send(&["FLOCK.WATCH", "0", "mem", t]).expect("send")
                })
            } else {
                memory_pass(m, "blocked_clients", &|i, b, _| {
                    b.send(&[
                        "FLOCK.ACQUIRE",
                        "mem",
                        &format!("waiter-{i:06}"),
                        TTL,
                        "BLOCK",
                        "0",
                    ])
                    .expect("send")
                })
            };
            eprintln!(
                "    memory pass {pass}: {} {:.0} B per connection, {per_conn:.0} B per idle \
                 PING connection: {:.0} B net",
                if watcher { "watcher" } else { "waiter" },
                per_blocked,
                per_blocked - per_conn
            );
            conn.push(per_conn);
            if watcher {
                w.push(per_blocked - per_conn);
            } else {
                b.push(per_blocked - per_conn);
            }
        }
    }
    (median(&mut w), median(&mut b), median(&mut conn))
}

pub(crate) fn run(cfg: &Cfg, rep: &mut Report) {
    let rounds = if cfg.quick { 200 } else { 2_000 };
    let crowd = 1_000;
    let many = 10_000;
    crate::system::raise_nofile();
    eprintln!(
        "[8] watch: {rounds} rounds of one watcher / one waiter, {crowd} watchers of one key"
    );
    let srv = Server::builder()
        .arg("maxclients", &(many + 1000).to_string())
        .start();
    let port = srv.port();
    let mut c = RawConn::connect(port).expect("connect");
    c.set_read_timeout(Duration::from_secs(60))
        .expect("timeout");
    // Warm up (connections, allocator); not measured.
    for i in 0..20 {
        one_round(port, &mut c, i % 2 == 0);
    }
    let (mut told, mut granted) = (Vec::new(), Vec::new());
    for i in 0..rounds {
        if i % 2 == 0 {
            told.push(one_round(port, &mut c, true));
            granted.push(one_round(port, &mut c, false));
        } else {
            granted.push(one_round(port, &mut c, false));
            told.push(one_round(port, &mut c, true));
        }
    }
    told.sort_unstable();
    granted.sort_unstable();
    let (w50, w99) = (pct(&told, 0.5), pct(&told, 0.99));
    let (b50, b99) = (pct(&granted, 0.5), pct(&granted, 0.99));

    // 1,000 watchers of one grant, all told by one RELEASE.
    let t = token(&mut c, "crowd", "holder");
    let mut conns = blocked(port, &mut c, crowd, "watchers", &|_, b| {
        b.send(&["FLOCK.WATCH", "0", "crowd", &t]).expect("send")
    });
    let t0 = Instant::now();
    c.send(&["FLOCK.RELEASE", "crowd", "holder"]).expect("send");
    let mut first = None;
    for b in &mut conns {
        let r = b.read_reply().expect("reply");
        assert!(matches!(r, Reply::Array(_)), "a watcher's reply: {r:?}");
        first.get_or_insert(t0.elapsed());
    }
    let last = t0.elapsed();
    assert_eq!(c.read_reply().expect("RELEASE"), Reply::Int(1));
    drop(conns);
    wait_stat(&mut c, "watchers", 0);
    let first_ms = first.unwrap_or_default().as_secs_f64() * 1e3;
    let last_ms = last.as_secs_f64() * 1e3;

    // 10,000 watchers of 10,000 keys, one watcher per grant, all told by one pipeline of
    // RELEASEs; then the same pipeline with nobody watching (what the releases cost alone).
    let keys: Vec<String> = (0..many).map(|i| format!("many:{i:05}")).collect();
    let tokens = grant_many(&mut c, &keys);
    let mut conns = Vec::with_capacity(many);
    for (k, t) in keys.iter().zip(&tokens) {
        conns.push(bare(port, &["FLOCK.WATCH", "0", k, t]));
    }
    wait_stat(&mut c, "watchers", many as i64);
    let (many_released, many_first, many_last) = release_all(&mut c, &keys, &mut conns, true);
    drop(conns);
    wait_stat(&mut c, "watchers", 0);
    grant_many(&mut c, &keys);
    let (alone_released, _, _) = release_all(&mut c, &keys, &mut [], true);
    let many_rate = many as f64 / (many_last / 1e3);
    // The same with 10,000 BLOCK waiters of the 10,000 keys, each granted by its key's RELEASE.
    grant_many(&mut c, &keys);
    let mut conns = Vec::with_capacity(many);
    for k in &keys {
        conns.push(bare(port, &["FLOCK.ACQUIRE", k, "next", TTL, "BLOCK", "0"]));
    }
    wait_stat(&mut c, "blocked_clients", many as i64);
    let (wait_released, wait_first, wait_last) = release_all(&mut c, &keys, &mut conns, false);
    for k in &keys {
        c.send(&["FLOCK.RELEASE", k, "next"]).expect("send");
    }
    for _ in &keys {
        assert_eq!(c.read_reply().expect("RELEASE"), Reply::Int(1));
    }
    drop(conns);
    let wait_rate = many as f64 / (wait_last / 1e3);

    drop(srv);
    let (per_watcher, per_waiter, per_conn) = memory(cfg);
    eprintln!(
        "    one watcher told p50 {w50} µs p99 {w99} µs; one waiter granted p50 {b50} µs p99 {b99} µs; \
         {crowd} watchers: first {first_ms:.2} ms, last {last_ms:.2} ms; {many} watchers of {many} \
         keys: first {many_first:.2} ms, last {many_last:.2} ms ({many_rate:.0} replies/s; the \
         {many} RELEASEs answered in {many_released:.2} ms, {alone_released:.2} ms unwatched); \
         {many} BLOCK waiters of {many} keys: first {wait_first:.2} ms, last {wait_last:.2} ms \
         ({wait_rate:.0} replies/s; RELEASEs answered in {wait_released:.2} ms); \
         memory per idle watcher {per_watcher:.0} B, per idle waiter {per_waiter:.0} B (each a \
         blocked connection less an idle one, {per_conn:.0} B; watcher - waiter {:.0} B)",
        per_watcher - per_waiter
    );

    let sec = "8. WATCH";
    rep.check(
        sec,
        "one watcher told / one BLOCK waiter granted, p99 from RELEASE to reply",
        w99 as f64 / b99.max(1) as f64,
        Some(Goal::AtMost(1.25)),
    );
    rep.check(
        sec,
        "one watcher told, p99 from RELEASE to reply / 1 ms",
        w99 as f64 / 1000.0,
        Some(Goal::Below(1.0)),
    );
    rep.check(
        sec,
        "memory of an idle watcher / of an idle BLOCK waiter (each a blocked connection less an \
         idle one)",
        per_watcher / per_waiter.max(1.0),
        Some(Goal::AtMost(1.1)),
    );
    let rows = vec![
        vec![
            "one watcher told, from RELEASE to reply".to_string(),
            format!("p50 {w50} µs, p99 {w99} µs"),
        ],
        vec![
            "one BLOCK waiter granted, from RELEASE to reply".to_string(),
            format!("p50 {b50} µs, p99 {b99} µs"),
        ],
        vec![
            format!("{crowd} watchers of one grant, one RELEASE"),
            format!("first reply {first_ms:.2} ms, last {last_ms:.2} ms"),
        ],
        vec![
            format!("{many} watchers of {many} keys, one pipeline of {many} RELEASEs"),
            format!(
                "first reply {many_first:.2} ms, last {many_last:.2} ms ({many_rate:.0} replies/s); \
                 the RELEASEs answered in {many_released:.2} ms ({alone_released:.2} ms with \
                 nobody watching)"
            ),
        ],
        vec![
            format!("{many} BLOCK waiters of {many} keys, one pipeline of {many} RELEASEs"),
            format!(
                "first reply {wait_first:.2} ms, last {wait_last:.2} ms ({wait_rate:.0} replies/s); \
                 the RELEASEs answered in {wait_released:.2} ms"
            ),
        ],
        vec![
            "memory per idle watcher (a blocked connection less an idle one, median of fresh \
             servers)"
                .to_string(),
            format!("{per_watcher:.0} B"),
        ],
        vec![
            "memory per idle BLOCK waiter (the same)".to_string(),
            format!("{per_waiter:.0} B"),
        ],
        vec![
            "idle watcher - idle BLOCK waiter (the module's share and the command's argv: \
             Redis's blocked-client cost cancels out)"
                .to_string(),
            format!("{:.0} B", per_watcher - per_waiter),
        ],
    ];
    rep.section(
        sec,
        format!(
            "{rounds} rounds each, alternated; every reply read on its own connection (the \
             watchers' one after the other, from one thread: the last reply includes reading \
             the others).\n\n{}",
            table(&["what", "measured"], &rows)
        ),
    );
}
