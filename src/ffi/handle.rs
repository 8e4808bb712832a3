//! The handles safe code holds: a context ([`Ctx`]) and a string ([`RStr`]), each `Copy` with
//! the lifetime of the callback that was given it (see the invariant in `mod.rs`); an owned
//! string ([`RString`], freed on drop); the context's flags, decoded ([`CtxFlags`]); and what a
//! command or reply callback hands back to Redis ([`Status`]).

use redis_module::raw;
use std::marker::PhantomData;
use std::os::raw::{c_char, c_int};
use std::ptr::{self, NonNull};

/// A module context, valid for `'a` (made only in `ffi`, from a callback's context or the
/// module's detached one).
#[derive(Clone, Copy)]
#[repr(transparent)]
pub struct Ctx<'a>(NonNull<raw::RedisModuleCtx>, PhantomData<&'a ()>);

impl<'a> Ctx<'a> {
    /// # Safety
    /// `ptr` must be null or a context valid for `'a`.
    pub(in crate::ffi) unsafe fn from_raw(ptr: *mut raw::RedisModuleCtx) -> Option<Ctx<'a>> {
        NonNull::new(ptr).map(|p| Ctx(p, PhantomData))
    }

    pub(in crate::ffi) fn ptr(self) -> *mut raw::RedisModuleCtx {
        self.0.as_ptr()
    }

    /// What the context is running in (`RedisModule_GetContextFlags`).
    #[inline]
    pub fn flags(self) -> CtxFlags {
        // SAFETY: a live context (module invariant).
        CtxFlags(unsafe { api!(RedisModule_GetContextFlags, 0; self.ptr()) } as u32)
    }

    /// The database selected in this context.
    #[inline]
    pub fn selected_db(self) -> c_int {
        // SAFETY: a live context (module invariant).
        unsafe { api!(RedisModule_GetSelectedDb, 0; self.ptr()) }
    }

    /// Select database `db`; false when there is no such database.
    pub fn select_db(self, db: c_int) -> bool {
        // SAFETY: a live context (module invariant); Redis checks `db`.
        let r =
            unsafe { api!(RedisModule_SelectDb, raw::REDISMODULE_ERR as c_int; self.ptr(), db) };
        r == raw::REDISMODULE_OK as c_int
    }

    /// The id of the client behind this context (0: none).
    pub fn client_id(self) -> u64 {
        // SAFETY: a live context (module invariant).
        unsafe { api!(RedisModule_GetClientId, 0; self.ptr()) }
    }
}

/// The flags of a context, as `RedisModule_GetContextFlags` returned them.
#[derive(Clone, Copy)]
pub struct CtxFlags(u32);

impl CtxFlags {
    fn has(self, flag: u32) -> bool {
        self.0 & flag != 0
    }
    /// This server is a master.
    pub fn is_master(self) -> bool {
        self.has(raw::REDISMODULE_CTX_FLAGS_MASTER)
    }
    /// Cluster mode is on.
    pub fn is_cluster(self) -> bool {
        self.has(raw::REDISMODULE_CTX_FLAGS_CLUSTER)
    }
    /// Inside MULTI.
    pub fn is_multi(self) -> bool {
        self.has(raw::REDISMODULE_CTX_FLAGS_MULTI)
    }
    /// Inside a script or function.
    pub fn is_lua(self) -> bool {
        self.has(raw::REDISMODULE_CTX_FLAGS_LUA)
    }
    /// The command came from the master's replication stream.
    pub fn is_replicated(self) -> bool {
        self.has(raw::REDISMODULE_CTX_FLAGS_REPLICATED)
    }
    /// The server is loading (AOF, RDB).
    pub fn is_loading(self) -> bool {
        self.has(raw::REDISMODULE_CTX_FLAGS_LOADING)
    }
    /// The context may not block its client.
    pub fn denies_blocking(self) -> bool {
        self.has(raw::REDISMODULE_CTX_FLAGS_DENY_BLOCKING)
    }
}

