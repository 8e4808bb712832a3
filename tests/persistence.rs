//! G3/G7/G9 through persistence: RDB, AOF (with rewrite), DEBUG RELOAD, DUMP/RESTORE, COPY,
//! and leases that end while the server is down.

use flock_testkit::*;
use std::thread::sleep;
use std::time::{Duration, Instant};

/// Slack for comparing a remaining lease with what it must at most be (ms granularity, the
/// server's clock read a moment later than ours, ...).
const SLACK_MS: i64 = 50;

/// Issue a bunch of tokens (acquire/release cycles, some keys left held); returns the
/// largest token issued.
fn churn(c: &mut redis::Connection, n: usize) -> i64 {
    let mut max = 0;
    for i in 0..n {
        let key = format!("churn{}", i % 4);
        let t = grant(c, &key, "worker", 60_000);
        max = max.max(t);
        assert_eq!(release(c, &key, "worker"), 1);
    }
    max
}

/// A held lock (`held`, alice, 60 s) and a lock released after it (`rel`): the released one
/// has the largest token. Returns (held token, when the grant's reply arrived, largest token
/// issued). The reply comes after the server granted: the lease ends at most `ttl` after it.
fn setup_locks(c: &mut redis::Connection) -> (i64, Instant, i64) {
    let mut max = churn(c, 20);
    let t_held = grant(c, "held", "alice", 60_000);
    let at = Instant::now();
    max = max.max(t_held);
    let t_rel = grant(c, "rel", "bob", 60_000);
    assert_eq!(release(c, "rel", "bob"), 1);
    max = max.max(t_rel);
    (t_held, at, max)
}

/// After a reload: `held` is alice's with the same token and a lease that kept running.
/// `at`: taken after the reply of the grant (or renew) that set the lease, so the deadline is
/// at most `at + ttl`; the elapsed time is read before INFO is sent, so the server's reading
/// is later than ours. Neither a slow grant nor a slow INFO reply on a loaded machine can
/// then eat into SLACK_MS.
#[track_caller]
fn assert_held_survived(c: &mut redis::Connection, t_held: i64, at: Instant, ttl: i64, what: &str) {
    let max_left = ttl - at.elapsed().as_millis() as i64 + SLACK_MS;
    let i = info(c, "held").unwrap_or_else(|| panic!("{what}: held lock lost"));
    assert_eq!(
        i.owner.as_deref(),
        Some(b"alice".as_slice()),
        "{what}: owner"
    );
    assert_eq!(i.token, t_held, "{what}: token");
    assert!(
        i.ttl >= 1 && i.ttl <= max_left,
        "{what}: remaining lease {} ms, expected <= {max_left} (absolute deadline kept)",
        i.ttl
    );
    assert!(
        i.ttl >= max_left - 10_000,
        "{what}: remaining lease {} ms far below {max_left}",
        i.ttl
    );
    assert!(
        check(c, "held", t_held) >= 1,
        "{what}: CHECK of the held token"
    );
    assert_eq!(
        acquire(c, "held", "bob", 1000),
        None,
        "{what}: another owner got a held lock"
    );
    assert_eq!(
        acquire(c, "held", "alice", 60_000),
        Some(t_held),
        "{what}: holder's retry must return the same token"
    );
}

/// After a reload: released locks stay released and new grants exceed every earlier token.
#[track_caller]
fn assert_tokens_above(c: &mut redis::Connection, max_before: i64, what: &str) {
    assert_eq!(exists(c, "rel"), 0, "{what}: released lock came back");
    let t1 = grant(c, "rel", "carol", 10_000);
    assert!(
        t1 > max_before,
        "{what}: grant on released key {t1} not > {max_before}"
    );
    let t2 = grant(c, "fresh", "carol", 10_000);
    assert!(t2 > t1, "{what}: grant on new key {t2} not > {t1}");
    for i in 0..4 {
        let key = format!("churn{i}");
        let t = grant(c, &key, "dave", 10_000);
        assert!(t > max_before, "{what}: {key}: {t} not > {max_before}");
    }
}

#[test]
fn rdb_save_and_restart() {
    let mut srv = Server::start();
    let mut c = srv.conn();
    let (t_held, at, max) = setup_locks(&mut c);
    assert_eq!(call(&mut c, &["SAVE"]).string().as_deref(), Some("OK"));
    sleep(Duration::from_millis(1000));
    srv.restart(); // SIGKILL: only the RDB from SAVE remains
    let mut c = srv.conn();
    assert_held_survived(&mut c, t_held, at, 60_000, "RDB restart");
    assert_tokens_above(&mut c, max, "RDB restart");
}

