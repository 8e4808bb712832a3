//! The lock engine: every operation on one lock key, in the order the contract needs.
//!
//! Each operation takes the key as the store holds it ([`Stored`]: no lock, its one grant
//! read in place, or its whole state), a [`Context`] (the role, the clocks, the settings, the
//! token issuer) and the key's [`Waiters`], and returns an [`Outcome`]: the reply, the
//! [`Effects`] to carry out in order (keyspace notifications, counters, replication, deleting
//! the key, arming its timer, bindings) and what becomes of the stored lock ([`KeyFate`]).
//! The Redis module's one executor carries the outcome out; it decides nothing. The fuzzer
//! and the table tests run the same operations and check their outcomes.
//!
//! The two operations most locks see are answered without building a [`LockState`] when the
//! key is that simple (`lone.rs`: ACQUIRE of a free key, RELEASE of a one-grant key); every
//! other case goes the general way. Effects are values in a buffer with room for eight
//! inline, so the hot path allocates nothing.

use crate::args::AcquireArgs;
use crate::clock::{Deadline, Now};
use crate::errors::Fixed;
use crate::queue::Waiter;
use crate::snapshot::{LockImage, Snapshot};
use crate::state::{Acquired, Binding, Grant, LockState, Mode};
use crate::tokens::TokenIssuer;
use std::ffi::CStr;

/// What an operation needs besides the key's state.
pub struct Env<'t> {
    /// The clocks, read once per command.
    pub now: Now,
    /// `flock.lock-delay-ms`: after an expiry or a revoke, a slot stays taken this long.
    pub lock_delay_ms: u64,
    /// `flock.max-holders`: most live shared grants on one key.
    pub max_holders: u32,
    /// Only a master ends leases, hands keys off, deletes keys and arms timers on its own; a
    /// replica follows its master's effects (G7).
    pub master: bool,
    /// The server-wide token issuer (G3).
    pub tokens: &'t mut TokenIssuer,
}

/// A change that subscribers see as a keyspace notification (`flock.<name>`, class `d`) and
/// `INFO flock` counts: one per grant.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Event {
    /// A grant with this lease.
    Acquired {
        ttl_ms: u64,
    },
    /// A grant ended by RELEASE after it was held this long. Each ending event names the
    /// grant's token: FLOCK.WATCH tells the watchers of that grant how it ended.
    Released {
        held_ms: u64,
        token: u64,
    },
    Expired {
        token: u64,
    },
    Revoked {
        token: u64,
    },
    /// A BOUND grant ended because its connection closed (or it had none on this master).
    Closed {
        token: u64,
    },
}

impl Event {
    /// The keyspace notification's event name.
    pub fn name(self) -> &'static str {
        // Every name is ASCII.
        self.c_name().to_str().unwrap_or("flock")
    }

    /// The same name as a C string, for `RedisModule_NotifyKeyspaceEvent`.
    pub fn c_name(self) -> &'static CStr {
        match self {
            Event::Acquired { .. } => c"flock.acquired",
            Event::Released { .. } => c"flock.released",
            Event::Expired { .. } => c"flock.expired",
            Event::Revoked { .. } => c"flock.revoked",
            Event::Closed { .. } => c"flock.closed",
        }
    }
}

/// Something only `INFO flock` counts (no notification).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Count {
    /// A holder extended its lease (RENEW).
    Renewed,
    /// An ACQUIRE found no room for it (whether or not it then waited).
    Contended,
}

