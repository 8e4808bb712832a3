//! The one executor: opens the lock under a key as the store holds it, runs an engine
//! operation on it, and carries out the outcome the engine returns, in order: keyspace
//! notifications and counters, replication, bindings, the key's new state or its deletion,
//! its timer. Nothing here decides what a lock does.
//!
//! How the store holds a key ([`Stored`]): no key; a compact block whose one grant the engine
//! reads in place (the hot ACQUIRE and RELEASE never build a `LockState`); or a full block
//! whose state the engine changes in place. The engine says what becomes of it
//! ([`KeyFate`]): kept, a new state (written back in the form that fits), or a new key held
//! by one grant (written in the compact form at once).

use crate::ffi::block::{self, Found, KeyId, LockRecord, Opened, RecordPtr};
use crate::ffi::{self, Ctx, Key, RStr};
use crate::peers::replication;
use crate::server::{self, config, stats};
use crate::store::bindings;
use crate::store::expiry::{self, Arming};
use crate::waiting::jobs::{self, Job};
use crate::waiting::{waiters, watchers};
use flock_core::args::AcquireArgs;
use flock_core::engine::{
    BlockRefused, Context, Count, Effect, Env, Event, KeyFate, Outcome, Reply, Stored, Waiters,
};
use flock_core::lock_stats::{ClassRef, Event as Measured};
use flock_core::state::Mode;
use flock_core::{Deadline, LockState, Snapshot, TokenIssuer, Waiter};
use std::sync::MutexGuard;

/// Why [`run`] ran nothing.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum NoLock {
    /// No key (and none to be made).
    Missing,
    /// The key holds another type.
    WrongType,
    /// Redis would not store a new lock.
    NotStored,
}

/// What an operation asks of the server, read when it asks: RELEASE of a lone grant needs
/// only the role and the monotonic clock; the wall clock and the token issuer's lock are
/// taken only by an operation that needs them, and let go before the outcome is carried out.
pub struct ServerCx {
    tokens: Option<MutexGuard<'static, TokenIssuer>>,
}

impl ServerCx {
    fn new() -> ServerCx {
        ServerCx { tokens: None }
    }
}

impl Context for ServerCx {
    #[inline]
    fn master(&self) -> bool {
        server::is_master()
    }

    #[inline]
    fn mono_us(&mut self) -> u64 {
        ffi::monotonic_us()
    }

    #[inline(always)]
    fn env(&mut self) -> Env<'_> {
        let tokens = self.tokens.get_or_insert_with(server::tokens);
        Env {
            now: server::now(),
            lock_delay_ms: config::lock_delay_ms(),
            max_holders: config::max_holders(),
            master: server::is_master(),
            tokens,
        }
    }
}

/// The wait queue of the key an operation runs on (see [`Waiters`]), and what waiting
/// changes beside the state: the FLOCK.STATS class (wait times) and the record's waiters'
/// key (`watched`: set once clients wait for this value's key, and only then are the queues
/// consulted, which keeps the uncontended path off the registry).
pub struct KeyWaiters<'r> {
    ctx: Ctx<'r>,
    key_name: RStr<'r>,
    class: &'r mut ClassRef,
    watched: &'r mut Option<Box<KeyId>>,
}

impl KeyWaiters<'_> {
    /// Mark the record as waited for when clients wait for its key (a new value under a
    /// name that was deleted or moved while they waited).
    #[inline(always)]
    pub fn watch_if_waited(&mut self) {
        if self.watched.is_none() && waiters::count(self.ctx, self.key_name) > 0 {
            self.mark_waited();
        }
    }

    #[cold]
    #[inline(never)]
    fn mark_waited(&mut self) {
        *self.watched = Some(Box::new(waiters::key_id(self.ctx, self.key_name)));
    }
}

/// An engine operation the executor runs on a key: any closure of the right shape, or a
/// command's own type (FLOCK.ACQUIRE's and FLOCK.RELEASE's, in `handlers.rs`) whose `run` is
/// inlined where the executor calls it, so that with the key's form known there (free, one
/// grant, full) the engine's fast path is all that is left of it.
/// It writes its outcome into `out`, the executor's (fresh: [`Outcome::keep`]), where the
/// executor carries it out from: no copy of the (large) outcome on the hot paths.
pub trait Op {
    fn run(self, stored: Stored<'_>, cx: &mut ServerCx, w: &mut KeyWaiters<'_>, out: &mut Outcome);
}

