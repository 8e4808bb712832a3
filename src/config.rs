//! Module configuration: `flock.max-ttl-ms` (module argument and CONFIG GET/SET).

use std::sync::atomic::{AtomicI64, Ordering};

pub const MAX_TTL_DEFAULT: i64 = 86_400_000;
/// The largest value `flock.max-ttl-ms` may be set to: ten years.
pub const MAX_TTL_LIMIT: i64 = 315_360_000_000;

pub static MAX_TTL_MS: AtomicI64 = AtomicI64::new(MAX_TTL_DEFAULT);

pub fn max_ttl_ms() -> u64 {
    MAX_TTL_MS.load(Ordering::Relaxed).clamp(1, MAX_TTL_LIMIT) as u64
}
