//! The peers' worst client-side lock bugs as regression tests, each named after its report
//! (docs/CLIENTS.md names them), against a real redis-server with the module. What the client
//! sent is read from the server's MONITOR, so the tests prove what was and was not sent.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use flock_client::{Error, Flock, LockOptions, Wait};
use flock_testkit::aio::{info_i64, q, wait_until};
use flock_testkit::{RawConn, Reply, Server};

const MS: fn(u64) -> Duration = Duration::from_millis;
const SENTINEL: &str = "flock-peer-bugs-monitor-done";

/// Every command the server runs, in order, as "NAME arg arg ..." (MONITOR on a connection of
/// its own, read by a thread until `close`).
struct Monitor {
    port: u16,
    lines: Arc<Mutex<Vec<String>>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Monitor {
    fn start(srv: &Server) -> Monitor {
        let mut c = RawConn::connect(srv.port()).expect("connect for MONITOR");
        assert_eq!(
            c.call(&["MONITOR"]).expect("MONITOR"),
            Reply::Status("OK".into())
        );
        let lines = Arc::new(Mutex::new(Vec::new()));
        let out = lines.clone();
        let thread = std::thread::spawn(move || {
            while let Ok(Reply::Status(line)) = c.read_reply() {
                // 1700000000.123456 [0 127.0.0.1:5000] "FLOCK.RENEW" "key" ...
                let Some((_, args)) = line.split_once("] ") else {
                    continue;
                };
                let cmd = args.replace('"', "");
                if cmd.contains(SENTINEL) {
                    return;
                }
                out.lock().unwrap().push(cmd);
            }
        });
        Monitor {
            port: srv.port(),
            lines,
            thread: Some(thread),
        }
    }

    fn commands(&self) -> Vec<String> {
        self.lines.lock().unwrap().clone()
    }

    /// How many commands so far start with `prefix` (command name and key: "FLOCK.RENEW k ").
    fn count(&self, prefix: &str) -> usize {
        self.commands()
            .iter()
            .filter(|c| c.starts_with(prefix))
            .count()
    }

    /// Stop reading; every command run before this is in `commands()`.
    fn close(mut self) -> Vec<String> {
        let mut c = RawConn::connect(self.port).expect("connect");
        let _ = c.call(&["ECHO", SENTINEL]);
        if let Some(t) = self.thread.take() {
            t.join().expect("monitor thread");
        }
        self.commands()
    }
}

/// The commands after the first that starts with `prefix`.
fn after(cmds: &[String], prefix: &str) -> Vec<String> {
    let i = cmds
        .iter()
        .position(|c| c.starts_with(prefix))
        .unwrap_or_else(|| panic!("no {prefix:?} in {cmds:?}"));
    cmds[i + 1..].to_vec()
}

async fn until_count(mon: &Monitor, prefix: &str, n: usize) {
    wait_until(&format!("{n} x {prefix:?}"), MS(10_000), || {
        let got = mon.count(prefix);
        async move { got >= n }
    })
    .await;
}

/// redisson#7272: the watchdog kept renewing after unlock. Here no RENEW of a lease is sent
/// once its RELEASE was, nor after a RENEW answered nil (the grant was revoked).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redisson_7272_no_renewal_after_release_or_loss() {
    let srv = Server::start();
    let mut raw = srv.async_conn().await;
    let flock = Flock::new(srv.client());
    let mon = Monitor::start(&srv);
    // 600 ms: renewed every 200 ms.
    let lease = flock.lock("pb:rel", MS(600)).await.expect("lock");
    until_count(&mon, "FLOCK.RENEW pb:rel ", 2).await;
    lease.release().await.expect("release");
    let revoked = flock.lock("pb:rev", MS(600)).await.expect("lock");
    until_count(&mon, "FLOCK.RENEW pb:rev ", 1).await;
    let n: i64 = q(&mut raw, &["FLOCK.REVOKE", "pb:rev"]).await;
    assert_eq!(n, 1);
    assert!(revoked.wait_lost(MS(10_000)).await, "the revoke is noticed");
    // A marker lease renews five times meanwhile: renewals of the other two would show.
    let marker = flock.lock("pb:marker", MS(600)).await.expect("lock");
    until_count(&mon, "FLOCK.RENEW pb:marker ", 5).await;
    marker.release().await.expect("release");
    let cmds = mon.close();
    let late: Vec<_> = after(&cmds, "FLOCK.RELEASE pb:rel ")
        .into_iter()
        .filter(|c| c.starts_with("FLOCK.RENEW pb:rel "))
        .collect();
    assert!(late.is_empty(), "RENEW after RELEASE: {late:?}");
    // After the REVOKE at most the one RENEW that answered nil.
    let late: Vec<_> = after(&cmds, "FLOCK.REVOKE pb:rev")
        .into_iter()
        .filter(|c| c.starts_with("FLOCK.RENEW pb:rev "))
        .collect();
    assert!(late.len() <= 1, "renewals after the loss: {late:?}");
    drop(revoked);
}