impl<F> Op for F
where
    F: FnOnce(Stored<'_>, &mut ServerCx, &mut KeyWaiters<'_>) -> Outcome,
{
    #[inline(always)]
    fn run(self, stored: Stored<'_>, cx: &mut ServerCx, w: &mut KeyWaiters<'_>, out: &mut Outcome) {
        *out = self(stored, cx, w);
    }
}

impl Waiters for KeyWaiters<'_> {
    #[inline]
    fn waiting(&mut self) -> usize {
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

    fn dismiss(&mut self, owner: &[u8]) -> bool {
        if self.watched.is_none() {
            return false;
        }
        waiters::dismiss(self.ctx, self.key_name, owner)
    }

    fn refuse_other_limits(&mut self, limit: Mode) -> usize {
        if self.watched.is_none() {
            return 0;
        }
        waiters::refuse_other_limits(self.ctx, self.key_name, limit)
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

/// Run `op` on `stored`, with the server as its context and the key's waiters (`class` and
/// `watched`: what waiting changes beside the state). Inlined into each caller: the engine
/// operation it runs (with its fast path) then lands in the executor's own code, one call
/// and one copy of the outcome fewer.
#[inline(always)]
fn run_op(
    ctx: Ctx<'_>,
    key_name: RStr<'_>,
    stored: Stored<'_>,
    class: &mut ClassRef,
    watched: &mut Option<Box<KeyId>>,
    op: impl Op,
    out: &mut Outcome,
) {
    let mut cx = ServerCx::new();
    let mut w = KeyWaiters {
        ctx,
        key_name,
        class,
        watched,
    };
    if matches!(stored, Stored::Free) {
        // Clients waiting for the name: the engine must see them (no free-key fast path).
        w.watch_if_waited();
    }
    op.run(stored, &mut cx, &mut w, out);
}

/// Run `op` on the lock stored under `key_name` (opened for writing as `key`): on `Free` when
/// `create` and the key does not exist, else `Missing`. Carries the outcome out and returns
/// the reply to send. Then, only while someone watches some key (one atomic load
/// otherwise), the key's watchers are told what changed.
#[inline]
pub fn run(
    ctx: Ctx<'_>,
    key_name: RStr<'_>,
    key: &mut Key,
    create: bool,
    op: impl FnOnce(Stored<'_>, &mut ServerCx, &mut KeyWaiters<'_>) -> Outcome,
) -> Result<Reply<'static>, NoLock> {
    run_with(ctx, key_name, key, create, op)
}

/// [`run`] for any [`Op`] (a closure is one).
#[inline]
pub fn run_with(
    ctx: Ctx<'_>,
    key_name: RStr<'_>,
    key: &mut Key,
    create: bool,
    op: impl Op,
) -> Result<Reply<'static>, NoLock> {
    if watchers::any() {
        return run_watched(ctx, key_name, key, create, op);
    }
    run_here(ctx, key_name, key, create, op)
}

/// [`run`] while someone watches some key: the operation's ending events are kept, and the
/// key's watchers told afterwards. Out of line, so that the usual path pays one load.
#[cold]
#[inline(never)]
fn run_watched(
    ctx: Ctx<'_>,
    key_name: RStr<'_>,
    key: &mut Key,
    create: bool,
    op: impl Op,
) -> Result<Reply<'static>, NoLock> {
    let reply = run_here(ctx, key_name, key, create, Noted(op));
    watchers::key_changed(ctx, key_name, key);
    reply
}

/// `O`, whose outcome's ending events are kept for the watchers ([`run_watched`]).
struct Noted<O>(O);

impl<O: Op> Op for Noted<O> {
    fn run(self, stored: Stored<'_>, cx: &mut ServerCx, w: &mut KeyWaiters<'_>, out: &mut Outcome) {
        self.0.run(stored, cx, w, out);
        watchers::note(out);
    }
}

