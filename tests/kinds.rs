//! Lock kinds end to end (issue #13, SPEC "Lock kinds", "Token-qualified calls"): exclusive,
//! SHARED (read/write locks) and LIMIT n (semaphores whose every permit has its own owner,
//! lease and token) against real servers: one FIFO queue for all kinds, owners unique per
//! key (G4, a second wait replaces the first), the key's limit and its error texts, option
//! syntax, flock.max-holders, per-slot lock-delay, HOLDERS and INFO, token-qualified calls,
//! FENCED read-only under a shared token (G5), persistence (RDB v2, AOF, rewrite, DEBUG
//! RELOAD, DUMP/RESTORE, COPY, the v1 fixtures), replication and promotion (G7), cluster slot
//! migration, keyspace events and INFO counters per grant, ACL, and no residue (G10).
//!
//! Waiters are threads with their own connection; the order they queue in is fixed by
//! waiting until the server counts each one blocked before the next one is sent.

use flock_testkit::*;
use std::path::{Path, PathBuf};
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

// ---------------------------------------------------------------------------------------
// helpers
// ---------------------------------------------------------------------------------------

/// `FLOCK.ACQUIRE key owner ttl opts...`, the raw reply.
fn acq(c: &mut redis::Connection, key: &str, owner: &str, ttl: i64, opts: &[&str]) -> Reply {
    let ttl = ttl.to_string();
    let mut args = vec!["FLOCK.ACQUIRE", key, owner, ttl.as_str()];
    args.extend_from_slice(opts);
    call(c, &args)
}

/// A token in (0, 2^53), or a panic naming `what`.
#[track_caller]
fn tok(r: &Reply, what: &str) -> i64 {
    match r {
        Reply::Int(t) if *t > 0 && *t < TWO_POW_53 => *t,
        other => panic!("{what}: expected a token, got {other:?}"),
    }
}

/// ACQUIRE that must be granted.
#[track_caller]
fn grant_kind(c: &mut redis::Connection, key: &str, owner: &str, ttl: i64, opts: &[&str]) -> i64 {
    let r = acq(c, key, owner, ttl, opts);
    tok(&r, &format!("ACQUIRE {key} {owner} {ttl} {opts:?}"))
}

/// ACQUIRE that must answer nil.
#[track_caller]
fn refused(c: &mut redis::Connection, key: &str, owner: &str, opts: &[&str], why: &str) {
    let r = acq(c, key, owner, 10_000, opts);
    assert!(
        r.is_nil(),
        "ACQUIRE {key} {owner} {opts:?}: expected nil ({why}), got {r:?}"
    );
}

/// ACQUIRE that must fail with exactly `text`.
#[track_caller]
fn refused_with(c: &mut redis::Connection, key: &str, owner: &str, opts: &[&str], text: &str) {
    let r = acq(c, key, owner, 10_000, opts);
    assert_eq!(
        r,
        Reply::Err(text.to_string()),
        "ACQUIRE {key} {owner} {opts:?}"
    );
}

/// An ACQUIRE on its own connection in a thread (opts should hold BLOCK); a closed
/// connection is `Reply::Other`.
fn spawn_acq(srv: &Server, key: &str, owner: &str, ttl: i64, opts: &[&str]) -> JoinHandle<Reply> {
    let mut con = srv.conn();
    let (key, owner) = (key.to_string(), owner.to_string());
    let opts: Vec<String> = opts.iter().map(|s| s.to_string()).collect();
    thread::spawn(move || {
        let ttl = ttl.to_string();
        let mut args = vec!["FLOCK.ACQUIRE", key.as_str(), owner.as_str(), ttl.as_str()];
        args.extend(opts.iter().map(String::as_str));
        // A connection the test kills on purpose answers `Other`, not a panic.
        call_raw(&mut con, &args).unwrap_or_else(Reply::Other)
    })
}

#[track_caller]
fn join(h: JoinHandle<Reply>, what: &str) -> Reply {
    h.join()
        .unwrap_or_else(|_| panic!("{what}: waiter thread panicked"))
}

/// FLOCK.INFO with the kinds' fields.
#[derive(Clone, Debug, PartialEq)]
struct K {
    owner: Option<String>,
    token: i64,
    ttl: i64,
    waiters: i64,
    mode: String,
    holders: i64,
    limit: i64,
    delayed: i64,
}

#[track_caller]
fn parse_k(r: &Reply, what: &str) -> Option<K> {
    let i = parse_info(r, what)?;
    let field = |name: &str| -> Reply {
        i.fields
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.clone())
            .unwrap_or_else(|| panic!("{what}: FLOCK.INFO has no {name}: {r:?}"))
    };
    let int = |name: &str| -> i64 {
        field(name)
            .int()
            .unwrap_or_else(|| panic!("{what}: {name} is not an integer: {r:?}"))
    };
    Some(K {
        owner: i.owner.map(|o| String::from_utf8_lossy(&o).into_owned()),
        token: i.token,
        ttl: i.ttl,
        waiters: i.waiters,
        mode: field("mode")
            .string()
            .unwrap_or_else(|| panic!("{what}: mode is not a string: {r:?}")),
        holders: int("holders"),
        limit: int("limit"),
        delayed: int("delayed"),
    })
}

#[track_caller]
fn kinfo(c: &mut redis::Connection, key: &str) -> K {
    let r = call(c, &["FLOCK.INFO", key]);
    parse_k(&r, &format!("FLOCK.INFO {key}"))
        .unwrap_or_else(|| panic!("FLOCK.INFO {key}: nil, expected a lock"))
}

/// (mode, holders, limit, delayed, waiters) of a key that must exist.
#[track_caller]
fn shape(c: &mut redis::Connection, key: &str) -> (String, i64, i64, i64, i64) {
    let k = kinfo(c, key);
    (k.mode, k.holders, k.limit, k.delayed, k.waiters)
}

fn sh(
    mode: &str,
    holders: i64,
    limit: i64,
    delayed: i64,
    waiters: i64,
) -> (String, i64, i64, i64, i64) {
    (mode.to_string(), holders, limit, delayed, waiters)
}

/// FLOCK.HOLDERS as (owner, token, ttl) triples; panics on any other shape.
#[track_caller]
fn parse_holders(r: &Reply, what: &str) -> Vec<(String, i64, i64)> {
    let a = r
        .array()
        .unwrap_or_else(|| panic!("{what}: HOLDERS is not an array: {r:?}"));
    a.iter()
        .map(|t| match t.array() {
            Some([o, Reply::Int(tk), Reply::Int(ttl)]) => {
                let o = o
                    .string()
                    .unwrap_or_else(|| panic!("{what}: owner not a string: {r:?}"));
                (o, *tk, *ttl)
            }
            _ => panic!("{what}: HOLDERS entry is not [owner, token, ttl]: {t:?}"),
        })
        .collect()
}

#[track_caller]
fn holders(c: &mut redis::Connection, key: &str) -> Vec<(String, i64, i64)> {
    let r = call(c, &["FLOCK.HOLDERS", key]);
    parse_holders(&r, &format!("FLOCK.HOLDERS {key}"))
}

/// HOLDERS as (owner, token) pairs.
#[track_caller]
fn holder_tokens(c: &mut redis::Connection, key: &str) -> Vec<(String, i64)> {
    holders(c, key)
        .into_iter()
        .map(|(o, t, _)| (o, t))
        .collect()
}

/// Expected (owner, token) pairs.
fn hv(v: &[(&str, i64)]) -> Vec<(String, i64)> {
    v.iter().map(|(o, t)| (o.to_string(), *t)).collect()
}

#[track_caller]
fn owners(c: &mut redis::Connection, key: &str) -> Vec<String> {
    holders(c, key).into_iter().map(|(o, _, _)| o).collect()
}

#[track_caller]
fn rel(c: &mut redis::Connection, key: &str, owner: &str) {
    assert_eq!(release(c, key, owner), 1, "RELEASE {key} {owner}");
}

#[track_caller]
fn revoke(c: &mut redis::Connection, args: &[&str]) -> i64 {
    let mut a = vec!["FLOCK.REVOKE"];
    a.extend_from_slice(args);
    call(c, &a)
        .int()
        .unwrap_or_else(|| panic!("FLOCK.REVOKE {args:?}: not an integer"))
}

/// A key's state that copies must reproduce: INFO without `ttl` and `waiters` (waiters are
/// connections of one server) and HOLDERS' owners and tokens; plus the leases, compared with
/// a tolerance by `assert_same_state`.
#[derive(Debug, PartialEq)]
struct Snap {
    info: Option<(Option<String>, i64, String, i64, i64, i64)>,
    grants: Vec<(String, i64)>,
}

fn snap(c: &mut redis::Connection, key: &str) -> (Snap, Vec<i64>) {
    let r = call(c, &["FLOCK.INFO", key]);
    let k = parse_k(&r, key);
    let h = holders(c, key);
    (
        Snap {
            info: k.map(|k| (k.owner, k.token, k.mode, k.holders, k.limit, k.delayed)),
            grants: h.iter().map(|(o, t, _)| (o.clone(), *t)).collect(),
        },
        h.iter().map(|(_, _, ttl)| *ttl).collect(),
    )
}

/// Same INFO (but leases and waiters), same holders and tokens, leases within 1 s.
#[track_caller]
fn assert_same_state(a: &(Snap, Vec<i64>), b: &(Snap, Vec<i64>), what: &str) {
    assert_eq!(a.0, b.0, "{what}: state differs");
    for (x, y) in a.1.iter().zip(&b.1) {
        assert!(
            (x - y).abs() < 1000,
            "{what}: leases {:?} vs {:?}",
            a.1,
            b.1
        );
    }
}

fn set_config(c: &mut redis::Connection, name: &str, value: &str) {
    let r = call(c, &["CONFIG", "SET", name, value]);
    assert_eq!(r, Reply::Status("OK".into()), "CONFIG SET {name} {value}");
}

// ---------------------------------------------------------------------------------------
// read/write locks and semaphores: who gets the key, in which order
// ---------------------------------------------------------------------------------------

#[test]
fn readers_share_a_waiting_writer_holds_later_readers_back_and_a_run_of_readers_goes_together() {
    let srv = Server::start();
    let mut c = srv.conn();
    let t1 = grant_kind(&mut c, "rw", "r1", 30_000, &["SHARED"]);
    let t2 = grant_kind(&mut c, "rw", "r2", 30_000, &["SHARED"]);
    assert!(t2 > t1, "each reader its own, larger token: {t1} {t2}");
    assert_eq!(shape(&mut c, "rw"), sh("shared", 2, 0, 0, 0));
    refused(&mut c, "rw", "w", &[], "a writer while readers hold");

    let w = spawn_acq(&srv, "rw", "w", 30_000, &["BLOCK", "0"]);
    wait_blocked(&mut c, 1);
    // Capacity for readers is free, but a writer waits: nobody jumps the queue.
    refused(
        &mut c,
        "rw",
        "r3",
        &["SHARED"],
        "a reader behind a waiting writer",
    );
    let r3 = spawn_acq(&srv, "rw", "r3", 30_000, &["SHARED", "BLOCK", "0"]);
    wait_blocked(&mut c, 2);
    let r4 = spawn_acq(&srv, "rw", "r4", 30_000, &["BLOCK", "0", "SHARED"]);
    wait_blocked(&mut c, 3);
    let w2 = spawn_acq(&srv, "rw", "w2", 30_000, &["BLOCK", "0"]);
    wait_blocked(&mut c, 4);
    let r5 = spawn_acq(&srv, "rw", "r5", 30_000, &["SHARED", "BLOCK", "0"]);
    wait_blocked(&mut c, 5);
    assert_eq!(shape(&mut c, "rw"), sh("shared", 2, 0, 0, 5));

    // One reader leaves: the writer still waits for the other.
    rel(&mut c, "rw", "r1");
    assert_eq!(owners(&mut c, "rw"), ["r2"]);
    assert_eq!(kinfo(&mut c, "rw").waiters, 5, "nobody granted yet");
    rel(&mut c, "rw", "r2");
    let tw = tok(&join(w, "w"), "the writer after the readers left");
    assert!(tw > t2);
    let k = kinfo(&mut c, "rw");
    assert_eq!(
        (k.mode.as_str(), k.owner.as_deref(), k.holders, k.waiters),
        ("exclusive", Some("w"), 1, 4)
    );

    // The writer leaves: the run of readers behind it (r3, r4) goes together; w2 stops the
    // run, and r5 behind w2 waits although it is a reader.
    rel(&mut c, "rw", "w");
    let t3 = tok(&join(r3, "r3"), "r3");
    let t4 = tok(&join(r4, "r4"), "r4");
    assert!(t3 > tw && t4 > t3, "FIFO tokens: w {tw}, r3 {t3}, r4 {t4}");
    assert_eq!(holder_tokens(&mut c, "rw"), hv(&[("r3", t3), ("r4", t4)]));
    assert_eq!(shape(&mut c, "rw"), sh("shared", 2, 0, 0, 2));
    assert_eq!(blocked_clients(&mut c), 2, "w2 and r5 still wait");

    rel(&mut c, "rw", "r3");
    rel(&mut c, "rw", "r4");
    let tw2 = tok(&join(w2, "w2"), "w2");
    assert_eq!(owners(&mut c, "rw"), ["w2"]);
    rel(&mut c, "rw", "w2");
    let t5 = tok(&join(r5, "r5"), "r5");
    assert!(
        tw2 > t4 && t5 > tw2,
        "tokens in grant order: {t4} {tw2} {t5}"
    );
    rel(&mut c, "rw", "r5");
    assert_eq!(exists(&mut c, "rw"), 0, "nothing held or waiting: no key");
}

#[test]
fn a_waiter_that_times_out_or_disconnects_leaves_the_mixed_queue() {
    let srv = Server::start();
    let mut c = srv.conn();
    grant_kind(&mut c, "rw", "r1", 30_000, &["SHARED"]);
    let w = spawn_acq(&srv, "rw", "w", 30_000, &["BLOCK", "0"]);
    wait_blocked(&mut c, 1);
    // A reader behind the writer with a timeout: nil at its timeout.
    let t0 = Instant::now();
    let r = acq(&mut c, "rw", "late", 30_000, &["SHARED", "BLOCK", "150"]);
    assert!(r.is_nil(), "timed-out reader: {r:?}");
    assert!(
        t0.elapsed() >= Duration::from_millis(140),
        "answered before its timeout"
    );
    assert_eq!(
        kinfo(&mut c, "rw").waiters,
        1,
        "the timed-out reader left the queue"
    );
    // A reader that disconnects while waiting leaves the queue too.
    let mut gone = srv.conn();
    let id = call(&mut gone, &["CLIENT", "ID"]).int().expect("CLIENT ID");
    let h = thread::spawn(move || {
        call_raw(
            &mut gone,
            &[
                "FLOCK.ACQUIRE",
                "rw",
                "gone",
                "30000",
                "SHARED",
                "BLOCK",
                "0",
            ],
        )
    });
    wait_blocked(&mut c, 2);
    assert_eq!(kinfo(&mut c, "rw").waiters, 2);
    let r = call(&mut c, &["CLIENT", "KILL", "ID", &id.to_string()]);
    assert_eq!(r, Reply::Int(1), "CLIENT KILL");
    assert!(
        h.join().expect("thread").is_err(),
        "the killed waiter's connection is closed"
    );
    wait_until("the killed reader leaves the queue", || {
        kinfo(&mut c, "rw").waiters == 1
    });
    rel(&mut c, "rw", "r1");
    tok(&join(w, "w"), "the writer, next in the queue");
    assert_eq!(
        owners(&mut c, "rw"),
        ["w"],
        "no grant went to a reader that left"
    );
    assert_eq!(shape(&mut c, "rw"), sh("exclusive", 1, 0, 0, 0));
}

