//! The one error type of the crate and its `Result`. Every other module depends on this one
//! and it on none of them, so an error can be made anywhere without a cycle.

use std::fmt;
use std::time::Duration;

use redis::RedisError;

/// The one error type of this crate.
#[derive(Debug)]
pub enum Error {
    /// The lock was not granted within the wait (`flock.lock`, `with_lock`).
    Busy,
    /// The lease is lost: its grant ended on the server (expiry, REVOKE, another RENEW's nil),
    /// or its local deadline passed, or it was already released.
    Lost,
    /// The lease is live but has less than the asked-for time left (`ensure`).
    TooShort {
        /// What the local lease clock had left when asked.
        remaining: Duration,
    },
    /// A fenced command was refused because the token is no longer the live grant; the lease
    /// is marked lost. The text is the server's.
    Fenced(String),
    /// A durable grant or renewal (`replicas(n)`, `fsync(true)`, rule 10) was not acknowledged
    /// by enough replicas (or the AOF) within the durable timeout. A grant is then released
    /// again; a renewal leaves the local deadline where the last acknowledged one put it.
    NotDurable {
        /// Replicas that acknowledged (WAIT's count, or WAITAOF's replica count).
        acknowledged: u32,
        /// Replicas asked for (`replicas(n)`).
        asked: u32,
        /// With `fsync(true)`: whether the master's AOF had it on disk; `None` without fsync.
        fsynced: Option<bool>,
    },
    /// Any other error from redis-rs or the server (connection, syntax, WRONGTYPE, ...).
    Redis(RedisError),
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::Busy => f.write_str("lock busy: not granted within the wait"),
            Error::Lost => f.write_str("lock lost: the lease is no longer held"),
            Error::TooShort { remaining } => {
                write!(f, "lease too short: {} ms left", remaining.as_millis())
            }
            Error::Fenced(msg) => write!(f, "fenced command refused: {msg}"),
            Error::NotDurable {
                acknowledged,
                asked,
                fsynced,
            } => {
                write!(
                    f,
                    "not durable: {acknowledged} of {asked} replicas acknowledged within the \
                     durable timeout"
                )?;
                match fsynced {
                    Some(true) => f.write_str(", the master's AOF has it on disk"),
                    Some(false) => f.write_str(", the master's AOF did not fsync it"),
                    None => Ok(()),
                }
            }
            Error::Redis(e) => write!(f, "redis error: {e}"),
        }
    }
}

impl std::error::Error for Error {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            Error::Redis(e) => Some(e),
            _ => None,
        }
    }
}

impl From<RedisError> for Error {
    fn from(e: RedisError) -> Self {
        Error::Redis(e)
    }
}

impl Error {
    /// True for `Lost` and `TooShort` (a too-short lease is a kind of loss, as in the other
    /// clients where `LeaseTooShortError` subclasses `LockLostError`).
    pub fn is_lost(&self) -> bool {
        matches!(self, Error::Lost | Error::TooShort { .. })
    }
}

/// Result with this crate's [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// A request refused before it is sent (a ttl below 1 ms, `Permits(0)`), as the same kind of
/// error redis-rs gives a bad client configuration, so that callers see one `Error::Redis`
/// whether the client or the server refused it.
pub(crate) fn invalid(what: &'static str, detail: String) -> Error {
    Error::Redis(RedisError::from((
        redis::ErrorKind::InvalidClientConfig,
        what,
        detail,
    )))
}
