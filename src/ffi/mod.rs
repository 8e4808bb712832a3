//! Thin, panic-free access to the Redis module API.
//!
//! The crate's safe wrappers convert every argument into a `Vec<RedisString>` and unwrap API
//! pointers; on the hot path we call the raw API directly. Every API function used here is
//! checked once at load time ([`missing_api`]), so the `None` fallbacks below are never taken
//! on a server that loaded the module; they exist so that no code path can panic.
//!
//! Calling the module API is `unsafe`, and every call says so at its site: [`api!`] must be
//! used inside an `unsafe` block, with a `SAFETY:` note saying why the handles are valid. The
//! safe wrappers below rest on one invariant of the whole module, argued here once: a [`Ctx`]
//! or [`RStr`] passed to them is a handle Redis gave the callback that is running (a command,
//! a timer, an event, a type callback) or the module's own detached context
//! (`server::module_ctx`), and so is valid while that callback runs; every wrapper checks
//! for null, and none keeps a handle beyond the call.

use redis_module::raw;
use std::ffi::CStr;
use std::os::raw::{c_char, c_int, c_void};
use std::ptr;

pub type Ctx = *mut raw::RedisModuleCtx;
pub type RStr = *mut raw::RedisModuleString;

/// Call `RedisModule_<name>(args)`, or evaluate `fallback` if the server lacks it.
///
/// Expands to unsafe operations (reading the API table, calling a C function), so it only
/// compiles inside an `unsafe` block: the caller states why the call is sound.
#[macro_export]
macro_rules! api {
    ($name:ident, $fallback:expr; $($arg:expr),* $(,)?) => {
        match redis_module::raw::$name {
            Some(f) => f($($arg),*),
            None => $fallback,
        }
    };
}

/// API functions this module calls directly; loading fails cleanly when one is missing.
pub fn missing_api() -> Option<&'static str> {
    macro_rules! need {
        ($($name:ident),* $(,)?) => {
            // SAFETY: reads the API table Redis filled in before calling the module's init.
            $(if unsafe { raw::$name }.is_none() { return Some(stringify!($name)); })*
        };
    }
    need!(
        RedisModule_OpenKey,
        RedisModule_GetCommand,
        RedisModule_CreateSubcommand,
        RedisModule_ReplyWithArray,
        RedisModule_SetCommandInfo,
        RedisModule_KeyAtPosWithFlags,
        RedisModule_GetCommandKeysWithFlags,
        RedisModule_CloseKey,
        RedisModule_KeyType,
        RedisModule_ModuleTypeGetType,
        RedisModule_ModuleTypeGetValue,
        RedisModule_ModuleTypeSetValue,
        RedisModule_ModuleTypeReplaceValue,
        RedisModule_DeleteKey,
        RedisModule_StringPtrLen,
        RedisModule_CreateString,
        RedisModule_HoldString,
        RedisModule_FreeString,
        RedisModule_ReplyWithLongLong,
        RedisModule_ReplyWithNull,
        RedisModule_ReplyWithError,
        RedisModule_ReplyWithSimpleString,
        RedisModule_ReplyWithStringBuffer,
        RedisModule_ReplyWithMap,
        RedisModule_WrongArity,
        RedisModule_GetContextFlags,
        RedisModule_Replicate,
        RedisModule_ReplicateVerbatim,
        RedisModule_EmitAOF,
        RedisModule_CreateTimer,
        RedisModule_StopTimer,
        RedisModule_MonotonicMicroseconds,
        RedisModule_SelectDb,
        RedisModule_GetSelectedDb,
        RedisModule_Scan,
        RedisModule_ScanCursorCreate,
        RedisModule_ScanCursorDestroy,
        RedisModule_NotifyKeyspaceEvent,
        RedisModule_SubscribeToKeyspaceEvents,
        RedisModule_SubscribeToServerEvent,
        RedisModule_CreateCommand,
        RedisModule_GetDetachedThreadSafeContext,
        RedisModule_SaveUnsigned,
        RedisModule_SaveSigned,
        RedisModule_SaveStringBuffer,
        RedisModule_LoadUnsigned,
        RedisModule_LoadSigned,
        RedisModule_LoadStringBuffer,
        RedisModule_IsIOError,
        RedisModule_Free,
        RedisModule_InfoAddSection,
        RedisModule_InfoAddFieldULongLong,
        RedisModule_RegisterInfoFunc,
        RedisModule_DigestAddStringBuffer,
        RedisModule_DigestAddLongLong,
        RedisModule_DigestEndSequence,
        RedisModule_BlockClient,
        RedisModule_UnblockClient,
        RedisModule_SetDisconnectCallback,
        RedisModule_GetBlockedClientPrivateData,
        RedisModule_GetClientId,
        RedisModule_GetClientInfoById,
        RedisModule_Call,
        RedisModule_CallReplyType,
        RedisModule_ReplyWithCallReply,
        RedisModule_FreeCallReply,
        RedisModule_IsKeysPositionRequest,
        RedisModule_KeyAtPos,
        RedisModule_GetCommandKeys,
        RedisModule_GetServerInfo,
        RedisModule_ServerInfoGetFieldSigned,
        RedisModule_FreeServerInfo,
        RedisModule_CallReplyStringPtr,
        RedisModule_AvoidReplicaTraffic,
    );
    None
}