/// What the executor must carry out, in the order given (see [`Effects`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Effect {
    Notify(Event),
    Count(Count),
    /// Send the key's state, as the operation left it, to replicas and the AOF
    /// (`FLOCK.APPLY`; [`Snapshot::of`] that state is `Some`).
    Replicate,
    /// Send the key's state as it was at this point of the operation: the `n`-th state kept
    /// in the [`Effects`] ([`Effects::state_so_far`]).
    ReplicateSoFar(u8),
    /// Send the key's deletion to replicas and the AOF (`DEL`).
    ReplicateDelete,
    /// Pass the command being run on to replicas and the AOF as it is (a replica applying
    /// its master's effect).
    ReplicateVerbatim,
    /// Take the key out of the keyspace once the operation is over (nothing is left of it:
    /// no grant, no delayed slot, no waiter).
    DeleteKey,
    /// The key needs attention at this deadline (a lease's or a delayed slot's end); `None`:
    /// it needs none.
    Arm(Option<Deadline>),
    /// The grant `token` of this key is now bound to connection `client` (BOUND): when that
    /// connection closes, [`close`] must run on the key.
    Bind {
        client: u64,
        token: u64,
    },
    /// The grant `token` is no longer bound to `client` (it ended or was rebound).
    Unbind {
        client: u64,
        token: u64,
    },
    /// The FLOCK.MACQUIRE request `waiter` is first in this key's queue and the key is free:
    /// it may be granted now if the same holds for its other keys, which only the module can
    /// look at together ([`crate::multi::ready`]). Until then the key stays free and those
    /// behind the request wait (nobody overtakes it).
    TryMulti {
        waiter: u64,
    },
}

/// Why the caller could not wait for the key.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BlockRefused {
    /// `flock.max-waiters` clients already wait for it.
    TooMany,
    /// The server would not block the client.
    Failed,
}

/// The wait queue of the key an operation runs on, as the server keeps it: what the engine
/// asks of it and does to it while it decides (who waits, who is next, hand the key to a
/// waiter, make the caller wait). Everything else an operation causes is an [`Effect`] in
/// its [`Outcome`].
pub trait Waiters {
    /// How many requests wait for this key.
    fn waiting(&mut self) -> usize;
    /// The mode of the shared requests waiting for this key, if any wait (they all have the
    /// key's limit).
    fn waiting_mode(&mut self) -> Option<Mode>;
    /// The first waiter of this key, taken off its queue when `fits` says it can be granted
    /// now; `None` when nobody waits or the first one does not fit.
    fn next_waiter_if(&mut self, fits: &mut dyn FnMut(&Waiter) -> bool) -> Option<Waiter>;
    /// Hand the key to `waiter` with `token`; false when the waiter is gone (it left between
    /// its queueing and now), and the grant must be taken back.
    fn deliver(&mut self, waiter: &Waiter, token: u64) -> bool;
    /// Make the caller wait for this key (BLOCK) with the request `args`; `timeout_ms` 0 waits
    /// without limit. An earlier request of the same owner leaves the queue (it gets nil).
    /// `bind_to`: with BOUND, the connection the grant is to live with.
    fn block(
        &mut self,
        args: &AcquireArgs<'_>,
        timeout_ms: u64,
        bind_to: Option<u64>,
    ) -> Result<(), BlockRefused>;
}

/// What an operation asks of the server it runs on: the role, the clocks and the token
/// issuer. [`Context::env`] is asked only when the operation needs it: RELEASE of a lone
/// grant needs only the role and the monotonic clock, which saves the server a wall-clock
/// read and the token issuer's lock on the hottest path there is. An [`Env`] is a context
/// too (tests, the fuzzer).
pub trait Context {
    /// Whether this server is a master (only a master ends leases, hands keys off, deletes
    /// keys and arms timers on its own; a replica follows its master's effects, G7).
    fn master(&self) -> bool;
    /// The monotonic clock now, in microseconds (as [`Now::mono_us`]).
    fn mono_us(&mut self) -> u64;
    /// Everything else: both clocks, the settings, the token issuer.
    fn env(&mut self) -> Env<'_>;
}

impl Context for Env<'_> {
    fn master(&self) -> bool {
        self.master
    }
    fn mono_us(&mut self) -> u64 {
        self.now.mono_us
    }
    fn env(&mut self) -> Env<'_> {
        Env {
            now: self.now,
            lock_delay_ms: self.lock_delay_ms,
            max_holders: self.max_holders,
            master: self.master,
            tokens: self.tokens,
        }
    }
}

mod reply;
pub use reply::{Info, Reply, ReplyError};

mod read;
pub use read::{check, holders, info};

