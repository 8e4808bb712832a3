//! FLOCK.MACQUIRE: parse, look at every key, then grant them all, refuse, answer nil, or make
//! the caller wait in every key's queue at once. A waiting request is tried again
//! ([`try_waiting`], a deferred job) when the engine finds it first in line on a free key. What
//! is decided is flock-core's `multi` rule; each key's grant goes through the one executor as an
//! ordinary ACQUIRE (its effects: notification, counters, replication, binding, timer).

use super::executor;
use crate::ffi::block::{self, Found, KeyId};
use crate::ffi::{self, Ctx, Key, KeyFlags, KeysRequest, RStr, RString, Status};
use crate::server::{self, config, stats};
use crate::store::bindings;
use crate::waiting::jobs::{self, Job};
use crate::waiting::waiters;
use flock_core::args::{parse_i64, AcquireArgs, ArgError};
use flock_core::engine::{self, BlockRefused, Reply};
use flock_core::errors::{Fixed, Formatted};
use flock_core::lock_stats::Event as Measured;
use flock_core::multi::{self, Decision, KeyLook, Refusal};
use flock_core::Now;
use smallvec::SmallVec;

/// Keys kept inline by a MACQUIRE (more spill to the heap).
const INLINE: usize = 8;

/// The command, registered `getkeys-api` beside its keynum key spec: Redis 7.0's cluster
/// routing (the CROSSSLOT check) reads a module command's keys from its legacy range or from
/// this API, not from its key specs, and a counted set of keys has no legacy range.
pub struct Macquire;

impl ffi::Command for Macquire {
    const GETKEYS: bool = true;

    fn run(ctx: Ctx<'_>, args: &[RStr<'_>]) -> Status {
        macquire(ctx, args)
    }

    fn keys(req: KeysRequest<'_>, args: &[RStr<'_>]) {
        // The `numkeys` arguments after argv[1], each read and written; none when numkeys is
        // out of range or past the end (the command itself then answers with its error).
        let n = args
            .get(1)
            .and_then(|n| parse_i64(ffi::bytes(n)))
            .filter(|n| (1..=multi::MAX_KEYS as i64).contains(n))
            .map_or(0, |n| n as usize);
        if n == 0 || 2 + n > args.len() {
            return;
        }
        let flags = KeyFlags::RW.and(KeyFlags::ACCESS).and(KeyFlags::UPDATE);
        for pos in 2..2 + n {
            // Inside argv (checked just above); at most 66.
            req.key_at(pos as std::ffi::c_int, flags);
        }
    }
}

fn reply_arg_error(ctx: Ctx<'_>, e: ArgError) -> Status {
    match e {
        ArgError::Arity => ffi::wrong_arity(ctx),
        other => ffi::reply_error_string(ctx, &other.message()),
    }
}

