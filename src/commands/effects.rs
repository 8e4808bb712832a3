//! The one effects executor: runs an engine operation on the lock under an open key and
//! carries out what the engine decides (notifications, counters, replication, timers,
//! waiters, deleting the key, the reply). Nothing here decides what a lock does.

use crate::ffi::block::{self, Found, KeyId, LockRecord, RecordPtr};
use crate::ffi::{self, Ctx, Key, KeyKind, RStr, Status};
use crate::peers::replication;
use crate::server::{self, config, stats};
use crate::store::{bindings, expiry};
use crate::waiting::waiters;
use flock_core::args::AcquireArgs;
use flock_core::engine::{self, BlockRefused, Count, Effect, Env, Event, Host, Reply, ReplyError};
use flock_core::lock_stats::{ClassRef, Event as Measured};
use flock_core::state::Mode;
use flock_core::{Deadline, LockState, TokenIssuer, Waiter};
use std::ffi::CStr;

pub const WRONGTYPE: &CStr = c"WRONGTYPE Operation against a key holding the wrong kind of value";

/// The host of one engine operation on the lock stored under `key_name`: the parts of the
/// record beside the state, and what waits for the state to be stored back: the deletion the
/// engine asked for, and a timer the block could not take yet (a new lock has no block until
/// the operation is over; a block that does not carry the key's name gets a named one).
pub struct KeyHost<'r> {
    ctx: Ctx<'r>,
    key_name: RStr<'r>,
    /// The lock's FLOCK.STATS class (written back to the block afterwards).
    class: &'r mut ClassRef,
    watched: &'r mut Option<Box<KeyId>>,
    /// The lock's block (`None`: a new lock, stored after the operation).
    block: Option<RecordPtr>,
    arm_later: Option<Option<Deadline>>,
    delete: bool,
}

impl<'r> KeyHost<'r> {
    fn new(
        ctx: Ctx<'r>,
        key_name: RStr<'r>,
        class: &'r mut ClassRef,
        watched: &'r mut Option<Box<KeyId>>,
        block: Option<RecordPtr>,
    ) -> KeyHost<'r> {
        KeyHost {
            ctx,
            key_name,
            class,
            watched,
            block,
            arm_later: None,
            delete: false,
        }
    }

    /// Mark the record as having waiters when clients wait for its key (a new value under a
    /// name that was deleted or moved while they waited): only marked records consult the
    /// wait queues.
    pub fn watch_if_waited(&mut self) {
        if self.watched.is_none() && waiters::count(self.ctx, self.key_name) > 0 {
            *self.watched = Some(Box::new(waiters::key_id(self.ctx, self.key_name)));
        }
    }
}

fn event_name(e: Event) -> &'static CStr {
    match e {
        Event::Acquired { .. } => c"flock.acquired",
        Event::Released { .. } => c"flock.released",
        Event::Expired => c"flock.expired",
        Event::Revoked => c"flock.revoked",
        Event::Closed => c"flock.closed",
    }
}

impl Host for KeyHost<'_> {
    // Always inlined: each call site names one variant, so the match folds away.
    #[inline(always)]
    fn effect(&mut self, effect: Effect<'_>) {
        let (ctx, key) = (self.ctx, self.key_name);
        match effect {
            Effect::Notify(e) => {
                let measured = match e {
                    Event::Acquired { ttl_ms } => {
                        stats::GRANTS.incr();
                        Measured::Granted { ttl_ms }
                    }
                    Event::Released { held_ms } => {
                        stats::RELEASES.incr();
                        Measured::Released { held_ms }
                    }
                    Event::Expired => {
                        stats::EXPIRATIONS.incr();
                        Measured::Expired
                    }
                    Event::Revoked => {
                        stats::REVOKES.incr();
                        Measured::Revoked
                    }
                    Event::Closed => {
                        stats::BOUND_CLOSED.incr();
                        Measured::Closed
                    }
                };
                stats::record(self.class, ffi::bytes(&key), measured);
                ffi::notify(ctx, event_name(e), key);
            }
            Effect::Count(Count::Renewed) => {
                stats::RENEWALS.incr();
                stats::record(self.class, ffi::bytes(&key), Measured::Renewed);
            }
            Effect::Count(Count::Contended) => stats::CONTENDED.incr(),
            Effect::Replicate(snapshot) => replication::state(ctx, key, snapshot),
            Effect::ReplicateDelete => replication::delete(ctx, key),
            Effect::ReplicateVerbatim => replication::verbatim(ctx),
            Effect::DeleteKey => self.delete = true,
            Effect::Arm(next) => {
                let armed = self
                    .block
                    .is_some_and(|b| expiry::arm(ctx, key, b, next).is_ok());
                if !armed {
                    self.arm_later = Some(next);
                }
            }
            Effect::Bind { client, token } => {
                bindings::bind(client, token, ctx.selected_db(), ffi::bytes(&key));
            }
            Effect::Unbind { client, token } => bindings::unbind(client, token),
        }
    }

    #[inline]
    fn waiting(&mut self) -> usize {
        // Only a record clients waited on consults the queues (see `LockRecord::watched`).
        if self.watched.is_none() {
            return 0;
        }
        waiters::count(self.ctx, self.key_name)
    }

    #[inline]
    fn waiting_mode(&mut self) -> Option<Mode> {
        if self.watched.is_none() {
            return None;
        }
        waiters::shared_mode(self.ctx, self.key_name)
    }

    #[inline]
    fn next_waiter_if(&mut self, fits: &mut dyn FnMut(&Waiter) -> bool) -> Option<Waiter> {
        if self.watched.is_none() {
            return None;
        }
        waiters::pop_if(self.ctx, self.key_name, fits)
    }

    #[inline]
    fn deliver(&mut self, waiter: &Waiter, token: u64) -> bool {
        match waiters::deliver(waiter.id, token) {
            Some(waited_us) => {
                let wait_ms = waited_us / 1000;
                let key = ffi::bytes(&self.key_name);
                stats::record(self.class, key, Measured::Waited { wait_ms });
                true
            }
            None => false,
        }
    }

    #[inline]
    fn block(
        &mut self,
        args: &AcquireArgs<'_>,
        timeout_ms: u64,
        bind_to: Option<u64>,
    ) -> Result<(), BlockRefused> {
        let blocked = waiters::block(self.ctx, self.key_name, args, timeout_ms, bind_to);
        if blocked.is_ok() && self.watched.is_none() {
            // If this value is ever replaced or freed, its waiters must hear of it.
            *self.watched = Some(Box::new(waiters::key_id(self.ctx, self.key_name)));
        }
        blocked
    }
}