#[test]
fn a_semaphore_admits_at_most_n_and_hands_off_in_order_on_release_expiry_and_revoke() {
    let srv = Server::start();
    let mut c = srv.conn();
    let t1 = grant_kind(&mut c, "sem", "p1", 60_000, &["LIMIT", "2"]);
    let t2 = grant_kind(&mut c, "sem", "p2", 60_000, &["LIMIT", "2"]);
    refused(&mut c, "sem", "p3", &["LIMIT", "2"], "a third permit of 2");
    refused(
        &mut c,
        "sem",
        "x",
        &[],
        "an exclusive request on a semaphore in use",
    );
    assert_eq!(shape(&mut c, "sem"), sh("permits", 2, 2, 0, 0));
    assert_eq!(
        kinfo(&mut c, "sem").owner,
        None,
        "no single owner of permits"
    );

    let w1 = spawn_acq(&srv, "sem", "w1", 60_000, &["LIMIT", "2", "BLOCK", "0"]);
    wait_blocked(&mut c, 1);
    let w2 = spawn_acq(&srv, "sem", "w2", 60_000, &["BLOCK", "0", "LIMIT", "2"]);
    wait_blocked(&mut c, 2);
    let w3 = spawn_acq(&srv, "sem", "w3", 60_000, &["LIMIT", "2", "BLOCK", "0"]);
    wait_blocked(&mut c, 3);

    // Release: the head waiter only.
    rel(&mut c, "sem", "p1");
    let tw1 = tok(&join(w1, "w1"), "w1 after a release");
    assert_eq!(holder_tokens(&mut c, "sem"), hv(&[("p2", t2), ("w1", tw1)]));
    assert_eq!(shape(&mut c, "sem"), sh("permits", 2, 2, 0, 2));
    refused(
        &mut c,
        "sem",
        "p4",
        &["LIMIT", "2"],
        "a newcomer while others wait",
    );

    // Revoke of one owner: the next waiter.
    assert_eq!(revoke(&mut c, &["sem", "w1"]), 1);
    let tw2 = tok(&join(w2, "w2"), "w2 after a revoke");
    assert_eq!(owners(&mut c, "sem"), ["p2", "w2"]);
    assert_eq!(check(&mut c, "sem", tw1), 0, "the revoked permit is stale");

    // Expiry (p2's lease shortened to 200 ms): the last waiter, at the lease's end.
    assert_eq!(renew(&mut c, "sem", "p2", 200), Some(t2));
    let t0 = Instant::now();
    let tw3 = tok(&join(w3, "w3"), "w3 after an expiry");
    assert!(
        t0.elapsed() < Duration::from_secs(5),
        "handed off at the lease's end"
    );
    assert_eq!(owners(&mut c, "sem"), ["w2", "w3"]);
    assert_eq!(check(&mut c, "sem", t2), 0);

    let all = [t1, t2, tw1, tw2, tw3];
    assert!(all.windows(2).all(|w| w[0] < w[1]), "tokens grow: {all:?}");
    assert_eq!(
        revoke(&mut c, &["sem"]),
        2,
        "REVOKE key counts the grants it ended"
    );
    assert_eq!(exists(&mut c, "sem"), 0);
}

#[test]
fn every_grant_of_every_kind_gets_a_larger_token() {
    // G3 across kinds, through release, expiry, revoke and DEL of the key.
    let srv = Server::start();
    let mut c = srv.conn();
    let mut last = 0;
    let kinds: [&[&str]; 3] = [&[], &["SHARED"], &["LIMIT", "3"]];
    for round in 0..4 {
        for opts in kinds {
            let n = if opts.is_empty() { 1 } else { 3 };
            for i in 0..n {
                let t = grant_kind(&mut c, "k", &format!("o{i}"), 60_000, opts);
                assert!(t > last, "round {round} {opts:?}: {t} not above {last}");
                last = t;
            }
            match round {
                0 => {
                    for i in 0..n {
                        rel(&mut c, "k", &format!("o{i}"));
                    }
                }
                1 => assert_eq!(revoke(&mut c, &["k"]), n),
                2 => assert_eq!(call(&mut c, &["DEL", "k"]), Reply::Int(1)),
                _ => {
                    for i in 0..n {
                        assert!(
                            renew(&mut c, "k", &format!("o{i}"), 30).is_some(),
                            "renew o{i}"
                        );
                    }
                    wait_until("the short leases expire", || exists(&mut c, "k") == 0);
                }
            }
            assert_eq!(exists(&mut c, "k"), 0, "round {round} {opts:?}: key left");
        }
    }
}

#[test]
fn the_holder_repeating_its_mode_gets_its_token_and_a_fresh_lease_other_modes_are_errors() {
    let srv = Server::start();
    let mut c = srv.conn();
    // G4 for a reader: same token, fresh lease, and its place in HOLDERS kept.
    let ta = grant_kind(&mut c, "rw", "a", 1_000, &["SHARED"]);
    let tb = grant_kind(&mut c, "rw", "b", 60_000, &["SHARED"]);
    assert_eq!(grant_kind(&mut c, "rw", "a", 60_000, &["SHARED"]), ta);
    let h = holders(&mut c, "rw");
    assert_eq!(
        (h[0].0.as_str(), h[0].1),
        ("a", ta),
        "the repeat does not move the grant"
    );
    assert!(
        h[0].2 > 50_000,
        "fresh lease after the repeat: {} ms",
        h[0].2
    );
    // With BLOCK too: the holder's repeat answers at once.
    assert_eq!(
        grant_kind(&mut c, "rw", "b", 60_000, &["BLOCK", "0", "SHARED"]),
        tb
    );
    // Another mode: no upgrade, no downgrade; checks the owner's mode before anything else.
    refused_with(
        &mut c,
        "rw",
        "a",
        &[],
        "ERR owner already holds a shared grant of rw",
    );
    refused_with(
        &mut c,
        "rw",
        "a",
        &["LIMIT", "2"],
        "ERR owner already holds a shared grant of rw",
    );
    refused_with(
        &mut c,
        "rw",
        "a",
        &["BLOCK", "0"],
        "ERR owner already holds a shared grant of rw",
    );
    assert_eq!(
        holder_tokens(&mut c, "rw"),
        hv(&[("a", ta), ("b", tb)]),
        "errors change nothing"
    );

    let tx = grant_kind(&mut c, "x", "a", 60_000, &[]);
    refused_with(
        &mut c,
        "x",
        "a",
        &["SHARED"],
        "ERR owner already holds an exclusive grant of x",
    );
    refused_with(
        &mut c,
        "x",
        "a",
        &["LIMIT", "1"],
        "ERR owner already holds an exclusive grant of x",
    );
    assert_eq!(grant_kind(&mut c, "x", "a", 60_000, &["BLOCK", "10"]), tx);

    let tp = grant_kind(&mut c, "sem", "a", 1_000, &["LIMIT", "3"]);
    assert_eq!(grant_kind(&mut c, "sem", "a", 60_000, &["LIMIT", "3"]), tp);
    assert!(
        holders(&mut c, "sem")[0].2 > 50_000,
        "the permit's lease is fresh"
    );
    // The owner's own limit is checked before the key's: another limit names the permit.
    refused_with(
        &mut c,
        "sem",
        "a",
        &["LIMIT", "4"],
        "ERR owner already holds a permit grant of sem",
    );
    refused_with(
        &mut c,
        "sem",
        "a",
        &["SHARED"],
        "ERR owner already holds a permit grant of sem",
    );
    refused_with(
        &mut c,
        "sem",
        "a",
        &[],
        "ERR owner already holds a permit grant of sem",
    );
    assert_eq!(holder_tokens(&mut c, "sem"), hv(&[("a", tp)]));
    assert_eq!(flock_stat(&mut c, "grants"), 4, "repeats are no new grants");
}

#[test]
fn a_key_has_one_limit_and_other_limits_get_the_mismatch_texts() {
    let srv = Server::builder()
        .module_args(&["lock-delay-ms", "60000"])
        .start();
    let mut c = srv.conn();
    // With live permits.
    grant_kind(&mut c, "sem", "p1", 60_000, &["LIMIT", "2"]);
    let m2 = "ERR limit mismatch: sem admits 2 shared holders";
    refused_with(&mut c, "sem", "p2", &["LIMIT", "3"], m2);
    refused_with(&mut c, "sem", "p2", &["SHARED"], m2);
    refused_with(&mut c, "sem", "p2", &["SHARED", "BLOCK", "0"], m2);
    assert_eq!(
        shape(&mut c, "sem"),
        sh("permits", 1, 2, 0, 0),
        "a mismatch does not queue"
    );
    // With live shared grants.
    grant_kind(&mut c, "rw", "r1", 60_000, &["SHARED"]);
    let many = "ERR limit mismatch: rw admits any number of shared holders";
    refused_with(&mut c, "rw", "p", &["LIMIT", "2"], many);
    refused_with(&mut c, "rw", "p", &["LIMIT", "2", "BLOCK", "0"], many);
    // Exclusive requests have no limit: nil, not a mismatch.
    refused(&mut c, "rw", "w", &[], "a writer while a reader holds");

    // With only waiters: an exclusive holder, a permit request waiting gives the key its limit.
    grant_kind(&mut c, "wq", "x", 60_000, &[]);
    let h = spawn_acq(&srv, "wq", "p1", 60_000, &["LIMIT", "2", "BLOCK", "0"]);
    wait_blocked(&mut c, 1);
    assert_eq!(
        shape(&mut c, "wq"),
        sh("exclusive", 1, 2, 0, 1),
        "limit in every mode"
    );
    let mq = "ERR limit mismatch: wq admits 2 shared holders";
    refused_with(&mut c, "wq", "p2", &["LIMIT", "3"], mq);
    refused_with(&mut c, "wq", "p2", &["SHARED", "BLOCK", "0"], mq);
    refused(
        &mut c,
        "wq",
        "y",
        &[],
        "an exclusive request behind a holder",
    );
    // Checks come in order: syntax, limit range, then the key's limit.
    refused_with(
        &mut c,
        "wq",
        "p2",
        &["LIMIT", "0"],
        "ERR invalid limit: must be an integer from 1 to 10000 (flock.max-holders)",
    );
    refused_with(
        &mut c,
        "wq",
        "p2",
        &["LIMIT", "0", "SHARED"],
        "ERR syntax error",
    );
    assert_eq!(revoke(&mut c, &["wq", "x"]), 1);
    // x's revoked slot is delayed (exclusive): the permit waiter still waits for it.
    assert_eq!(shape(&mut c, "wq"), sh("none", 0, 2, 1, 1));
    assert_eq!(
        call(
            &mut c,
            &["CLIENT", "KILL", "TYPE", "normal", "SKIPME", "yes"]
        )
        .int()
        .map(|n| n >= 1),
        Some(true)
    );
    let _ = h.join();

    // With only delayed slots: a revoked permit keeps the key's limit.
    grant_kind(&mut c, "dl", "p1", 60_000, &["LIMIT", "3"]);
    assert_eq!(revoke(&mut c, &["dl"]), 1);
    assert_eq!(shape(&mut c, "dl"), sh("none", 0, 3, 1, 0));
    refused_with(
        &mut c,
        "dl",
        "p2",
        &["LIMIT", "2"],
        "ERR limit mismatch: dl admits 3 shared holders",
    );
    refused_with(
        &mut c,
        "dl",
        "p2",
        &["SHARED"],
        "ERR limit mismatch: dl admits 3 shared holders",
    );
    tok(
        &acq(&mut c, "dl", "p2", 60_000, &["LIMIT", "3"]),
        "a permit beside a delayed slot",
    );
    // A delayed shared slot keeps "any number".
    grant_kind(&mut c, "ds", "r1", 60_000, &["SHARED"]);
    assert_eq!(revoke(&mut c, &["ds", "r1"]), 1);
    assert_eq!(shape(&mut c, "ds"), sh("none", 0, 0, 1, 0));
    refused_with(
        &mut c,
        "ds",
        "p",
        &["LIMIT", "5"],
        "ERR limit mismatch: ds admits any number of shared holders",
    );
}

#[test]
fn options_come_in_any_order_once_each_and_bad_ones_are_clear_errors() {
    let srv = Server::start();
    let mut c = srv.conn();
    let syntax = "ERR syntax error";
    let range = "ERR invalid limit: must be an integer from 1 to 10000 (flock.max-holders)";
    let bad: &[(&[&str], &str)] = &[
        (&["SHARED", "LIMIT", "2"], syntax),
        (&["LIMIT", "2", "SHARED"], syntax),
        (&["SHARED", "SHARED"], syntax),
        (&["LIMIT", "2", "LIMIT", "2"], syntax),
        (&["BLOCK", "0", "BLOCK", "0"], syntax),
        (&["LIMIT"], syntax),
        (&["SHARED", "BLOCK"], syntax),
        (&["EXCLUSIVE"], syntax),
        (&["LIMIT", "0"], range),
        (&["LIMIT", "-1"], range),
        (&["LIMIT", "abc"], range),
        (&["LIMIT", "02"], range),
        (&["LIMIT", "10001"], range),
        (&["LIMIT", "99999999999999999999"], range),
        (
            &["LIMIT", "2", "BLOCK", "-1"],
            "ERR invalid timeout: must be an integer of milliseconds, 0 or more",
        ),
    ];
    for (opts, text) in bad {
        refused_with(&mut c, "k", "o", opts, text);
    }
    assert_eq!(exists(&mut c, "k"), 0, "bad options change nothing");
    assert_eq!(flock_stat(&mut c, "grants"), 0);

    // Any order, any case.
    grant_kind(&mut c, "a", "o", 10_000, &["BLOCK", "100", "SHARED"]);
    grant_kind(&mut c, "b", "o", 10_000, &["block", "0", "limit", "4"]);
    grant_kind(&mut c, "c", "o", 10_000, &["LIMIT", "4", "BLOCK", "0"]);
    grant_kind(&mut c, "d", "o", 10_000, &["Shared"]);
    grant_kind(&mut c, "e", "o", 10_000, &["LIMIT", "10000"]);
    assert_eq!(shape(&mut c, "a"), sh("shared", 1, 0, 0, 0));
    assert_eq!(shape(&mut c, "b"), sh("permits", 1, 4, 0, 0));
    assert_eq!(shape(&mut c, "c"), sh("permits", 1, 4, 0, 0));
    assert_eq!(shape(&mut c, "d"), sh("shared", 1, 0, 0, 0));
    assert_eq!(shape(&mut c, "e"), sh("permits", 1, 10000, 0, 0));
    // The range follows flock.max-holders.
    set_config(&mut c, "flock.max-holders", "7");
    refused_with(
        &mut c,
        "k",
        "o",
        &["LIMIT", "8"],
        "ERR invalid limit: must be an integer from 1 to 7 (flock.max-holders)",
    );
    grant_kind(&mut c, "f", "o", 10_000, &["LIMIT", "7"]);
}

