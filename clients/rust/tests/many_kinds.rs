//! M.2 (bound) and M.3 (durable) of docs/CLIENTS.md, "Several keys at once": `lock_many` with
//! `bound(true)` binds every grant to one connection of the leases' own, and with
//! `replicas(n)` hands the leases over only once `n` replicas acknowledged the MACQUIRE. Against
//! real servers with the module (a master and a replica for M.3); each test starts its own.

use std::time::Duration;

use flock_client::{Error, Flock, LockOptions, LossReason, Wait};
use flock_testkit::aio::{q, wait_until};
use flock_testkit::Server;
use redis::aio::MultiplexedConnection;
use redis::Value;
use tokio::time::Instant;

const MS: fn(u64) -> Duration = Duration::from_millis;
const KEYS: [&str; 3] = ["{m}:a", "{m}:b", "{m}:c"];

/// The ids of the server's connections whose last command is `cmd`.
async fn conns_with(admin: &mut MultiplexedConnection, cmd: &str) -> Vec<String> {
    let text: String = q(admin, &["CLIENT", "LIST"]).await;
    text.lines()
        .filter(|l| l.split(' ').any(|f| f == format!("cmd={cmd}")))
        .filter_map(|l| l.split(' ').find_map(|f| f.strip_prefix("id=")))
        .map(str::to_string)
        .collect()
}

/// Waits until the leases' FLOCK.WATCH waits on the server (rule 9), a moment after the last
/// change of the set it names (a lease joins it 5 ms after its grant or a release re-arms it).
async fn watched(admin: &MultiplexedConnection) {
    tokio::time::sleep(MS(100)).await;
    wait_until("the WATCH is waiting", MS(3000), || {
        let mut c = admin.clone();
        async move {
            conns_with(&mut c, "flock.watch").await.len() == 1
                && flock_testkit::aio::info_i64(&mut c, "flock", "flock_watchers").await == 1
        }
    })
    .await;
}

async fn info_is_nil(c: &mut MultiplexedConnection, key: &str) -> bool {
    matches!(q::<Value>(c, &["FLOCK.INFO", key]).await, Value::Nil)
}