/// What an operation runs in: both clocks read now, the configs, the role, and the token
/// issuer (held for the operation).
fn env_now(tokens: &mut TokenIssuer) -> Env<'_> {
    Env {
        now: server::now(),
        lock_delay_ms: config::lock_delay_ms(),
        max_holders: config::max_holders(),
        master: server::is_master(),
        tokens,
    }
}

/// Why [`with_lock`] ran nothing.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum NoLock {
    /// No key (and none to be made).
    Missing,
    /// The key holds another type.
    WrongType,
    /// Redis would not store a new lock.
    NotStored,
}

/// Run `op` on the lock stored under `key_name` (opened for writing as `key`), on an empty
/// state when `create` and the key does not exist (stored afterwards unless the engine said
/// to delete it). Deletes the key afterwards when the engine said so.
#[inline]
pub fn with_lock(
    ctx: Ctx<'_>,
    key_name: RStr<'_>,
    key: &mut Key,
    create: bool,
    op: impl FnOnce(&mut LockState, &mut Env<'_>, &mut KeyHost<'_>) -> Reply<'static>,
) -> Result<Reply<'static>, NoLock> {
    // (`found` ends with this block, before the key is used again.)
    let mut lock = {
        let found = block::lock_mut(key);
        match found {
            Found::Lock(lock) => lock,
            Found::OtherType => return Err(NoLock::WrongType),
            Found::Nothing if !create => return Err(NoLock::Missing),
            Found::Nothing => {
                // Nothing borrowed here, but the type says so: let it go before the key is
                // used.
                drop(found);
                return with_new_lock(ctx, key_name, key, op);
            }
        }
    };
    let mut tokens = server::tokens();
    let mut env = env_now(&mut tokens);
    let block = lock.block();
    let mut class = block.class();
    let (reply, delete, arm) = {
        let (state, watched) = lock.parts();
        let mut host = KeyHost::new(ctx, key_name, &mut class, watched, Some(block));
        let reply = op(state, &mut env, &mut host);
        (reply, host.delete, host.arm_later)
    };
    drop(tokens);
    if delete {
        lock.discard();
        key.delete();
        return Ok(reply);
    }
    // The state goes back into its block (in the form that fits it now).
    drop(lock);
    // The key's live block (the key is still open and unchanged).
    block.set_class(class);
    if arm.is_some() {
        // The block did not carry the key's name: a named block takes its place.
        expiry::name_and_arm(ctx, key_name, key, false);
    }
    Ok(reply)
}

