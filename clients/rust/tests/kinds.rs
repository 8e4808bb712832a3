//! Shared, counted and bound leases (docs/SPEC.md "Lock kinds", "Connection-bound grants")
//! against a real redis-server with the flock module. Each test starts its own server.

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::Duration;

use flock_client::{Error, Flock, Lease, LockOptions, Mode, Wait};
use flock_testkit::aio::{info_i64, q, wait_until};
use flock_testkit::Server;
use redis::aio::MultiplexedConnection;
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

fn opts(ttl: u64) -> LockOptions {
    LockOptions::new(MS(ttl))
}

/// FLOCK.INFO as (field, value) text pairs.
async fn info(c: &mut MultiplexedConnection, key: &str) -> Vec<(String, String)> {
    let v: Vec<redis::Value> = q(c, &["FLOCK.INFO", key]).await;
    let text = |v: &redis::Value| match v {
        redis::Value::BulkString(b) => String::from_utf8_lossy(b).into_owned(),
        redis::Value::SimpleString(s) => s.clone(),
        redis::Value::Int(i) => i.to_string(),
        redis::Value::Nil => "nil".into(),
        other => format!("{other:?}"),
    };
    v.chunks(2).map(|p| (text(&p[0]), text(&p[1]))).collect()
}

async fn field(c: &mut MultiplexedConnection, key: &str, name: &str) -> String {
    info(c, key)
        .await
        .into_iter()
        .find(|(k, _)| k == name)
        .map(|(_, v)| v)
        .unwrap_or_else(|| panic!("no {name} in FLOCK.INFO {key}"))
}

/// FLOCK.HOLDERS as (owner, token) pairs.
async fn holders(c: &mut MultiplexedConnection, key: &str) -> Vec<(String, u64)> {
    let v: Vec<(String, u64, u64)> = q(c, &["FLOCK.HOLDERS", key]).await;
    v.into_iter().map(|(o, t, _)| (o, t)).collect()
}

/// FLOCK.WAITERS as (owner, mode) pairs, first in line first.
async fn waiters(c: &mut MultiplexedConnection, key: &str) -> Vec<(String, String)> {
    let v: Vec<(String, String, u64)> = q(c, &["FLOCK.WAITERS", key]).await;
    v.into_iter().map(|(o, m, _)| (o, m)).collect()
}

async fn blocked(c: &MultiplexedConnection, n: i64) {
    wait_until(&format!("{n} blocked clients"), MS(10_000), || {
        let mut c = c.clone();
        async move { waiting(&mut c, "blocked_clients").await == n }
    })
    .await;
}

