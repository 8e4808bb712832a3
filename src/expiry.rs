//! Timers on a master: one Redis timer per lock key, armed for the key's next deadline (the
//! end of its lease, or of its lock-delay).
//!
//! Redis module timers run on the monotonic clock (G9) and live in a radix tree, so arming and
//! stopping one costs O(log n). A timer owns its data (database, key name, record id) and acts
//! only when it finds that same record under that name; a timer that outlived its record
//! (flushed asynchronously, replaced) is a no-op. A renewal keeps the pending timer: when it
//! fires early it settles nothing and re-arms for the new deadline.
//!
//! Replicas arm no timers and never expire on their own: they learn expiry from the master's
//! effects. When a server becomes master (promotion, the end of loading) it scans its keyspace
//! and arms a timer for every lock.

use crate::ffi::{self, Ctx, Key, KeyKind, RStr};
use crate::lock_type::LockRecord;
use crate::{handoff, rm, server};
use redis_module::raw;
use std::os::raw::{c_int, c_void};
use std::ptr;

/// What a pending timer costs besides the lock record (its data and Redis's timer entry).
pub const TIMER_BYTES: usize = std::mem::size_of::<KeyTimer>() + 48;

pub struct KeyTimer {
    db: c_int,
    key: RStr,
    record_id: u64,
}

impl Drop for KeyTimer {
    fn drop(&mut self) {
        ffi::free_string(self.key);
    }
}

/// Make sure a timer fires at the next deadline of `rec` (master only). `key` is the key's
/// name in the currently selected database of `ctx`.
pub fn arm(ctx: Ctx, key: RStr, rec: &mut LockRecord) {
    arm_with(ctx, key, rec, false)
}

/// Like [`arm`], but always replaces a pending timer (the key was renamed, moved, swapped).
pub fn rearm(ctx: Ctx, key: RStr, rec: &mut LockRecord) {
    arm_with(ctx, key, rec, true)
}

fn arm_with(ctx: Ctx, key: RStr, rec: &mut LockRecord, replace: bool) {
    if !server::is_master() {
        return;
    }
    let Some(next) = rec.state.next_deadline() else {
        disarm(ctx, rec);
        return;
    };
    if rec.timer != 0 && !replace && rec.timer_at_us <= next.mono_us {
        return; // fires no later than needed, and re-arms then
    }
    disarm(ctx, rec);
    let timer = Box::new(KeyTimer {
        db: rm!(RedisModule_GetSelectedDb, 0; ctx),
        key: ffi::hold_string(key),
        record_id: rec.id,
    });
    let now = server::now();
    rec.timer = start(ctx, next.remaining_us(now), timer);
    rec.timer_at_us = next.mono_us;
}

/// Stop the pending timer of `rec`, if any.
pub fn disarm(ctx: Ctx, rec: &mut LockRecord) {
    if rec.timer != 0 {
        stop(ctx, rec.timer);
        rec.timer = 0;
        rec.timer_at_us = 0;
    }
}

fn start(ctx: Ctx, after_us: u64, timer: Box<KeyTimer>) -> u64 {
    let period_ms = after_us.div_ceil(1000).min(i64::MAX as u64) as i64;
    let data = Box::into_raw(timer);
    let id = rm!(RedisModule_CreateTimer, 0; ctx, period_ms, Some(on_timer), data.cast());
    if id == 0 {
        // Not armed: take the data back; lazy expiry still applies.
        drop(unsafe { Box::from_raw(data) });
    }
    id
}

/// Stop timer `id` and free its data (no-op when it already fired).
pub fn stop(ctx: Ctx, id: u64) {
    if ctx.is_null() {
        return;
    }
    let mut data: *mut c_void = ptr::null_mut();
    let ok = rm!(RedisModule_StopTimer, raw::REDISMODULE_ERR as c_int; ctx, id, &mut data);
    if ok == raw::REDISMODULE_OK as c_int && !data.is_null() {
        drop(unsafe { Box::from_raw(data.cast::<KeyTimer>()) });
    }
}

unsafe extern "C" fn on_timer(ctx: Ctx, data: *mut c_void) {
    if data.is_null() {
        return;
    }
    let timer = unsafe { Box::from_raw(data.cast::<KeyTimer>()) };
    if rm!(RedisModule_SelectDb, raw::REDISMODULE_ERR as c_int; ctx, timer.db)
        != raw::REDISMODULE_OK as c_int
    {
        return;
    }
    let key = Key::open(ctx, timer.key, true);
    if !matches!(key.kind(server::lock_type()), KeyKind::Ours) {
        return;
    }
    let Some(rec) = (unsafe { key.value::<LockRecord>().as_mut() }) else {
        return;
    };
    if rec.id != timer.record_id {
        return; // a timer that outlived its record
    }
    rec.timer = 0;
    rec.timer_at_us = 0;
    if server::is_master() {
        handoff::settle(ctx, timer.key, &key, rec, server::now(), false);
    }
}

/// Arm a timer for every lock in every database (after promotion, loading or SWAPDB).
pub fn arm_all(ctx: Ctx) {
    if !server::is_master() {
        return;
    }
    let mut db: c_int = 0;
    while rm!(RedisModule_SelectDb, raw::REDISMODULE_ERR as c_int; ctx, db)
        == raw::REDISMODULE_OK as c_int
    {
        let cursor = rm!(RedisModule_ScanCursorCreate, ptr::null_mut(););
        if cursor.is_null() {
            return;
        }
        while rm!(RedisModule_Scan, 0; ctx, cursor, Some(arm_scanned), ptr::null_mut()) != 0 {}
        rm!(RedisModule_ScanCursorDestroy, (); cursor);
        db += 1;
    }
    rm!(RedisModule_SelectDb, 0; ctx, 0);
}

unsafe extern "C" fn arm_scanned(
    ctx: Ctx,
    keyname: RStr,
    key: *mut raw::RedisModuleKey,
    _privdata: *mut c_void,
) {
    if key.is_null()
        || rm!(RedisModule_ModuleTypeGetType, ptr::null_mut(); key) != server::lock_type()
    {
        return;
    }
    let value = rm!(RedisModule_ModuleTypeGetValue, ptr::null_mut(); key).cast::<LockRecord>();
    if let Some(rec) = unsafe { value.as_mut() } {
        rearm(ctx, keyname, rec);
    }
}
