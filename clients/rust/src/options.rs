//! What a caller asks for: the lease length, how long to wait, the kind of grant (exclusive,
//! shared, permits), bound or not, the watchdog, the owner, and how durable the grant must be
//! before it is handed over (rule 10). Plain values: nothing here talks to a server.

use std::time::Duration;

use crate::error::{invalid, Result};

/// How long to wait for a lock that someone else holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum Wait {
    /// One try (`For(Duration::ZERO)` is the same).
    #[default]
    None,
    /// Wait up to this long, in the server's FIFO queue (`BLOCK ms`).
    For(Duration),
    /// Wait without limit (`BLOCK 0`).
    Forever,
}

/// The kind of grant.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum Mode {
    /// The key's only live grant.
    #[default]
    Exclusive,
    /// A read lock: any number of shared grants together, never with an exclusive one
    /// (`SHARED`).
    Shared,
    /// A counting semaphore: at most `n` permits at once, each with its own token
    /// (`LIMIT n`).
    Permits(u32),
}

/// Options of `lock`, `acquire` and `with_lock`. `LockOptions::new(ttl)` or a bare
/// `Duration` (via `From`) gives the defaults: one try, exclusive, unbound, watchdog on, a
/// random 128-bit owner, not durable (no replicas, no fsync waited for).
#[derive(Clone, Debug)]
pub struct LockOptions {
    pub(crate) ttl: Duration,
    pub(crate) wait: Wait,
    pub(crate) mode: Mode,
    pub(crate) bound: bool,
    pub(crate) renew: bool,
    pub(crate) owner: Option<String>,
    pub(crate) replicas: u32,
    pub(crate) fsync: bool,
    pub(crate) durable_timeout: Option<Duration>,
    pub(crate) reentrant: bool,
}

impl LockOptions {
    /// Options with this lease length (whole milliseconds, at least 1 ms).
    pub fn new(ttl: Duration) -> Self {
        LockOptions {
            ttl,
            wait: Wait::None,
            mode: Mode::Exclusive,
            bound: false,
            renew: true,
            owner: None,
            replicas: 0,
            fsync: false,
            durable_timeout: None,
            reentrant: false,
        }
    }
    /// The lease length.
    pub fn ttl(mut self, ttl: Duration) -> Self {
        self.ttl = ttl;
        self
    }
    /// How long to wait when the key is held.
    pub fn wait(mut self, wait: Wait) -> Self {
        self.wait = wait;
        self
    }
    /// Exclusive, shared or a permit.
    pub fn mode(mut self, mode: Mode) -> Self {
        self.mode = mode;
        self
    }
    /// A grant bound to its connection (`BOUND`): it ends when that connection closes. The
    /// lease then keeps a connection of its own, renews on it, and is lost when it fails: the
    /// first call that finds it failed (the watchdog's next renewal at the latest) marks the
    /// lease lost, and `release()` is then `Error::Lost`.
    pub fn bound(mut self, bound: bool) -> Self {
        self.bound = bound;
        self
    }
    /// The watchdog (on by default): renew at a third of the ttl.
    pub fn renew(mut self, renew: bool) -> Self {
        self.renew = renew;
        self
    }
    /// A caller-given owner (default: 128 random bits in hex). With a known owner a
    /// supervisor can `Flock::release` or `Flock::revoke` from any process.
    pub fn owner(mut self, owner: impl Into<String>) -> Self {
        self.owner = Some(owner.into());
        self
    }
    /// A durable grant (rule 10): the lease is handed over only after at least `n` replicas
    /// acknowledged the grant (`WAIT n timeout`, pipelined with the ACQUIRE on the same
    /// connection), and every renewal counts only once `n` replicas acknowledged it. When
    /// fewer acknowledge within the durable timeout, the grant is released and the result is
    /// [`Error::NotDurable`](crate::Error::NotDurable). 0 (the default): not waited for.
    /// Refused with `bound(true)`: a bound grant ends at any promotion by design.
    pub fn replicas(mut self, n: u32) -> Self {
        self.replicas = n;
        self
    }
    /// A grant handed over only after the master's AOF has it on disk (`WAITAOF 1 n
    /// timeout`, with `n` the [`replicas`](Self::replicas): with `fsync(true)` those must have
    /// it in their own AOF on disk too). Needs a server with WAITAOF (Redis 7.2 or later,
    /// Valkey) and `appendonly yes`; on a server without WAITAOF the request is refused
    /// before anything is sent. Refused with `bound(true)`.
    pub fn fsync(mut self, fsync: bool) -> Self {
        self.fsync = fsync;
        self
    }
    /// How long a durable grant or renewal waits for its acknowledgments (whole
    /// milliseconds, at least 1 ms, less than the ttl; default a third of the ttl). Only used
    /// with [`replicas`](Self::replicas) or [`fsync`](Self::fsync). A renewal never waits
    /// past the lease's local deadline.
    pub fn durable_timeout(mut self, timeout: Duration) -> Self {
        self.durable_timeout = Some(timeout);
        self
    }