#[test]
fn rdb_shutdown_save_and_restart() {
    let mut srv = Server::start();
    let mut c = srv.conn();
    let (t_held, at, max) = setup_locks(&mut c);
    srv.shutdown_save();
    sleep(Duration::from_millis(500));
    srv.start_again();
    let mut c = srv.conn();
    assert_held_survived(&mut c, t_held, at, 60_000, "SHUTDOWN SAVE restart");
    assert_tokens_above(&mut c, max, "SHUTDOWN SAVE restart");
}

#[test]
fn rdb_keeps_token_high_water_when_no_lock_is_held() {
    // every lock released before the save: only server-wide state can carry the mark
    let mut srv = Server::start();
    let mut c = srv.conn();
    let max = churn(&mut c, 30);
    assert_eq!(dbsize(&mut c), 0);
    assert_eq!(call(&mut c, &["SAVE"]).string().as_deref(), Some("OK"));
    srv.restart();
    let mut c = srv.conn();
    for i in 0..4 {
        let t = grant(&mut c, &format!("churn{i}"), "w", 10_000);
        assert!(t > max, "grant after RDB restart {t} not > {max}");
    }
}

fn aof_server() -> Server {
    Server::builder()
        .arg("appendonly", "yes")
        .arg("appendfsync", "always")
        .start()
}

#[test]
fn aof_restart_with_rewrite() {
    let mut srv = aof_server();
    let mut c = srv.conn();
    // before the rewrite
    let (t_held, at, mut max) = setup_locks(&mut c);
    let t_gone = grant(&mut c, "gone-after-rewrite", "erin", 60_000);
    rewrite_aof(&mut c);
    // after the rewrite: new grants, a release and a renew in the incremental AOF
    assert_eq!(release(&mut c, "gone-after-rewrite", "erin"), 1);
    let t_held2 = grant(&mut c, "held2", "frank", 40_000);
    let at2 = Instant::now();
    max = max.max(t_held2).max(t_gone);
    assert_eq!(renew(&mut c, "held", "alice", 50_000), Some(t_held));
    let at_renew = Instant::now();
    max = max.max(churn(&mut c, 10));
    sleep(Duration::from_millis(1000));
    srv.restart(); // SIGKILL; appendfsync always
    let mut c = srv.conn();
    assert_held_survived(
        &mut c,
        t_held,
        at_renew,
        50_000,
        "AOF restart (renewed lock)",
    );
    let _ = at;
    let max_left = 40_000 - at2.elapsed().as_millis() as i64 + SLACK_MS;
    let i = info(&mut c, "held2").expect("held2 lost after AOF restart");
    assert_eq!(
        (i.owner.as_deref(), i.token),
        (Some(b"frank".as_slice()), t_held2),
        "held2 after AOF restart"
    );
    assert!(
        i.ttl <= max_left,
        "held2 lease {} > {max_left}: AOF replay restarted the lease",
        i.ttl
    );
    assert_eq!(
        exists(&mut c, "gone-after-rewrite"),
        0,
        "released lock came back from the AOF"
    );
    assert_tokens_above(&mut c, max, "AOF restart");
}

#[test]
fn aof_holds_effects_not_clock_dependent_commands() {
    // G7: the AOF must carry the effect (FLOCK.APPLY with owner/token/deadline), never the
    // client's ACQUIRE/RENEW whose outcome depends on the clock at replay time
    let srv = aof_server();
    let mut c = srv.conn();
    grant(&mut c, "a", "alice", 60_000);
    renew(&mut c, "a", "alice", 30_000).expect("renew");
    grant(&mut c, "b", "bob", 60_000);
    release(&mut c, "b", "bob");
    let aof = srv.aof_bytes();
    assert!(!aof.is_empty(), "no AOF written; files: {:?}", srv.files());
    for cmd in ["FLOCK.ACQUIRE", "FLOCK.RENEW", "FLOCK.RELEASE"] {
        assert!(
            !contains_bytes(&aof, cmd.as_bytes()),
            "AOF contains {cmd} verbatim"
        );
    }
    rewrite_aof(&mut c);
    let aof = srv.aof_bytes();
    assert!(
        !contains_bytes(&aof, b"FLOCK.ACQUIRE"),
        "rewritten AOF contains FLOCK.ACQUIRE"
    );
}