/// A Redis string handle valid for `'a` (an argument, a key name Redis passed, or an
/// [`RString`] borrowed).
#[derive(Clone, Copy)]
#[repr(transparent)]
pub struct RStr<'a>(NonNull<raw::RedisModuleString>, PhantomData<&'a ()>);

impl<'a> RStr<'a> {
    /// # Safety
    /// `ptr` must be null or a string valid for `'a`.
    pub(in crate::ffi) unsafe fn from_raw(ptr: *mut raw::RedisModuleString) -> Option<RStr<'a>> {
        NonNull::new(ptr).map(|p| RStr(p, PhantomData))
    }

    pub(in crate::ffi) fn ptr(self) -> *mut raw::RedisModuleString {
        self.0.as_ptr()
    }
}

/// The command's arguments as a slice of string handles.
///
/// # Safety
/// `argv` must point to `argc` valid, non-null strings (as Redis passes them to a command
/// handler) that outlive `'a` (the handler's run).
pub(in crate::ffi) unsafe fn argv_slice<'a>(
    argv: *mut *mut raw::RedisModuleString,
    argc: c_int,
) -> &'a [RStr<'a>] {
    if argv.is_null() || argc <= 0 {
        return &[];
    }
    // SAFETY: by the caller; `RStr` is a transparent non-null string pointer.
    unsafe { std::slice::from_raw_parts(argv.cast::<RStr<'a>>(), argc as usize) }
}

/// The bytes of a Redis string (an argument, a key name). The slice borrows the handle: it
/// lives as long as the caller's reference to it (an argv slice, a held key reference), during
/// which Redis keeps the string.
#[inline]
pub fn bytes<'s>(s: &'s RStr<'_>) -> &'s [u8] {
    let mut len = 0usize;
    // SAFETY: `s` is a live string handle (module invariant); Redis returns its buffer.
    let p = unsafe { api!(RedisModule_StringPtrLen, ptr::null(); s.ptr(), &mut len) };
    if p.is_null() || len == 0 {
        return &[];
    }
    // SAFETY: Redis's buffer of `len` bytes stays valid and unchanged while the string lives,
    // which the borrow of the handle stands for.
    unsafe { std::slice::from_raw_parts(p.cast::<u8>(), len) }
}

/// A Redis string of our own, freed on drop.
#[repr(transparent)]
pub struct RString(NonNull<raw::RedisModuleString>);

impl RString {
    /// A new string with the bytes `b` (`None`: Redis made none).
    pub fn new(ctx: Ctx<'_>, b: &[u8]) -> Option<RString> {
        RString::create(ctx.ptr(), b)
    }

    /// A new string outside any context (kept by whoever takes a reference to it).
    pub fn detached(b: &[u8]) -> Option<RString> {
        RString::create(ptr::null_mut(), b)
    }

    fn create(ctx: *mut raw::RedisModuleCtx, b: &[u8]) -> Option<RString> {
        // SAFETY: a live context or null (no automatic memory); Redis copies `b.len()` bytes
        // from a valid slice.
        let s = unsafe {
            api!(RedisModule_CreateString, ptr::null_mut(); ctx, b.as_ptr().cast::<c_char>(), b.len())
        };
        NonNull::new(s).map(RString)
    }

    /// The handle, borrowed for as long as the string is.
    pub fn get(&self) -> RStr<'_> {
        RStr(self.0, PhantomData)
    }
}

impl Drop for RString {
    fn drop(&mut self) {
        // SAFETY: created by us, freed once (by its single owner).
        unsafe { api!(RedisModule_FreeString, (); ptr::null_mut(), self.0.as_ptr()) };
    }
}

/// What a command, reply or unblock callback returns to Redis (REDISMODULE_OK or _ERR, as
/// the reply call made said).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Status(pub(in crate::ffi) c_int);

impl Status {
    pub const OK: Status = Status(raw::REDISMODULE_OK as c_int);
}
