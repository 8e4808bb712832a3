//! Leader election (docs/CLIENTS.md "The API every client offers") against a real
//! redis-server with the flock module. Each test names its scenario (`se_1` is E.1).

use std::time::Duration;

use flock_client::{Error, Flock, Leader, LossReason, Wait};
use flock_testkit::aio::{info_i64, q, wait_until};
use flock_testkit::Server;
use tokio::time::Instant;

const MS: fn(u64) -> Duration = Duration::from_millis;
const TTL: Duration = Duration::from_secs(30);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn se_1_and_e_2_campaign_leads_and_the_next_leads_after_resign() {
    let srv = Server::start();
    let raw = srv.async_conn().await;
    let flock = Flock::new(srv.client());
    let mut a = flock.election("lead", TTL, Some("a")).expect("election");
    let t0 = Instant::now();
    let lease = a.campaign(Wait::Forever).await.expect("campaign");
    assert!(t0.elapsed() < MS(1000), "a free key leads at once");
    assert_eq!(
        a.leader().await.expect("leader"),
        Some(Leader {
            owner: "a".into(),
            token: lease.token()
        })
    );
    // E.2: a second candidate (another process) waits in line.
    let other = Flock::new(srv.client());
    let mut b = other.election("lead", TTL, Some("b")).expect("election");
    let waiting = tokio::spawn(async move {
        let h = b.campaign(Wait::Forever).await.expect("b leads");
        (b, h)
    });
    wait_until("b waits in line", MS(3000), || {
        let mut c = raw.clone();
        async move { info_i64(&mut c, "clients", "blocked_clients").await >= 1 }
    })
    .await;
    assert!(!waiting.is_finished());
    assert!(a.resign().await.expect("resign"));
    assert!(!a.resign().await.expect("again"), "not leading any more");
    let (b, h) = waiting.await.expect("task");
    assert_eq!(h.owner(), "b");
    assert_eq!(
        a.leader().await.expect("leader").map(|l| l.owner),
        Some("b".to_string())
    );
    assert!(b.leading().is_some());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn se_3_and_e_4_observe_sees_each_change_and_a_dead_leader_is_replaced() {
    let srv = Server::start();
    let mut raw = srv.async_conn().await;
    let flock = Flock::new(srv.client());
    let watcher = flock.election("obs", TTL, None).expect("election");
    let mut seen = watcher.observe().await.expect("observe");
    // E.3: first the current state: free.
    assert_eq!(seen.next().await.expect("next"), None);
    let mut a = Flock::new(srv.client())
        .election("obs", TTL, Some("a"))
        .expect("election");
    let la = a.campaign(Wait::Forever).await.expect("a");
    let next = tokio::time::timeout(MS(3000), seen.next())
        .await
        .expect("a change")
        .expect("next");
    assert_eq!(
        next,
        Some(Leader {
            owner: "a".into(),
            token: la.token()
        })
    );
    // One WATCH at a time on the server while nothing changes (no polling).
    let before: i64 = {
        let text: String = q(&mut raw, &["INFO", "commandstats"]).await;
        text.lines()
            .find_map(|l| l.strip_prefix("cmdstat_flock.info:calls="))
            .and_then(|r| r.split(',').next())
            .and_then(|n| n.parse().ok())
            .unwrap_or(0)
    };
    let mut b = Flock::new(srv.client())
        .election("obs", TTL, Some("b"))
        .expect("election");
    let bt = tokio::spawn(async move {
        let h = b.campaign(Wait::Forever).await.expect("b leads");
        (b, h)
    });
    let next = tokio::spawn(async move {
        let v = seen.next().await;
        (seen, v)
    });
    tokio::time::sleep(MS(500)).await;
    let after: i64 = {
        let text: String = q(&mut raw, &["INFO", "commandstats"]).await;
        text.lines()
            .find_map(|l| l.strip_prefix("cmdstat_flock.info:calls="))
            .and_then(|r| r.split(',').next())
            .and_then(|n| n.parse().ok())
            .unwrap_or(0)
    };
    assert!(after - before <= 1, "no polling: {before} -> {after}");
    // E.4: the leader's (BOUND) connection dies: b leads, a hears it, observe sees b.
    let text: String = q(&mut raw, &["CLIENT", "LIST"]).await;
    let a_conn = text
        .lines()
        .filter(|l| l.contains("cmd=flock.acquire") && !l.contains("flags=b"))
        .filter_map(|l| l.split(' ').find_map(|f| f.strip_prefix("id=")))
        .map(str::to_string)
        .collect::<Vec<_>>();
    assert_eq!(a_conn.len(), 1, "{text}");
    let _: () = q(&mut raw, &["CLIENT", "KILL", "ID", &a_conn[0]]).await;
    assert!(la.wait_lost(MS(3000)).await, "a hears it was deposed");
    assert_eq!(la.lost_reason(), Some(LossReason::Closed));
    let (_b, hb) = bt.await.expect("task");
    let (mut seen, v) = tokio::time::timeout(MS(3000), next)
        .await
        .expect("observed")
        .expect("task");
    let v = v.expect("next");
    // (observe may see the key free for a moment first)
    let v = if v.is_none() {
        seen.next().await.expect("next")
    } else {
        v
    };
    assert_eq!(
        v,
        Some(Leader {
            owner: "b".into(),
            token: hb.token()
        })
    );
    assert!(a.leading().is_none());
    seen.close();
    assert!(matches!(seen.next().await, Err(Error::Busy)));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn se_5_campaign_not_leading_in_time_is_busy() {
    let srv = Server::start();
    let flock = Flock::new(srv.client());
    let mut a = flock.election("t", TTL, Some("a")).expect("election");
    a.campaign(Wait::None).await.expect("a leads");
    let mut b = Flock::new(srv.client())
        .election("t", TTL, Some("b"))
        .expect("election");
    let t0 = Instant::now();
    let r = b.campaign(Wait::For(MS(300))).await;
    assert!(matches!(r, Err(Error::Busy)), "{r:?}");
    assert!(t0.elapsed() >= MS(290));
    assert!(matches!(
        flock.election("", TTL, None),
        Err(Error::Invalid(_))
    ));
    assert!(matches!(
        flock.election("t", Duration::ZERO, None),
        Err(Error::Invalid(_))
    ));
}