/// The bytes of a Redis string (an argument, a key name). The slice borrows the handle: it
/// lives as long as the caller's reference to it (an argv slice, a held key reference), during
/// which Redis keeps the string.
pub fn bytes(s: &RStr) -> &[u8] {
    let s = *s;
    if s.is_null() {
        return &[];
    }
    let mut len = 0usize;
    // SAFETY: `s` is a live string handle (module invariant); Redis returns its buffer.
    let p = unsafe { api!(RedisModule_StringPtrLen, ptr::null(); s, &mut len) };
    if p.is_null() || len == 0 {
        return &[];
    }
    // SAFETY: Redis's buffer of `len` bytes stays valid and unchanged while the string lives,
    // which the borrow of the handle stands for.
    unsafe { std::slice::from_raw_parts(p.cast::<u8>(), len) }
}

/// A new Redis string owned by the caller (free it with [`free_string`]).
pub fn create_string(ctx: Ctx, b: &[u8]) -> RStr {
    // SAFETY: Redis copies `b.len()` bytes from a valid slice.
    unsafe {
        api!(RedisModule_CreateString, ptr::null_mut(); ctx, b.as_ptr().cast::<c_char>(), b.len())
    }
}

pub fn free_string(s: RStr) {
    if !s.is_null() {
        // SAFETY: `s` was created or held by us and is freed once (by its single owner).
        unsafe { api!(RedisModule_FreeString, (); ptr::null_mut(), s) };
    }
}

pub fn context_flags(ctx: Ctx) -> u32 {
    // SAFETY: a live context (module invariant).
    unsafe { api!(RedisModule_GetContextFlags, 0; ctx) as u32 }
}

/// The database selected in `ctx`.
pub fn selected_db(ctx: Ctx) -> c_int {
    // SAFETY: a live context (module invariant).
    unsafe { api!(RedisModule_GetSelectedDb, 0; ctx) }
}

/// Select database `db` in `ctx`; false when there is no such database.
pub fn select_db(ctx: Ctx, db: c_int) -> bool {
    // SAFETY: a live context (module invariant); Redis checks `db`.
    let r = unsafe { api!(RedisModule_SelectDb, raw::REDISMODULE_ERR as c_int; ctx, db) };
    r == raw::REDISMODULE_OK as c_int
}

/// Redis's monotonic clock, in microseconds.
pub fn monotonic_us() -> u64 {
    // SAFETY: takes no arguments.
    unsafe { api!(RedisModule_MonotonicMicroseconds, 0;) }
}

// ---- timers ----

pub type TimerProc = unsafe extern "C" fn(ctx: Ctx, data: *mut c_void);

/// A Redis timer calling `callback(data)` after `period_ms`; 0 when none could be made.
pub fn create_timer(ctx: Ctx, period_ms: i64, callback: TimerProc, data: *mut c_void) -> u64 {
    // SAFETY: a live context; `callback` is a plain function that Redis calls on the main
    // thread with `data`, which the callback interprets (never a pointer it frees).
    unsafe { api!(RedisModule_CreateTimer, 0; ctx, period_ms, Some(callback), data) }
}

/// Stop timer `id` (an id that fired or was stopped already is ignored by Redis).
pub fn stop_timer(ctx: Ctx, id: u64) {
    let mut data: *mut c_void = ptr::null_mut();
    // SAFETY: a live context; Redis looks the id up and writes the timer's data to `data`.
    unsafe { api!(RedisModule_StopTimer, 0; ctx, id, &mut data) };
}

