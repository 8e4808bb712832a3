//! Rule 12 of docs/CLIENTS.md against a real redis-server with the flock module: the client's
//! own argument checks are `Error::Invalid` and send nothing; a lost lease names its reason
//! from the fixed list; a released lease answers `Lost(Released)` without a round trip; a
//! fenced reply of another type than asked for is `Error::Reply`, not a refusal. Each test
//! names the scenario (`s12_1` is 12.1) it checks.

use std::time::Duration;

use flock_client::{redis, Error, Flock, LockOptions, LossReason, Mode, Wait};
use flock_testkit::aio::{q, wait_until};
use flock_testkit::Server;
use redis::aio::MultiplexedConnection;

const MS: fn(u64) -> Duration = Duration::from_millis;

/// Every FLOCK.* command the server ran so far (INFO commandstats).
async fn flock_calls(c: &mut MultiplexedConnection) -> i64 {
    let text: String = q(c, &["INFO", "commandstats"]).await;
    text.lines()
        .filter(|l| l.starts_with("cmdstat_flock."))
        .filter_map(|l| l.split("calls=").nth(1))
        .filter_map(|rest| rest.split(',').next())
        .filter_map(|n| n.parse::<i64>().ok())
        .sum()
}

fn invalid(r: Result<impl std::fmt::Debug, Error>, what: &str) {
    match r {
        Err(Error::Invalid(text)) => assert!(text.contains(what), "{what}: {text}"),
        other => panic!("expected Error::Invalid ({what}), got {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn s12_1_to_12_5_arguments_are_checked_before_anything_is_sent() {
    let srv = Server::start();
    let mut raw = srv.async_conn().await;
    let flock = Flock::new(srv.client());
    // 12.1: an empty key, on every call that takes one.
    invalid(flock.acquire("", MS(1000)).await, "key");
    invalid(flock.lock("", MS(1000)).await, "key");
    invalid(flock.release("", "w", None).await, "key");
    invalid(flock.revoke("", None).await, "key");
    invalid(flock.check("", 1).await, "key");
    // 12.2: a ttl of 0 or of a fraction of a millisecond.
    invalid(flock.acquire("k", Duration::ZERO).await, "ttl");
    invalid(flock.acquire("k", Duration::from_micros(500)).await, "ttl");
    invalid(flock.acquire("k", Duration::from_micros(1500)).await, "ttl");
    // 12.3: an owner empty or longer than 256 bytes; 256 bytes is fine.
    invalid(
        flock
            .acquire("k", LockOptions::new(MS(1000)).owner(""))
            .await,
        "owner",
    );
    invalid(
        flock
            .acquire("k", LockOptions::new(MS(1000)).owner("x".repeat(257)))
            .await,
        "owner",
    );
    invalid(flock.release("k", "", None).await, "owner");
    invalid(flock.revoke("k", Some("")).await, "owner");
    // A token names a grant: 0 is none.
    invalid(flock.release("k", "w", Some(0)).await, "token");
    invalid(flock.check("k", 0).await, "token");
    // 12.5: a bad limit, bound with replicas or fsync.
    invalid(
        flock
            .acquire("k", LockOptions::new(MS(1000)).mode(Mode::Permits(0)))
            .await,
        "limit",
    );
    invalid(
        flock
            .acquire("k", LockOptions::new(MS(1000)).bound(true).replicas(1))
            .await,
        "bound",
    );
    // 12.4 (an unknown option) and the rest of 12.5 (negative or NaN waits, shared with a
    // limit, a key or owner of another type) cannot be written in Rust: `LockOptions` has
    // only its builder methods, `Wait` holds a `Duration`, `Mode` is one kind.
    assert_eq!(flock_calls(&mut raw).await, 0, "nothing was sent");

    // The boundaries are accepted: a 256-byte owner, a 1 ms ttl.
    let lease = flock
        .lock("k", LockOptions::new(MS(5000)).owner("x".repeat(256)))
        .await
        .expect("256-byte owner");
    lease.release().await.expect("release");
    let short = flock
        .acquire("k1", LockOptions::new(MS(1)).renew(false))
        .await
        .expect("1 ms ttl");
    assert!(short.is_some());
    // The server's own refusals stay server errors.
    let _: () = q(&mut raw, &["SET", "str", "x"]).await;
    let r = flock.acquire("str", MS(1000)).await;
    assert!(matches!(r, Err(Error::Redis(_))), "{r:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn s12_6_each_loss_names_its_reason() {
    let srv = Server::start();
    let mut raw = srv.async_conn().await;
    let flock = Flock::new(srv.client());

    // deadline-passed: no renewal, the local deadline runs out.
    let lease = flock
        .lock("d", LockOptions::new(MS(150)).renew(false))
        .await
        .expect("lock");
    assert_eq!(lease.lost_reason(), None);
    assert!(lease.wait_lost(MS(2000)).await);
    assert_eq!(lease.lost_reason(), Some(LossReason::DeadlinePassed));
    match lease.ensure(Duration::ZERO) {
        Err(Error::Lost(LossReason::DeadlinePassed)) => {}
        other => panic!("{other:?}"),
    }
    let r = lease.release().await;
    assert!(
        matches!(r, Err(Error::Lost(LossReason::DeadlinePassed))),
        "{r:?}"
    );

    // renew-refused: the grant is gone (DEL), an explicit renew answers nil.
    let lease = flock
        .lock("r", LockOptions::new(MS(20_000)).renew(false))
        .await
        .expect("lock");
    let _: i64 = q(&mut raw, &["DEL", "r"]).await;
    // (rule 9 may have heard the DEL first: `lost`; otherwise the RENEW's nil)
    let r = lease.renew(None).await;
    match r {
        Err(Error::Lost(reason)) => {
            assert!(
                matches!(reason, LossReason::RenewRefused | LossReason::Lost),
                "{reason}"
            );
            assert_eq!(lease.lost_reason(), Some(reason));
        }
        other => panic!("{other:?}"),
    }

    // fenced-refused: another grant holds the key.
    let lease = flock
        .lock("f", LockOptions::new(MS(20_000)).renew(false).owner("a"))
        .await
        .expect("lock");
    let token = lease.token();
    let _: i64 = q(&mut raw, &["FLOCK.RELEASE", "f", "a", &token.to_string()]).await;
    let _: i64 = q(&mut raw, &["FLOCK.ACQUIRE", "f", "b", "20000"]).await;
    let r = lease
        .fenced::<()>(redis::cmd("SET").arg("f:v").arg("1"))
        .await;
    assert!(matches!(r, Err(Error::Fenced(_))), "{r:?}");
    // (rule 9 may have heard the release as `revoked` first: the first reason stays)
    let reason = lease.lost_reason().expect("lost");
    assert!(
        matches!(reason, LossReason::FencedRefused | LossReason::Revoked),
        "{reason}"
    );
    assert!(matches!(lease.ensure(Duration::ZERO), Err(Error::Lost(r)) if r == reason));

    // gone: CHECK answers 0 for a grant the server no longer knows.
    let lease = flock
        .lock("g", LockOptions::new(MS(20_000)).renew(false))
        .await
        .expect("lock");
    let _: i64 = q(&mut raw, &["FLOCK.REVOKE", "g"]).await;
    wait_until("the revoke is heard or CHECK says 0", MS(2000), || {
        let h = lease.handle();
        async move { h.check().await.map(|d| d.is_zero()).unwrap_or(false) }
    })
    .await;
    let reason = lease.lost_reason().expect("lost");
    assert!(
        matches!(reason, LossReason::Gone | LossReason::Revoked),
        "{reason}"
    );

    // closed: a bound lease whose connection is killed.
    let lease = flock
        .lock("c", LockOptions::new(MS(20_000)).bound(true))
        .await
        .expect("lock");
    let _: () = q(
        &mut raw,
        &["CLIENT", "KILL", "SKIPME", "yes", "TYPE", "normal"],
    )
    .await;
    let _ = lease.check().await;
    assert!(lease.wait_lost(MS(2000)).await);
    assert_eq!(lease.lost_reason(), Some(LossReason::Closed));
    assert_eq!(LossReason::Closed.to_string(), "closed");
    assert_eq!(LossReason::RenewRefused.as_str(), "renew-refused");
    assert_eq!(LossReason::DeadlinePassed.as_str(), "deadline-passed");
    assert_eq!(LossReason::FencedRefused.as_str(), "fenced-refused");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn s12_7_a_released_lease_answers_released_at_once_and_sends_nothing() {
    let srv = Server::start();
    let mut raw = srv.async_conn().await;
    let flock = Flock::new(srv.client());
    let lease = flock.lock("k", MS(20_000)).await.expect("lock");
    let h = lease.handle();
    lease.release().await.expect("release");
    let before = flock_calls(&mut raw).await;
    let r = h.fenced::<()>(redis::cmd("SET").arg("k:v").arg("1")).await;
    assert!(matches!(r, Err(Error::Lost(LossReason::Released))), "{r:?}");
    assert!(matches!(
        h.ensure(Duration::ZERO),
        Err(Error::Lost(LossReason::Released))
    ));
    assert!(matches!(
        h.renew(None).await,
        Err(Error::Lost(LossReason::Released))
    ));
    assert!(!h.is_lost(), "a released lease is not lost");
    assert!(h.is_released());
    assert_eq!(h.lost_reason(), None);
    assert_eq!(flock_calls(&mut raw).await, before, "nothing was sent");
    assert_eq!(q::<i64>(&mut raw, &["EXISTS", "k:v"]).await, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn s12_fenced_reply_of_another_type_is_reply_not_a_refusal() {
    // A fenced write whose reply does not convert to the asked-for type: the write ran, and
    // the error says so and carries the reply; the lease stays live.
    let srv = Server::start();
    let mut raw = srv.async_conn().await;
    let flock = Flock::new(srv.client());
    let lease = flock.lock("t", MS(20_000)).await.expect("lock");
    let r = lease
        .fenced::<i64>(redis::cmd("SET").arg("t:v").arg("abc"))
        .await;
    match r {
        Err(Error::Reply { reply, .. }) => assert_eq!(reply, redis::Value::Okay),
        other => panic!("{other:?}"),
    }
    assert_eq!(q::<String>(&mut raw, &["GET", "t:v"]).await, "abc");
    assert!(!lease.is_lost());
    let v: redis::Value = lease
        .fenced(redis::cmd("GET").arg("t:v"))
        .await
        .expect("any reply as a Value");
    assert_eq!(v, redis::Value::BulkString(b"abc".to_vec()));
    // A wait is not an argument to refuse: `Wait::For(0)` is one try.
    let other = flock
        .acquire(
            "t",
            LockOptions::new(MS(1000)).wait(Wait::For(Duration::ZERO)),
        )
        .await
        .expect("one try");
    assert!(other.is_none());
    lease.release().await.expect("release");
}
