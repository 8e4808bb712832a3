//! The checker catches what it should: synthetic histories with planted violations of every
//! guarantee it checks, for every lock kind.

use super::*;

pub(super) fn synthetic_shared(keys: usize) -> Shared {
    Shared::new(0, keys, 0)
}

fn grant_rec(key: usize, owner: &str, token: i64, ttl_ms: u64, proofs: &[(u64, u64)]) -> GrantRec {
    kind_rec(key, owner, token, Kind::Exclusive, ttl_ms, proofs)
}

pub(super) fn kind_rec(
    key: usize,
    owner: &str,
    token: i64,
    kind: Kind,
    ttl_ms: u64,
    proofs: &[(u64, u64)],
) -> GrantRec {
    GrantRec {
        key,
        owner: owner.into(),
        token,
        kind,
        ttl_us: ttl_ms * 1000,
        send: proofs[0].0,
        ack: proofs[0].1,
        queue_send: proofs[0].0,
        lower: proofs[0].0,
        upper: proofs[0].1,
        proofs: proofs.to_vec(),
        proof_epochs: vec![0; proofs.len()],
        ends: Vec::new(),
        released: None,
        unsure: false,
        touched: proofs[0].0,
        failover_epoch: 0,
        lost_in_failover: false,
        bound: None,
        durable: false,
        durable_lower: proofs[0].0,
    }
}

/// The violations the checker finds in `h` with these logs, on 3 keys: a mutex (0), a
/// read/write key (1), a semaphore of 2 (2).
pub(super) fn violations_of(h: &mut History, logs: &[(usize, &[&str])]) -> Vec<String> {
    let sh = synthetic_shared(3);
    assert_eq!(
        sh.kinds,
        [
            KeyKind::Exclusive,
            KeyKind::ReadWrite,
            KeyKind::Semaphore(2)
        ]
    );
    h.quiet = true;
    let mut l: HashMap<usize, Vec<String>> = (0..3).map(|k| (k, Vec::new())).collect();
    for (k, entries) in logs {
        l.insert(*k, entries.iter().map(|s| s.to_string()).collect());
    }
    check_history(&sh, h, &l);
    std::mem::take(&mut h.violations)
}

#[test]
fn the_checker_finds_planted_violations() {
    let ms = |x: u64| x * 1000;
    // A clean history: two grants of key 0 one after the other, one of key 1.
    let mut h = History::default();
    h.grants
        .push(grant_rec(0, "a", 10, 100, &[(0, ms(1)), (ms(50), ms(51))]));
    h.grants.push(grant_rec(
        0,
        "b",
        20,
        100,
        &[(ms(60), ms(61)), (ms(90), ms(91))],
    ));
    h.grants
        .push(grant_rec(1, "c", 30, 100, &[(ms(95), ms(96))]));
    assert!(
        violations_of(&mut h, &[]).is_empty(),
        "clean history flagged"
    );

    // G1: b proves itself while a is live throughout (a proved live at 1 ms and at 50 ms).
    let mut h = History::default();
    h.grants
        .push(grant_rec(0, "a", 10, 100, &[(0, ms(1)), (ms(50), ms(51))]));
    h.grants
        .push(grant_rec(0, "b", 20, 100, &[(ms(10), ms(11))]));
    let v = violations_of(&mut h, &[]);
    assert!(v.iter().any(|x| x.contains("(G1)")), "G1 not found: {v:?}");

    // G3: the same token for two owners; a later grant with a smaller token.
    let mut h = History::default();
    h.grants.push(grant_rec(0, "a", 10, 10, &[(0, ms(1))]));
    h.grants
        .push(grant_rec(1, "b", 10, 10, &[(ms(20), ms(21))]));
    h.grants.push(grant_rec(1, "c", 5, 10, &[(ms(40), ms(41))]));
    let v = violations_of(&mut h, &[]);
    assert!(v.iter().any(|x| x.contains("issued twice")), "{v:?}");
    assert!(v.iter().any(|x| x.contains("is not above")), "{v:?}");

    // G9: a lease seen over long before its end, with nobody revoking it.
    let mut h = History::default();
    let mut g = grant_rec(0, "a", 10, 1000, &[(0, ms(1))]);
    g.ends.push((ms(100), ms(101), 0, 0));
    h.grants.push(g.clone());
    let v = violations_of(&mut h, &[]);
    assert!(v.iter().any(|x| x.contains("ended early")), "{v:?}");
    // ...but not when the operator revoked it meanwhile.
    h.grants = vec![g];
    h.operator.push(OperatorOp {
        key: 0,
        owner: None,
        send: ms(50),
        done: ms(51),
    });
    assert!(violations_of(&mut h, &[]).is_empty());

    // Logs: back in token order, a refused write present, an accepted write missing.
    let mut h = History::default();
    for (tag, token, outcome) in [
        ("20:1:1", 20, Outcome::Accepted),
        ("10:1:2", 10, Outcome::Refused),
        ("20:1:3", 20, Outcome::Accepted),
    ] {
        h.writes.push(WriteRec {
            key: 0,
            token,
            tag: tag.into(),
            send: 0,
            ack: 1,
            outcome,
            lost_in_failover: false,
            kind: Kind::Exclusive,
            epoch: 0,
        });
    }
    let v = violations_of(&mut h, &[(0, &["20:1:1", "10:1:2"])]);
    assert!(
        v.iter().any(|x| x.contains("goes back in token order")),
        "{v:?}"
    );
    assert!(
        v.iter()
            .any(|x| x.contains("refused FENCED write is in the log")),
        "{v:?}"
    );
    assert!(v.iter().any(|x| x.contains("20:1:3 missing")), "{v:?}");
}

