//! The `flocklock` Redis data type's callbacks: persistence (RDB, AOF rewrite, DUMP/RESTORE),
//! COPY, MEMORY USAGE, DEBUG DIGEST, free, and the server-wide token high-water mark saved as
//! RDB aux data. What a lock looks like on disk is flock-core's [`Snapshot`].

use crate::record::{LockRecord, RecordPtr, StateRef};
use crate::{api, expiry, jobs, replication, server};
use flock_core::snapshot::{mode_code, mode_from_code, GrantImage, LockImage};
use flock_core::state::MAX_LIMIT;
use flock_core::{engine, LockState, MAX_TOKEN};
use redis_module::native_types::RedisType;
use redis_module::raw;
use std::os::raw::{c_char, c_int, c_void};
use std::ptr;

/// Current RDB encoding version; `rdb_load` accepts this and every older one.
/// 1: exclusive keys only (token, deadline, owner). 2: every kind (see `rdb_save`).
pub const ENCODING_VERSION: c_int = 2;

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
        free_effort: Some(free_effort),
        unlink: None,
        copy: Some(copy),
        defrag: None,
        copy2: None,
        free_effort2: None,
        mem_usage2: None,
        unlink2: None,
    },
);

/// The state behind a value pointer Redis hands to a callback of our type.
///
/// # Safety
/// `value` must be null or a value of this type (a block made by this module) that Redis
/// keeps alive during the callback, which is what `'a` stands for.
unsafe fn state_of<'a>(value: *const c_void) -> Option<StateRef<'a>> {
    // SAFETY: by the caller.
    unsafe { RecordPtr::from_value(value.cast_mut()).map(|b| b.state()) }
}

/// A lock is one block (two for a key with waiters, many readers or a lock-delay): cheap to
/// free, so Redis frees it at once, on the main thread, where the deadline index is kept
/// (a lazy free would leave the index pointing at a block being freed elsewhere).
unsafe extern "C" fn free_effort(
    _key: *mut raw::RedisModuleString,
    _value: *const c_void,
) -> usize {
    1
}

unsafe extern "C" fn free(value: *mut c_void) {
    // SAFETY: Redis frees each value of our type once; it is a block of ours.
    let Some(block) = (unsafe { RecordPtr::from_value(value) }) else {
        return;
    };
    // DEL, UNLINK, RELEASE, overwrite, eviction and a synchronous flush free on the main
    // thread: take the block out of the deadline index now (G10). A lazy-free thread
    // (FLUSHALL ASYNC) must not touch the index; the flush event already took those out.
    let main_thread = server::on_main_thread();
    if main_thread {
        expiry::disarm(block);
    }
    // SAFETY: out of the index (above, or by the flush event) and out of the keyspace.
    if let Some(key) = unsafe { block.free() } {
        jobs::schedule_revisit(*key, main_thread);
    }
}

unsafe extern "C" fn copy(
    _from: *mut raw::RedisModuleString,
    _to: *mut raw::RedisModuleString,
    value: *const c_void,
) -> *mut c_void {
    // SAFETY: Redis passes a live value of our type.
    let Some(state) = (unsafe { state_of(value) }) else {
        return ptr::null_mut();
    };
    // The copy gets its name and timer when the copy_to event arms it. A binding lives with
    // one connection and one value: COPY leaves bound grants out (G11).
    let mut state = state.clone();
    state.retain_grants(|g| !g.bound());
    let rec = LockRecord {
        state,
        watched: None,
    };
    RecordPtr::new(rec, None, Default::default()).map_or(ptr::null_mut(), RecordPtr::as_value)
}

unsafe extern "C" fn mem_usage(value: *const c_void) -> usize {
    // SAFETY: Redis passes a live value of our type.
    match unsafe { RecordPtr::from_value(value.cast_mut()) } {
        // SAFETY: as above.
        Some(block) => unsafe {
            block.bytes()
                + if block.pos() != flock_core::deadlines::NOWHERE {
                    expiry::TIMER_BYTES
                } else {
                    0
                }
        },
        None => 0,
    }
}

unsafe extern "C" fn digest(md: *mut raw::RedisModuleDigest, value: *mut c_void) {
    // SAFETY: Redis passes a live value of our type.
    let Some(state) = (unsafe { state_of(value) }) else {
        return;
    };
    let (code, limit) = mode_code(state.mode);
    // SAFETY (every call below): `md` is the digest Redis passed; the buffers outlive the
    // calls. Exclusive keys add no mode, as v1 did.
    unsafe {
        if code != 0 {
            api!(RedisModule_DigestAddLongLong, (); md, code as i64);
            api!(RedisModule_DigestAddLongLong, (); md, limit as i64);
        }
        // In token order: master and replica may keep their grants in different orders.
        for g in state.grants().by_token() {
            api!(RedisModule_DigestAddStringBuffer, (); md, g.owner.as_ptr().cast::<c_char>().cast_mut(), g.owner.len());
            api!(RedisModule_DigestAddLongLong, (); md, g.token as i64);
            api!(RedisModule_DigestAddLongLong, (); md, g.deadline.wall_ms);
            if g.bound() {
                api!(RedisModule_DigestAddLongLong, (); md, 1);
            }
        }
        if state.grants().is_empty() && !state.delays.is_empty() {
            api!(RedisModule_DigestAddLongLong, (); md, state.last_token as i64);
        }
        let mut ends: Vec<i64> = state.delays.iter().map(|d| d.wall_ms).collect();
        ends.sort_unstable();
        for end in ends {
            api!(RedisModule_DigestAddLongLong, (); md, end);
        }
        api!(RedisModule_DigestEndSequence, (); md);
    }
}

