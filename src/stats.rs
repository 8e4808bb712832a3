//! Counters shown in `INFO flock` (the INFO section itself is built in `module.rs`), and the
//! per-class lock statistics of FLOCK.STATS (flock-core's `lock_stats`).

use flock_core::lock_stats::{Event, Stats};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{LazyLock, Mutex, MutexGuard};

pub struct Counter(AtomicU64);

impl Counter {
    const fn new() -> Counter {
        Counter(AtomicU64::new(0))
    }
    pub fn incr(&self) {
        self.0.fetch_add(1, Ordering::Relaxed);
    }
    pub fn get(&self) -> u64 {
        self.0.load(Ordering::Relaxed)
    }
}

pub static GRANTS: Counter = Counter::new();
pub static RELEASES: Counter = Counter::new();
pub static EXPIRATIONS: Counter = Counter::new();
pub static RENEWALS: Counter = Counter::new();
pub static CONTENDED: Counter = Counter::new();
pub static REVOKES: Counter = Counter::new();
pub static BLOCKED: Counter = Counter::new();
pub static TIMEOUTS: Counter = Counter::new();
pub static FENCED_ACCEPTED: Counter = Counter::new();
pub static FENCED_REJECTED: Counter = Counter::new();
pub static FENCED_INNER_ERRORS: Counter = Counter::new();
pub static BOUND_CLOSED: Counter = Counter::new();

/// FLOCK.STATS's table: per server, not persisted, not replicated. Commands run on Redis's
/// main thread, so the lock is never contended; it is there because statics must be Sync.
static CLASSES: LazyLock<Mutex<Stats>> = LazyLock::new(|| Mutex::new(Stats::default()));

pub fn classes() -> MutexGuard<'static, Stats> {
    CLASSES.lock().unwrap_or_else(|p| p.into_inner())
}

/// Count `event` for the lock class of `key`.
#[inline]
pub fn record(key: &[u8], event: Event) {
    classes().record(key, event, crate::config::stats_max_classes());
}
