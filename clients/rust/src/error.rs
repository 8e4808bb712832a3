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
    /// The lease is lost, or was released (rule 12): the reason says which, from the fixed
    /// list of docs/CLIENTS.md ([`LossReason::Released`] for a lease released cleanly).
    Lost(LossReason),
    /// An argument or option refused by the client itself, before anything was sent (rule 12:
    /// an empty key or owner, a ttl that is not a whole number of milliseconds of at least 1, a
    /// `Permits(0)`, `bound` with `replicas` or `fsync`, ...). Never a server's refusal.
    Invalid(String),
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
    /// A fenced command ran, but its reply is not of the type asked for (`fenced::<T>`): the
    /// reply as it came, and why it did not convert. Not a refusal: the command's effect
    /// happened.
    Reply {
        /// The command's reply.
        reply: redis::Value,
        /// What the conversion to the asked-for type said.
        detail: String,
    },
    /// Any other error from redis-rs or the server (connection, syntax, WRONGTYPE, ...).
    Redis(RedisError),
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::Busy => f.write_str("lock busy: not granted within the wait"),
            Error::Lost(LossReason::Released) => {
                f.write_str("lock lost: the lease was released (reason released)")
            }
            Error::Lost(r) => write!(f, "lock lost: the lease is no longer held (reason {r})"),
            Error::Invalid(msg) => write!(f, "invalid argument: {msg}"),
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
            Error::Reply { reply, detail } => write!(
                f,
                "the command ran, but its reply does not convert to the type asked for: \
                 {detail} (reply {reply:?})"
            ),
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
        matches!(self, Error::Lost(_) | Error::TooShort { .. })
    }

    /// The reason of an `Error::Lost`; `None` for any other error.
    pub fn loss_reason(&self) -> Option<LossReason> {
        match self {
            Error::Lost(r) => Some(*r),
            _ => None,
        }
    }
}

/// Why a lease is lost (rule 12 of docs/CLIENTS.md): one fixed list in every client. A lease
/// released cleanly is not lost; calls on it answer `Error::Lost(LossReason::Released)`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum LossReason {
    /// `FLOCK.REVOKE` ended the grant, or another process released it with the lease's owner.
    Revoked,
    /// The server says the grant's ttl ran out.
    Expired,
    /// The BOUND lease's connection closed (the server says so, or the client saw it fail).
    Closed,
    /// The server ended the grant any other way: DEL, UNLINK, FLUSHALL, eviction, a failover.
    Lost,
    /// The server no longer knows the grant and cannot say how it ended (WATCH answered
    /// `gone`, CHECK answered 0, a first RELEASE answered 0).
    Gone,
    /// A token-qualified `FLOCK.RENEW` answered nil.
    RenewRefused,
    /// The local deadline passed before a renewal was answered (rule 1).
    DeadlinePassed,
    /// `FLOCK.FENCED` refused the lease's token as stale.
    FencedRefused,
    /// Not a loss: the lease was released by its holder.
    Released,
}

impl LossReason {
    /// The reason as docs/CLIENTS.md spells it (`revoked`, `renew-refused`, ...).
    pub fn as_str(&self) -> &'static str {
        match self {
            LossReason::Revoked => "revoked",
            LossReason::Expired => "expired",
            LossReason::Closed => "closed",
            LossReason::Lost => "lost",
            LossReason::Gone => "gone",
            LossReason::RenewRefused => "renew-refused",
            LossReason::DeadlinePassed => "deadline-passed",
            LossReason::FencedRefused => "fenced-refused",
            LossReason::Released => "released",
        }
    }

    /// A FLOCK.WATCH event as a loss reason (rule 9): a `released` the lease did not send is
    /// someone else ending the grant with the lease's owner, so `revoked`.
    pub(crate) fn of_event(event: &str) -> LossReason {
        match event {
            "revoked" | "released" => LossReason::Revoked,
            "expired" => LossReason::Expired,
            "closed" => LossReason::Closed,
            "gone" => LossReason::Gone,
            _ => LossReason::Lost,
        }
    }
}

impl fmt::Display for LossReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Result with this crate's [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// A request refused before it is sent (rule 12): the client's own error kind, never dressed
/// as a server error.
pub(crate) fn invalid(msg: impl Into<String>) -> Error {
    Error::Invalid(msg.into())
}
