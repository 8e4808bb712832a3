//! Timers on a master: every lock key is in a deadline index for its next deadline (the end
//! of its lease, or of its lock-delay), and one Redis timer is armed for the earliest.
//!
//! Redis module timers run on the monotonic clock (G9). The index (`deadlines.rs`) costs
//! O(log n) per insert with no allocation and O(1) per removal, much less than a Redis timer
//! per lock. An entry owns its key reference (database, key name, record id) and acts only
//! when it finds that same record under that name; an entry that outlived its record
//! (flushed asynchronously, replaced) is a no-op. A renewal keeps the pending entry: when it
//! comes due early it settles nothing and re-arms for the new deadline.
//!
//! Replicas arm nothing and never expire on their own: they learn expiry from the master's
//! effects. When a server becomes master (promotion, the end of loading) it scans its keyspace
//! and arms every lock.

use crate::deadlines::{DeadlineIndex, Handle};
use crate::ffi::{self, Ctx, Key, KeyKind, RStr};
use crate::lock_type::LockRecord;
use crate::{handoff, rm, server};
use redis_module::raw;
use std::os::raw::{c_int, c_void};
use std::ptr;
use std::sync::{Mutex, MutexGuard};

/// What an armed lock costs besides its record (index slot, heap entry, key reference).
pub const TIMER_BYTES: usize = std::mem::size_of::<KeyRef>() + 48;

pub struct KeyRef {
    db: c_int,
    key: RStr,
    record_id: u64,
}

impl Drop for KeyRef {
    fn drop(&mut self) {
        ffi::free_string(self.key);
    }
}

struct Expiry {
    index: DeadlineIndex<KeyRef>,
    /// The Redis timer armed for the earliest deadline (0: none), and when it fires.
    alarm: u64,
    alarm_at_us: u64,
}

// Only Redis's main thread touches the index and the key references in it.
unsafe impl Send for Expiry {}

static EXPIRY: Mutex<Option<Expiry>> = Mutex::new(None);

fn expiry() -> MutexGuard<'static, Option<Expiry>> {
    EXPIRY.lock().unwrap_or_else(|p| p.into_inner())
}

fn with_expiry<R>(f: impl FnOnce(&mut Expiry) -> R) -> R {
    let mut guard = expiry();
    let e = guard.get_or_insert_with(|| Expiry {
        index: DeadlineIndex::default(),
        alarm: 0,
        alarm_at_us: 0,
    });
    f(e)
}

/// Make sure `rec` is due at its next deadline (master only). `key` is the key's name in the
/// currently selected database of `ctx`.
pub fn arm(ctx: Ctx, key: RStr, rec: &mut LockRecord) {
    arm_with(ctx, key, rec, false)
}

/// Like [`arm`], but always replaces a pending entry (the key was renamed, moved, swapped).
pub fn rearm(ctx: Ctx, key: RStr, rec: &mut LockRecord) {
    arm_with(ctx, key, rec, true)
}

fn arm_with(ctx: Ctx, key: RStr, rec: &mut LockRecord, replace: bool) {
    if !server::is_master() {
        return;
    }
    let Some(next) = rec.state.next_deadline() else {
        disarm(rec);
        return;
    };
    if rec.timer != 0 && !replace && rec.timer_at_us <= next.mono_us {
        return; // due no later than needed, and re-arms then
    }
    disarm(rec);
    let key_ref = KeyRef {
        db: rm!(RedisModule_GetSelectedDb, 0; ctx),
        key: ffi::hold_string(key),
        record_id: rec.id,
    };
    rec.timer = with_expiry(|e| {
        let h = e.index.insert(next.mono_us, key_ref);
        ensure_alarm(e, next.mono_us);
        h
    });
    rec.timer_at_us = next.mono_us;
}

/// Take `rec` out of the index, if it is in.
pub fn disarm(rec: &mut LockRecord) {
    if rec.timer != 0 {
        forget(rec.timer);
        rec.timer = 0;
        rec.timer_at_us = 0;
    }
}

