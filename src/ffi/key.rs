//! Open keys, and keyspace notifications about them.

use super::handle::{Ctx, RStr};
use redis_module::raw;
use std::ffi::CStr;
use std::os::raw::{c_int, c_void};
use std::ptr;
use std::sync::atomic::{AtomicPtr, Ordering};

/// Our data type's handle, as Redis registered it (`lock_type::create_lock_type`).
static LOCK_TYPE: AtomicPtr<raw::RedisModuleType> = AtomicPtr::new(ptr::null_mut());

pub(in crate::ffi) fn set_lock_type(ty: *mut raw::RedisModuleType) {
    LOCK_TYPE.store(ty, Ordering::Relaxed);
}

pub(in crate::ffi) fn lock_type() -> *mut raw::RedisModuleType {
    LOCK_TYPE.load(Ordering::Relaxed)
}

/// Module keyspace event (class `d`).
pub fn notify(ctx: Ctx<'_>, event: &'static CStr, key: RStr<'_>) {
    // SAFETY: a live context and key name; `event` is NUL-terminated.
    unsafe {
        api!(RedisModule_NotifyKeyspaceEvent, 0; ctx.ptr(), raw::REDISMODULE_NOTIFY_MODULE as c_int, event.as_ptr(), key.ptr())
    };
}

/// An open key, closed on drop.
///
/// A lock's value is reached through `block.rs` (`lock_of`, `lock_mut`, ...), whose accessors
/// tie their borrows to the key: the key cannot be deleted, overwritten or closed (`&mut
/// self`, drop) while a reference into its value is alive.
pub struct Key {
    pub(in crate::ffi) ptr: *mut raw::RedisModuleKey,
}

pub enum KeyKind {
    Empty,
    Ours,
    Other,
}

impl Key {
    #[inline]
    pub fn open(ctx: Ctx<'_>, name: RStr<'_>, write: bool) -> Key {
        let mode = if write {
            raw::REDISMODULE_READ | raw::REDISMODULE_WRITE
        } else {
            raw::REDISMODULE_READ
        } as c_int;
        Key {
            // SAFETY: a live context and key name (module invariant).
            ptr: unsafe { api!(RedisModule_OpenKey, ptr::null_mut(); ctx.ptr(), name.ptr(), mode) }
                .cast(),
        }
    }

    /// What the key holds: nothing, a lock of ours, or another type.
    #[inline]
    pub fn kind(&self) -> KeyKind {
        if self.ptr.is_null() {
            return KeyKind::Empty;
        }
        // SAFETY: an open key handle (non-null, closed only on drop).
        let t = unsafe { api!(RedisModule_KeyType, 0; self.ptr) } as isize;
        if t == raw::REDISMODULE_KEYTYPE_EMPTY {
            KeyKind::Empty
        } else if t == raw::REDISMODULE_KEYTYPE_MODULE
            // SAFETY: an open key holding a module value.
            && unsafe { api!(RedisModule_ModuleTypeGetType, ptr::null_mut(); self.ptr) } == lock_type()
        {
            KeyKind::Ours
        } else {
            KeyKind::Other
        }
    }

    /// The module value pointer of this key (null when there is none).
    #[inline]
    pub(in crate::ffi) fn raw_value(&self) -> *mut c_void {
        if self.ptr.is_null() {
            return ptr::null_mut();
        }
        // SAFETY: an open key handle; Redis returns null for a key of another kind.
        unsafe { api!(RedisModule_ModuleTypeGetValue, ptr::null_mut(); self.ptr) }
    }

    /// Store `value` (a block of ours, owned by Redis from now on) under this key;
    /// false when Redis refused (the caller still owns `value` then).
    #[inline]
    pub(in crate::ffi) fn set_value(&mut self, value: *mut c_void) -> bool {
        // SAFETY: an open key opened for writing; `lock_type()` is our registered type,
        // `value` a record of it.
        !self.ptr.is_null()
            && unsafe {
                api!(RedisModule_ModuleTypeSetValue, raw::REDISMODULE_ERR as c_int; self.ptr, lock_type(), value)
            } == raw::REDISMODULE_OK as c_int
    }

    /// Put `value` in place of this key's module value, which is returned (Redis does not
    /// free it: the caller owns it now); `None` when Redis refused (the caller still owns
    /// `value` then). The key must be open for writing and hold a value of our type.
    pub(in crate::ffi) fn replace_value(&mut self, value: *mut c_void) -> Option<*mut c_void> {
        if self.ptr.is_null() {
            return None;
        }
        let mut old: *mut c_void = ptr::null_mut();
        // SAFETY: an open key; our registered type, `value` a record of it, `old` a place for
        // the pointer Redis hands back.
        let rc = unsafe {
            api!(RedisModule_ModuleTypeReplaceValue, raw::REDISMODULE_ERR as c_int; self.ptr, lock_type(), value, &mut old)
        };
        (rc == raw::REDISMODULE_OK as c_int).then_some(old)
    }

    /// Delete the key (Redis frees its value): needs `&mut self`, so no borrow of the value
    /// can still be alive.
    #[inline]
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
            // SAFETY: opened by `Key::open`, closed once (a key Redis lent to a SCAN callback
            // is wrapped in `ManuallyDrop` and never gets here).
            unsafe { api!(RedisModule_CloseKey, (); self.ptr) };
        }
    }
}
