//! The `flocklock` Redis data type's callbacks: persistence (RDB, AOF rewrite, DUMP/RESTORE),
//! COPY, MEMORY USAGE, DEBUG DIGEST, free, and the server-wide token high-water mark saved as
//! RDB aux data. What a lock looks like on disk is flock-core's [`Snapshot`].

use crate::record::LockRecord;
use crate::{api, expiry, jobs, replication, server};
use flock_core::{engine, Snapshot, MAX_TOKEN};
use redis_module::native_types::RedisType;
use redis_module::raw;
use std::os::raw::{c_char, c_int, c_void};
use std::ptr;

/// Current RDB encoding version; `rdb_load` accepts this and every older one.
pub const ENCODING_VERSION: c_int = 1;

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

/// The record behind a value pointer Redis hands to a callback of our type.
///
/// # Safety
/// `value` must be null or a value of this type (a `LockRecord` boxed by this module) that
/// Redis keeps alive during the callback, which is what `'a` stands for.
unsafe fn record<'a>(value: *const c_void) -> Option<&'a LockRecord> {
    // SAFETY: by the caller.
    unsafe { value.cast::<LockRecord>().as_ref() }
}

unsafe extern "C" fn free(value: *mut c_void) {
    if value.is_null() {
        return;
    }
    // SAFETY: Redis frees each value of our type once; we boxed it.
    let rec = unsafe { Box::from_raw(value.cast::<LockRecord>()) };
    // DEL, UNLINK, RELEASE, overwrite and a synchronous flush free on the main thread: take
    // the record out of the deadline index now (G10). A lazy-free thread (FLUSHALL ASYNC)
    // must not touch the index; the flush event already dropped those entries.
    let main_thread = server::on_main_thread();
    if rec.timer.handle != 0 && main_thread {
        expiry::forget(rec.timer.handle);
    }
    if let Some(key) = rec.watched {
        jobs::schedule_revisit(*key, main_thread);
    }
}

unsafe extern "C" fn copy(
    _from: *mut raw::RedisModuleString,
    _to: *mut raw::RedisModuleString,
    value: *const c_void,
) -> *mut c_void {
    // SAFETY: Redis passes a live value of our type.
    match unsafe { record(value) } {
        // The copy gets its own timer when the copy_to event arms it.
        Some(rec) => LockRecord::boxed(rec.state.clone()).cast(),
        None => ptr::null_mut(),
    }
}

unsafe extern "C" fn mem_usage(value: *const c_void) -> usize {
    // SAFETY: Redis passes a live value of our type.
    match unsafe { record(value) } {
        Some(rec) => {
            std::mem::size_of::<LockRecord>()
                + rec.state.holder.as_ref().map_or(0, |g| g.owner.len())
                + if rec.timer.handle != 0 {
                    expiry::TIMER_BYTES
                } else {
                    0
                }
        }
        None => 0,
    }
}

unsafe extern "C" fn digest(md: *mut raw::RedisModuleDigest, value: *mut c_void) {
    // SAFETY: Redis passes a live value of our type.
    let Some(rec) = (unsafe { record(value) }) else {
        return;
    };
    // SAFETY (every call below): `md` is the digest Redis passed; the buffers outlive the
    // calls.
    match Snapshot::of(&rec.state) {
        Some(Snapshot::Held {
            owner,
            token,
            deadline_wall_ms,
        }) => unsafe {
            api!(RedisModule_DigestAddStringBuffer, (); md, owner.as_ptr().cast::<c_char>().cast_mut(), owner.len());
            api!(RedisModule_DigestAddLongLong, (); md, token as i64);
            api!(RedisModule_DigestAddLongLong, (); md, deadline_wall_ms);
        },
        Some(Snapshot::Delayed {
            last_token,
            until_wall_ms,
        }) => unsafe {
            api!(RedisModule_DigestAddLongLong, (); md, last_token as i64);
            api!(RedisModule_DigestAddLongLong, (); md, until_wall_ms);
        },
        None => {}
    }
    // SAFETY: as above.
    unsafe { api!(RedisModule_DigestEndSequence, (); md) };
}

