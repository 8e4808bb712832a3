//! Who gets the key and in which order: readers share, a waiting writer holds later readers
//! back, semaphores admit at most n, tokens grow, a holder repeating its mode, one limit per
//! key, option syntax, max-holders, one wait per owner, runs of readers and their hand-offs.

use super::helpers::*;
use flock_testkit::*;
use std::thread;
use std::time::{Duration, Instant};

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
