//! The `flocklock` Redis data type: the value stored under a lock key, and its persistence
//! callbacks (RDB, AOF rewrite, DUMP/RESTORE, COPY, MEMORY USAGE, DEBUG DIGEST), plus the
//! server-wide token high-water mark saved as RDB aux data.

use crate::core::{Deadline, Grant, LockState, MAX_OWNER_LEN, MAX_TOKEN};
use crate::{expiry, rm, server};
use redis_module::native_types::RedisType;
use redis_module::raw;
use std::os::raw::{c_char, c_int, c_void};
use std::ptr;
use std::sync::atomic::{AtomicU64, Ordering};

/// Current RDB encoding version; `rdb_load` accepts this and every older one.
pub const ENCODING_VERSION: c_int = 1;

/// The value of a lock key: the pure lock state plus this server's timer for it.
#[derive(Debug)]
pub struct LockRecord {
    pub state: LockState,
    /// Unique per record on this server: a timer acts only on the record it was armed for.
    pub id: u64,
    /// The deadline-index entry (0: none) and when it is due, on the monotonic clock.
    pub timer: u64,
    pub timer_at_us: u64,
    /// Set once clients wait for this value's key (and only then are the wait queues
    /// consulted): the key (database, name) to look at again when the value is freed
    /// (deleted, overwritten by another type, flushed, evicted).
    pub watched: Option<Box<(c_int, Vec<u8>)>>,
}

static NEXT_RECORD_ID: AtomicU64 = AtomicU64::new(1);

impl LockRecord {
    pub fn new(state: LockState) -> LockRecord {
        LockRecord {
            state,
            id: NEXT_RECORD_ID.fetch_add(1, Ordering::Relaxed),
            timer: 0,
            timer_at_us: 0,
            watched: None,
        }
    }

    pub fn boxed(state: LockState) -> *mut LockRecord {
        Box::into_raw(Box::new(LockRecord::new(state)))
    }
}

pub static LOCK_TYPE: RedisType = RedisType::new(
    "flocklock",
    ENCODING_VERSION,
    raw::RedisModuleTypeMethods {
        version: raw::REDISMODULE_TYPE_METHOD_VERSION as u64,
        rdb_load: Some(rdb_load),
        rdb_save: Some(rdb_save),
        aof_rewrite: Some(aof_rewrite),
        mem_usage: Some(mem_usage),
        digest: Some(digest),
        free: Some(free),
        aux_load: Some(aux_load),
        aux_save: Some(aux_save),
        aux_save2: None,
        aux_save_triggers: raw::REDISMODULE_AUX_BEFORE_RDB as c_int,
        free_effort: None,
        unlink: None,
        copy: Some(copy),
        defrag: None,
        copy2: None,
        free_effort2: None,
        mem_usage2: None,
        unlink2: None,
    },
);

fn record<'a>(value: *const c_void) -> Option<&'a LockRecord> {
    unsafe { value.cast::<LockRecord>().as_ref() }
}

unsafe extern "C" fn free(value: *mut c_void) {
    if value.is_null() {
        return;
    }
    let rec = unsafe { Box::from_raw(value.cast::<LockRecord>()) };
    // DEL, UNLINK, RELEASE, overwrite and a synchronous flush free on the main thread: take
    // the record out of the deadline index now (G10). A lazy-free thread (FLUSHALL ASYNC)
    // must not touch the index; the flush event already dropped those entries.
    let main_thread = server::on_main_thread();
    if rec.timer != 0 && main_thread {
        expiry::forget(rec.timer);
    }
    if let Some(key) = rec.watched {
        crate::waiters::schedule_revisit(*key, main_thread);
    }
}

unsafe extern "C" fn copy(
    _from: *mut raw::RedisModuleString,
    _to: *mut raw::RedisModuleString,
    value: *const c_void,
) -> *mut c_void {
    match record(value) {
        // The copy gets its own timer when the copy_to event arms it.
        Some(rec) => LockRecord::boxed(rec.state.clone()).cast(),
        None => ptr::null_mut(),
    }
}

unsafe extern "C" fn mem_usage(value: *const c_void) -> usize {
    match record(value) {
        Some(rec) => {
            std::mem::size_of::<LockRecord>()
                + rec.state.holder.as_ref().map_or(0, |g| g.owner.len())
                + if rec.timer != 0 {
                    expiry::TIMER_BYTES
                } else {
                    0
                }
        }
        None => 0,
    }
}

