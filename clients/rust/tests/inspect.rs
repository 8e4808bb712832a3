//! Inspection without a lease (docs/CLIENTS.md "The API every client offers") against a real
//! redis-server with the flock module. Each test names its scenario (`si_1` is I.1).

use std::time::Duration;

use flock_client::{Error, Flock, LockOptions, Mode, Wait};
use flock_testkit::aio::{q, wait_until};
use flock_testkit::Server;

const MS: fn(u64) -> Duration = Duration::from_millis;

/// Waits until `n` requests wait for `key` (the raw FLOCK.WAITERS: blocked_clients would
/// count the Flock's FLOCK.WATCH too, rule 9).
async fn blocked(srv: &Server, key: &str, n: usize) {
    let c = srv.async_conn().await;
    wait_until("the waiters are queued", MS(3000), || {
        let mut c = c.clone();
        async move {
            q::<Vec<redis::Value>>(&mut c, &["FLOCK.WAITERS", key])
                .await
                .len()
                == n
        }
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn si_1_and_i_3_info_and_waiters() {
    let srv = Server::start();
    let flock = Flock::new(srv.client());
    // I.1: unknown key.
    assert_eq!(flock.info("nothing").await.expect("info"), None);
    // I.3: nobody waits.
    assert!(flock.waiters("nothing").await.expect("waiters").is_empty());

    let lease = flock
        .lock("k", LockOptions::new(MS(20_000)).owner("holder"))
        .await
        .expect("lock");
    let w = Flock::new(srv.client());
    let w1 = w.clone();
    let first = tokio::spawn(async move {
        w1.acquire(
            "k",
            LockOptions::new(MS(20_000))
                .owner("first")
                .wait(Wait::For(MS(10_000))),
        )
        .await
    });
    blocked(&srv, "k", 1).await;
    let w2 = w.clone();
    let second = tokio::spawn(async move {
        w2.acquire(
            "k",
            LockOptions::new(MS(20_000))
                .owner("second")
                .mode(Mode::Shared)
                .wait(Wait::For(MS(10_000))),
        )
        .await
    });
    blocked(&srv, "k", 2).await;

    // I.1: the fields of a held key with waiters.
    let info = flock.info("k").await.expect("info").expect("known");
    assert_eq!(info.owner.as_deref(), Some("holder"));
    assert_eq!(info.token, Some(lease.token()));
    assert!(info.ttl.is_some_and(|t| t > 0 && t <= 20_000), "{info:?}");
    assert_eq!(info.waiters, 2);
    assert_eq!(info.mode, "exclusive");
    assert_eq!(info.holders, 1);
    assert_eq!(info.limit, 0);
    assert_eq!(info.delayed, 0);

    // I.3: the waiters in line order, with their modes.
    let ws = flock.waiters("k").await.expect("waiters");
    assert_eq!(ws.len(), 2, "{ws:?}");
    assert_eq!(
        (ws[0].owner.as_str(), ws[0].mode.as_str()),
        ("first", "exclusive")
    );
    assert_eq!(
        (ws[1].owner.as_str(), ws[1].mode.as_str()),
        ("second", "shared")
    );
    assert!(ws[0].waited >= ws[1].waited, "{ws:?}");

    lease.release().await.expect("release");
    let a = first.await.expect("task").expect("first").expect("granted");
    assert_eq!(a.owner(), "first");
    a.release().await.expect("release");
    let b = second
        .await
        .expect("task")
        .expect("second")
        .expect("granted");
    b.release().await.expect("release");
    assert!(flock.waiters("k").await.expect("waiters").is_empty());
    let r = flock.info("").await;
    assert!(matches!(r, Err(Error::Invalid(_))), "{r:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn si_2_holders_of_a_shared_key_oldest_first() {
    let srv = Server::start();
    let flock = Flock::new(srv.client());
    let shared = |o: &str, ttl| LockOptions::new(MS(ttl)).mode(Mode::Shared).owner(o);
    let a = flock.lock("s", shared("a", 20_000)).await.expect("a");
    let b = flock.lock("s", shared("b", 10_000)).await.expect("b");
    let hs = flock.holders("s").await.expect("holders");
    assert_eq!(hs.len(), 2);
    assert_eq!((hs[0].owner.as_str(), hs[0].token), ("a", a.token()));
    assert_eq!((hs[1].owner.as_str(), hs[1].token), ("b", b.token()));
    assert!(hs[0].ttl <= MS(20_000) && hs[0].ttl > MS(10_000), "{hs:?}");
    assert!(hs[1].ttl <= MS(10_000) && hs[1].ttl > MS(5_000), "{hs:?}");
    let again = b.holders().await.expect("lease.holders");
    assert_eq!(
        again
            .iter()
            .map(|h| (h.owner.clone(), h.token))
            .collect::<Vec<_>>(),
        vec![("a".to_string(), a.token()), ("b".to_string(), b.token())]
    );
    a.release().await.expect("release");
    b.release().await.expect("release");
    assert!(flock.holders("s").await.expect("holders").is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn si_4_and_i_5_locked_and_check() {
    let srv = Server::start();
    let flock = Flock::new(srv.client());
    assert!(!flock.locked("k").await.expect("locked"));
    let lease = flock.lock("k", MS(5000)).await.expect("lock");
    assert!(flock.locked("k").await.expect("locked"));
    let left = flock.check("k", lease.token()).await.expect("check");
    assert!(left > Duration::ZERO && left <= MS(5000), "{left:?}");
    let token = lease.token();
    lease.release().await.expect("release");
    assert!(!flock.locked("k").await.expect("locked"));
    assert_eq!(
        flock.check("k", token).await.expect("check"),
        Duration::ZERO
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn si_6_stats_count_a_class_grants_and_releases() {
    let srv = Server::start();
    let flock = Flock::new(srv.client());
    let empty = flock.stats(&[]).await.expect("stats");
    assert!(empty.classes.is_empty(), "{empty:?}");
    assert_eq!(empty.overflow, 0);
    for _ in 0..3 {
        let l = flock.lock("job", MS(5000)).await.expect("lock");
        l.release().await.expect("release");
    }
    let all = flock.stats(&[]).await.expect("stats");
    let job = all.classes.get("job").expect("the class of the key");
    assert_eq!(job.get("grants"), Some(&Some(3)), "{job:?}");
    assert_eq!(job.get("released"), Some(&Some(3)), "{job:?}");
    assert_eq!(job.get("ttl_ms.p50"), Some(&Some(5000)), "{job:?}");
    let one = flock.stats(&["job"]).await.expect("stats job");
    assert_eq!(one.classes.len(), 1);
    let none = flock.stats(&["nosuch"]).await.expect("stats nosuch");
    assert!(none.classes.is_empty(), "{none:?}");
    let r = flock.stats(&[""]).await;
    assert!(matches!(r, Err(Error::Invalid(_))), "{r:?}");
}
