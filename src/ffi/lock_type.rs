//! The `flocklock` data type: its creation and the trampolines of its callbacks, which hand
//! safe handles ([`RdbReader`], [`RdbWriter`], [`Digest`], [`Aof`]) and the lock's state
//! (read from its block) to a safe [`LockTypeMethods`].

use super::block::{KeyId, LockRecord, RecordPtr};
use super::handle::{Ctx, RStr};
use super::key::set_lock_type;
use flock_core::LockState;
use redis_module::raw;
use std::ffi::CStr;
use std::marker::PhantomData;
use std::os::raw::{c_char, c_int, c_void};
use std::ptr::{self, NonNull};

/// What the type does; the trampolines below call it with safe arguments.
pub trait LockTypeMethods {
    /// The type's name (exactly 9 characters) and its current encoding version.
    const NAME: &'static CStr;
    const ENCODING_VERSION: c_int;
    /// A value read from an RDB payload of version `encver` (`None`: refused).
    fn rdb_load(r: &RdbReader<'_>, encver: c_int) -> Option<LockRecord>;
    fn rdb_save(w: &RdbWriter<'_>, state: &LockState);
    fn aof_rewrite(aof: Aof<'_>, key: RStr<'_>, state: &LockState);
    /// MEMORY USAGE of a block.
    fn mem_usage(block: RecordPtr) -> usize;
    fn digest(d: &Digest<'_>, state: &LockState);
    /// The state COPY puts in the new key (`None`: no copy).
    fn copy(state: &LockState) -> Option<LockRecord>;
    /// `block` is about to be freed (by Redis, possibly on a lazy-free thread): let go of
    /// it. `bound` reads its bound grants (connection id, token), decoding the block: call it
    /// only when they matter. Returns whether this is the main thread, passed on to
    /// [`Self::freed`].
    fn freeing(block: RecordPtr, bound: impl FnOnce() -> Vec<(u64, u64)>) -> bool;
    /// The block is gone; it had clients waiting for `watched`.
    fn freed(watched: Option<Box<KeyId>>, main_thread: bool);
    /// The aux data saved before the keyspace.
    fn aux_save(w: &RdbWriter<'_>);
    /// The aux data loaded (`before_rdb`: saved before the keyspace); false: refused.
    fn aux_load(r: &RdbReader<'_>, encver: c_int, before_rdb: bool) -> bool;
}

/// An RDB handle Redis passed to a load callback. Every read checks the IO error flag (set
/// with HANDLE_IO_ERRORS when the payload ends early or is corrupt) and turns it into `None`.
pub struct RdbReader<'a>(NonNull<raw::RedisModuleIO>, PhantomData<&'a ()>);

impl RdbReader<'_> {
    fn failed(&self) -> bool {
        // SAFETY: the handle Redis passed to the callback.
        unsafe { api!(RedisModule_IsIOError, 1; self.0.as_ptr()) != 0 }
    }

    pub fn unsigned(&self) -> Option<u64> {
        // SAFETY: as above.
        let v = unsafe { api!(RedisModule_LoadUnsigned, 0; self.0.as_ptr()) };
        (!self.failed()).then_some(v)
    }

    pub fn signed(&self) -> Option<i64> {
        // SAFETY: as above.
        let v = unsafe { api!(RedisModule_LoadSigned, 0; self.0.as_ptr()) };
        (!self.failed()).then_some(v)
    }

    pub fn bytes(&self) -> Option<Vec<u8>> {
        let mut len = 0usize;
        // SAFETY: as above.
        let buf = unsafe {
            api!(RedisModule_LoadStringBuffer, ptr::null_mut(); self.0.as_ptr(), &mut len)
        };
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

/// An RDB handle Redis passed to a save callback.
pub struct RdbWriter<'a>(NonNull<raw::RedisModuleIO>, PhantomData<&'a ()>);

impl RdbWriter<'_> {
    pub fn unsigned(&self, v: u64) {
        // SAFETY: the handle Redis passed to the callback.
        unsafe { api!(RedisModule_SaveUnsigned, (); self.0.as_ptr(), v) };
    }

    pub fn signed(&self, v: i64) {
        // SAFETY: as above.
        unsafe { api!(RedisModule_SaveSigned, (); self.0.as_ptr(), v) };
    }

    pub fn bytes(&self, b: &[u8]) {
        // SAFETY: as above; Redis copies `b.len()` bytes from a valid slice.
        unsafe {
            api!(RedisModule_SaveStringBuffer, (); self.0.as_ptr(), b.as_ptr().cast::<c_char>(), b.len())
        };
    }
}

/// The AOF handle Redis passed to `aof_rewrite` (`replicate::emit_aof` writes to it).
#[derive(Clone, Copy)]
pub struct Aof<'a>(
    pub(in crate::ffi) NonNull<raw::RedisModuleIO>,
    PhantomData<&'a ()>,
);

/// The digest Redis passed to DEBUG DIGEST.
pub struct Digest<'a>(NonNull<raw::RedisModuleDigest>, PhantomData<&'a ()>);

impl Digest<'_> {
    pub fn add_long_long(&self, v: i64) {
        // SAFETY: the digest Redis passed to the callback.
        unsafe { api!(RedisModule_DigestAddLongLong, (); self.0.as_ptr(), v) };
    }

