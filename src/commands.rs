//! The FLOCK.* command handlers: parse arguments, open the key, call the core, reply,
//! replicate the effect, notify.

use crate::args::{self, ArgError};
use crate::core::{Acquired, Grant, LockState};
use crate::ffi::{self, Ctx, Key, KeyKind, RStr};
use crate::lock_type::LockRecord;
use crate::{config, expiry, replication, server, stats};
use redis_module::raw;
use std::os::raw::c_int;

const WRONGTYPE: &str = "WRONGTYPE Operation against a key holding the wrong kind of value\0";

/// Run `f` over the arguments as byte slices, without allocating for the usual arities.
fn with_bytes<R>(args: &[RStr], f: impl FnOnce(&[&[u8]]) -> R) -> R {
    const N: usize = 8;
    if args.len() <= N {
        let mut buf: [&[u8]; N] = [&[]; N];
        for (slot, a) in buf.iter_mut().zip(args) {
            *slot = ffi::bytes(*a);
        }
        f(&buf[..args.len()])
    } else {
        let v: Vec<&[u8]> = args.iter().map(|a| ffi::bytes(*a)).collect();
        f(&v)
    }
}

fn reply_arg_error(ctx: Ctx, e: ArgError) -> c_int {
    match e {
        ArgError::Arity => ffi::wrong_arity(ctx),
        other => ffi::reply_error_string(ctx, &other.message()),
    }
}

/// The key name argument (callers have checked the arity).
fn key_arg(args: &[RStr]) -> RStr {
    args.get(1).copied().unwrap_or(std::ptr::null_mut())
}

/// Store a fresh record holding `state` under an empty key.
fn create<'a>(key: &Key, state: LockState) -> Option<&'a mut LockRecord> {
    let rec = Box::into_raw(Box::new(LockRecord {
        state,
        timer: 0,
        timer_token: 0,
    }));
    if !key.set_value(server::lock_type(), rec.cast()) {
        drop(unsafe { Box::from_raw(rec) });
        return None;
    }
    unsafe { rec.as_mut() }
}

fn granted(ctx: Ctx, key_name: RStr, grant: Option<&Grant>) {
    if let Some(g) = grant {
        replication::grant(ctx, key_name, g);
    }
    stats::GRANTS.incr();
    ffi::notify(ctx, "flock.acquired\0", key_name);
}

/// `FLOCK.ACQUIRE key owner ttl [BLOCK timeout]`
pub fn acquire(ctx: Ctx, args: &[RStr]) -> c_int {
    with_bytes(args, |argv| {
        let a = match args::parse_acquire(argv, config::max_ttl_ms()) {
            Ok(a) => a,
            Err(e) => return reply_arg_error(ctx, e),
        };
        if a.block.is_some() {
            return ffi::reply_error_static(
                ctx,
                "ERR BLOCK is not supported by this version of flock\0",
            );
        }
        let key_name = key_arg(args);
        let key = Key::open(ctx, key_name, true);
        let now = server::now();
        let mut tokens = server::tokens();
        match key.kind(server::lock_type()) {
            KeyKind::Other => ffi::reply_error_static(ctx, WRONGTYPE),
            KeyKind::Empty => {
                let mut state = LockState::default();
                match state.acquire(a.owner, a.ttl_ms, now, &mut tokens) {
                    Acquired::Granted(token) => {
                        drop(tokens);
                        let Some(rec) = create(&key, state) else {
                            return ffi::reply_error_static(ctx, "ERR could not store the lock\0");
                        };
                        expiry::arm(ctx, key_name, rec);
                        granted(ctx, key_name, rec.state.holder.as_ref());
                        ffi::reply_int(ctx, token as i64)
                    }
                    _ => ffi::reply_error_static(ctx, "ERR token space exhausted\0"),
                }
            }
            KeyKind::Ours => {
                let Some(rec) = (unsafe { key.value::<LockRecord>().as_mut() }) else {
                    return ffi::reply_null(ctx);
                };
                if let Some(_ended) = rec.state.expire(now) {
                    stats::EXPIRATIONS.incr();
                    ffi::notify(ctx, "flock.expired\0", key_name);
                }
                match rec.state.acquire(a.owner, a.ttl_ms, now, &mut tokens) {
                    Acquired::Granted(token) => {
                        drop(tokens);
                        granted(ctx, key_name, rec.state.holder.as_ref());
                        expiry::arm(ctx, key_name, rec);
                        ffi::reply_int(ctx, token as i64)
                    }
                    Acquired::Refreshed(token) => {
                        drop(tokens);
                        if let Some(g) = rec.state.holder.as_ref() {
                            replication::grant(ctx, key_name, g);
                        }
                        ffi::reply_int(ctx, token as i64)
                    }
                    Acquired::Busy => {
                        stats::CONTENDED.incr();
                        ffi::reply_null(ctx)
                    }
                    Acquired::TokensExhausted => {
                        drop(tokens);
                        if rec.state.is_vacant(now) {
                            replication::delete(ctx, key_name);
                            key.delete();
                        }
                        ffi::reply_error_static(ctx, "ERR token space exhausted\0")
                    }
                }
            }
        }
    })
}