// ---- replies ----

pub fn reply_int(ctx: Ctx, v: i64) -> c_int {
    // SAFETY: a live command context (module invariant).
    unsafe { api!(RedisModule_ReplyWithLongLong, raw::REDISMODULE_ERR as c_int; ctx, v) }
}

pub fn reply_null(ctx: Ctx) -> c_int {
    // SAFETY: a live command context (module invariant).
    unsafe { api!(RedisModule_ReplyWithNull, raw::REDISMODULE_ERR as c_int; ctx) }
}

/// An error reply from a C string literal (no allocation).
pub fn reply_error_static(ctx: Ctx, msg: &'static CStr) -> c_int {
    // SAFETY: a live command context; `msg` is NUL-terminated.
    unsafe { api!(RedisModule_ReplyWithError, raw::REDISMODULE_ERR as c_int; ctx, msg.as_ptr()) }
}

/// An error reply from any text (NUL, CR and LF dropped so the reply stays one RESP line).
pub fn reply_error_string(ctx: Ctx, msg: &str) -> c_int {
    let mut buf: Vec<u8> = msg
        .bytes()
        .filter(|&b| b != 0 && b != b'\r' && b != b'\n')
        .collect();
    buf.push(0);
    // SAFETY: a live command context; `buf` is NUL-terminated and outlives the call.
    unsafe {
        api!(RedisModule_ReplyWithError, raw::REDISMODULE_ERR as c_int; ctx, buf.as_ptr().cast::<c_char>())
    }
}

pub fn reply_simple(ctx: Ctx, msg: &'static CStr) -> c_int {
    // SAFETY: a live command context; `msg` is NUL-terminated.
    unsafe {
        api!(RedisModule_ReplyWithSimpleString, raw::REDISMODULE_ERR as c_int; ctx, msg.as_ptr())
    }
}

pub fn reply_bulk(ctx: Ctx, b: &[u8]) -> c_int {
    // SAFETY: a live command context; Redis copies `b.len()` bytes from a valid slice.
    unsafe {
        api!(RedisModule_ReplyWithStringBuffer, raw::REDISMODULE_ERR as c_int; ctx, b.as_ptr().cast::<c_char>(), b.len())
    }
}

pub fn reply_map(ctx: Ctx, len: usize) -> c_int {
    // SAFETY: a live command context.
    unsafe {
        api!(RedisModule_ReplyWithMap, raw::REDISMODULE_ERR as c_int; ctx, len as std::os::raw::c_long)
    }
}

pub fn reply_array(ctx: Ctx, len: usize) -> c_int {
    // SAFETY: a live command context.
    unsafe {
        api!(RedisModule_ReplyWithArray, raw::REDISMODULE_ERR as c_int; ctx, len as std::os::raw::c_long)
    }
}

pub fn wrong_arity(ctx: Ctx) -> c_int {
    // SAFETY: a live command context.
    unsafe { api!(RedisModule_WrongArity, raw::REDISMODULE_ERR as c_int; ctx) }
}

// ---- keyspace notifications ----

/// Module keyspace event (class `d`).
pub fn notify(ctx: Ctx, event: &'static CStr, key: RStr) {
    // SAFETY: a live context and key name; `event` is NUL-terminated.
    unsafe {
        api!(RedisModule_NotifyKeyspaceEvent, 0; ctx, raw::REDISMODULE_NOTIFY_MODULE, event.as_ptr(), key)
    };
}

// ---- keys ----

/// An open key, closed on drop.
///
/// A module value is reached through [`Key::raw_value`] by `record.rs`, whose accessors tie
/// their borrows to the key: the key cannot be deleted, overwritten or closed (`&mut self`,
/// drop) while a reference into its value is alive.
pub struct Key {
    ptr: *mut raw::RedisModuleKey,
}

pub enum KeyKind {
    Empty,
    Ours,
    Other,
}

impl Key {
    pub fn open(ctx: Ctx, name: RStr, write: bool) -> Key {
        let mode = if write {
            raw::REDISMODULE_READ | raw::REDISMODULE_WRITE
        } else {
            raw::REDISMODULE_READ
        } as c_int;
        Key {
            // SAFETY: a live context and key name (module invariant).
            ptr: unsafe { api!(RedisModule_OpenKey, ptr::null_mut(); ctx, name, mode) }.cast(),
        }
    }

