//! A worker takes a lock, writes with its token, releases. Needs a Redis with the flock
//! module (`make run` at the repo root), then:
//!   cargo run -p flock-client --example worker -- redis://127.0.0.1:6379/
use std::time::Duration;

// redis-rs through the crate's re-export: this program needs no dependency but flock-client
// and tokio (with macros, rt-multi-thread), as the README's install step gives.
use flock_client::{redis, Error, Flock, LockOptions, Wait};

#[tokio::main]
async fn main() -> Result<(), Error> {
    let url = std::env::args()
        .nth(1)
        .unwrap_or_else(|| "redis://127.0.0.1:6379/".into());
    let flock = Flock::new(redis::Client::open(url)?);

    // Wait up to 5 s for the lock; the lease lasts 10 s and is renewed in the background.
    let opts = LockOptions::new(Duration::from_secs(10)).wait(Wait::For(Duration::from_secs(5)));
    let lease = flock.lock("{order:42}:lock", opts).await?;
    println!("holding {} with token {}", lease.key(), lease.token());

    // The write runs only while the token is the live grant (FLOCK.FENCED).
    lease.ensure(Duration::from_secs(1))?;
    let _: () = lease
        .fenced(redis::cmd("SET").arg("{order:42}:status").arg("paid"))
        .await?;

    // An outside resource gets the token and refuses anything older than what it has seen.
    println!(
        "UPDATE orders SET status='paid', fence={} WHERE id=42 AND fence < {}",
        lease.token(),
        lease.token()
    );

    lease.release().await?;
    println!("released");
    Ok(())
}
