//! The FLOCK.* command handlers: parse the arguments, open the key, run the engine's
//! operation through the executor, reply. (FLOCK.FENCED is in `fenced.rs`;
//! registration in `registration/module.rs`.)

use super::executor::{self, KeyWaiters, Op, ServerCx};
use super::reply;
use crate::ffi::block::{self, Found};
use crate::ffi::{self, Ctx, Key, RStr, Status};
use crate::peers::replication;
use crate::server::{self, config};
use crate::store::bindings;
use crate::waiting::waiters;
use flock_core::args::{self, AcquireArgs, ArgError};
use flock_core::engine::{self, Outcome, Reply, Stored};
use flock_core::errors::Fixed;

/// Run `f` over the arguments as byte slices, without allocating for the usual arities.
fn with_bytes<R>(args: &[RStr<'_>], f: impl FnOnce(&[&[u8]]) -> R) -> R {
    const N: usize = 8;
    if args.len() <= N {
        let mut buf: [&[u8]; N] = [&[]; N];
        for (slot, a) in buf.iter_mut().zip(args) {
            *slot = ffi::bytes(a);
        }
        f(&buf[..args.len()])
    } else {
        let v: Vec<&[u8]> = args.iter().map(ffi::bytes).collect();
        f(&v)
    }
}

fn reply_arg_error(ctx: Ctx<'_>, e: ArgError) -> Status {
    match e {
        ArgError::Arity => ffi::wrong_arity(ctx),
        other => ffi::reply_error_string(ctx, &other.message()),
    }
}

/// The key name argument (callers have checked the arity: `None` is not reached, and
/// answered as a wrong arity).
fn key_arg<'a>(args: &[RStr<'a>]) -> Option<RStr<'a>> {
    args.get(1).copied()
}

/// Run a write operation on the key of `args` and reply; `missing` answers when there is no
/// lock (and `create` is false).
fn write_op(
    ctx: Ctx<'_>,
    args: &[RStr<'_>],
    create: bool,
    missing: Reply<'static>,
    op: impl FnOnce(Stored<'_>, &mut ServerCx, &mut KeyWaiters<'_>) -> Outcome,
) -> Status {
    let Some(key_name) = key_arg(args) else {
        return ffi::wrong_arity(ctx);
    };
    let mut key = Key::open(ctx, key_name, true);
    write_op_on(ctx, key_name, &mut key, create, missing, op)
}

/// [`write_op`] on a key already open for writing.
fn write_op_on(
    ctx: Ctx<'_>,
    key_name: RStr<'_>,
    key: &mut Key,
    create: bool,
    missing: Reply<'static>,
    op: impl Op,
) -> Status {
    match executor::run_with(ctx, key_name, key, create, op) {
        Ok(r) => reply::send(ctx, key_name, r),
        Err(why) => reply::send_no_lock(ctx, key_name, why, missing),
    }
}

/// `FLOCK.ACQUIRE key owner ttl [BLOCK timeout]`
pub fn acquire(ctx: Ctx<'_>, args: &[RStr<'_>]) -> Status {
    with_bytes(args, |argv| {
        let a = match args::parse_acquire(argv, config::max_ttl_ms(), config::max_holders()) {
            Ok(a) => a,
            Err(e) => return reply_arg_error(ctx, e),
        };
        // A BOUND grant lives with the caller's connection: there must be one.
        let bind_to = match a.bound {
            false => None,
            true => match bindings::client_connection(ctx) {
                Some(client) => Some(client),
                None => return reply_arg_error(ctx, ArgError::BoundNeedsClient),
            },
        };
        // Only a BLOCK call asks whether it may block (not inside MULTI or a script).
        let can_block = a.block.is_some() && waiters::can_block(ctx);
        let Some(key_name) = key_arg(args) else {
            return ffi::wrong_arity(ctx);
        };
        let mut key = Key::open(ctx, key_name, true);
        write_op_on(
            ctx,
            key_name,
            &mut key,
            true,
            Reply::Null,
            AcquireOp {
                args: &a,
                can_block,
                bind_to,
            },
        )
    })
}

/// `FLOCK.RELEASE key owner [token]`
pub fn release(ctx: Ctx<'_>, args: &[RStr<'_>]) -> Status {
    with_bytes(args, |argv| {
        let (owner, token) = match args::parse_release(argv) {
            Ok(o) => o,
            Err(e) => return reply_arg_error(ctx, e),
        };
        let Some(key_name) = key_arg(args) else {
            return ffi::wrong_arity(ctx);
        };
        let mut key = Key::open(ctx, key_name, true);
        write_op_on(
            ctx,
            key_name,
            &mut key,
            false,
            Reply::Int(0),
            ReleaseOp { owner, token },
        )
    })
}

/// FLOCK.ACQUIRE's operation as an [`Op`] of its own (not a closure), run inlined where the
/// executor knows the key's form: on a free key only the engine's fast path is left of it.
struct AcquireOp<'a> {
    args: &'a AcquireArgs<'a>,
    can_block: bool,
    bind_to: Option<u64>,
}

impl Op for AcquireOp<'_> {
    #[inline(always)]
    fn run(self, stored: Stored<'_>, cx: &mut ServerCx, w: &mut KeyWaiters<'_>, out: &mut Outcome) {
        let (args, can_block, bind_to) = (self.args, self.can_block, self.bind_to);
        engine::acquire_into(stored, cx, w, args, can_block, bind_to, out);
    }
}

