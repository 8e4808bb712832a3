//! FLOCK.HOLDERS and FLOCK.INFO in every mode, and lock-delay per slot.

use super::helpers::*;
use flock_testkit::*;
use std::time::{Duration, Instant};

#[test]
fn holders_lists_live_grants_in_token_order_in_both_protocols() {
    let srv = Server::start();
    let mut c = srv.conn();
    assert_eq!(
        call(&mut c, &["FLOCK.HOLDERS", "none"]),
        Reply::Array(vec![])
    );
    call(&mut c, &["SET", "str", "v"]);
    assert_err_prefix(
        &call(&mut c, &["FLOCK.HOLDERS", "str"]),
        "WRONGTYPE",
        "HOLDERS of a string",
    );
    assert_err_prefix(
        &call(&mut c, &["FLOCK.HOLDERS"]),
        "ERR wrong number of arguments",
        "arity",
    );
    assert_err_prefix(
        &call(&mut c, &["FLOCK.HOLDERS", "a", "b"]),
        "ERR wrong number of arguments",
        "arity",
    );

    let ta = grant_kind(&mut c, "rw", "a", 10_000, &["SHARED"]);
    let tb = grant_kind(&mut c, "rw", "b", 20_000, &["SHARED"]);
    let tc = grant_kind(&mut c, "rw", "c", 30_000, &["SHARED"]);
    // RENEW and a repeat do not move a grant.
    assert_eq!(renew(&mut c, "rw", "a", 50_000), Some(ta));
    assert_eq!(grant_kind(&mut c, "rw", "b", 40_000, &["SHARED"]), tb);
    let h = holders(&mut c, "rw");
    assert_eq!(
        h.iter()
            .map(|(o, t, _)| (o.as_str(), *t))
            .collect::<Vec<_>>(),
        [("a", ta), ("b", tb), ("c", tc)]
    );
    for ((o, _, ttl), want) in h.iter().zip([50_000, 40_000, 30_000]) {
        assert!(
            *ttl > want - 5_000 && *ttl <= want,
            "{o}: ttl {ttl}, asked {want}"
        );
    }
    rel(&mut c, "rw", "b");
    assert_eq!(owners(&mut c, "rw"), ["a", "c"]);
    // RESP3: the same array of [owner, token, ttl] (no map, ints stay ints).
    let mut c3 = srv.conn_resp3();
    let r3 = call(&mut c3, &["FLOCK.HOLDERS", "rw"]);
    let h3 = parse_holders(&r3, "HOLDERS over RESP3");
    assert_eq!(
        h3.iter()
            .map(|(o, t, _)| (o.clone(), *t))
            .collect::<Vec<_>>(),
        [("a".to_string(), ta), ("c".to_string(), tc)]
    );
    assert_eq!(
        call(&mut c3, &["FLOCK.HOLDERS", "none"]),
        Reply::Array(vec![])
    );
    // An exclusive key: one triple. A binary-safe owner comes back as given.
    let tx = grant_kind(&mut c, "x", "owner with spaces", 10_000, &[]);
    assert_eq!(holder_tokens(&mut c, "x"), hv(&[("owner with spaces", tx)]));
    // An expired grant is not listed even before the key is reaped.
    grant_kind(&mut c, "short", "s", 30, &["LIMIT", "2"]);
    wait_until("the short permit expires", || {
        holders(&mut c, "short").is_empty()
    });
}

#[test]
fn info_shows_mode_holders_limit_and_delayed_in_every_mode() {
    let srv = Server::builder()
        .module_args(&["lock-delay-ms", "60000"])
        .start();
    let mut c = srv.conn();
    let tx = grant_kind(&mut c, "x", "a", 30_000, &[]);
    let k = kinfo(&mut c, "x");
    assert_eq!(
        (
            k.owner.as_deref(),
            k.token,
            k.mode.as_str(),
            k.holders,
            k.limit,
            k.delayed,
            k.waiters
        ),
        (Some("a"), tx, "exclusive", 1, 0, 0, 0)
    );

    let t1 = grant_kind(&mut c, "rw", "r1", 50_000, &["SHARED"]);
    let t2 = grant_kind(&mut c, "rw", "r2", 20_000, &["SHARED"]);
    let k = kinfo(&mut c, "rw");
    // token: the largest live token; ttl: the longest lease; owner: nil.
    assert_eq!(
        (k.owner, k.token, k.mode.as_str(), k.holders, k.limit),
        (None, t2, "shared", 2, 0)
    );
    assert!(
        k.ttl > 40_000 && k.ttl <= 50_000,
        "longest lease, got {}",
        k.ttl
    );
    rel(&mut c, "rw", "r2");
    assert_eq!(
        kinfo(&mut c, "rw").token,
        t1,
        "the largest live token after t2 left"
    );

    let tp1 = grant_kind(&mut c, "sem", "p1", 30_000, &["LIMIT", "3"]);
    let tp = grant_kind(&mut c, "sem", "p2", 30_000, &["LIMIT", "3"]);
    let k = kinfo(&mut c, "sem");
    assert_eq!(
        (
            k.owner,
            k.token,
            k.mode.as_str(),
            k.holders,
            k.limit,
            k.delayed
        ),
        (None, tp, "permits", 2, 3, 0)
    );
    // A revoked permit: its slot is delayed, the key still "permits".
    assert_eq!(revoke(&mut c, &["sem", "p2"]), 1);
    assert_eq!(shape(&mut c, "sem"), sh("permits", 1, 3, 1, 0));
    assert_eq!(
        kinfo(&mut c, "sem").token,
        tp1,
        "token: the largest live one"
    );

    // Only delayed slots and waiters: mode none, nil owner, the last token, ttl 0.
    assert_eq!(revoke(&mut c, &["x"]), 1);
    let w = spawn_acq(&srv, "x", "b", 30_000, &["BLOCK", "0"]);
    wait_blocked(&mut c, 1);
    let k = kinfo(&mut c, "x");
    assert_eq!(
        (
            k.owner,
            k.token,
            k.ttl,
            k.mode.as_str(),
            k.holders,
            k.limit,
            k.delayed,
            k.waiters
        ),
        (None, tx, 0, "none", 0, 0, 1, 1)
    );
    // RESP3: a map with the same fields.
    let mut c3 = srv.conn_resp3();
    let r = call(&mut c3, &["FLOCK.INFO", "x"]);
    assert!(matches!(r, Reply::Map(_)), "INFO is a map in RESP3: {r:?}");
    assert_eq!(
        parse_k(&r, "RESP3 INFO").map(|k| k.mode),
        Some("none".into())
    );
    assert_eq!(
        call(
            &mut c,
            &["CLIENT", "KILL", "TYPE", "normal", "SKIPME", "yes"]
        )
        .int()
        .map(|n| n >= 1),
        Some(true)
    );
    let _ = w.join();
}

