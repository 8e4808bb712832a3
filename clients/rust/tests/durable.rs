//! Durable grants (docs/CLIENTS.md rule 10): `replicas(n)` hands a lease over only once `n`
//! replicas acknowledged the grant, `fsync(true)` only once the AOF has it on disk, renewals
//! count only once acknowledged. Real servers: Redis from `REDIS_SERVER` (Debian's 7.0, which
//! has no WAITAOF) with replicas, and valkey-server (which has WAITAOF) for fsync.

use std::time::Duration;

use flock_client::{Error, Flock, LockOptions, Mode, Wait};
use flock_testkit::aio::{q, wait_until};
use flock_testkit::{missing, valkey_server, Server};
use redis::aio::MultiplexedConnection;
use redis::Value;
use tokio::time::Instant;

const MS: fn(u64) -> Duration = Duration::from_millis;

/// Clients blocked in a wait, not counting FLOCK.WATCHes (rule 9: each Flock with leases keeps
/// one waiting, which counts in blocked_clients and flock_blocked_clients too).
async fn waiting(c: &mut redis::aio::MultiplexedConnection, field: &str) -> i64 {
    let section = if field == "blocked_clients" {
        "clients"
    } else {
        "flock"
    };
    flock_testkit::aio::info_i64(c, section, field).await
        - flock_testkit::aio::info_i64(c, "flock", "flock_watchers").await
}

async fn exists(c: &mut MultiplexedConnection, key: &str) -> bool {
    q::<i64>(c, &["EXISTS", key]).await == 1
}

async fn check(c: &mut MultiplexedConnection, key: &str, token: u64) -> u64 {
    q(c, &["FLOCK.CHECK", key, &token.to_string()]).await
}

async fn info_text(c: &mut MultiplexedConnection, key: &str) -> String {
    let v: Value = q(c, &["FLOCK.INFO", key]).await;
    format!("{v:?}")
}

/// How many FLOCK.ACQUIRE the server ran (0 when it never saw one).
async fn acquires_seen(c: &mut MultiplexedConnection) -> i64 {
    let text: String = q(c, &["INFO", "commandstats"]).await;
    text.lines()
        .find_map(|l| l.strip_prefix("cmdstat_flock.acquire:calls="))
        .and_then(|rest| rest.split(',').next())
        .and_then(|n| n.parse().ok())
        .unwrap_or(0)
}

fn server_text(e: &Error) -> String {
    match e {
        Error::Redis(r) => r.to_string(),
        other => panic!("expected Error::Redis, got {other:?}"),
    }
}

/// A refusal of the client's own (rule 12): `Error::Invalid`, never dressed as a server error.
fn invalid_text(e: &Error) -> String {
    match e {
        Error::Invalid(t) => t.clone(),
        other => panic!("expected Error::Invalid, got {other:?}"),
    }
}

/// The master's WAIT with every replica caught up (the test's own check, not the client's).
async fn replicas_caught_up(m: &mut MultiplexedConnection, n: i64) {
    let acked: i64 = q(m, &["WAIT", &n.to_string(), "5000"]).await;
    assert_eq!(acked, n, "WAIT {n} 5000");
}

