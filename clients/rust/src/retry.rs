//! Which failures are worth sending a command again, how often, and after what pause. Only
//! commands that are safe to repeat are ever retried (ACQUIRE of the same owner, the
//! token-qualified RENEW and RELEASE, CHECK); a FENCED command never is, as it may have run.

use std::time::Duration;

use redis::{RedisError, RetryMethod};

/// A failure of the connection rather than an answer of the server: worth a retry on a new
/// connection (for commands that are safe to repeat).
pub(crate) fn is_connection_error(e: &RedisError) -> bool {
    e.is_io_error()
        || e.is_connection_dropped()
        || e.is_connection_refusal()
        || e.is_timeout()
        || e.is_unrecoverable_error()
}

/// Worth a retry at all: a connection failure or a transient cluster state (TRYAGAIN,
/// CLUSTERDOWN, MASTERDOWN, LOADING).
pub(crate) fn is_transient(e: &RedisError) -> bool {
    is_connection_error(e) || !matches!(e.retry_method(), RetryMethod::NoRetry)
}

/// The key moved to another cluster node during a BLOCK wait (the wait asks again).
pub(crate) fn is_tryagain(e: &RedisError) -> bool {
    e.kind() == redis::ErrorKind::Server(redis::ServerErrorKind::TryAgain)
}

/// How many times a command that is safe to repeat is sent again after a connection failure.
pub(crate) const RETRIES: u32 = 3;

/// The pause before retry `attempt` (1, 2, ...): 20, 40, 80, 160, then 200 ms. Short, because
/// a watchdog has only the rest of its lease; where a deadline applies the caller cuts the
/// pause at it.
pub(crate) fn backoff(attempt: u32) -> Duration {
    if attempt == 0 {
        Duration::ZERO
    } else {
        Duration::from_millis((10u64 << attempt.min(5)).min(200))
    }
}