    /// Wrap a key handle Redis passed to a callback (a SCAN callback). Not closed on drop.
    ///
    /// # Safety
    /// `ptr` must be a key handle valid for the lifetime of the returned borrow.
    pub unsafe fn borrowed(ptr: *mut raw::RedisModuleKey) -> std::mem::ManuallyDrop<Key> {
        std::mem::ManuallyDrop::new(Key { ptr })
    }

    pub fn kind(&self, ours: *mut raw::RedisModuleType) -> KeyKind {
        if self.ptr.is_null() {
            return KeyKind::Empty;
        }
        // SAFETY: an open key handle (non-null, closed only on drop).
        let t = unsafe { api!(RedisModule_KeyType, 0; self.ptr) } as isize;
        if t == raw::REDISMODULE_KEYTYPE_EMPTY {
            KeyKind::Empty
        } else if t == raw::REDISMODULE_KEYTYPE_MODULE
            // SAFETY: an open key holding a module value.
            && unsafe { api!(RedisModule_ModuleTypeGetType, ptr::null_mut(); self.ptr) } == ours
        {
            KeyKind::Ours
        } else {
            KeyKind::Other
        }
    }

    /// The module value pointer of this key (null when there is none). Reading it is safe;
    /// what it points to is the caller's to reach soundly.
    pub fn raw_value(&self) -> *mut c_void {
        if self.ptr.is_null() {
            return ptr::null_mut();
        }
        // SAFETY: an open key handle; Redis returns null for a key of another kind.
        unsafe { api!(RedisModule_ModuleTypeGetValue, ptr::null_mut(); self.ptr) }
    }

    /// Store `value` (a block of ours, owned by Redis from now on) under this key;
    /// false when Redis refused (the caller still owns `value` then).
    pub fn set_value(&mut self, ty: *mut raw::RedisModuleType, value: *mut c_void) -> bool {
        // SAFETY: an open key opened for writing; `ty` is our registered type, `value` a
        // record of it.
        !self.ptr.is_null()
            && unsafe {
                api!(RedisModule_ModuleTypeSetValue, raw::REDISMODULE_ERR as c_int; self.ptr, ty, value)
            } == raw::REDISMODULE_OK as c_int
    }

    /// Put `value` in place of this key's module value, which is returned (Redis does not
    /// free it: the caller owns it now); `None` when Redis refused (the caller still owns
    /// `value` then). The key must be open for writing and hold a value of type `ty`.
    pub fn replace_value(
        &mut self,
        ty: *mut raw::RedisModuleType,
        value: *mut c_void,
    ) -> Option<*mut c_void> {
        if self.ptr.is_null() {
            return None;
        }
        let mut old: *mut c_void = ptr::null_mut();
        // SAFETY: an open key; `ty` is our registered type, `value` a record of it, `old` a
        // place for the pointer Redis hands back.
        let rc = unsafe {
            api!(RedisModule_ModuleTypeReplaceValue, raw::REDISMODULE_ERR as c_int; self.ptr, ty, value, &mut old)
        };
        (rc == raw::REDISMODULE_OK as c_int).then_some(old)
    }

    /// Delete the key (Redis frees its value): needs `&mut self`, so no borrow of the value
    /// can still be alive.
    pub fn delete(&mut self) {
        if !self.ptr.is_null() {
            // SAFETY: an open key handle.
            unsafe { api!(RedisModule_DeleteKey, 0; self.ptr) };
        }
    }
}

impl Drop for Key {
    fn drop(&mut self) {
        if !self.ptr.is_null() {
            // SAFETY: opened by `Key::open`, closed once.
            unsafe { api!(RedisModule_CloseKey, (); self.ptr) };
        }
    }
}

// ---- argument helpers ----

/// The command's arguments as a slice of string handles.
///
/// # Safety
/// `argv` must point to `argc` valid strings (as Redis passes them to a command handler) that
/// outlive `'a` (the handler's run).
pub unsafe fn argv_slice<'a>(argv: *mut RStr, argc: c_int) -> &'a [RStr] {
    if argv.is_null() || argc <= 0 {
        return &[];
    }
    // SAFETY: by the caller.
    unsafe { std::slice::from_raw_parts(argv, argc as usize) }
}
