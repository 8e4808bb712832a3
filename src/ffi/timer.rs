//! Redis timers, calling a safe [`Timer`] through a trampoline.

use super::handle::Ctx;
use std::os::raw::c_void;
use std::ptr;

/// What a timer does when it fires: `data` is the number it was made with.
pub trait Timer {
    fn fire(ctx: Ctx<'_>, data: u64);
}

unsafe extern "C" fn fire<T: Timer>(
    ctx: *mut redis_module::raw::RedisModuleCtx,
    data: *mut c_void,
) {
    // SAFETY: Redis passes the timer's live context for the length of this callback.
    if let Some(ctx) = unsafe { Ctx::from_raw(ctx) } {
        // The timer's data is a number, never a pointer.
        T::fire(ctx, data as usize as u64);
    }
}

/// A Redis timer calling `T::fire(data)` after `period_ms`; 0 when none could be made.
pub fn create_timer<T: Timer>(ctx: Ctx<'_>, period_ms: i64, data: u64) -> u64 {
    // SAFETY: a live context; the callback is a plain function that Redis calls on the main
    // thread with `data`, a number (it is never dereferenced).
    unsafe {
        api!(RedisModule_CreateTimer, 0; ctx.ptr(), period_ms, Some(fire::<T>), data as usize as *mut c_void)
    }
}

/// Stop timer `id` (an id that fired or was stopped already is ignored by Redis).
pub fn stop_timer(ctx: Ctx<'_>, id: u64) {
    let mut data: *mut c_void = ptr::null_mut();
    // SAFETY: a live context; Redis looks the id up and writes the timer's data to `data`.
    unsafe { api!(RedisModule_StopTimer, 0; ctx.ptr(), id, &mut data) };
}