unsafe extern "C" fn digest(md: *mut raw::RedisModuleDigest, value: *mut c_void) {
    let Some(rec) = record(value) else { return };
    if let Some(g) = &rec.state.holder {
        rm!(RedisModule_DigestAddStringBuffer, (); md, g.owner.as_ptr().cast::<c_char>().cast_mut(), g.owner.len());
        rm!(RedisModule_DigestAddLongLong, (); md, g.token as i64);
        rm!(RedisModule_DigestAddLongLong, (); md, g.deadline.wall_ms);
    } else if let Some(d) = rec.state.delay {
        rm!(RedisModule_DigestAddLongLong, (); md, rec.state.last_token as i64);
        rm!(RedisModule_DigestAddLongLong, (); md, d.wall_ms);
    }
    rm!(RedisModule_DigestEndSequence, (); md);
}

// RDB layout, encoding version 1:
//   unsigned token, signed deadline (Unix ms), string owner.
// With an owner: the key is held, until the deadline. Without: nobody holds it and it is in
// lock-delay until the deadline; the token is the last one granted. Waiters are connections
// and are never saved.
unsafe extern "C" fn rdb_save(rdb: *mut raw::RedisModuleIO, value: *mut c_void) {
    let Some(rec) = record(value) else { return };
    let (token, deadline, owner): (u64, i64, &[u8]) = match &rec.state.holder {
        Some(g) => (g.token, g.deadline.wall_ms, &g.owner),
        None => (
            rec.state.last_token,
            rec.state.delay.map_or(0, |d| d.wall_ms),
            &[],
        ),
    };
    rm!(RedisModule_SaveUnsigned, (); rdb, token);
    rm!(RedisModule_SaveSigned, (); rdb, deadline);
    rm!(RedisModule_SaveStringBuffer, (); rdb, owner.as_ptr().cast::<c_char>(), owner.len());
}

unsafe extern "C" fn rdb_load(rdb: *mut raw::RedisModuleIO, encver: c_int) -> *mut c_void {
    if !(1..=ENCODING_VERSION).contains(&encver) {
        return ptr::null_mut();
    }
    let io_error = || rm!(RedisModule_IsIOError, 1; rdb) != 0;
    let token = rm!(RedisModule_LoadUnsigned, 0; rdb);
    let deadline = rm!(RedisModule_LoadSigned, 0; rdb);
    if io_error() {
        return ptr::null_mut();
    }
    let mut len = 0usize;
    let buf = rm!(RedisModule_LoadStringBuffer, ptr::null_mut(); rdb, &mut len);
    if io_error() || buf.is_null() && len > 0 {
        return ptr::null_mut();
    }
    let owner: Vec<u8> = if buf.is_null() || len == 0 {
        Vec::new()
    } else {
        unsafe { std::slice::from_raw_parts(buf.cast::<u8>(), len) }.to_vec()
    };
    if !buf.is_null() {
        rm!(RedisModule_Free, (); buf.cast());
    }
    // Refuse values no master could have written (a corrupt payload), rather than load them.
    if owner.len() > MAX_OWNER_LEN || token > MAX_TOKEN || (!owner.is_empty() && token == 0) {
        return ptr::null_mut();
    }
    server::tokens().observe(token);
    let now = server::now();
    let state = if owner.is_empty() {
        LockState::delayed(token, Deadline::from_wall(deadline, now))
    } else {
        LockState::with_grant(Grant::from_wall_deadline(&owner, token, deadline, now))
    };
    LockRecord::boxed(state).cast()
}

unsafe extern "C" fn aof_rewrite(
    aof: *mut raw::RedisModuleIO,
    key: *mut raw::RedisModuleString,
    value: *mut c_void,
) {
    let Some(rec) = record(value) else { return };
    crate::replication::emit_state(aof, key, &rec.state);
}

// Aux data: the token high-water mark, so that tokens keep growing across restarts and full
// syncs even with the wall clock set back (G3).
unsafe extern "C" fn aux_save(rdb: *mut raw::RedisModuleIO, when: c_int) {
    if when == raw::REDISMODULE_AUX_BEFORE_RDB as c_int {
        let mark = server::tokens().high_water();
        rm!(RedisModule_SaveUnsigned, (); rdb, mark);
    }
}

unsafe extern "C" fn aux_load(rdb: *mut raw::RedisModuleIO, encver: c_int, when: c_int) -> c_int {
    if !(1..=ENCODING_VERSION).contains(&encver) || when != raw::REDISMODULE_AUX_BEFORE_RDB as c_int
    {
        return raw::REDISMODULE_ERR as c_int;
    }
    let mark = rm!(RedisModule_LoadUnsigned, 0; rdb);
    if rm!(RedisModule_IsIOError, 1; rdb) != 0 || mark > MAX_TOKEN {
        return raw::REDISMODULE_ERR as c_int;
    }
    server::tokens().observe(mark);
    raw::REDISMODULE_OK as c_int
}