/// Remove entry `h` (a record being freed on the main thread).
pub fn forget(h: Handle) {
    let removed = with_expiry(|e| e.index.remove(h));
    drop(removed); // frees the key reference outside the lock
}

/// Drop the entries of database `db` (all databases: `None`), before a flush frees their
/// records, possibly on another thread.
pub fn forget_db(db: Option<c_int>) {
    let dropped = with_expiry(|e| e.index.drain_where(|k| db.is_none_or(|d| k.db == d)));
    drop(dropped);
}

fn ensure_alarm(e: &mut Expiry, at_us: u64) {
    if e.alarm != 0 && e.alarm_at_us <= at_us {
        return;
    }
    let ctx = server::module_ctx();
    if e.alarm != 0 {
        let mut data: *mut c_void = ptr::null_mut();
        rm!(RedisModule_StopTimer, 0; ctx, e.alarm, &mut data);
    }
    let now = server::now().mono_us;
    let period_ms = at_us
        .saturating_sub(now)
        .div_ceil(1000)
        .min(i64::MAX as u64) as i64;
    e.alarm = rm!(RedisModule_CreateTimer, 0; ctx, period_ms, Some(on_alarm), ptr::null_mut());
    e.alarm_at_us = at_us;
}

/// While clients are paused, due entries wait this long and are looked at again.
const PAUSED_RETRY_US: u64 = 10_000;

unsafe extern "C" fn on_alarm(ctx: Ctx, _data: *mut c_void) {
    let now = server::now();
    if server::avoid_replica_traffic() {
        with_expiry(|e| {
            e.alarm = 0;
            ensure_alarm(e, now.mono_us + PAUSED_RETRY_US);
        });
        return;
    }
    let due = with_expiry(|e| {
        e.alarm = 0;
        e.index.pop_due(now.mono_us)
    });
    for key_ref in due {
        settle_due(ctx, &key_ref);
    }
    with_expiry(|e| {
        if let Some(next) = e.index.next() {
            ensure_alarm(e, next);
        }
    });
}

/// From the cron event (every 100 ms at hz 10): a backstop for the alarm. Redis 7.0 and
/// Valkey key module timers by the wall clock, so after the wall clock steps back the alarm
/// fires late; the index is on the monotonic clock, and this catches what is due.
pub fn on_cron(ctx: Ctx) {
    let now = server::now().mono_us;
    let due = with_expiry(|e| {
        let due = e.index.next().is_some_and(|next| next <= now);
        if due && e.alarm != 0 {
            // The alarm is late: replace it (on_alarm arms a new one for what is left).
            let mut data: *mut c_void = ptr::null_mut();
            rm!(RedisModule_StopTimer, 0; server::module_ctx(), e.alarm, &mut data);
            e.alarm = 0;
        }
        due
    });
    if due {
        unsafe { on_alarm(ctx, ptr::null_mut()) };
    }
}

fn settle_due(ctx: Ctx, key_ref: &KeyRef) {
    if rm!(RedisModule_SelectDb, raw::REDISMODULE_ERR as c_int; ctx, key_ref.db)
        != raw::REDISMODULE_OK as c_int
    {
        return;
    }
    let key = Key::open(ctx, key_ref.key, true);
    if !matches!(key.kind(server::lock_type()), KeyKind::Ours) {
        return;
    }
    let Some(rec) = (unsafe { key.value::<LockRecord>().as_mut() }) else {
        return;
    };
    if rec.id != key_ref.record_id {
        return; // an entry that outlived its record
    }
    rec.timer = 0;
    rec.timer_at_us = 0;
    if server::is_master() {
        handoff::settle(ctx, key_ref.key, &key, rec, server::now(), false);
    }
}

/// Arm a timer for every lock in every database (after promotion, loading or SWAPDB).
pub fn arm_all(ctx: Ctx) {
    if !server::is_master() {
        return;
    }
    // The context may be the client that ran SWAPDB (Valkey 8.1 fires the event on it):
    // leave it in the database it had selected.
    let selected = rm!(RedisModule_GetSelectedDb, 0; ctx);
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
    rm!(RedisModule_SelectDb, 0; ctx, selected);
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
