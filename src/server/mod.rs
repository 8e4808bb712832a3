//! Server-wide state of the module: the token issuer, the role, the clocks, the type handle.
//!
//! Redis runs module commands, callbacks and timers on its main thread; the only other thread
//! that can reach module code is a lazy-free thread calling the type's `free` (FLUSHALL ASYNC),
//! which touches none of this but [`on_main_thread`].

use crate::api;
use crate::ffi::{self, Ctx};
use flock_core::{Now, TokenIssuer};
use redis_module::raw;
use std::cell::Cell;
use std::sync::atomic::{AtomicBool, AtomicPtr, Ordering};
use std::sync::{Mutex, MutexGuard};

static TOKENS: Mutex<TokenIssuer> = Mutex::new(TokenIssuer::new());
static IS_MASTER: AtomicBool = AtomicBool::new(true);
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
    ON_MAIN_THREAD.with(|m| m.set(true));
    LOCK_TYPE.store(lock_type, Ordering::Relaxed);
    // SAFETY: `ctx` is the context of the module's init; the detached context lives as long
    // as the module.
    let detached =
        unsafe { api!(RedisModule_GetDetachedThreadSafeContext, std::ptr::null_mut(); ctx) };
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

thread_local! {
    /// Set on the thread that loaded the module (Redis's main thread). A thread-local flag:
    /// `free` asks on every release, and `std::thread::current()` costs an `Arc` round trip.
    static ON_MAIN_THREAD: Cell<bool> = const { Cell::new(false) };
}

pub fn on_main_thread() -> bool {
    ON_MAIN_THREAD.with(Cell::get)
}

/// Whether this server is a master: only a master expires leases on its own.
pub fn is_master() -> bool {
    IS_MASTER.load(Ordering::Relaxed)
}

pub fn refresh_role(ctx: Ctx) {
    let flags = ffi::context_flags(ctx);
    IS_MASTER.store(
        flags & raw::REDISMODULE_CTX_FLAGS_MASTER != 0,
        Ordering::Relaxed,
    );
}

/// Both clocks, read once per command: the wall clock in microseconds (Redis 7.0 has no
/// module API for it; this is the same clock_gettime(CLOCK_REALTIME) Redis reads) and Redis's
/// monotonic clock.
pub fn now() -> Now {
    Now::new(wall_us(), ffi::monotonic_us())
}

/// The wall clock in microseconds since the Unix epoch (0 before it), read with one
/// `clock_gettime`: `SystemTime::now().duration_since(UNIX_EPOCH)` reads the same clock but
/// then goes through a `Result` and 128-bit arithmetic, on every command.
fn wall_us() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid timespec to write; CLOCK_REALTIME always exists on Linux.
    if unsafe { libc::clock_gettime(libc::CLOCK_REALTIME, &mut ts) } != 0 {
        return 0;
    }
    let (Ok(secs), Ok(nanos)) = (u64::try_from(ts.tv_sec), u64::try_from(ts.tv_nsec)) else {
        return 0;
    };
    secs.saturating_mul(1_000_000).saturating_add(nanos / 1000)
}

pub fn set_master(master: bool) {
    IS_MASTER.store(master, Ordering::Relaxed);
}

/// Whether anything consumes the replication stream: an AOF, replicas, or a replication
/// backlog (which replicas partially resync from). When nothing does, effects are not built
/// at all (building them costs as much as the rest of ACQUIRE). Starts true, is raised at once
/// by every event that can start a consumer (a fork for BGSAVE or replica sync, an AOF
/// rewrite, a replica change, a role or config change, loading), and lowered only by
/// [`recheck_replication`] when INFO shows none.
static REPLICATION_CONSUMED: AtomicBool = AtomicBool::new(true);

pub fn replication_consumed() -> bool {
    REPLICATION_CONSUMED.load(Ordering::Relaxed)
}

pub fn assume_replication_consumed() {
    REPLICATION_CONSUMED.store(true, Ordering::Relaxed);
}

fn info_field(ctx: Ctx, section: &std::ffi::CStr, field: &std::ffi::CStr) -> Option<i64> {
    // SAFETY: a live context (the cron's); `section` is NUL-terminated.
    let info =
        unsafe { api!(RedisModule_GetServerInfo, std::ptr::null_mut(); ctx, section.as_ptr()) };
    if info.is_null() {
        return None;
    }
    let mut err: std::os::raw::c_int = 0;
    // SAFETY: `info` is the live INFO data fetched above, freed once right after.
    let v =
        unsafe { api!(RedisModule_ServerInfoGetFieldSigned, 0; info, field.as_ptr(), &mut err) };
    // SAFETY: as above.
    unsafe { api!(RedisModule_FreeServerInfo, (); ctx, info) };
    (err == 0).then_some(v)
}

/// Look at INFO: with no AOF, no replica and no replication backlog, stop building effects.
pub fn recheck_replication(ctx: Ctx) {
    let quiet = info_field(ctx, c"persistence", c"aof_enabled") == Some(0)
        && info_field(ctx, c"replication", c"repl_backlog_active") == Some(0)
        && info_field(ctx, c"replication", c"connected_slaves") == Some(0);
    REPLICATION_CONSUMED.store(!quiet, Ordering::Relaxed);
}

/// True while clients are paused (CLIENT PAUSE, or a cluster manual failover waiting for the
/// replica's offset to match): timers and deferred jobs then wait, since effects they would
/// replicate keep the offsets from ever matching. Commands still check leases lazily.
pub fn avoid_replica_traffic() -> bool {
    // SAFETY: takes no arguments.
    unsafe { api!(RedisModule_AvoidReplicaTraffic, 0;) != 0 }
}
