//! What a caller asks for: the lease length, how long to wait, the kind of grant (exclusive,
//! shared, permits), bound or not, the watchdog, the owner. Plain values: nothing here talks
//! to a server.

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
/// random 128-bit owner.
#[derive(Clone, Debug)]
pub struct LockOptions {
    pub(crate) ttl: Duration,
    pub(crate) wait: Wait,
    pub(crate) mode: Mode,
    pub(crate) bound: bool,
    pub(crate) renew: bool,
    pub(crate) owner: Option<String>,
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
}

impl From<Duration> for LockOptions {
    fn from(ttl: Duration) -> Self {
        LockOptions::new(ttl)
    }
}

/// The ttl as the whole milliseconds the commands carry; less than 1 ms is refused here,
/// before anything is sent.
pub(crate) fn ttl_ms(ttl: Duration) -> Result<u64> {
    let ms = u64::try_from(ttl.as_millis()).unwrap_or(u64::MAX);
    if ms == 0 {
        return Err(invalid("ttl must be at least 1 ms", format!("{ttl:?}")));
    }
    Ok(ms)
}