/// How long `grant` was held at `now`, in ms.
fn held_ms(grant: &Grant, now: Now) -> u64 {
    now.mono_us.saturating_sub(grant.since_mono_us) / 1000
}

/// A grant ended: its connection, if it was bound to one, no longer holds it.
fn unbind(fx: &mut Effects, grant: &Grant) {
    if let Some(client) = grant.bound_client() {
        fx.push(Effect::Unbind {
            client,
            token: grant.token,
        });
    }
}

// ---- the steps every write operation is made of ----

/// Bring the key up to date at `now`: end run-out leases (`flock.expired` each), end finished
/// delayed slots, and grant from the head of the queue while the head fits (a run of readers
/// goes together; a head that does not fit holds everyone behind it). Publishes nothing.
/// Returns whether the state changed (and so must be replicated).
#[inline]
fn settle_state(
    state: &mut LockState,
    env: &mut Env<'_>,
    w: &mut impl Waiters,
    fx: &mut Effects,
) -> bool {
    let now = env.now;
    let mut changed = false;
    if !state.grants().is_empty()
        && state.expire(now, env.lock_delay_ms, |g| {
            // A bound grant that lost its connection while its lease ran ends as closed; one
            // whose lease had run out already ended by its lease (G11: never past it), even if
            // its loss is what brought the key here.
            let event = if g.binding() == Binding::Lost && !g.deadline.passed(now) {
                Event::Closed { token: g.token }
            } else {
                Event::Expired { token: g.token }
            };
            fx.push(Effect::Notify(event));
            unbind(fx, g);
        }) > 0
    {
        changed = true;
    }
    if !state.delays.is_empty() {
        changed |= state.end_delays(now);
    }
    let max_holders = env.max_holders;
    if !state.could_admit(now, max_holders) || w.waiting() == 0 {
        return changed;
    }
    loop {
        // Checked before the waiter leaves its queue: a waiter is never taken off without
        // a token for it.
        if env.tokens.exhausted(now) {
            return changed;
        }
        // A MACQUIRE request is never granted one key alone: at the head of a free key it is
        // named for the module to try on all its keys, and holds the queue until then.
        let mut multi_first = None;
        let fits = &mut |w: &Waiter| {
            let fits = state.fits(w.mode, now, max_holders);
            if w.multi && fits {
                multi_first = Some(w.id);
            }
            fits && !w.multi
        };
        let Some(waiter) = w.next_waiter_if(fits) else {
            if let Some(waiter) = multi_first {
                fx.push(Effect::TryMulti { waiter });
            }
            return changed;
        };
        let Some(token) = env.tokens.issue(now) else {
            return changed;
        };
        state.grant(
            waiter.mode,
            &waiter.owner,
            waiter.ttl_ms,
            token,
            now,
            waiter.bind_to,
        );
        changed = true;
        if w.deliver(&waiter, token) {
            fx.push(Effect::Notify(Event::Acquired {
                ttl_ms: waiter.ttl_ms,
            }));
            if let Some(client) = waiter.bind_to {
                fx.push(Effect::Bind { client, token });
            }
        } else {
            // The waiter vanished between its queueing and now: the next one may have it.
            state.ungrant_newest();
        }
    }
}

/// Replicate the state when it `changed`; delete the key when nothing is left of it (no
/// grant, no delayed slot, no waiter), else arm it for its next deadline. Returns true when
/// the key is to be deleted.
#[inline]
fn publish(
    state: &LockState,
    env: &Env<'_>,
    w: &mut impl Waiters,
    fx: &mut Effects,
    changed: bool,
) -> bool {
    publish_as(state, env, w, fx, changed, false)
}