// RDB layout, encoding version 2: unsigned mode code and limit (0 0: exclusive, 1 0: shared,
// 2 n: permits of n), unsigned last token, unsigned number of grants, each as string owner,
// unsigned token, signed deadline (Unix ms), unsigned bound mark; unsigned number of delayed
// slots, each as its signed end (Unix ms).
unsafe extern "C" fn rdb_save(rdb: *mut raw::RedisModuleIO, value: *mut c_void) {
    // SAFETY: Redis passes a live value of our type.
    let Some(state) = (unsafe { state_of(value) }) else {
        return;
    };
    let state: &LockState = &state;
    let (code, limit) = mode_code(state.mode);
    // SAFETY: `rdb` is the handle Redis passed; the owner buffers outlive the calls.
    unsafe {
        api!(RedisModule_SaveUnsigned, (); rdb, code);
        api!(RedisModule_SaveUnsigned, (); rdb, limit);
        api!(RedisModule_SaveUnsigned, (); rdb, state.last_token);
        api!(RedisModule_SaveUnsigned, (); rdb, state.grants().len() as u64);
        // In token order, as every persisted form (LockImage::validate checks it).
        for g in state.grants().by_token() {
            api!(RedisModule_SaveStringBuffer, (); rdb, g.owner.as_ptr().cast::<c_char>(), g.owner.len());
            api!(RedisModule_SaveUnsigned, (); rdb, g.token);
            api!(RedisModule_SaveSigned, (); rdb, g.deadline.wall_ms);
            api!(RedisModule_SaveUnsigned, (); rdb, u64::from(g.bound()));
        }
        api!(RedisModule_SaveUnsigned, (); rdb, state.delays.len() as u64);
        for d in state.delays.iter() {
            api!(RedisModule_SaveSigned, (); rdb, d.wall_ms);
        }
    }
}

/// Reads of one RDB value; every read checks the IO error flag (set with HANDLE_IO_ERRORS
/// when the payload ends early or is corrupt) and turns it into `None`.
struct RdbReader(*mut raw::RedisModuleIO);

impl RdbReader {
    fn failed(&self) -> bool {
        // SAFETY: the handle Redis passed to rdb_load.
        unsafe { api!(RedisModule_IsIOError, 1; self.0) != 0 }
    }

    fn unsigned(&self) -> Option<u64> {
        // SAFETY: as above.
        let v = unsafe { api!(RedisModule_LoadUnsigned, 0; self.0) };
        (!self.failed()).then_some(v)
    }

    fn signed(&self) -> Option<i64> {
        // SAFETY: as above.
        let v = unsafe { api!(RedisModule_LoadSigned, 0; self.0) };
        (!self.failed()).then_some(v)
    }

    fn bytes(&self) -> Option<Vec<u8>> {
        let mut len = 0usize;
        // SAFETY: as above.
        let buf = unsafe { api!(RedisModule_LoadStringBuffer, ptr::null_mut(); self.0, &mut len) };
        if self.failed() || buf.is_null() && len > 0 {
            return None;
        }
        if buf.is_null() {
            return Some(Vec::new());
        }
        // SAFETY: Redis allocated `len` bytes for us, freed just below.
        let out = unsafe { std::slice::from_raw_parts(buf.cast::<u8>(), len) }.to_vec();
        // SAFETY: the buffer LoadStringBuffer returned, freed once.
        unsafe { api!(RedisModule_Free, (); buf.cast()) };
        Some(out)
    }
}

fn read_v1(r: &RdbReader) -> Option<LockImage> {
    let token = r.unsigned()?;
    let deadline = r.signed()?;
    let owner = r.bytes()?;
    LockImage::from_rdb_v1(token, deadline, &owner).ok()
}

fn read_v2(r: &RdbReader) -> Option<LockImage> {
    let mode = mode_from_code(r.unsigned()?, r.unsigned()?).ok()?;
    let last_token = r.unsigned()?;
    let count = |n: u64| (n <= u64::from(MAX_LIMIT)).then_some(n as usize);
    let n = count(r.unsigned()?)?;
    let mut grants = Vec::with_capacity(n.min(64));
    for _ in 0..n {
        let owner = r.bytes()?;
        let token = r.unsigned()?;
        let deadline_wall_ms = r.signed()?;
        let bound = match r.unsigned()? {
            0 => false,
            1 => true,
            _ => return None,
        };
        grants.push(GrantImage {
            owner,
            token,
            deadline_wall_ms,
            bound,
        });
    }
    let m = count(r.unsigned()?)?;
    let mut delays = Vec::with_capacity(m.min(64));
    for _ in 0..m {
        delays.push(r.signed()?);
    }
    LockImage {
        mode,
        last_token,
        grants,
        delays,
    }
    .validate()
    .ok()
}

unsafe extern "C" fn rdb_load(rdb: *mut raw::RedisModuleIO, encver: c_int) -> *mut c_void {
    let reader = RdbReader(rdb);
    // Refuse values no master could have written (a corrupt payload), rather than load them.
    let image = match encver {
        1 => read_v1(&reader),
        2 => read_v2(&reader),
        _ => None,
    };
    let Some(image) = image else {
        return ptr::null_mut();
    };
    let state = engine::load(image, server::now(), &mut server::tokens());
    let rec = LockRecord {
        state,
        watched: None,
    };
    // Named when first armed (the key's name is not known here).
    RecordPtr::new(rec, None, Default::default()).map_or(ptr::null_mut(), RecordPtr::as_value)
}

unsafe extern "C" fn aof_rewrite(
    aof: *mut raw::RedisModuleIO,
    key: *mut raw::RedisModuleString,
    value: *mut c_void,
) {
    // SAFETY: Redis passes a live value of our type.
    let Some(state) = (unsafe { state_of(value) }) else {
        return;
    };
    if let Some(snapshot) = flock_core::Snapshot::of(&state) {
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
