//! Module configuration: the live values of the settings (module arguments at load time,
//! CONFIG GET/SET flock.<name> later). Defaults and limits are flock-core's.

use flock_core::config::{LOCK_DELAY_LIMIT, MAX_TTL_DEFAULT, MAX_TTL_LIMIT, MAX_WAITERS_DEFAULT, MAX_WAITERS_LIMIT};
use std::sync::atomic::{AtomicI64, Ordering};

/// `flock.max-ttl-ms`: largest ttl accepted.
pub static MAX_TTL_MS: AtomicI64 = AtomicI64::new(MAX_TTL_DEFAULT);
/// `flock.max-waiters`: most clients waiting on one key (0: nobody may wait).
pub static MAX_WAITERS: AtomicI64 = AtomicI64::new(MAX_WAITERS_DEFAULT);
/// `flock.lock-delay-ms`: after an expiry or a revoke, no grant for this long.
pub static LOCK_DELAY_MS: AtomicI64 = AtomicI64::new(0);

pub fn max_ttl_ms() -> u64 {
    MAX_TTL_MS.load(Ordering::Relaxed).clamp(1, MAX_TTL_LIMIT) as u64
}

pub fn max_waiters() -> usize {
    MAX_WAITERS
        .load(Ordering::Relaxed)
        .clamp(0, MAX_WAITERS_LIMIT) as usize
}

pub fn lock_delay_ms() -> u64 {
    LOCK_DELAY_MS
        .load(Ordering::Relaxed)
        .clamp(0, LOCK_DELAY_LIMIT) as u64
}