unsafe extern "C" fn rdb_save(rdb: *mut raw::RedisModuleIO, value: *mut c_void) {
    // SAFETY: Redis passes a live value of our type.
    let Some(rec) = (unsafe { record(value) }) else {
        return;
    };
    let (token, deadline, owner) = Snapshot::rdb_fields(&rec.state);
    // SAFETY: `rdb` is the handle Redis passed; the owner buffer outlives the call.
    unsafe {
        api!(RedisModule_SaveUnsigned, (); rdb, token);
        api!(RedisModule_SaveSigned, (); rdb, deadline);
        api!(RedisModule_SaveStringBuffer, (); rdb, owner.as_ptr().cast::<c_char>(), owner.len());
    }
}

unsafe extern "C" fn rdb_load(rdb: *mut raw::RedisModuleIO, encver: c_int) -> *mut c_void {
    if !(1..=ENCODING_VERSION).contains(&encver) {
        return ptr::null_mut();
    }
    // SAFETY (every call in this function): `rdb` is the handle Redis passed; with
    // HANDLE_IO_ERRORS set, a failed read returns 0/null and raises the IO error flag.
    let io_error = || unsafe { api!(RedisModule_IsIOError, 1; rdb) } != 0;
    let token = unsafe { api!(RedisModule_LoadUnsigned, 0; rdb) };
    let deadline = unsafe { api!(RedisModule_LoadSigned, 0; rdb) };
    if io_error() {
        return ptr::null_mut();
    }
    let mut len = 0usize;
    let buf = unsafe { api!(RedisModule_LoadStringBuffer, ptr::null_mut(); rdb, &mut len) };
    if io_error() || buf.is_null() && len > 0 {
        return ptr::null_mut();
    }
    let owner: Vec<u8> = if buf.is_null() || len == 0 {
        Vec::new()
    } else {
        // SAFETY: Redis allocated `len` bytes for us (freed just below).
        unsafe { std::slice::from_raw_parts(buf.cast::<u8>(), len) }.to_vec()
    };
    if !buf.is_null() {
        unsafe { api!(RedisModule_Free, (); buf.cast()) };
    }
    // Refuse values no master could have written (a corrupt payload), rather than load them.
    let Ok(snapshot) = Snapshot::from_rdb(token, deadline, &owner) else {
        return ptr::null_mut();
    };
    let state = engine::load(snapshot, server::now(), &mut server::tokens());
    LockRecord::boxed(state).cast()
}

unsafe extern "C" fn aof_rewrite(
    aof: *mut raw::RedisModuleIO,
    key: *mut raw::RedisModuleString,
    value: *mut c_void,
) {
    // SAFETY: Redis passes a live value of our type.
    let Some(rec) = (unsafe { record(value) }) else {
        return;
    };
    if let Some(snapshot) = Snapshot::of(&rec.state) {
        replication::emit_aof(aof, key, snapshot);
    }
}

// Aux data: the token high-water mark, so that tokens keep growing across restarts and full
// syncs even with the wall clock set back (G3).
unsafe extern "C" fn aux_save(rdb: *mut raw::RedisModuleIO, when: c_int) {
    if when == raw::REDISMODULE_AUX_BEFORE_RDB as c_int {
        let mark = server::tokens().high_water();
        // SAFETY: `rdb` is the handle Redis passed.
        unsafe { api!(RedisModule_SaveUnsigned, (); rdb, mark) };
    }
}

unsafe extern "C" fn aux_load(rdb: *mut raw::RedisModuleIO, encver: c_int, when: c_int) -> c_int {
    if !(1..=ENCODING_VERSION).contains(&encver) || when != raw::REDISMODULE_AUX_BEFORE_RDB as c_int
    {
        return raw::REDISMODULE_ERR as c_int;
    }
    // SAFETY: `rdb` is the handle Redis passed.
    let mark = unsafe { api!(RedisModule_LoadUnsigned, 0; rdb) };
    // SAFETY: as above.
    if unsafe { api!(RedisModule_IsIOError, 1; rdb) } != 0 || mark > MAX_TOKEN {
        return raw::REDISMODULE_ERR as c_int;
    }
    server::tokens().observe(mark);
    raw::REDISMODULE_OK as c_int
}
