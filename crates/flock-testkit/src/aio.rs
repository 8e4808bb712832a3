//! Async helpers for tests that run on tokio (the Rust client's): a redis-rs multiplexed
//! connection of the test's own to a test server, one command, an INFO number, and waiting
//! for a condition within a limit. Behind the `aio` feature, so that the sync tests build
//! without tokio. Not re-exported at the crate root, because these mirror sync helpers there
//! (`wait_until`, `info_i64`) with other signatures: `use flock_testkit::aio::*;`.

use std::future::Future;
use std::time::Duration;

use redis::aio::MultiplexedConnection;
use redis::AsyncConnectionConfig;
use tokio::time::Instant;

use crate::info::info_text_field;
use crate::server::Server;

impl Server {
    /// A new multiplexed async connection of the test's own, without a response timeout: on a
    /// loaded machine a slow reply must not fail the test's own checks (its waits have limits
    /// of their own).
    pub async fn async_conn(&self) -> MultiplexedConnection {
        self.client()
            .get_multiplexed_async_connection_with_config(
                &AsyncConnectionConfig::new().set_response_timeout(None),
            )
            .await
            .unwrap_or_else(|e| panic!("connect to {}: {e}\n{}", self.url(), self.log_tail(30)))
    }
}

/// Run one command (`args[0]` the name) and convert its reply; panics with the command on any
/// error, as test-side calls must not fail.
pub async fn q<T: redis::FromRedisValue>(c: &mut MultiplexedConnection, args: &[&str]) -> T {
    let Some((name, rest)) = args.split_first() else {
        panic!("q: no command");
    };
    let mut cmd = redis::cmd(name);
    for a in rest {
        cmd.arg(*a);
    }
    cmd.query_async(c)
        .await
        .unwrap_or_else(|e| panic!("{args:?}: {e}"))
}

/// An integer field of `INFO <section>` that must be there.
pub async fn info_i64(c: &mut MultiplexedConnection, section: &str, field: &str) -> i64 {
    let text: String = q(c, &["INFO", section]).await;
    info_text_field(&text, field)
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("no integer {field} in INFO {section}:\n{text}"))
}

/// Poll `f` every 10 ms until it holds; panic with `what` once `limit` has passed. The limit
/// is the caller's: it is part of what a test asserts (e.g. "released within 3 s").
pub async fn wait_until<F, Fut>(what: &str, limit: Duration, mut f: F)
where
    F: FnMut() -> Fut,
    Fut: Future<Output = bool>,
{
    let start = Instant::now();
    loop {
        if f().await {
            return;
        }
        assert!(start.elapsed() < limit, "timed out waiting for: {what}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}
