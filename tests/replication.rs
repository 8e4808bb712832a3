//! G3/G7 across replication: replicas mirror the master's grants (owner, token, absolute
//! deadline), answer CHECK, refuse writes, and a promoted replica keeps fencing.

use flock_testkit::*;
use std::thread::sleep;
use std::time::{Duration, Instant};

type State = Option<(Option<Vec<u8>>, i64, i64)>;

fn state(c: &mut redis::Connection, key: &str) -> State {
    info(c, key).map(|i| (i.owner, i.token, i.ttl))
}

/// Same owner and token on both sides, leases within 1 s of each other.
#[track_caller]
fn assert_same(master: &State, replica: &State, what: &str) {
    match (master, replica) {
        (None, None) => {}
        (Some((mo, mt, ml)), Some((ro, rt, rl))) => {
            assert_eq!(
                (mo, mt),
                (ro, rt),
                "{what}: owner/token differ (master {master:?}, replica {replica:?})"
            );
            assert!(
                (ml - rl).abs() < 1000,
                "{what}: lease differs: master {ml} ms, replica {rl} ms"
            );
        }
        _ => panic!("{what}: master {master:?}, replica {replica:?}"),
    }
}

#[test]
fn replica_mirrors_grant_and_answers_check() {
    let m = Server::start();
    let r = Server::start_replica_of(&m);
    let (mut mc, mut rc) = (m.conn(), r.conn());
    let t = grant(&mut mc, "lk", "alice", 30_000);
    wait_replica(&mut mc);
    let ms = state(&mut mc, "lk");
    let rs = state(&mut rc, "lk");
    assert_same(&ms, &rs, "after acquire");
    assert_eq!(
        call(&mut rc, &["TYPE", "lk"]).string().as_deref(),
        Some("flocklock")
    );
    // CHECK is read-only: it works on a replica
    let left = check(&mut rc, "lk", t);
    assert!((1..=30_000).contains(&left), "CHECK on replica: {left}");
    assert_eq!(check(&mut rc, "lk", t + 1), 0);
    assert_eq!(check(&mut rc, "lk", t - 1), 0);
    // renew on master moves the replica's deadline
    assert_eq!(renew(&mut mc, "lk", "alice", 5000), Some(t));
    wait_replica(&mut mc);
    let rl = check(&mut rc, "lk", t);
    assert!(
        (1..=5000).contains(&rl),
        "replica lease after renew to 5000: {rl}"
    );
    // same-owner re-acquire resets the lease on the replica too
    assert_eq!(acquire(&mut mc, "lk", "alice", 20_000), Some(t));
    wait_replica(&mut mc);
    let rl = check(&mut rc, "lk", t);
    assert!(
        rl > 15_000 && rl <= 20_000,
        "replica lease after re-acquire with 20000: {rl}"
    );
}

#[test]
fn release_propagates() {
    let m = Server::start();
    let r = Server::start_replica_of(&m);
    let (mut mc, mut rc) = (m.conn(), r.conn());
    let t = grant(&mut mc, "lk", "alice", 30_000);
    wait_replica(&mut mc);
    assert_eq!(exists(&mut rc, "lk"), 1);
    assert_eq!(release(&mut mc, "lk", "alice"), 1);
    wait_replica(&mut mc);
    wait_until("replica drops the released lock", || {
        exists(&mut rc, "lk") == 0 && dbsize(&mut rc) == 0
    });
    assert_eq!(check(&mut rc, "lk", t), 0);
    assert_eq!(info(&mut rc, "lk"), None);
    // DEL of a held lock propagates as well
    grant(&mut mc, "lk2", "bob", 30_000);
    call(&mut mc, &["DEL", "lk2"]);
    wait_replica(&mut mc);
    wait_until("replica drops the deleted lock", || dbsize(&mut rc) == 0);
}