/// etcd#22082: an unlock retried after an ambiguous failure ended a newer grant of the same
/// owner. Here the old lease's release names its own token, so a RELEASE that comes after the
/// same owner was granted again (the first one ran and its answer was lost, then the retry)
/// ends nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn etcd_22082_a_retried_release_never_ends_a_newer_grant_of_the_same_owner() {
    let srv = Server::start();
    let mut raw = srv.async_conn().await;
    let flock = Flock::new(srv.client());
    let opts = LockOptions::new(MS(10_000)).owner("same").renew(false);
    let old = flock.lock("pb:22082", opts).await.expect("lock");
    // The first RELEASE ran on the server (its reply lost), and the owner was granted again.
    let n: i64 = q(&mut raw, &["FLOCK.RELEASE", "pb:22082", "same"]).await;
    assert_eq!(n, 1);
    let newer: u64 = q(&mut raw, &["FLOCK.ACQUIRE", "pb:22082", "same", "10000"]).await;
    assert!(newer > old.token());
    let old_token = old.token();
    let mon = Monitor::start(&srv);
    // The retry: the old lease's release.
    let r = old.release().await;
    assert!(matches!(r, Err(Error::Lost(_))), "{r:?}");
    let left: u64 = q(&mut raw, &["FLOCK.CHECK", "pb:22082", &newer.to_string()]).await;
    assert!(left > 0, "the newer grant was ended");
    let cmds = mon.close();
    let releases: Vec<_> = cmds
        .iter()
        .filter(|c| c.starts_with("FLOCK.RELEASE pb:22082 "))
        .collect();
    assert!(!releases.is_empty());
    for c in releases {
        assert_eq!(token_of(c), old_token, "{c}");
    }
}

/// The token a token-qualified RELEASE names (its last argument).
fn token_of(c: &str) -> u64 {
    let words: Vec<&str> = c.split(' ').collect();
    assert_eq!(words.len(), 4, "RELEASE key owner token: {c}");
    words[3].parse().expect("a token")
}

/// etcd#11456: a waiter granted after its own lease would have ended (the wait longer than the
/// ttl) held a grant that was already over. Here the grant after the wait is renewed at once
/// with a token-qualified RENEW, and counts from it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn etcd_11456_a_waiter_granted_after_its_ttl_holds_a_whole_lease() {
    let srv = Server::start();
    let mut raw = srv.async_conn().await;
    let flock = Flock::new(srv.client());
    let _: i64 = q(&mut raw, &["FLOCK.ACQUIRE", "pb:11456", "holder", "30000"]).await;
    let mon = Monitor::start(&srv);
    let f = flock.clone();
    let waiter = tokio::spawn(async move {
        f.lock(
            "pb:11456",
            LockOptions::new(MS(1000))
                .wait(Wait::For(MS(20_000)))
                .renew(false),
        )
        .await
    });
    wait_until("the waiter blocks", MS(10_000), || {
        let mut c = raw.clone();
        async move { info_i64(&mut c, "flock", "flock_blocked_clients").await == 1 }
    })
    .await;
    // Twice the ttl in the queue.
    tokio::time::sleep(MS(2000)).await;
    let _: i64 = q(&mut raw, &["FLOCK.RELEASE", "pb:11456", "holder"]).await;
    let lease = waiter.await.expect("join").expect("granted after the wait");
    assert!(!lease.is_lost());
    let left: u64 = q(
        &mut raw,
        &["FLOCK.CHECK", "pb:11456", &lease.token().to_string()],
    )
    .await;
    assert!(left > 0, "the grant after the wait is live on the server");
    assert!(lease.remaining() <= MS(left));
    let token = lease.token();
    lease.release().await.expect("release");
    let cmds = mon.close();
    let renews: Vec<_> = cmds
        .iter()
        .filter(|c| c.starts_with("FLOCK.RENEW pb:11456 "))
        .collect();
    assert_eq!(renews.len(), 1, "one RENEW right after the grant: {cmds:?}");
    assert!(
        renews[0].ends_with(&format!(" 1000 {token}")),
        "{}",
        renews[0]
    );
}