#[test]
fn the_checker_finds_planted_kind_violations() {
    let ms = |x: u64| x * 1000;
    let two = |a: u64, b: u64| [(ms(a), ms(a) + 500), (ms(b), ms(b) + 500)];
    // A clean history: readers together on the read/write key (1), then a writer; two permits
    // together on the semaphore of 2 (key 2), a third after one of them ended.
    let clean = || {
        let mut h = History::default();
        h.grants
            .push(kind_rec(1, "r1", 10, Kind::Shared, 1000, &two(0, 50)));
        h.grants
            .push(kind_rec(1, "r2", 12, Kind::Shared, 1000, &two(5, 40)));
        h.grants
            .push(kind_rec(1, "w", 20, Kind::Exclusive, 1000, &two(60, 90)));
        h.grants
            .push(kind_rec(2, "p1", 11, Kind::Permit, 1000, &two(0, 50)));
        h.grants
            .push(kind_rec(2, "p2", 13, Kind::Permit, 1000, &two(5, 80)));
        h.grants
            .push(kind_rec(2, "p3", 21, Kind::Permit, 1000, &two(60, 90)));
        h
    };
    let mut h = clean();
    h.holders.push(HoldersRec {
        key: 2,
        send: ms(20),
        ack: ms(21),
        grants: vec![("p1".into(), 11, 900), ("p2".into(), 13, 900)],
        epoch: 0,
    });
    h.reads.push(ReadRec {
        key: 1,
        token: 10,
        last: Some("5:0:1".into()),
        epoch: 0,
    });
    let v = violations_of(
        &mut h,
        &[
            (1, &["5:0:1", "20:0:2"]),
            (2, &["11:0:1", "13:0:2", "11:0:3"]),
        ],
    );
    // The log entries were not written by recorded writes: only that may be flagged.
    assert!(
        v.iter().all(|x| x.contains("which no client wrote")),
        "clean kinds history flagged: {v:?}"
    );

    // A writer live among readers: its span overlaps theirs.
    let mut h = clean();
    h.grants
        .push(kind_rec(1, "w2", 14, Kind::Exclusive, 1000, &two(10, 30)));
    let v = violations_of(&mut h, &[]);
    assert!(
        v.iter()
            .any(|x| x.contains("live grants of") && x.contains("(G1)")),
        "{v:?}"
    );

    // A third permit proving itself while two are live throughout.
    let mut h = clean();
    h.grants.push(kind_rec(
        2,
        "p4",
        16,
        Kind::Permit,
        1000,
        &[(ms(20), ms(21))],
    ));
    let v = violations_of(&mut h, &[]);
    assert!(v.iter().any(|x| x.contains("proved live within")), "{v:?}");

    // HOLDERS: three permits at once, out of token order, an owner twice, a sure-live grant
    // left out.
    let mut h = clean();
    h.holders.push(HoldersRec {
        key: 2,
        send: ms(20),
        ack: ms(21),
        grants: vec![
            ("p2".into(), 13, 900),
            ("p1".into(), 11, 900),
            ("p1".into(), 99, 900),
        ],
        epoch: 0,
    });
    h.holders.push(HoldersRec {
        key: 1,
        send: ms(20),
        ack: ms(21),
        grants: vec![("r1".into(), 10, 900)],
        epoch: 0,
    });
    let v = violations_of(&mut h, &[]);
    for want in [
        "FLOCK.HOLDERS {chaos2}:lock at 0.020s..0.021s lists",
        "is not in token order",
        "lists an owner twice",
        "leaves out token 12",
    ] {
        assert!(v.iter().any(|x| x.contains(want)), "{want}: {v:?}");
    }

    // The semaphore's log: a third permit writes between the entries of two others.
    let mut h = clean();
    let v = violations_of(
        &mut h,
        &[(2, &["11:0:1", "13:0:2", "21:0:3", "13:0:4", "11:0:5"])],
    );
    assert!(
        v.iter().any(|x| x.contains("3 writers live at once")),
        "{v:?}"
    );

    // A write under a shared token accepted, and in the log; a read between two entries of
    // one writer.
    let mut h = clean();
    h.writes.push(WriteRec {
        key: 1,
        token: 10,
        tag: "10:0:1".into(),
        send: ms(10),
        ack: ms(11),
        outcome: Outcome::Accepted,
        lost_in_failover: false,
        kind: Kind::Shared,
        epoch: 0,
    });
    h.reads.push(ReadRec {
        key: 1,
        token: 12,
        last: Some("20:0:2".into()),
        epoch: 0,
    });
    for tag in ["20:0:2", "20:0:3"] {
        h.writes.push(WriteRec {
            key: 1,
            token: 20,
            tag: tag.into(),
            send: ms(70),
            ack: ms(71),
            outcome: Outcome::Accepted,
            lost_in_failover: false,
            kind: Kind::Exclusive,
            epoch: 0,
        });
    }
    let v = violations_of(&mut h, &[(1, &["10:0:1", "20:0:2", "20:0:3"])]);
    assert!(
        v.iter()
            .any(|x| x.contains("under a shared token was accepted")),
        "{v:?}"
    );
    assert!(
        v.iter().any(|x| x.contains("written under a shared token")),
        "{v:?}"
    );
    assert!(
        v.iter()
            .any(|x| x.contains("between two entries of writer")),
        "{v:?}"
    );

    // FIFO: a request sent after a waiter was queued is granted a smaller token than the
    // waiter's; another is granted while a waiter that later timed out still waited.
    let mut h = clean();
    h.waiters.push(WaitRec {
        key: 1,
        kind: Kind::Exclusive,
        send: ms(55),
        retried: false,
        queued_by: Some(ms(56)),
        granted: Some(20),
        ack: ms(60),
        waited_until: None,
        epoch: 0,
    });
    h.grants.push(kind_rec(
        1,
        "r3",
        15,
        Kind::Shared,
        100,
        &[(ms(57), ms(58))],
    ));
    h.waiters.push(WaitRec {
        key: 2,
        kind: Kind::Permit,
        send: ms(50),
        retried: false,
        queued_by: Some(ms(51)),
        granted: None,
        ack: ms(100),
        waited_until: Some(ms(100)),
        epoch: 0,
    });
    let v = violations_of(&mut h, &[]);
    assert!(
        v.iter()
            .any(|x| x.contains("token 15 while that waiter waited (it was granted token 20")),
        "{v:?}"
    );
    assert!(
        v.iter()
            .any(|x| x.contains("token 21 while that waiter waited (it timed out")),
        "{v:?}"
    );
}