/// `FLOCK.RELEASE key owner`
pub fn release(ctx: Ctx, args: &[RStr]) -> c_int {
    with_bytes(args, |argv| {
        let owner = match args::parse_release(argv) {
            Ok(o) => o,
            Err(e) => return reply_arg_error(ctx, e),
        };
        let key_name = key_arg(args);
        let key = Key::open(ctx, key_name, true);
        match key.kind(server::lock_type()) {
            KeyKind::Other => ffi::reply_error_static(ctx, WRONGTYPE),
            KeyKind::Empty => ffi::reply_int(ctx, 0),
            KeyKind::Ours => {
                let Some(rec) = (unsafe { key.value::<LockRecord>().as_mut() }) else {
                    return ffi::reply_int(ctx, 0);
                };
                let now = server::now();
                if expiry::reap(ctx, key_name, &key, rec, now) {
                    return ffi::reply_int(ctx, 0);
                }
                if !rec.state.release(owner, now) {
                    return ffi::reply_int(ctx, 0);
                }
                stats::RELEASES.incr();
                ffi::notify(ctx, "flock.released\0", key_name);
                if rec.state.is_vacant(now) {
                    replication::delete(ctx, key_name);
                    key.delete();
                }
                ffi::reply_int(ctx, 1)
            }
        }
    })
}

/// `FLOCK.RENEW key owner ttl`
pub fn renew(ctx: Ctx, args: &[RStr]) -> c_int {
    with_bytes(args, |argv| {
        let (owner, ttl_ms) = match args::parse_renew(argv, config::max_ttl_ms()) {
            Ok(v) => v,
            Err(e) => return reply_arg_error(ctx, e),
        };
        let key_name = key_arg(args);
        let key = Key::open(ctx, key_name, true);
        match key.kind(server::lock_type()) {
            KeyKind::Other => ffi::reply_error_static(ctx, WRONGTYPE),
            KeyKind::Empty => ffi::reply_null(ctx),
            KeyKind::Ours => {
                let Some(rec) = (unsafe { key.value::<LockRecord>().as_mut() }) else {
                    return ffi::reply_null(ctx);
                };
                let now = server::now();
                if expiry::reap(ctx, key_name, &key, rec, now) {
                    return ffi::reply_null(ctx);
                }
                match rec.state.renew(owner, ttl_ms, now) {
                    Some(token) => {
                        if let Some(g) = rec.state.holder.as_ref() {
                            replication::grant(ctx, key_name, g);
                        }
                        stats::RENEWALS.incr();
                        expiry::arm(ctx, key_name, rec);
                        ffi::reply_int(ctx, token as i64)
                    }
                    None => ffi::reply_null(ctx),
                }
            }
        }
    })
}

/// Open `key` for reading and hand its lock state to `f`; replies for other outcomes.
fn read_lock(
    ctx: Ctx,
    args: &[RStr],
    on_empty: impl FnOnce() -> c_int,
    f: impl FnOnce(&LockRecord) -> c_int,
) -> c_int {
    let key = Key::open(ctx, key_arg(args), false);
    match key.kind(server::lock_type()) {
        KeyKind::Other => ffi::reply_error_static(ctx, WRONGTYPE),
        KeyKind::Empty => on_empty(),
        KeyKind::Ours => match unsafe { key.value::<LockRecord>().as_ref() } {
            Some(rec) => f(rec),
            None => on_empty(),
        },
    }
}

