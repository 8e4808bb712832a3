//! Active lease expiry on a master: one Redis timer per held lock.
//!
//! Redis module timers run on the monotonic clock (G9) and live in a radix tree, so arming and
//! stopping one costs O(log n). A timer owns its data (database, key name, token) and checks,
//! when it fires, that the key still holds a grant with that token: a timer that outlived its
//! lock (renamed, flushed asynchronously, replaced) is a no-op. A renewal keeps the timer: when
//! it fires early it re-arms itself for the rest of the lease.
//!
//! Replicas arm no timers and never expire on their own: they learn expiry from the master's
//! `DEL`. When a server becomes master (promotion, or the end of loading) it scans its keyspace
//! and arms a timer for every lock.

use crate::ffi::{self, Ctx, Key, KeyKind, RStr};
use crate::lock_type::LockRecord;
use crate::{replication, rm, server, stats};
use redis_module::raw;
use std::os::raw::{c_char, c_int, c_void};
use std::ptr;

/// What a pending timer costs besides the lock record (its data and Redis's timer entry).
pub const TIMER_BYTES: usize = std::mem::size_of::<ExpiryTimer>() + 48;

pub struct ExpiryTimer {
    db: c_int,
    key: RStr,
    token: u64,
}

impl Drop for ExpiryTimer {
    fn drop(&mut self) {
        ffi::free_string(self.key);
    }
}

/// Make sure a timer will fire when the lease of `rec` ends (master only).
/// `key` is the key's name in the currently selected database of `ctx`.
pub fn arm(ctx: Ctx, key: RStr, rec: &mut LockRecord) {
    arm_with(ctx, key, rec, false)
}

/// Like [`arm`], but replaces a pending timer (the key was renamed or moved).
pub fn rearm(ctx: Ctx, key: RStr, rec: &mut LockRecord) {
    arm_with(ctx, key, rec, true)
}

fn arm_with(ctx: Ctx, key: RStr, rec: &mut LockRecord, replace: bool) {
    if !server::is_master() {
        return;
    }
    let Some(grant) = rec.state.holder.as_ref() else {
        disarm(ctx, rec);
        return;
    };
    if rec.timer != 0 && rec.timer_token == grant.token && !replace {
        return;
    }
    let token = grant.token;
    let remaining_us = grant.remaining_us(server::now());
    disarm(ctx, rec);
    let timer = Box::new(ExpiryTimer {
        db: rm!(RedisModule_GetSelectedDb, 0; ctx),
        key: ffi::hold_string(key),
        token,
    });
    rec.timer = start(ctx, remaining_us, timer);
    rec.timer_token = token;
}

/// Stop the pending timer of `rec`, if any.
pub fn disarm(ctx: Ctx, rec: &mut LockRecord) {
    if rec.timer != 0 {
        stop(ctx, rec.timer);
        rec.timer = 0;
        rec.timer_token = 0;
    }
}

fn start(ctx: Ctx, after_us: u64, timer: Box<ExpiryTimer>) -> u64 {
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
        drop(unsafe { Box::from_raw(data.cast::<ExpiryTimer>()) });
    }
}

unsafe extern "C" fn on_timer(ctx: Ctx, data: *mut c_void) {
    if data.is_null() {
        return;
    }
    let timer = unsafe { Box::from_raw(data.cast::<ExpiryTimer>()) };
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
    if rec.state.holder.as_ref().map(|g| g.token) != Some(timer.token) {
        return; // a timer that outlived its grant
    }
    rec.timer = 0;
    rec.timer_token = 0;
    if !server::is_master() {
        return;
    }
    let now = server::now();
    match rec.state.holder.as_ref() {
        Some(g) if g.is_live(now) => {
            // Renewed since this timer was armed: wait for the rest of the lease.
            let (remaining, token) = (g.remaining_us(now), g.token);
            rec.timer = start(ctx, remaining, timer);
            rec.timer_token = if rec.timer != 0 { token } else { 0 };
        }
        _ => {
            reap(ctx, timer.key, &key, rec, now);
        }
    }
}

/// End the grant of `rec` if its lease ran out (master only): count it, notify
/// `flock.expired`, and when nothing is left remove the key and replicate that.
/// Returns true when the key was deleted (then `rec` is gone: do not touch it).
pub fn reap(ctx: Ctx, key_name: RStr, key: &Key, rec: &mut LockRecord, now: crate::core::Now) -> bool {
    if !server::is_master() || rec.state.expire(now).is_none() {
        return false;
    }
    stats::EXPIRATIONS.incr();
    ffi::notify(ctx, "flock.expired\0", key_name);
    if rec.state.is_vacant(now) {
        replication::delete(ctx, key_name);
        key.delete();
        return true;
    }
    false
}

/// Arm a timer for every lock in every database (after promotion or loading).
pub fn arm_all(ctx: Ctx) {
    if !server::is_master() {
        return;
    }
    let mut db: c_int = 0;
    while rm!(RedisModule_SelectDb, raw::REDISMODULE_ERR as c_int; ctx, db) == raw::REDISMODULE_OK as c_int {
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

/// Keyspace events that put a lock under a new name, database or value (RESTORE, COPY,
/// RENAME, MOVE): arm its timer there.
pub unsafe extern "C" fn on_keyspace_event(
    ctx: Ctx,
    _type: c_int,
    event: *const c_char,
    key: RStr,
) -> c_int {
    if event.is_null() || !server::is_master() {
        return raw::REDISMODULE_OK as c_int;
    }
    let event = unsafe { std::ffi::CStr::from_ptr(event) }.to_bytes();
    if !matches!(event, b"restore" | b"copy_to" | b"rename_to" | b"move_to") {
        return raw::REDISMODULE_OK as c_int;
    }
    let k = Key::open(ctx, key, false);
    if matches!(k.kind(server::lock_type()), KeyKind::Ours) {
        if let Some(rec) = unsafe { k.value::<LockRecord>().as_mut() } {
            rearm(ctx, key, rec);
        }
    }
    raw::REDISMODULE_OK as c_int
}