#[test]
fn the_checker_finds_a_grant_inside_a_lock_delay() {
    let ms = |x: u64| x * 1000;
    // Lock-delay 200 ms from 10 ms on; token 10 (100 ms lease from 20 ms) expires at 120 ms at
    // the earliest, so its slot is taken until 320 ms.
    let base = || {
        let mut h = History::default();
        h.lock_delay.push((ms(10), Some(200)));
        h.grants
            .push(grant_rec(0, "a", 10, 100, &[(ms(20), ms(21))]));
        h
    };
    let mut h = base();
    h.grants
        .push(grant_rec(0, "b", 20, 100, &[(ms(400), ms(401))]));
    assert!(violations_of(&mut h, &[]).is_empty());
    let mut h = base();
    h.grants
        .push(grant_rec(0, "b", 20, 100, &[(ms(200), ms(201))]));
    let v = violations_of(&mut h, &[]);
    assert!(
        v.iter().any(|x| x.contains("within the 200 ms lock-delay")),
        "{v:?}"
    );
    // Not when it was released, nor when the delay was changed (unknown) meanwhile.
    let mut h = base();
    h.grants[0].released = Some(ms(50));
    h.grants
        .push(grant_rec(0, "b", 20, 100, &[(ms(200), ms(201))]));
    assert!(violations_of(&mut h, &[]).is_empty());
    let mut h = base();
    h.lock_delay.push((ms(150), None));
    h.grants
        .push(grant_rec(0, "b", 20, 100, &[(ms(200), ms(201))]));
    assert!(violations_of(&mut h, &[]).is_empty());
}