#[test]
fn max_holders_caps_readers_and_lowering_it_keeps_a_live_keys_limit() {
    let srv = Server::start();
    let mut c = srv.conn();
    set_config(&mut c, "flock.max-holders", "2");
    grant_kind(&mut c, "rw", "r1", 60_000, &["SHARED"]);
    grant_kind(&mut c, "rw", "r2", 60_000, &["SHARED"]);
    refused(
        &mut c,
        "rw",
        "r3",
        &["SHARED"],
        "a third reader with max-holders 2",
    );
    let r3 = spawn_acq(&srv, "rw", "r3", 60_000, &["SHARED", "BLOCK", "0"]);
    wait_blocked(&mut c, 1);
    rel(&mut c, "rw", "r1");
    tok(&join(r3, "r3"), "the waiting reader when a reader left");
    assert_eq!(shape(&mut c, "rw"), sh("shared", 2, 0, 0, 0));

    // A semaphore of 5 made while max-holders is 5 keeps its limit when max-holders drops.
    set_config(&mut c, "flock.max-holders", "5");
    for i in 0..5 {
        grant_kind(&mut c, "sem", &format!("p{i}"), 60_000, &["LIMIT", "5"]);
    }
    let p5 = spawn_acq(&srv, "sem", "p5", 60_000, &["LIMIT", "5", "BLOCK", "0"]);
    wait_blocked(&mut c, 1);
    set_config(&mut c, "flock.max-holders", "2");
    assert_eq!(shape(&mut c, "sem"), sh("permits", 5, 5, 0, 1));
    rel(&mut c, "sem", "p0");
    tok(
        &join(p5, "p5"),
        "the waiting permit of a limit above today's max-holders",
    );
    assert_eq!(
        shape(&mut c, "sem"),
        sh("permits", 5, 5, 0, 0),
        "5 permits live, limit kept"
    );
    // New requests: the range check comes first, then the key's limit.
    refused_with(
        &mut c,
        "sem",
        "q",
        &["LIMIT", "5"],
        "ERR invalid limit: must be an integer from 1 to 2 (flock.max-holders)",
    );
    refused_with(
        &mut c,
        "sem",
        "q",
        &["LIMIT", "2"],
        "ERR limit mismatch: sem admits 5 shared holders",
    );
    // Readers above a lowered max-holders stay; a new one waits until fewer than 2 live.
    set_config(&mut c, "flock.max-holders", "10");
    for i in 0..3 {
        grant_kind(&mut c, "many", &format!("r{i}"), 60_000, &["SHARED"]);
    }
    set_config(&mut c, "flock.max-holders", "2");
    assert_eq!(shape(&mut c, "many"), sh("shared", 3, 0, 0, 0));
    refused(
        &mut c,
        "many",
        "r3",
        &["SHARED"],
        "3 live readers, max-holders 2",
    );
    rel(&mut c, "many", "r0");
    refused(
        &mut c,
        "many",
        "r3",
        &["SHARED"],
        "2 live readers, max-holders 2",
    );
    rel(&mut c, "many", "r1");
    grant_kind(&mut c, "many", "r3", 60_000, &["SHARED"]);
}

#[test]
fn an_owner_waits_at_most_once_and_a_second_block_takes_the_first_ones_place() {
    let srv = Server::start();
    let mut c = srv.conn();
    // A reader behind a writer retries its wait: the first request gets nil, one wait is left.
    grant_kind(&mut c, "rw", "w", 60_000, &[]);
    let r1 = spawn_acq(&srv, "rw", "r", 60_000, &["SHARED", "BLOCK", "0"]);
    wait_blocked(&mut c, 1);
    let r2 = spawn_acq(&srv, "rw", "r", 60_000, &["SHARED", "BLOCK", "0"]);
    assert!(join(r1, "first r").is_nil(), "the replaced wait gets nil");
    wait_blocked(&mut c, 1);
    assert_eq!(kinfo(&mut c, "rw").waiters, 1, "r waits once");
    assert_eq!(
        release(&mut c, "rw", "r"),
        0,
        "a waiter holds nothing to release"
    );
    rel(&mut c, "rw", "w");
    let t = tok(&join(r2, "second r"), "the reader's retried wait");
    assert_eq!(holder_tokens(&mut c, "rw"), hv(&[("r", t)]));
    assert_eq!(shape(&mut c, "rw"), sh("shared", 1, 0, 0, 0));

    // With another waiter behind it: the retry takes the earlier request's place (SPEC:
    // "takes the earlier request's place"), so it stays ahead of `other`.
    grant_kind(&mut c, "x", "holder", 60_000, &[]);
    let first = spawn_acq(&srv, "x", "dup", 60_000, &["BLOCK", "0"]);
    wait_blocked(&mut c, 1);
    let other = spawn_acq(&srv, "x", "other", 60_000, &["BLOCK", "0"]);
    wait_blocked(&mut c, 2);
    let second = spawn_acq(&srv, "x", "dup", 60_000, &["BLOCK", "0"]);
    assert!(
        join(first, "first dup").is_nil(),
        "the replaced wait gets nil"
    );
    wait_blocked(&mut c, 2);
    assert_eq!(
        kinfo(&mut c, "x").waiters,
        2,
        "other and dup wait, dup once"
    );
    // The hand-off happens inside RELEASE: HOLDERS shows who got the key at once.
    rel(&mut c, "x", "holder");
    assert_eq!(
        owners(&mut c, "x"),
        ["dup"],
        "the retried wait of dup must keep the earlier request's place, ahead of other"
    );
    let t = tok(&join(second, "second dup"), "the retried wait");
    rel(&mut c, "x", "dup");
    let t2 = tok(&join(other, "other"), "other after dup");
    assert!(t2 > t);
}

// ---------------------------------------------------------------------------------------
// HOLDERS, INFO and lock-delay per slot
// ---------------------------------------------------------------------------------------

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

// ---------------------------------------------------------------------------------------
// token-qualified calls, REVOKE, FENCED
// ---------------------------------------------------------------------------------------

#[test]
fn check_renew_release_and_revoke_treat_shared_grants_and_permits_alike() {
    let srv = Server::start();
    let mut c = srv.conn();
    for opts in [&["SHARED"][..], &["LIMIT", "5"]] {
        let t1 = grant_kind(&mut c, "k", "o1", 60_000, opts);
        let t2 = grant_kind(&mut c, "k", "o2", 60_000, opts);
        assert!(check(&mut c, "k", t1) > 50_000 && check(&mut c, "k", t2) > 50_000);
        assert_eq!(check(&mut c, "k", t2 + 1), 0);
        // Token-qualified RENEW: only the grant with that token.
        let r = call(&mut c, &["FLOCK.RENEW", "k", "o1", "5000", &t2.to_string()]);
        assert!(r.is_nil(), "{opts:?}: o1 renewing o2's token: {r:?}");
        let r = call(&mut c, &["FLOCK.RENEW", "k", "o1", "5000", &t1.to_string()]);
        assert_eq!(r, Reply::Int(t1));
        let left = check(&mut c, "k", t1);
        assert!(
            left <= 5000 && left > 3000,
            "{opts:?}: RENEW set the lease: {left}"
        );
        // Token-qualified RELEASE.
        let r = call(&mut c, &["FLOCK.RELEASE", "k", "o1", &t2.to_string()]);
        assert_eq!(r, Reply::Int(0), "{opts:?}: o1 releasing o2's token");
        let r = call(&mut c, &["FLOCK.RELEASE", "k", "o1", &t1.to_string()]);
        assert_eq!(r, Reply::Int(1));
        assert_eq!(check(&mut c, "k", t1), 0);
        assert!(
            check(&mut c, "k", t2) > 0,
            "{opts:?}: the other grant lives on"
        );
        // A late release of o1's earlier grant never ends its later one.
        let t3 = grant_kind(&mut c, "k", "o1", 60_000, opts);
        let r = call(&mut c, &["FLOCK.RELEASE", "k", "o1", &t1.to_string()]);
        assert_eq!(
            r,
            Reply::Int(0),
            "{opts:?}: a stale token released a newer grant"
        );
        let r = call(&mut c, &["FLOCK.RENEW", "k", "o1", "5000", &t1.to_string()]);
        assert!(r.is_nil(), "{opts:?}: a stale token renewed a newer grant");
        assert!(check(&mut c, "k", t3) > 50_000);
        // Untokened calls act on the owner's live grant; another owner changes nothing.
        assert_eq!(release(&mut c, "k", "nobody"), 0);
        assert_eq!(renew(&mut c, "k", "o2", 60_000), Some(t2));
        // REVOKE key owner: only that owner's grant; REVOKE key: the count of the rest.
        grant_kind(&mut c, "k", "o4", 60_000, opts);
        assert_eq!(revoke(&mut c, &["k", "o2"]), 1);
        assert_eq!(revoke(&mut c, &["k", "o2"]), 0, "nothing left of o2");
        assert_eq!(revoke(&mut c, &["k", "nobody"]), 0);
        assert_eq!(check(&mut c, "k", t2), 0);
        assert_eq!(owners(&mut c, "k"), ["o1", "o4"]);
        assert_eq!(revoke(&mut c, &["k"]), 2);
        assert_eq!(revoke(&mut c, &["k"]), 0);
        assert_eq!(exists(&mut c, "k"), 0);
    }
}

#[test]
fn fenced_under_a_shared_token_runs_only_reads() {
    let srv = Server::start();
    let mut c = srv.conn();
    call(&mut c, &["SET", "data", "v0"]);
    let ts = grant_kind(&mut c, "rw", "r", 60_000, &["SHARED"]).to_string();
    let fenced = |c: &mut redis::Connection, tok: &str, cmd: &[&str]| {
        let mut a = vec!["FLOCK.FENCED", "rw", tok];
        a.extend_from_slice(cmd);
        call(c, &a)
    };
    let ro = "ERR FLOCK.FENCED with a shared grant runs read-only commands only";
    let rejected0 = flock_stat(&mut c, "fenced_rejected");
    for cmd in [
        &["SET", "data", "v1"][..],
        &["INCR", "n"],
        &["DEL", "data"],
        &["HSET", "h", "f", "v"],
        &["EXPIRE", "data", "100"],
    ] {
        assert_eq!(
            fenced(&mut c, &ts, cmd),
            Reply::Err(ro.into()),
            "{cmd:?} under a read lock"
        );
    }
    assert_eq!(
        flock_stat(&mut c, "fenced_rejected") - rejected0,
        5,
        "each refusal counted"
    );
    assert_eq!(
        call(&mut c, &["GET", "data"]).string().as_deref(),
        Some("v0"),
        "nothing written"
    );
    assert_eq!(
        exists(&mut c, "n") + exists(&mut c, "h"),
        0,
        "nothing written"
    );
    // Reads run, in the caller's protocol.
    assert_eq!(
        fenced(&mut c, &ts, &["GET", "data"]).string().as_deref(),
        Some("v0")
    );
    assert_eq!(fenced(&mut c, &ts, &["EXISTS", "data"]), Reply::Int(1));
    let mut c3 = srv.conn_resp3();
    call(&mut c, &["HSET", "hh", "f", "v"]);
    let r = fenced(&mut c3, &ts, &["HGETALL", "hh"]);
    assert!(matches!(r, Reply::Map(_)), "RESP3 reply of the read: {r:?}");
    // Scripts are refused anyway, read-only ones too.
    let r = fenced(&mut c, &ts, &["EVAL_RO", "return 1", "0"]);
    assert!(
        r.is_err() && r != Reply::Err(ro.into()),
        "EVAL_RO refused as a script: {r:?}"
    );
    // A permit's token and an exclusive token write.
    let tp = grant_kind(&mut c, "sem", "p", 60_000, &["LIMIT", "2"]).to_string();
    let r = call(
        &mut c,
        &["FLOCK.FENCED", "sem", &tp, "SET", "data", "by-permit"],
    );
    assert_eq!(r, Reply::Status("OK".into()), "a permit writes");
    let tx = grant_kind(&mut c, "x", "w", 60_000, &[]).to_string();
    let r = call(
        &mut c,
        &["FLOCK.FENCED", "x", &tx, "SET", "data", "by-writer"],
    );
    assert_eq!(r, Reply::Status("OK".into()), "an exclusive grant writes");
    assert_eq!(
        call(&mut c, &["GET", "data"]).string().as_deref(),
        Some("by-writer")
    );
    // A released shared token reads nothing.
    rel(&mut c, "rw", "r");
    assert_err_prefix(
        &fenced(&mut c, &ts, &["GET", "data"]),
        "FENCED",
        "a stale shared token",
    );
}

// ---------------------------------------------------------------------------------------
// persistence
// ---------------------------------------------------------------------------------------

/// The keys every persistence test carries: `rw` (readers r1, r2 live, r3 revoked: a delayed
/// slot), `sem` (LIMIT 3: p1, p2 live, p3 revoked), `x` (exclusive), `dl` (LIMIT 2, only a
/// delayed slot). Needs a lock-delay long
/// enough to outlast the test. Returns the largest token issued.
fn kinds_setup(c: &mut redis::Connection) -> i64 {
    grant_kind(c, "rw", "r1", 60_000, &["SHARED"]);
    grant_kind(c, "rw", "r2", 50_000, &["SHARED"]);
    grant_kind(c, "rw", "r3", 60_000, &["SHARED"]);
    assert_eq!(revoke(c, &["rw", "r3"]), 1);
    grant_kind(c, "sem", "p1", 60_000, &["LIMIT", "3"]);
    grant_kind(c, "sem", "p2", 40_000, &["LIMIT", "3"]);
    grant_kind(c, "sem", "p3", 60_000, &["LIMIT", "3"]);
    assert_eq!(revoke(c, &["sem", "p3"]), 1);
    // A key that only a delayed slot keeps.
    grant_kind(c, "dl", "p", 60_000, &["LIMIT", "2"]);
    assert_eq!(revoke(c, &["dl"]), 1);
    let t = grant_kind(c, "x", "a", 60_000, &[]);
    assert_eq!(shape(c, "dl"), sh("none", 0, 2, 1, 0));
    assert_eq!(shape(c, "rw"), sh("shared", 2, 0, 1, 0));
    assert_eq!(shape(c, "sem"), sh("permits", 2, 3, 1, 0));
    t
}

type State3 = Vec<(Snap, Vec<i64>)>;

fn kinds_state(c: &mut redis::Connection, keys: &[&str]) -> State3 {
    keys.iter().map(|k| snap(c, k)).collect()
}