/// A replica of `m` whose command stream runs. Redis 7.0 lists a new replica as online
/// before it streams to it: the stream starts with the replica's first REPLCONF ACK, sent
/// once a second, so until then nothing reaches the replica and no WAIT is answered (a
/// durable grant made then falls short). A write and a WAIT of the test's own wait for that.
async fn streaming_replica_of(m: &Server, mc: &mut MultiplexedConnection) -> Server {
    let r = Server::start_replica_of(m);
    let _: () = q(mc, &["SET", "warm-up", "1"]).await;
    let n: i64 = q(mc, &["WAIT", "1", "5000"]).await;
    assert_eq!(n, 1, "the replica streams");
    r
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replicas_1_hands_over_a_grant_the_replica_already_holds() {
    let m = Server::start();
    let mut mc = m.async_conn().await;
    let r = streaming_replica_of(&m, &mut mc).await;
    let mut rc = r.async_conn().await;
    let flock = Flock::new(m.client());

    // One try on a free key: the replica holds the grant the moment lock() returns.
    let lease = flock
        .lock("d:1", LockOptions::new(MS(5000)).replicas(1))
        .await
        .expect("durable lock");
    let on_replica = check(&mut rc, "d:1", lease.token()).await;
    assert!(on_replica > 0, "the replica holds the grant");
    assert!(info_text(&mut rc, "d:1").await.contains(lease.owner()));
    // Counted from the ACQUIRE's send (rule 1), so never above the master's CHECK.
    let on_master = check(&mut mc, "d:1", lease.token()).await;
    assert!(lease.remaining() <= MS(on_master));
    assert!(lease.remaining() > MS(4000), "{:?}", lease.remaining());

    // A durable shared grant, the same.
    let reader = flock
        .lock(
            "d:shared",
            LockOptions::new(MS(5000)).mode(Mode::Shared).replicas(1),
        )
        .await
        .expect("durable shared lock");
    assert!(check(&mut rc, "d:shared", reader.token()).await > 0);
    reader.release().await.expect("release");

    // A grant after a BLOCK wait: its RENEW carries the WAIT; the replica holds the grant
    // when lock() returns.
    let f = flock.clone();
    let waiter = tokio::spawn(async move {
        f.lock(
            "d:1",
            LockOptions::new(MS(5000))
                .owner("waiter")
                .replicas(1)
                .wait(Wait::For(MS(20_000))),
        )
        .await
    });
    wait_until("the waiter blocks", MS(5000), || {
        let mut c = mc.clone();
        async move { waiting(&mut c, "blocked_clients").await == 1 }
    })
    .await;
    let held = lease.token();
    lease.release().await.expect("release");
    let l2 = waiter.await.expect("join").expect("granted after the wait");
    assert!(l2.token() > held);
    assert!(check(&mut rc, "d:1", l2.token()).await > 0);
    assert!(info_text(&mut rc, "d:1").await.contains("waiter"));
    l2.release().await.expect("release");

    // The watchdog's renewals are durable too: a 600 ms lease lives 2 s, and the replica's
    // copy of it is renewed along (it would have run out after 600 ms).
    let lease = flock
        .lock("d:wd", LockOptions::new(MS(600)).replicas(1))
        .await
        .expect("durable lock");
    for _ in 0..10 {
        tokio::time::sleep(MS(200)).await;
        assert!(!lease.is_lost());
        assert!(check(&mut rc, "d:wd", lease.token()).await > 0);
    }
    lease.release().await.expect("release");
    replicas_caught_up(&mut mc, 1).await;
    assert!(!exists(&mut rc, "d:wd").await);
    m.assert_log_clean();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replicas_1_without_a_replica_is_not_durable_after_the_timeout_and_frees_the_key() {
    let m = Server::start();
    let mut mc = m.async_conn().await;
    let flock = Flock::new(m.client());

    // Default durable timeout: a third of the 3 s ttl.
    let t0 = Instant::now();
    let r = flock
        .acquire("nd", LockOptions::new(MS(3000)).replicas(1))
        .await;
    let took = t0.elapsed();
    match &r {
        Err(
            e @ Error::NotDurable {
                acknowledged: 0,
                asked: 1,
                fsynced: None,
            },
        ) => assert_eq!(
            e.to_string(),
            "not durable: 0 of 1 replicas acknowledged within the durable timeout"
        ),
        other => panic!("expected NotDurable 0 of 1, got {other:?}"),
    }
    assert!(
        took >= MS(990) && took < MS(2500),
        "NotDurable after {took:?}, not about the 1 s durable timeout"
    );
    // The grant was made, then released: the key is free again for anyone.
    assert_eq!(acquires_seen(&mut mc).await, 1);
    assert!(!exists(&mut mc, "nd").await, "the short grant was released");
    let plain = flock.lock("nd", MS(3000)).await.expect("free again");
    plain.release().await.expect("release");

    // A durable timeout of the caller's, through lock() and with_lock().
    let t0 = Instant::now();
    let r = flock
        .lock(
            "nd",
            LockOptions::new(MS(10_000))
                .replicas(1)
                .durable_timeout(MS(200)),
        )
        .await;
    let took = t0.elapsed();
    assert!(
        matches!(
            r,
            Err(Error::NotDurable {
                acknowledged: 0,
                ..
            })
        ),
        "{r:?}"
    );
    assert!(took >= MS(195) && took < MS(1500), "{took:?}");
    assert!(!exists(&mut mc, "nd").await);
    let out: Result<(), Error> = flock
        .with_lock(
            "nd",
            LockOptions::new(MS(10_000))
                .replicas(1)
                .durable_timeout(MS(100)),
            |_lease| async move { panic!("the closure must not run") },
        )
        .await;
    assert!(matches!(out, Err(Error::NotDurable { .. })), "{out:?}");
    assert!(!exists(&mut mc, "nd").await);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replicas_2_with_one_replica_is_not_durable() {
    let m = Server::start();
    let mut mc = m.async_conn().await;
    let r = streaming_replica_of(&m, &mut mc).await;
    let mut rc = r.async_conn().await;
    let flock = Flock::new(m.client());
    let t0 = Instant::now();
    let res = flock
        .acquire(
            "two",
            LockOptions::new(MS(5000))
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
    assert!(!exists(&mut mc, "two").await);
    replicas_caught_up(&mut mc, 1).await;
    assert!(
        !exists(&mut rc, "two").await,
        "the release reached the replica"
    );
    // The same with the one replica asked for: granted.
    let lease = flock
        .lock("two", LockOptions::new(MS(5000)).replicas(1))
        .await
        .expect("durable lock");
    assert!(check(&mut rc, "two", lease.token()).await > 0);
    lease.release().await.expect("release");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn s10_3_fsync_on_a_server_without_waitaof_is_refused_before_anything_is_sent() {
    // Debian's Redis 7.0 has no WAITAOF. Should REDIS_SERVER be a newer one, the command is
    // renamed away, so that the server is one without it all the same.
    let probe = Server::start();
    let mut pc = probe.async_conn().await;
    let info: Vec<Value> = q(&mut pc, &["COMMAND", "INFO", "WAITAOF"]).await;
    let srv = if matches!(info.first(), None | Some(Value::Nil)) {
        probe
    } else {
        drop(pc);
        drop(probe);
        Server::builder()
            .args("rename-command", &["WAITAOF", ""])
            .start()
    };
    let mut c = srv.async_conn().await;
    let info: Vec<Value> = q(&mut c, &["COMMAND", "INFO", "WAITAOF"]).await;
    assert!(matches!(info.first(), Some(Value::Nil)), "{info:?}");

    let flock = Flock::new(srv.client());
    for opts in [
        LockOptions::new(MS(5000)).fsync(true),
        LockOptions::new(MS(5000)).fsync(true).replicas(1),
        LockOptions::new(MS(5000))
            .fsync(true)
            .wait(Wait::For(MS(1000))),
    ] {
        let t0 = Instant::now();
        let r = flock.acquire("aof", opts).await;
        let e = r.expect_err("refused");
        let text = invalid_text(&e);
        assert!(
            text.contains("fsync(true) needs WAITAOF, which this server does not have"),
            "{text}"
        );
        assert!(text.contains("Redis 7.2"), "{text}");
        assert!(t0.elapsed() < MS(500), "refused at once");
    }
    assert!(!exists(&mut c, "aof").await, "the key was never created");
    assert_eq!(acquires_seen(&mut c).await, 0, "no ACQUIRE was ever sent");
    // Without fsync the same factory takes the lock.
    let lease = flock.lock("aof", MS(5000)).await.expect("lock");
    lease.release().await.expect("release");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fsync_on_valkey_with_appendonly_hands_over_once_the_aof_has_it() {
    let Some(valkey) = valkey_server() else {
        missing("fsync_on_valkey", "valkey-server (VALKEY_SERVER)");
    };
    let m = Server::builder()
        .bin(&valkey)
        .arg("appendonly", "yes")
        .arg("appendfsync", "everysec")
        .start();
    let r = Server::builder()
        .bin(&valkey)
        .arg("appendonly", "yes")
        .replica_of(&m)
        .start();
    let mut mc = m.async_conn().await;
    let _: () = q(&mut mc, &["SET", "warm-up", "1"]).await;
    let n: i64 = q(&mut mc, &["WAIT", "1", "5000"]).await;
    assert_eq!(n, 1, "the replica streams");
    let mut rc = r.async_conn().await;
    let flock = Flock::new(m.client());

    // Handed over once WAITAOF said the master's AOF has the grant on disk: the file holds
    // it (that it was fsynced, and not only written, is WAITAOF's word).
    let lease = flock
        .lock("f:1", LockOptions::new(MS(5000)).fsync(true))
        .await
        .expect("fsync lock");
    assert!(check(&mut mc, "f:1", lease.token()).await > 0);
    let aof = std::fs::read_dir(m.dir().join("appendonlydir"))
        .expect("appendonlydir")
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().contains(".incr.aof"))
        .map(|e| std::fs::read(e.path()).unwrap_or_default())
        .any(|bytes| {
            bytes
                .windows(lease.owner().len())
                .any(|w| w == lease.owner().as_bytes())
        });
    assert!(
        aof,
        "the grant is in the master's AOF file when lock() returns"
    );
    // The watchdog's renewals wait for the fsync as well: a 3 s lease lives 4 s. (With
    // appendfsync everysec a write is on disk within about a second: the durable timeout
    // covers that.)
    let short = flock
        .lock(
            "f:wd",
            LockOptions::new(MS(3000))
                .fsync(true)
                .durable_timeout(MS(1500)),
        )
        .await
        .expect("fsync lock");
    tokio::time::sleep(MS(4000)).await;
    assert!(!short.is_lost());
    assert!(check(&mut mc, "f:wd", short.token()).await > 0);
    short.release().await.expect("release");
    lease.release().await.expect("release");

    // fsync with a replica: WAITAOF 1 1, the replica's own AOF has it too. (A replica
    // reports what it has on disk with its REPLCONF ACK, which can come a second later.)
    let lease = flock
        .lock("f:2", LockOptions::new(MS(5000)).fsync(true).replicas(1))
        .await
        .expect("fsync + replica lock");
    assert!(check(&mut rc, "f:2", lease.token()).await > 0);
    lease.release().await.expect("release");
    // Two replicas asked for, one there: not durable, released.
    let res = flock
        .acquire(
            "f:3",
            LockOptions::new(MS(5000))
                .fsync(true)
                .replicas(2)
                .durable_timeout(MS(1500)),
        )
        .await;
    match &res {
        Err(
            e @ Error::NotDurable {
                acknowledged: 1,
                asked: 2,
                fsynced: Some(true),
            },
        ) => assert!(
            e.to_string().contains("the master's AOF has it on disk"),
            "{e}"
        ),
        other => panic!("expected NotDurable 1 of 2, fsynced, got {other:?}"),
    }
    assert!(!exists(&mut mc, "f:3").await);

    // WAITAOF on a server with appendonly no: the server's error, after the grant, which is
    // released again.
    let plain = Server::builder().bin(&valkey).start();
    let mut pc = plain.async_conn().await;
    let pf = Flock::new(plain.client());
    let res = pf
        .acquire("f:4", LockOptions::new(MS(5000)).fsync(true))
        .await;
    let text = server_text(&res.expect_err("appendonly no"));
    assert!(text.to_lowercase().contains("appendonly"), "{text}");
    assert!(!exists(&mut pc, "f:4").await, "the grant was released");
    assert_eq!(acquires_seen(&mut pc).await, 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn s10_3_bound_with_replicas_or_fsync_and_bad_durable_timeouts_are_refused_before_sending() {
    let m = Server::start();
    let mut mc = m.async_conn().await;
    let flock = Flock::new(m.client());
    let cases = [
        (
            LockOptions::new(MS(5000)).bound(true).replicas(1),
            "a bound grant cannot be durable",
        ),
        (
            LockOptions::new(MS(5000)).bound(true).fsync(true),
            "a bound grant cannot be durable",
        ),
        (
            LockOptions::new(MS(5000))
                .replicas(1)
                .durable_timeout(Duration::ZERO),
            "durable_timeout must be at least 1 ms",
        ),
        (
            LockOptions::new(MS(5000))
                .replicas(1)
                .durable_timeout(MS(5000)),
            "durable_timeout must be less than the ttl",
        ),
    ];
    for (opts, what) in cases {
        let e = flock.acquire("b", opts).await.expect_err(what);
        let text = invalid_text(&e);
        assert!(text.contains(what), "{text}");
    }
    assert_eq!(acquires_seen(&mut mc).await, 0, "nothing was sent");
    // A bound lease without durability, and a durable timeout without durability, are fine.
    let lease = flock
        .lock(
            "b",
            LockOptions::new(MS(5000))
                .bound(true)
                .durable_timeout(MS(100)),
        )
        .await
        .expect("bound lock");
    lease.release().await.expect("release");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_durable_renewal_moves_the_deadline_and_a_short_one_does_not() {
    let m = Server::start();
    let mut mc = m.async_conn().await;
    let r = streaming_replica_of(&m, &mut mc).await;
    let mut rc = r.async_conn().await;
    let flock = Flock::new(m.client());

    // Explicit renewals (no watchdog) with a 300 ms durable timeout.
    let lease = flock
        .lock(
            "r:1",
            LockOptions::new(MS(6000))
                .replicas(1)
                .durable_timeout(MS(300))
                .renew(false),
        )
        .await
        .expect("durable lock");
    tokio::time::sleep(MS(500)).await;
    let before = lease.remaining();
    lease.renew(Some(MS(8000))).await.expect("durable renew");
    let after = lease.remaining();
    assert!(
        after > MS(7500) && after > before,
        "{before:?} -> {after:?}"
    );
    // The replica already has the renewed deadline.
    assert!(check(&mut rc, "r:1", lease.token()).await > 7500);

    // The replica stops: a renewal runs on the master but nobody acknowledges it in 300 ms.
    // (A second after the last one, so that it would move the deadline by a second.)
    tokio::time::sleep(MS(1000)).await;
    r.signal("STOP");
    let before = lease.remaining();
    let t0 = Instant::now();
    let res = lease.renew(Some(MS(8000))).await;
    let took = t0.elapsed();
    let after = lease.remaining();
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
    assert!(took >= MS(295), "{took:?}");
    // The deadline did not move: the time went by on the old one.
    assert!(
        after + took <= before + MS(5),
        "{before:?} -> {after:?} over {took:?}"
    );
    assert!(!lease.is_lost());
    // The master did renew: its CHECK is above what the client believes (rule 1 still holds).
    let on_master = check(&mut mc, "r:1", lease.token()).await;
    let local = lease.remaining();
    assert!(
        MS(on_master) > local + MS(700),
        "master {on_master} ms, local {local:?}"
    );

    // With the watchdog: granted durably (the replica back), then every renewal falls
    // short, so the lease is lost at its local deadline, while the master, renewed all
    // along, still holds the grant.
    r.signal("CONT");
    replicas_caught_up(&mut mc, 1).await;
    let wd = flock
        .lock(
            "r:2",
            LockOptions::new(MS(1500))
                .replicas(1)
                .durable_timeout(MS(200)),
        )
        .await
        .expect("durable lock");
    let granted = Instant::now();
    r.signal("STOP");
    assert!(
        wd.wait_lost(MS(4000)).await,
        "lost when no renewal was acknowledged"
    );
    let lost_after = granted.elapsed();
    assert!(
        lost_after >= MS(1300) && lost_after < MS(2500),
        "lost after {lost_after:?}, not at its 1.5 s local deadline"
    );
    let on_master = check(&mut mc, "r:2", wd.token()).await;
    assert!(
        on_master > 0,
        "the master renewed the grant (the client did not count it)"
    );
    r.signal("CONT");
    replicas_caught_up(&mut mc, 1).await;

    // With the replica back, renewals count again.
    let res = lease.renew(None).await;
    assert!(res.is_ok(), "{res:?}");
    assert!(lease.remaining() > MS(7500));
    lease.release().await.expect("release");
    assert!(matches!(wd.release().await, Err(Error::Lost(_))));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_durable_grant_survives_the_masters_loss_when_the_promoted_replica_acknowledged() {
    let mut m = Server::start();
    let mut mc = m.async_conn().await;
    let r = streaming_replica_of(&m, &mut mc).await;
    let mut rc = r.async_conn().await;
    let flock = Flock::new(m.client());
    let lease = flock
        .lock("fo", LockOptions::new(MS(10_000)).replicas(1).renew(false))
        .await
        .expect("durable lock");
    let token = lease.token();
    // The master dies at once (SIGKILL) and the replica is promoted.
    m.stop();
    let _: String = q(&mut rc, &["REPLICAOF", "NO", "ONE"]).await;
    wait_until("the replica is a master", MS(5000), || {
        let mut c = rc.clone();
        async move {
            let text: String = q(&mut c, &["INFO", "replication"]).await;
            text.contains("role:master")
        }
    })
    .await;
    // The new master holds the grant: another owner is refused, the token is live.
    assert!(check(&mut rc, "fo", token).await > 0);
    let other: Option<u64> = q(&mut rc, &["FLOCK.ACQUIRE", "fo", "someone-else", "1000"]).await;
    assert_eq!(other, None, "the lock is still held after the failover");
    drop(lease);
}