#[test]
fn lock_delay_applies_per_slot() {
    // 2 s of delay: the checks that a slot is still delayed get 2 s on a loaded machine.
    let srv = Server::builder()
        .module_args(&["lock-delay-ms", "2000"])
        .start();
    let mut c = srv.conn();
    // A semaphore of 2: an expired permit keeps its slot, so the key has one permit fewer.
    // p1's lease ends no earlier than `sent` + 100 ms, its slot's delay `sent` + 2100 ms.
    let sent = Instant::now();
    let t1 = grant_kind(&mut c, "sem", "p1", 100, &["LIMIT", "2"]);
    grant_kind(&mut c, "sem", "p2", 60_000, &["LIMIT", "2"]);
    wait_until("p1 expires", || check(&mut c, "sem", t1) == 0);
    assert_eq!(shape(&mut c, "sem"), sh("permits", 1, 2, 1, 0));
    refused(
        &mut c,
        "sem",
        "p3",
        &["LIMIT", "2"],
        "one slot live, one delayed",
    );
    refused(
        &mut c,
        "sem",
        "p1",
        &["LIMIT", "2"],
        "the old owner during its delay",
    );
    // A waiter is granted when the delayed slot frees, not before.
    let r = acq(
        &mut c,
        "sem",
        "p3",
        60_000,
        &["LIMIT", "2", "BLOCK", "5000"],
    );
    tok(&r, "p3 after the delayed slot");
    // (10 ms for the servers' ms clocks)
    assert!(
        sent.elapsed() >= Duration::from_millis(100 + 2000 - 10),
        "granted {:?} after p1's 100 ms grant was sent, the slot's delay is 2000 ms from the deadline",
        sent.elapsed()
    );
    assert_eq!(shape(&mut c, "sem"), sh("permits", 2, 2, 0, 0));
    // A released permit frees its slot at once.
    rel(&mut c, "sem", "p2");
    grant_kind(&mut c, "sem", "p4", 60_000, &["LIMIT", "2"]);
    // A revoked permit keeps its slot from the revoke.
    assert_eq!(revoke(&mut c, &["sem", "p3"]), 1);
    assert_eq!(shape(&mut c, "sem"), sh("permits", 1, 2, 1, 0));
    refused(&mut c, "sem", "p5", &["LIMIT", "2"], "right after a revoke");
    wait_until("the revoked slot frees", || {
        acq(&mut c, "sem", "p5", 60_000, &["LIMIT", "2"])
            .int()
            .is_some()
    });

    // An unlimited shared key: a delayed slot holds off only exclusive requests.
    let tr = grant_kind(&mut c, "rw", "r1", 60_000, &["SHARED"]);
    assert_eq!(revoke(&mut c, &["rw"]), 1);
    assert_eq!(shape(&mut c, "rw"), sh("none", 0, 0, 1, 0));
    assert_eq!(exists(&mut c, "rw"), 1, "a key in lock-delay exists");
    let k = kinfo(&mut c, "rw");
    assert_eq!(
        (k.owner, k.token, k.ttl),
        (None, tr, 0),
        "no live grant: the last token, ttl 0"
    );
    assert_eq!(holders(&mut c, "rw"), [], "a delayed slot is no holder");
    refused(
        &mut c,
        "rw",
        "w",
        &[],
        "a writer during a reader's delayed slot",
    );
    grant_kind(&mut c, "rw", "r2", 60_000, &["SHARED"]);
    assert_eq!(shape(&mut c, "rw"), sh("shared", 1, 0, 1, 0));
    // The writer waits for both: the delay's end and the reader's release.
    let w = spawn_acq(&srv, "rw", "w", 60_000, &["BLOCK", "0"]);
    wait_blocked(&mut c, 1);
    rel(&mut c, "rw", "r2");
    tok(&join(w, "w"), "the writer after the delay and the reader");
    assert_eq!(shape(&mut c, "rw"), sh("exclusive", 1, 0, 0, 0));
    // Delayed slots alone: the key leaves the keyspace when they end.
    assert_eq!(revoke(&mut c, &["rw"]), 1);
    assert_eq!(revoke(&mut c, &["sem"]), 2);
    assert_eq!(shape(&mut c, "sem"), sh("none", 0, 2, 2, 0));
    wait_until("delayed keys leave the keyspace", || dbsize(&mut c) == 0);
}