#[test]
fn expiry_propagates() {
    let m = Server::start();
    let r = Server::start_replica_of(&m);
    let (mut mc, mut rc) = (m.conn(), r.conn());
    // The lease ends between `at + 1000` (sent no earlier) and `granted + 1000` (granted no
    // later than its reply came): the first bounds the "still live" check, the second the
    // "ended" one (the grant itself may wait a while on a loaded machine).
    let at = Instant::now();
    let t = grant(&mut mc, "lk", "alice", 1000);
    let granted = Instant::now();
    wait_replica(&mut mc);
    // Read first, then look at the clock: replies that came back before `at + 1000` were
    // computed before the lease could end (10 ms for the ms clocks).
    let (keys, live) = (dbsize(&mut rc), check(&mut rc, "lk", t));
    if at.elapsed() < Duration::from_millis(990) {
        assert_eq!(keys, 1, "replica got the grant");
        assert!(live >= 1, "replica: grant live");
    }
    sleep(Duration::from_millis(1100).saturating_sub(granted.elapsed()));
    // past the absolute deadline the replica must not call the token live, reaped or not
    assert_eq!(
        check(&mut rc, "lk", t),
        0,
        "replica says an ended lease is live"
    );
    // and the master's expiry reaches the replica (DBSIZE counts keys even if logically expired)
    let gone = poll_until(Duration::from_secs(5), || dbsize(&mut rc) == 0);
    assert!(
        gone,
        "expired lock still on the replica after 5 s (master dbsize {})",
        dbsize(&mut mc)
    );
    assert_eq!(dbsize(&mut mc), 0);
}

#[test]
fn replica_refuses_writes() {
    let m = Server::start();
    let r = Server::start_replica_of(&m);
    let (mut mc, mut rc) = (m.conn(), r.conn());
    let t = grant(&mut mc, "lk", "alice", 30_000);
    wait_replica(&mut mc);
    let cases: &[&[&str]] = &[
        &["FLOCK.ACQUIRE", "lk", "alice", "1000"],
        &["FLOCK.ACQUIRE", "free", "bob", "1000"],
        &["FLOCK.RELEASE", "lk", "alice"],
        &["FLOCK.RENEW", "lk", "alice", "60000"],
    ];
    for args in cases {
        let rep = call(&mut rc, args);
        assert_err_prefix(&rep, "READONLY", &format!("{args:?} on replica"));
    }
    let (o, tok, ttl) = held(&mut rc, "lk");
    assert_eq!((o.as_str(), tok), ("alice", t));
    assert!(ttl <= 30_000);
    assert_eq!(exists(&mut rc, "free"), 0);
    // INFO works on a replica
    assert!(info(&mut rc, "lk").is_some());
}

#[test]
fn promoted_replica_issues_greater_tokens() {
    let m = Server::start();
    let r = Server::start_replica_of(&m);
    let (mut mc, mut rc) = (m.conn(), r.conn());
    let mut max = 0;
    for i in 0..30 {
        let key = format!("k{}", i % 5);
        let t = grant(&mut mc, &key, "w", 30_000);
        max = max.max(t);
        assert_eq!(release(&mut mc, &key, "w"), 1);
    }
    let t_held = grant(&mut mc, "held", "alice", 30_000);
    let t_short = grant(&mut mc, "short", "bob", 1500);
    max = max.max(t_held).max(t_short);
    wait_replica(&mut mc);
    drop(m); // the master dies
    assert_eq!(
        call(&mut rc, &["REPLICAOF", "NO", "ONE"])
            .string()
            .as_deref(),
        Some("OK")
    );
    assert_eq!(
        info_field(&mut rc, "replication", "role").as_deref(),
        Some("master")
    );
    // grants that reached the replica are still in force
    assert_eq!(
        acquire(&mut rc, "held", "bob", 1000),
        None,
        "promoted replica granted a held lock"
    );
    assert_eq!(
        acquire(&mut rc, "held", "alice", 30_000),
        Some(t_held),
        "holder's retry after failover"
    );
    // new grants exceed every token the master issued
    for i in 0..5 {
        let key = format!("k{i}");
        let t = grant(&mut rc, &key, "v", 10_000);
        assert!(
            t > max,
            "promoted replica issued {t} on {key}, master had issued up to {max}"
        );
    }
    // the promoted server reaps leases on its own now: k0..k4 and `held` stay, `short` goes
    let gone = poll_until(Duration::from_secs(6), || dbsize(&mut rc) == 6);
    assert!(
        gone,
        "lease (1.5 s) taken on the old master not reaped by the promoted replica (dbsize {})",
        dbsize(&mut rc)
    );
    assert_eq!(exists(&mut rc, "short"), 0);
    let t = grant(&mut rc, "short", "carol", 10_000);
    assert!(t > t_short);
}