#[test]
fn aof_loaded_token_raises_the_high_water_mark() {
    // A hand-written AOF holding a grant whose token lies far above the clock: after loading
    // it, every new grant must be above it (G3: every token loaded raises the mark).
    let mut srv = Server::start();
    srv.stop();
    let big = now_us() + 10_000_000_000_000; // ~115 days of microseconds ahead
    assert!(big < TWO_POW_53);
    let deadline = now_ms() + 600_000;
    let mut aof = resp_command(&["SELECT", "0"]);
    aof.extend(resp_command(&[
        "FLOCK.APPLY",
        "forged",
        "GRANT",
        "mallory",
        &big.to_string(),
        &deadline.to_string(),
    ]));
    std::fs::write(srv.dir().join("appendonly.aof"), aof).expect("write AOF");
    srv.set_arg("appendonly", "yes");
    srv.start_again();
    let mut c = srv.conn();
    let i = info(&mut c, "forged").unwrap_or_else(|| {
        panic!(
            "lock from the hand-written AOF not loaded (old-style AOF upgrade?)\n{}",
            srv.log_tail(30)
        )
    });
    assert_eq!(
        (i.owner.as_deref(), i.token),
        (Some(b"mallory".as_slice()), big)
    );
    let t = grant(&mut c, "other", "o", 10_000);
    assert!(t > big, "grant after loading token {big} got {t}");
    assert!(t < TWO_POW_53);
}

#[test]
fn debug_reload_keeps_locks() {
    let srv = Server::start();
    let mut c = srv.conn();
    let (t_held, at, max) = setup_locks(&mut c);
    let r = call(&mut c, &["DEBUG", "RELOAD"]);
    assert_eq!(r.string().as_deref(), Some("OK"), "DEBUG RELOAD: {r:?}");
    assert_held_survived(&mut c, t_held, at, 60_000, "DEBUG RELOAD");
    assert_tokens_above(&mut c, max, "DEBUG RELOAD");
}

#[test]
fn dump_restore_same_and_other_server() {
    let srv = Server::start();
    let mut c = srv.conn();
    let t = grant(&mut c, "held", "alice", 60_000);
    let at = Instant::now(); // after the grant's reply: the lease ends by at + 60 s
    let payload = call(&mut c, &["DUMP", "held"]);
    let payload = payload
        .bytes()
        .unwrap_or_else(|| panic!("DUMP: {payload:?}"))
        .to_vec();

    // same server, another key
    let r = call(&mut c, &[b"RESTORE".as_slice(), b"copy", b"0", &payload]);
    assert_eq!(r.string().as_deref(), Some("OK"), "RESTORE: {r:?}");
    let max_left = 60_000 - at.elapsed().as_millis() as i64 + SLACK_MS;
    let i = info(&mut c, "copy").expect("restored lock");
    assert_eq!(
        (i.owner.as_deref(), i.token),
        (Some(b"alice".as_slice()), t)
    );
    assert!(
        i.ttl >= 1 && i.ttl <= max_left,
        "restored ttl {} > {max_left}",
        i.ttl
    );
    assert_eq!(
        call(&mut c, &["TYPE", "copy"]).string().as_deref(),
        Some("flocklock")
    );
    assert_eq!(release(&mut c, "copy", "alice"), 1);
    let t2 = grant(&mut c, "copy", "bob", 10_000);
    assert!(
        t2 > t,
        "grant on restored key {t2} not > restored token {t}"
    );
    // RESTORE ... REPLACE over the new grant brings back the old grant; the next grant after
    // it must still exceed every token issued (t2)
    let r = call(
        &mut c,
        &[b"RESTORE".as_slice(), b"copy", b"0", &payload, b"REPLACE"],
    );
    assert_eq!(r.string().as_deref(), Some("OK"), "RESTORE REPLACE: {r:?}");
    assert_eq!(info(&mut c, "copy").map(|i| i.token), Some(t));
    assert_eq!(release(&mut c, "copy", "alice"), 1);
    let t3 = grant(&mut c, "copy", "carol", 10_000);
    assert!(t3 > t2, "grant after RESTORE REPLACE {t3} not > {t2}");

    // another server with the module
    let srv2 = Server::start();
    let mut c2 = srv2.conn();
    let r = call(&mut c2, &[b"RESTORE".as_slice(), b"held", b"0", &payload]);
    assert_eq!(
        r.string().as_deref(),
        Some("OK"),
        "RESTORE on server 2: {r:?}"
    );
    let i = info(&mut c2, "held").expect("restored lock on server 2");
    assert_eq!(
        (i.owner.as_deref(), i.token),
        (Some(b"alice".as_slice()), t)
    );
    assert!(check(&mut c2, "held", t) >= 1);
    assert_eq!(acquire(&mut c2, "held", "bob", 1000), None);
    assert_eq!(
        acquire(&mut c2, "held", "alice", 1000),
        Some(t),
        "holder's retry on server 2"
    );
    assert_eq!(release(&mut c2, "held", "alice"), 1);
    let t4 = grant(&mut c2, "held", "bob", 10_000);
    assert!(t4 > t, "grant on server 2 {t4} not > restored token {t}");
}