/// [`run`] but for the watchers.
#[inline(always)]
fn run_here(
    ctx: Ctx<'_>,
    key_name: RStr<'_>,
    key: &mut Key,
    create: bool,
    op: impl Op,
) -> Result<Reply<'static>, NoLock> {
    match block::open(key) {
        Opened::OtherType => Err(NoLock::WrongType),
        Opened::Nothing if !create => Err(NoLock::Missing),
        Opened::Nothing => run_free(ctx, key_name, key, op),
        Opened::Other => run_full(ctx, key_name, key, op),
        Opened::Lone(b, lone) => {
            // The operation works on a decoded copy: the block keeps the grant as it was.
            let was_bound = lone.tie_word != 0;
            let mut class = b.class();
            let mut watched = None;
            let mut out = Outcome::keep(Reply::Null);
            run_op(
                ctx,
                key_name,
                Stored::Lone(lone),
                &mut class,
                &mut watched,
                op,
                &mut out,
            );
            let (next, delete) = carry_out(ctx, key_name, &out, None, &mut class);
            if delete {
                if was_bound {
                    // The key's departure (`events::key_left`) unbinds the bound grants its
                    // block still holds: emptied first, so that it does not unbind a second
                    // time the grant whose end the effects just unbound. (A second unbind of
                    // an entry no longer listed was noted as gone and could drop the
                    // connection's other bound grants from the index: G11.)
                    block::put(key, LockRecord::default());
                }
                key.delete();
                return Ok(out.reply);
            }
            if let Some(state) = out.fate.into_state() {
                block::put(key, LockRecord { state, watched });
            }
            b.set_class(class);
            arm(ctx, key_name, key, b, next);
            Ok(out.reply)
        }
    }
}

/// [`run`] on a key that does not exist: stored afterwards only if the engine keeps it (a
/// refused or waiting request leaves no key behind).
#[inline(always)]
fn run_free(
    ctx: Ctx<'_>,
    key_name: RStr<'_>,
    key: &mut Key,
    op: impl Op,
) -> Result<Reply<'static>, NoLock> {
    let mut class = ClassRef::default();
    let mut watched = None;
    let mut out = Outcome::keep(Reply::Null);
    run_op(
        ctx,
        key_name,
        Stored::Free,
        &mut class,
        &mut watched,
        op,
        &mut out,
    );
    let (next, delete) = carry_out(ctx, key_name, &out, None, &mut class);
    if delete {
        return Ok(out.reply);
    }
    let db = ctx.selected_db();
    let name = ffi::bytes(&key_name);
    // The key was found empty and is open for writing, and Redis's allocator does not
    // return short: not reached in practice, and the reply says so if it ever is.
    let made = match out.fate {
        KeyFate::StoreLone { ref grant, mode } => {
            block::create_lone(key, grant, mode, db, name, class)
        }
        KeyFate::Store(state) => block::create(key, LockRecord { state, watched }, db, name, class),
        // Nothing to keep of a key that does not exist.
        KeyFate::Keep => return Ok(out.reply),
    };
    let block = made.map_err(|_| NoLock::NotStored)?;
    if let Some(next) = next {
        // A block made here carries its name: nothing to compare, nothing to take out.
        let _ = expiry::arm(ctx, key_name, block, next, Arming::Made);
    }
    Ok(out.reply)
}

/// [`run`] on a key whose block holds any state but a lone grant: the engine changes it in
/// place, and the block takes the form that fits it afterwards. Out of line: neither hot path
/// (ACQUIRE of a free key, RELEASE of a lone grant) comes here, and inlined it would spread
/// their code over more cache lines.
#[inline(never)]
fn run_full(
    ctx: Ctx<'_>,
    key_name: RStr<'_>,
    key: &mut Key,
    op: impl Op,
) -> Result<Reply<'static>, NoLock> {
    let Found::Lock(mut lock) = block::lock_mut(key) else {
        return Err(NoLock::Missing);
    };
    let b = lock.block();
    let mut class = b.class();
    let mut out = Outcome::keep(Reply::Null);
    {
        let (state, watched) = lock.parts();
        let stored = Stored::Full(state);
        run_op(ctx, key_name, stored, &mut class, watched, op, &mut out);
    }
    let (next, delete) = carry_out(ctx, key_name, &out, Some(lock.state()), &mut class);
    if delete {
        lock.discard();
        key.delete();
        return Ok(out.reply);
    }
    if let Some(state) = out.fate.into_state() {
        *lock.state() = state;
    }
    // The state goes back into its block (in the form that fits it now).
    drop(lock);
    b.set_class(class);
    arm(ctx, key_name, key, b, next);
    Ok(out.reply)
}

/// Arm the key's existing block for `next` (the last `Arm` of the outcome, if any); a block
/// that does not carry the key's name gets a named one first.
#[inline]
fn arm(
    ctx: Ctx<'_>,
    key_name: RStr<'_>,
    key: &mut Key,
    b: RecordPtr,
    next: Option<Option<Deadline>>,
) {
    if let Some(next) = next {
        if expiry::arm(ctx, key_name, b, next, Arming::Update).is_err() {
            expiry::name_and_arm(ctx, key_name, key, false);
        }
    }
}