    pub fn add_string_buffer(&self, b: &[u8]) {
        // SAFETY: as above; Redis reads `b.len()` bytes from a valid slice.
        unsafe {
            api!(RedisModule_DigestAddStringBuffer, (); self.0.as_ptr(), b.as_ptr().cast::<c_char>().cast_mut(), b.len())
        };
    }

    pub fn end_sequence(&self) {
        // SAFETY: as above.
        unsafe { api!(RedisModule_DigestEndSequence, (); self.0.as_ptr()) };
    }
}

/// The state behind a value pointer Redis hands to a callback of our type, for `f`.
///
/// # Safety
/// `value` must be null or a value of this type (a block made by this module) that Redis
/// keeps alive during the callback.
unsafe fn with_state<R>(value: *const c_void, f: impl FnOnce(&LockState) -> R) -> Option<R> {
    // SAFETY: by the caller.
    let block = unsafe { RecordPtr::from_value(value.cast_mut()) }?;
    // SAFETY: a live block, unchanged during the callback.
    let state = unsafe { block.state() };
    Some(f(&state))
}

/// A new block (unnamed: named when first armed) for a state made by a callback, as the
/// value pointer Redis takes (null: none).
fn new_value(rec: Option<LockRecord>) -> *mut c_void {
    rec.and_then(|rec| RecordPtr::new(rec, None, Default::default()))
        .map_or(ptr::null_mut(), RecordPtr::as_value)
}

unsafe extern "C" fn rdb_load<T: LockTypeMethods>(
    rdb: *mut raw::RedisModuleIO,
    encver: c_int,
) -> *mut c_void {
    let Some(rdb) = NonNull::new(rdb) else {
        return ptr::null_mut();
    };
    new_value(T::rdb_load(&RdbReader(rdb, PhantomData), encver))
}

unsafe extern "C" fn rdb_save<T: LockTypeMethods>(
    rdb: *mut raw::RedisModuleIO,
    value: *mut c_void,
) {
    let Some(rdb) = NonNull::new(rdb) else {
        return;
    };
    // SAFETY: Redis passes a live value of our type.
    unsafe {
        with_state(value, |state| {
            T::rdb_save(&RdbWriter(rdb, PhantomData), state)
        })
    };
}

unsafe extern "C" fn aof_rewrite<T: LockTypeMethods>(
    aof: *mut raw::RedisModuleIO,
    key: *mut raw::RedisModuleString,
    value: *mut c_void,
) {
    // SAFETY: the handles Redis passed, valid during the callback.
    let (Some(aof), Some(key)) = (NonNull::new(aof), unsafe { RStr::from_raw(key) }) else {
        return;
    };
    // SAFETY: Redis passes a live value of our type.
    unsafe {
        with_state(value, |state| {
            T::aof_rewrite(Aof(aof, PhantomData), key, state)
        })
    };
}

unsafe extern "C" fn mem_usage<T: LockTypeMethods>(value: *const c_void) -> usize {
    // SAFETY: Redis passes a live value of our type.
    match unsafe { RecordPtr::from_value(value.cast_mut()) } {
        Some(block) => T::mem_usage(block),
        None => 0,
    }
}

unsafe extern "C" fn digest<T: LockTypeMethods>(
    md: *mut raw::RedisModuleDigest,
    value: *mut c_void,
) {
    let Some(md) = NonNull::new(md) else {
        return;
    };
    // SAFETY: Redis passes a live value of our type.
    unsafe { with_state(value, |state| T::digest(&Digest(md, PhantomData), state)) };
}

unsafe extern "C" fn copy<T: LockTypeMethods>(
    _from: *mut raw::RedisModuleString,
    _to: *mut raw::RedisModuleString,
    value: *const c_void,
) -> *mut c_void {
    // SAFETY: Redis passes a live value of our type.
    new_value(unsafe { with_state(value, T::copy) }.flatten())
}

unsafe extern "C" fn free<T: LockTypeMethods>(value: *mut c_void) {
    // SAFETY: Redis frees each value of our type once; it is a block of ours.
    let Some(block) = (unsafe { RecordPtr::from_value(value) }) else {
        return;
    };
    let bound = || {
        // SAFETY: the live block Redis is about to free, not changed while it is read.
        let state = unsafe { block.state() };
        state
            .grants()
            .iter()
            .filter_map(|g| g.bound_client().map(|client| (client, g.token)))
            .collect()
    };
    let main_thread = T::freeing(block, bound);
    // SAFETY: out of the index (`freeing`, or the flush event before a lazy free) and out of
    // the keyspace.
    let watched = unsafe { block.free() };
    T::freed(watched, main_thread);
}