#[test]
fn promoted_replica_exceeds_tokens_it_never_saw() {
    // G3 for grants lost in the failover (same machine: same clock)
    let m = Server::start();
    let r = Server::start_replica_of(&m);
    let (mut mc, mut rc) = (m.conn(), r.conn());
    let t0 = grant(&mut mc, "seen", "alice", 30_000);
    wait_replica(&mut mc);
    // cut the replica off: stop it, then drop its link on the master
    r.signal("STOP");
    let k = call(&mut mc, &["CLIENT", "KILL", "TYPE", "replica"]);
    assert!(!k.is_err(), "CLIENT KILL TYPE replica: {k:?}");
    let mut lost = 0;
    for i in 0..10 {
        lost = grant(&mut mc, &format!("lost{i}"), "bob", 30_000);
    }
    assert!(lost > t0);
    drop(mc);
    drop(m); // master gone before the replica wakes up
    r.signal("CONT");
    assert_eq!(
        call(&mut rc, &["REPLICAOF", "NO", "ONE"])
            .string()
            .as_deref(),
        Some("OK")
    );
    assert_eq!(
        exists(&mut rc, "lost0"),
        0,
        "the replica was not cut off in time"
    );
    let t = grant(&mut rc, "lost0", "carol", 10_000);
    assert!(
        t > lost,
        "promoted replica issued {t}, below lost grant {lost}"
    );
}

#[test]
fn replica_with_aof_reaches_master_state() {
    let m = Server::start();
    let mut r = Server::builder()
        .replica_of(&m)
        .arg("appendonly", "yes")
        .arg("appendfsync", "always")
        .start();
    let (mut mc, mut rc) = (m.conn(), r.conn());
    let keys: Vec<String> = (0..10).map(|i| format!("k{i}")).collect();
    for (i, k) in keys.iter().enumerate() {
        grant(&mut mc, k, &format!("owner{i}"), 30_000 + i as i64 * 1000);
    }
    release(&mut mc, "k1", "owner1");
    renew(&mut mc, "k2", "owner2", 50_000).expect("renew");
    acquire(&mut mc, "k3", "owner3", 45_000).expect("re-acquire");
    grant(&mut mc, "short", "x", 200);
    call(&mut mc, &["DEL", "k4"]);
    sleep(Duration::from_millis(400)); // `short` ends
    wait_replica(&mut mc);
    wait_until("replica drops `short`", || {
        let _ = check(&mut rc, "short", 1);
        dbsize(&mut rc) == dbsize(&mut mc)
    });
    for k in keys.iter().chain(std::iter::once(&"short".to_string())) {
        assert_same(
            &state(&mut mc, k),
            &state(&mut rc, k),
            &format!("{k} on replica"),
        );
    }
    // rewrite the replica's AOF, then more writes land in its incremental AOF
    rewrite_aof(&mut rc);
    release(&mut mc, "k5", "owner5");
    grant(&mut mc, "k1", "late", 40_000);
    renew(&mut mc, "k6", "owner6", 55_000).expect("renew");
    wait_replica(&mut mc);
    let snapshot: Vec<(String, State)> = keys
        .iter()
        .map(|k| (k.clone(), state(&mut mc, k)))
        .collect();
    for (k, s) in &snapshot {
        assert_same(
            s,
            &state(&mut rc, k),
            &format!("{k} on replica after rewrite"),
        );
    }
    // G7: the replica's AOF holds effects, not client commands
    let aof = r.aof_bytes();
    assert!(
        !contains_bytes(&aof, b"FLOCK.ACQUIRE"),
        "replica AOF contains FLOCK.ACQUIRE"
    );
    assert!(
        !contains_bytes(&aof, b"FLOCK.RENEW"),
        "replica AOF contains FLOCK.RENEW"
    );
    // the grant to `late` happened after the rewrite: only the incremental AOF can hold it
    assert!(
        contains_bytes(&aof, b"FLOCK.APPLY") && contains_bytes(&aof, b"late"),
        "replica's AOF lacks the FLOCK.APPLY effect of the grant k1 -> `late` that it applied from \
         the master's stream; its incremental AOF: {:?}",
        r.aof_incr_text()
    );
    // the master goes away; the replica restarts from its own AOF
    drop(mc);
    drop(m);
    r.restart();
    let mut rc = r.conn();
    for (k, s) in &snapshot {
        let now = state(&mut rc, k);
        match (s, &now) {
            (None, None) => {}
            (Some((mo, mt, ml)), Some((ro, rt, rl))) => {
                assert_eq!((mo, mt), (ro, rt), "{k} after replica restart from AOF");
                assert!(
                    *rl <= ml + 50,
                    "{k}: lease {rl} after restart > {ml} before (deadline not absolute)"
                );
                assert!(
                    *rl >= ml - 10_000,
                    "{k}: lease {rl} after restart far below {ml}"
                );
            }
            _ => panic!("{k} after replica restart from AOF: before {s:?}, now {now:?}"),
        }
    }
}

