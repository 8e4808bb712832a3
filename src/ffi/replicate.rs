//! The effect command `FLOCK.APPLY` sent to replicas (`RedisModule_Replicate`) and written by
//! AOF rewrite (`RedisModule_EmitAOF`), from a [`Snapshot`] (what it carries is said in
//! `peers/replication.rs`); `DEL`; and verbatim replication.

use super::handle::{Ctx, RStr, RString};
use super::lock_type::Aof;
use flock_core::apply::{encode_apply, ApplyArg, ApplySink, APPLY_COMMAND, MARK};
use flock_core::Snapshot;
use std::ffi::CStr;
use std::os::raw::{c_char, c_longlong};

/// Where an effect goes: replicas (`RedisModule_Replicate`, with the command's context) or
/// the AOF being rewritten (`RedisModule_EmitAOF`, with its handle).
#[derive(Clone, Copy)]
enum Target<'a> {
    Replicas(Ctx<'a>),
    Aof(Aof<'a>),
}

/// Call `$api` of `$target` for `FLOCK.APPLY $key` with the format and arguments given. Must
/// be used inside `unsafe`: the target handle must be live and every pointer passed outlives
/// the call (Redis copies the arguments).
macro_rules! emit {
    ($target:expr, $key:expr, $fmt:expr $(, $arg:expr)* $(,)?) => {
        match $target {
            Target::Replicas(ctx) => {
                api!(RedisModule_Replicate, 0; ctx.ptr(), APPLY_COMMAND.as_ptr(), $fmt.as_ptr(), $key $(, $arg)*);
            }
            Target::Aof(aof) => {
                api!(RedisModule_EmitAOF, (); aof.0.as_ptr(), APPLY_COMMAND.as_ptr(), $fmt.as_ptr(), $key $(, $arg)*);
            }
        }
    };
}

/// The FLOCK.APPLY encoder's sink (`flock_core::apply`, which decides the words): each of its
/// argument shapes as one call with the matching format.
struct Emit<'a> {
    target: Target<'a>,
    key: RStr<'a>,
}

impl ApplySink for Emit<'_> {
    fn short(&mut self, args: &[ApplyArg<'_>]) {
        let key = self.key.ptr();
        // SAFETY (each call): a live target and key; the formats match the arguments, which
        // live through the call.
        match *args {
            [ApplyArg::Word(w), ApplyArg::Bytes(o), ApplyArg::Int(t), ApplyArg::Int(d)] => unsafe {
                emit!(
                    self.target,
                    key,
                    c"scbll",
                    w.as_ptr(),
                    o.as_ptr().cast::<c_char>(),
                    o.len(),
                    t as c_longlong,
                    d as c_longlong
                );
            },
            [ApplyArg::Word(w), ApplyArg::Bytes(o), ApplyArg::Int(t), ApplyArg::Int(d), ApplyArg::Word(b)] =>
            unsafe {
                emit!(
                    self.target,
                    key,
                    c"scbllc",
                    w.as_ptr(),
                    o.as_ptr().cast::<c_char>(),
                    o.len(),
                    t as c_longlong,
                    d as c_longlong,
                    b.as_ptr()
                );
            },
            [ApplyArg::Word(w), ApplyArg::Int(a), ApplyArg::Int(b)] => unsafe {
                emit!(
                    self.target,
                    key,
                    c"scll",
                    w.as_ptr(),
                    a as c_longlong,
                    b as c_longlong
                );
            },
            // The encoder makes no other shape (`flock_core::apply::SHORT_SHAPES`).
            _ => {}
        }
    }

    fn state(&mut self, word: &'static CStr, fields: &[Vec<u8>]) {
        // Redis made no string (its allocator aborts before that): nothing to send.
        let Some(fields) = StateFields::of(fields) else {
            return;
        };
        let key = self.key.ptr();
        // SAFETY: a live target and key; "v" takes the vector of `len` string handles, which
        // live through the call (`RString` is a transparent string pointer).
        unsafe {
            emit!(
                self.target,
                key,
                c"scv",
                word.as_ptr(),
                fields
                    .strings
                    .as_ptr()
                    .cast::<*mut redis_module::raw::RedisModuleString>()
                    .cast_mut(),
                fields.strings.len()
            );
        }
    }
}

/// The fields of a `FLOCK.APPLY key STATE ...` effect as Redis strings (the `v` format takes
/// a vector of them; Redis takes its own references, these are freed on drop).
struct StateFields {
    strings: Vec<RString>,
}

impl StateFields {
    fn of(fields: &[Vec<u8>]) -> Option<StateFields> {
        let strings = fields
            .iter()
            .map(|f| RString::detached(f))
            .collect::<Option<Vec<RString>>>()?;
        Some(StateFields { strings })
    }
}

/// Replicate (to replicas and the AOF) that `key` is now as `snapshot` says.
pub fn replicate_state(ctx: Ctx<'_>, key: RStr<'_>, snapshot: Snapshot<'_>) {
    let mut sink = Emit {
        target: Target::Replicas(ctx),
        key,
    };
    encode_apply(snapshot, &mut sink);
}

/// Replicate that `key` left the keyspace (release, expiry).
pub fn replicate_delete(ctx: Ctx<'_>, key: RStr<'_>) {
    // SAFETY: a live context and key name; "s" takes one string handle.
    unsafe { api!(RedisModule_Replicate, 0; ctx.ptr(), c"DEL".as_ptr(), c"s".as_ptr(), key.ptr()) };
}

/// Replicate the server's token mark (`FLOCK.APPLY MARK token`: no key).
pub fn replicate_mark(ctx: Ctx<'_>, token: u64) {
    // SAFETY: a live context; "cl" takes a C string and a long long.
    unsafe {
        api!(RedisModule_Replicate, 0; ctx.ptr(), APPLY_COMMAND.as_ptr(), c"cl".as_ptr(),
            MARK.as_ptr(), token as c_longlong)
    };
}

/// Pass the command being run on as it is.
pub fn replicate_verbatim(ctx: Ctx<'_>) {
    // SAFETY: a live command context.
    unsafe { api!(RedisModule_ReplicateVerbatim, 0; ctx.ptr()) };
}

/// The same effect, written by AOF rewrite.
pub fn emit_aof(aof: Aof<'_>, key: RStr<'_>, snapshot: Snapshot<'_>) {
    let mut sink = Emit {
        target: Target::Aof(aof),
        key,
    };
    encode_apply(snapshot, &mut sink);
}