/// A lock is one block (two for a key with waiters, many readers or a lock-delay): cheap to
/// free, so Redis frees it at once, on the main thread, where the deadline index is kept
/// (a lazy free would leave the index pointing at a block being freed elsewhere: the block
/// invariant of `block.rs` rests on this).
unsafe extern "C" fn free_effort(
    _key: *mut raw::RedisModuleString,
    _value: *const c_void,
) -> usize {
    1
}

unsafe extern "C" fn aux_save<T: LockTypeMethods>(rdb: *mut raw::RedisModuleIO, when: c_int) {
    if when == raw::REDISMODULE_AUX_BEFORE_RDB as c_int {
        if let Some(rdb) = NonNull::new(rdb) {
            T::aux_save(&RdbWriter(rdb, PhantomData));
        }
    }
}

unsafe extern "C" fn aux_load<T: LockTypeMethods>(
    rdb: *mut raw::RedisModuleIO,
    encver: c_int,
    when: c_int,
) -> c_int {
    let Some(rdb) = NonNull::new(rdb) else {
        return raw::REDISMODULE_ERR as c_int;
    };
    let before_rdb = when == raw::REDISMODULE_AUX_BEFORE_RDB as c_int;
    if T::aux_load(&RdbReader(rdb, PhantomData), encver, before_rdb) {
        raw::REDISMODULE_OK as c_int
    } else {
        raw::REDISMODULE_ERR as c_int
    }
}

/// Create the data type `T` (in OnLoad); false when Redis refused it.
pub fn create_lock_type<T: LockTypeMethods>(ctx: Ctx<'_>) -> bool {
    let name = T::NAME;
    if name.to_bytes().len() != 9 {
        raw::redis_log(
            ctx.ptr(),
            "Redis requires the length of native type names to be exactly 9 characters",
        );
        return false;
    }
    let mut methods = raw::RedisModuleTypeMethods {
        version: raw::REDISMODULE_TYPE_METHOD_VERSION as u64,
        rdb_load: Some(rdb_load::<T>),
        rdb_save: Some(rdb_save::<T>),
        aof_rewrite: Some(aof_rewrite::<T>),
        mem_usage: Some(mem_usage::<T>),
        digest: Some(digest::<T>),
        free: Some(free::<T>),
        aux_load: Some(aux_load::<T>),
        aux_save: Some(aux_save::<T>),
        aux_save2: None,
        aux_save_triggers: raw::REDISMODULE_AUX_BEFORE_RDB as c_int,
        free_effort: Some(free_effort),
        unlink: None,
        copy: Some(copy::<T>),
        defrag: None,
        copy2: None,
        free_effort2: None,
        mem_usage2: None,
        unlink2: None,
    };
    // SAFETY: the init context; `name` is NUL-terminated; Redis copies the methods.
    let ty = unsafe {
        api!(RedisModule_CreateDataType, ptr::null_mut();
            ctx.ptr(), name.as_ptr(), T::ENCODING_VERSION, &mut methods)
    };
    if ty.is_null() {
        raw::redis_log(ctx.ptr(), "Error: created data type is null");
        return false;
    }
    set_lock_type(ty);
    raw::redis_log(
        ctx.ptr(),
        &format!("Created new data type '{}'", name.to_string_lossy()),
    );
    true
}

// The RDB layout is flock-core's (`flock_core::rdb`): these handles are its sink and source.

impl flock_core::rdb::RdbSink for &RdbWriter<'_> {
    fn save_unsigned(&mut self, v: u64) {
        self.unsigned(v);
    }
    fn save_signed(&mut self, v: i64) {
        self.signed(v);
    }
    fn save_bytes(&mut self, b: &[u8]) {
        self.bytes(b);
    }
}

impl flock_core::rdb::RdbSource for &RdbReader<'_> {
    fn load_unsigned(&mut self) -> Option<u64> {
        self.unsigned()
    }
    fn load_signed(&mut self) -> Option<i64> {
        self.signed()
    }
    fn load_bytes(&mut self) -> Option<Vec<u8>> {
        self.bytes()
    }
}

impl flock_core::rdb::DigestSink for &Digest<'_> {
    fn add_long_long(&mut self, v: i64) {
        Digest::add_long_long(self, v);
    }
    fn add_bytes(&mut self, b: &[u8]) {
        self.add_string_buffer(b);
    }
    fn end_sequence(&mut self) {
        Digest::end_sequence(self);
    }
}
