//! Counters shown in `INFO flock` (the INFO section itself is built in `module.rs`).

use std::sync::atomic::{AtomicU64, Ordering};

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
