//! What a durable grant costs (rule 10): `lock()` + `release()` with `replicas(1)` against the
//! same without, on loopback, against a master with one replica.
//!
//!   FLOCK_MODULE=target/release/libredis_flock.so \
//!     cargo run --release -p flock-client --example durable_cost [-- --iters 2000]
//!
//! starts a master and a replica with the module (flock-testkit: `REDIS_SERVER`, default
//! `redis-server`), measures, and stops them; `-- --port P` measures against a master of your
//! own instead (it needs at least one replica). Rounds of both kinds alternate so that load
//! from elsewhere hits both alike.
use std::time::{Duration, Instant};

use flock_client::{Flock, LockOptions};
use flock_testkit::Server;

fn arg(name: &str, default: u64) -> u64 {
    let args: Vec<String> = std::env::args().collect();
    args.iter()
        .position(|a| a == name)
        .and_then(|i| args.get(i + 1))
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn pct(sorted: &[Duration], p: f64) -> Duration {
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i.min(sorted.len() - 1)]
}

/// The median and p99 of `times` in microseconds (sorts them).
fn p50_p99(times: &mut [Duration]) -> (f64, f64) {
    times.sort();
    let us = |d: Duration| d.as_secs_f64() * 1e6;
    (us(pct(times, 0.5)), us(pct(times, 0.99)))
}

/// One line of the report: `label`, then the median and p99 in microseconds.
fn row(label: &str, (p50, p99): (f64, f64), note: &str) {
    println!("{label:<30} p50 {p50:8.1} us   p99 {p99:8.1} us{note}");
}

/// One raw FLOCK.ACQUIRE + FLOCK.RELEASE, with `WAIT 1 1000` pipelined behind the ACQUIRE
/// when `wait` (what a durable grant sends, without the client around it).
async fn raw_once(
    c: &mut redis::aio::MultiplexedConnection,
    wait: bool,
) -> Result<(), Box<dyn std::error::Error>> {
    let (key, owner) = ("durable_cost:raw", "durable-cost-raw-owner");
    let token: i64 = if wait {
        let (token, acked): (i64, i64) = redis::pipe()
            .cmd("FLOCK.ACQUIRE")
            .arg(key)
            .arg(owner)
            .arg(10_000)
            .cmd("WAIT")
            .arg(1)
            .arg(1000)
            .query_async(c)
            .await?;
        if acked < 1 {
            return Err("WAIT 1: the replica did not acknowledge within 1 s".into());
        }
        token
    } else {
        redis::cmd("FLOCK.ACQUIRE")
            .arg(key)
            .arg(owner)
            .arg(10_000)
            .query_async(c)
            .await?
    };
    let released: i64 = redis::cmd("FLOCK.RELEASE")
        .arg(key)
        .arg(owner)
        .arg(token)
        .query_async(c)
        .await?;
    if released != 1 {
        return Err(format!("FLOCK.RELEASE answered {released}").into());
    }
    Ok(())
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let iters = arg("--iters", 2000).max(100) as usize;
    let threads = arg("--threads", 2) as usize;
    // Our own master and replica unless a port is given; killed on drop.
    let own = if arg("--port", 0) == 0 {
        let m = Server::start();
        let r = Server::start_replica_of(&m);
        Some((m, r))
    } else {
        None
    };
    let port = match &own {
        Some((m, _)) => m.port(),
        None => arg("--port", 6379) as u16,
    };
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(threads.max(1))
        .enable_all()
        .build()?;
    rt.block_on(async move {
        let client = redis::Client::open(format!("redis://127.0.0.1:{port}/"))?;
        let mut admin = client
            .get_multiplexed_async_connection_with_config(
                &redis::AsyncConnectionConfig::new().set_response_timeout(None),
            )
            .await?;
        // A new replica's stream starts with its first REPLCONF ACK (up to a second): wait
        // until a WAIT is answered.
        let _: () = redis::cmd("SET")
            .arg("durable_cost:warm")
            .arg(1)
            .query_async(&mut admin)
            .await?;
        let acked: i64 = redis::cmd("WAIT")
            .arg(1)
            .arg(5000)
            .query_async(&mut admin)
            .await?;
        if acked < 1 {
            return Err(
                "the master has no replica that acknowledges: replicas(1) cannot be granted".into(),
            );
        }
        let flock = Flock::new(client);
        let key = "durable_cost:lock";
        let plain = LockOptions::new(Duration::from_secs(10));
        let durable = LockOptions::new(Duration::from_secs(10)).replicas(1);
        let rounds = 10;
        let per = iters.div_ceil(rounds);
        let mut plain_t = Vec::with_capacity(per * rounds);
        let mut durable_t = Vec::with_capacity(per * rounds);
        // The floor: the same pair of raw commands without the client, plain and with the
        // WAIT pipelined behind the ACQUIRE. What the WAIT adds there is what any WAIT-based
        // durable lock pays on this machine.
        let mut raw_t = Vec::with_capacity(per * rounds);
        let mut raw_wait_t = Vec::with_capacity(per * rounds);
        let mut raw = admin.clone();
        // Warm up every path (connections, the durable pool, allocator, caches).
        for _ in 0..200 {
            flock.lock(key, plain.clone()).await?.release().await?;
            flock.lock(key, durable.clone()).await?.release().await?;
            raw_once(&mut raw, false).await?;
            raw_once(&mut raw, true).await?;
        }
        for _ in 0..rounds {
            for _ in 0..per {
                let s = Instant::now();
                let l = flock.lock(key, plain.clone()).await?;
                l.release().await?;
                plain_t.push(s.elapsed());
            }
            for _ in 0..per {
                let s = Instant::now();
                let l = flock.lock(key, durable.clone()).await?;
                l.release().await?;
                durable_t.push(s.elapsed());
            }
            for _ in 0..per {
                let s = Instant::now();
                raw_once(&mut raw, false).await?;
                raw_t.push(s.elapsed());
            }
            for _ in 0..per {
                let s = Instant::now();
                raw_once(&mut raw, true).await?;
                raw_wait_t.push(s.elapsed());
            }
        }
        let plain = p50_p99(&mut plain_t);
        let durable = p50_p99(&mut durable_t);
        let raw = p50_p99(&mut raw_t);
        let raw_wait = p50_p99(&mut raw_wait_t);
        let added =
            |with: (f64, f64), without: (f64, f64)| (with.0 - without.0, with.1 - without.1);
        println!(
            "iterations: {} each, {threads} runtime threads, master port {port}, one replica",
            plain_t.len()
        );
        row("plain        lock()+release():", plain, "");
        row("replicas(1)  lock()+release():", durable, "");
        row("added by the WAIT:", added(durable, plain), "");
        row("raw ACQUIRE+RELEASE:", raw, "");
        row("raw ACQUIRE+WAIT 1, RELEASE:", raw_wait, "");
        row(
            "added by the WAIT alone (raw):",
            added(raw_wait, raw),
            "   (the floor, no client)",
        );
        Ok::<(), Box<dyn std::error::Error>>(())
    })?;
    drop(own);
    Ok(())
}