/// What the keys hold, in order, for `decide`: the key's state, how many wait for it, and
/// the per-key flag of [`KeyLook::owner_in_queue`]. `None`: a key holds another type.
fn look_at<R>(
    keys: &[Key],
    names: &[RStr<'_>],
    queued: impl Fn(usize, RStr<'_>) -> (usize, bool),
    decide: impl FnOnce(&[KeyLook<'_>]) -> R,
) -> Option<R> {
    let found: SmallVec<[_; INLINE]> = keys.iter().map(block::lock_of).collect();
    let mut looks: SmallVec<[KeyLook<'_>; INLINE]> = SmallVec::new();
    for (i, (f, name)) in found.iter().zip(names).enumerate() {
        let state = match f {
            Found::OtherType => return None,
            Found::Lock(s) => Some(&**s),
            Found::Nothing => None,
        };
        let (waiting, owner_in_queue) = queued(i, *name);
        looks.push(KeyLook {
            state,
            waiting,
            owner_in_queue,
        });
    }
    Some(decide(&looks))
}

/// Grant every key of `names` to `args.owner` at `now` (which `multi::at_call` or
/// `multi::ready` found grantable at that instant): each an ordinary ACQUIRE through the
/// executor. The tokens in key order; `None` when a key could not be stored (no memory), in
/// which case the new grants made so far are released again.
fn grant_all(
    ctx: Ctx<'_>,
    keys: &mut [Key],
    names: &[RStr<'_>],
    args: &AcquireArgs<'_>,
    bind_to: Option<u64>,
    now: Now,
) -> Option<SmallVec<[u64; INLINE]>> {
    let mut tokens = SmallVec::new();
    // Every token this call issues is above the mark as it stands now; a key the owner held
    // before keeps its token, at or below it (that grant stays, whatever happens here).
    let issued_before = server::tokens().high_water();
    for (i, (name, key)) in names.iter().zip(keys.iter_mut()).enumerate() {
        let reply = executor::run(ctx, *name, key, true, |stored, cx, w| {
            multi::grant_key(stored, cx, w, args, bind_to, now)
        });
        match reply {
            Ok(Reply::Int(token)) => tokens.push(token as u64),
            _ => {
                // Not reached unless Redis refuses to store a lock: all or nothing still, so
                // the grants this call made are released again (those held before stay).
                let made = names.iter().zip(keys.iter_mut()).zip(&tokens).take(i);
                for ((name, key), token) in made.filter(|(_, t)| **t > issued_before) {
                    let _ = executor::run(ctx, *name, key, false, |stored, cx, w| {
                        engine::release(stored, cx, w, args.owner, Some(*token))
                    });
                }
                return None;
            }
        }
    }
    stats::MULTI_GRANTS.incr();
    Some(tokens)
}

fn reply_tokens(ctx: Ctx<'_>, tokens: &[u64]) -> Status {
    ffi::reply_array(ctx, tokens.len());
    for t in tokens {
        ffi::reply_int(ctx, *t as i64);
    }
    Status::OK
}

/// `FLOCK.MACQUIRE numkeys key [key ...] owner ttl [BOUND] [BLOCK timeout]`
pub fn macquire(ctx: Ctx<'_>, args: &[RStr<'_>]) -> Status {
    let argv: SmallVec<[&[u8]; 16]> = args.iter().map(ffi::bytes).collect();
    let a = match multi::parse_macquire(&argv, config::max_ttl_ms(), config::max_holders()) {
        Ok(a) => a,
        Err(e) => return reply_arg_error(ctx, e),
    };
    let Some(names) = args.get(2..2 + a.keys.len()) else {
        return ffi::wrong_arity(ctx);
    };
    let owner = a.acquire.owner;
    // Every grant lives with the caller's connection: there must be one.
    let bind_to = match a.acquire.bound {
        false => None,
        true => match bindings::client_connection(ctx) {
            Some(client) => Some(client),
            None => return reply_arg_error(ctx, ArgError::BoundNeedsClient),
        },
    };
    let now = server::now();
    // Each key opened once, for writing: looked at, then granted.
    let mut keys: SmallVec<[Key; INLINE]> =
        names.iter().map(|n| Key::open(ctx, *n, true)).collect();
    let decided = look_at(
        &keys,
        names,
        |_, name| {
            let waiting = waiters::count(ctx, name);
            (waiting, waiting > 0 && waiters::has_owner(ctx, name, owner))
        },
        |looks| multi::at_call(looks, owner, now, config::lock_delay_ms()),
    );
    let Some(decision) = decided else {
        return ffi::reply_error_static(ctx, Fixed::WrongType.text());
    };
    match decision {
        Decision::Refused(i, why) => {
            let key = names.get(i).map_or(&b""[..], ffi::bytes);
            let text = match why {
                Refusal::Holds(mode) => Formatted::OwnerHolds { mode, key },
                Refusal::Waits => Formatted::OwnerWaits { key },
            };
            ffi::reply_error_string(ctx, &text.message())
        }
        Decision::Grant => match grant_all(ctx, &mut keys, names, &a.acquire, bind_to, now) {
            Some(tokens) => reply_tokens(ctx, &tokens),
            None => ffi::reply_error_static(ctx, Fixed::NotStored.text()),
        },
        Decision::Busy => {
            stats::CONTENDED.incr();
            // Only a BLOCK call asks whether it may block (not inside MULTI or a script).
            let Some(timeout_ms) = a.acquire.block.filter(|_| waiters::can_block(ctx)) else {
                return ffi::reply_null(ctx);
            };
            match waiters::block_multi(ctx, names, &a.acquire, timeout_ms, bind_to) {
                Ok(()) => {
                    // Each key now knows it is waited for (a free one is kept, empty, while
                    // the request heads its queue), and is settled.
                    for (name, key) in names.iter().zip(keys.iter_mut()) {
                        let _ = executor::run(ctx, *name, key, true, |stored, cx, w| {
                            w.watch_if_waited();
                            engine::revisit(stored, cx, w, None)
                        });
                    }
                    Status::OK
                }
                Err(BlockRefused::TooMany) => {
                    ffi::reply_error_static(ctx, Fixed::TooManyWaiters.text())
                }
                Err(BlockRefused::Failed) => {
                    ffi::reply_error_static(ctx, Fixed::CouldNotBlock.text())
                }
            }
        }
    }
}

/// The waiting MACQUIRE request `waiter` was first in line on a free key of it: grant it if
/// that holds for all its keys now (`multi::ready`), else leave it waiting. Runs from a
/// deferred job, in the database of its keys.
pub fn try_waiting(ctx: Ctx<'_>, waiter: u64) {
    if !server::is_master() {
        return;
    }
    let Some(req) = waiters::multi_request(waiter) else {
        return;
    };
    let Some(names) = req
        .keys
        .iter()
        .map(|((_, name), _, _)| RString::new(ctx, name))
        .collect::<Option<Vec<RString>>>()
    else {
        return;
    };
    let names: Vec<RStr<'_>> = names.iter().map(RString::get).collect();
    let now = server::now();
    let owner: &[u8] = &req.owner;
    let mut keys: Vec<Key> = names.iter().map(|n| Key::open(ctx, *n, true)).collect();
    let decided = look_at(
        &keys,
        &names,
        |i, _| {
            req.keys
                .get(i)
                .map_or((0, false), |(_, n, first)| (*n, *first))
        },
        |looks| multi::ready(looks, owner, now, config::lock_delay_ms()),
    );
    // A key of another type: its own look fails the request (TRYAGAIN or the type error).
    if decided != Some(Decision::Grant) {
        return;
    }
    let args = AcquireArgs {
        owner,
        ttl_ms: req.ttl_ms,
        mode: flock_core::state::Mode::Exclusive,
        bound: req.bind_to.is_some(),
        block: None,
    };
    let Some(tokens) = grant_all(ctx, &mut keys, &names, &args, req.bind_to, now) else {
        return;
    };
    if let Some(waited_us) = waiters::deliver_multi(waiter, &tokens) {
        // FLOCK.STATS: each key's class records the wait, as for an ACQUIRE ... BLOCK.
        let wait_ms = waited_us / 1000;
        for (name, key) in names.iter().zip(&keys) {
            if let Some(b) = block::record_of(key) {
                let mut class = b.class();
                stats::record(&mut class, ffi::bytes(name), Measured::Waited { wait_ms });
                b.set_class(class);
            }
        }
    } else {
        // Gone meanwhile (not reached: nothing runs between): release what was granted.
        let keys: Vec<KeyId> = req.keys.into_iter().map(|(k, _, _)| k).collect();
        for (key, token) in keys.into_iter().zip(tokens) {
            jobs::schedule(Job::ReleaseGhost { key, token });
        }
    }
}
