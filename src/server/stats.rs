//! Counters shown in `INFO flock` (the INFO section itself is built in
//! `registration/module.rs`), and the per-class lock statistics of FLOCK.STATS (flock-core's
//! `lock_stats`).

use flock_core::lock_stats::{ClassRef, Event, Stats};
use std::cell::RefCell;
use std::sync::atomic::{AtomicU64, Ordering};

pub struct Counter(AtomicU64);

impl Counter {
    const fn new() -> Counter {
        Counter(AtomicU64::new(0))
    }
    /// Only Redis's main thread counts (commands, timers, events), so a load and a store do
    /// what an atomic add would, without its locked instruction on every grant and release;
    /// other threads (INFO is the main thread too) only ever read.
    pub fn incr(&self) {
        self.0.store(
            self.0.load(Ordering::Relaxed).wrapping_add(1),
            Ordering::Relaxed,
        );
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
/// FLOCK.MACQUIRE requests granted (at once or after waiting); each key's grant counts in
/// `GRANTS` too.
pub static MULTI_GRANTS: Counter = Counter::new();

thread_local! {
    /// FLOCK.STATS's table: per server, not persisted, not replicated. Only Redis's main
    /// thread runs the code that counts and reads it (commands, timers, keyspace and server
    /// events, INFO), so a thread-local table is the server's one table, without the lock
    /// a shared static would need (a lock and unlock cost more than the counting itself).
    /// Lazy-free threads only free records and never reach it.
    static CLASSES: RefCell<Stats> = RefCell::new(Stats::default());
}

/// Run `f` on FLOCK.STATS's table.
pub fn with_classes<R>(f: impl FnOnce(&mut Stats) -> R) -> R {
    CLASSES.with(|t| f(&mut t.borrow_mut()))
}

/// Count `event` for the lock class of `key`, whose class the lock keeps in `class` (set on
/// the first event, then used instead of the name: see `ClassRef`).
#[inline]
pub fn record(class: &mut ClassRef, key: &[u8], event: Event) {
    let max = super::config::stats_max_classes();
    with_classes(|t| t.record_for(class, key, event, max));
}