/// [`publish`]; `so_far`: the operation goes on changing the state after this (the first
/// step of RELEASE, RENEW and REVOKE), so the state is replicated as it is now
/// ([`Effect::ReplicateSoFar`]): the tokens it carries must reach the replicas even when a
/// later step ends their grants in the same operation (G3 after a failover).
#[inline]
fn publish_as(
    state: &LockState,
    env: &Env<'_>,
    w: &mut impl Waiters,
    fx: &mut Effects,
    changed: bool,
    so_far: bool,
) -> bool {
    if state.is_vacant(env.now) && w.waiting() == 0 {
        // Replicated even when this operation changed nothing: the replicas may hold the
        // key all the same (a COPY that left only bound grants out is vacant on both sides,
        // and only the master looks at it again). A DEL of a key a replica never had is a
        // no-op there.
        fx.push(Effect::ReplicateDelete);
        fx.push(Effect::DeleteKey);
        return true;
    }
    if changed && Snapshot::of(state).is_some() {
        if so_far {
            fx.push_state_so_far(state);
        } else {
            fx.push(Effect::Replicate);
        }
    } else if changed {
        // Nothing held, nothing delayed, but waited on: a MACQUIRE request first in line
        // keeps the key here (its waiters are this server's own). Replicas, which see no
        // waiters, drop the key.
        fx.push(Effect::ReplicateDelete);
    }
    if env.master {
        fx.push(Effect::Arm(state.next_deadline()));
    }
    false
}

/// [`settle_state`] then [`publish`], on a master. `changed`: the caller already changed the
/// state. Returns true when the key is to be deleted.
#[inline]
fn settle(
    state: &mut LockState,
    env: &mut Env<'_>,
    w: &mut impl Waiters,
    fx: &mut Effects,
    changed: bool,
) -> bool {
    if !env.master {
        return false;
    }
    let changed = settle_state(state, env, w, fx) || changed;
    publish(state, env, w, fx, changed)
}

/// The first step of an operation on a held key (RELEASE, RENEW, REVOKE): [`settle`], except
/// that a state the settling left unchanged is not armed again. Its timer is already right:
/// every change was armed when it was published, and a timer that fires pops its entry and
/// arms the key again through [`expire`], so only the deletion of a key nothing is left of
/// needs checking here. Returns true when the key is to be deleted.
#[inline]
fn settle_first(
    state: &mut LockState,
    env: &mut Env<'_>,
    w: &mut impl Waiters,
    fx: &mut Effects,
) -> bool {
    if !env.master {
        return false;
    }
    if settle_state(state, env, w, fx) {
        return publish_as(state, env, w, fx, true, true);
    }
    if state.is_vacant(env.now) && w.waiting() == 0 {
        fx.push(Effect::DeleteKey);
        return true;
    }
    false
}

// ---- the operations ----

