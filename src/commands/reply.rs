//! Replies: an engine reply as RESP, and the errors of a key no operation could run on.
//! Every error text comes from the one table (`flock_core::errors`).

use super::executor::NoLock;
use crate::ffi::{self, Ctx, RStr, Status};
use flock_core::engine::Reply;
use flock_core::errors::Fixed;

/// Send `reply` to the client of `ctx`; `key` names the lock key in error texts.
#[inline]
pub fn send(ctx: Ctx<'_>, key: RStr<'_>, reply: Reply<'_>) -> Status {
    match reply {
        Reply::Int(v) => ffi::reply_int(ctx, v),
        Reply::Null => ffi::reply_null(ctx),
        Reply::Ok => ffi::reply_simple(ctx, c"OK"),
        Reply::Error(e) => match e.static_text() {
            Some(text) => ffi::reply_error_static(ctx, text),
            None => ffi::reply_error_string(ctx, &e.message(ffi::bytes(&key))),
        },
        // The reply comes later, from the waiter's unblocking.
        Reply::Blocked => Status::OK,
        Reply::Info(info) => {
            ffi::reply_map(ctx, 8);
            ffi::reply_bulk(ctx, b"owner");
            match info.owner {
                Some(o) => ffi::reply_bulk(ctx, o),
                None => ffi::reply_null(ctx),
            };
            let ints: [(&[u8], i64); 3] = [
                (b"token", info.token as i64),
                (b"ttl", info.ttl_ms as i64),
                (b"waiters", info.waiters as i64),
            ];
            for (name, v) in ints {
                ffi::reply_bulk(ctx, name);
                ffi::reply_int(ctx, v);
            }
            ffi::reply_bulk(ctx, b"mode");
            ffi::reply_bulk(ctx, info.mode_name().as_bytes());
            let ints: [(&[u8], i64); 3] = [
                (b"holders", info.holders as i64),
                (b"limit", i64::from(info.limit)),
                (b"delayed", info.delayed as i64),
            ];
            for (name, v) in ints {
                ffi::reply_bulk(ctx, name);
                ffi::reply_int(ctx, v);
            }
            Status::OK
        }
        Reply::Holders(grants) => {
            ffi::reply_array(ctx, grants.len());
            for (owner, token, ttl_ms) in grants {
                ffi::reply_array(ctx, 3);
                ffi::reply_bulk(ctx, owner);
                ffi::reply_int(ctx, token as i64);
                ffi::reply_int(ctx, ttl_ms as i64);
            }
            Status::OK
        }
    }
}

/// The reply for a key [`super::executor::run`] could not run on; `missing` answers for no lock.
pub fn send_no_lock(ctx: Ctx<'_>, key: RStr<'_>, why: NoLock, missing: Reply<'static>) -> Status {
    match why {
        NoLock::Missing => send(ctx, key, missing),
        NoLock::WrongType => ffi::reply_error_static(ctx, Fixed::WrongType.text()),
        NoLock::NotStored => ffi::reply_error_static(ctx, Fixed::NotStored.text()),
    }
}