/// FLOCK.RELEASE's operation, as [`AcquireOp`] (on a lone grant: the engine's fast path).
struct ReleaseOp<'a> {
    owner: &'a [u8],
    token: Option<u64>,
}

impl Op for ReleaseOp<'_> {
    #[inline(always)]
    fn run(self, stored: Stored<'_>, cx: &mut ServerCx, w: &mut KeyWaiters<'_>, out: &mut Outcome) {
        engine::release_into(stored, cx, w, self.owner, self.token, out);
    }
}

/// `FLOCK.REVOKE key [owner]`
pub fn revoke(ctx: Ctx<'_>, args: &[RStr<'_>]) -> Status {
    with_bytes(args, |argv| {
        let owner = match args::parse_revoke(argv) {
            Ok(o) => o,
            Err(e) => return reply_arg_error(ctx, e),
        };
        write_op(ctx, args, false, Reply::Int(0), |stored, cx, w| {
            engine::revoke(stored, cx, w, owner)
        })
    })
}

/// `FLOCK.RENEW key owner ttl [token]`
pub fn renew(ctx: Ctx<'_>, args: &[RStr<'_>]) -> Status {
    with_bytes(args, |argv| {
        let (owner, ttl_ms, token) = match args::parse_renew(argv, config::max_ttl_ms()) {
            Ok(v) => v,
            Err(e) => return reply_arg_error(ctx, e),
        };
        write_op(ctx, args, false, Reply::Null, |stored, cx, w| {
            engine::renew(stored, cx, w, owner, ttl_ms, token)
        })
    })
}

/// `FLOCK.CHECK key token`
pub fn check(ctx: Ctx<'_>, args: &[RStr<'_>]) -> Status {
    let token = match with_bytes(args, args::parse_check) {
        Ok(t) => t,
        Err(e) => return reply_arg_error(ctx, e),
    };
    let Some(key_name) = key_arg(args) else {
        return ffi::wrong_arity(ctx);
    };
    let key = Key::open(ctx, key_name, false);
    match block::lock_of(&key) {
        Found::OtherType => ffi::reply_error_static(ctx, Fixed::WrongType.text()),
        Found::Nothing => reply::send(ctx, key_name, engine::check(None, token, server::now())),
        Found::Lock(rec) => reply::send(
            ctx,
            key_name,
            engine::check(Some(&*rec), token, server::now()),
        ),
    }
}

/// `FLOCK.INFO key`
pub fn info(ctx: Ctx<'_>, args: &[RStr<'_>]) -> Status {
    if let Err(e) = with_bytes(args, args::parse_info) {
        return reply_arg_error(ctx, e);
    }
    let Some(key_name) = key_arg(args) else {
        return ffi::wrong_arity(ctx);
    };
    let waiting = waiters::count(ctx, key_name);
    let waiting_mode = if waiting > 0 {
        waiters::shared_mode(ctx, key_name)
    } else {
        None
    };
    let key = Key::open(ctx, key_name, false);
    let now = server::now();
    match block::lock_of(&key) {
        Found::OtherType => ffi::reply_error_static(ctx, Fixed::WrongType.text()),
        Found::Nothing => reply::send(
            ctx,
            key_name,
            engine::info(None, waiting, waiting_mode, now),
        ),
        Found::Lock(rec) => reply::send(
            ctx,
            key_name,
            engine::info(Some(&*rec), waiting, waiting_mode, now),
        ),
    }
}

/// `FLOCK.HOLDERS key`
pub fn holders(ctx: Ctx<'_>, args: &[RStr<'_>]) -> Status {
    if let Err(e) = with_bytes(args, args::parse_holders) {
        return reply_arg_error(ctx, e);
    }
    let Some(key_name) = key_arg(args) else {
        return ffi::wrong_arity(ctx);
    };
    let key = Key::open(ctx, key_name, false);
    let now = server::now();
    match block::lock_of(&key) {
        Found::OtherType => ffi::reply_error_static(ctx, Fixed::WrongType.text()),
        Found::Nothing => reply::send(ctx, key_name, engine::holders(None, now)),
        Found::Lock(rec) => reply::send(ctx, key_name, engine::holders(Some(&*rec), now)),
    }
}

/// `FLOCK.APPLY key GRANT|DELAY|STATE ...`: the replication effects (see
/// `flock_core::args::parse_apply`). Accepted only from the master's replication stream and from AOF
/// loading.
pub fn apply(ctx: Ctx<'_>, args: &[RStr<'_>]) -> Status {
    if !replication::caller_may_apply(ctx) {
        return ffi::reply_error_static(ctx, Fixed::ApplyInternal.text());
    }
    with_bytes(args, |argv| {
        if let Some(mark) = args::parse_apply_mark(argv) {
            return match mark {
                Ok(token) => {
                    server::tokens().observe(token);
                    // A replica passes it on to its own replicas and AOF.
                    replication::verbatim(ctx);
                    ffi::reply_simple(ctx, c"OK")
                }
                Err(e) => reply_arg_error(ctx, e),
            };
        }
        let image = match args::parse_apply(argv) {
            Ok(image) => image,
            Err(e) => return reply_arg_error(ctx, e),
        };
        write_op(ctx, args, true, Reply::Null, |stored, cx, _| {
            engine::apply(stored, cx, image)
        })
    })
}