/// `FLOCK.CHECK key token`
pub fn check(ctx: Ctx, args: &[RStr]) -> c_int {
    let token = match with_bytes(args, args::parse_check) {
        Ok(t) => t,
        Err(e) => return reply_arg_error(ctx, e),
    };
    read_lock(
        ctx,
        args,
        || ffi::reply_int(ctx, 0),
        |rec| ffi::reply_int(ctx, rec.state.check(token, server::now()) as i64),
    )
}

/// `FLOCK.INFO key`
pub fn info(ctx: Ctx, args: &[RStr]) -> c_int {
    if let Err(e) = with_bytes(args, args::parse_info) {
        return reply_arg_error(ctx, e);
    }
    read_lock(
        ctx,
        args,
        || ffi::reply_null(ctx),
        |rec| {
            let now = server::now();
            let Some(g) = rec.state.live_holder(now) else {
                return ffi::reply_null(ctx);
            };
            ffi::reply_map(ctx, 4);
            ffi::reply_bulk(ctx, b"owner");
            ffi::reply_bulk(ctx, &g.owner);
            ffi::reply_bulk(ctx, b"token");
            ffi::reply_int(ctx, g.token as i64);
            ffi::reply_bulk(ctx, b"ttl");
            ffi::reply_int(ctx, g.remaining_ms(now) as i64);
            ffi::reply_bulk(ctx, b"waiters");
            ffi::reply_int(ctx, 0)
        },
    )
}

/// `FLOCK.APPLY key GRANT owner token deadline_ms`: the replication effect. Accepted only from
/// the master's replication stream and from AOF loading.
pub fn apply(ctx: Ctx, args: &[RStr]) -> c_int {
    if !replication::caller_may_apply(ctx) {
        return ffi::reply_error_static(
            ctx,
            "ERR FLOCK.APPLY is internal: only replication and AOF loading may call it\0",
        );
    }
    with_bytes(args, |argv| {
        let effect = match args::parse_apply(argv) {
            Ok(e) => e,
            Err(e) => return reply_arg_error(ctx, e),
        };
        server::tokens().observe(effect.token);
        let grant =
            Grant::from_wall_deadline(effect.owner, effect.token, effect.deadline_wall_ms, server::now());
        let key_name = key_arg(args);
        let key = Key::open(ctx, key_name, true);
        match key.kind(server::lock_type()) {
            KeyKind::Other => ffi::reply_error_static(ctx, WRONGTYPE),
            KeyKind::Empty => {
                if create(&key, LockState::with_grant(grant)).is_some() {
                    ffi::reply_simple(ctx, "OK\0")
                } else {
                    ffi::reply_error_static(ctx, "ERR could not store the lock\0")
                }
            }
            KeyKind::Ours => {
                if let Some(rec) = unsafe { key.value::<LockRecord>().as_mut() } {
                    rec.state.holder = Some(grant);
                }
                ffi::reply_simple(ctx, "OK\0")
            }
        }
    })
}

/// Register every command. Flags and key positions matter to cluster clients and ACLs.
pub fn register(ctx: Ctx) -> Result<(), String> {
    macro_rules! handler {
        ($f:path) => {{
            unsafe extern "C" fn h(ctx: Ctx, argv: *mut RStr, argc: c_int) -> c_int {
                let args = unsafe { ffi::argv_slice(argv, argc) };
                $f(ctx, args)
            }
            h as unsafe extern "C" fn(Ctx, *mut RStr, c_int) -> c_int
        }};
    }
    let table: [(&std::ffi::CStr, unsafe extern "C" fn(Ctx, *mut RStr, c_int) -> c_int, &std::ffi::CStr); 6] = [
        (c"flock.acquire", handler!(acquire), c"write deny-oom"),
        (c"flock.release", handler!(release), c"write fast"),
        (c"flock.renew", handler!(renew), c"write fast"),
        (c"flock.check", handler!(check), c"readonly fast"),
        (c"flock.info", handler!(info), c"readonly fast"),
        (c"flock.apply", handler!(apply), c"write"),
    ];
    for (name, h, flags) in table {
        let ok = crate::rm!(RedisModule_CreateCommand, raw::REDISMODULE_ERR as c_int;
            ctx, name.as_ptr(), Some(h), flags.as_ptr(), 1, 1, 1);
        if ok != raw::REDISMODULE_OK as c_int {
            return Err(format!("could not register {}", name.to_string_lossy()));
        }
    }
    Ok(())
}
