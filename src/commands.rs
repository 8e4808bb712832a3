//! The FLOCK.* command handlers: parse arguments, open the key, call the core, reply,
//! replicate the effect, notify.

use crate::args::Effect;
use crate::args::{self, ArgError};
use crate::core::{Acquired, Deadline, Grant, LockState};
use crate::ffi::{self, Ctx, Key, KeyKind, RStr};
use crate::lock_type::LockRecord;
use crate::{config, handoff, replication, server, stats, waiters};
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

/// The lock record of a key opened for writing: the stored one, or a fresh empty one stored
/// now (the caller settles and publishes it, which deletes it again if nothing needs it).
fn record_for_write<'a>(ctx: Ctx, key_name: RStr, key: &Key) -> Result<&'a mut LockRecord, c_int> {
    match key.kind(server::lock_type()) {
        KeyKind::Other => Err(0),
        KeyKind::Ours => unsafe { key.value::<LockRecord>().as_mut() }.ok_or(1),
        KeyKind::Empty => {
            let rec = LockRecord::boxed(LockState::default());
            if !key.set_value(server::lock_type(), rec.cast()) {
                drop(unsafe { Box::from_raw(rec) });
                return Err(1);
            }
            let rec = unsafe { rec.as_mut() }.ok_or(1)?;
            watch_if_waited(ctx, key_name, rec);
            Ok(rec)
        }
    }
}

/// Mark `rec` as having waiters when clients wait for its key (a new value under a name
/// that was deleted or moved while they waited): only marked records consult the queues.
fn watch_if_waited(ctx: Ctx, key_name: RStr, rec: &mut LockRecord) {
    if rec.watched.is_none() && waiters::count(ctx, key_name) > 0 {
        rec.watched = Some(Box::new(waiters::key_id(ctx, key_name)));
    }
}

/// Open `key` for writing and hand its settled lock record to `f`. `missing` answers when
/// there is no lock (no key, or the key went away while settling); another type gets
/// WRONGTYPE.
fn with_existing_record(
    ctx: Ctx,
    key_name: RStr,
    missing: impl Fn() -> c_int,
    f: impl FnOnce(&Key, &mut LockRecord, crate::core::Now) -> c_int,
) -> c_int {
    let key = Key::open(ctx, key_name, true);
    match key.kind(server::lock_type()) {
        KeyKind::Other => ffi::reply_error_static(ctx, WRONGTYPE),
        KeyKind::Empty => missing(),
        KeyKind::Ours => {
            let Some(rec) = (unsafe { key.value::<LockRecord>().as_mut() }) else {
                return missing();
            };
            let now = server::now();
            if handoff::settle(ctx, key_name, &key, rec, now, false) {
                return missing();
            }
            f(&key, rec, now)
        }
    }
}

/// `FLOCK.ACQUIRE key owner ttl [BLOCK timeout]`
pub fn acquire(ctx: Ctx, args: &[RStr]) -> c_int {
    with_bytes(args, |argv| {
        let a = match args::parse_acquire(argv, config::max_ttl_ms()) {
            Ok(a) => a,
            Err(e) => return reply_arg_error(ctx, e),
        };
        let key_name = key_arg(args);
        let key = Key::open(ctx, key_name, true);
        let rec = match record_for_write(ctx, key_name, &key) {
            Ok(rec) => rec,
            Err(0) => return ffi::reply_error_static(ctx, WRONGTYPE),
            Err(_) => return ffi::reply_error_static(ctx, "ERR could not store the lock\0"),
        };
        let now = server::now();
        // Settle first (expiry, hand-off to waiters), publish once with the outcome.
        let (settled, waiting) = if server::is_master() {
            handoff::settle_state(ctx, key_name, rec, now)
        } else {
            (false, 0)
        };
        let outcome = rec
            .state
            .acquire(a.owner, a.ttl_ms, now, waiting, &mut server::tokens());
        match outcome {
            Acquired::Granted(token) => {
                stats::GRANTS.incr();
                handoff::publish(ctx, key_name, &key, rec, now, true);
                ffi::notify(ctx, "flock.acquired\0", key_name);
                ffi::reply_int(ctx, token as i64)
            }
            Acquired::Refreshed(token) => {
                handoff::publish(ctx, key_name, &key, rec, now, true);
                ffi::reply_int(ctx, token as i64)
            }
            Acquired::Busy => {
                stats::CONTENDED.incr();
                let Some(timeout) = a.block else {
                    handoff::publish(ctx, key_name, &key, rec, now, settled);
                    return ffi::reply_null(ctx);
                };
                if !waiters::can_block(ctx) {
                    handoff::publish(ctx, key_name, &key, rec, now, settled);
                    return ffi::reply_null(ctx);
                }
                let blocked = waiters::block(ctx, key_name, a.owner, a.ttl_ms, timeout);
                if blocked.is_ok() && rec.watched.is_none() {
                    // If this value is ever replaced or freed, its waiters must hear of it.
                    rec.watched = Some(Box::new(waiters::key_id(ctx, key_name)));
                }
                handoff::publish(ctx, key_name, &key, rec, now, settled);
                match blocked {
                    Ok(()) => raw::REDISMODULE_OK as c_int,
                    Err(waiters::BlockError::TooMany) => ffi::reply_error_static(
                        ctx,
                        "ERR too many clients wait for this key (flock.max-waiters)\0",
                    ),
                    Err(waiters::BlockError::Failed) => {
                        ffi::reply_error_static(ctx, "ERR could not block the client\0")
                    }
                }
            }
            Acquired::TokensExhausted => {
                handoff::publish(ctx, key_name, &key, rec, now, settled);
                ffi::reply_error_static(ctx, "ERR token space exhausted\0")
            }
        }
    })
}

