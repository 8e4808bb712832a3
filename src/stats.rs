//! Counters shown in `INFO flock`.

use crate::rm;
use redis_module::raw;
use std::os::raw::c_char;
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

/// The `INFO flock` section (fields appear as `flock_<name>`).
pub unsafe extern "C" fn info(ctx: *mut raw::RedisModuleInfoCtx, _for_crash_report: i32) {
    rm!(RedisModule_InfoAddSection, 0; ctx, c"".as_ptr());
    let fields: [(&std::ffi::CStr, u64); 14] = [
        (c"grants", GRANTS.get()),
        (c"releases", RELEASES.get()),
        (c"expirations", EXPIRATIONS.get()),
        (c"revokes", REVOKES.get()),
        (c"renewals", RENEWALS.get()),
        (c"contended_acquires", CONTENDED.get()),
        (c"blocked_acquires", BLOCKED.get()),
        (c"blocked_clients", crate::waiters::blocked_now() as u64),
        (c"timeouts", TIMEOUTS.get()),
        (c"fenced_accepted", FENCED_ACCEPTED.get()),
        (c"fenced_rejected", FENCED_REJECTED.get()),
        (c"fenced_inner_errors", FENCED_INNER_ERRORS.get()),
        (c"token_high_water", crate::server::tokens().high_water()),
        (
            c"replicating_effects",
            crate::server::replication_consumed() as u64,
        ),
    ];
    for (name, value) in fields {
        rm!(RedisModule_InfoAddFieldULongLong, 0; ctx, name.as_ptr() as *const c_char, value);
    }
}