fn redis_error_with(r: &Result<Option<Lease>, Error>, text: &str) -> bool {
    matches!(r, Err(Error::Redis(e)) if e.to_string().contains(text))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shared_leases_hold_together_and_a_writer_waits_for_all_of_them() {
    let srv = Server::start();
    let mut raw = srv.async_conn().await;
    let flock = Flock::new(srv.client());
    let mut readers = Vec::new();
    for _ in 0..3 {
        let l = flock
            // 900 ms (renewed every 300 ms): 450 ms left 300 ms for a late renewal
            .lock("rw", opts(900).mode(Mode::Shared))
            .await
            .expect("a reader");
        assert_eq!(l.mode(), Mode::Shared);
        readers.push(l);
    }
    let tokens: Vec<u64> = readers.iter().map(|l| l.token()).collect();
    assert!(tokens.windows(2).all(|w| w[0] < w[1]), "{tokens:?}");
    assert_eq!(field(&mut raw, "rw", "mode").await, "shared");
    assert_eq!(field(&mut raw, "rw", "holders").await, "3");
    let want: Vec<(String, u64)> = readers
        .iter()
        .map(|l| (l.owner().to_string(), l.token()))
        .collect();
    assert_eq!(holders(&mut raw, "rw").await, want);

    // A writer gets nothing while readers hold.
    assert!(flock
        .acquire("rw", opts(5000))
        .await
        .expect("try")
        .is_none());
    assert!(matches!(
        flock.lock("rw", opts(5000)).await,
        Err(Error::Busy)
    ));
    // A reader's fenced() runs reads; a write is the server's error (not Fenced), and the
    // lease stays live.
    let got: Option<String> = readers[0]
        .fenced(redis::cmd("GET").arg("rw:data"))
        .await
        .expect("a read");
    assert_eq!(got, None);
    let w = readers[0]
        .fenced::<()>(redis::cmd("SET").arg("rw:data").arg("x"))
        .await;
    assert!(
        matches!(&w, Err(Error::Redis(e)) if e.to_string().contains("shared grant runs read-only commands only")),
        "{w:?}"
    );
    assert!(!readers[0].is_lost());

    let f = flock.clone();
    let writer =
        tokio::spawn(async move { f.lock("rw", opts(5000).wait(Wait::For(MS(20_000)))).await });
    blocked(&raw, 1).await;
    // A reader that comes after the waiting writer does not jump the queue.
    assert!(flock
        .acquire("rw", opts(5000).mode(Mode::Shared))
        .await
        .expect("try")
        .is_none());
    // The watchdogs keep the 900 ms shared leases alive while the writer waits.
    let base = info_i64(&mut raw, "flock", "flock_renewals").await;
    wait_until("two renewals per reader", MS(10_000), || {
        let mut c = raw.clone();
        async move { info_i64(&mut c, "flock", "flock_renewals").await >= base + 6 }
    })
    .await;
    assert!(readers.iter().all(|l| !l.is_lost()));
    let last = readers.pop().expect("three");
    for l in readers {
        l.release().await.expect("release a reader");
    }
    assert_eq!(holders(&mut raw, "rw").await.len(), 1);
    // The writer still waits: the only request in the key's queue, and the only blocked client
    // but the watches. Polled: the releases just above end the Flock's FLOCK.WATCH, which it
    // sends again without them; while it is on its way, INFO clients may count it out and INFO
    // flock (read next) count it in, so that one reading can say 0.
    let queued = waiters(&mut raw, "rw").await;
    assert_eq!(queued.len(), 1, "{queued:?}");
    assert_eq!(queued[0].1, "exclusive", "{queued:?}");
    blocked(&raw, 1).await;
    assert!(
        !writer.is_finished(),
        "the writer waits for the last reader"
    );
    last.release().await.expect("release the last reader");
    let w = writer.await.expect("join").expect("the writer's lease");
    assert_eq!(w.mode(), Mode::Exclusive);
    assert_eq!(
        queued[0].0,
        w.owner(),
        "the request that waited was the writer's"
    );
    assert!(w.token() > tokens[2]);
    assert_eq!(field(&mut raw, "rw", "mode").await, "exclusive");
    assert_eq!(field(&mut raw, "rw", "owner").await, w.owner());
    let ok: String = w
        .fenced(redis::cmd("SET").arg("rw:data").arg("w"))
        .await
        .expect("the writer writes");
    assert_eq!(ok, "OK");
    w.release().await.expect("release the writer");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn permits_admit_n_holders_and_the_next_waiter_gets_a_released_one() {
    let srv = Server::start();
    let mut raw = srv.async_conn().await;
    let flock = Flock::new(srv.client());
    let sem = || opts(5000).mode(Mode::Permits(3));
    let out: Result<(), Error> = flock
        .with_lock("sem", sem(), |first| {
            let flock = flock.clone();
            let raw = raw.clone();
            async move {
                let mut raw = raw;
                assert_eq!(first.mode(), Mode::Permits(3));
                let p1 = flock.lock("sem", sem()).await?;
                let p2 = flock.lock("sem", sem()).await?;
                assert!(first.token() < p1.token() && p1.token() < p2.token());
                assert_eq!(field(&mut raw, "sem", "mode").await, "permits");
                assert_eq!(field(&mut raw, "sem", "limit").await, "3");
                assert_eq!(field(&mut raw, "sem", "holders").await, "3");
                // A permit may write (unlike a shared grant).
                let n: i64 = p1.fenced(redis::cmd("INCR").arg("sem:count")).await?;
                assert_eq!(n, 1);
                assert!(flock.acquire("sem", sem()).await?.is_none());
                assert!(matches!(flock.lock("sem", sem()).await, Err(Error::Busy)));
                let f = flock.clone();
                let fourth =
                    tokio::spawn(
                        async move { f.lock("sem", sem().wait(Wait::For(MS(20_000)))).await },
                    );
                blocked(&raw, 1).await;
                assert!(!fourth.is_finished());
                let p1_token = p1.token();
                p1.release().await?;
                let p3 = fourth.await.expect("join")?;
                assert!(p3.token() > p2.token() && p3.token() > p1_token);
                assert_eq!(
                    holders(&mut raw, "sem").await,
                    vec![
                        (first.owner().to_string(), first.token()),
                        (p2.owner().to_string(), p2.token()),
                        (p3.owner().to_string(), p3.token()),
                    ]
                );
                let n: i64 = p3.fenced(redis::cmd("INCR").arg("sem:count")).await?;
                assert_eq!(n, 2);
                p3.release().await?;
                p2.release().await?;
                Ok(())
            }
        })
        .await;
    out.expect("with_lock");
    assert_eq!(q::<i64>(&mut raw, &["EXISTS", "sem"]).await, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn limit_mismatch_and_mode_conflicts_are_the_servers_errors() {
    let srv = Server::start();
    let mut raw = srv.async_conn().await;
    let flock = Flock::new(srv.client());
    let a = flock
        .lock("lim", opts(5000).mode(Mode::Permits(2)).owner("a"))
        .await
        .expect("a");
    let b = flock
        .lock("lim", opts(5000).mode(Mode::Permits(2)))
        .await
        .expect("b");
    let mismatch = "limit mismatch: lim admits 2 shared holders";
    for o in [
        opts(5000).mode(Mode::Permits(3)),
        opts(5000).mode(Mode::Shared),
        opts(5000).mode(Mode::Permits(3)).bound(true),
    ] {
        let r = flock.acquire("lim", o.clone()).await;
        assert!(redis_error_with(&r, mismatch), "{o:?}: {r:?}");
        // With a wait (the key is full): at once, neither a wait nor Busy.
        let t0 = Instant::now();
        let r = flock.acquire("lim", o.wait(Wait::For(MS(20_000)))).await;
        assert!(redis_error_with(&r, mismatch), "{r:?}");
        assert!(t0.elapsed() < MS(5000));
    }
    // An exclusive request on a limited key is no mismatch: busy.
    assert!(flock
        .acquire("lim", opts(5000))
        .await
        .expect("try")
        .is_none());
    // The owner holding a permit asks again in another mode, from another process (this
    // `Flock` refuses a second lease of its own grant before sending: rule 11).
    let other = Flock::new(srv.client());
    let r = other.acquire("lim", opts(5000).owner("a")).await;
    assert!(
        redis_error_with(&r, "owner already holds a permit grant of lim"),
        "{r:?}"
    );
    let r = other
        .acquire(
            "lim",
            opts(5000)
                .owner("a")
                .mode(Mode::Shared)
                .wait(Wait::For(MS(1000))),
        )
        .await;
    assert!(
        redis_error_with(&r, "owner already holds a permit grant of lim"),
        "{r:?}"
    );
    assert_eq!(
        holders(&mut raw, "lim").await,
        vec![
            ("a".to_string(), a.token()),
            (b.owner().to_string(), b.token())
        ]
    );
    assert_eq!(field(&mut raw, "lim", "waiters").await, "0");
    assert!(!a.is_lost() && !b.is_lost());
    assert!(a.check().await.expect("check") > Duration::ZERO);
    a.release().await.expect("release a");
    b.release().await.expect("release b");

    let s = flock
        .lock("sh", opts(5000).mode(Mode::Shared).owner("s"))
        .await
        .expect("shared");
    let r = flock.acquire("sh", opts(5000).mode(Mode::Permits(2))).await;
    assert!(
        redis_error_with(&r, "limit mismatch: sh admits any number of shared holders"),
        "{r:?}"
    );
    let r = other.acquire("sh", opts(5000).owner("s")).await;
    assert!(
        redis_error_with(&r, "owner already holds a shared grant of sh"),
        "{r:?}"
    );
    s.release().await.expect("release");
    // A key held in another mode is busy, not an error.
    let x = flock.lock("ex", opts(5000)).await.expect("exclusive");
    assert!(flock
        .acquire("ex", opts(5000).mode(Mode::Shared))
        .await
        .expect("try")
        .is_none());
    assert!(matches!(
        flock.lock("ex", opts(5000).mode(Mode::Permits(4))).await,
        Err(Error::Busy)
    ));
    x.release().await.expect("release");
    let r = flock
        .acquire("big", opts(5000).mode(Mode::Permits(1_000_000)))
        .await;
    assert!(redis_error_with(&r, "invalid limit"), "{r:?}");
    let r = flock
        .acquire("big", opts(5000).mode(Mode::Permits(0)))
        .await;
    // Refused by the client itself (rule 12).
    assert!(matches!(r, Err(Error::Invalid(_))), "{r:?}");
}

/// The ids of the server's client connections other than `admin`'s own.
async fn other_clients(admin: &mut MultiplexedConnection) -> Vec<String> {
    let me: i64 = q(admin, &["CLIENT", "ID"]).await;
    let list: String = q(admin, &["CLIENT", "LIST"]).await;
    list.lines()
        .filter_map(|l| l.split(' ').find_map(|f| f.strip_prefix("id=")))
        .filter(|id| *id != me.to_string())
        .map(str::to_string)
        .collect()
}

/// The ids of the connections other than `admin`'s whose last command was FLOCK.ACQUIRE or
/// FLOCK.RENEW: a bound lease's own connection, and not the one rule 9's watch (FLOCK.WATCH)
/// may have opened meanwhile.
async fn lease_clients(admin: &mut MultiplexedConnection) -> Vec<String> {
    let mut ids = Vec::new();
    for id in other_clients(admin).await {
        let cmd = last_cmd(admin, &id).await;
        if matches!(cmd.as_deref(), Some("flock.acquire" | "flock.renew")) {
            ids.push(id);
        }
    }
    ids
}

async fn last_cmd(admin: &mut MultiplexedConnection, id: &str) -> Option<String> {
    let list: String = q(admin, &["CLIENT", "LIST", "ID", id]).await;
    list.split_whitespace()
        .find_map(|f| f.strip_prefix("cmd="))
        .map(str::to_string)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bound_lease_whose_connection_is_killed_is_lost_and_frees_the_lock() {
    let srv = Server::start();
    let mut raw = srv.async_conn().await;
    let flock = Flock::new(srv.client());
    // 3 s: the next renewal (a third) plus 800 ms of slack on a loaded machine is still before
    // the local deadline (at least two thirds of the ttl after the kill).
    let ttl = 3000;
    let closed = info_i64(&mut raw, "flock", "flock_bound_closed").await;
    let out: Result<(), Error> = flock
        .with_lock("bd", opts(ttl).bound(true), |lease| {
            let srv_client = srv.client();
            let mut raw = raw.clone();
            async move {
                // The lease's own connection is the flock's only one that locked so far.
                let mine = lease_clients(&mut raw).await;
                assert_eq!(mine.len(), 1, "{mine:?}");
                let id = mine[0].clone();
                wait_until("a renewal on the bound connection", MS(10_000), || {
                    let mut c = raw.clone();
                    let id = id.clone();
                    async move { last_cmd(&mut c, &id).await.as_deref() == Some("flock.renew") }
                })
                .await;
                let waiter_flock = Flock::new(srv_client);
                let waiter = tokio::spawn(async move {
                    let l = waiter_flock
                        .lock("bd", opts(10_000).wait(Wait::For(MS(20_000))))
                        .await;
                    (l, Instant::now())
                });
                blocked(&raw, 1).await;
                let mut signal = lease.lost_signal();
                assert!(!*signal.borrow_and_update());
                let t0 = Instant::now();
                let killed: i64 = q(&mut raw, &["CLIENT", "KILL", "ID", &id]).await;
                assert_eq!(killed, 1);
                // Noticed at the next renewal at the latest: a third of the ttl.
                assert!(
                    lease.wait_lost(MS(ttl / 3 + 800)).await,
                    "the loss was not noticed in time"
                );
                let noticed = t0.elapsed();
                assert!(noticed <= MS(ttl / 3 + 800), "noticed after {noticed:?}");
                assert!(signal.has_changed().unwrap_or(false) && *signal.borrow());
                assert!(matches!(lease.ensure(Duration::ZERO), Err(Error::Lost(_))));
                assert_eq!(lease.remaining(), Duration::ZERO);
                // The server ended the grant when its connection closed.
                let (w, at) = waiter.await.expect("join");
                let w = w.expect("the waiter's lease");
                assert!(at - t0 < MS(ttl / 2), "granted after {:?}", at - t0);
                assert!(w.token() > lease.token());
                assert_eq!(
                    q::<u64>(&mut raw, &["FLOCK.CHECK", "bd", &lease.token().to_string()]).await,
                    0
                );
                w.release().await.expect("the waiter releases");
                Ok(())
            }
        })
        .await;
    // Leaving the block of a lost lease is Error::Lost (rule 3), not the dead connection's error.
    assert!(matches!(out, Err(Error::Lost(_))), "{out:?}");
    assert_eq!(
        info_i64(&mut raw, "flock", "flock_bound_closed").await,
        closed + 1
    );
    // The factory works on: a new bound lease on a new connection.
    let again = flock
        .lock("bd", opts(1000).bound(true))
        .await
        .expect("again");
    again.release().await.expect("release");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bound_lease_renews_on_its_own_connection_and_is_lost_when_it_fails() {
    let srv = Server::start();
    let mut raw = srv.async_conn().await;
    let flock = Flock::new(srv.client());
    // No watchdog: the kill is found by the lease's next use of its connection.
    let lease = flock
        .lock("bo", opts(5000).bound(true).renew(false))
        .await
        .expect("lock");
    assert_eq!(info_i64(&mut raw, "flock", "flock_bound_grants").await, 1);
    let mine = lease_clients(&mut raw).await;
    assert_eq!(mine.len(), 1, "{mine:?}");
    lease.renew(None).await.expect("renew");
    assert_eq!(
        last_cmd(&mut raw, &mine[0]).await.as_deref(),
        Some("flock.renew")
    );
    assert!(lease.check().await.expect("check") > Duration::ZERO);
    assert_eq!(
        last_cmd(&mut raw, &mine[0]).await.as_deref(),
        Some("flock.check")
    );
    let killed: i64 = q(&mut raw, &["CLIENT", "KILL", "ID", &mine[0]]).await;
    assert_eq!(killed, 1);
    // A failed call on the bound connection is the lease's loss (rule 8).
    let r = lease.check().await;
    assert!(r.is_err(), "{r:?}");
    assert!(lease.is_lost());
    assert!(matches!(lease.renew(None).await, Err(Error::Lost(_))));
    assert!(matches!(lease.release().await, Err(Error::Lost(_))));
    assert_eq!(info_i64(&mut raw, "flock", "flock_bound_grants").await, 0);
}

/// The holder side of the process-death test (this test binary re-invoked with
/// FLOCK_BOUND_HOLDER_PORT set): with_lock with a bound lease, prints its token, and waits
/// inside the block until it is killed.
async fn bound_holder_child(port: String) {
    let client = redis::Client::open(format!("redis://127.0.0.1:{port}/")).expect("client");
    let flock = Flock::new(client);
    let _: Result<(), Error> = flock
        .with_lock("bp", opts(30_000).bound(true), |lease| async move {
            println!("HOLDER holding {}", lease.token());
            let mut lost = lease.lost_signal();
            let _ = lost.wait_for(|v| *v).await;
            println!("HOLDER lost");
            Ok(())
        })
        .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bound_scoped_lock_is_freed_at_once_when_its_process_dies() {
    if let Ok(port) = std::env::var("FLOCK_BOUND_HOLDER_PORT") {
        return bound_holder_child(port).await;
    }
    let srv = Server::start();
    let mut raw = srv.async_conn().await;
    let exe = std::env::current_exe().expect("test binary");
    let mut child = Command::new(exe)
        .args([
            "--exact",
            "a_bound_scoped_lock_is_freed_at_once_when_its_process_dies",
            "--nocapture",
            "--test-threads=1",
        ])
        .env("FLOCK_BOUND_HOLDER_PORT", srv.port().to_string())
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("spawn the holder");
    struct Reap(std::process::Child);
    impl Drop for Reap {
        fn drop(&mut self) {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
    let stdout = child.stdout.take().expect("stdout");
    let mut child = Reap(child);
    let (tx, rx) = std::sync::mpsc::channel::<String>();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines() {
            let Ok(line) = line else { break };
            if let Some(at) = line.find("HOLDER ") {
                if tx.send(line[at + 7..].to_string()).is_err() {
                    break;
                }
            }
        }
    });
    let line = rx
        .recv_timeout(Duration::from_secs(30))
        .expect("a line from the holder");
    let token: u64 = line
        .strip_prefix("holding ")
        .and_then(|t| t.parse().ok())
        .unwrap_or_else(|| panic!("{line}"));
    let flock = Flock::new(srv.client());
    assert!(flock
        .acquire("bp", opts(5000))
        .await
        .expect("try")
        .is_none());
    let closed = info_i64(&mut raw, "flock", "flock_bound_closed").await;
    let f = flock.clone();
    let waiter = tokio::spawn(async move {
        let l = f.lock("bp", opts(5000).wait(Wait::For(MS(20_000)))).await;
        (l, Instant::now())
    });
    blocked(&raw, 1).await;
    let t0 = Instant::now();
    child.0.kill().expect("SIGKILL the holder"); // inside the block: no release is sent
    let _ = child.0.wait();
    let (lease, at) = waiter.await.expect("join");
    let lease = lease.expect("the waiter's lease");
    assert!(
        at - t0 < MS(5000),
        "granted {:?} after the holder died (ttl 30 s)",
        at - t0
    );
    assert!(lease.token() > token);
    assert_eq!(
        info_i64(&mut raw, "flock", "flock_bound_closed").await,
        closed + 1
    );
    lease.release().await.expect("release");
}

/// The ids of the clients blocked in FLOCK.ACQUIRE.
async fn blocked_acquirers(admin: &mut MultiplexedConnection) -> Vec<String> {
    let list: String = q(admin, &["CLIENT", "LIST"]).await;
    list.lines()
        .filter(|l| {
            l.split(' ').any(|f| f == "cmd=flock.acquire")
                && l.split(' ')
                    .any(|f| f.strip_prefix("flags=").is_some_and(|v| v.contains('b')))
        })
        .filter_map(|l| l.split(' ').find_map(|f| f.strip_prefix("id=")))
        .map(str::to_string)
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bound_wait_survives_a_killed_connection_and_its_grant_is_bound_to_the_new_one() {
    let srv = Server::start();
    let mut raw = srv.async_conn().await;
    let flock = Flock::new(srv.client());
    let holder = flock.lock("bw", opts(20_000)).await.expect("holder");
    let f = flock.clone();
    let waiter = tokio::spawn(async move {
        f.lock("bw", opts(5000).bound(true).wait(Wait::Forever))
            .await
    });
    blocked(&raw, 1).await;
    let first = blocked_acquirers(&mut raw).await;
    assert_eq!(first.len(), 1, "{first:?}");
    let killed: i64 = q(&mut raw, &["CLIENT", "KILL", "ID", &first[0]]).await;
    assert_eq!(killed, 1);
    // The client waits again, on a new connection of its own.
    wait_until("the wait on a new connection", MS(10_000), || {
        let mut c = raw.clone();
        let old = first[0].clone();
        async move {
            let now = blocked_acquirers(&mut c).await;
            now.len() == 1 && now[0] != old
        }
    })
    .await;
    let second = blocked_acquirers(&mut raw).await;
    assert!(!waiter.is_finished());
    holder.release().await.expect("release");
    let lease = waiter.await.expect("join").expect("granted after the wait");
    assert!(!lease.is_lost());
    assert_eq!(info_i64(&mut raw, "flock", "flock_bound_grants").await, 1);
    // The grant lives on the connection that waited for it: killing that one ends it.
    let killed: i64 = q(&mut raw, &["CLIENT", "KILL", "ID", &second[0]]).await;
    assert_eq!(killed, 1);
    wait_until(
        "the bound grant ends with its connection",
        MS(10_000),
        || {
            let mut c = raw.clone();
            let t = lease.token().to_string();
            async move { q::<u64>(&mut c, &["FLOCK.CHECK", "bw", &t]).await == 0 }
        },
    )
    .await;
    // At its next renewal (a third of the ttl), with slack for a loaded machine; the local
    // deadline is further off (the grant was renewed just before the kill).
    assert!(lease.wait_lost(MS(5000 / 3 + 1000)).await);
    assert!(matches!(lease.release().await, Err(Error::Lost(_))));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bound_lease_whose_connection_dies_during_its_release_is_lost_at_once() {
    let srv = Server::start();
    let mut raw = srv.async_conn().await;
    let flock = Flock::new(srv.client());
    let ttl = 6000;
    let lease = flock
        .lock("brl", opts(ttl).bound(true).renew(false))
        .await
        .expect("lock");
    let token = lease.token();
    let mine = lease_clients(&mut raw).await;
    assert_eq!(mine.len(), 1, "{mine:?}");
    let id = mine[0].clone();
    // The RELEASE waits in the server while writes are paused; its connection is killed.
    let _: () = q(&mut raw, &["CLIENT", "PAUSE", "5000", "WRITE"]).await;
    let releasing = tokio::spawn(async move {
        let r = lease.release().await;
        (r, Instant::now())
    });
    let held = async {
        wait_until("the RELEASE held by the pause", MS(10_000), || {
            let mut c = raw.clone();
            let id = id.clone();
            async move {
                let list: String = q(&mut c, &["CLIENT", "LIST", "ID", &id]).await;
                list.contains("cmd=flock.release")
                    && list
                        .split_whitespace()
                        .any(|f| f.strip_prefix("flags=").is_some_and(|v| v.contains('b')))
            }
        })
        .await
    };
    held.await;
    let t0 = Instant::now();
    let killed: i64 = q(&mut raw, &["CLIENT", "KILL", "ID", &id]).await;
    let _: () = q(&mut raw, &["CLIENT", "UNPAUSE"]).await;
    assert_eq!(killed, 1);
    let (r, at) = releasing.await.expect("join");
    // The grant ended with its connection (as on expiry): Lost, at once.
    assert!(matches!(r, Err(Error::Lost(_))), "{r:?}");
    assert!(at - t0 < MS(ttl / 3), "release took {:?}", at - t0);
    wait_until(
        "the bound grant ends with its connection",
        MS(10_000),
        || {
            let mut c = raw.clone();
            async move { q::<u64>(&mut c, &["FLOCK.CHECK", "brl", &token.to_string()]).await == 0 }
        },
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn readers_waiting_behind_a_writer_are_granted_together_in_wait_order() {
    let srv = Server::start();
    let mut raw = srv.async_conn().await;
    let flock = Flock::new(srv.client());
    let writer = flock.lock("rg", opts(10_000)).await.expect("writer");
    let mut waits = Vec::new();
    for i in 1..=3 {
        let f = flock.clone();
        waits.push(tokio::spawn(async move {
            f.lock(
                "rg",
                opts(900).mode(Mode::Shared).wait(Wait::For(MS(20_000))),
            )
            .await
        }));
        blocked(&raw, i).await;
    }
    let writer_token = writer.token();
    writer.release().await.expect("release the writer");
    let mut readers = Vec::new();
    for w in waits {
        readers.push(w.await.expect("join").expect("a reader"));
    }
    let tokens: Vec<u64> = readers.iter().map(|l| l.token()).collect();
    assert!(
        tokens[0] > writer_token && tokens.windows(2).all(|w| w[0] < w[1]),
        "{tokens:?}"
    );
    let want: Vec<(String, u64)> = readers
        .iter()
        .map(|l| (l.owner().to_string(), l.token()))
        .collect();
    assert_eq!(holders(&mut raw, "rg").await, want);
    // Each was renewed at once after its wait (rule 1), and the watchdogs go on.
    let base = info_i64(&mut raw, "flock", "flock_renewals").await;
    wait_until("two renewals per reader", MS(10_000), || {
        let mut c = raw.clone();
        async move { info_i64(&mut c, "flock", "flock_renewals").await >= base + 6 }
    })
    .await;
    assert!(readers.iter().all(|l| !l.is_lost()));
    for l in readers {
        l.release().await.expect("release a reader");
    }
    assert_eq!(q::<i64>(&mut raw, &["EXISTS", "rg"]).await, 0);
}
