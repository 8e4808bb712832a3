//! The effect command `FLOCK.APPLY` sent to replicas (`RedisModule_Replicate`) and written by
//! AOF rewrite (`RedisModule_EmitAOF`), from a [`Snapshot`] (what it carries is said in
//! `peers/replication.rs`); `DEL`; and verbatim replication.

use super::handle::{Ctx, RStr, RString};
use super::lock_type::Aof;
use flock_core::Snapshot;
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
            Snapshot::Full(state) => match StateFields::of(state) {
                Some(fields) => api!($api, $fallback;
                    $target,
                    APPLY.as_ptr(),
                    c"scv".as_ptr(),
                    $key,
                    c"STATE".as_ptr(),
                    fields.strings.as_ptr().cast::<*mut redis_module::raw::RedisModuleString>().cast_mut(),
                    fields.strings.len()
                ),
                // Redis made no string (its allocator aborts before that): nothing to send.
                None => $fallback,
            },
        }
    };
}

/// The fields of a `FLOCK.APPLY key STATE ...` effect as Redis strings (the `v` format takes
/// a vector of them; Redis takes its own references, these are freed on drop).
struct StateFields {
    strings: Vec<RString>,
}

impl StateFields {
    fn of(state: &flock_core::LockState) -> Option<StateFields> {
        let strings = flock_core::snapshot::state_fields(state)
            .iter()
            .map(|f| RString::detached(f))
            .collect::<Option<Vec<RString>>>()?;
        Some(StateFields { strings })
    }
}

/// Replicate (to replicas and the AOF) that `key` is now as `snapshot` says.
pub fn replicate_state(ctx: Ctx<'_>, key: RStr<'_>, snapshot: Snapshot<'_>) {
    // SAFETY: a live command or timer context and key name; the format matches the
    // arguments, which live through the call; `RString` is a transparent string pointer.
    unsafe { emit!(RedisModule_Replicate, 0, ctx.ptr(), key.ptr(), snapshot) };
}

/// Replicate that `key` left the keyspace (release, expiry).
pub fn replicate_delete(ctx: Ctx<'_>, key: RStr<'_>) {
    // SAFETY: a live context and key name; "s" takes one string handle.
    unsafe { api!(RedisModule_Replicate, 0; ctx.ptr(), c"DEL".as_ptr(), c"s".as_ptr(), key.ptr()) };
}

/// Pass the command being run on as it is.
pub fn replicate_verbatim(ctx: Ctx<'_>) {
    // SAFETY: a live command context.
    unsafe { api!(RedisModule_ReplicateVerbatim, 0; ctx.ptr()) };
}

/// The same effect, written by AOF rewrite.
pub fn emit_aof(aof: Aof<'_>, key: RStr<'_>, snapshot: Snapshot<'_>) {
    // SAFETY: `aof` and `key` are the handles Redis passed to the aof_rewrite callback.
    unsafe { emit!(RedisModule_EmitAOF, (), aof.0.as_ptr(), key.ptr(), snapshot) };
}
