//! Thin, panic-free access to the Redis module API.
//!
//! The crate's safe wrappers convert every argument into a `Vec<RedisString>` and unwrap API
//! pointers; on the hot path we call the raw API directly. Every API function used here is
//! checked once at load time ([`missing_api`]), so the `None` fallbacks below are never taken
//! on a server that loaded the module; they exist so that no code path can panic.

use redis_module::raw;
use std::os::raw::{c_char, c_int, c_void};
use std::ptr;

pub type Ctx = *mut raw::RedisModuleCtx;
pub type RStr = *mut raw::RedisModuleString;

/// Call `RedisModule_<name>(args)`, or evaluate `fallback` if the server lacks it.
#[macro_export]
macro_rules! rm {
    ($name:ident, $fallback:expr; $($arg:expr),* $(,)?) => {
        match unsafe { redis_module::raw::$name } {
            Some(f) => unsafe { f($($arg),*) },
            None => $fallback,
        }
    };
}

/// API functions this module calls directly; loading fails cleanly when one is missing.
pub fn missing_api() -> Option<&'static str> {
    macro_rules! need {
        ($($name:ident),* $(,)?) => {
            $(if unsafe { raw::$name }.is_none() { return Some(stringify!($name)); })*
        };
    }
    need!(
        RedisModule_OpenKey,
        RedisModule_GetCommand,
        RedisModule_SetCommandInfo,
        RedisModule_KeyAtPosWithFlags,
        RedisModule_GetCommandKeysWithFlags,
        RedisModule_CloseKey,
        RedisModule_KeyType,
        RedisModule_ModuleTypeGetType,
        RedisModule_ModuleTypeGetValue,
        RedisModule_ModuleTypeSetValue,
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

/// The bytes of a Redis string (argv, key name). Valid while the string is.
pub fn bytes<'a>(s: RStr) -> &'a [u8] {
    if s.is_null() {
        return &[];
    }
    let mut len = 0usize;
    let p = rm!(RedisModule_StringPtrLen, ptr::null(); s, &mut len);
    if p.is_null() || len == 0 {
        return &[];
    }
    unsafe { std::slice::from_raw_parts(p.cast::<u8>(), len) }
}

/// A new Redis string owned by the caller (free it with [`free_string`]).
pub fn create_string(ctx: Ctx, b: &[u8]) -> RStr {
    rm!(RedisModule_CreateString, ptr::null_mut(); ctx, b.as_ptr().cast::<c_char>(), b.len())
}

/// Keep `s` alive beyond the command (a reference or a copy); free it with [`free_string`].
pub fn hold_string(s: RStr) -> RStr {
    rm!(RedisModule_HoldString, ptr::null_mut(); ptr::null_mut(), s)
}

pub fn free_string(s: RStr) {
    if !s.is_null() {
        rm!(RedisModule_FreeString, (); ptr::null_mut(), s);
    }
}

pub fn context_flags(ctx: Ctx) -> u32 {
    rm!(RedisModule_GetContextFlags, 0; ctx) as u32
}

// ---- replies ----

pub fn reply_int(ctx: Ctx, v: i64) -> c_int {
    rm!(RedisModule_ReplyWithLongLong, raw::REDISMODULE_ERR as c_int; ctx, v)
}

pub fn reply_null(ctx: Ctx) -> c_int {
    rm!(RedisModule_ReplyWithNull, raw::REDISMODULE_ERR as c_int; ctx)
}

/// `msg` must end with a NUL byte (use `concat!(..., "\0")` or [`reply_error_string`]).
pub fn reply_error_static(ctx: Ctx, msg: &'static str) -> c_int {
    rm!(RedisModule_ReplyWithError, raw::REDISMODULE_ERR as c_int; ctx, msg.as_ptr().cast::<c_char>())
}

pub fn reply_error_string(ctx: Ctx, msg: &str) -> c_int {
    let mut buf: Vec<u8> = msg
        .bytes()
        .filter(|&b| b != 0 && b != b'\r' && b != b'\n')
        .collect();
    buf.push(0);
    rm!(RedisModule_ReplyWithError, raw::REDISMODULE_ERR as c_int; ctx, buf.as_ptr().cast::<c_char>())
}

pub fn reply_simple(ctx: Ctx, msg: &'static str) -> c_int {
    rm!(RedisModule_ReplyWithSimpleString, raw::REDISMODULE_ERR as c_int; ctx, msg.as_ptr().cast::<c_char>())
}

pub fn reply_bulk(ctx: Ctx, b: &[u8]) -> c_int {
    rm!(RedisModule_ReplyWithStringBuffer, raw::REDISMODULE_ERR as c_int; ctx, b.as_ptr().cast::<c_char>(), b.len())
}

pub fn reply_map(ctx: Ctx, len: usize) -> c_int {
    rm!(RedisModule_ReplyWithMap, raw::REDISMODULE_ERR as c_int; ctx, len as std::os::raw::c_long)
}

pub fn wrong_arity(ctx: Ctx) -> c_int {
    rm!(RedisModule_WrongArity, raw::REDISMODULE_ERR as c_int; ctx)
}

// ---- keyspace notifications ----

/// Module keyspace event (class `d`); `event` must end with a NUL byte.
pub fn notify(ctx: Ctx, event: &'static str, key: RStr) {
    rm!(RedisModule_NotifyKeyspaceEvent, 0; ctx, raw::REDISMODULE_NOTIFY_MODULE, event.as_ptr().cast::<c_char>(), key);
}

// ---- keys ----

/// An open key, closed on drop.
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
            ptr: rm!(RedisModule_OpenKey, ptr::null_mut(); ctx, name, mode).cast(),
        }
    }

    pub fn kind(&self, ours: *mut raw::RedisModuleType) -> KeyKind {
        if self.ptr.is_null() {
            return KeyKind::Empty;
        }
        let t = rm!(RedisModule_KeyType, 0; self.ptr) as isize;
        if t == raw::REDISMODULE_KEYTYPE_EMPTY {
            KeyKind::Empty
        } else if t == raw::REDISMODULE_KEYTYPE_MODULE
            && rm!(RedisModule_ModuleTypeGetType, ptr::null_mut(); self.ptr) == ours
        {
            KeyKind::Ours
        } else {
            KeyKind::Other
        }
    }

    /// The module value of a key of our type (check [`Key::kind`] first).
    pub fn value<T>(&self) -> *mut T {
        if self.ptr.is_null() {
            return ptr::null_mut();
        }
        rm!(RedisModule_ModuleTypeGetValue, ptr::null_mut(); self.ptr).cast::<T>()
    }

    /// Store `value` (a `Box::into_raw` pointer) under this key; false when Redis refused.
    pub fn set_value(&self, ty: *mut raw::RedisModuleType, value: *mut c_void) -> bool {
        !self.ptr.is_null()
            && rm!(RedisModule_ModuleTypeSetValue, raw::REDISMODULE_ERR as c_int; self.ptr, ty, value)
                == raw::REDISMODULE_OK as c_int
    }

    pub fn delete(&self) {
        if !self.ptr.is_null() {
            rm!(RedisModule_DeleteKey, 0; self.ptr);
        }
    }
}

impl Drop for Key {
    fn drop(&mut self) {
        if !self.ptr.is_null() {
            rm!(RedisModule_CloseKey, (); self.ptr);
        }
    }
}

// ---- argument helpers ----

/// The command's arguments as a slice of string handles.
///
/// # Safety
/// `argv` must point to `argc` valid strings (as Redis passes them to a command handler).
pub unsafe fn argv_slice<'a>(argv: *mut RStr, argc: c_int) -> &'a [RStr] {
    if argv.is_null() || argc <= 0 {
        return &[];
    }
    unsafe { std::slice::from_raw_parts(argv, argc as usize) }
}