/// `FLOCK.ACQUIRE key owner ttl [SHARED | LIMIT n] [BOUND] [BLOCK timeout]` on the key's
/// state (a fresh, empty one when the key did not exist). `can_block`: the caller's context
/// allows blocking (not MULTI, not a script). `bind_to`: with BOUND, the caller's connection.
#[inline]
fn acquire_state(
    state: &mut LockState,
    env: &mut Env<'_>,
    w: &mut impl Waiters,
    fx: &mut Effects,
    args: &AcquireArgs<'_>,
    can_block: bool,
    bind_to: Option<u64>,
) -> Reply<'static> {
    // Settle first (expiry, hand-off to waiters), publish once with the outcome.
    let (settled, waiting) = if env.master {
        let settled = settle_state(state, env, w, fx);
        // The queue matters to a request that could be granted now (a newcomer never
        // overtakes it) and to a shared one (its limit must be the waiters'); an exclusive
        // request on a key that admits nobody gets nil without asking.
        let ask = !args.mode.is_exclusive() || state.could_admit(env.now, env.max_holders);
        (settled, if ask { w.waiting() } else { 0 })
    } else {
        (false, 0)
    };
    let now = env.now;
    // The connection the owner's grant is bound to now, if any (an indexed look-up).
    let bound_before = state
        .owner_grant(args.owner, now)
        .and_then(Grant::bound_client);
    let outcome = state.acquire(
        args.owner,
        args.mode,
        args.ttl_ms,
        now,
        waiting,
        || {
            if waiting > 0 {
                w.waiting_mode()
            } else {
                None
            }
        },
        env.max_holders,
        bind_to,
        env.tokens,
    );
    match outcome {
        Acquired::Granted(token) => {
            publish(state, env, w, fx, true);
            fx.push(Effect::Notify(Event::Acquired {
                ttl_ms: args.ttl_ms,
            }));
            if let Some(client) = bind_to {
                fx.push(Effect::Bind { client, token });
            }
            Reply::Int(token as i64)
        }
        Acquired::Refreshed(token) => {
            publish(state, env, w, fx, true);
            if bound_before != bind_to {
                if let Some(client) = bound_before {
                    fx.push(Effect::Unbind { client, token });
                }
                if let Some(client) = bind_to {
                    fx.push(Effect::Bind { client, token });
                }
            }
            Reply::Int(token as i64)
        }
        Acquired::Busy => {
            fx.push(Effect::Count(Count::Contended));
            let blocked = match args.block {
                Some(timeout_ms) if can_block => Some(w.block(args, timeout_ms, bind_to)),
                _ => None,
            };
            // A retried wait takes the owner's earlier request out of the queue: when that
            // was the head that held the others behind it, the new head may fit now (G6).
            let settled = match blocked {
                Some(Ok(())) if env.master => settle_state(state, env, w, fx) || settled,
                _ => settled,
            };
            publish(state, env, w, fx, settled);
            match blocked {
                None => Reply::Null,
                Some(Ok(())) => Reply::Blocked,
                Some(Err(BlockRefused::TooMany)) => Reply::Error(ReplyError::TooManyWaiters),
                Some(Err(BlockRefused::Failed)) => Reply::Error(ReplyError::CouldNotBlock),
            }
        }
        Acquired::OwnerHolds(mode) => {
            publish(state, env, w, fx, settled);
            Reply::Error(ReplyError::OwnerHolds(mode))
        }
        Acquired::LimitMismatch(mode) => {
            publish(state, env, w, fx, settled);
            Reply::Error(ReplyError::LimitMismatch(mode))
        }
        Acquired::TokensExhausted => {
            publish(state, env, w, fx, settled);
            Reply::Error(ReplyError::TokensExhausted)
        }
    }
}

/// `FLOCK.RELEASE key owner [token]` on an existing lock key.
#[inline]
fn release_state(
    state: &mut LockState,
    env: &mut Env<'_>,
    w: &mut impl Waiters,
    fx: &mut Effects,
    owner: &[u8],
    token: Option<u64>,
) -> Reply<'static> {
    if settle_first(state, env, w, fx) {
        return Reply::Int(0);
    }
    let Some(grant) = state.release(owner, token, env.now) else {
        return Reply::Int(0);
    };
    fx.push(Effect::Notify(Event::Released {
        held_ms: held_ms(&grant, env.now),
        token: grant.token,
    }));
    unbind(fx, &grant);
    settle(state, env, w, fx, true);
    Reply::Int(1)
}

/// `FLOCK.RENEW key owner ttl [token]` on an existing lock key.
#[inline]
fn renew_state(
    state: &mut LockState,
    env: &mut Env<'_>,
    w: &mut impl Waiters,
    fx: &mut Effects,
    owner: &[u8],
    ttl_ms: u64,
    token: Option<u64>,
) -> Reply<'static> {
    if settle_first(state, env, w, fx) {
        return Reply::Null;
    }
    match state.renew(owner, ttl_ms, token, env.now) {
        Some(token) => {
            fx.push(Effect::Count(Count::Renewed));
            publish(state, env, w, fx, true);
            Reply::Int(token as i64)
        }
        None => Reply::Null,
    }
}

/// `FLOCK.REVOKE key [owner]` on an existing lock key: the number of grants ended.
#[inline]
fn revoke_state(
    state: &mut LockState,
    env: &mut Env<'_>,
    w: &mut impl Waiters,
    fx: &mut Effects,
    owner: Option<&[u8]>,
) -> Reply<'static> {
    if settle_first(state, env, w, fx) {
        return Reply::Int(0);
    }
    let n = state.revoke(owner, env.now, env.lock_delay_ms, |g| {
        fx.push(Effect::Notify(Event::Revoked { token: g.token }));
        unbind(fx, g);
    });
    if n == 0 {
        return Reply::Int(0);
    }
    settle(state, env, w, fx, true);
    Reply::Int(n as i64)
}

