//! The module's settings: their defaults and limits (the module keeps the live values).

/// `flock.max-ttl-ms` default: one day.
pub const MAX_TTL_DEFAULT: i64 = 86_400_000;
/// The largest value `flock.max-ttl-ms` may be set to: ten years.
pub const MAX_TTL_LIMIT: i64 = 315_360_000_000;
/// `flock.max-waiters` default.
pub const MAX_WAITERS_DEFAULT: i64 = 10_000;
pub const MAX_WAITERS_LIMIT: i64 = 1_000_000_000;
/// The largest lock-delay: one day.
pub const LOCK_DELAY_LIMIT: i64 = 86_400_000;
/// A BLOCK timeout beyond this (ten years) means no limit: a huge period would wrap in the
/// server's timer arithmetic and fire at once.
pub const BLOCK_TIMEOUT_LIMIT_MS: u64 = 315_360_000_000;