#[test]
fn a_grant_revived_by_a_failover_is_two_spans() {
    let ms = |x: u64| x * 1000;
    // Token 10 proves itself at 1 ms and, revived on the new master (a failover lost its
    // release), at 90 ms; token 20 was granted on the old master at 50 ms. One span 1..90 ms
    // would hold 20's grant; one per epoch does not.
    let mut h = History::default();
    let mut g = grant_rec(1, "a", 10, 1000, &[(0, ms(1)), (ms(90), ms(91))]);
    g.proof_epochs = vec![0, 1];
    h.grants.push(g.clone());
    h.grants
        .push(grant_rec(1, "b", 20, 100, &[(ms(50), ms(51))]));
    assert!(violations_of(&mut h, &[]).is_empty());
    // In one epoch it is a violation.
    g.proof_epochs = vec![0, 0];
    h.grants[0] = g;
    let v = violations_of(&mut h, &[]);
    assert!(v.iter().any(|x| x.contains("(G1)")), "{v:?}");
}

#[test]
fn the_checker_finds_a_bound_grant_outliving_its_killed_connection() {
    let ms = |x: u64| x * 1000;
    // Bound grant 10 of the mutex (client 0's connection 1), proved at 1 ms and 40 ms; its
    // connection killed at 50..51 ms; token 20 granted at 55 ms and proved at 80 ms: no overlap,
    // the bound grant's span ends at the kill (its 1 s lease notwithstanding).
    let base = || {
        let mut h = History::default();
        let mut g = grant_rec(0, "a", 10, 1000, &[(0, ms(1)), (ms(40), ms(41))]);
        g.bound = Some((0, 1));
        h.grants.push(g);
        h.grants.push(grant_rec(
            0,
            "b",
            20,
            1000,
            &[(ms(55), ms(56)), (ms(80), ms(81))],
        ));
        h.kills.push(KillRec {
            client: 0,
            gen: 1,
            conn_id: 7,
            send: ms(50),
            ack: ms(51),
        });
        h.closed.insert((0, 1), ms(50));
        h
    };
    let mut h = base();
    // Its end seen at 60 ms (CHECK 0), long before its lease's end: no G9 violation, the
    // connection had closed; a reply to a request sent before the kill is allowed.
    h.grants[0].ends.push((ms(60), ms(61), 0, 0));
    h.grants[0].proofs.push((ms(49), ms(52)));
    h.grants[0].proof_epochs.push(0);
    let v = violations_of(&mut h, &[]);
    assert!(v.is_empty(), "clean bound history flagged: {v:?}");
    assert_eq!(h.checks["G11 bound grants ended by CLIENT KILL"], 1);

    // Planted: a CHECK > 0 (a proof) under token 10 sent after the kill's reply.
    let mut h = base();
    h.grants[0].proofs.push((ms(70), ms(71)));
    h.grants[0].proof_epochs.push(0);
    let v = violations_of(&mut h, &[]);
    assert!(
        v.iter()
            .any(|x| x.contains("(G11)") && x.contains("a proof of life")),
        "{v:?}"
    );
    // Planted: an accepted FENCED write under it after the kill; a HOLDERS listing of it.
    let mut h = base();
    h.writes.push(WriteRec {
        key: 0,
        token: 10,
        tag: "10:0:1".into(),
        send: ms(60),
        ack: ms(61),
        outcome: Outcome::Accepted,
        lost_in_failover: false,
        kind: Kind::Exclusive,
        epoch: 0,
    });
    let v = violations_of(&mut h, &[(0, &["10:0:1"])]);
    assert!(
        v.iter()
            .any(|x| x.contains("(G11)") && x.contains("an accepted FENCED write")),
        "{v:?}"
    );
    let mut h = base();
    h.holders.push(HoldersRec {
        key: 0,
        send: ms(90),
        ack: ms(91),
        grants: vec![("a".into(), 10, 500)],
        epoch: 0,
    });
    let v = violations_of(&mut h, &[]);
    assert!(
        v.iter()
            .any(|x| x.contains("(G11)") && x.contains("FLOCK.HOLDERS listing")),
        "{v:?}"
    );
    // The same grant unbound: the early end is a G9 violation.
    let mut h = base();
    h.grants[0].bound = None;
    h.grants[0].ends.push((ms(60), ms(61), 0, 0));
    let v = violations_of(&mut h, &[]);
    assert!(v.iter().any(|x| x.contains("ended early")), "{v:?}");
}
