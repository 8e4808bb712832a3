//! Exclusive leases against a real redis-server with the flock module (docs/CLIENTS.md "What done
//! looks like"). Each test starts its own server.

use std::io::{BufRead, BufReader, Write};
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use flock_client::{Error, Flock, LockOptions, Wait};
use flock_testkit::aio::{info_i64, q, wait_until};
use flock_testkit::{signal, Server};
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

async fn exists(c: &mut redis::aio::MultiplexedConnection, key: &str) -> bool {
    q::<i64>(c, &["EXISTS", key]).await == 1
}

async fn server_check(c: &mut redis::aio::MultiplexedConnection, key: &str, token: u64) -> u64 {
    q(c, &["FLOCK.CHECK", key, &token.to_string()]).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn scoped_lock_and_release() {
    let srv = Server::start();
    let mut raw = srv.async_conn().await;
    let flock = Flock::new(srv.client());

    // lock + release: the server sees the owner and token, and nothing is left after.
    let lease = flock.lock("job:1", MS(5000)).await.expect("lock");
    assert_eq!(lease.key(), "job:1");
    assert_eq!(lease.owner().len(), 32, "128 random bits in hex");
    let info: Vec<redis::Value> = q(&mut raw, &["FLOCK.INFO", "job:1"]).await;
    let text = format!("{info:?}");
    assert!(text.contains(lease.owner()), "{text}");
    assert!(server_check(&mut raw, "job:1", lease.token()).await > 0);
    assert!(!lease.is_lost());
    assert!(lease.ensure(MS(1000)).is_ok());
    match lease.ensure(MS(10_000)) {
        Err(Error::TooShort { remaining }) => assert!(remaining <= MS(5000)),
        other => panic!("ensure(10 s) on a 5 s lease: {other:?}"),
    }
    assert!(!lease.is_lost(), "ensure changes nothing");
    // A manual renew with a longer ttl, token-qualified, counted from its send.
    lease.renew(Some(MS(20_000))).await.expect("renew");
    assert!(lease.remaining() > MS(5000));
    let server = server_check(&mut raw, "job:1", lease.token()).await;
    assert!(server > 5000 && lease.remaining() <= MS(server));
    assert!(lease.ensure(MS(10_000)).is_ok());

    // Held: another owner gets None from acquire and Busy from lock.
    assert!(flock
        .acquire("job:1", MS(1000))
        .await
        .expect("acquire")
        .is_none());
    assert!(matches!(
        flock.lock("job:1", MS(1000)).await,
        Err(Error::Busy)
    ));
    // Another task waits (this one would wait on its own lease: rule 11, at once Busy).
    let f2 = flock.clone();
    let (busy, waited) = tokio::spawn(async move {
        let t0 = Instant::now();
        let busy = f2
            .lock("job:1", LockOptions::new(MS(1000)).wait(Wait::For(MS(300))))
            .await;
        (busy, t0.elapsed())
    })
    .await
    .expect("task");
    assert!(matches!(busy, Err(Error::Busy)), "{busy:?}");
    assert!(waited >= MS(290), "waited {waited:?}");

    let token = lease.token();
    lease.release().await.expect("release");
    assert!(
        !exists(&mut raw, "job:1").await,
        "released lock leaves no key"
    );
    assert_eq!(server_check(&mut raw, "job:1", token).await, 0);

    // with_lock: runs the closure with the lease and releases on the way out.
    let out: Result<u64, Error> = flock
        .with_lock("job:2", MS(5000), |lease| async move {
            let n: i64 = lease
                .fenced(redis::cmd("INCR").arg("job:2:counter"))
                .await?;
            assert_eq!(n, 1);
            Ok(lease.token())
        })
        .await;
    let t2 = out.expect("with_lock");
    assert!(t2 > token, "tokens grow: {t2} > {token}");
    assert!(!exists(&mut raw, "job:2").await);
    assert_eq!(q::<i64>(&mut raw, &["GET", "job:2:counter"]).await, 1);

    // A caller-given owner, and a dropped guard released in the background.
    let lease = flock
        .lock("job:3", LockOptions::new(MS(5000)).owner("worker-7"))
        .await
        .expect("lock");
    assert_eq!(lease.owner(), "worker-7");
    drop(lease);
    wait_until("the dropped guard releases", MS(3000), || {
        let mut c = raw.clone();
        async move { !exists(&mut c, "job:3").await }
    })
    .await;

    // The supervisor calls: revoke and release by owner from anywhere.
    let lease = flock
        .lock("job:4", LockOptions::new(MS(5000)).owner("w4"))
        .await
        .expect("lock");
    assert!(flock
        .release("job:4", "w4", Some(lease.token()))
        .await
        .expect("release"));
    assert!(matches!(lease.release().await, Err(Error::Lost(_))));
    let _lease = flock.lock("job:5", MS(5000)).await.expect("lock");
    assert_eq!(flock.revoke("job:5", None).await.expect("revoke"), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn watchdog_keeps_a_600ms_lease_alive_for_3s_and_stops_on_release() {
    let srv = Server::start();
    let mut raw = srv.async_conn().await;
    let flock = Flock::new(srv.client());
    let before = info_i64(&mut raw, "flock", "flock_renewals").await;
    // 600 ms (renewed every 200 ms): a renewal may come 400 ms late on a loaded machine
    // before the server lets the lease go.
    let lease = flock.lock("wd", MS(600)).await.expect("lock");
    let start = Instant::now();
    while start.elapsed() < MS(3000) {
        tokio::time::sleep(MS(100)).await;
        assert!(!lease.is_lost(), "lost after {:?}", start.elapsed());
        assert!(
            server_check(&mut raw, "wd", lease.token()).await > 0,
            "server expired the lease after {:?}",
            start.elapsed()
        );
    }
    let renewals = info_i64(&mut raw, "flock", "flock_renewals").await - before;
    assert!(
        renewals >= 5,
        "only {renewals} renewals in 3 s at ttl/3 = 200 ms"
    );
    lease.release().await.expect("release");
    // The watchdog never outlives the lease (redisson#7272): no RENEW after release ...
    let after = info_i64(&mut raw, "flock", "flock_renewals").await;
    tokio::time::sleep(MS(400)).await;
    assert_eq!(info_i64(&mut raw, "flock", "flock_renewals").await, after);
    // ... nor after a drop.
    let lease = flock.lock("wd", MS(600)).await.expect("lock");
    drop(lease);
    // (a RENEW already on its way when the lease was dropped may land meanwhile)
    tokio::time::sleep(MS(300)).await;
    let after = info_i64(&mut raw, "flock", "flock_renewals").await;
    tokio::time::sleep(MS(400)).await;
    assert_eq!(info_i64(&mut raw, "flock", "flock_renewals").await, after);
    assert!(!exists(&mut raw, "wd").await);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn watchdog_of_a_lease_taken_after_the_others_started_renews_it() {
    // 2.1: the watchdogs start a few ms after their grants; a lease taken once every earlier
    // one's has started (nothing left to start) gets its watchdog too.
    let srv = Server::start();
    let mut raw = srv.async_conn().await;
    let flock = Flock::new(srv.client());
    let first = flock.lock("wd1", MS(10_000)).await.expect("lock");
    tokio::time::sleep(MS(100)).await;
    let lease = flock.lock("wd2", MS(600)).await.expect("lock");
    let start = Instant::now();
    while start.elapsed() < MS(1500) {
        tokio::time::sleep(MS(100)).await;
        assert!(!lease.is_lost(), "lost after {:?}", start.elapsed());
        assert!(server_check(&mut raw, "wd2", lease.token()).await > 0);
    }
    lease.release().await.expect("release");
    first.release().await.expect("release");
}

#[test]
fn a_flock_used_from_a_second_runtime_still_renews_and_watches() {
    // 2.1 and 9.1 across runtimes: the runtime that ran a Flock's background tasks (the
    // watchdogs' starter, the watching lane) shut down while they waited; a lease taken from
    // another runtime is still renewed, and a REVOKE of it is still heard.
    let srv = Server::start();
    let flock = Flock::new(srv.client());
    let runtime = || {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .expect("runtime")
    };
    let first = runtime();
    first.block_on(async {
        let lease = flock.lock("rt", MS(600)).await.expect("lock");
        // Long enough for its watchdog to start and its WATCH to be sent.
        tokio::time::sleep(MS(300)).await;
        assert_eq!(flock.watch_connections(), 1);
        lease.release().await.expect("release");
    });
    drop(first);
    runtime().block_on(async {
        let mut raw = srv.async_conn().await;
        let before = info_i64(&mut raw, "flock", "flock_renewals").await;
        let lease = flock.lock("rt", MS(600)).await.expect("lock");
        let start = Instant::now();
        while start.elapsed() < MS(2000) {
            tokio::time::sleep(MS(100)).await;
            assert!(!lease.is_lost(), "lost after {:?}", start.elapsed());
            assert!(server_check(&mut raw, "rt", lease.token()).await > 0);
        }
        let renewals = info_i64(&mut raw, "flock", "flock_renewals").await - before;
        assert!(renewals >= 3, "only {renewals} renewals in 2 s at ttl/3");
        let t0 = Instant::now();
        let _: i64 = q(&mut raw, &["FLOCK.REVOKE", "rt"]).await;
        assert!(lease.wait_lost(MS(3000)).await, "the REVOKE is heard");
        assert!(t0.elapsed() < MS(1000), "heard after {:?}", t0.elapsed());
        assert_eq!(lease.lost_reason(), Some(flock_client::LossReason::Revoked));
    });
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn revoke_is_noticed_within_a_third_of_the_ttl() {
    let srv = Server::start();
    let mut raw = srv.async_conn().await;
    let flock = Flock::new(srv.client());
    // 3 s: a third of it plus 1 s of slack for a late renewal on a loaded machine is still
    // well before the local deadline (almost the whole ttl after the REVOKE), which is the
    // only other way the loss could be noticed.
    let ttl = MS(3000);
    let lease = flock.lock("rv", ttl).await.expect("lock");
    let mut signal = lease.lost_signal();
    assert!(!*signal.borrow());
    tokio::time::sleep(MS(50)).await;
    let n: i64 = q(&mut raw, &["FLOCK.REVOKE", "rv"]).await;
    assert_eq!(n, 1);
    let revoked = Instant::now();
    tokio::time::timeout(ttl, signal.wait_for(|v| *v))
        .await
        .expect("the watch channel fires")
        .expect("sender alive");
    let took = revoked.elapsed();
    assert!(
        took <= ttl / 3 + MS(1000),
        "loss noticed after {took:?}, more than a third of the ttl"
    );
    assert!(lease.is_lost());
    assert_eq!(lease.remaining(), Duration::ZERO);
    assert!(matches!(lease.ensure(Duration::ZERO), Err(Error::Lost(_))));
    assert!(lease.wait_lost(MS(1)).await);
    assert!(matches!(lease.release().await, Err(Error::Lost(_))));
    println!("REVOKE noticed after {took:?} (ttl {ttl:?})");
}

#[derive(Debug)]
enum AppError {
    App(&'static str),
    #[allow(dead_code)]
    Flock(Error),
}

impl From<Error> for AppError {
    fn from(e: Error) -> Self {
        AppError::Flock(e)
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_lock_returns_lost_or_the_blocks_own_error() {
    let srv = Server::start();
    let raw = srv.async_conn().await;
    let flock = Flock::new(srv.client());
    let ttl = MS(900);

    // The block succeeds but the lease was revoked meanwhile: with_lock returns Lost.
    let r = raw.clone();
    let out: Result<u32, Error> = flock
        .with_lock("wl", ttl, |lease| async move {
            let mut r = r;
            let _: i64 = q(&mut r, &["FLOCK.REVOKE", "wl"]).await;
            assert!(lease.wait_lost(ttl).await, "loss seen in the block");
            Ok(7)
        })
        .await;
    assert!(matches!(out, Err(Error::Lost(_))), "{out:?}");

    // The block fails: its own error passes through unchanged; the lease shows the loss.
    let seen = Arc::new(Mutex::new(None));
    let s = seen.clone();
    let r = raw.clone();
    let out: Result<u32, AppError> = flock
        .with_lock("wl", ttl, |lease| async move {
            let mut r = r;
            *s.lock().unwrap() = Some(lease.clone());
            let _: i64 = q(&mut r, &["FLOCK.REVOKE", "wl"]).await;
            let mut sig = lease.lost_signal();
            let _ = tokio::time::timeout(ttl, sig.wait_for(|v| *v)).await;
            Err(AppError::App("the block failed"))
        })
        .await;
    assert!(
        matches!(out, Err(AppError::App("the block failed"))),
        "{out:?}"
    );
    let handle = seen.lock().unwrap().take().expect("handle");
    assert!(handle.is_lost());

    // A block that succeeds on a live lease: Ok, released.
    let out: Result<&str, AppError> = flock
        .with_lock("wl", ttl, |lease| async move {
            lease.ensure(MS(100))?;
            Ok("done")
        })
        .await;
    assert!(matches!(out, Ok("done")), "{out:?}");
    let mut r = raw.clone();
    assert!(!exists(&mut r, "wl").await);
}

/// The holder side of the SIGSTOP test, run in a child process (this test binary re-invoked
/// with FLOCK_HOLDER_PORT set): takes a lease, then answers commands read from stdin.
async fn holder_child(port: String) {
    let client = redis::Client::open(format!("redis://127.0.0.1:{port}/")).expect("client");
    let flock = Flock::new(client);
    let lease = flock.lock("gc", MS(800)).await.expect("lock");
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<String>();
    std::thread::spawn(move || {
        for line in std::io::stdin().lock().lines() {
            let Ok(line) = line else { break };
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    println!("HOLDER ready {}", lease.token());
    while let Some(line) = rx.recv().await {
        match line.trim() {
            "ensure" => {
                let t = std::time::Instant::now();
                let r = lease.ensure(MS(1));
                let took = t.elapsed();
                let what = match r {
                    Ok(()) => "ok".to_string(),
                    Err(Error::Lost(_)) => "Lost".to_string(),
                    Err(e) => format!("{e:?}"),
                };
                println!(
                    "HOLDER ensure {what} {} us lost={} remaining={:?}",
                    took.as_micros(),
                    lease.is_lost(),
                    lease.remaining()
                );
            }
            "fenced" => {
                let r = lease
                    .fenced::<()>(redis::cmd("SET").arg("gc:data").arg("stale write"))
                    .await;
                let what = match r {
                    Ok(()) => "accepted".to_string(),
                    Err(Error::Fenced(m)) => format!("Fenced {m}"),
                    Err(e) => format!("other {e:?}"),
                };
                println!("HOLDER fenced {what}");
            }
            _ => break,
        }
    }
    drop(lease);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stopped_holder_process_fails_ensure_from_its_own_clock_and_is_fenced() {
    if let Ok(port) = std::env::var("FLOCK_HOLDER_PORT") {
        return holder_child(port).await;
    }
    let srv = Server::start();
    let mut raw = srv.async_conn().await;
    let exe = std::env::current_exe().expect("test binary");
    let mut child = Command::new(exe)
        .args([
            "--exact",
            "stopped_holder_process_fails_ensure_from_its_own_clock_and_is_fenced",
            "--nocapture",
            "--test-threads=1",
        ])
        .env("FLOCK_HOLDER_PORT", srv.port().to_string())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("spawn the holder");
    let pid = child.id();
    let mut stdin = child.stdin.take().expect("stdin");
    let stdout = child.stdout.take().expect("stdout");
    // Never leave a stopped child behind, whatever fails below.
    struct Reap(std::process::Child);
    impl Drop for Reap {
        fn drop(&mut self) {
            if let Ok(None) = self.0.try_wait() {
                let _ = Command::new("kill")
                    .args(["-CONT", &self.0.id().to_string()])
                    .status();
                let _ = self.0.kill();
                let _ = self.0.wait();
            }
        }
    }
    let mut child = Reap(child);
    let (tx, rx) = std::sync::mpsc::channel::<String>();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines() {
            let Ok(line) = line else { break };
            // libtest may print "test NAME ... " on the same line first.
            if let Some(at) = line.find("HOLDER ") {
                if tx.send(line[at + 7..].to_string()).is_err() {
                    break;
                }
            }
        }
    });
    let next = |what: &str| -> String {
        rx.recv_timeout(Duration::from_secs(30))
            .unwrap_or_else(|_| panic!("no '{what}' line from the holder"))
    };
    let ready = next("ready");
    let token: u64 = ready
        .strip_prefix("ready ")
        .and_then(|t| t.parse().ok())
        .expect("token");
    tokio::time::sleep(MS(300)).await;
    assert!(server_check(&mut raw, "gc", token).await > 0);

    // A "GC pause" of the holder longer than its lease, with the server stopped too, so no
    // round trip can answer anything while the holder wakes up.
    signal(pid, "STOP");
    srv.signal("STOP");
    tokio::time::sleep(MS(1600)).await;
    signal(pid, "CONT");
    writeln!(stdin, "ensure").expect("write");
    let line = next("ensure");
    println!("holder after SIGCONT (server still stopped): {line}");
    assert!(line.starts_with("ensure Lost "), "{line}");
    assert!(line.contains("lost=true"), "{line}");
    assert!(line.contains("remaining=0ns"), "{line}");

    // The server resumes; the holder's write with its stale token is refused there.
    srv.signal("CONT");
    writeln!(stdin, "fenced").expect("write");
    let line = next("fenced");
    println!("holder's fenced write after the server resumed: {line}");
    assert!(line.starts_with("fenced Fenced "), "{line}");
    assert!(line.contains("FENCED"), "{line}");
    let v: Option<String> = q(&mut raw, &["GET", "gc:data"]).await;
    assert_eq!(v, None, "the stale write did not run");
    assert_eq!(server_check(&mut raw, "gc", token).await, 0);
    writeln!(stdin, "exit").expect("write");
    drop(stdin);
    let st = child.0.wait().expect("holder exits");
    assert!(st.success(), "holder exit {st:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn remaining_is_never_above_the_servers_check() {
    let srv = Server::start();
    let mut raw = srv.async_conn().await;
    let flock = Flock::new(srv.client());
    // A lease granted at once. No watchdog here: a renewal that lands between the CHECK and
    // the local reading would move the local deadline past the one the server just gave
    // (the watchdog's own rule-1 bookkeeping is tested with renewals elsewhere).
    // 10 s: the 60 rounds below take about 1 s, more on a loaded machine; a CHECK answering 0
    // would fail the test for the wrong reason.
    let lease = flock
        .lock("rm", LockOptions::new(MS(10_000)).renew(false))
        .await
        .expect("lock");
    let mut worst = i128::MIN;
    for _ in 0..60 {
        let server = server_check(&mut raw, "rm", lease.token()).await;
        let local = lease.remaining();
        assert!(server > 0);
        assert!(
            local <= MS(server),
            "remaining {local:?} above the server's CHECK {server} ms"
        );
        worst = worst.max(local.as_micros() as i128 - server as i128 * 1000);
        tokio::time::sleep(MS(15)).await;
    }
    // The lease's own check() agrees.
    let s = lease.check().await.expect("check");
    assert!(lease.remaining() <= s);
    // A lease granted after a BLOCK wait.
    let l2f = flock.clone();
    let waiter = tokio::spawn(async move {
        l2f.lock(
            "rm",
            LockOptions::new(MS(3000))
                .wait(Wait::For(MS(10_000)))
                .renew(false),
        )
        .await
    });
    wait_until("the waiter blocks", MS(5000), || {
        let mut c = raw.clone();
        async move { waiting(&mut c, "blocked_clients").await == 1 }
    })
    .await;
    lease.release().await.expect("release");
    let l2 = waiter.await.expect("join").expect("granted");
    for _ in 0..20 {
        let server = server_check(&mut raw, "rm", l2.token()).await;
        let local = l2.remaining();
        assert!(local <= MS(server), "{local:?} > {server} ms");
        tokio::time::sleep(MS(15)).await;
    }
    l2.release().await.expect("release");
    println!("local minus server, worst: {worst} us (always <= 0)");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn client_kill_of_the_leases_connection_is_recovered_without_losing_it() {
    let srv = Server::start();
    let mut raw = srv.async_conn().await;
    let flock = Flock::new(srv.client());
    // 900 ms (renewed every 300 ms): each renewal after a kill also reconnects; 600 ms of
    // slack for that on a loaded machine.
    let lease = flock.lock("ck", MS(900)).await.expect("lock");
    let token = lease.token();
    let mut signal = lease.lost_signal();
    for round in 0..3 {
        let killed: i64 = q(
            &mut raw,
            &["CLIENT", "KILL", "TYPE", "normal", "SKIPME", "yes"],
        )
        .await;
        assert!(killed >= 1, "round {round}: killed {killed}");
        // Counted after the kill: a renewal that landed just before it must not pass for one
        // on a new connection.
        let before = info_i64(&mut raw, "flock", "flock_renewals").await;
        wait_until("a renewal on a new connection", MS(3000), || {
            let mut c = raw.clone();
            async move { info_i64(&mut c, "flock", "flock_renewals").await > before }
        })
        .await;
        tokio::time::sleep(MS(250)).await;
        assert!(!lease.is_lost(), "round {round}");
    }
    assert!(!*signal.borrow_and_update());
    tokio::time::sleep(MS(1000)).await;
    assert!(!lease.is_lost());
    assert!(server_check(&mut raw, "ck", token).await > 0);
    assert_eq!(lease.token(), token);
    assert!(!signal.has_changed().unwrap_or(true));
    lease.release().await.expect("release");
    assert!(!exists(&mut raw, "ck").await);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_block_wait_longer_than_the_ttl_is_renewed_at_once() {
    let srv = Server::start();
    let mut raw = srv.async_conn().await;
    let flock = Flock::new(srv.client());
    let _: i64 = q(&mut raw, &["FLOCK.ACQUIRE", "bw", "holder", "30000"]).await;
    let f = flock.clone();
    let waiter = tokio::spawn(async move {
        let t = Instant::now();
        let r = f
            .lock(
                "bw",
                // 1 s, less than the 2 s wait below: counted from the BLOCK request it would
                // be long over; counted from the RENEW after the grant, most of it is left
                // even when the reply is slow on a loaded machine.
                LockOptions::new(MS(1000))
                    .wait(Wait::For(MS(20_000)))
                    .renew(false),
            )
            .await;
        (r, t.elapsed())
    });
    wait_until("the waiter blocks", MS(5000), || {
        let mut c = raw.clone();
        async move { waiting(&mut c, "flock_blocked_clients").await == 1 }
    })
    .await;
    tokio::time::sleep(MS(2000)).await;
    let renewals = info_i64(&mut raw, "flock", "flock_renewals").await;
    let _: i64 = q(&mut raw, &["FLOCK.RELEASE", "bw", "holder"]).await;
    let (lease, waited) = waiter.await.expect("join");
    let lease = lease.expect("granted after the wait");
    let remaining = lease.remaining();
    assert!(waited > MS(1900), "waited {waited:?}");
    // Counted from the RENEW sent right after the grant, not from the BLOCK request two
    // seconds earlier (which would be long expired).
    assert!(!lease.is_lost());
    assert!(
        remaining > MS(300),
        "remaining {remaining:?} after a {waited:?} wait"
    );
    assert_eq!(
        info_i64(&mut raw, "flock", "flock_renewals").await,
        renewals + 1,
        "exactly one RENEW right after the grant (the watchdog is off)"
    );
    // Measured after the CHECK's reply: never above it.
    let server = server_check(&mut raw, "bw", lease.token()).await;
    assert!(lease.remaining() <= MS(server));
    lease.release().await.expect("release");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn block_waiters_are_blocked_clients_served_in_fifo_order() {
    let srv = Server::start();
    let mut raw = srv.async_conn().await;
    let flock = Flock::new(srv.client());
    let holder = flock.lock("q", MS(10_000)).await.expect("lock");
    let order = Arc::new(Mutex::new(Vec::new()));
    let mut tasks = Vec::new();
    for i in 1..=4 {
        let f = flock.clone();
        let order = order.clone();
        tasks.push(tokio::spawn(async move {
            let lease = f
                .lock("q", LockOptions::new(MS(5000)).wait(Wait::Forever))
                .await
                .expect("granted");
            order.lock().unwrap().push(i);
            tokio::time::sleep(MS(20)).await;
            lease.release().await.expect("release");
        }));
        // Each waiter is a blocked client of the server before the next one starts.
        wait_until("the waiter blocks", MS(5000), || {
            let mut c = raw.clone();
            async move {
                waiting(&mut c, "blocked_clients").await == i
                    && waiting(&mut c, "flock_blocked_clients").await == i
            }
        })
        .await;
    }
    assert!(order.lock().unwrap().is_empty(), "nobody jumps the holder");
    holder.release().await.expect("release");
    for t in tasks {
        t.await.expect("waiter");
    }
    assert_eq!(*order.lock().unwrap(), vec![1, 2, 3, 4]);
    assert_eq!(waiting(&mut raw, "blocked_clients").await, 0);
    assert!(!exists(&mut raw, "q").await);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn release_is_exact_to_its_token() {
    let srv = Server::start();
    let mut raw = srv.async_conn().await;
    let flock = Flock::new(srv.client());
    let opts = LockOptions::new(MS(5000)).owner("same-owner");
    let old = flock.lock("ex", opts.clone()).await.expect("lock");
    let _: i64 = q(&mut raw, &["FLOCK.REVOKE", "ex"]).await;
    // Rule 11: while the old lease is live this Flock refuses a second one of the same owner;
    // the revoke is heard (rule 9) and the old lease lost first.
    assert!(old.wait_lost(MS(3000)).await);
    let new = flock.lock("ex", opts).await.expect("lock again");
    assert!(new.token() > old.token());
    // The stale lease's release names its own token: the newer grant of the same owner stays.
    assert!(matches!(old.release().await, Err(Error::Lost(_))));
    assert!(server_check(&mut raw, "ex", new.token()).await > 0);
    assert!(!new.is_lost());
    // A stale fenced write: Error::Fenced, and the lease is marked lost.
    let _: i64 = q(&mut raw, &["FLOCK.REVOKE", "ex"]).await;
    let r = new
        .fenced::<()>(redis::cmd("SET").arg("ex:data").arg("x"))
        .await;
    assert!(matches!(r, Err(Error::Fenced(_))), "{r:?}");
    assert!(new.is_lost());
    assert!(matches!(new.renew(None).await, Err(Error::Lost(_))));
    drop(new);
}
