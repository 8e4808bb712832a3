//! Server-wide calls: both clocks, the module's detached context, INFO fields, whether
//! clients are paused, whether a client id is a connection.

use super::handle::Ctx;
use flock_core::Now;
use redis_module::raw;
use std::ffi::CStr;
use std::os::raw::c_int;
use std::ptr;
use std::sync::atomic::{AtomicPtr, Ordering};

static MODULE_CTX: AtomicPtr<raw::RedisModuleCtx> = AtomicPtr::new(ptr::null_mut());

/// Make the module's detached context (from the init context, once).
pub fn init_module_ctx(ctx: Ctx<'_>) {
    // SAFETY: `ctx` is the context of the module's init; the detached context lives as long
    // as the module.
    let detached =
        unsafe { api!(RedisModule_GetDetachedThreadSafeContext, ptr::null_mut(); ctx.ptr()) };
    MODULE_CTX.store(detached, Ordering::Relaxed);
}

/// A context bound to this module, for API calls made outside a command (timers started
/// from type callbacks, events); `None` before the module's init made it.
#[inline]
pub fn module_ctx() -> Option<Ctx<'static>> {
    // SAFETY: null or the detached context, which lives as long as the module.
    unsafe { Ctx::from_raw(MODULE_CTX.load(Ordering::Relaxed)) }
}

/// Redis's monotonic clock, in microseconds.
#[inline]
pub fn monotonic_us() -> u64 {
    // SAFETY: takes no arguments.
    unsafe { api!(RedisModule_MonotonicMicroseconds, 0;) }
}

/// Both clocks, read once per command: the wall clock in microseconds (Redis 7.0 has no
/// module API for it; this is the same clock_gettime(CLOCK_REALTIME) Redis reads) and Redis's
/// monotonic clock.
#[inline]
pub fn now() -> Now {
    Now::new(wall_us(), monotonic_us())
}

/// The wall clock in microseconds since the Unix epoch (0 before it), read with one
/// `clock_gettime`: `SystemTime::now().duration_since(UNIX_EPOCH)` reads the same clock but
/// then goes through a `Result` and 128-bit arithmetic, on every command.
#[inline]
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

/// The signed INFO field `field` of `section` (`None`: no such field).
pub fn server_info_field(ctx: Ctx<'_>, section: &CStr, field: &CStr) -> Option<i64> {
    // SAFETY: a live context (the cron's); `section` is NUL-terminated.
    let info =
        unsafe { api!(RedisModule_GetServerInfo, ptr::null_mut(); ctx.ptr(), section.as_ptr()) };
    if info.is_null() {
        return None;
    }
    let mut err: c_int = 0;
    // SAFETY: `info` is the live INFO data fetched above, freed once right after.
    let v =
        unsafe { api!(RedisModule_ServerInfoGetFieldSigned, 0; info, field.as_ptr(), &mut err) };
    // SAFETY: as above.
    unsafe { api!(RedisModule_FreeServerInfo, (); ctx.ptr(), info) };
    (err == 0).then_some(v)
}

/// True while clients are paused (`RedisModule_AvoidReplicaTraffic`).
pub fn avoid_replica_traffic() -> bool {
    // SAFETY: takes no arguments.
    unsafe { api!(RedisModule_AvoidReplicaTraffic, 0;) != 0 }
}

/// Whether `id` is a client in the server's client table (a real connection).
pub fn is_connected_client(id: u64) -> bool {
    // SAFETY: a null info pointer only asks whether the id is a connected client.
    let known = unsafe {
        api!(RedisModule_GetClientInfoById, raw::REDISMODULE_ERR as c_int; ptr::null_mut(), id)
    };
    known == raw::REDISMODULE_OK as c_int
}

/// The string INFO field `field` of `section` (`None`: no such field).
pub fn server_info_text(ctx: Ctx<'_>, section: &CStr, field: &CStr) -> Option<String> {
    // SAFETY: a live context; `section` is NUL-terminated.
    let info =
        unsafe { api!(RedisModule_GetServerInfo, ptr::null_mut(); ctx.ptr(), section.as_ptr()) };
    if info.is_null() {
        return None;
    }
    // SAFETY: `info` is the live INFO data fetched above; the returned C string lives as long
    // as `info`, and is copied before `info` is freed (once, right after).
    let text = unsafe {
        let v = api!(RedisModule_ServerInfoGetFieldC, ptr::null(); info, field.as_ptr());
        (!v.is_null()).then(|| CStr::from_ptr(v).to_string_lossy().into_owned())
    };
    // SAFETY: as above.
    unsafe { api!(RedisModule_FreeServerInfo, (); ctx.ptr(), info) };
    text
}

/// The server's version as `0x00MMmmpp` (Valkey's own number on Valkey; 0 when unknown).
pub fn server_version() -> i32 {
    // SAFETY: takes no arguments.
    unsafe { api!(RedisModule_GetServerVersion, 0;) }
}
