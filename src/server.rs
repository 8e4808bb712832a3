//! Server-wide state of the module: the token issuer, the role, the clocks, the type handle.
//!
//! Redis runs module commands, callbacks and timers on its main thread; the only other thread
//! that can reach module code is a lazy-free thread calling the type's `free` (FLUSHALL ASYNC),
//! which touches none of this but [`on_main_thread`].

use crate::core::{Now, TokenIssuer};
use crate::ffi::Ctx;
use redis_module::raw;
use std::sync::atomic::{AtomicBool, AtomicPtr, Ordering};
use std::sync::{Mutex, MutexGuard, OnceLock};
use std::thread::ThreadId;

static TOKENS: Mutex<TokenIssuer> = Mutex::new(TokenIssuer::new());
static IS_MASTER: AtomicBool = AtomicBool::new(true);
static MAIN_THREAD: OnceLock<ThreadId> = OnceLock::new();
static LOCK_TYPE: AtomicPtr<raw::RedisModuleType> = AtomicPtr::new(std::ptr::null_mut());
static MODULE_CTX: AtomicPtr<raw::RedisModuleCtx> = AtomicPtr::new(std::ptr::null_mut());

/// The server-wide token issuer (G3).
pub fn tokens() -> MutexGuard<'static, TokenIssuer> {
    TOKENS
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// Called once from the module's init, on the main thread.
pub fn init(ctx: Ctx, lock_type: *mut raw::RedisModuleType) {
    let _ = MAIN_THREAD.set(std::thread::current().id());
    LOCK_TYPE.store(lock_type, Ordering::Relaxed);
    let detached = crate::rm!(RedisModule_GetDetachedThreadSafeContext, std::ptr::null_mut(); ctx);
    MODULE_CTX.store(detached, Ordering::Relaxed);
    refresh_role(ctx);
}

/// Our data type's handle, as Redis registered it.
pub fn lock_type() -> *mut raw::RedisModuleType {
    LOCK_TYPE.load(Ordering::Relaxed)
}

/// A context bound to this module, for API calls made outside a command (type callbacks).
pub fn module_ctx() -> Ctx {
    MODULE_CTX.load(Ordering::Relaxed)
}

pub fn on_main_thread() -> bool {
    MAIN_THREAD.get() == Some(&std::thread::current().id())
}

/// Whether this server is a master: only a master expires leases on its own.
pub fn is_master() -> bool {
    IS_MASTER.load(Ordering::Relaxed)
}

pub fn refresh_role(ctx: Ctx) {
    let flags = crate::ffi::context_flags(ctx);
    IS_MASTER.store(
        flags & raw::REDISMODULE_CTX_FLAGS_MASTER != 0,
        Ordering::Relaxed,
    );
}

/// Both clocks, read once per command: the wall clock in microseconds (Redis 7.0 has no
/// module API for it; this is the same clock_gettime(CLOCK_REALTIME) Redis reads) and Redis's
/// monotonic clock.
pub fn now() -> Now {
    let wall_us = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_micros()).unwrap_or(u64::MAX));
    let mono_us = crate::rm!(RedisModule_MonotonicMicroseconds, 0;);
    Now::new(wall_us, mono_us)
}

pub fn set_master(master: bool) {
    IS_MASTER.store(master, Ordering::Relaxed);
}