    /// Rule 11: acquiring a key this `Flock` already holds with the same owner returns
    /// another hold of that same lease instead of failing with `Error::Busy`; only the last
    /// hold's release ends the grant. Without an `owner`, the owner is the task's: the tokio
    /// task that holds the key re-enters, any other task waits like another holder would.
    /// Asking for another kind (mode, bound) than the held lease is `Error::Invalid`.
    pub fn reentrant(mut self, reentrant: bool) -> Self {
        self.reentrant = reentrant;
        self
    }

    /// The durability asked for, checked against the rest of the options: `None` when the
    /// grant need not be durable.
    pub(crate) fn durability(&self, ttl: Duration) -> Result<Option<Durable>> {
        if self.replicas == 0 && !self.fsync {
            return Ok(None);
        }
        if self.bound {
            return Err(invalid(
                "a bound grant cannot be durable (replicas, fsync): it ends at any promotion",
            ));
        }
        let timeout = match self.durable_timeout {
            None => None,
            Some(t) => {
                let ms = u64::try_from(t.as_millis()).unwrap_or(u64::MAX);
                if ms == 0 {
                    return Err(invalid(format!(
                        "durable_timeout must be at least 1 ms, not {t:?}"
                    )));
                }
                let t = Duration::from_millis(ms);
                if t >= ttl {
                    return Err(invalid(format!(
                        "durable_timeout must be less than the ttl: {t:?} with a ttl of {ttl:?}"
                    )));
                }
                Some(t)
            }
        };
        Ok(Some(Durable {
            replicas: self.replicas,
            fsync: self.fsync,
            timeout,
        }))
    }
}

/// What a durable grant waits for (rule 10): `replicas` acknowledgments, and with `fsync` the
/// master's AOF fsync (`WAITAOF 1 replicas`), each within the durable timeout.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Durable {
    pub(crate) replicas: u32,
    pub(crate) fsync: bool,
    /// The caller's durable timeout; `None`: a third of the current ttl.
    pub(crate) timeout: Option<Duration>,
}

impl Durable {
    /// The durable timeout for a grant or renewal of `ttl`: the caller's, else a third of the
    /// ttl; at least 1 ms (`WAIT n 0` would wait for ever).
    pub(crate) fn timeout_for(&self, ttl: Duration) -> Duration {
        self.timeout
            .unwrap_or(ttl / 3)
            .max(Duration::from_millis(1))
    }
}

impl From<Duration> for LockOptions {
    fn from(ttl: Duration) -> Self {
        LockOptions::new(ttl)
    }
}

/// The ttl as the whole milliseconds the commands carry (rule 12): at least 1 ms and a whole
/// number of milliseconds (a sub-millisecond part would be cut off silently), refused here,
/// before anything is sent.
pub(crate) fn ttl_ms(ttl: Duration) -> Result<u64> {
    let ms = u64::try_from(ttl.as_millis()).unwrap_or(u64::MAX);
    if ms == 0 || !ttl.subsec_nanos().is_multiple_of(1_000_000) {
        return Err(invalid(format!(
            "ttl must be a positive whole number of milliseconds, not {ttl:?}"
        )));
    }
    Ok(ms)
}

/// The longest owner, in bytes (rule 12).
pub(crate) const MAX_OWNER_BYTES: usize = 256;

/// Rule 12: a key is a non-empty string.
pub(crate) fn check_key(key: &str) -> Result<()> {
    if key.is_empty() {
        return Err(invalid("key must be a non-empty string"));
    }
    Ok(())
}

/// Rule 12: an owner is a non-empty string of at most 256 bytes.
pub(crate) fn check_owner(owner: &str) -> Result<()> {
    if owner.is_empty() || owner.len() > MAX_OWNER_BYTES {
        return Err(invalid(format!(
            "owner must be a non-empty string of at most {MAX_OWNER_BYTES} bytes, not {} bytes",
            owner.len()
        )));
    }
    Ok(())
}

/// Rule 12: a token names a grant, so it is at least 1.
pub(crate) fn check_token(token: u64) -> Result<()> {
    if token == 0 {
        return Err(invalid("token must be a positive integer, not 0"));
    }
    Ok(())
}