/// [`with_lock`] on a key that does not exist: the operation runs on an empty state, stored
/// only if the engine keeps it (a refused or waiting request leaves no key behind).
#[inline]
fn with_new_lock(
    ctx: Ctx<'_>,
    key_name: RStr<'_>,
    key: &mut Key,
    op: impl FnOnce(&mut LockState, &mut Env<'_>, &mut KeyHost<'_>) -> Reply<'static>,
) -> Result<Reply<'static>, NoLock> {
    let mut tokens = server::tokens();
    let mut env = env_now(&mut tokens);
    let mut rec = LockRecord::default();
    let mut class = ClassRef::default();
    let (reply, delete, arm) = {
        let mut host = KeyHost::new(ctx, key_name, &mut class, &mut rec.watched, None);
        host.watch_if_waited();
        let reply = op(&mut rec.state, &mut env, &mut host);
        (reply, host.delete, host.arm_later)
    };
    drop(tokens);
    if delete {
        return Ok(reply);
    }
    let db = ctx.selected_db();
    // The key was found empty and is open for writing, and Redis's allocator does not
    // return short: not reached in practice, and the reply says so if it ever is.
    let block =
        block::create(key, rec, db, ffi::bytes(&key_name), class).map_err(|_| NoLock::NotStored)?;
    if let Some(next) = arm {
        // A block made here carries its name: arming it cannot be refused.
        let _ = expiry::arm(ctx, key_name, block, next);
    }
    Ok(reply)
}

/// ACQUIRE on a key that does not exist, by the engine's `acquire_free`: the grant is stored
/// as the new key's one block. `None`: the key exists, or the engine left the request to
/// the general path ([`with_lock`] with `engine::acquire`), and nothing was done.
#[inline]
pub fn acquire_free(
    ctx: Ctx<'_>,
    key_name: RStr<'_>,
    key: &mut Key,
    args: &AcquireArgs<'_>,
    bind_to: Option<u64>,
) -> Option<Result<Reply<'static>, NoLock>> {
    if !matches!(key.kind(), KeyKind::Empty) {
        return None;
    }
    let mut tokens = server::tokens();
    let mut env = env_now(&mut tokens);
    let mut class = ClassRef::default();
    let mut watched = None;
    let (reply, grant, mode, arm) = {
        let mut host = KeyHost::new(ctx, key_name, &mut class, &mut watched, None);
        // Clients waiting for the name make the engine leave the request to `acquire`.
        host.watch_if_waited();
        let (reply, grant, mode) = engine::acquire_free(args, &mut env, &mut host, bind_to)?;
        (reply, grant, mode, host.arm_later)
    };
    drop(tokens);
    let db = ctx.selected_db();
    let name = ffi::bytes(&key_name);
    let Ok(block) = block::create_lone(key, &grant, mode, db, name, class) else {
        return Some(Err(NoLock::NotStored));
    };
    if let Some(next) = arm {
        expiry::arm_new(block, next);
    }
    Some(Ok(reply))
}

/// RELEASE of a key whose whole state is one grant (its block's compact form), by the
/// engine's `release_lone` on the grant read in place. `None`: another key or state, or the
/// engine left the request to the general path ([`with_lock`] with `engine::release`), and
/// nothing was done.
#[inline]
pub fn release_lone(
    ctx: Ctx<'_>,
    key_name: RStr<'_>,
    key: &mut Key,
    owner: &[u8],
    token: Option<u64>,
) -> Option<Reply<'static>> {
    let (block, lone) = block::lone_of(key)?;
    let mut class = block.class();
    let mut watched = None;
    let (reply, delete) = {
        let mut host = KeyHost::new(ctx, key_name, &mut class, &mut watched, Some(block));
        let mono_us = ffi::monotonic_us();
        let master = server::is_master();
        let reply = engine::release_lone(&lone, mono_us, master, &mut host, owner, token)?;
        (reply, host.delete)
    };
    if delete {
        key.delete();
    }
    Some(reply)
}

/// Send `reply` to the client of `ctx`; `key` names the lock key in error texts.
#[inline]
pub fn send(ctx: Ctx<'_>, key: RStr<'_>, reply: Reply<'_>) -> Status {
    match reply {
        Reply::Int(v) => ffi::reply_int(ctx, v),
        Reply::Null => ffi::reply_null(ctx),
        Reply::Ok => ffi::reply_simple(ctx, c"OK"),
        Reply::Error(e) => match static_error_text(e) {
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

/// The engine's fixed error texts as C strings (no allocation on the reply path); `None` for
/// the texts that name the key.
fn static_error_text(e: ReplyError) -> Option<&'static CStr> {
    match e {
        ReplyError::TokensExhausted => Some(c"ERR token space exhausted"),
        ReplyError::TooManyWaiters => {
            Some(c"ERR too many clients wait for this key (flock.max-waiters)")
        }
        ReplyError::CouldNotBlock => Some(c"ERR could not block the client"),
        ReplyError::OwnerHolds(_) | ReplyError::LimitMismatch(_) => None,
    }
}

/// The reply for a key [`with_lock`] could not run on; `missing` answers for no lock.
pub fn send_no_lock(ctx: Ctx<'_>, key: RStr<'_>, why: NoLock, missing: Reply<'static>) -> Status {
    match why {
        NoLock::Missing => send(ctx, key, missing),
        NoLock::WrongType => ffi::reply_error_static(ctx, WRONGTYPE),
        NoLock::NotStored => ffi::reply_error_static(ctx, c"ERR could not store the lock"),
    }
}
