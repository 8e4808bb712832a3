//! Rule 9's measurement (docs/CLIENTS.md scenario 9.7): the delay from the server's end of a
//! grant to the lease's loss signal, over N `FLOCK.REVOKE`s and N `CLIENT KILL`s of a BOUND
//! lease's connection, at a ttl of 30 s (so no renewal, due 10 s later, can be what finds it).
//!
//!   FLOCK_MODULE=target/release/libredis_flock.so \
//!     cargo run --release -p flock-client --example loss_delay [-- --n 100]
//!
//! starts a server with the module (flock-testkit: `REDIS_SERVER`, default `redis-server`),
//! measures, and stops it; `-- --port P` measures against a server of your own. Each delay is
//! counted from just before the REVOKE or CLIENT KILL is sent on another connection until the
//! lease's `lost_signal()` turns true in this process: an upper bound of the rule's delay
//! (it includes the half round trip of the command that ends the grant).
use std::time::{Duration, Instant};

use flock_client::{Flock, LockOptions, LossReason};
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

fn report(what: &str, mut d: Vec<Duration>, reasons: &[LossReason]) {
    d.sort();
    let us = |x: Duration| x.as_micros();
    println!(
        "{what}: n={} p50={} us p99={} us max={} us min={} us; reasons: {:?}",
        d.len(),
        us(pct(&d, 0.50)),
        us(pct(&d, 0.99)),
        us(d[d.len() - 1]),
        us(d[0]),
        {
            let mut r: Vec<&str> = reasons.iter().map(|r| r.as_str()).collect();
            r.sort();
            r.dedup();
            r
        }
    );
}

/// The ids of the server's connections whose last command is `cmd`.
async fn ids_with(
    admin: &mut redis::aio::MultiplexedConnection,
    cmd: &str,
) -> redis::RedisResult<Vec<String>> {
    let text: String = redis::cmd("CLIENT").arg("LIST").query_async(admin).await?;
    Ok(text
        .lines()
        .filter(|l| l.split(' ').any(|f| f == format!("cmd={cmd}")))
        .filter_map(|l| l.split(' ').find_map(|f| f.strip_prefix("id=")))
        .map(str::to_string)
        .collect())
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let n = arg("--n", 100).max(1) as usize;
    let ttl = Duration::from_millis(arg("--ttl", 30_000));
    let own = if arg("--port", 0) == 0 {
        Some(Server::start())
    } else {
        None
    };
    let port = match &own {
        Some(s) => s.port(),
        None => arg("--port", 6379) as u16,
    };
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    rt.block_on(async move {
        let client = redis::Client::open(format!("redis://127.0.0.1:{port}/"))?;
        let mut admin = client.get_multiplexed_async_connection().await?;
        let flock = Flock::new(client.clone());
        // Other leases held throughout, as an application would: the WATCH names them all.
        let mut others = Vec::new();
        for i in 0..8 {
            others.push(flock.lock(format!("loss_delay:other:{i}"), ttl).await?);
        }

        let mut revoke = Vec::with_capacity(n);
        let mut reasons = Vec::with_capacity(n);
        for i in 0..n {
            let key = format!("loss_delay:revoke:{i}");
            let lease = flock.lock(key.as_str(), ttl).await?;
            // Let the WATCH take the new lease in (it joins after 5 ms).
            tokio::time::sleep(Duration::from_millis(30)).await;
            let mut sig = lease.lost_signal();
            let t0 = Instant::now();
            let _: i64 = redis::cmd("FLOCK.REVOKE")
                .arg(&key)
                .query_async(&mut admin)
                .await?;
            if tokio::time::timeout(Duration::from_secs(15), sig.wait_for(|v| *v))
                .await
                .is_err()
            {
                return Err(format!("revoke {i}: not heard within 15 s").into());
            }
            revoke.push(t0.elapsed());
            reasons.push(lease.lost_reason().unwrap_or(LossReason::Lost));
            drop(lease);
        }
        report("REVOKE", revoke, &reasons);

        let mut kill = Vec::with_capacity(n);
        let mut reasons = Vec::with_capacity(n);
        for i in 0..n {
            let key = format!("loss_delay:kill:{i}");
            let before = ids_with(&mut admin, "flock.acquire").await?;
            let lease = flock
                .lock(key.as_str(), LockOptions::new(ttl).bound(true))
                .await?;
            let after = ids_with(&mut admin, "flock.acquire").await?;
            let Some(id) = after.into_iter().find(|id| !before.contains(id)) else {
                return Err(format!("kill {i}: the bound lease's connection not found").into());
            };
            tokio::time::sleep(Duration::from_millis(30)).await;
            let mut sig = lease.lost_signal();
            let t0 = Instant::now();
            let _: i64 = redis::cmd("CLIENT")
                .arg("KILL")
                .arg("ID")
                .arg(&id)
                .query_async(&mut admin)
                .await?;
            if tokio::time::timeout(Duration::from_secs(15), sig.wait_for(|v| *v))
                .await
                .is_err()
            {
                return Err(format!("kill {i}: not heard within 15 s").into());
            }
            kill.push(t0.elapsed());
            reasons.push(lease.lost_reason().unwrap_or(LossReason::Lost));
            drop(lease);
        }
        report("CLIENT KILL of a BOUND lease's connection", kill, &reasons);
        for l in others {
            l.release().await?;
        }
        println!(
            "ttl {} ms, {} watching connection(s)",
            ttl.as_millis(),
            flock.watch_connections()
        );
        Ok::<(), Box<dyn std::error::Error>>(())
    })?;
    drop(own);
    Ok(())
}
