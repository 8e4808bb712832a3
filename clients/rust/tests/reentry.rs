//! Rule 11 of docs/CLIENTS.md against a real redis-server with the flock module: one grant,
//! one lease object; reentrant holds; a task never waits on itself; a forgotten lease is
//! released. Each test names the scenario (`s11_1` is 11.1) it checks.

use std::time::Duration;

use flock_client::{Error, Flock, LockOptions, Mode, Wait};
use flock_testkit::aio::{q, wait_until};
use flock_testkit::Server;
use redis::aio::MultiplexedConnection;
use tokio::time::Instant;

const MS: fn(u64) -> Duration = Duration::from_millis;

async fn check(c: &mut MultiplexedConnection, key: &str, token: u64) -> u64 {
    q(c, &["FLOCK.CHECK", key, &token.to_string()]).await
}

async fn renews_seen(c: &mut MultiplexedConnection) -> i64 {
    let text: String = q(c, &["INFO", "commandstats"]).await;
    text.lines()
        .find_map(|l| l.strip_prefix("cmdstat_flock.renew:calls="))
        .and_then(|rest| rest.split(',').next())
        .and_then(|n| n.parse().ok())
        .unwrap_or(0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn s11_1_the_same_owner_acquiring_a_held_key_is_busy_at_once() {
    let srv = Server::start();
    let mut raw = srv.async_conn().await;
    let flock = Flock::new(srv.client());
    let opts = || LockOptions::new(MS(20_000)).owner("w");
    let lease = flock.lock("k", opts()).await.expect("lock");
    let t0 = Instant::now();
    let again = flock.acquire("k", opts().wait(Wait::For(MS(2000)))).await;
    assert!(matches!(again, Err(Error::Busy)), "{again:?}");
    assert!(t0.elapsed() < MS(500), "at once: {:?}", t0.elapsed());
    // A clone of the factory knows the same leases.
    let again = flock.clone().lock("k", opts()).await;
    assert!(matches!(again, Err(Error::Busy)), "{again:?}");
    // The held lease is left as it was.
    assert!(!lease.is_lost());
    assert!(check(&mut raw, "k", lease.token()).await > 0);
    lease.release().await.expect("release");
    // Released: the same owner takes it again.
    let lease = flock.lock("k", opts()).await.expect("again after release");
    lease.release().await.expect("release");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn s11_2_reentrant_holds_are_counted_and_the_last_release_frees_the_key() {
    let srv = Server::start();
    let mut raw = srv.async_conn().await;
    let flock = Flock::new(srv.client());
    let opts = || LockOptions::new(MS(20_000)).owner("w").reentrant(true);
    let first = flock.lock("k", opts()).await.expect("lock");
    let second = flock.lock("k", opts()).await.expect("re-enter");
    assert_eq!(second.token(), first.token(), "the same grant");
    assert_eq!(first.holds(), 2);
    // The ttl of a reentrant acquire only has to be valid: the held lease keeps its own.
    let third = flock
        .lock("k", LockOptions::new(MS(5)).owner("w").reentrant(true))
        .await
        .expect("re-enter with another ttl");
    assert_eq!(first.holds(), 3);
    let token = first.token();
    first.release().await.expect("one hold");
    third.release().await.expect("one hold");
    assert!(check(&mut raw, "k", token).await > 0, "the grant stays");
    assert!(!second.is_lost());
    second.release().await.expect("the last hold");
    assert_eq!(
        check(&mut raw, "k", token).await,
        0,
        "the last release frees it"
    );
    assert_eq!(q::<i64>(&mut raw, &["EXISTS", "k"]).await, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn s11_3_a_reentrant_acquire_of_another_kind_is_invalid() {
    let srv = Server::start();
    let flock = Flock::new(srv.client());
    let opts = || LockOptions::new(MS(20_000)).owner("w").reentrant(true);
    let lease = flock.lock("k", opts()).await.expect("lock");
    for other in [
        opts().mode(Mode::Shared),
        opts().mode(Mode::Permits(2)),
        opts().bound(true),
    ] {
        let r = flock.acquire("k", other).await;
        assert!(matches!(r, Err(Error::Invalid(_))), "{r:?}");
    }
    assert_eq!(lease.holds(), 1);
    lease.release().await.expect("release");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn s11_4_reentrant_without_an_owner_reenters_in_its_task_and_waits_in_another() {
    let srv = Server::start();
    let flock = Flock::new(srv.client());
    let f2 = flock.clone();
    let t = tokio::spawn(async move {
        let opts = || LockOptions::new(MS(20_000)).reentrant(true);
        let a = f2.lock("k", opts()).await.expect("lock");
        let b = f2.lock("k", opts()).await.expect("the same task re-enters");
        assert_eq!(a.token(), b.token());
        assert_eq!(a.owner(), b.owner());
        assert_eq!(a.holds(), 2);
        (a, b)
    });
    let (a, b) = t.await.expect("task");
    // Another task is another holder: it waits, and is granted once both holds are released.
    let f3 = flock.clone();
    let waiter = tokio::spawn(async move {
        let t0 = Instant::now();
        let l = f3
            .lock(
                "k",
                LockOptions::new(MS(20_000))
                    .reentrant(true)
                    .wait(Wait::For(MS(5000))),
            )
            .await
            .expect("granted after the release");
        (l, t0.elapsed())
    });
    tokio::time::sleep(MS(300)).await;
    let owner_a = a.owner().to_string();
    a.release().await.expect("one hold");
    tokio::time::sleep(MS(200)).await;
    assert!(!waiter.is_finished(), "one hold left: still waiting");
    b.release().await.expect("last hold");
    let (l, waited) = waiter.await.expect("task");
    assert!(waited >= MS(450), "it waited: {waited:?}");
    assert_ne!(l.owner(), owner_a, "another task, another owner");
    l.release().await.expect("release");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn s11_5_a_nested_wait_on_a_key_of_its_own_task_is_busy_at_once() {
    let srv = Server::start();
    let flock = Flock::new(srv.client());
    let outer = flock.lock("k", MS(20_000)).await.expect("lock");
    let t0 = Instant::now();
    let inner = flock
        .acquire("k", LockOptions::new(MS(20_000)).wait(Wait::For(MS(3000))))
        .await;
    assert!(matches!(inner, Err(Error::Busy)), "{inner:?}");
    assert!(
        t0.elapsed() < MS(500),
        "at once, not at the timeout: {:?}",
        t0.elapsed()
    );
    let inner = flock
        .lock("k", LockOptions::new(MS(20_000)).wait(Wait::Forever))
        .await;
    assert!(matches!(inner, Err(Error::Busy)), "{inner:?}");
    outer.release().await.expect("release");
    // A nested shared acquire under a shared lease, nobody waiting: granted by the one try.
    let s1 = flock
        .lock("s", LockOptions::new(MS(20_000)).mode(Mode::Shared))
        .await
        .expect("shared");
    let s2 = flock
        .lock(
            "s",
            LockOptions::new(MS(20_000))
                .mode(Mode::Shared)
                .wait(Wait::For(MS(3000))),
        )
        .await
        .expect("nested shared");
    s2.release().await.expect("release");
    s1.release().await.expect("release");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn s11_6_a_dropped_lease_stops_renewing_and_frees_the_key() {
    let srv = Server::start();
    let mut raw = srv.async_conn().await;
    let flock = Flock::new(srv.client());
    let lease = flock.lock("k", MS(300)).await.expect("lock");
    let token = lease.token();
    drop(lease);
    wait_until("the dropped lease is released", MS(2000), || {
        let mut c = raw.clone();
        async move { check(&mut c, "k", token).await == 0 }
    })
    .await;
    let renews = renews_seen(&mut raw).await;
    tokio::time::sleep(MS(600)).await;
    assert_eq!(
        renews_seen(&mut raw).await,
        renews,
        "no renewal after the drop"
    );
    // A dropped reentrant hold is one hold less: the last drop frees the key.
    let opts = || LockOptions::new(MS(20_000)).owner("w").reentrant(true);
    let a = flock.lock("r", opts()).await.expect("lock");
    let b = flock.lock("r", opts()).await.expect("re-enter");
    let token = a.token();
    drop(a);
    tokio::time::sleep(MS(200)).await;
    assert!(check(&mut raw, "r", token).await > 0, "one hold left");
    drop(b);
    wait_until("the last drop frees the key", MS(2000), || {
        let mut c = raw.clone();
        async move { check(&mut c, "r", token).await == 0 }
    })
    .await;
}