/// The key's deadline came (its timer fired): end leases and delayed slots, hand the key on,
/// delete it when nothing is left.
fn expire_state(state: &mut LockState, env: &mut Env<'_>, w: &mut impl Waiters, fx: &mut Effects) {
    settle(state, env, w, fx, false);
}

/// A look at a waited key after something happened to it (deleted, flushed, renamed,
/// overwritten, a waiter left), or after a waiter vanished before its grant's reply went out:
/// `ghost` is that grant's token, which is released first if it is still a live grant.
fn revisit_state(
    state: &mut LockState,
    env: &mut Env<'_>,
    w: &mut impl Waiters,
    fx: &mut Effects,
    ghost: Option<u64>,
) {
    if !env.master {
        return;
    }
    let mut changed = false;
    if let Some(token) = ghost {
        if let Some(grant) = state.take_token(token, env.now) {
            fx.push(Effect::Notify(Event::Released {
                held_ms: held_ms(&grant, env.now),
                token: grant.token,
            }));
            unbind(fx, &grant);
            changed = true;
        }
    }
    settle(state, env, w, fx, changed);
}

/// Connection `client` closed (it left every wait queue already): its bound grants of this
/// key end now, as on expiry (`flock.closed`, lock-delay, the next waiters are granted).
fn close_state(
    state: &mut LockState,
    env: &mut Env<'_>,
    w: &mut impl Waiters,
    fx: &mut Effects,
    client: u64,
) {
    if !env.master {
        return;
    }
    state.close(client);
    settle(state, env, w, fx, false);
}

/// On a master, a key that arrived from outside (restart, RESTORE or MIGRATE, promotion,
/// DEBUG RELOAD): its bound grants have no connection in this process, so they are not live
/// from now on; the key is then due at once ([`LockState::next_deadline`]) and its timer ends
/// them and replicates that. Returns whether any grant lost its connection.
pub fn orphan_bound(state: &mut LockState, master: bool) -> bool {
    master && state.orphan_bound() > 0
}

/// What the key of a [`revisit`] holds now.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Found {
    Lock,
    Nothing,
    OtherType,
}

/// What to do for a [`revisit`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RevisitPlan {
    /// Nothing to do.
    Skip,
    /// Unblock every waiter of the key with this error.
    FailWaiters(&'static str),
    /// Open (or create) the lock and [`revisit`] it.
    Revisit,
}

/// Decide a [`revisit`] from what the key holds. `serves_stably` (asked only when needed: it
/// costs a `CLUSTER NODES`) tells whether this node still serves the key's slot.
pub fn plan_revisit(
    master: bool,
    found: Found,
    ghost: Option<u64>,
    waiting: usize,
    serves_stably: impl FnOnce() -> bool,
) -> RevisitPlan {
    match found {
        _ if !master => RevisitPlan::Skip,
        Found::OtherType => RevisitPlan::FailWaiters(Fixed::WaitedKeyOtherType.as_str()),
        Found::Nothing if ghost.is_some() || waiting == 0 => RevisitPlan::Skip,
        // The key migrated away (or is migrating): granting it here would make a second copy
        // of the lock. Cluster clients retry TRYAGAIN and follow the redirect.
        Found::Nothing if !serves_stably() => {
            RevisitPlan::FailWaiters(Fixed::WaitedKeyMoved.as_str())
        }
        _ => RevisitPlan::Revisit,
    }
}

/// An image that arrived from outside (RDB, RESTORE, AOF, replication), as the key's state on
/// this server; the tokens it carries raise the high-water mark (G3).
pub fn load(image: LockImage, now: Now, tokens: &mut TokenIssuer) -> LockState {
    tokens.observe(image.token());
    let mut state = image.restore(now);
    if state.grants().is_empty() && state.delays.is_empty() {
        // Saved with nothing in it (a free key that a waiting MACQUIRE kept: waiters are never
        // saved): due at once, so that its timer finds it vacant and deletes it (G10).
        state.delays.push(Deadline::after(0, now));
    }
    state
}