/// With no AOF and no replica the module stops building replication effects (after its
/// once-a-second INFO check). A replica that attaches later, and an AOF turned on later, must
/// still reach the master's state.
#[test]
fn consumers_that_arrive_later_get_every_effect() {
    let mut master = Server::start();
    let mut m = master.conn();
    wait_until("the module stops building effects nobody consumes", || {
        info_field(&mut m, "flock", "flock_replicating_effects").as_deref() == Some("0")
    });
    let t_old = grant(&mut m, "before", "a", 60_000);
    grant(&mut m, "released", "a", 60_000);
    assert_eq!(release(&mut m, "released", "a"), 1);
    // A replica attaches: full sync, then the effects stream.
    let replica = Server::start_replica_of(&master);
    let mut r = replica.conn();
    assert_eq!(
        info_field(&mut m, "flock", "flock_replicating_effects").as_deref(),
        Some("1"),
        "a replica consumes effects"
    );
    let t_after = grant(&mut m, "after", "b", 60_000);
    assert_eq!(release(&mut m, "before", "a"), 1);
    wait_replica(&mut m);
    assert_eq!(
        exists(&mut r, "before"),
        0,
        "the release after the sync reached the replica"
    );
    assert_eq!(held(&mut r, "after").1, t_after);
    assert_eq!(exists(&mut r, "released"), 0);
    assert!(t_after > t_old);
    drop(r);
    drop(replica);
    // The replica is gone (the backlog stays); turn the AOF on at runtime, restart from it.
    // fsync every write: the restart below is a SIGKILL, and with `everysec` the last
    // second of writes may not be on disk yet.
    call(&mut m, &["CONFIG", "SET", "appendfsync", "always"]);
    assert_eq!(
        call(&mut m, &["CONFIG", "SET", "appendonly", "yes"]),
        Reply::Status("OK".into())
    );
    wait_until("AOF rewrite finished", || {
        info_field(&mut m, "persistence", "aof_rewrite_in_progress").as_deref() == Some("0")
            && info_field(&mut m, "persistence", "aof_rewrite_scheduled").as_deref() == Some("0")
    });
    let t_aof = grant(&mut m, "aof", "c", 60_000);
    assert_eq!(release(&mut m, "after", "b"), 1);
    master.set_arg("appendonly", "yes");
    master.set_arg("appendfsync", "always");
    master.restart();
    let mut m = master.conn();
    assert_eq!(
        held(&mut m, "aof").1,
        t_aof,
        "a grant after AOF was enabled survives"
    );
    assert_eq!(
        exists(&mut m, "after"),
        0,
        "a release after AOF was enabled survives"
    );
}