#[test]
fn restore_of_an_expired_lease_is_not_live() {
    let srv = Server::start();
    let mut c = srv.conn();
    let t = grant(&mut c, "short", "alice", 200);
    let payload = call(&mut c, &["DUMP", "short"])
        .bytes()
        .expect("DUMP")
        .to_vec();
    sleep(Duration::from_millis(500));
    let r = call(&mut c, &[b"RESTORE".as_slice(), b"back", b"0", &payload]);
    assert!(!r.is_err(), "RESTORE of an expired lease: {r:?}");
    assert_eq!(
        check(&mut c, "back", t),
        0,
        "restored expired lease is live"
    );
    let i = info(&mut c, "back");
    assert!(
        i.as_ref().map(|i| i.owner.is_none()).unwrap_or(true),
        "expired lease shows an owner: {i:?}"
    );
    let t2 = grant(&mut c, "back", "bob", 1000);
    assert!(t2 > t);
}

#[test]
fn copy_duplicates_the_lock() {
    let srv = Server::start();
    let mut c = srv.conn();
    let t = grant(&mut c, "held", "alice", 60_000);
    // Every server the suite runs on (Redis 7.0, Valkey 8.1 and 9.1) has COPY.
    let r = call(&mut c, &["COPY", "held", "held2"]);
    assert_eq!(r, Reply::Int(1), "COPY held held2");
    let i = info(&mut c, "held2").expect("copy");
    assert_eq!(
        (i.owner.as_deref(), i.token),
        (Some(b"alice".as_slice()), t)
    );
    assert!(i.ttl >= 1 && i.ttl <= 60_000);
    assert_eq!(
        call(&mut c, &["TYPE", "held2"]).string().as_deref(),
        Some("flocklock")
    );
    // the copy is independent of the original
    assert_eq!(release(&mut c, "held2", "alice"), 1);
    assert_eq!(exists(&mut c, "held2"), 0);
    let (o, tok, _) = held(&mut c, "held");
    assert_eq!(
        (o.as_str(), tok),
        ("alice", t),
        "original after releasing the copy"
    );
    let t2 = grant(&mut c, "held2", "bob", 10_000);
    assert!(t2 > t);
    // COPY over an existing lock needs REPLACE
    let r = call(&mut c, &["COPY", "held", "held2"]);
    assert_eq!(
        r,
        Reply::Int(0),
        "COPY onto an existing key without REPLACE"
    );
    assert_eq!(info(&mut c, "held2").map(|i| i.token), Some(t2));
    let r = call(&mut c, &["COPY", "held", "held2", "REPLACE"]);
    assert_eq!(r, Reply::Int(1));
    assert_eq!(info(&mut c, "held2").map(|i| i.token), Some(t));
}

fn assert_expired_while_down(srv: &mut Server, persist: impl FnOnce(&mut redis::Connection)) {
    let mut c = srv.conn();
    let t_short = grant(&mut c, "short", "alice", 1500);
    let t_long = grant(&mut c, "long", "bob", 60_000);
    persist(&mut c);
    srv.stop();
    sleep(Duration::from_millis(2000));
    srv.start_again();
    let mut c = srv.conn();
    assert_eq!(
        check(&mut c, "short", t_short),
        0,
        "lease that ended while down is live"
    );
    let i = info(&mut c, "short");
    assert!(
        i.as_ref().map(|i| i.owner.is_none()).unwrap_or(true),
        "ended lease shows an owner: {i:?}"
    );
    assert_eq!(exists(&mut c, "short"), 0, "ended lease still a key");
    assert_eq!(
        renew(&mut c, "short", "alice", 10_000),
        None,
        "RENEW revived a lease that ended while down"
    );
    let t = grant(&mut c, "short", "carol", 10_000);
    assert!(t > t_long, "grant after restart {t} not > {t_long}");
    assert_eq!(held(&mut c, "long").1, t_long);
}

#[test]
fn lease_ending_while_down_is_gone_after_rdb_restart() {
    let mut srv = Server::start();
    assert_expired_while_down(&mut srv, |c| {
        assert_eq!(call(c, &["SAVE"]).string().as_deref(), Some("OK"));
    });
}

#[test]
fn lease_ending_while_down_is_gone_after_aof_restart() {
    let mut srv = aof_server();
    assert_expired_while_down(&mut srv, |_| {});
}