/// The state is as before, behaves as before (the delayed slots still count) and new tokens
/// are above `max`. Changes nothing of rw, sem, x.
#[track_caller]
fn assert_kinds_survived(c: &mut redis::Connection, before: &State3, max: i64, what: &str) {
    let keys = ["rw", "sem", "x", "dl"];
    let now = kinds_state(c, &keys);
    for ((k, a), b) in keys.iter().zip(before).zip(&now) {
        assert_same_state(a, b, &format!("{what}: {k}"));
    }
    for (o, t) in before[0].0.grants.iter().chain(&before[1].0.grants) {
        assert!(
            check(c, if o.starts_with('r') { "rw" } else { "sem" }, *t) > 0,
            "{what}: {o}'s token"
        );
    }
    refused(
        c,
        "sem",
        "p4",
        &["LIMIT", "3"],
        &format!("{what}: 2 live permits and a delayed slot"),
    );
    refused(
        c,
        "rw",
        "w",
        &[],
        &format!("{what}: a writer on a read-locked key"),
    );
    refused_with(
        c,
        "sem",
        "p4",
        &["LIMIT", "2"],
        "ERR limit mismatch: sem admits 3 shared holders",
    );
    let r = acq(c, "rw", "r1", 60_000, &[]);
    assert_eq!(
        r,
        Reply::Err("ERR owner already holds a shared grant of rw".into()),
        "{what}"
    );
    let fresh = format!("fresh:{}", now_us());
    let t = grant_kind(c, &fresh, "n", 10_000, &["SHARED"]);
    assert!(t > max, "{what}: new token {t} not above {max}");
    call(c, &["DEL", &fresh]);
}

#[test]
fn shared_and_permit_keys_survive_debug_reload_rdb_restart_dump_restore_and_copy() {
    let mut srv = Server::builder()
        .module_args(&["lock-delay-ms", "300000"])
        .start();
    let mut c = srv.conn();
    let max = kinds_setup(&mut c);
    let keys = ["rw", "sem", "x", "dl"];
    let before = kinds_state(&mut c, &keys);

    assert_eq!(
        call(&mut c, &["DEBUG", "RELOAD"]),
        Reply::Status("OK".into())
    );
    assert_kinds_survived(&mut c, &before, max, "DEBUG RELOAD");

    assert_eq!(call(&mut c, &["SAVE"]), Reply::Status("OK".into()));
    srv.restart(); // SIGKILL: only the RDB of SAVE is left
    let mut c = srv.conn();
    assert_kinds_survived(&mut c, &before, max, "RDB restart");

    // DUMP/RESTORE onto the same server (another name) and onto another server.
    let srv2 = Server::builder()
        .module_args(&["lock-delay-ms", "300000"])
        .start();
    let mut c2 = srv2.conn();
    for k in ["rw", "sem"] {
        let payload = call(&mut c, &["DUMP", k]).bytes().expect("DUMP").to_vec();
        let copy = format!("{k}-restored");
        let r = call(
            &mut c,
            &[b"RESTORE".as_slice(), copy.as_bytes(), b"0", &payload],
        );
        assert_eq!(r, Reply::Status("OK".into()), "RESTORE {copy}");
        let a = snap(&mut c, k);
        assert_same_state(&a, &snap(&mut c, &copy), &format!("RESTORE of {k}"));
        let r = call(
            &mut c2,
            &[b"RESTORE".as_slice(), k.as_bytes(), b"0", &payload],
        );
        assert_eq!(r, Reply::Status("OK".into()), "RESTORE {k} on server 2");
        assert_same_state(
            &a,
            &snap(&mut c2, k),
            &format!("RESTORE of {k} on server 2"),
        );
        let fresh = grant_kind(&mut c2, "fresh", "n", 10_000, &["SHARED"]);
        assert!(
            fresh > max,
            "server 2 issues above restored tokens: {fresh} vs {max}"
        );
        assert_eq!(release(&mut c2, "fresh", "n"), 1);
    }
    // The restored semaphore still counts its delayed slot on server 2.
    refused(
        &mut c2,
        "sem",
        "p4",
        &["LIMIT", "3"],
        "restored semaphore with a delayed slot",
    );
    // COPY duplicates grants and delayed slots; the copy is independent.
    assert_eq!(call(&mut c, &["COPY", "sem", "sem-copy"]), Reply::Int(1));
    assert_same_state(
        &snap(&mut c, "sem"),
        &snap(&mut c, "sem-copy"),
        "COPY of sem",
    );
    assert_eq!(call(&mut c, &["COPY", "rw", "rw-copy"]), Reply::Int(1));
    assert_same_state(&snap(&mut c, "rw"), &snap(&mut c, "rw-copy"), "COPY of rw");
    rel(&mut c, "sem-copy", "p1");
    assert_eq!(
        owners(&mut c, "sem"),
        ["p1", "p2"],
        "the original after releasing the copy's p1"
    );
    assert_kinds_survived(&mut c, &before, max, "after RESTORE and COPY");
}

#[test]
fn shared_and_permit_keys_survive_aof_restart_and_rewrite() {
    let mut srv = Server::builder()
        .module_args(&["lock-delay-ms", "300000"])
        .arg("appendonly", "yes")
        .arg("appendfsync", "always")
        .start();
    let mut c = srv.conn();
    let max = kinds_setup(&mut c);
    let before = kinds_state(&mut c, &["rw", "sem", "x", "dl"]);
    srv.restart();
    let mut c = srv.conn();
    assert_kinds_survived(&mut c, &before, max, "AOF restart");
    rewrite_aof(&mut c);
    srv.restart();
    let mut c = srv.conn();
    assert_kinds_survived(&mut c, &before, max, "AOF rewrite and restart");
    // A hand-off after the reload is written too: r1 and r2 leave, the writer comes in.
    rel(&mut c, "rw", "r1");
    rel(&mut c, "rw", "r2");
    assert_eq!(
        shape(&mut c, "rw"),
        sh("none", 0, 0, 1, 0),
        "only r3's delayed slot left"
    );
    srv.restart();
    let mut c = srv.conn();
    assert_eq!(
        shape(&mut c, "rw"),
        sh("none", 0, 0, 1, 0),
        "after the third restart"
    );
    refused(
        &mut c,
        "rw",
        "w",
        &[],
        "the delayed reader slot still holds off a writer",
    );
}

/// Copy the v1 fixtures (read-only files) into a fresh dir the server may write to.
fn fixture_dir(what: &str) -> PathBuf {
    let src = Path::new("/work/shared/fixtures/v1");
    let dir = temp_dir(what);
    std::fs::copy(src.join("dump.rdb"), dir.join("dump.rdb")).expect("copy dump.rdb");
    std::fs::create_dir_all(dir.join("aof")).expect("mkdir aof");
    for e in std::fs::read_dir(src.join("aof"))
        .expect("read aof dir")
        .flatten()
    {
        let to = dir.join("aof").join(e.file_name());
        std::fs::copy(e.path(), &to).expect("copy aof file");
        let mut p = std::fs::metadata(&to).expect("stat").permissions();
        #[allow(clippy::permissions_set_readonly_false)]
        p.set_readonly(false);
        std::fs::set_permissions(&to, p).expect("chmod");
    }
    let mut p = std::fs::metadata(dir.join("dump.rdb"))
        .expect("stat")
        .permissions();
    #[allow(clippy::permissions_set_readonly_false)]
    p.set_readonly(false);
    std::fs::set_permissions(dir.join("dump.rdb"), p).expect("chmod");
    dir
}

#[test]
fn the_v1_fixtures_still_load_as_exclusive_locks() {
    let expected = [
        ("fx:held", b"worker-a".to_vec(), 1796112043312069i64),
        (
            "{fx}:tagged",
            b"owner with spaces".to_vec(),
            1796112043315934,
        ),
        ("fx:binary", b"bin\x00owner\xff".to_vec(), 1796112050324158),
        ("fx:renewed", b"worker-r".to_vec(), 1796112043324004),
    ];
    let high_water = 1796112050324158i64;
    for aof in [false, true] {
        let mut b = Server::builder()
            .module_args(&["max-ttl-ms", "315360000000"])
            .dir(fixture_dir(if aof { "v1-aof" } else { "v1-rdb" }));
        if aof {
            b = b.arg("appendonly", "yes").arg("appenddirname", "aof");
        } else {
            b = b.arg("dbfilename", "dump.rdb");
        }
        let srv = b.start();
        let mut c = srv.conn();
        let what = if aof { "v1 AOF" } else { "v1 RDB" };
        assert_eq!(dbsize(&mut c), 4, "{what}: four locks");
        assert_eq!(exists(&mut c, "fx:released"), 0, "{what}");
        for (key, owner, token) in &expected {
            let i = info(&mut c, key).unwrap_or_else(|| panic!("{what}: {key} missing"));
            assert_eq!(
                (i.owner.as_deref(), i.token),
                (Some(owner.as_slice()), *token),
                "{what}: {key}"
            );
            assert_eq!(
                shape(&mut c, key),
                sh("exclusive", 1, 0, 0, 0),
                "{what}: {key}"
            );
            let h = call(&mut c, &["FLOCK.HOLDERS", key]);
            let h = h.array().expect("HOLDERS array");
            assert_eq!(h.len(), 1, "{what}: {key}: one holder");
            assert!(check(&mut c, key, *token) > 0, "{what}: {key}: live");
        }
        // New grants of any kind are above the fixture's high-water mark.
        let t = grant_kind(&mut c, "fx:released", "n", 10_000, &["SHARED"]);
        assert!(t > high_water, "{what}: {t} not above {high_water}");
        let t2 = grant_kind(&mut c, "new", "n", 10_000, &["LIMIT", "2"]);
        assert!(t2 > t, "{what}");
        srv.assert_log_clean();
    }
}

// ---------------------------------------------------------------------------------------
// replication, cluster
// ---------------------------------------------------------------------------------------

/// After each step the replica shows what the master shows: INFO (but waiters), HOLDERS,
/// and the same DEBUG DIGEST-VALUE.
#[track_caller]
fn assert_mirrored(
    m: &mut redis::Connection,
    r: &mut redis::Connection,
    keys: &[&str],
    what: &str,
) {
    wait_replica(m);
    for k in keys {
        assert_same_state(&snap(m, k), &snap(r, k), &format!("{what}: {k}"));
        let dm = call(m, &["DEBUG", "DIGEST-VALUE", k]);
        let dr = call(r, &["DEBUG", "DIGEST-VALUE", k]);
        assert_eq!(dm, dr, "{what}: {k}: DEBUG DIGEST-VALUE differs");
    }
}

#[test]
fn a_replica_mirrors_every_kind_step_by_step_and_keeps_it_when_promoted() {
    let master = Server::builder()
        .module_args(&["lock-delay-ms", "300000"])
        .start();
    let replica = Server::start_replica_of(&master);
    let (mut m, mut r) = (master.conn(), replica.conn());
    let keys = ["rw", "sem"];
    let mut issued = Vec::new();
    let mut note = |t: i64| issued.push(t);

    note(grant_kind(&mut m, "rw", "r1", 60_000, &["SHARED"]));
    note(grant_kind(&mut m, "rw", "r2", 60_000, &["SHARED"]));
    assert_mirrored(&mut m, &mut r, &keys, "two readers");
    let w = spawn_acq(&master, "rw", "w", 60_000, &["BLOCK", "0"]);
    wait_blocked(&mut m, 1);
    let r3 = spawn_acq(&master, "rw", "r3", 60_000, &["SHARED", "BLOCK", "0"]);
    wait_blocked(&mut m, 2);
    let r4 = spawn_acq(&master, "rw", "r4", 60_000, &["SHARED", "BLOCK", "0"]);
    wait_blocked(&mut m, 3);
    assert_mirrored(&mut m, &mut r, &keys, "waiters queued (not replicated)");
    rel(&mut m, "rw", "r1");
    assert_mirrored(&mut m, &mut r, &keys, "one reader left");
    rel(&mut m, "rw", "r2");
    note(tok(&join(w, "w"), "w"));
    assert_mirrored(&mut m, &mut r, &keys, "the writer handed the key");
    assert_eq!(kinfo(&mut r, "rw").owner.as_deref(), Some("w"));
    rel(&mut m, "rw", "w");
    note(tok(&join(r3, "r3"), "r3"));
    note(tok(&join(r4, "r4"), "r4"));
    assert_mirrored(&mut m, &mut r, &keys, "a run of readers handed the key");
    assert_eq!(owners(&mut r, "rw"), ["r3", "r4"]);
    assert!(renew(&mut m, "rw", "r3", 30_000).is_some(), "renew r3");
    assert_mirrored(&mut m, &mut r, &keys, "renew");

    note(grant_kind(&mut m, "sem", "p1", 60_000, &["LIMIT", "2"]));
    let t2 = grant_kind(&mut m, "sem", "p2", 60_000, &["LIMIT", "2"]);
    note(t2);
    assert_mirrored(&mut m, &mut r, &keys, "two permits");
    // p2's lease shortened after the comparison, so that it cannot end in the middle of one.
    assert_eq!(renew(&mut m, "sem", "p2", 100), Some(t2));
    wait_until("p2 expires on the master", || check(&mut m, "sem", t2) == 0);
    wait_until("the master ended p2", || kinfo(&mut m, "sem").delayed == 1);
    assert_mirrored(&mut m, &mut r, &keys, "an expired permit's delayed slot");
    assert_eq!(shape(&mut r, "sem"), sh("permits", 1, 2, 1, 0));
    assert_eq!(revoke(&mut m, &["sem", "p1"]), 1);
    assert_mirrored(&mut m, &mut r, &keys, "a revoked permit");
    assert_eq!(shape(&mut r, "sem"), sh("none", 0, 2, 2, 0));
    assert_eq!(revoke(&mut m, &["rw", "r4"]), 1);
    assert_mirrored(&mut m, &mut r, &keys, "a revoked reader");
    assert_eq!(shape(&mut r, "rw"), sh("shared", 1, 0, 1, 0));
    // The replica refuses writes; reads work there.
    assert_err_prefix(
        &acq(&mut r, "rw", "x", 1000, &["SHARED"]),
        "READONLY",
        "ACQUIRE on a replica",
    );
    assert_eq!(owners(&mut r, "rw"), ["r3"]);

    let max = issued.iter().copied().max().unwrap_or(0);
    let before: Vec<_> = keys.iter().map(|k| snap(&mut r, k)).collect();
    drop(master);
    assert_eq!(
        call(&mut r, &["REPLICAOF", "NO", "ONE"]),
        Reply::Status("OK".into())
    );
    for (k, b) in keys.iter().zip(&before) {
        assert_same_state(b, &snap(&mut r, k), &format!("after promotion: {k}"));
    }
    // The promoted replica keeps the rules and issues larger tokens.
    refused(
        &mut r,
        "sem",
        "p3",
        &["LIMIT", "2"],
        "both slots delayed after promotion",
    );
    refused(
        &mut r,
        "rw",
        "w",
        &[],
        "a writer while r3 holds and r4's slot is delayed",
    );
    let t = grant_kind(&mut r, "rw", "r5", 60_000, &["SHARED"]);
    assert!(
        t > max,
        "promoted replica issued {t}, master had issued up to {max}"
    );
    assert_eq!(owners(&mut r, "rw"), ["r3", "r5"]);
}

