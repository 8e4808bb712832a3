//! Deterministic copies (G7): the effect command `FLOCK.APPLY` that the master replicates and
//! that AOF rewrite emits, carrying a [`Snapshot`] of the key: its kind, who holds it with
//! which tokens until when (absolute wall-clock deadlines), and its delayed slots. An
//! exclusive key keeps v1's short forms (`GRANT`, with `BOUND` for a bound grant, `DELAY`);
//! every other key is sent whole (`STATE`). Nothing clock-dependent is ever replicated
//! verbatim. The reverse, `FLOCK.APPLY` on a replica, parses back into the same `Snapshot`.

use crate::api;
use crate::ffi::{Ctx, RStr};
use flock_core::Snapshot;
use redis_module::raw;
use std::os::raw::{c_char, c_longlong};

const APPLY: &std::ffi::CStr = c"FLOCK.APPLY";

/// Send the effect of `$snapshot` on `$key` through `$api` (`RedisModule_Replicate` with a
/// context, or `RedisModule_EmitAOF` with an AOF handle): one argument list for both. Must be
/// used inside `unsafe`: the target handle must be live and every pointer passed outlives the
/// call (Redis copies the arguments).
macro_rules! emit {
    ($api:ident, $fallback:expr, $target:expr, $key:expr, $snapshot:expr) => {
        match $snapshot {
            Snapshot::Held(g) if g.bound() => api!($api, $fallback;
                $target,
                APPLY.as_ptr(),
                c"scbllc".as_ptr(),
                $key,
                c"GRANT".as_ptr(),
                g.owner.as_ptr().cast::<c_char>(),
                g.owner.len(),
                g.token as c_longlong,
                g.deadline.wall_ms as c_longlong,
                c"BOUND".as_ptr()
            ),
            Snapshot::Held(g) => api!($api, $fallback;
                $target,
                APPLY.as_ptr(),
                c"scbll".as_ptr(),
                $key,
                c"GRANT".as_ptr(),
                g.owner.as_ptr().cast::<c_char>(),
                g.owner.len(),
                g.token as c_longlong,
                g.deadline.wall_ms as c_longlong
            ),
            Snapshot::Delayed {
                last_token,
                until_wall_ms,
            } => api!($api, $fallback;
                $target,
                APPLY.as_ptr(),
                c"scll".as_ptr(),
                $key,
                c"DELAY".as_ptr(),
                last_token as c_longlong,
                until_wall_ms as c_longlong
            ),
            Snapshot::Full(state) => {
                let fields = StateFields::of(state);
                api!($api, $fallback;
                    $target,
                    APPLY.as_ptr(),
                    c"scv".as_ptr(),
                    $key,
                    c"STATE".as_ptr(),
                    fields.strings.as_ptr(),
                    fields.strings.len()
                )
            }
        }
    };
}

/// The fields of a `FLOCK.APPLY key STATE ...` effect as Redis strings (the `v` format takes
/// a vector of them; Redis takes its own references, these are freed on drop).
struct StateFields {
    strings: Vec<RStr>,
}

impl StateFields {
    fn of(state: &flock_core::LockState) -> StateFields {
        let strings = flock_core::snapshot::state_fields(state)
            .iter()
            .map(|f| crate::ffi::create_string(std::ptr::null_mut(), f))
            .collect();
        StateFields { strings }
    }
}

impl Drop for StateFields {
    fn drop(&mut self) {
        for s in self.strings.drain(..) {
            crate::ffi::free_string(s);
        }
    }
}

/// Replicate (to replicas and the AOF) that `key` is now as `snapshot` says.
pub fn state(ctx: Ctx, key: RStr, snapshot: Snapshot<'_>) {
    if crate::server::replication_consumed() {
        // SAFETY: a live command or timer context and key name; the format matches the
        // arguments, which live through the call.
        unsafe { emit!(RedisModule_Replicate, 0, ctx, key, snapshot) };
    }
}

/// Replicate that `key` left the keyspace (release, expiry).
pub fn delete(ctx: Ctx, key: RStr) {
    if crate::server::replication_consumed() {
        // SAFETY: a live context and key name; "s" takes one string handle.
        unsafe { api!(RedisModule_Replicate, 0; ctx, c"DEL".as_ptr(), c"s".as_ptr(), key) };
    }
}

/// Pass the command being run on as it is (a replica passing its master's effect on to its
/// own AOF and sub-replicas: the effect is deterministic).
pub fn verbatim(ctx: Ctx) {
    // SAFETY: a live command context.
    unsafe { api!(RedisModule_ReplicateVerbatim, 0; ctx) };
}

/// The same effect, written by AOF rewrite.
pub fn emit_aof(aof: *mut raw::RedisModuleIO, key: RStr, snapshot: Snapshot<'_>) {
    // SAFETY: `aof` and `key` are the handles Redis passed to the aof_rewrite callback.
    unsafe { emit!(RedisModule_EmitAOF, (), aof, key, snapshot) };
}

/// Only the replication stream and AOF loading may apply effects: a client that could call
/// `FLOCK.APPLY` could forge tokens.
pub fn caller_may_apply(ctx: Ctx) -> bool {
    let flags = crate::ffi::context_flags(ctx);
    flags & (raw::REDISMODULE_CTX_FLAGS_REPLICATED | raw::REDISMODULE_CTX_FLAGS_LOADING) != 0
}