/// `FLOCK.APPLY`: a replica (or AOF loading) takes the master's state of the key as it is,
/// and passes the effect on to its own AOF and sub-replicas.
fn apply_state(
    state: &mut LockState,
    env: &mut Env<'_>,
    fx: &mut Effects,
    image: LockImage,
) -> Reply<'static> {
    *state = load(image, env.now, env.tokens);
    fx.push(Effect::ReplicateVerbatim);
    Reply::Ok
}

mod lone;
pub use lone::LoneGrant;

#[cfg(test)]
mod tests;

// ---- the operations, on the key as the store holds it ----

mod outcome;
pub use outcome::{Effects, KeyFate, Outcome, Stored};

/// Run `op` on the whole state of the key: the full form's own (changed in place), or one
/// made for the operation (decoded from the one grant, or empty for a free key), which
/// becomes the key's state afterwards.
#[inline]
pub(crate) fn with_state<R>(
    stored: Stored<'_>,
    op: impl FnOnce(&mut LockState) -> R,
) -> (R, KeyFate) {
    match stored {
        Stored::Full(state) => (op(state), KeyFate::Keep),
        Stored::Lone(lone) => {
            let mut state = lone.state();
            let r = op(&mut state);
            (r, KeyFate::Store(state))
        }
        Stored::Free => {
            let mut state = LockState::default();
            let r = op(&mut state);
            (r, KeyFate::Store(state))
        }
    }
}

/// `FLOCK.ACQUIRE key owner ttl [SHARED | LIMIT n] [BOUND] [BLOCK timeout]`. `can_block`: the
/// caller's context allows blocking (not MULTI, not a script). `bind_to`: with BOUND, the
/// caller's connection.
#[inline]
pub fn acquire(
    stored: Stored<'_>,
    cx: &mut impl Context,
    w: &mut impl Waiters,
    args: &AcquireArgs<'_>,
    can_block: bool,
    bind_to: Option<u64>,
) -> Outcome {
    let mut fx = Effects::default();
    let mut env = cx.env();
    if matches!(stored, Stored::Free) {
        if let Some((reply, grant, mode)) = lone::acquire_free(args, &mut env, w, &mut fx, bind_to)
        {
            return Outcome {
                reply,
                effects: fx,
                fate: KeyFate::StoreLone { grant, mode },
            };
        }
    }
    acquire_general(stored, &mut env, w, fx, args, can_block, bind_to)
}

/// [`acquire`] past its fast path. Out of line and cold: kept away from the hot ACQUIRE of a
/// free key, whose code then stays a few cache lines long (the general path is many times
/// its size, and inlined it spread the hot instructions over twice the I1 cache lines).
#[cold]
#[inline(never)]
fn acquire_general(
    stored: Stored<'_>,
    env: &mut Env<'_>,
    w: &mut impl Waiters,
    mut fx: Effects,
    args: &AcquireArgs<'_>,
    can_block: bool,
    bind_to: Option<u64>,
) -> Outcome {
    let (reply, fate) = with_state(stored, |state| {
        acquire_state(state, env, w, &mut fx, args, can_block, bind_to)
    });
    Outcome {
        reply,
        effects: fx,
        fate,
    }
}

/// `FLOCK.RELEASE key owner [token]` on an existing lock key.
#[inline]
pub fn release(
    stored: Stored<'_>,
    cx: &mut impl Context,
    w: &mut impl Waiters,
    owner: &[u8],
    token: Option<u64>,
) -> Outcome {
    let mut fx = Effects::default();
    if let Stored::Lone(lone) = &stored {
        let (mono_us, master) = (cx.mono_us(), cx.master());
        if let Some(reply) = lone::release_lone(lone, mono_us, master, w, &mut fx, owner, token) {
            return Outcome {
                reply,
                effects: fx,
                fate: KeyFate::Keep,
            };
        }
    }
    release_general(stored, cx, w, fx, owner, token)
}

