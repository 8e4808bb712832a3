//! Timers on a master: every lock key is in a deadline index for its next deadline (the end
//! of its lease, or of its lock-delay), and one Redis timer is armed for the earliest.
//!
//! Redis module timers run on the monotonic clock (G9). The index (`deadlines.rs`) costs
//! O(log n) per insert and O(1) per removal, much less than a Redis timer per lock. An entry
//! keeps its key's database and a copy of its name ([`KeyName`]); the record keeps the
//! entry's handle, and a due entry acts only when it finds a record holding that same handle
//! under that name; an entry that outlived its record (flushed asynchronously, replaced) is a
//! no-op. A renewal keeps the pending entry: when it comes due early it settles nothing and
//! re-arms for the new deadline.
//!
//! Replicas arm nothing and never expire on their own: they learn expiry from the master's
//! effects. When a server becomes master (promotion, the end of loading) it scans its keyspace
//! and arms every lock.

use crate::ffi::{self, Ctx, Key, RStr};
use crate::key_name::KeyName;
use crate::record::{self, Found, TimerSlot};
use crate::{api, server};
use flock_core::deadlines::{DeadlineIndex, Due, Handle};
use flock_core::Deadline;
use redis_module::raw;
use std::os::raw::{c_int, c_void};
use std::ptr;
use std::sync::{Mutex, MutexGuard, OnceLock};

/// What an armed lock costs besides its record: its index entry (slot and heap entry, with a
/// short name inline; a longer name's copy comes on top).
pub const TIMER_BYTES: usize = DeadlineIndex::<KeyName>::ENTRY_BYTES;

/// An index entry that came due: its handle (what its record keeps, if it is still there),
/// its key's database and name.
pub struct DueKey {
    pub handle: Handle,
    pub db: c_int,
    pub name: KeyName,
}

struct Expiry {
    index: DeadlineIndex<KeyName>,
    /// The Redis timer armed for the earliest deadline (0: none), and when it fires.
    alarm: u64,
    alarm_at_us: u64,
}

// Only Redis's main thread touches the index and the key names in it.
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

/// Make the record owning `slot` due at `next` (its next deadline; `None`: never), master
/// only. `key` is the key's name in the currently selected database of `ctx`.
pub fn arm(ctx: Ctx, key: RStr, slot: &mut TimerSlot, next: Option<Deadline>) {
    arm_with(ctx, key, slot, next, false)
}

/// Like [`arm`], but always replaces a pending entry (the key was renamed, moved, swapped).
/// The record's FLOCK.STATS class is forgotten too: its next event counts for the class of
/// the name it has now.
pub fn rearm(ctx: Ctx, key: RStr, slot: &mut TimerSlot, next: Option<Deadline>) {
    slot.class = Default::default();
    arm_with(ctx, key, slot, next, true)
}

fn arm_with(ctx: Ctx, key: RStr, slot: &mut TimerSlot, next: Option<Deadline>, replace: bool) {
    if !server::is_master() {
        return;
    }
    let Some(next) = next else {
        disarm(slot);
        return;
    };
    if slot.handle != 0 && !replace && slot.at_us <= next.mono_us {
        return; // due no later than needed, and re-arms then
    }
    disarm(slot);
    let name = KeyName::new(ffi::bytes(&key));
    // Databases are numbered from 0: the group is the number's bits.
    let db = ffi::selected_db(ctx) as u32;
    slot.handle = with_expiry(|e| {
        let h = e.index.insert(next.mono_us, db, name);
        ensure_alarm(e, next.mono_us);
        h
    });
    slot.at_us = next.mono_us;
}

/// Take the record owning `slot` out of the index, if it is in.
pub fn disarm(slot: &mut TimerSlot) {
    if slot.handle != 0 {
        forget(slot.handle);
        slot.handle = 0;
        slot.at_us = 0;
    }
}

/// Remove entry `h` (a record being freed on the main thread).
pub fn forget(h: Handle) {
    let removed = with_expiry(|e| e.index.remove(h));
    drop(removed); // frees the key name outside the lock
}

/// Drop the entries of database `db` (all databases: `None`), before a flush frees their
/// records, possibly on another thread.
pub fn forget_db(db: Option<c_int>) {
    let dropped = with_expiry(|e| {
        e.index
            .drain_where(|group| db.is_none_or(|d| group == d as u32))
    });
    drop(dropped);
}

fn ensure_alarm(e: &mut Expiry, at_us: u64) {
    if e.alarm != 0 && e.alarm_at_us <= at_us {
        return;
    }
    let ctx = server::module_ctx();
    if e.alarm != 0 {
        ffi::stop_timer(ctx, e.alarm);
    }
    let now = server::now().mono_us;
    let period_ms = at_us
        .saturating_sub(now)
        .div_ceil(1000)
        .min(i64::MAX as u64) as i64;
    e.alarm = ffi::create_timer(ctx, period_ms, on_alarm, ptr::null_mut());
    e.alarm_at_us = at_us;
}

/// What to do with an entry that came due: settle its key (set once by the module's
/// registration; the mechanism never calls up into the code that runs the engine).
pub type DueHandler = fn(Ctx, &DueKey);

static ON_DUE: OnceLock<DueHandler> = OnceLock::new();

pub fn set_due_handler(handler: DueHandler) {
    let _ = ON_DUE.set(handler);
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
    if let Some(handler) = ON_DUE.get() {
        for Due {
            handle,
            group,
            item,
        } in due
        {
            let key = DueKey {
                handle,
                db: group as c_int,
                name: item,
            };
            handler(ctx, &key);
        }
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
            ffi::stop_timer(server::module_ctx(), e.alarm);
            e.alarm = 0;
        }
        due
    });
    if due {
        // SAFETY: the alarm callback, run from the cron's live context like a timer would.
        unsafe { on_alarm(ctx, ptr::null_mut()) };
    }
}

/// Arm a timer for every lock in every database (after promotion, loading or SWAPDB).
pub fn arm_all(ctx: Ctx) {
    if !server::is_master() {
        return;
    }
    // The context may be the client that ran SWAPDB (Valkey 8.1 fires the event on it):
    // leave it in the database it had selected.
    let selected = ffi::selected_db(ctx);
    let mut db: c_int = 0;
    while ffi::select_db(ctx, db) {
        // SAFETY: takes no arguments; the cursor is destroyed below.
        let cursor = unsafe { api!(RedisModule_ScanCursorCreate, ptr::null_mut();) };
        if cursor.is_null() {
            return;
        }
        // SAFETY: a live context and cursor; `arm_scanned` only touches the key it is given.
        while unsafe { api!(RedisModule_Scan, 0; ctx, cursor, Some(arm_scanned), ptr::null_mut()) }
            != 0
        {}
        // SAFETY: created above, destroyed once.
        unsafe { api!(RedisModule_ScanCursorDestroy, (); cursor) };
        db += 1;
    }
    ffi::select_db(ctx, selected);
}

unsafe extern "C" fn arm_scanned(
    ctx: Ctx,
    keyname: RStr,
    key: *mut raw::RedisModuleKey,
    _privdata: *mut c_void,
) {
    if key.is_null() {
        return;
    }
    // SAFETY: Redis passes a key handle valid during this callback.
    let mut key = unsafe { Key::borrowed(key) };
    if let Found::Lock(rec) = record::lock_of_mut(&mut key) {
        // A master that loaded, restored or was promoted holds no binding for bound grants:
        // they are not live from now on and come due at once (the engine decides).
        flock_core::engine::orphan_bound(&mut rec.state, true);
        let next = rec.state.next_deadline();
        rearm(ctx, keyname, &mut rec.timer, next);
    }
}