/// `FLOCK.RELEASE key owner [token]`
pub fn release(ctx: Ctx, args: &[RStr]) -> c_int {
    with_bytes(args, |argv| {
        let (owner, token) = match args::parse_release(argv) {
            Ok(o) => o,
            Err(e) => return reply_arg_error(ctx, e),
        };
        let key_name = key_arg(args);
        with_existing_record(
            ctx,
            key_name,
            || ffi::reply_int(ctx, 0),
            |key, rec, now| {
                if !rec.state.release_grant(owner, token, now) {
                    return ffi::reply_int(ctx, 0);
                }
                stats::RELEASES.incr();
                ffi::notify(ctx, "flock.released\0", key_name);
                handoff::settle(ctx, key_name, key, rec, now, true);
                ffi::reply_int(ctx, 1)
            },
        )
    })
}

/// `FLOCK.REVOKE key [owner]`
pub fn revoke(ctx: Ctx, args: &[RStr]) -> c_int {
    with_bytes(args, |argv| {
    let owner = match args::parse_revoke(argv) {
        Ok(o) => o,
        Err(e) => return reply_arg_error(ctx, e),
    };
    let key_name = key_arg(args);
    with_existing_record(
        ctx,
        key_name,
        || ffi::reply_int(ctx, 0),
        |key, rec, now| {
            if rec.state.revoke_owner(owner, now, config::lock_delay_ms()).is_none() {
                return ffi::reply_int(ctx, 0);
            }
            stats::REVOKES.incr();
            ffi::notify(ctx, "flock.revoked\0", key_name);
            handoff::settle(ctx, key_name, key, rec, now, true);
            ffi::reply_int(ctx, 1)
        },
    )
    })
}

/// `FLOCK.RENEW key owner ttl [token]`
pub fn renew(ctx: Ctx, args: &[RStr]) -> c_int {
    with_bytes(args, |argv| {
        let (owner, ttl_ms, token) = match args::parse_renew(argv, config::max_ttl_ms()) {
            Ok(v) => v,
            Err(e) => return reply_arg_error(ctx, e),
        };
        let key_name = key_arg(args);
        with_existing_record(
            ctx,
            key_name,
            || ffi::reply_null(ctx),
            |key, rec, now| match rec.state.renew_grant(owner, ttl_ms, token, now) {
                Some(token) => {
                    stats::RENEWALS.incr();
                    handoff::publish(ctx, key_name, key, rec, now, true);
                    ffi::reply_int(ctx, token as i64)
                }
                None => ffi::reply_null(ctx),
            },
        )
    })
}

