//! Redis Cluster: the token high-water mark shared between nodes, and whether this node still
//! serves a key's slot (for waiters whose key migrated away).

use crate::ffi::{self, Ctx};
use crate::{api, server};
use flock_core::slots::{key_slot, slot_state, SlotState};
use redis_module::raw;
use std::os::raw::{c_char, c_uchar};
use std::ptr;
use std::sync::atomic::{AtomicBool, Ordering};

/// Cluster bus message type carrying a node's token high-water mark (8 bytes, little endian).
const MSG_HIGH_WATER: u8 = 1;

static ENABLED: AtomicBool = AtomicBool::new(false);

pub fn init(ctx: Ctx) {
    let on = ffi::context_flags(ctx) & raw::REDISMODULE_CTX_FLAGS_CLUSTER != 0;
    ENABLED.store(on, Ordering::Relaxed);
    if on {
        // SAFETY: the init context; `on_high_water` is a plain function of this file.
        unsafe {
            api!(RedisModule_RegisterClusterMessageReceiver, ();
                ctx, MSG_HIGH_WATER, Some(on_high_water))
        };
    }
}

pub fn enabled() -> bool {
    ENABLED.load(Ordering::Relaxed)
}

/// Tell every node our high-water mark (from the cron, ten times a second). A node that gets
/// a slot by migration or failover then issues tokens above every token we issued up to the
/// last broadcast, whatever the clocks say (G3 across nodes).
pub fn broadcast_high_water(ctx: Ctx) {
    if !enabled() || !server::is_master() {
        return;
    }
    let mark = server::tokens().high_water();
    if mark == 0 {
        return;
    }
    let bytes = mark.to_le_bytes();
    // SAFETY: the cron's live context; a null target broadcasts; Redis copies the 8 bytes.
    unsafe {
        api!(RedisModule_SendClusterMessage, 0;
            ctx, ptr::null(), MSG_HIGH_WATER, bytes.as_ptr().cast::<c_char>(), bytes.len() as u32)
    };
}

unsafe extern "C" fn on_high_water(
    _ctx: Ctx,
    _sender: *const c_char,
    _type: u8,
    payload: *const c_uchar,
    len: u32,
) {
    if payload.is_null() || len != 8 {
        return;
    }
    let mut bytes = [0u8; 8];
    // SAFETY: Redis passes a payload of `len` (checked: 8) bytes, valid during the callback.
    bytes.copy_from_slice(unsafe { std::slice::from_raw_parts(payload, 8) });
    let mark = u64::from_le_bytes(bytes);
    if mark <= flock_core::MAX_TOKEN {
        server::tokens().observe(mark);
    }
}

/// Whether this node serves the slot of `key` and is not migrating it away.
pub fn serves_stably(ctx: Ctx, key: &[u8]) -> bool {
    if !enabled() {
        return true;
    }
    // SAFETY: a live context; "c" takes one C string, NUL-terminated.
    let reply = unsafe {
        api!(RedisModule_Call, ptr::null_mut(); ctx, c"CLUSTER".as_ptr(), c"c".as_ptr(), c"NODES".as_ptr())
    };
    if reply.is_null() {
        return false;
    }
    let mut len = 0usize;
    // SAFETY: the live reply made above (freed below).
    let p = unsafe { api!(RedisModule_CallReplyStringPtr, ptr::null(); reply, &mut len) };
    let stable = if p.is_null() {
        false
    } else {
        // SAFETY: the reply's buffer of `len` bytes, valid until the reply is freed.
        let text = unsafe { std::slice::from_raw_parts(p.cast::<u8>(), len) };
        slot_state(&String::from_utf8_lossy(text), key_slot(key)) == SlotState::Stable
    };
    // SAFETY: the reply made above, freed once.
    unsafe { api!(RedisModule_FreeCallReply, (); reply) };
    stable
}
