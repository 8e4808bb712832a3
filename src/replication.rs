//! Deterministic copies (G7): the effect command `FLOCK.APPLY` that the master replicates and
//! that AOF rewrite emits, carrying who holds the key, which token, and until when (an absolute
//! wall-clock deadline). Nothing clock-dependent is ever replicated verbatim.

use crate::core::{Grant, LockState};
use crate::ffi::{Ctx, RStr};
use crate::rm;
use redis_module::raw;
use std::os::raw::{c_char, c_longlong};

const APPLY: &std::ffi::CStr = c"FLOCK.APPLY";

/// Send the GRANT effect of `$grant` on `$key` through `$api` (`RedisModule_Replicate` with a
/// context, or `RedisModule_EmitAOF` with an AOF handle): one argument list for both.
macro_rules! grant_effect {
    ($api:ident, $fallback:expr, $target:expr, $key:expr, $grant:expr) => {
        rm!($api, $fallback;
            $target,
            APPLY.as_ptr(),
            c"scbll".as_ptr(),
            $key,
            c"GRANT".as_ptr(),
            $grant.owner.as_ptr().cast::<c_char>(),
            $grant.owner.len(),
            $grant.token as c_longlong,
            $grant.deadline.wall_ms as c_longlong
        )
    };
}

/// The DELAY effect (nobody holds the key; lock-delay until `$until_ms`), likewise.
macro_rules! delay_effect {
    ($api:ident, $fallback:expr, $target:expr, $key:expr, $last_token:expr, $until_ms:expr) => {
        rm!($api, $fallback;
            $target,
            APPLY.as_ptr(),
            c"scll".as_ptr(),
            $key,
            c"DELAY".as_ptr(),
            $last_token as c_longlong,
            $until_ms as c_longlong
        )
    };
}

/// Replicate (to replicas and the AOF) that `key` is held by `grant`.
pub fn grant(ctx: Ctx, key: RStr, grant: &Grant) {
    if crate::server::replication_consumed() {
        grant_effect!(RedisModule_Replicate, 0, ctx, key, grant);
    }
}

/// Replicate that nobody holds `key`, which is in lock-delay until `until_wall_ms`.
pub fn delay(ctx: Ctx, key: RStr, last_token: u64, until_wall_ms: i64) {
    if crate::server::replication_consumed() {
        delay_effect!(
            RedisModule_Replicate,
            0,
            ctx,
            key,
            last_token,
            until_wall_ms
        );
    }
}

/// Replicate that `key` left the keyspace (release, expiry).
pub fn delete(ctx: Ctx, key: RStr) {
    if crate::server::replication_consumed() {
        rm!(RedisModule_Replicate, 0; ctx, c"DEL".as_ptr(), c"s".as_ptr(), key);
    }
}

/// The same effects, written by AOF rewrite.
pub fn emit_state(aof: *mut raw::RedisModuleIO, key: RStr, state: &LockState) {
    if let Some(grant) = &state.holder {
        grant_effect!(RedisModule_EmitAOF, (), aof, key, grant);
    } else if let Some(d) = state.delay {
        delay_effect!(
            RedisModule_EmitAOF,
            (),
            aof,
            key,
            state.last_token,
            d.wall_ms
        );
    }
}

/// Only the replication stream and AOF loading may apply effects: a client that could call
/// `FLOCK.APPLY` could forge tokens.
pub fn caller_may_apply(ctx: Ctx) -> bool {
    let flags = crate::ffi::context_flags(ctx);
    flags & (raw::REDISMODULE_CTX_FLAGS_REPLICATED | raw::REDISMODULE_CTX_FLAGS_LOADING) != 0
}