/// A deferred look at a waited key (see `waiters::Job`): hand it to its first waiter when it
/// is free, fail its waiters when it now holds another type, and release `ghost` (a grant
/// whose client vanished before its reply) first.
pub fn revisit(ctx: Ctx, key_name: RStr, ghost: Option<u64>) {
    if !server::is_master() {
        return;
    }
    let key = Key::open(ctx, key_name, true);
    match key.kind(server::lock_type()) {
        KeyKind::Other => {
            waiters::fail_all(
                &waiters::key_id(ctx, key_name),
                "ERR the lock key now holds a value of another type\0",
            );
        }
        KeyKind::Empty if ghost.is_some() || waiters::count(ctx, key_name) == 0 => {}
        KeyKind::Empty if !crate::cluster::serves_stably(ctx, ffi::bytes(key_name)) => {
            // The key migrated away (or is migrating): granting it here would make a second
            // copy of the lock. Cluster clients retry TRYAGAIN and follow the redirect.
            waiters::fail_all(
                &waiters::key_id(ctx, key_name),
                "TRYAGAIN the lock key moved to another node while you waited; retry\0",
            );
        }
        _ => {
            let Ok(rec) = record_for_write(ctx, key_name, &key) else {
                return;
            };
            watch_if_waited(ctx, key_name, rec);
            let now = server::now();
            let mut changed = false;
            if let Some(token) = ghost {
                if rec.state.live_holder(now).is_some_and(|g| g.token == token) {
                    rec.state.holder = None;
                    stats::RELEASES.incr();
                    ffi::notify(ctx, "flock.released\0", key_name);
                    changed = true;
                }
            }
            handoff::settle(ctx, key_name, &key, rec, now, changed);
        }
    }
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
    let key_name = key_arg(args);
    let waiting = waiters::count(ctx, key_name);
    read_lock(
        ctx,
        args,
        || ffi::reply_null(ctx),
        |rec| {
            let now = server::now();
            let holder = rec.state.live_holder(now);
            if holder.is_none() && waiting == 0 && !rec.state.delay_active(now) {
                return ffi::reply_null(ctx);
            }
            ffi::reply_map(ctx, 4);
            ffi::reply_bulk(ctx, b"owner");
            match holder {
                Some(g) => ffi::reply_bulk(ctx, &g.owner),
                None => ffi::reply_null(ctx),
            };
            ffi::reply_bulk(ctx, b"token");
            ffi::reply_int(ctx, holder.map_or(rec.state.last_token, |g| g.token) as i64);
            ffi::reply_bulk(ctx, b"ttl");
            ffi::reply_int(ctx, holder.map_or(0, |g| g.remaining_ms(now)) as i64);
            ffi::reply_bulk(ctx, b"waiters");
            ffi::reply_int(ctx, waiting as i64)
        },
    )
}

/// `FLOCK.APPLY key GRANT owner token deadline_ms` and `FLOCK.APPLY key DELAY token until_ms`:
/// the replication effects. Accepted only from the master's replication stream and from AOF
/// loading.
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
        let now = server::now();
        let state = match effect {
            Effect::Grant {
                owner,
                token,
                deadline_wall_ms,
            } => LockState::with_grant(Grant::from_wall_deadline(
                owner,
                token,
                deadline_wall_ms,
                now,
            )),
            Effect::Delay {
                token,
                until_wall_ms,
            } => LockState::delayed(token, Deadline::from_wall(until_wall_ms, now)),
        };
        server::tokens().observe(state.last_token);
        let key_name = key_arg(args);
        let key = Key::open(ctx, key_name, true);
        match record_for_write(ctx, key_name, &key) {
            Ok(rec) => {
                rec.state = state;
                // The effect is deterministic: a replica passes it on verbatim to its own AOF
                // and sub-replicas.
                crate::rm!(RedisModule_ReplicateVerbatim, 0; ctx);
                ffi::reply_simple(ctx, "OK\0")
            }
            Err(0) => ffi::reply_error_static(ctx, WRONGTYPE),
            Err(_) => ffi::reply_error_static(ctx, "ERR could not store the lock\0"),
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
    let table: [(
        &std::ffi::CStr,
        unsafe extern "C" fn(Ctx, *mut RStr, c_int) -> c_int,
        &std::ffi::CStr,
    ); 7] = [
        (c"flock.acquire", handler!(acquire), c"write deny-oom"),
        (c"flock.release", handler!(release), c"write fast"),
        (c"flock.renew", handler!(renew), c"write fast"),
        (c"flock.check", handler!(check), c"readonly fast"),
        (c"flock.info", handler!(info), c"readonly fast"),
        (c"flock.revoke", handler!(revoke), c"write fast"),
        (c"flock.apply", handler!(apply), c"write"),
    ];
    let fenced: (
        &std::ffi::CStr,
        unsafe extern "C" fn(Ctx, *mut RStr, c_int) -> c_int,
        &std::ffi::CStr,
    ) = (
        c"flock.fenced",
        crate::fenced::command,
        c"write getkeys-api",
    );
    for (name, h, flags) in table.into_iter().chain([fenced]) {
        let ok = crate::rm!(RedisModule_CreateCommand, raw::REDISMODULE_ERR as c_int;
            ctx, name.as_ptr(), Some(h), flags.as_ptr(), 1, 1, 1);
        if ok != raw::REDISMODULE_OK as c_int {
            return Err(format!("could not register {}", name.to_string_lossy()));
        }
    }
    Ok(())
}