#[test]
fn slot_migration_moves_readers_and_permits_whole_and_answers_a_waiting_writer() {
    let cluster = Cluster::start();
    let mut any = cluster.nodes[0].srv.conn();
    let (rw, sem) = ("{kmig}:rw", "{kmig}:sem");
    let s = key_slot(&mut any, rw);
    let from = cluster.master_of(s);
    let to = cluster.other_master(from);
    let mut src = from.srv.conn();
    let t1 = grant_kind(&mut src, rw, "r1", 20_000, &["SHARED"]);
    let t2 = grant_kind(&mut src, rw, "r2", 20_000, &["SHARED"]);
    let tp = grant_kind(&mut src, sem, "p1", 20_000, &["LIMIT", "2"]);
    let w = spawn_acq(&from.srv, rw, "w", 10_000, &["BLOCK", "0"]);
    wait_blocked(&mut src, 1);
    let before = (snap(&mut src, rw), snap(&mut src, sem));
    cluster.migrate_slot(s, from, to);
    // The writer is told at once, with an error cluster clients retry.
    assert_err_prefix(
        &join(w, "w"),
        "TRYAGAIN",
        "the writer waiting on a key that moved",
    );
    let mut dst = to.srv.conn();
    assert_same_state(&before.0, &snap(&mut dst, rw), "readers after migration");
    assert_same_state(&before.1, &snap(&mut dst, sem), "permits after migration");
    assert_eq!(holder_tokens(&mut dst, rw), hv(&[("r1", t1), ("r2", t2)]));
    assert!(check(&mut dst, rw, t1) > 10_000 && check(&mut dst, sem, tp) > 10_000);
    // The rules hold at the target, and its tokens are above the source's.
    refused(&mut dst, rw, "w", &[], "a writer on the migrated read lock");
    refused_with(
        &mut dst,
        sem,
        "p2",
        &["LIMIT", "3"],
        "ERR limit mismatch: {kmig}:sem admits 2 shared holders",
    );
    let t3 = grant_kind(&mut dst, rw, "r3", 10_000, &["SHARED"]);
    let t4 = grant_kind(&mut dst, sem, "p2", 10_000, &["LIMIT", "2"]);
    assert!(
        t3 > t2.max(tp) && t4 > t3,
        "target tokens {t3} {t4} vs source {t2} {tp}"
    );
    refused(
        &mut dst,
        sem,
        "p3",
        &["LIMIT", "2"],
        "the migrated semaphore is full",
    );
}

// ---------------------------------------------------------------------------------------
// events, counters, ACL
// ---------------------------------------------------------------------------------------

#[test]
fn keyspace_events_and_info_counters_come_once_per_grant() {
    let srv = Server::start();
    let mut c = srv.conn();
    set_config(&mut c, "notify-keyspace-events", "Kd");
    let mut sub = KeyspaceEvents::subscribe(&srv);
    let base: Vec<i64> = [
        "grants",
        "releases",
        "revokes",
        "expirations",
        "blocked_acquires",
    ]
    .iter()
    .map(|n| flock_stat(&mut c, n))
    .collect();
    grant_kind(&mut c, "rw", "w", 60_000, &[]);
    let r1 = spawn_acq(&srv, "rw", "r1", 60_000, &["SHARED", "BLOCK", "0"]);
    wait_blocked(&mut c, 1);
    let r2 = spawn_acq(&srv, "rw", "r2", 60_000, &["SHARED", "BLOCK", "0"]);
    wait_blocked(&mut c, 2);
    rel(&mut c, "rw", "w");
    tok(&join(r1, "r1"), "r1");
    tok(&join(r2, "r2"), "r2");
    grant_kind(&mut c, "rw", "r3", 60_000, &["SHARED"]);
    grant_kind(&mut c, "rw", "r3", 60_000, &["SHARED"]); // a repeat: no new grant
    assert_eq!(revoke(&mut c, &["rw"]), 3);
    let t = grant_kind(&mut c, "sem", "p1", 60_000, &["LIMIT", "2"]);
    grant_kind(&mut c, "sem", "p2", 40, &["LIMIT", "2"]);
    wait_until("p2 expires", || owners(&mut c, "sem") == ["p1"]);
    assert_eq!(
        call(&mut c, &["FLOCK.RELEASE", "sem", "p1", &t.to_string()]),
        Reply::Int(1)
    );
    // A sentinel: every event before it has arrived once it is seen.
    grant_kind(&mut c, "sentinel", "s", 60_000, &[]);
    sub.read_until(b"__keyspace@0__:sentinel");
    let counts: Vec<(&str, &str, usize)> = [
        ("rw", "flock.acquired"),
        ("rw", "flock.released"),
        ("rw", "flock.revoked"),
        ("sem", "flock.acquired"),
        ("sem", "flock.expired"),
        ("sem", "flock.released"),
    ]
    .iter()
    .map(|(k, e)| (*k, *e, sub.count(k, e)))
    .collect();
    assert_eq!(
        counts,
        [
            ("rw", "flock.acquired", 4),
            ("rw", "flock.released", 1),
            ("rw", "flock.revoked", 3),
            ("sem", "flock.acquired", 2),
            ("sem", "flock.expired", 1),
            ("sem", "flock.released", 1),
        ]
    );
    let now: Vec<i64> = [
        "grants",
        "releases",
        "revokes",
        "expirations",
        "blocked_acquires",
    ]
    .iter()
    .map(|n| flock_stat(&mut c, n))
    .collect();
    let delta: Vec<i64> = now.iter().zip(&base).map(|(a, b)| a - b).collect();
    // grants: w, r1, r2, r3, p1, p2, sentinel; releases: w, p1; revokes: 3; expirations: p2.
    assert_eq!(
        delta,
        [7, 2, 3, 1, 2],
        "INFO flock grants/releases/revokes/expirations/blocked"
    );
}

#[test]
fn a_read_only_user_lists_holders_and_changes_nothing() {
    let srv = Server::start();
    let mut admin = srv.conn();
    for (user, keys) in [("reader", "%R~orders:*"), ("writer", "%W~orders:*")] {
        let r = call(
            &mut admin,
            &[
                "ACL",
                "SETUSER",
                user,
                "on",
                ">pw",
                keys,
                "+flock.holders",
                "+flock.info",
                "+flock.acquire",
                "+flock.release",
            ],
        );
        assert_ok(&r, "ACL SETUSER");
    }
    let t = grant_kind(&mut admin, "orders:lock", "a", 60_000, &["SHARED"]);
    let mut reader = srv.conn_as("reader", "pw");
    assert_eq!(holder_tokens(&mut reader, "orders:lock"), hv(&[("a", t)]));
    assert_eq!(kinfo(&mut reader, "orders:lock").mode, "shared");
    let r = acq(&mut reader, "orders:lock", "b", 1000, &["SHARED"]);
    assert_err_prefix(&r, "NOPERM", "ACQUIRE by a read-only user");
    assert_err_prefix(
        &call(&mut reader, &["FLOCK.HOLDERS", "other"]),
        "NOPERM",
        "HOLDERS outside the pattern",
    );
    let mut writer = srv.conn_as("writer", "pw");
    assert_err_prefix(
        &call(&mut writer, &["FLOCK.HOLDERS", "orders:lock"]),
        "NOPERM",
        "HOLDERS by a write-only user",
    );
    let dry = call(
        &mut admin,
        &["ACL", "DRYRUN", "reader", "FLOCK.HOLDERS", "orders:lock"],
    );
    assert_eq!(dry, Reply::Status("OK".into()), "ACL DRYRUN agrees");
    assert_eq!(owners(&mut admin, "orders:lock"), ["a"], "nothing changed");
}

// ---------------------------------------------------------------------------------------
// G10
// ---------------------------------------------------------------------------------------

fn used_memory(c: &mut RawConn) -> i64 {
    info_i64(c, "memory", "used_memory")
}

/// Take `n` grants on keys of `holders` grants each (SHARED, or LIMIT `holders`), `batch`
/// keys at a time, and end them: most released, every tenth key revoked.
fn churn_kinds(c: &mut RawConn, round: &str, n: usize, holders: usize, limit: bool) {
    let keys = n / holders;
    let batch = 2_000;
    let lim = holders.to_string();
    let mut done = 0;
    while done < keys {
        let this = batch.min(keys - done);
        let mut take: Vec<Vec<String>> = Vec::with_capacity(this * holders);
        for k in done..done + this {
            for h in 0..holders {
                let mut cmd: Vec<String> = [
                    "FLOCK.ACQUIRE",
                    &format!("g10:{round}:{k}"),
                    &format!("owner-{h}"),
                    "60000",
                ]
                .iter()
                .map(|s| s.to_string())
                .collect();
                if limit {
                    cmd.extend(["LIMIT".to_string(), lim.clone()]);
                } else {
                    cmd.push("SHARED".into());
                }
                take.push(cmd);
            }
        }
        for r in c.pipeline(&take).expect("pipeline") {
            assert!(matches!(r, Reply::Int(t) if t > 0), "ACQUIRE: {r:?}");
        }
        let mut end: Vec<Vec<String>> = Vec::new();
        for k in done..done + this {
            let key = format!("g10:{round}:{k}");
            if k % 10 == 9 {
                end.push(vec!["FLOCK.REVOKE".into(), key]);
            } else {
                for h in 0..holders {
                    end.push(vec![
                        "FLOCK.RELEASE".into(),
                        key.clone(),
                        format!("owner-{h}"),
                    ]);
                }
            }
        }
        for r in c.pipeline(&end).expect("pipeline") {
            assert!(
                matches!(r, Reply::Int(1)) || r == Reply::Int(holders as i64),
                "RELEASE/REVOKE: {r:?}"
            );
        }
        done += this;
    }
}

/// `rounds` times: 10,000 (the default flock.max-holders) readers of one key, then all
/// released (the holders of one value grow and shrink as one key's index).
fn wide_key(c: &mut RawConn, rounds: usize) {
    for round in 0..rounds {
        let take: Vec<Vec<String>> = (0..10_000)
            .map(|h| {
                [
                    "FLOCK.ACQUIRE",
                    "g10:wide",
                    &format!("reader-{h}"),
                    "60000",
                    "SHARED",
                ]
                .iter()
                .map(|s| s.to_string())
                .collect()
            })
            .collect();
        for r in c.pipeline(&take).expect("pipeline") {
            assert!(
                matches!(r, Reply::Int(t) if t > 0),
                "round {round}: ACQUIRE: {r:?}"
            );
        }
        let end: Vec<Vec<String>> = (0..10_000)
            .map(|h| {
                vec![
                    "FLOCK.RELEASE".into(),
                    "g10:wide".into(),
                    format!("reader-{h}"),
                ]
            })
            .collect();
        for r in c.pipeline(&end).expect("pipeline") {
            assert_eq!(r, Reply::Int(1), "round {round}: RELEASE");
        }
    }
}