/// [`release`] past its fast path: out of line and cold, as [`acquire_general`] is.
#[cold]
#[inline(never)]
fn release_general(
    stored: Stored<'_>,
    cx: &mut impl Context,
    w: &mut impl Waiters,
    mut fx: Effects,
    owner: &[u8],
    token: Option<u64>,
) -> Outcome {
    let mut env = cx.env();
    let (reply, fate) = with_state(stored, |state| {
        release_state(state, &mut env, w, &mut fx, owner, token)
    });
    Outcome {
        reply,
        effects: fx,
        fate,
    }
}

/// `FLOCK.RENEW key owner ttl [token]` on an existing lock key.
pub fn renew(
    stored: Stored<'_>,
    cx: &mut impl Context,
    w: &mut impl Waiters,
    owner: &[u8],
    ttl_ms: u64,
    token: Option<u64>,
) -> Outcome {
    let mut fx = Effects::default();
    let mut env = cx.env();
    let (reply, fate) = with_state(stored, |state| {
        renew_state(state, &mut env, w, &mut fx, owner, ttl_ms, token)
    });
    Outcome {
        reply,
        effects: fx,
        fate,
    }
}

/// `FLOCK.REVOKE key [owner]` on an existing lock key: the number of grants ended.
pub fn revoke(
    stored: Stored<'_>,
    cx: &mut impl Context,
    w: &mut impl Waiters,
    owner: Option<&[u8]>,
) -> Outcome {
    let mut fx = Effects::default();
    let mut env = cx.env();
    let (reply, fate) = with_state(stored, |state| {
        revoke_state(state, &mut env, w, &mut fx, owner)
    });
    Outcome {
        reply,
        effects: fx,
        fate,
    }
}

/// The key's deadline came (its timer fired): end leases and delayed slots, hand the key on,
/// delete it when nothing is left.
pub fn expire(stored: Stored<'_>, cx: &mut impl Context, w: &mut impl Waiters) -> Outcome {
    let mut fx = Effects::default();
    let mut env = cx.env();
    let ((), fate) = with_state(stored, |state| expire_state(state, &mut env, w, &mut fx));
    Outcome {
        reply: Reply::Null,
        effects: fx,
        fate,
    }
}

/// A look at a waited key after something happened to it (deleted, flushed, renamed,
/// overwritten, a waiter left), or after a waiter vanished before its grant's reply went out:
/// `ghost` is that grant's token, which is released first if it is still a live grant. A
/// free key is looked at as an empty lock (its waiters may be granted it).
pub fn revisit(
    stored: Stored<'_>,
    cx: &mut impl Context,
    w: &mut impl Waiters,
    ghost: Option<u64>,
) -> Outcome {
    let mut fx = Effects::default();
    let mut env = cx.env();
    let ((), fate) = with_state(stored, |state| {
        revisit_state(state, &mut env, w, &mut fx, ghost)
    });
    Outcome {
        reply: Reply::Null,
        effects: fx,
        fate,
    }
}

/// Connection `client` closed (it left every wait queue already): its bound grants of this
/// key end now, as on expiry (`flock.closed`, lock-delay, the next waiters are granted).
pub fn close(
    stored: Stored<'_>,
    cx: &mut impl Context,
    w: &mut impl Waiters,
    client: u64,
) -> Outcome {
    let mut fx = Effects::default();
    let mut env = cx.env();
    let ((), fate) = with_state(stored, |state| {
        close_state(state, &mut env, w, &mut fx, client)
    });
    Outcome {
        reply: Reply::Null,
        effects: fx,
        fate,
    }
}

/// `FLOCK.APPLY`: a replica (or AOF loading) takes the master's state of the key as it is,
/// and passes the effect on to its own AOF and sub-replicas.
pub fn apply(stored: Stored<'_>, cx: &mut impl Context, image: LockImage) -> Outcome {
    let mut fx = Effects::default();
    let mut env = cx.env();
    let (reply, fate) = with_state(stored, |state| apply_state(state, &mut env, &mut fx, image));
    Outcome {
        reply,
        effects: fx,
        fate,
    }
}
