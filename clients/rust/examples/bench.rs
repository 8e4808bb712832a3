//! Added latency of `flock.lock()` + `release()` over the raw commands, on loopback.
//!
//! Start a server with the module, then:
//!   cargo run -p flock-client --release --example bench -- --port 6379 [--iters 5000]
//!
//! "raw" is FLOCK.ACQUIRE key owner ttl + FLOCK.RELEASE key owner token on one multiplexed
//! connection; "client" is `flock.lock(key, ttl)` + `lease.release()` (random owner, watchdog
//! task started and stopped, token-qualified release) over the same kind of connection. Rounds
//! of both alternate so that load from elsewhere hits both alike. With `--paired 1` it then
//! also alternates them one by one, `--iters` pairs, and prints the median of the per-pair
//! differences (steadier than the difference of the medians on a loaded machine).
use std::time::{Duration, Instant};

use flock_client::Flock;

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

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let port = arg("--port", 6379);
    let iters = arg("--iters", 5000).max(2000) as usize;
    let threads = arg("--threads", 2) as usize;
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(threads.max(1))
        .enable_all()
        .build()?;
    rt.block_on(async move {
        let client = redis::Client::open(format!("redis://127.0.0.1:{port}/"))?;
        let mut raw = client.get_multiplexed_async_connection().await?;
        let flock = Flock::new(client);
        let key = "bench:lock";
        let rounds = 10;
        let per = iters / rounds;
        let mut raw_t = Vec::with_capacity(iters);
        let mut cli_t = Vec::with_capacity(iters);
        // Warm up both paths (connections, allocator, caches).
        for _ in 0..300 {
            let l = flock.lock(key, Duration::from_secs(10)).await?;
            l.release().await?;
            let t: u64 = redis::cmd("FLOCK.ACQUIRE")
                .arg(key)
                .arg("raw-owner")
                .arg(10_000)
                .query_async(&mut raw)
                .await?;
            let _: i64 = redis::cmd("FLOCK.RELEASE")
                .arg(key)
                .arg("raw-owner")
                .arg(t)
                .query_async(&mut raw)
                .await?;
        }
        for _ in 0..rounds {
            for _ in 0..per {
                let s = Instant::now();
                let t: u64 = redis::cmd("FLOCK.ACQUIRE")
                    .arg(key)
                    .arg("raw-owner")
                    .arg(10_000)
                    .query_async(&mut raw)
                    .await?;
                let n: i64 = redis::cmd("FLOCK.RELEASE")
                    .arg(key)
                    .arg("raw-owner")
                    .arg(t)
                    .query_async(&mut raw)
                    .await?;
                raw_t.push(s.elapsed());
                assert_eq!(n, 1);
            }
            for _ in 0..per {
                let s = Instant::now();
                let l = flock.lock(key, Duration::from_secs(10)).await?;
                l.release().await?;
                cli_t.push(s.elapsed());
            }
        }
        raw_t.sort();
        cli_t.sort();
        let us = |d: Duration| d.as_secs_f64() * 1e6;
        let (rm, r99) = (pct(&raw_t, 0.5), pct(&raw_t, 0.99));
        let (cm, c99) = (pct(&cli_t, 0.5), pct(&cli_t, 0.99));
        println!("iterations: {} each, {threads} runtime threads, port {port}", raw_t.len());
        println!("raw ACQUIRE+RELEASE:     median {:8.1} us   p99 {:8.1} us", us(rm), us(r99));
        println!("client lock()+release(): median {:8.1} us   p99 {:8.1} us", us(cm), us(c99));
        println!(
            "added by the client:     median {:8.1} us   p99 {:8.1} us   (target: < 50 us per lock)",
            us(cm) - us(rm),
            us(c99) - us(r99)
        );
        if arg("--paired", 0) == 1 {
            let mut diffs = Vec::with_capacity(iters);
            for _ in 0..iters {
                let s = Instant::now();
                let t: u64 = redis::cmd("FLOCK.ACQUIRE")
                    .arg(key)
                    .arg("raw-owner")
                    .arg(10_000)
                    .query_async(&mut raw)
                    .await?;
                let _: i64 = redis::cmd("FLOCK.RELEASE")
                    .arg(key)
                    .arg("raw-owner")
                    .arg(t)
                    .query_async(&mut raw)
                    .await?;
                let r = us(s.elapsed());
                let s = Instant::now();
                let l = flock.lock(key, Duration::from_secs(10)).await?;
                l.release().await?;
                diffs.push(us(s.elapsed()) - r);
            }
            diffs.sort_by(f64::total_cmp);
            let mid = diffs.get(diffs.len() / 2).copied().unwrap_or(0.0);
            println!("paired, one by one:      median of the per-pair differences {mid:8.1} us");
        }
        Ok::<(), Box<dyn std::error::Error>>(())
    })
}