#[test]
fn shared_grants_and_permits_taken_and_ended_return_used_memory() {
    // FLOCK_G10_KINDS: shared grants (and as many permits) to take; a million each by default
    // (about 6 s on a 2-core box), plus 100,000 readers of one key, 10,000 at a time.
    let n: usize = std::env::var("FLOCK_G10_KINDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(1_000_000);
    let srv = Server::start();
    let mut c = RawConn::connect(srv.port()).expect("connect");
    // Warm up the allocator, the keyspace's tables and the module's state.
    churn_kinds(&mut c, "warm", 20_000, 4, false);
    churn_kinds(&mut c, "warm", 20_000, 4, true);
    wide_key(&mut c, 1);
    assert_eq!(c.call(&["DBSIZE"]).expect("DBSIZE"), Reply::Int(0));
    let base = used_memory(&mut c);
    let t0 = Instant::now();
    churn_kinds(&mut c, "main", n, 8, false);
    churn_kinds(&mut c, "main", n, 4, true);
    wide_key(&mut c, 10);
    let took = t0.elapsed();
    assert_eq!(
        c.call(&["DBSIZE"]).expect("DBSIZE"),
        Reply::Int(0),
        "no key left"
    );
    let slack = 256 * 1024;
    let mut after = used_memory(&mut c);
    poll_until(Duration::from_secs(20), || {
        after = used_memory(&mut c);
        after - base < slack
    });
    eprintln!(
        "G10 kinds: {n} shared grants, {n} permits and 100,000 readers of one key taken and ended in {:.1} s; used_memory \
         {base} before, {after} after ({:+} bytes)",
        took.as_secs_f64(),
        after - base
    );
    assert!(
        after - base < slack,
        "used_memory grew by {} bytes",
        after - base
    );
}

// ---------------------------------------------------------------------------------------
// the queue when waiters leave, the limit of waiting requests, max-waiters, BOUND, MULTI
// ---------------------------------------------------------------------------------------

/// How a head waiter leaves the queue in `head_waiter_leaves`.
#[derive(Clone, Copy, Debug)]
enum Leave {
    Timeout,
    Disconnect,
    ClientUnblock,
}

/// `k` is held in a mode that the head waiter (`head_opts`) does not fit but the waiter
/// behind it (`next_opts`) does; the head leaves by `how`: the one behind must be granted at
/// once ("waiters are granted from the head while the head fits", G6), not at the next
/// release or expiry.
fn head_waiter_leaves(holder_opts: &[&str], head_opts: &[&str], next_opts: &[&str], how: Leave) {
    let srv = Server::start();
    let mut c = srv.conn();
    grant_kind(&mut c, "k", "holder", 60_000, holder_opts);
    let mut head = srv.conn();
    let id = call(&mut head, &["CLIENT", "ID"]).int().expect("CLIENT ID");
    // Long enough that the waiter behind it is queued before the head times out, also when
    // the test thread is slow to start it on a loaded machine.
    let block = if matches!(how, Leave::Timeout) {
        "3000"
    } else {
        "0"
    };
    let args: Vec<String> = ["FLOCK.ACQUIRE", "k", "head", "60000"]
        .iter()
        .chain(head_opts)
        .chain(&["BLOCK", block])
        .map(|s| s.to_string())
        .collect();
    let h = thread::spawn(move || call_raw(&mut head, &args));
    wait_blocked(&mut c, 1);
    let mut next_opts = next_opts.to_vec();
    next_opts.extend_from_slice(&["BLOCK", "0"]);
    let next = spawn_acq(&srv, "k", "next", 60_000, &next_opts);
    wait_blocked(&mut c, 2);
    match how {
        Leave::Timeout => {}
        Leave::Disconnect => {
            let r = call(&mut c, &["CLIENT", "KILL", "ID", &id.to_string()]);
            assert_eq!(r, Reply::Int(1), "CLIENT KILL");
        }
        Leave::ClientUnblock => {
            let r = call(&mut c, &["CLIENT", "UNBLOCK", &id.to_string()]);
            assert_eq!(r, Reply::Int(1), "CLIENT UNBLOCK");
        }
    }
    let r = h.join().expect("head thread");
    assert!(
        matches!(r, Ok(Reply::Nil)) || r.is_err(),
        "{how:?}: the head waiter's answer: {r:?}"
    );
    let granted = poll_until(DEADLINE, || owners(&mut c, "k").len() == 2);
    let head_kind = if head_opts.is_empty() {
        "exclusive".to_string()
    } else {
        format!("{head_opts:?}")
    };
    assert!(
        granted,
        "{how:?}: holder {holder_opts:?}; the head waiter ({head_kind}) left; \
         the waiter behind it {next_opts:?} fits but was not granted within {DEADLINE:?}: HOLDERS {:?}, \
         INFO {:?}",
        owners(&mut c, "k"),
        kinfo(&mut c, "k")
    );
    tok(&join(next, "next"), "the waiter behind the head that left");
    assert_eq!(owners(&mut c, "k"), ["holder", "next"]);
}

#[test]
fn when_a_head_writer_times_out_the_reader_behind_it_is_granted_at_once() {
    head_waiter_leaves(&["SHARED"], &[], &["SHARED"], Leave::Timeout);
}

#[test]
fn when_a_head_writer_disconnects_the_reader_behind_it_is_granted_at_once() {
    head_waiter_leaves(&["SHARED"], &[], &["SHARED"], Leave::Disconnect);
}

#[test]
fn when_a_head_writer_is_unblocked_the_permit_behind_it_is_granted_at_once() {
    head_waiter_leaves(&["LIMIT", "2"], &[], &["LIMIT", "2"], Leave::ClientUnblock);
}

#[test]
fn the_limit_of_waiting_requests_leaves_with_them() {
    let srv = Server::start();
    let mut c = srv.conn();
    grant_kind(&mut c, "k", "x", 60_000, &[]);
    let p = spawn_acq(&srv, "k", "p", 60_000, &["LIMIT", "2", "BLOCK", "0"]);
    wait_blocked(&mut c, 1);
    // The waiting owner retrying with another limit: an error, and its wait stays.
    refused_with(
        &mut c,
        "k",
        "p",
        &["LIMIT", "3", "BLOCK", "0"],
        "ERR limit mismatch: k admits 2 shared holders",
    );
    assert_eq!(
        shape(&mut c, "k"),
        sh("exclusive", 1, 2, 0, 1),
        "the earlier wait is untouched"
    );
    assert_eq!(blocked_clients(&mut c), 1);
    // Once the only limited request left the queue the key has no limit any more.
    let r = call(
        &mut c,
        &["CLIENT", "KILL", "TYPE", "normal", "SKIPME", "yes"],
    );
    assert_eq!(r, Reply::Int(1), "CLIENT KILL of the waiter");
    assert!(matches!(join(p, "p"), Reply::Other(_)), "the killed waiter");
    wait_until("the waiter left", || kinfo(&mut c, "k").waiters == 0);
    assert_eq!(shape(&mut c, "k"), sh("exclusive", 1, 0, 0, 0));
    let r = acq(&mut c, "k", "q", 60_000, &["LIMIT", "3", "BLOCK", "100"]);
    assert!(
        r.is_nil(),
        "a LIMIT 3 wait (timing out) after the LIMIT 2 waiter left: {r:?}"
    );
    let r = acq(&mut c, "k", "q", 60_000, &["SHARED", "BLOCK", "100"]);
    assert!(
        r.is_nil(),
        "a SHARED wait after the LIMIT 3 waiter timed out: {r:?}"
    );
    // And when the last permit of a key is released, the next one may name any limit.
    rel(&mut c, "k", "x");
    grant_kind(&mut c, "k", "a", 60_000, &["LIMIT", "2"]);
    rel(&mut c, "k", "a");
    grant_kind(&mut c, "k", "a", 60_000, &["LIMIT", "5"]);
    assert_eq!(shape(&mut c, "k"), sh("permits", 1, 5, 0, 0));
}

#[test]
fn max_waiters_counts_a_retried_wait_once() {
    let srv = Server::start();
    let mut c = srv.conn();
    set_config(&mut c, "flock.max-waiters", "1");
    grant_kind(&mut c, "rw", "w", 60_000, &[]);
    let r1 = spawn_acq(&srv, "rw", "r", 60_000, &["SHARED", "BLOCK", "0"]);
    wait_blocked(&mut c, 1);
    let r = acq(&mut c, "rw", "other", 60_000, &["SHARED", "BLOCK", "0"]);
    assert_err_contains(&r, "max-waiters", "a second waiter past max-waiters 1");
    // The waiting owner's retry replaces its wait: no second place taken, so it is allowed.
    let r2 = spawn_acq(&srv, "rw", "r", 60_000, &["SHARED", "BLOCK", "0"]);
    assert!(join(r1, "r1").is_nil(), "the replaced wait");
    wait_blocked(&mut c, 1);
    rel(&mut c, "rw", "w");
    tok(&join(r2, "r2"), "the retried wait");
}

#[test]
fn bound_shared_grants_and_permits_end_with_their_connection() {
    let srv = Server::start();
    let mut c = srv.conn();
    set_config(&mut c, "notify-keyspace-events", "Kd");
    let mut sub = KeyspaceEvents::subscribe(&srv);
    let mut a = srv.conn();
    let ta = grant_kind(&mut a, "rw", "ra", 60_000, &["BOUND", "SHARED"]);
    let tb = grant_kind(&mut c, "rw", "rb", 60_000, &["SHARED"]);
    let tp = grant_kind(&mut a, "sem", "pa", 60_000, &["LIMIT", "1", "BOUND"]);
    let w = spawn_acq(&srv, "rw", "w", 60_000, &["BLOCK", "0"]);
    wait_blocked(&mut c, 1);
    let p = spawn_acq(&srv, "sem", "pb", 60_000, &["BLOCK", "0", "LIMIT", "1"]);
    wait_blocked(&mut c, 2);
    assert_eq!(flock_stat(&mut c, "bound_grants"), 2);
    // The holder's connection closes: its permit goes to the waiting permit; its read grant
    // ends, and the writer still waits for rb.
    drop(a);
    tok(
        &join(p, "pb"),
        "the permit after the bound holder's connection closed",
    );
    wait_until("ra's grant ends", || check(&mut c, "rw", ta) == 0);
    assert_eq!(check(&mut c, "sem", tp), 0);
    assert_eq!(
        holder_tokens(&mut c, "rw"),
        hv(&[("rb", tb)]),
        "rb's unbound grant lives on"
    );
    assert_eq!(kinfo(&mut c, "rw").waiters, 1, "the writer waits for rb");
    rel(&mut c, "rw", "rb");
    tok(&join(w, "w"), "the writer");
    sub.read_until(b"flock.closed");
    grant_kind(&mut c, "sentinel", "s", 60_000, &[]);
    sub.read_until(b"__keyspace@0__:sentinel");
    assert_eq!(
        (
            sub.count("rw", "flock.closed"),
            sub.count("sem", "flock.closed")
        ),
        (1, 1)
    );
    assert_eq!(flock_stat(&mut c, "bound_closed"), 2);
    assert_eq!(flock_stat(&mut c, "bound_grants"), 0);
    // pb is not bound: its thread's connection is gone, its permit stays.
    assert_eq!(owners(&mut c, "sem"), ["pb"]);
}

#[test]
fn inside_multi_and_scripts_block_answers_at_once_for_every_kind() {
    let srv = Server::start();
    let mut c = srv.conn();
    grant_kind(&mut c, "rw", "w", 60_000, &[]);
    grant_kind(&mut c, "sem", "p1", 60_000, &["LIMIT", "1"]);
    assert_eq!(call(&mut c, &["MULTI"]), Reply::Status("OK".into()));
    call(
        &mut c,
        &["FLOCK.ACQUIRE", "rw", "r", "1000", "SHARED", "BLOCK", "0"],
    );
    call(
        &mut c,
        &[
            "FLOCK.ACQUIRE",
            "sem",
            "p2",
            "1000",
            "LIMIT",
            "1",
            "BLOCK",
            "0",
        ],
    );
    call(
        &mut c,
        &["FLOCK.ACQUIRE", "free", "r", "1000", "SHARED", "BLOCK", "0"],
    );
    call(&mut c, &["FLOCK.HOLDERS", "rw"]);
    let t0 = Instant::now();
    let r = call(&mut c, &["EXEC"]);
    assert!(t0.elapsed() < Duration::from_secs(2), "EXEC blocked");
    let a = r.array().unwrap_or_else(|| panic!("EXEC: {r:?}"));
    assert_eq!(
        (a[0].clone(), a[1].clone()),
        (Reply::Nil, Reply::Nil),
        "EXEC: {r:?}"
    );
    tok(&a[2], "a free key inside MULTI");
    assert_eq!(parse_holders(&a[3], "HOLDERS in MULTI").len(), 1);
    let r = call(
        &mut c,
        &[
            "EVAL",
            "return redis.call('FLOCK.ACQUIRE', KEYS[1], 'r', '1000', 'SHARED', 'BLOCK', '0')",
            "1",
            "rw",
        ],
    );
    assert_eq!(r, Reply::Nil, "BLOCK inside a script answers at once");
    assert_eq!(
        kinfo(&mut c, "rw").waiters,
        0,
        "nobody waits after MULTI and EVAL"
    );
    assert_eq!(kinfo(&mut c, "sem").waiters, 0);
}

#[test]
fn deleting_a_write_locked_key_hands_it_to_the_run_of_waiting_readers() {
    let srv = Server::start();
    let mut c = srv.conn();
    let tw = grant_kind(&mut c, "rw", "w", 60_000, &[]);
    let r1 = spawn_acq(&srv, "rw", "r1", 60_000, &["SHARED", "BLOCK", "0"]);
    wait_blocked(&mut c, 1);
    let r2 = spawn_acq(&srv, "rw", "r2", 60_000, &["SHARED", "BLOCK", "0"]);
    wait_blocked(&mut c, 2);
    let w2 = spawn_acq(&srv, "rw", "w2", 60_000, &["BLOCK", "0"]);
    wait_blocked(&mut c, 3);
    assert_eq!(call(&mut c, &["DEL", "rw"]), Reply::Int(1));
    let t1 = tok(&join(r1, "r1"), "r1 after DEL");
    let t2 = tok(&join(r2, "r2"), "r2 after DEL");
    assert!(
        t1 > tw && t2 > t1,
        "tokens above the deleted grant's: {tw} {t1} {t2}"
    );
    wait_until("the readers hold the key", || {
        owners(&mut c, "rw") == ["r1", "r2"]
    });
    assert_eq!(
        kinfo(&mut c, "rw").waiters,
        1,
        "w2 still waits behind the readers"
    );
    rel(&mut c, "rw", "r1");
    rel(&mut c, "rw", "r2");
    tok(&join(w2, "w2"), "w2");
}

#[test]
fn grants_that_expire_together_each_count_and_each_hand_off() {
    let srv = Server::start();
    let mut c = srv.conn();
    set_config(&mut c, "notify-keyspace-events", "Kd");
    let mut sub = KeyspaceEvents::subscribe(&srv);
    let e0 = flock_stat(&mut c, "expirations");
    for i in 0..3 {
        grant_kind(&mut c, "sem", &format!("p{i}"), 60_000, &["LIMIT", "3"]);
    }
    let mut ws = Vec::new();
    for i in 0..3 {
        ws.push(spawn_acq(
            &srv,
            "sem",
            &format!("w{i}"),
            60_000,
            &["LIMIT", "3", "BLOCK", "0"],
        ));
        wait_blocked(&mut c, i + 1);
    }
    // The three leases end together (shortened once the waiters queued: a short lease from
    // the start could end before they are in the queue).
    for i in 0..3 {
        assert!(renew(&mut c, "sem", &format!("p{i}"), 100).is_some());
    }
    let mut last = 0;
    for (i, w) in ws.into_iter().enumerate() {
        let t = tok(&join(w, "w"), &format!("w{i} after the permits expired"));
        assert!(t > last);
        last = t;
    }
    assert_eq!(owners(&mut c, "sem"), ["w0", "w1", "w2"]);
    grant_kind(&mut c, "sentinel", "s", 60_000, &[]);
    sub.read_until(b"__keyspace@0__:sentinel");
    assert_eq!(sub.count("sem", "flock.expired"), 3);
    assert_eq!(sub.count("sem", "flock.acquired"), 6);
    assert_eq!(flock_stat(&mut c, "expirations") - e0, 3);
}

// ---------------------------------------------------------------------------------------
// keyspace changes under waiters, delayed slots' end on a replica, RENEW after expiry
// ---------------------------------------------------------------------------------------

#[test]
fn waiters_are_served_by_what_their_key_name_holds_after_rename_and_swapdb() {
    let srv = Server::start();
    let mut c = srv.conn();
    // RENAME of a read-locked key: the waiting writer gets the free name; the readers move.
    let t1 = grant_kind(&mut c, "lk", "r1", 60_000, &["SHARED"]);
    let w = spawn_acq(&srv, "lk", "w", 60_000, &["BLOCK", "0"]);
    wait_blocked(&mut c, 1);
    assert_eq!(
        call(&mut c, &["RENAME", "lk", "moved"]),
        Reply::Status("OK".into())
    );
    let tw = tok(&join(w, "w"), "the writer after RENAME");
    assert!(tw > t1);
    assert_eq!(holder_tokens(&mut c, "moved"), hv(&[("r1", t1)]));
    assert_eq!(shape(&mut c, "moved"), sh("shared", 1, 0, 0, 0));
    // SWAPDB brings a read-locked key under the name a reader waits for (behind an
    // exclusive holder): the reader fits now and is granted.
    call(&mut c, &["SELECT", "1"]);
    grant_kind(&mut c, "lk", "s1", 60_000, &["SHARED"]);
    call(&mut c, &["SELECT", "0"]);
    let r = spawn_acq(&srv, "lk", "r2", 60_000, &["SHARED", "BLOCK", "0"]);
    wait_blocked(&mut c, 1);
    assert_eq!(
        call(&mut c, &["SWAPDB", "0", "1"]),
        Reply::Status("OK".into())
    );
    let ok = poll_until(DEADLINE, || owners(&mut c, "lk").len() == 2);
    assert!(
        ok,
        "after SWAPDB the waiting reader fits the read-locked key but was not granted within \
         {DEADLINE:?}: HOLDERS {:?}, INFO {:?}",
        owners(&mut c, "lk"),
        kinfo(&mut c, "lk")
    );
    tok(&join(r, "r2"), "the reader after SWAPDB");
    assert_eq!(owners(&mut c, "lk"), ["s1", "r2"]);
}

#[test]
fn a_replica_follows_delayed_slots_to_their_end() {
    // 1.5 s of lock-delay: long enough that the slots are still running when the first
    // comparisons are made on a loaded machine, short enough to wait for their end.
    let master = Server::builder()
        .module_args(&["lock-delay-ms", "1500"])
        .start();
    let replica = Server::start_replica_of(&master);
    let (mut m, mut r) = (master.conn(), replica.conn());
    grant_kind(&mut m, "sem", "p1", 60_000, &["LIMIT", "2"]);
    grant_kind(&mut m, "sem", "p2", 60_000, &["LIMIT", "2"]);
    grant_kind(&mut m, "only", "p", 60_000, &["LIMIT", "2"]);
    assert_eq!(revoke(&mut m, &["sem", "p1"]), 1);
    assert_eq!(revoke(&mut m, &["only"]), 1);
    assert_mirrored(&mut m, &mut r, &["sem", "only"], "two delayed slots");
    assert_eq!(shape(&mut r, "sem"), sh("permits", 1, 2, 1, 0));
    assert_eq!(shape(&mut r, "only"), sh("none", 0, 2, 1, 0));
    // The master drops a key that only a delayed slot kept; the replica follows.
    wait_until("the delayed-only key leaves the master", || {
        exists(&mut m, "only") == 0
    });
    wait_replica(&mut m);
    wait_until("the delayed-only key leaves the replica", || {
        exists(&mut r, "only") == 0
    });
    // The slot of sem frees: both agree, and the freed slot is usable on the master.
    wait_until("sem's delayed slot ends", || {
        kinfo(&mut m, "sem").delayed == 0
    });
    grant_kind(&mut m, "sem", "p3", 60_000, &["LIMIT", "2"]);
    assert_mirrored(&mut m, &mut r, &["sem"], "after the slot freed");
    assert_eq!(shape(&mut r, "sem"), sh("permits", 2, 2, 0, 0));
    assert_eq!(
        call(&mut m, &["DEBUG", "DIGEST"]),
        call(&mut r, &["DEBUG", "DIGEST"]),
        "datasets differ"
    );
}

#[test]
fn renew_never_revives_an_expired_shared_grant_or_permit() {
    let srv = Server::start();
    let mut c = srv.conn();
    for opts in [&["SHARED"][..], &["LIMIT", "2"]] {
        let keep = grant_kind(&mut c, "k", "keep", 60_000, opts);
        let t = grant_kind(&mut c, "k", "short", 50, opts);
        wait_until("the short grant expires", || check(&mut c, "k", t) == 0);
        assert_eq!(
            renew(&mut c, "k", "short", 60_000),
            None,
            "{opts:?}: RENEW revived"
        );
        let r = call(
            &mut c,
            &["FLOCK.RENEW", "k", "short", "60000", &t.to_string()],
        );
        assert!(r.is_nil(), "{opts:?}: token-qualified RENEW revived: {r:?}");
        assert_eq!(
            release(&mut c, "k", "short"),
            0,
            "{opts:?}: RELEASE of an expired grant"
        );
        assert_eq!(holder_tokens(&mut c, "k"), hv(&[("keep", keep)]));
        assert_eq!(revoke(&mut c, &["k"]), 1);
    }
}

// ---------------------------------------------------------------------------------------
// runs of readers capped by max-holders, hand-offs by expiry/revoke/FLUSHALL, a model check
// ---------------------------------------------------------------------------------------

#[test]
fn a_run_of_readers_stops_at_max_holders_and_the_rest_follow_in_order() {
    let srv = Server::start();
    let mut c = srv.conn();
    set_config(&mut c, "flock.max-holders", "3");
    grant_kind(&mut c, "rw", "w", 60_000, &[]);
    let mut rs = Vec::new();
    for i in 0..4 {
        rs.push(spawn_acq(
            &srv,
            "rw",
            &format!("r{i}"),
            60_000,
            &["SHARED", "BLOCK", "0"],
        ));
        wait_blocked(&mut c, i + 1);
    }
    rel(&mut c, "rw", "w");
    let mut rs = rs.into_iter();
    for i in 0..3 {
        tok(&join(rs.next().unwrap(), "r"), &format!("r{i} in the run"));
    }
    assert_eq!(owners(&mut c, "rw"), ["r0", "r1", "r2"]);
    assert_eq!(
        shape(&mut c, "rw"),
        sh("shared", 3, 0, 0, 1),
        "r3 waits: max-holders 3"
    );
    rel(&mut c, "rw", "r1");
    tok(&join(rs.next().unwrap(), "r3"), "r3 when a reader left");
    assert_eq!(owners(&mut c, "rw"), ["r0", "r2", "r3"]);
}

#[test]
fn expiry_revoke_and_flushall_of_a_writer_hand_the_key_to_the_run_of_readers() {
    let srv = Server::builder()
        .module_args(&["lock-delay-ms", "300"])
        .start();
    let mut c = srv.conn();
    for how in ["expiry", "revoke", "flushall"] {
        let tw = grant_kind(&mut c, "rw", "w", 60_000, &[]);
        let r1 = spawn_acq(&srv, "rw", "r1", 60_000, &["SHARED", "BLOCK", "0"]);
        wait_blocked(&mut c, 1);
        let r2 = spawn_acq(&srv, "rw", "r2", 60_000, &["SHARED", "BLOCK", "0"]);
        wait_blocked(&mut c, 2);
        let w2 = spawn_acq(&srv, "rw", "w2", 60_000, &["BLOCK", "0"]);
        wait_blocked(&mut c, 3);
        let t0 = Instant::now();
        match how {
            "expiry" => assert_eq!(renew(&mut c, "rw", "w", 50), Some(tw)),
            "revoke" => assert_eq!(revoke(&mut c, &["rw", "w"]), 1),
            _ => assert_eq!(call(&mut c, &["FLUSHALL"]), Reply::Status("OK".into())),
        }
        let t1 = tok(&join(r1, "r1"), &format!("r1 after {how}"));
        let t2 = tok(&join(r2, "r2"), &format!("r2 after {how}"));
        let waited = t0.elapsed();
        assert!(tw < t1 && t1 < t2, "{how}: tokens {tw} {t1} {t2}");
        // lock-delay applies to expiry and revoke, not to a deleted key.
        if how != "flushall" {
            assert!(
                waited >= Duration::from_millis(250),
                "{how}: readers granted after {waited:?}, inside the lock-delay"
            );
        }
        assert_eq!(owners(&mut c, "rw"), ["r1", "r2"], "{how}");
        assert_eq!(
            kinfo(&mut c, "rw").waiters,
            1,
            "{how}: w2 waits behind the run"
        );
        assert_eq!(revoke(&mut c, &["rw"]), 2);
        tok(&join(w2, "w2"), &format!("w2 after {how}"));
        assert_eq!(call(&mut c, &["FLUSHALL"]), Reply::Status("OK".into()));
    }
}

/// What the model says an ACQUIRE without BLOCK answers.
#[derive(Debug, PartialEq)]
enum Want {
    Token(i64),
    New,
    Nil,
    Err(String),
}

#[test]
fn random_calls_of_every_kind_match_a_model_of_the_rules() {
    // Seeded (FLOCK_KINDS_SEED to repeat a run); no BLOCK and no expiry, so that a simple
    // model of SPEC's rules predicts every reply: G1 (an exclusive grant alone, never more
    // than the limit), G3 (tokens grow), G4 (the holder's repeat), the error texts, the
    // token-qualified calls and REVOKE's count.
    let seed = seed_from_env("FLOCK_KINDS_SEED");
    eprintln!("FLOCK_KINDS_SEED={seed}");
    let mut rng = Rng::new(seed);
    let srv = Server::start();
    let mut c = srv.conn();
    set_config(&mut c, "flock.max-holders", "4");
    let keys = ["k0", "k1"];
    let owners_ = ["a", "b", "c", "d", "e", "f"];
    // mode: "x", "s" or the limit as text; each key: (mode, [(owner, token)]).
    let mut model: Vec<(String, Vec<(String, i64)>)> = vec![(String::new(), Vec::new()); 2];
    let mut last = 0i64;
    for step in 0..5_000 {
        let ki = rng.below(2) as usize;
        let key = keys[ki];
        let owner = rng.pick(&owners_);
        let (mode, grants) = &mut model[ki];
        let held = grants.iter().position(|(o, _)| o == owner);
        let what = format!("seed {seed} step {step}");
        match rng.below(10) {
            0..=4 => {
                let m = rng.pick(&["x", "s", "2", "3"]);
                let opts: Vec<&str> = match m {
                    "x" => vec![],
                    "s" => vec!["SHARED"],
                    n => vec!["LIMIT", n],
                };
                let noun = |m: &str| match m {
                    "x" => "an exclusive",
                    "s" => "a shared",
                    _ => "a permit",
                };
                let want = if let Some(i) = held {
                    if *mode == m {
                        Want::Token(grants[i].1)
                    } else {
                        Want::Err(format!(
                            "ERR owner already holds {} grant of {key}",
                            noun(mode)
                        ))
                    }
                } else if !grants.is_empty() && *mode != "x" && m != "x" && *mode != m {
                    Want::Err(if *mode == "s" {
                        format!("ERR limit mismatch: {key} admits any number of shared holders")
                    } else {
                        format!("ERR limit mismatch: {key} admits {mode} shared holders")
                    })
                } else {
                    let cap = match m {
                        "x" => 1,
                        "s" => 4,
                        n => n.parse().unwrap(),
                    };
                    let fits = grants.is_empty() || (*mode == m && m != "x" && grants.len() < cap);
                    if fits {
                        Want::New
                    } else {
                        Want::Nil
                    }
                };
                let r = acq(&mut c, key, owner, 600_000, &opts);
                match (&want, &r) {
                    (Want::Token(t), Reply::Int(g)) if g == t => {}
                    (Want::New, Reply::Int(g)) if *g > last => {
                        last = *g;
                        *mode = m.to_string();
                        grants.push((owner.to_string(), *g));
                    }
                    (Want::Nil, Reply::Nil) => {}
                    (Want::Err(e), Reply::Err(g)) if e == g => {}
                    _ => panic!("{what}: ACQUIRE {key} {owner} {opts:?}: want {want:?}, got {r:?} (model {mode} {grants:?}, last token {last})"),
                }
            }
            5 | 6 => {
                // RELEASE, half of the time with a token (right or wrong).
                let tok_arg = match (held, rng.chance(50)) {
                    (Some(i), true) if rng.chance(70) => Some(grants[i].1),
                    (_, true) => Some(last + 1),
                    _ => None,
                };
                let mut args = vec!["FLOCK.RELEASE".to_string(), key.into(), owner.into()];
                args.extend(tok_arg.map(|t| t.to_string()));
                let want = match held {
                    Some(i) if tok_arg.is_none_or(|t| t == grants[i].1) => {
                        grants.remove(i);
                        1
                    }
                    _ => 0,
                };
                assert_eq!(call(&mut c, &args), Reply::Int(want), "{what}: {args:?}");
            }
            7 => {
                let want = held.map(|i| grants[i].1);
                let r = call(&mut c, &["FLOCK.RENEW", key, owner, "600000"]);
                assert_eq!(r.int(), want, "{what}: RENEW {key} {owner}");
            }
            8 => {
                if rng.chance(30) {
                    let n = grants.len() as i64;
                    grants.clear();
                    assert_eq!(revoke(&mut c, &[key]), n, "{what}: REVOKE {key}");
                } else {
                    let n = held.map(|i| grants.remove(i)).is_some() as i64;
                    let r = revoke(&mut c, &[key, owner]);
                    assert_eq!(r, n, "{what}: REVOKE {key} {owner}");
                }
            }
            _ => {
                // CHECK of a random grant's token, live or not.
                if let Some((_, t)) = grants.first() {
                    assert!(check(&mut c, key, *t) > 0, "{what}: CHECK of a live token");
                }
                assert_eq!(
                    check(&mut c, key, last + 1),
                    0,
                    "{what}: CHECK of a never issued token"
                );
            }
        }
        if grants.is_empty() {
            mode.clear();
        }
        // The server agrees with the model: same grants in token order, same mode.
        let (mode, grants) = &model[ki];
        assert_eq!(&holder_tokens(&mut c, key), grants, "{what}: HOLDERS {key}");
        if grants.is_empty() {
            assert_eq!(
                exists(&mut c, key),
                0,
                "{what}: {key} without grants exists"
            );
        } else {
            let k = kinfo(&mut c, key);
            let (m, limit) = match mode.as_str() {
                "x" => ("exclusive", 0),
                "s" => ("shared", 0),
                n => ("permits", n.parse().unwrap()),
            };
            assert_eq!(
                (k.mode.as_str(), k.limit, k.holders),
                (m, limit, grants.len() as i64),
                "{what}: INFO {key}"
            );
        }
    }
}

/// One key of `random_waits_of_every_kind_follow_one_fifo_queue`'s model.
#[derive(Default, Debug)]
struct QKey {
    /// "x", "s" or the limit as text (meaningful while `grants` is not empty).
    mode: String,
    grants: Vec<(String, i64)>,
    /// Waiting requests in arrival order: (owner, mode).
    queue: Vec<(String, String)>,
}

impl QKey {
    /// SPEC: "a shared waiter or permit when no exclusive grant is live and the limit is not
    /// reached"; an exclusive one when no grant is live.
    fn fits(&self, m: &str, max_holders: usize) -> bool {
        if self.grants.is_empty() {
            return true;
        }
        match m {
            "x" => false,
            "s" => self.mode == "s" && self.grants.len() < max_holders,
            n => self.mode == n && self.grants.len() < n.parse::<usize>().unwrap(),
        }
    }
    /// The key's limit: that of its live shared grants, else of its waiting shared requests.
    fn limit(&self) -> Option<String> {
        if !self.grants.is_empty() && self.mode != "x" {
            return Some(self.mode.clone());
        }
        self.queue
            .iter()
            .find(|(_, m)| m != "x")
            .map(|(_, m)| m.clone())
    }
}

#[test]
fn random_waits_of_every_kind_follow_one_fifo_queue() {
    // Seeded (FLOCK_KINDS_SEED): owners on their own connections send ACQUIRE ... BLOCK 0
    // for random kinds, the test releases and revokes; a model of SPEC's queue (one FIFO per
    // key, grant from the head while the head fits, nobody jumps it, the key's limit from
    // grants and waiting requests) predicts who holds after every step and which waiter
    // is answered, and with what. Waits are never retried or abandoned here (see the tests
    // above for those).
    let seed = seed_from_env("FLOCK_KINDS_SEED");
    eprintln!("FLOCK_KINDS_SEED={seed}");
    let mut rng = Rng::new(seed);
    let srv = Server::start();
    let mut c = srv.conn();
    let max_holders = 3;
    set_config(&mut c, "flock.max-holders", &max_holders.to_string());
    let names = ["a", "b", "c", "d", "e", "f", "g"];
    let mut conns: Vec<RawConn> = names
        .iter()
        .map(|_| RawConn::connect(srv.port()).expect("connect"))
        .collect();
    // Which key each owner's connection waits on (a blocked connection sends nothing else).
    let mut waiting: Vec<Option<usize>> = vec![None; names.len()];
    let keys = ["q0", "q1"];
    let mut model: Vec<QKey> = vec![QKey::default(), QKey::default()];
    let mut last = 0i64;
    // How much of the queue the run exercised: requests queued, hand-offs, the longest queue.
    let (mut queued, mut handed, mut longest) = (0, 0, 0);
    for step in 0..1_000 {
        let what = format!("seed {seed} step {step}");
        let ki = rng.below(2) as usize;
        let key = keys[ki];
        let k = &mut model[ki];
        let mut check_waiters = false;
        match rng.below(10) {
            0..=4 => {
                let free: Vec<usize> = (0..names.len()).filter(|&i| waiting[i].is_none()).collect();
                if free.is_empty() {
                    continue;
                }
                let oi = rng.pick(&free);
                let owner = names[oi];
                let m = rng.pick(&["x", "x", "s", "s", "2"]);
                let mut args = vec!["FLOCK.ACQUIRE", key, owner, "600000"];
                match m {
                    "x" => {}
                    "s" => args.push("SHARED"),
                    n => args.extend(["LIMIT", n]),
                }
                args.extend(["BLOCK", "0"]);
                conns[oi].send(&args).expect("send");
                let holds = k.grants.iter().position(|(o, _)| o == owner);
                let at_once = match holds {
                    Some(i) if k.mode == m => Some(Reply::Int(k.grants[i].1)),
                    Some(_) => Some(Reply::Err(format!(
                        "ERR owner already holds {} grant of {key}",
                        match k.mode.as_str() {
                            "x" => "an exclusive",
                            "s" => "a shared",
                            _ => "a permit",
                        }
                    ))),
                    None => match k.limit() {
                        Some(l) if m != "x" && l != m => Some(Reply::Err(if l == "s" {
                            format!("ERR limit mismatch: {key} admits any number of shared holders")
                        } else {
                            format!("ERR limit mismatch: {key} admits {l} shared holders")
                        })),
                        _ => None,
                    },
                };
                if let Some(want) = at_once {
                    let r = conns[oi].read_reply().expect("reply");
                    assert_eq!(r, want, "{what}: {args:?} (model {k:?})");
                } else if k.queue.is_empty() && k.fits(m, max_holders) {
                    let r = conns[oi].read_reply().expect("reply");
                    let t = r.int().unwrap_or_else(|| {
                        panic!("{what}: {args:?}: {r:?}, model grants at once ({k:?})")
                    });
                    assert!(t > last, "{what}: token {t} not above {last}");
                    last = t;
                    k.mode = m.to_string();
                    k.grants.push((owner.to_string(), t));
                } else {
                    k.queue.push((owner.to_string(), m.to_string()));
                    queued += 1;
                    longest = longest.max(k.queue.len());
                    waiting[oi] = Some(ki);
                    check_waiters = true;
                }
            }
            5 | 6 => {
                if k.grants.is_empty() {
                    continue;
                }
                let i = rng.below(k.grants.len() as u64) as usize;
                let (o, _) = k.grants.remove(i);
                assert_eq!(release(&mut c, key, &o), 1, "{what}: RELEASE {key} {o}");
            }
            7 => {
                let o = rng.pick(&names);
                let n = k
                    .grants
                    .iter()
                    .position(|(g, _)| g == o)
                    .map(|i| k.grants.remove(i))
                    .is_some();
                assert_eq!(
                    revoke(&mut c, &[key, o]),
                    n as i64,
                    "{what}: REVOKE {key} {o}"
                );
            }
            8 => {
                let n = k.grants.len() as i64;
                k.grants.clear();
                assert_eq!(revoke(&mut c, &[key]), n, "{what}: REVOKE {key}");
            }
            _ => {
                // A request without BLOCK from the control connection: never jumps the queue.
                let o = rng.pick(&names);
                let m = rng.pick(&["x", "s"]);
                let opts: &[&str] = if m == "s" { &["SHARED"] } else { &[] };
                let r = acq(&mut c, key, o, 600_000, opts);
                let holds = k.grants.iter().position(|(g, _)| g == o);
                match holds {
                    Some(i) if k.mode == m => assert_eq!(r, Reply::Int(k.grants[i].1), "{what}"),
                    Some(_) => assert!(r.is_err(), "{what}: other mode: {r:?}"),
                    None if r.is_err() => {
                        assert!(
                            k.limit().is_some_and(|l| m == "s" && l != "s"),
                            "{what}: {r:?} ({k:?})"
                        )
                    }
                    None if !k.queue.is_empty() || !k.fits(m, max_holders) => {
                        assert!(
                            r.is_nil(),
                            "{what}: {o} {m} jumped the queue or did not fit: {r:?} ({k:?})"
                        )
                    }
                    None => {
                        let t = tok(&r, &what);
                        assert!(t > last);
                        last = t;
                        k.mode = m.to_string();
                        k.grants.push((o.to_string(), t));
                    }
                }
            }
        }
        // Serve the queue as SPEC says: from the head while the head fits.
        while let Some((o, m)) = k.queue.first().cloned() {
            if !k.fits(&m, max_holders) {
                break;
            }
            k.queue.remove(0);
            handed += 1;
            let oi = names.iter().position(|n| *n == o).unwrap();
            waiting[oi] = None;
            let r = conns[oi].read_reply().unwrap_or_else(|e| {
                panic!("{what}: {o} ({m}) should have been granted {key} ({k:?}): {e}")
            });
            let t = tok(&r, &format!("{what}: {o} handed {key}"));
            assert!(t > last, "{what}: hand-off token {t} not above {last}");
            last = t;
            if k.grants.is_empty() {
                k.mode = m.clone();
            }
            k.grants.push((o, t));
        }
        if check_waiters {
            let n = k.queue.len() as i64;
            wait_until(&format!("{what}: {n} waiters on {key}"), || {
                parse_k(&call(&mut c, &["FLOCK.INFO", key]), key).is_some_and(|i| i.waiters == n)
            });
        }
        let k = &model[ki];
        assert_eq!(
            holder_tokens(&mut c, key),
            k.grants,
            "{what}: HOLDERS {key} (model {k:?})"
        );
        match parse_k(&call(&mut c, &["FLOCK.INFO", key]), key) {
            None => assert!(
                k.grants.is_empty() && k.queue.is_empty(),
                "{what}: {key} gone, model {k:?}"
            ),
            Some(i) => assert_eq!(
                i.waiters,
                k.queue.len() as i64,
                "{what}: waiters of {key} ({k:?})"
            ),
        }
    }
    eprintln!(
        "queue model: {queued} requests queued, {handed} handed off, longest queue {longest}"
    );
    assert!(
        queued > 20 && handed > 10,
        "the run hardly waited: {queued} queued, {handed} handed off"
    );
}

#[test]
fn flock_stats_counts_every_grant_of_every_kind() {
    let srv = Server::start();
    let mut c = srv.conn();
    let map = |r: &Reply| -> Vec<(String, Reply)> {
        r.pairs()
            .unwrap_or_else(|| panic!("not a map: {r:?}"))
            .into_iter()
            .map(|(k, v)| (k.string().unwrap_or_default(), v))
            .collect()
    };
    let get = |m: &[(String, Reply)], k: &str| -> Reply {
        m.iter()
            .find(|(n, _)| n == k)
            .map(|(_, v)| v.clone())
            .unwrap_or_else(|| panic!("no {k} in {m:?}"))
    };
    // Three readers released, two permits revoked, one writer expired: one class.
    for i in 0..3 {
        grant_kind(&mut c, "job:1", &format!("r{i}"), 60_000, &["SHARED"]);
    }
    for i in 0..3 {
        rel(&mut c, "job:1", &format!("r{i}"));
    }
    grant_kind(&mut c, "job:2", "p1", 60_000, &["LIMIT", "2"]);
    grant_kind(&mut c, "job:2", "p2", 60_000, &["LIMIT", "2"]);
    assert_eq!(revoke(&mut c, &["job:2"]), 2);
    grant_kind(&mut c, "job:3", "w", 30, &[]);
    wait_until("the writer's lease ends", || exists(&mut c, "job:3") == 0);
    let top = map(&call(&mut c, &["FLOCK.STATS", "GET", "job:#"]));
    let class = map(&get(&map(&get(&top, "classes")), "job:#"));
    let n = |k: &str| {
        get(&class, k)
            .int()
            .unwrap_or_else(|| panic!("{k}: {class:?}"))
    };
    assert_eq!(
        (n("grants"), n("released"), n("revoked"), n("expired")),
        (6, 3, 2, 1),
        "FLOCK.STATS of job:#: {class:?}"
    );
}

#[test]
fn waiters_are_served_by_a_read_locked_value_restored_or_copied_over_their_key() {
    let srv = Server::start();
    let mut c = srv.conn();
    grant_kind(&mut c, "src", "s1", 60_000, &["SHARED"]);
    let payload = call(&mut c, &["DUMP", "src"])
        .bytes()
        .expect("DUMP")
        .to_vec();
    for how in ["RESTORE", "COPY"] {
        grant_kind(&mut c, "lk", "w", 60_000, &[]);
        let r = spawn_acq(&srv, "lk", "r", 60_000, &["SHARED", "BLOCK", "0"]);
        wait_blocked(&mut c, 1);
        let reply = if how == "RESTORE" {
            call(
                &mut c,
                &[b"RESTORE".as_slice(), b"lk", b"0", &payload, b"REPLACE"],
            )
        } else {
            call(&mut c, &["COPY", "src", "lk", "REPLACE"])
        };
        assert!(!reply.is_err(), "{how}: {reply:?}");
        // The name now holds a read lock: the waiting reader fits and is granted.
        let ok = poll_until(DEADLINE, || owners(&mut c, "lk").len() == 2);
        assert!(
            ok,
            "{how} REPLACE put a read-locked value under the name a reader waits for; the \
             reader was not granted within {DEADLINE:?}: HOLDERS {:?}, INFO {:?}",
            owners(&mut c, "lk"),
            kinfo(&mut c, "lk")
        );
        tok(&join(r, "r"), how);
        assert_eq!(owners(&mut c, "lk"), ["s1", "r"], "{how}");
        assert_eq!(call(&mut c, &["DEL", "lk"]), Reply::Int(1));
    }
}

#[test]
fn a_reader_granted_as_its_connection_closes_is_released_again_and_the_queue_goes_on() {
    let srv = Server::start();
    let mut c = srv.conn();
    grant_kind(&mut c, "rw", "w", 60_000, &[]);
    let mut gone = srv.conn();
    let id = call(&mut gone, &["CLIENT", "ID"]).int().expect("CLIENT ID");
    let h = thread::spawn(move || {
        call_raw(
            &mut gone,
            &["FLOCK.ACQUIRE", "rw", "r1", "60000", "SHARED", "BLOCK", "0"],
        )
    });
    wait_blocked(&mut c, 1);
    let r2 = spawn_acq(&srv, "rw", "r2", 60_000, &["SHARED", "BLOCK", "0"]);
    wait_blocked(&mut c, 2);
    let w2 = spawn_acq(&srv, "rw", "w2", 60_000, &["BLOCK", "0"]);
    wait_blocked(&mut c, 3);
    // In one transaction: the release hands the key to r1 and r2, and r1's connection is
    // killed before its reply can be written: the grant to a client that has just gone away
    // is released again, r2 keeps its own.
    assert_eq!(call(&mut c, &["MULTI"]), Reply::Status("OK".into()));
    call(&mut c, &["FLOCK.RELEASE", "rw", "w"]);
    call(&mut c, &["CLIENT", "KILL", "ID", &id.to_string()]);
    let r = call(&mut c, &["EXEC"]);
    assert_eq!(r, Reply::Array(vec![Reply::Int(1), Reply::Int(1)]), "EXEC");
    assert!(
        h.join().expect("thread").is_err(),
        "r1's connection is closed"
    );
    tok(&join(r2, "r2"), "r2 in the run");
    wait_until("r1's orphaned grant is released", || {
        owners(&mut c, "rw") == ["r2"]
    });
    rel(&mut c, "rw", "r2");
    tok(&join(w2, "w2"), "w2 after r2 (r1's grant gone)");
}

#[test]
fn a_forged_aof_never_loads_a_state_that_breaks_the_kinds_rules() {
    // G1/G8 against files: FLOCK.APPLY STATE lines that no master writes (too many permits,
    // two exclusive grants, an owner twice, tokens out of order, bad limits, a last token
    // below a grant's) are appended to the AOF. The server must come up, and whatever it
    // loaded must obey the rules.
    let mut srv = Server::builder()
        .arg("appendonly", "yes")
        .arg("appendfsync", "always")
        .start();
    let mut c = srv.conn();
    grant_kind(&mut c, "good", "p1", 60_000, &["LIMIT", "2"]);
    let t0 = now_us();
    let dl = (now_ms() + 60_000).to_string();
    let t = |i: i64| (t0 + 1_000 + i).to_string();
    let g =
        |o: &'static str, i: i64| -> Vec<String> { vec![o.into(), t(i), dl.clone(), "0".into()] };
    let state = |key: &str,
                 mode: &str,
                 limit: &str,
                 last: String,
                 grants: Vec<Vec<String>>|
     -> Vec<String> {
        let mut v: Vec<String> = ["FLOCK.APPLY", key, "STATE", mode, limit]
            .iter()
            .map(|s| s.to_string())
            .collect();
        v.push(last);
        v.push(grants.len().to_string());
        v.extend(grants.into_iter().flatten());
        v.push("0".into());
        v
    };
    let forged = [
        state(
            "f:three-of-two",
            "permits",
            "2",
            t(3),
            vec![g("a", 1), g("b", 2), g("c", 3)],
        ),
        state(
            "f:two-exclusive",
            "exclusive",
            "0",
            t(5),
            vec![g("a", 4), g("b", 5)],
        ),
        state(
            "f:owner-twice",
            "shared",
            "0",
            t(7),
            vec![g("a", 6), g("a", 7)],
        ),
        state(
            "f:out-of-order",
            "shared",
            "0",
            t(9),
            vec![g("a", 9), g("b", 8)],
        ),
        state("f:limit-zero", "permits", "0", t(10), vec![g("a", 10)]),
        state(
            "f:shared-with-limit",
            "shared",
            "5",
            t(11),
            vec![g("a", 11)],
        ),
        state("f:bad-mode", "readers", "0", t(12), vec![g("a", 12)]),
        state("f:last-below", "permits", "3", t(0), vec![g("a", 13)]),
    ];
    srv.stop();
    let incr = srv
        .files()
        .into_iter()
        .find(|p| p.to_string_lossy().ends_with(".incr.aof"))
        .expect("an incremental AOF file");
    let mut bytes = std::fs::read(&incr).expect("read AOF");
    for f in &forged {
        encode_command(&mut bytes, f);
    }
    std::fs::write(&incr, bytes).expect("write AOF");
    srv.start_again();
    let mut c = srv.conn();
    srv.assert_log_clean();
    assert_eq!(owners(&mut c, "good"), ["p1"], "the genuine key loaded");
    let mut max = 0;
    for f in &forged {
        let key = f[1].as_str();
        let h = holder_tokens(&mut c, key);
        let Some(k) = parse_k(&call(&mut c, &["FLOCK.INFO", key]), key) else {
            continue; // refused: fine
        };
        eprintln!("forged {key} loaded as {k:?} {h:?}");
        let mut seen: Vec<&str> = h.iter().map(|(o, _)| o.as_str()).collect();
        seen.dedup();
        assert_eq!(seen.len(), h.len(), "{key}: an owner holds twice: {h:?}");
        assert!(
            h.windows(2).all(|w| w[0].1 < w[1].1),
            "{key}: HOLDERS not in token order: {h:?}"
        );
        match k.mode.as_str() {
            "exclusive" => assert_eq!(h.len(), 1, "{key}: G1: {h:?}"),
            "permits" => assert!(
                k.limit >= 1 && h.len() as i64 <= k.limit,
                "{key}: G1: {k:?} {h:?}"
            ),
            "shared" => assert_eq!(k.limit, 0, "{key}: {k:?}"),
            m => panic!("{key}: mode {m}"),
        }
        max = max.max(h.iter().map(|(_, t)| *t).max().unwrap_or(0));
    }
    let fresh = grant_kind(&mut c, "fresh", "n", 10_000, &["SHARED"]);
    assert!(
        fresh > max,
        "G3: a new token {fresh} not above a loaded one {max}"
    );
}
