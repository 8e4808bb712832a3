//! Module configuration: `loadmodule` arguments, redis.conf `flock.*` lines and CONFIG SET,
//! all validated by flock-core's `settings`; this file holds the live values (registered by
//! `registration/config.rs`).

use flock_core::settings::{self, Setting};
use redis_module::configuration::ConfigurationContext;
use redis_module::{ConfigurationValue, RedisError};
use std::sync::atomic::{AtomicI64, Ordering};

/// One setting's value in effect. Every write goes through [`Setting::check`], so what
/// CONFIG GET shows is what the module applies.
pub struct Value {
    setting: &'static Setting,
    value: AtomicI64,
}

impl Value {
    const fn new(setting: &'static Setting) -> Value {
        Value {
            setting,
            value: AtomicI64::new(setting.default),
        }
    }

    pub fn get(&self) -> i64 {
        self.value.load(Ordering::Relaxed)
    }

    /// Set the value in effect before the config is registered (its default).
    pub fn set_default(&self, v: i64) {
        self.value.store(v, Ordering::Relaxed);
    }
}

impl ConfigurationValue<i64> for Value {
    fn get(&self, _ctx: &ConfigurationContext) -> i64 {
        Value::get(self)
    }

    fn set(&self, _ctx: &ConfigurationContext, val: i64) -> Result<(), RedisError> {
        let v = self.setting.check(val).map_err(RedisError::String)?;
        self.value.store(v, Ordering::Relaxed);
        Ok(())
    }
}

pub static MAX_TTL_MS: Value = Value::new(&settings::MAX_TTL);
pub static MAX_WAITERS: Value = Value::new(&settings::MAX_WAITERS);
pub static LOCK_DELAY_MS: Value = Value::new(&settings::LOCK_DELAY);
pub static MAX_HOLDERS: Value = Value::new(&settings::MAX_HOLDERS);
pub static PROMOTION_MARGIN_MS: Value = Value::new(&settings::PROMOTION_MARGIN);
pub static STATS_MAX_CLASSES: Value = Value::new(&settings::STATS_MAX_CLASSES);
pub static MAX_WATCHERS: Value = Value::new(&settings::MAX_WATCHERS);

/// Settings are told apart by name, not by address: they are `const`s of flock-core, and each
/// crate that takes a reference to a `const` may get its own copy, so two references to the
/// same setting need not be equal pointers.
pub fn same(a: &Setting, b: &Setting) -> bool {
    a.name == b.name
}

pub fn value_of(setting: &Setting) -> Option<&'static Value> {
    [
        &MAX_TTL_MS,
        &MAX_WAITERS,
        &LOCK_DELAY_MS,
        &MAX_HOLDERS,
        &PROMOTION_MARGIN_MS,
        &STATS_MAX_CLASSES,
        &MAX_WATCHERS,
    ]
    .into_iter()
    .find(|v| same(v.setting, setting))
}

/// `flock.max-ttl-ms`: largest ttl accepted.
pub fn max_ttl_ms() -> u64 {
    MAX_TTL_MS.get() as u64
}

/// `flock.max-waiters`: most clients waiting on one key (0: nobody may wait).
pub fn max_waiters() -> usize {
    MAX_WAITERS.get() as usize
}

/// `flock.lock-delay-ms`: after an expiry or a revoke, no grant for this long.
pub fn lock_delay_ms() -> u64 {
    LOCK_DELAY_MS.get() as u64
}

/// `flock.max-holders`: most live shared grants on one key, and the largest LIMIT.
pub fn max_holders() -> u32 {
    MAX_HOLDERS.get() as u32
}

/// `flock.promotion-margin-ms`: how far above the clock a promoted master starts its tokens.
pub fn promotion_margin_ms() -> u64 {
    PROMOTION_MARGIN_MS.get() as u64
}

/// `flock.stats-max-classes`: most lock classes FLOCK.STATS keeps.
pub fn stats_max_classes() -> usize {
    STATS_MAX_CLASSES.get() as usize
}

/// `flock.max-watchers`: most FLOCK.WATCH watchers of one key (0: nobody may watch).
pub fn max_watchers() -> usize {
    usize::try_from(MAX_WATCHERS.get()).unwrap_or(0)
}
