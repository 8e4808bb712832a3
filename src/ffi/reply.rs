//! Replies to the client of a command (or reply callback) context.

use super::handle::{Ctx, Status};
use redis_module::raw;
use std::ffi::CStr;
use std::os::raw::{c_char, c_int, c_long};

const ERR: c_int = raw::REDISMODULE_ERR as c_int;

#[inline]
pub fn reply_int(ctx: Ctx<'_>, v: i64) -> Status {
    // SAFETY: a live command context (module invariant).
    Status(unsafe { api!(RedisModule_ReplyWithLongLong, ERR; ctx.ptr(), v) })
}

#[inline]
pub fn reply_null(ctx: Ctx<'_>) -> Status {
    // SAFETY: a live command context (module invariant).
    Status(unsafe { api!(RedisModule_ReplyWithNull, ERR; ctx.ptr()) })
}

/// An error reply from a C string literal (no allocation).
#[inline]
pub fn reply_error_static(ctx: Ctx<'_>, msg: &'static CStr) -> Status {
    // SAFETY: a live command context; `msg` is NUL-terminated.
    Status(unsafe { api!(RedisModule_ReplyWithError, ERR; ctx.ptr(), msg.as_ptr()) })
}

/// An error reply from any text (NUL, CR and LF dropped so the reply stays one RESP line).
pub fn reply_error_string(ctx: Ctx<'_>, msg: &str) -> Status {
    let mut buf: Vec<u8> = msg
        .bytes()
        .filter(|&b| b != 0 && b != b'\r' && b != b'\n')
        .collect();
    buf.push(0);
    // SAFETY: a live command context; `buf` is NUL-terminated and outlives the call.
    Status(unsafe {
        api!(RedisModule_ReplyWithError, ERR; ctx.ptr(), buf.as_ptr().cast::<c_char>())
    })
}

#[inline]
pub fn reply_simple(ctx: Ctx<'_>, msg: &'static CStr) -> Status {
    // SAFETY: a live command context; `msg` is NUL-terminated.
    Status(unsafe { api!(RedisModule_ReplyWithSimpleString, ERR; ctx.ptr(), msg.as_ptr()) })
}

pub fn reply_bulk(ctx: Ctx<'_>, b: &[u8]) -> Status {
    // SAFETY: a live command context; Redis copies `b.len()` bytes from a valid slice.
    Status(unsafe {
        api!(RedisModule_ReplyWithStringBuffer, ERR; ctx.ptr(), b.as_ptr().cast::<c_char>(), b.len())
    })
}

pub fn reply_map(ctx: Ctx<'_>, len: usize) -> Status {
    // SAFETY: a live command context.
    Status(unsafe { api!(RedisModule_ReplyWithMap, ERR; ctx.ptr(), len as c_long) })
}

pub fn reply_array(ctx: Ctx<'_>, len: usize) -> Status {
    // SAFETY: a live command context.
    Status(unsafe { api!(RedisModule_ReplyWithArray, ERR; ctx.ptr(), len as c_long) })
}

pub fn wrong_arity(ctx: Ctx<'_>) -> Status {
    // SAFETY: a live command context.
    Status(unsafe { api!(RedisModule_WrongArity, ERR; ctx.ptr()) })
}