async fn check(c: &mut MultiplexedConnection, key: &str, token: u64) -> u64 {
    q(c, &["FLOCK.CHECK", key, &token.to_string()]).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn m2_many_bound_lost_closed_when_their_connection_is_killed() {
    let srv = Server::start();
    let mut raw = srv.async_conn().await;
    let flock = Flock::new(srv.client());
    let leases = flock
        .lock_many(&KEYS, LockOptions::new(MS(30_000)).bound(true))
        .await
        .expect("lock_many bound");
    let bound = conns_with(&mut raw, "flock.macquire").await;
    assert_eq!(bound.len(), 1, "one connection of their own: {bound:?}");
    let mut leases = leases.into_vec();
    // Releasing one keeps the others' grants: the connection stays open for them.
    let first = leases.remove(0);
    first.release().await.expect("release one");
    assert!(info_is_nil(&mut raw, KEYS[0]).await);
    for l in &leases {
        assert!(check(&mut raw, l.key(), l.token()).await > 0, "{}", l.key());
    }
    watched(&raw).await;
    let t0 = Instant::now();
    let _: () = q(&mut raw, &["CLIENT", "KILL", "ID", &bound[0]]).await;
    for l in &leases {
        assert!(l.wait_lost(MS(3000)).await, "{} heard lost", l.key());
        assert_eq!(l.lost_reason(), Some(LossReason::Closed), "{}", l.key());
    }
    assert!(t0.elapsed() < MS(10_000), "heard, not found at a renewal");
    for key in &KEYS[1..] {
        assert!(
            info_is_nil(&mut raw, key).await,
            "{key} ended by the server"
        );
    }
    for l in leases {
        assert!(matches!(l.release().await, Err(Error::Lost(_))));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn m2_many_bound_wait_granted_on_its_own_connection() {
    let srv = Server::start();
    let mut raw = srv.async_conn().await;
    let flock = Flock::new(srv.client());
    let holder = Flock::new(srv.client())
        .lock(KEYS[1], MS(30_000))
        .await
        .expect("holder");
    let f = flock.clone();
    let task = tokio::spawn(async move {
        f.acquire_many(
            &KEYS,
            LockOptions::new(MS(30_000))
                .bound(true)
                .wait(Wait::For(MS(5000))),
        )
        .await
    });
    wait_until("the wait in every queue", MS(3000), || {
        let mut c = raw.clone();
        async move {
            let mut all = true;
            for k in KEYS {
                all &= !q::<Vec<Value>>(&mut c, &["FLOCK.WAITERS", k])
                    .await
                    .is_empty();
            }
            all
        }
    })
    .await;
    holder.release().await.expect("release");
    let leases = task
        .await
        .expect("task")
        .expect("acquire_many")
        .expect("granted");
    // The grants are bound to the connection that waited (its last command: the RENEWs).
    let bound = conns_with(&mut raw, "flock.renew").await;
    assert_eq!(bound.len(), 1, "{bound:?}");
    watched(&raw).await;
    let _: () = q(&mut raw, &["CLIENT", "KILL", "ID", &bound[0]]).await;
    for l in leases.iter() {
        assert!(l.wait_lost(MS(3000)).await, "{} heard lost", l.key());
        assert_eq!(l.lost_reason(), Some(LossReason::Closed));
    }
    for key in KEYS {
        assert!(info_is_nil(&mut raw, key).await);
    }
}

/// A replica of `m` whose command stream runs (see tests/durable.rs).
async fn streaming_replica_of(m: &Server, mc: &mut MultiplexedConnection) -> Server {
    let r = Server::start_replica_of(m);
    let _: () = q(mc, &["SET", "warm-up", "1"]).await;
    let n: i64 = q(mc, &["WAIT", "1", "5000"]).await;
    assert_eq!(n, 1, "the replica streams");
    r
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn m3_many_durable_one_replica_then_two_asked() {
    let m = Server::start();
    let mut mc = m.async_conn().await;
    let r = streaming_replica_of(&m, &mut mc).await;
    let mut rc = r.async_conn().await;
    let flock = Flock::new(m.client());
    // One replica asked, one there: every grant is on the replica when lock_many returns.
    let leases = flock
        .lock_many(&KEYS, LockOptions::new(MS(6000)).replicas(1))
        .await
        .expect("durable lock_many");
    for l in leases.iter() {
        assert!(check(&mut rc, l.key(), l.token()).await > 0, "{}", l.key());
    }
    leases.release_all().await.expect("release_all");
    // Two asked, one there: NotDurable (1 of 2), and every key released.
    let t0 = Instant::now();
    let res = flock
        .acquire_many(
            &KEYS,
            LockOptions::new(MS(6000))
                .replicas(2)
                .durable_timeout(MS(300)),
        )
        .await;
    assert!(
        matches!(
            res,
            Err(Error::NotDurable {
                acknowledged: 1,
                asked: 2,
                fsynced: None
            })
        ),
        "{res:?}"
    );
    assert!(t0.elapsed() >= MS(295), "{:?}", t0.elapsed());
    for key in KEYS {
        assert!(
            info_is_nil(&mut mc, key).await,
            "{key} released on the master"
        );
    }
    let acked: i64 = q(&mut mc, &["WAIT", "1", "5000"]).await;
    assert_eq!(acked, 1);
    for key in KEYS {
        assert!(
            info_is_nil(&mut rc, key).await,
            "{key} released on the replica"
        );
    }
    // After a wait: the RENEWs carry the WAIT, and too few acknowledgments release all.
    let holder = Flock::new(m.client())
        .lock(KEYS[2], MS(6000))
        .await
        .expect("holder");
    let f = flock.clone();
    let task = tokio::spawn(async move {
        f.acquire_many(
            &KEYS,
            LockOptions::new(MS(6000))
                .replicas(2)
                .durable_timeout(MS(300))
                .wait(Wait::For(MS(5000))),
        )
        .await
    });
    wait_until("the wait", MS(3000), || {
        let mut c = mc.clone();
        async move {
            !q::<Vec<Value>>(&mut c, &["FLOCK.WAITERS", KEYS[0]])
                .await
                .is_empty()
        }
    })
    .await;
    holder.release().await.expect("release");
    let res = task.await.expect("task");
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
    for key in KEYS {
        assert!(
            info_is_nil(&mut mc, key).await,
            "{key} released after the wait"
        );
    }
}
