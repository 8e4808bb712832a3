//! Compact locks while tokens run ahead of the clock. After a start or a promotion the token
//! mark is raised a margin (a day by default) above the wall clock (G3), and tokens count up
//! from it; the lock's block measures them from a token anchor instead of the clock, so that a
//! held lock keeps its one small allocation (docs/MEMORY.md). What these tests hold: every
//! grant reads back exactly (owner, token) on the master and on its replica, across DEBUG
//! RELOAD and across a promotion that raises the mark again, the copies agree (DEBUG DIGEST),
//! and a held lock costs what it costs with tokens at the clock.

use flock_testkit::*;
use std::time::{Duration, Instant};

const OWNER: &str = "01234567-89ab-4def-8123-456789abcdef";

fn memory_usage(c: &mut redis::Connection, key: &str) -> i64 {
    call(c, &["MEMORY", "USAGE", key])
        .int()
        .unwrap_or_else(|| panic!("MEMORY USAGE {key}"))
}

fn wall_us(c: &mut redis::Connection) -> i64 {
    let t: Vec<String> = redis::cmd("TIME").query(c).expect("TIME");
    let secs: i64 = t[0].parse().expect("secs");
    let us: i64 = t[1].parse().expect("us");
    secs * 1_000_000 + us
}

fn digest(c: &mut redis::Connection) -> String {
    call(c, &["DEBUG", "DIGEST"])
        .string()
        .unwrap_or_else(|| panic!("DEBUG DIGEST"))
}

/// `n` locks `p0..`, each checked to read back with its own token.
fn take(c: &mut redis::Connection, prefix: &str, n: usize) -> Vec<(String, i64)> {
    (0..n)
        .map(|i| {
            let key = format!("{prefix}{i:05}");
            let t = grant(c, &key, OWNER, 600_000);
            (key, t)
        })
        .collect()
}

fn assert_held(c: &mut redis::Connection, locks: &[(String, i64)], what: &str) {
    for (key, t) in locks {
        let (owner, token, _) = held(c, key);
        assert_eq!(owner, OWNER, "{what}: owner of {key}");
        assert_eq!(token, *t, "{what}: token of {key}");
        assert!(check(c, key, *t) > 0, "{what}: CHECK {key} {t}");
    }
}

#[test]
fn locks_taken_while_tokens_run_ahead_read_back_exactly_and_stay_small() {
    // Started first: with a 1 ms margin its tokens reach the clock once the 2^24 us allowance
    // is behind it (17 s), while the rest of the test runs; its lock is the size reference.
    let near = Server::builder()
        .arg("flock.promotion-margin-ms", "1")
        .start();
    let near_started = Instant::now();
    let m = Server::start();
    let mut mc = m.conn();

    let first = grant(&mut mc, "probe", OWNER, 600_000);
    let ahead_us = first - wall_us(&mut mc);
    assert!(
        ahead_us > 80_000_000_000,
        "the mark is raised about a day above the clock at start: {ahead_us} us"
    );

    let locks = take(&mut mc, "a:", 2000);
    assert_held(&mut mc, &locks, "master");
    assert!(locks.windows(2).all(|w| w[0].1 < w[1].1), "tokens grow");

    // A replica: the grants arrive with the master's tokens, a day ahead of its clock too.
    let r = Server::start_replica_of(&m);
    let mut rc = r.conn();
    wait_replica(&mut mc);
    assert_held(&mut rc, &locks, "replica");
    let more = take(&mut mc, "b:", 500);
    wait_replica(&mut mc);
    assert_held(&mut rc, &more, "replica, replicated grants");
    assert_eq!(
        digest(&mut mc),
        digest(&mut rc),
        "master and replica agree (G7)"
    );

    // Reload: every grant comes back as it was.
    assert_eq!(
        call(&mut mc, &["DEBUG", "RELOAD"]).string().as_deref(),
        Some("OK")
    );
    assert_held(&mut mc, &locks, "master after DEBUG RELOAD");
    assert_held(&mut mc, &more, "master after DEBUG RELOAD");

    // A promotion raises the mark again: the replica's grants from before it read back
    // exactly, and the grants after it are above every earlier token.
    let promoted = call(&mut rc, &["REPLICAOF", "NO", "ONE"]);
    assert!(!promoted.is_err(), "REPLICAOF NO ONE: {promoted:?}");
    drop(mc);
    drop(m);
    let after = take(&mut rc, "c:", 500);
    let highest_before = more.iter().map(|l| l.1).max().unwrap_or(0);
    assert!(
        after.iter().all(|l| l.1 > highest_before),
        "tokens after the promotion are above every earlier one (G3)"
    );
    assert_held(&mut rc, &locks, "promoted replica, grants from before");
    assert_held(&mut rc, &more, "promoted replica, grants from before");
    assert_held(&mut rc, &after, "promoted replica, its own grants");
    // Renewing an old grant stores it again: it reads back as it was.
    for (key, t) in locks.iter().take(100) {
        assert!(renew(&mut rc, key, OWNER, 900_000).is_some(), "RENEW {key}");
        assert_eq!(held(&mut rc, key).1, *t, "token of {key} after RENEW");
    }

    // The size: a lock whose token is a day ahead (replicated, and made here after the
    // promotion) costs what a lock of the same key and owner lengths costs with tokens at the
    // clock.
    let mut nc = near.conn();
    let allowance = Duration::from_micros(1 << 24) + Duration::from_secs(1);
    if let Some(left) = allowance.checked_sub(near_started.elapsed()) {
        std::thread::sleep(left);
    }
    let near_token = grant(&mut nc, "a:00001", OWNER, 600_000);
    let lead = near_token - wall_us(&mut nc);
    assert!(
        lead < 1_000_000,
        "tokens at the clock on the reference server: {lead} us ahead"
    );
    let reference = memory_usage(&mut nc, "a:00001");
    assert_eq!(
        memory_usage(&mut rc, "a:00001"),
        reference,
        "a replicated lock"
    );
    assert_eq!(
        memory_usage(&mut rc, "c:00001"),
        reference,
        "a lock made after the promotion"
    );

    for (key, _) in locks.iter().chain(&more).chain(&after) {
        assert_eq!(release(&mut rc, key, OWNER), 1, "RELEASE {key}");
    }
}
