//! M.1 (docs/CLIENTS.md, "Several keys at once"): `lock_many` over FLOCK.MACQUIRE grants every
//! key or none, waits for all of them at once, and its leases release together. Against a real
//! server with the module (one with FLOCK.MACQUIRE); each test starts its own.

use std::time::Duration;

use flock_client::{Error, Flock, LockOptions, LossReason, Mode, Wait};
use flock_testkit::aio::{info_i64, q, wait_until};
use flock_testkit::{Cluster, Server};
use redis::cluster::ClusterClient;
use tokio::time::Instant;

const MS: fn(u64) -> Duration = Duration::from_millis;

async fn server_check(c: &mut redis::aio::MultiplexedConnection, key: &str, token: u64) -> u64 {
    q(c, &["FLOCK.CHECK", key, &token.to_string()]).await
}

async fn holders(c: &mut redis::aio::MultiplexedConnection, key: &str) -> usize {
    q::<Vec<redis::Value>>(c, &["FLOCK.HOLDERS", key])
        .await
        .len()
}

async fn waiters(c: &mut redis::aio::MultiplexedConnection, key: &str) -> usize {
    q::<Vec<redis::Value>>(c, &["FLOCK.WAITERS", key])
        .await
        .len()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn m1_all_free_one_lease_per_key() {
    let srv = Server::start();
    let mut raw = srv.async_conn().await;
    let flock = Flock::new(srv.client());
    let keys = ["m:a", "m:b", "m:c"];
    let leases = flock.lock_many(&keys, MS(5000)).await.expect("lock_many");
    assert_eq!(leases.len(), 3);
    let owner = leases[0].owner().to_string();
    assert_eq!(owner.len(), 32, "128 random bits in hex");
    let mut last = 0;
    for (lease, key) in leases.iter().zip(keys) {
        assert_eq!(lease.key(), key);
        assert_eq!(lease.owner(), owner, "one owner for the whole request");
        assert_eq!(lease.mode(), Mode::Exclusive);
        assert!(lease.token() > last, "tokens grow in key order");
        last = lease.token();
        let server = server_check(&mut raw, key, lease.token()).await;
        assert!(server > 0 && lease.remaining() <= MS(server), "rule 1");
        // Each lease is an ordinary one: fenced writes go through with its token.
        let _: () = lease
            .fenced(redis::cmd("SET").arg(format!("{key}:data")).arg("x"))
            .await
            .expect("fenced");
    }
    // Rule 11: a key of the set is held by this Flock; another owner is refused by the server.
    assert!(matches!(
        flock.lock("m:b", LockOptions::new(MS(1000))).await,
        Err(Error::Busy)
    ));
    leases.release_all().await.expect("release_all");
    for key in keys {
        assert_eq!(holders(&mut raw, key).await, 0, "{key} released");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn m1_one_held_is_busy_and_nothing_taken() {
    let srv = Server::start();
    let mut raw = srv.async_conn().await;
    let flock = Flock::new(srv.client());
    let other = Flock::new(srv.client());
    let held = other.lock("m:b", MS(5000)).await.expect("lock");
    let t0 = Instant::now();
    match flock.lock_many(&["m:a", "m:b", "m:c"], MS(5000)).await {
        Err(Error::Busy) => {}
        r => panic!("one key held: {r:?}"),
    }
    assert!(t0.elapsed() < MS(1000), "one try, no wait");
    assert!(flock
        .acquire_many(&["m:a", "m:b"], MS(5000))
        .await
        .expect("acquire_many")
        .is_none());
    for key in ["m:a", "m:c"] {
        assert_eq!(holders(&mut raw, key).await, 0, "{key} not taken");
        assert!(!flock.locked(key).await.expect("locked"));
    }
    assert_eq!(holders(&mut raw, "m:b").await, 1);
    // A wait that runs out takes nothing either and leaves no waiter behind.
    let t0 = Instant::now();
    let r = flock
        .lock_many(
            &["m:a", "m:b"],
            LockOptions::new(MS(5000)).wait(Wait::For(MS(300))),
        )
        .await;
    assert!(matches!(r, Err(Error::Busy)), "{r:?}");
    assert!(t0.elapsed() >= MS(250), "waited {:?}", t0.elapsed());
    assert_eq!(holders(&mut raw, "m:a").await, 0);
    assert_eq!(waiters(&mut raw, "m:a").await, 0);
    assert_eq!(waiters(&mut raw, "m:b").await, 0);
    held.release().await.expect("release");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn m1_waits_for_all_at_once() {
    let srv = Server::start();
    let mut raw = srv.async_conn().await;
    let flock = Flock::new(srv.client());
    let other = Flock::new(srv.client());
    let a = other.lock("m:a", MS(5000)).await.expect("lock a");
    let b = other.lock("m:b", MS(5000)).await.expect("lock b");
    let f = flock.clone();
    let waiter = tokio::spawn(async move {
        let t0 = Instant::now();
        let r = f
            .lock_many(
                &["m:a", "m:b"],
                LockOptions::new(MS(300)).wait(Wait::For(MS(5000))),
            )
            .await;
        (r, t0.elapsed())
    });
    // The request stands in both queues at once.
    let r = raw.clone();
    wait_until("queued on both keys", MS(3000), || {
        let mut c = r.clone();
        async move { waiters(&mut c, "m:a").await == 1 && waiters(&mut c, "m:b").await == 1 }
    })
    .await;
    // One key freed: still nothing granted (all or nothing), and nobody overtakes it.
    a.release().await.expect("release a");
    tokio::time::sleep(MS(200)).await;
    assert_eq!(
        holders(&mut raw, "m:a").await,
        0,
        "a free key it heads stays free"
    );
    assert!(
        other
            .acquire("m:a", MS(1000))
            .await
            .expect("acquire")
            .is_none(),
        "a newcomer does not overtake the waiting request"
    );
    b.release().await.expect("release b");
    let (r, took) = waiter.await.expect("task");
    let leases = r.expect("granted once both are free");
    assert!(took >= MS(200), "waited {took:?}");
    // Rule 1 after the wait, and the watchdog keeps the short (300 ms) leases for many ttls.
    tokio::time::sleep(MS(1000)).await;
    for lease in leases.iter() {
        assert!(!lease.is_lost(), "{} kept by its watchdog", lease.key());
        // The local lease clock runs behind the server's; a watchdog renewal landing between
        // the server's figure and the local read can put the local one ahead for a moment, so
        // the comparison is retried (a local clock ahead for good still fails).
        wait_until(
            "the local remaining time within the server's",
            MS(3000),
            || {
                let mut c = raw.clone();
                async move {
                    let server = server_check(&mut c, lease.key(), lease.token()).await;
                    server > 0 && lease.remaining() <= MS(server)
                }
            },
        )
        .await;
    }
    leases.release_all().await.expect("release_all");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn m1_release_together_and_on_drop() {
    let srv = Server::start();
    let mut raw = srv.async_conn().await;
    let flock = Flock::new(srv.client());
    let keys = ["m:a", "m:b"];
    // release_all releases both; a lease lost meanwhile is the result, the others released.
    let leases = flock.lock_many(&keys, MS(30_000)).await.expect("lock_many");
    // Rule 9: both leases are watched (one WATCH) before the revoke.
    let r = raw.clone();
    wait_until("the WATCH waits", MS(3000), || {
        let mut c = r.clone();
        async move { info_i64(&mut c, "flock", "flock_watchers").await == 1 }
    })
    .await;
    tokio::time::sleep(MS(100)).await;
    let _: i64 = q(&mut raw, &["FLOCK.REVOKE", "m:a"]).await;
    assert!(
        leases[0].wait_lost(MS(3000)).await,
        "rule 9: the revoke is heard"
    );
    assert_eq!(leases[0].lost_reason(), Some(LossReason::Revoked));
    assert!(!leases[1].is_lost(), "each lease is its own");
    match leases.release_all().await {
        Err(Error::Lost(LossReason::Revoked)) => {}
        r => panic!("release_all after a revoke: {r:?}"),
    }
    assert_eq!(
        holders(&mut raw, "m:b").await,
        0,
        "the live one released anyway"
    );
    // Dropped unreleased: every lease released in the background.
    let leases = flock.lock_many(&keys, MS(30_000)).await.expect("lock_many");
    drop(leases);
    let r = raw.clone();
    wait_until("both released after the drop", MS(3000), || {
        let mut c = r.clone();
        async move { holders(&mut c, "m:a").await == 0 && holders(&mut c, "m:b").await == 0 }
    })
    .await;
    // into_vec: released one by one.
    let leases = flock
        .lock_many(&keys, MS(30_000))
        .await
        .expect("lock_many")
        .into_vec();
    for l in leases {
        l.release().await.expect("release");
    }
    assert_eq!(holders(&mut raw, "m:a").await, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn m1_argument_errors_send_nothing() {
    let srv = Server::start();
    let mut raw = srv.async_conn().await;
    let flock = Flock::new(srv.client());
    let before: i64 = info_i64(&mut raw, "stats", "total_commands_processed").await;
    let ttl = MS(1000);
    let empty: [&str; 0] = [];
    let many: Vec<String> = (0..65).map(|i| format!("m:{i}")).collect();
    let cases: Vec<(&str, Vec<String>, LockOptions)> = vec![
        ("empty list", vec![], LockOptions::new(ttl)),
        ("65 keys", many, LockOptions::new(ttl)),
        (
            "duplicate",
            vec!["m:a".into(), "m:a".into()],
            LockOptions::new(ttl),
        ),
        (
            "empty key",
            vec!["m:a".into(), String::new()],
            LockOptions::new(ttl),
        ),
        ("ttl 0", vec!["m:a".into()], LockOptions::new(MS(0))),
        (
            "sub-ms ttl",
            vec!["m:a".into()],
            LockOptions::new(Duration::from_micros(1500)),
        ),
        (
            "empty owner",
            vec!["m:a".into()],
            LockOptions::new(ttl).owner(""),
        ),
        (
            "shared",
            vec!["m:a".into()],
            LockOptions::new(ttl).mode(Mode::Shared),
        ),
        (
            "bound with replicas",
            vec!["m:a".into()],
            LockOptions::new(ttl).bound(true).replicas(1),
        ),
        (
            "bound with fsync",
            vec!["m:a".into()],
            LockOptions::new(ttl).bound(true).fsync(true),
        ),
        (
            "durable_timeout not below the ttl",
            vec!["m:a".into()],
            LockOptions::new(ttl).replicas(1).durable_timeout(ttl),
        ),
        (
            "reentrant",
            vec!["m:a".into()],
            LockOptions::new(ttl).reentrant(true),
        ),
    ];
    for (what, keys, opts) in cases {
        match flock.lock_many(&keys, opts).await {
            Err(Error::Invalid(msg)) => assert!(!msg.is_empty(), "{what}"),
            r => panic!("{what}: {r:?}"),
        }
    }
    assert!(matches!(
        flock.acquire_many(&empty, ttl).await,
        Err(Error::Invalid(_))
    ));
    // 64 keys is the most, and allowed.
    let keys: Vec<String> = (0..64).map(|i| format!("m:{i}")).collect();
    let after: i64 = info_i64(&mut raw, "stats", "total_commands_processed").await;
    // Only this connection's INFO reached the server in between.
    assert_eq!(after - before, 1, "nothing sent for refused arguments");
    let leases = flock.lock_many(&keys, ttl).await.expect("64 keys");
    assert_eq!(leases.len(), 64);
    leases.release_all().await.expect("release_all");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn m1_in_a_cluster_one_slot_routed_to_its_master() {
    let cluster = tokio::task::block_in_place(Cluster::start);
    let flock = Flock::new(ClusterClient::new(cluster.urls()).expect("cluster client"));
    let mut any = cluster.nodes[0].srv.async_conn().await;
    // A hash tag whose slot is not on the first node, so routing matters.
    let mut tag = String::new();
    let mut slot = 0u16;
    for i in 0..100 {
        let t = format!("{{o{i}}}");
        let s = q::<i64>(&mut any, &["CLUSTER", "KEYSLOT", &t]).await as u16;
        if cluster.master_of(s).id != cluster.nodes[0].id {
            tag = t;
            slot = s;
            break;
        }
    }
    assert!(!tag.is_empty());
    let keys = [format!("{tag}:a"), format!("{tag}:b")];
    let leases = flock.lock_many(&keys, MS(5000)).await.expect("lock_many");
    let mut m = cluster.master_of(slot).srv.async_conn().await;
    for l in leases.iter() {
        assert!(
            server_check(&mut m, l.key(), l.token()).await > 0,
            "{}",
            l.key()
        );
    }
    // Keys of two slots are refused by the client, before anything is sent.
    match flock.lock_many(&["{x}:a", "{y}:b"], MS(5000)).await {
        Err(Error::Invalid(msg)) => assert!(msg.contains("slot"), "{msg}"),
        r => panic!("cross-slot: {r:?}"),
    }
    // Held: a wait from another factory stands in the master's queues and is granted there.
    let other = Flock::new(ClusterClient::new(cluster.urls()).expect("cluster client"));
    let k2 = keys.clone();
    let waiter = tokio::spawn(async move {
        other
            .lock_many(&k2, LockOptions::new(MS(5000)).wait(Wait::For(MS(5000))))
            .await
    });
    let mc = m.clone();
    let k0 = keys[0].clone();
    wait_until("queued on the master", MS(3000), || {
        let mut c = mc.clone();
        let k = k0.clone();
        async move { waiters(&mut c, &k).await == 1 }
    })
    .await;
    leases.release_all().await.expect("release_all");
    let got = waiter
        .await
        .expect("task")
        .expect("granted after the release");
    assert_eq!(got.len(), 2);
    got.release_all().await.expect("release_all");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn m4_rule_11_own_leases_are_busy_at_once() {
    let srv = Server::start();
    let mut raw = srv.async_conn().await;
    let flock = Flock::new(srv.client());
    // A named owner that already holds one of the keys through this Flock: Busy, nothing sent
    // for the others.
    let held = flock
        .lock("m:a", LockOptions::new(MS(5000)).owner("w1"))
        .await
        .expect("lock");
    let r = flock
        .lock_many(&["m:b", "m:a"], LockOptions::new(MS(5000)).owner("w1"))
        .await;
    assert!(matches!(r, Err(Error::Busy)), "{r:?}");
    assert_eq!(holders(&mut raw, "m:b").await, 0, "nothing taken");
    // A wait of this task on a key its own lease holds would wait on itself: one try, Busy at
    // once, and no waiter left in any queue.
    let t0 = Instant::now();
    let r = flock
        .lock_many(
            &["m:a", "m:b"],
            LockOptions::new(MS(5000)).wait(Wait::For(MS(3000))),
        )
        .await;
    assert!(matches!(r, Err(Error::Busy)), "{r:?}");
    assert!(t0.elapsed() < MS(1000), "not waited: {:?}", t0.elapsed());
    assert_eq!(waiters(&mut raw, "m:a").await, 0);
    assert_eq!(holders(&mut raw, "m:b").await, 0);
    held.release().await.expect("release");
    // Once released, the same call is granted.
    let leases = flock
        .lock_many(&["m:a", "m:b"], LockOptions::new(MS(5000)).owner("w1"))
        .await
        .expect("lock_many");
    assert!(leases.iter().all(|l| l.owner() == "w1"));
    leases.release_all().await.expect("release_all");
}