/// redis-semaphore#175: a delayed refresh quietly took back an expired lock. Here a renewal
/// after the lease ran out (locally, or on the server only) takes nothing: the key stays free
/// and no ACQUIRE is sent in its place.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_semaphore_175_a_renewal_after_expiry_takes_nothing() {
    let srv = Server::start();
    let mut raw = srv.async_conn().await;
    let flock = Flock::new(srv.client());
    let mon = Monitor::start(&srv);
    // Ran out everywhere: renew() is refused.
    let lease = flock
        .lock("pb:175", LockOptions::new(MS(200)).renew(false))
        .await
        .expect("lock");
    tokio::time::sleep(MS(500)).await;
    assert!(matches!(lease.renew(None).await, Err(Error::Lost(_))));
    assert!(lease.is_lost());
    assert_eq!(q::<i64>(&mut raw, &["EXISTS", "pb:175"]).await, 0);
    // Ended on the server while the local deadline is far: the RENEW answers nil and takes
    // nothing.
    let lease2 = flock
        .lock("pb:175b", LockOptions::new(MS(20_000)).renew(false))
        .await
        .expect("lock");
    let _: i64 = q(&mut raw, &["FLOCK.REVOKE", "pb:175b"]).await;
    assert!(matches!(lease2.renew(None).await, Err(Error::Lost(_))));
    assert_eq!(q::<i64>(&mut raw, &["EXISTS", "pb:175b"]).await, 0);
    // The key is free for the next owner at once.
    let other = flock.lock("pb:175", MS(1000)).await.expect("free");
    other.release().await.expect("release");
    let cmds = mon.close();
    for key in ["pb:175", "pb:175b"] {
        let acquires = cmds
            .iter()
            .filter(|c| c.starts_with(&format!("FLOCK.ACQUIRE {key} ")))
            .count();
        let want = if key == "pb:175" { 2 } else { 1 };
        assert_eq!(acquires, want, "{key}: {cmds:?}");
    }
    let renews: Vec<_> = cmds
        .iter()
        .filter(|c| c.starts_with("FLOCK.RENEW pb:175"))
        .collect();
    assert!(
        renews
            .iter()
            .all(|c| c.split(' ').count() == 5 && c.contains("pb:175b")),
        "only the token-qualified RENEW of the revoked grant: {renews:?}"
    );
}

/// redisson#2515, #5698: the watchdog died silently after one connection error and two
/// holders followed. Here it renews again after each kill of its connection (seen with
/// MONITOR), the lease is not lost, and the server still holds it three ttls later.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redisson_2515_5698_the_watchdog_survives_connection_errors() {
    let srv = Server::start();
    let mut raw = srv.async_conn().await;
    let flock = Flock::new(srv.client());
    let mon = Monitor::start(&srv);
    // 900 ms (renewed every 300 ms): each renewal after a kill also reconnects.
    let lease = flock.lock("pb:5698", MS(900)).await.expect("lock");
    for round in 0..3 {
        // Every other connection but the MONITOR's (flag O): the client's.
        let me: i64 = q(&mut raw, &["CLIENT", "ID"]).await;
        let list: String = q(&mut raw, &["CLIENT", "LIST", "TYPE", "normal"]).await;
        let mut killed = 0;
        for line in list.lines() {
            let field = |name: &str| {
                line.split(' ')
                    .find_map(|f| f.strip_prefix(name))
                    .unwrap_or_default()
                    .to_string()
            };
            if field("id=") != me.to_string() && !field("flags=").contains('O') {
                killed += q::<i64>(&mut raw, &["CLIENT", "KILL", "ID", &field("id=")]).await;
            }
        }
        assert!(killed >= 1, "round {round}");
        let base = mon.count("FLOCK.RENEW pb:5698 ");
        until_count(&mon, "FLOCK.RENEW pb:5698 ", base + 2).await;
        assert!(!lease.is_lost(), "round {round}");
    }
    tokio::time::sleep(MS(2700)).await;
    assert!(!lease.is_lost());
    let left: u64 = q(
        &mut raw,
        &["FLOCK.CHECK", "pb:5698", &lease.token().to_string()],
    )
    .await;
    assert!(left > 0, "the server let the lease go");
    lease.release().await.expect("release");
    mon.close();
}

/// redisson#4698: no signal at all when renewal failed. Here a server that stops answering
/// (SIGSTOP) for longer than the lease leaves the lease lost by its local deadline, and its
/// lost signal turns.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redisson_4698_a_renewal_that_fails_for_good_is_loud() {
    let srv = Server::start();
    let flock = Flock::new(srv.client());
    let lease = flock.lock("pb:4698", MS(900)).await.expect("lock");
    let signal = lease.lost_signal();
    srv.signal("STOP");
    let t0 = tokio::time::Instant::now();
    let lost = lease.wait_lost(MS(10_000)).await;
    let took = t0.elapsed();
    srv.signal("CONT");
    assert!(lost, "not marked lost while the server was stopped");
    assert!(took < MS(2000), "lost only after {took:?}");
    assert!(*signal.borrow());
    drop(lease);
}