/// Carry out the effects of `out` on the key `key_name`, in order, but the timer and the
/// deletion: the last `Arm`, and whether the key is to be deleted, are returned for after the
/// key's state is settled (a new key has no block before).
/// `kept`: the state the operation left in place (a full block's), which a replication sends
/// when the fate keeps it.
#[inline(always)]
fn carry_out(
    ctx: Ctx<'_>,
    key_name: RStr<'_>,
    out: &Outcome,
    kept: Option<&LockState>,
    class: &mut ClassRef,
) -> (Option<Option<Deadline>>, bool) {
    let key = ffi::bytes(&key_name);
    let mut next = None;
    let mut delete = false;
    let mut scratch = None;
    for &effect in out.effects.as_slice() {
        match effect {
            Effect::Notify(e @ Event::Acquired { ttl_ms }) => {
                stats::GRANTS.incr();
                stats::record(class, key, Measured::Granted { ttl_ms });
                ffi::notify(ctx, e.c_name(), key_name);
            }
            Effect::Notify(e @ Event::Released { held_ms, .. }) => {
                stats::RELEASES.incr();
                stats::record(class, key, Measured::Released { held_ms });
                ffi::notify(ctx, e.c_name(), key_name);
            }
            // Nothing to build when nothing consumes replication (no replica, no AOF).
            Effect::Replicate if server::replication_consumed() => {
                if let Some(s) = out.fate.snapshot_with(kept, &mut scratch) {
                    replication::state(ctx, key_name, s);
                }
            }
            Effect::Replicate | Effect::ReplicateSoFar(_) if !server::replication_consumed() => {}
            Effect::ReplicateDelete => replication::delete(ctx, key_name),
            // Done by the caller, once the effects are out.
            Effect::DeleteKey => delete = true,
            Effect::Arm(at) => next = Some(at),
            rare => carry_out_rare(ctx, key_name, out, rare, class),
        }
    }
    (next, delete)
}

/// The effects the hot ACQUIRE and RELEASE never have, out of line so that [`carry_out`],
/// inlined into every operation, stays short (see [`Effect`] for what each one does).
#[cold]
#[inline(never)]
fn carry_out_rare(
    ctx: Ctx<'_>,
    key_name: RStr<'_>,
    out: &Outcome,
    effect: Effect,
    class: &mut ClassRef,
) {
    let key = ffi::bytes(&key_name);
    match effect {
        Effect::Notify(e) => {
            let measured = match e {
                Event::Acquired { ttl_ms } => {
                    stats::GRANTS.incr();
                    Measured::Granted { ttl_ms }
                }
                Event::Released { held_ms, .. } => {
                    stats::RELEASES.incr();
                    Measured::Released { held_ms }
                }
                Event::Expired { .. } => {
                    stats::EXPIRATIONS.incr();
                    Measured::Expired
                }
                Event::Revoked { .. } => {
                    stats::REVOKES.incr();
                    Measured::Revoked
                }
                Event::Closed { .. } => {
                    stats::BOUND_CLOSED.incr();
                    Measured::Closed
                }
            };
            stats::record(class, key, measured);
            ffi::notify(ctx, e.c_name(), key_name);
        }
        Effect::Count(Count::Renewed) => {
            stats::RENEWALS.incr();
            stats::record(class, key, Measured::Renewed);
        }
        Effect::Count(Count::Contended) => stats::CONTENDED.incr(),
        Effect::ReplicateSoFar(n) => {
            if let Some(s) = out.effects.state_so_far(n).and_then(Snapshot::of) {
                replication::state(ctx, key_name, s);
            }
        }
        Effect::ReplicateVerbatim => replication::verbatim(ctx),
        Effect::Bind { client, token } => {
            bindings::bind(client, token, ctx.selected_db(), key);
        }
        Effect::Unbind { client, token } => bindings::unbind(client, token, ctx.selected_db(), key),
        // Looked at right after the command, on all the request's keys together.
        Effect::TryMulti { waiter } => jobs::schedule(Job::TryMulti {
            key: waiters::key_id(ctx, key_name),
            waiter,
        }),
        // Handled by `carry_out` itself.
        Effect::Replicate | Effect::ReplicateDelete | Effect::DeleteKey | Effect::Arm(_) => {}
    }
}
