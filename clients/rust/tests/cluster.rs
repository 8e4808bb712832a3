//! A Redis Cluster of 3 masters (the testkit's, made by `redis-cli --cluster create`, with a
//! replica each): a client waits for a lock while its slot moves to another master; the wait
//! completes on the new node. A durable grant's WAIT goes to the key's master, whose replica
//! holds the grant when the lease is handed over.

use std::time::Duration;

use flock_client::{Error, Flock, LockOptions, Wait};
use flock_testkit::aio::{info_i64, q, wait_until};
use flock_testkit::Cluster;
use redis::cluster::ClusterClient;
use tokio::time::Instant;

const MS: fn(u64) -> Duration = Duration::from_millis;

/// How many requests wait for `key` on this node (FLOCK.WAITERS; 0 where the key is not).
async fn waiters(c: &mut redis::aio::MultiplexedConnection, key: &str) -> usize {
    let r: redis::RedisResult<Vec<redis::Value>> =
        redis::cmd("FLOCK.WAITERS").arg(key).query_async(c).await;
    r.map(|v| v.len()).unwrap_or(0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wait_survives_a_slot_move_and_completes_on_the_new_node() {
    // The testkit's cluster calls are blocking: block_in_place hands this worker's tasks to
    // another thread meanwhile (the waiter must keep running while its slot moves).
    let cluster = tokio::task::block_in_place(Cluster::start);
    let flock = Flock::new(ClusterClient::new(cluster.urls()).expect("cluster client"));
    let key = "{order:42}:lock";
    let mut any = cluster.nodes[0].srv.async_conn().await;
    let slot: u16 = q::<i64>(&mut any, &["CLUSTER", "KEYSLOT", key]).await as u16;
    let from = cluster.master_of(slot);
    let to = cluster.other_master(from);

    // Routing through the cluster: a scoped lock with a fenced write in the same slot.
    let out: Result<i64, flock_client::Error> = flock
        .with_lock(key, MS(5000), |lease| async move {
            lease.fenced(redis::cmd("INCR").arg("{order:42}:n")).await
        })
        .await;
    assert_eq!(out.expect("with_lock"), 1);

    let holder = flock.lock(key, MS(10_000)).await.expect("holder");
    let f = flock.clone();
    let waiter = tokio::spawn(async move {
        f.lock(
            key,
            LockOptions::new(MS(5000))
                .owner("waiter")
                .wait(Wait::For(MS(30_000))),
        )
        .await
    });
    let mut src = from.srv.async_conn().await;
    // (FLOCK.WAITERS rather than blocked_clients: the Flock's FLOCK.WATCH of the holder's
    // lease, rule 9, is a blocked client too)
    wait_until("the waiter blocks on the old master", MS(10_000), || {
        let mut c = src.clone();
        async move { waiters(&mut c, key).await == 1 }
    })
    .await;

    let moved = Instant::now();
    tokio::task::block_in_place(|| cluster.migrate_slot(slot, from, to));
    println!(
        "slot {slot} moved from port {} to port {} in {:?}",
        from.srv.port(),
        to.srv.port(),
        moved.elapsed()
    );
    let mut dst = to.srv.async_conn().await;
    // The waiter got TRYAGAIN at the old master and waits again at the new one.
    wait_until("the waiter blocks on the new master", MS(15_000), || {
        let mut c = dst.clone();
        async move { waiters(&mut c, key).await == 1 }
    })
    .await;
    assert_eq!(info_i64(&mut src, "clients", "blocked_clients").await, 0);
    assert!(
        !waiter.is_finished(),
        "still waiting: the holder holds the lock"
    );
    let keys: i64 = q(&mut src, &["CLUSTER", "COUNTKEYSINSLOT", &slot.to_string()]).await;
    assert_eq!(keys, 0, "the lock left the old master");

    // The holder's lease moved with the slot; its release (MOVED, followed) frees the waiter.
    assert!(!holder.is_lost());
    let held_token = holder.token();
    holder.release().await.expect("release on the new node");
    let lease = waiter
        .await
        .expect("join")
        .expect("granted on the new node");
    assert!(lease.token() > held_token);
    let check: i64 = q(&mut dst, &["FLOCK.CHECK", key, &lease.token().to_string()]).await;
    assert!(check > 0, "the grant lives on the new master");
    let info: Vec<redis::Value> = q(&mut dst, &["FLOCK.INFO", key]).await;
    assert!(format!("{info:?}").contains("waiter"));
    assert!(lease.remaining() <= MS(check as u64));
    let n: i64 = lease
        .fenced(redis::cmd("INCR").arg("{order:42}:n"))
        .await
        .expect("fenced on the new node");
    assert_eq!(n, 2);
    lease.release().await.expect("release");
    let exists: i64 = q(&mut dst, &["EXISTS", key]).await;
    assert_eq!(exists, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_durable_grant_is_acknowledged_by_the_replica_of_its_keys_master() {
    let cluster = tokio::task::block_in_place(Cluster::start);
    let flock = Flock::new(ClusterClient::new(cluster.urls()).expect("cluster client"));
    let mut any = cluster.nodes[0].srv.async_conn().await;
    // One key on each of the three masters.
    let mut keys: Vec<(String, u16)> = Vec::new();
    for i in 0..100 {
        let key = format!("{{d{i}}}:lock");
        let slot = q::<i64>(&mut any, &["CLUSTER", "KEYSLOT", &key]).await as u16;
        let id = &cluster.master_of(slot).id;
        if !keys.iter().any(|(_, s)| &cluster.master_of(*s).id == id) {
            keys.push((key, slot));
        }
        if keys.len() == 3 {
            break;
        }
    }
    assert_eq!(keys.len(), 3, "a key on each master");
    for (key, slot) in &keys {
        let master = cluster.master_of(*slot);
        let replica = cluster.replica_of(master);
        let mut mc = master.srv.async_conn().await;
        let mut rc = replica.srv.async_conn().await;
        let _: String = q(&mut rc, &["READONLY"]).await;

        let lease = flock
            .lock(key.as_str(), LockOptions::new(MS(5000)).replicas(1))
            .await
            .expect("durable lock on the cluster");
        let t = lease.token().to_string();
        let on_replica: i64 = q(&mut rc, &["FLOCK.CHECK", key, &t]).await;
        assert!(
            on_replica > 0,
            "the replica of {key}'s master holds the grant"
        );
        // A durable renewal, routed the same way.
        lease.renew(Some(MS(9000))).await.expect("durable renew");
        let on_replica: i64 = q(&mut rc, &["FLOCK.CHECK", key, &t]).await;
        assert!(
            on_replica > 5000,
            "the replica has the renewal: {on_replica}"
        );
        lease.release().await.expect("release");

        // M.3 in a cluster: lock_many's MACQUIRE names numkeys first; it and its WAIT are
        // routed by the keys' slot to this master, whose replica holds every grant at once.
        let tag = key.trim_end_matches(":lock");
        let many = [format!("{tag}:a"), format!("{tag}:b")];
        let leases = flock
            .lock_many(&many, LockOptions::new(MS(5000)).replicas(1))
            .await
            .expect("durable lock_many on the cluster");
        for l in leases.iter() {
            let t = l.token().to_string();
            let on_replica: i64 = q(&mut rc, &["FLOCK.CHECK", l.key(), &t]).await;
            assert!(on_replica > 0, "the replica holds {}'s grant", l.key());
        }
        leases.release_all().await.expect("release_all");

        // Each master has one replica: two are too many, and the grant is released.
        let res = flock
            .acquire(
                key.as_str(),
                LockOptions::new(MS(5000))
                    .replicas(2)
                    .durable_timeout(MS(200)),
            )
            .await;
        assert!(
            matches!(
                res,
                Err(Error::NotDurable {
                    acknowledged: 1,
                    asked: 2,
                    ..
                })
            ),
            "{res:?}"
        );
        let exists: i64 = q(&mut mc, &["EXISTS", key]).await;
        assert_eq!(exists, 0);

        // The WAIT went to this master: with its replica stopped, nobody acknowledges (the
        // other masters' replicas, live, would).
        replica.srv.signal("STOP");
        let res = flock
            .acquire(
                key.as_str(),
                LockOptions::new(MS(5000))
                    .replicas(1)
                    .durable_timeout(MS(200)),
            )
            .await;
        let many_res = flock
            .acquire_many(
                &many,
                LockOptions::new(MS(5000))
                    .replicas(1)
                    .durable_timeout(MS(200)),
            )
            .await;
        replica.srv.signal("CONT");
        assert!(
            matches!(
                many_res,
                Err(Error::NotDurable {
                    acknowledged: 0,
                    asked: 1,
                    ..
                })
            ),
            "{many_res:?}"
        );
        for k in &many {
            let exists: i64 = q(&mut mc, &["EXISTS", k]).await;
            assert_eq!(exists, 0, "{k} released");
        }
        assert!(
            matches!(
                res,
                Err(Error::NotDurable {
                    acknowledged: 0,
                    asked: 1,
                    ..
                })
            ),
            "{res:?}"
        );
        let exists: i64 = q(&mut mc, &["EXISTS", key]).await;
        assert_eq!(exists, 0);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn s9_1_and_9_4_in_a_cluster_one_watch_per_slot_hears_a_revoke_at_once() {
    // Rule 9 in a cluster: leases of two slots (on two masters) are watched by one
    // connection per slot; a REVOKE on a slot's master is heard at once, and a lease that
    // joins a slot's waiting WATCH (CLIENT UNBLOCK routed to that master) is watched too.
    let cluster = tokio::task::block_in_place(Cluster::start);
    let flock = Flock::new(ClusterClient::new(cluster.urls()).expect("cluster client"));
    let mut any = cluster.nodes[0].srv.async_conn().await;
    let mut keys: Vec<(String, u16)> = Vec::new();
    for i in 0..100 {
        let key = format!("{{w{i}}}:lock");
        let slot = q::<i64>(&mut any, &["CLUSTER", "KEYSLOT", &key]).await as u16;
        let id = &cluster.master_of(slot).id;
        if !keys.iter().any(|(_, s)| &cluster.master_of(*s).id == id) {
            keys.push((key, slot));
        }
        if keys.len() == 2 {
            break;
        }
    }
    assert_eq!(keys.len(), 2);
    let ttl = Duration::from_secs(30);
    let mut leases = Vec::new();
    for (key, _) in &keys {
        leases.push(flock.lock(key.as_str(), ttl).await.expect("lock"));
    }
    // A second lease in the first slot joins its lane's WATCH.
    let (k0, s0) = &keys[0];
    let tag = &k0[..k0.find('}').map(|i| i + 1).unwrap_or(0)];
    let late_key = format!("{tag}:late");
    let late = flock.lock(late_key.as_str(), ttl).await.expect("lock");
    for (_, slot) in &keys {
        let m = cluster.master_of(*slot).srv.async_conn().await;
        wait_until("the slot's WATCH waits", MS(5000), || {
            let mut c = m.clone();
            async move { info_i64(&mut c, "flock", "flock_watchers").await == 1 }
        })
        .await;
    }
    assert_eq!(flock.watch_connections(), 2, "one per slot");
    tokio::time::sleep(MS(100)).await;
    let mut m0 = cluster.master_of(*s0).srv.async_conn().await;
    let t0 = Instant::now();
    let _: i64 = q(&mut m0, &["FLOCK.REVOKE", &late_key]).await;
    assert!(late.wait_lost(MS(3000)).await, "heard");
    let took = t0.elapsed();
    assert!(took < MS(1000), "heard after {took:?}");
    assert_eq!(late.lost_reason(), Some(flock_client::LossReason::Revoked));
    let (k1, s1) = &keys[1];
    let mut m1 = cluster.master_of(*s1).srv.async_conn().await;
    let t0 = Instant::now();
    let _: i64 = q(&mut m1, &["FLOCK.REVOKE", k1]).await;
    assert!(leases[1].wait_lost(MS(3000)).await, "heard");
    assert!(t0.elapsed() < MS(1000), "heard after {:?}", t0.elapsed());
    assert!(!leases[0].is_lost());
    assert_eq!(flock.watch_disabled(), None);
}