/// MOVE of any key leaves the client, and on the replica the link to its master, in the
/// database they had selected. Valkey 8.1 runs module keyspace callbacks on the client whose
/// command caused the event and leaves it in the event's database; without flock's
/// workaround a replica then applied every later write of the master to the wrong database.
#[test]
fn move_leaves_the_client_and_the_replica_link_in_their_database() {
    let master = Server::start();
    let replica = master.start_replica();
    let mut c = master.conn();
    let mut r = replica.conn();
    for (key, setup) in [
        ("plain", vec!["SET", "plain", "v"]),
        ("lk", vec!["FLOCK.ACQUIRE", "lk", "o", "60000"]),
    ] {
        assert!(!call(&mut c, &setup).is_err());
        assert_eq!(
            call(&mut c, &["MOVE", key, "1"]),
            Reply::Int(1),
            "MOVE {key}"
        );
        let info = call(&mut c, &["CLIENT", "INFO"])
            .string()
            .unwrap_or_default();
        assert!(
            info.contains(" db=0 "),
            "after MOVE {key} the client is not in db 0: {info}"
        );
        assert_eq!(
            call(&mut c, &["SET", &format!("after:{key}"), "x"]),
            Reply::Status("OK".into())
        );
    }
    wait_replica(&mut c);
    for key in ["after:plain", "after:lk"] {
        assert_eq!(
            call(&mut r, &["GET", key]),
            Reply::Bulk(b"x".to_vec()),
            "{key}: a write after MOVE must land in db 0 on the replica too"
        );
    }
    assert_eq!(call(&mut r, &["SELECT", "1"]), Reply::Status("OK".into()));
    assert_eq!(call(&mut r, &["EXISTS", "plain", "lk"]), Reply::Int(2));
}

#[test]
fn a_raised_token_mark_reaches_the_replicas_without_a_grant() {
    // DEBUG RELOAD ends a load on the master, which raises its token mark (G3: a restart is a
    // promotion of what was saved); the mark goes to the replica as `FLOCK.APPLY MARK` from
    // the next cron tick, with no grant to carry it, and without the command that caused it.
    let m = Server::start();
    let r = Server::start_replica_of(&m);
    let (mut mc, mut rc) = (m.conn(), r.conn());
    let t = grant(&mut mc, "k", "w", 30_000);
    assert_eq!(release(&mut mc, "k", "w"), 1);
    wait_replica(&mut mc);
    let before = info_i64(&mut mc, "flock", "flock_token_high_water");
    assert!(before >= t);
    assert_eq!(
        call(&mut mc, &["DEBUG", "RELOAD"]).string().as_deref(),
        Some("OK")
    );
    let raised = info_i64(&mut mc, "flock", "flock_token_high_water");
    assert!(
        raised >= before + (1 << 24),
        "the mark {raised} was not raised past {before} by the reload"
    );
    let heard = poll_until(Duration::from_secs(5), || {
        info_i64(&mut rc, "flock", "flock_token_high_water") == raised
    });
    assert!(
        heard,
        "the replica's mark {} did not reach the master's {raised}",
        info_i64(&mut rc, "flock", "flock_token_high_water")
    );
    assert_eq!(
        info_field(&mut rc, "replication", "role").as_deref(),
        Some("slave"),
        "the replica ran something else than the mark"
    );
    r.assert_log_clean();
    assert!(
        !r.log().contains("sending an error to its"),
        "{}",
        r.log_tail(20)
    );
}
