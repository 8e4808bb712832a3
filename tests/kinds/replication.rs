//! Replicas mirroring every kind and keeping it when promoted (G7), delayed slots on a
//! replica, and cluster slot migration.

use super::helpers::*;
use flock_testkit::*;

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
