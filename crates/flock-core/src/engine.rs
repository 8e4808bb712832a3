//! The lock engine: every operation on one lock key, in the order the contract needs.
//!
//! Each operation takes the key's [`LockState`], an [`Env`] (the clock reading, the settings,
//! the role, the token issuer) and a [`Host`], and returns the [`Reply`]. What must happen
//! around the state (keyspace notifications, replication, deleting the key, arming its timer,
//! handing the key to a waiter) goes to the host as an [`Effect`] the moment the engine
//! decides it, in the order it must be carried out. The Redis module is the host: it executes
//! effects and answers the few questions only the server can (how many clients wait, was a
//! waiter still there to take its grant, could the caller be blocked); it decides nothing.
//! The fuzzer and the table tests below are hosts too, so they check this very code.
//!
//! The host is a callback sink rather than a returned list so that the hot path (an
//! uncontended ACQUIRE) allocates nothing: three effects go straight to the module's executor.

use crate::args::AcquireArgs;
use crate::clock::{Deadline, Now};
use crate::queue::Waiter;
use crate::snapshot::Snapshot;
use crate::state::{Acquired, LockState};
use crate::tokens::TokenIssuer;

/// What an operation needs besides the key's state.
pub struct Env<'t> {
    /// The clocks, read once per command.
    pub now: Now,
    /// `flock.lock-delay-ms`: after an expiry or a revoke, no grant for this long.
    pub lock_delay_ms: u64,
    /// Only a master ends leases, hands keys off, deletes keys and arms timers on its own; a
    /// replica follows its master's effects (G7).
    pub master: bool,
    /// The server-wide token issuer (G3).
    pub tokens: &'t mut TokenIssuer,
}

/// A change that subscribers see as a keyspace notification (`flock.<name>`, class `d`) and
/// `INFO flock` counts.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Event {
    /// A grant with this lease.
    Acquired {
        ttl_ms: u64,
    },
    /// A grant ended by RELEASE after it was held this long.
    Released {
        held_ms: u64,
    },
    Expired,
    Revoked,
}

impl Event {
    /// The keyspace notification's event name.
    pub fn name(self) -> &'static str {
        match self {
            Event::Acquired { .. } => "flock.acquired",
            Event::Released { .. } => "flock.released",
            Event::Expired => "flock.expired",
            Event::Revoked => "flock.revoked",
        }
    }
}

/// Something only `INFO flock` counts (no notification).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Count {
    /// A holder extended its lease (RENEW).
    Renewed,
    /// An ACQUIRE found the key taken (whether or not it then waited).
    Contended,
}

/// What the host must carry out, in the order given.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Effect<'a> {
    Notify(Event),
    Count(Count),
    /// Send the key's new state to replicas and the AOF (`FLOCK.APPLY`).
    Replicate(Snapshot<'a>),
    /// Send the key's deletion to replicas and the AOF (`DEL`).
    ReplicateDelete,
    /// Pass the command being run on to replicas and the AOF as it is (a replica applying
    /// its master's effect).
    ReplicateVerbatim,
    /// Take the key out of the keyspace once the operation is over (nothing is left of it:
    /// no holder, no lock-delay, no waiter).
    DeleteKey,
    /// The key needs attention at this deadline (its lease's end or its lock-delay's end);
    /// `None`: it needs none.
    Arm(Option<Deadline>),
}

/// Why the caller could not wait for the key.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BlockRefused {
    /// `flock.max-waiters` clients already wait for it.
    TooMany,
    /// The server would not block the client.
    Failed,
}

/// The server side of an operation: effects in, facts out.
pub trait Host {
    fn effect(&mut self, effect: Effect<'_>);
    /// How many clients wait for this key.
    fn waiting(&mut self) -> usize;
    /// The first waiter of this key, taken off its queue.
    fn next_waiter(&mut self) -> Option<Waiter>;
    /// Hand the key to `waiter` with `token`; false when the waiter is gone (it left between
    /// its queueing and now), and the grant must go to the next one.
    fn deliver(&mut self, waiter: &Waiter, token: u64) -> bool;
    /// Make the caller wait for this key (BLOCK); `timeout_ms` 0 waits without limit.
    fn block(&mut self, owner: &[u8], ttl_ms: u64, timeout_ms: u64) -> Result<(), BlockRefused>;
}

/// An error reply decided by the engine.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ReplyError {
    TokensExhausted,
    TooManyWaiters,
    CouldNotBlock,
}

impl ReplyError {
    pub fn message(self) -> &'static str {
        match self {
            ReplyError::TokensExhausted => "ERR token space exhausted",
            ReplyError::TooManyWaiters => {
                "ERR too many clients wait for this key (flock.max-waiters)"
            }
            ReplyError::CouldNotBlock => "ERR could not block the client",
        }
    }
}

/// The reply of an operation.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Reply<'a> {
    Int(i64),
    Null,
    Ok,
    Error(ReplyError),
    /// The caller waits: its reply comes when it is handed the key, times out or is told why
    /// not.
    Blocked,
    /// FLOCK.INFO of a key that is held, in lock-delay or waited for.
    Info {
        owner: Option<&'a [u8]>,
        token: u64,
        ttl_ms: u64,
        waiters: usize,
    },
}

/// How long a grant that started at `since` (monotonic µs) was held at `now`, in ms.
fn held_ms(since: Option<u64>, now: Now) -> u64 {
    since.map_or(0, |s| now.mono_us.saturating_sub(s) / 1000)
}

// ---- the steps every write operation is made of ----

/// Bring the key up to date at `now`: end a run-out lease (`flock.expired`), end a finished
/// lock-delay, and while the key is free hand it to its first waiter that is still there.
/// Publishes nothing. Returns whether the state changed (and so must be replicated).
#[inline]
fn settle_state(state: &mut LockState, env: &mut Env<'_>, host: &mut impl Host) -> bool {
    let now = env.now;
    let mut changed = false;
    loop {
        let had_delay = state.delay.is_some();
        if state.expire(now, env.lock_delay_ms).is_some() {
            host.effect(Effect::Notify(Event::Expired));
            changed = true;
        }
        state.end_delay(now);
        changed |= had_delay && state.delay.is_none();
        if !state.is_free(now) || host.waiting() == 0 {
            return changed;
        }
        let Some(token) = env.tokens.issue(now) else {
            return changed;
        };
        let Some(waiter) = host.next_waiter() else {
            return changed;
        };
        state.grant_to(&waiter, token, now);
        changed = true;
        if host.deliver(&waiter, token) {
            host.effect(Effect::Notify(Event::Acquired {
                ttl_ms: waiter.ttl_ms,
            }));
            return changed;
        }
        // The waiter vanished between its queueing and now: the grant goes to the next one.
        state.holder = None;
    }
}

/// Replicate the state when it `changed`; delete the key when nothing is left of it (no
/// holder, no lock-delay, no waiter), else arm it for its next deadline. Returns true when
/// the key is to be deleted.
#[inline]
fn publish(state: &LockState, env: &Env<'_>, host: &mut impl Host, changed: bool) -> bool {
    if state.is_vacant(env.now) && host.waiting() == 0 {
        if changed {
            host.effect(Effect::ReplicateDelete);
        }
        host.effect(Effect::DeleteKey);
        return true;
    }
    if changed {
        if let Some(s) = Snapshot::of(state) {
            host.effect(Effect::Replicate(s));
        }
    }
    if env.master {
        host.effect(Effect::Arm(state.next_deadline()));
    }
    false
}

/// [`settle_state`] then [`publish`], on a master. `changed`: the caller already changed the
/// state. Returns true when the key is to be deleted.
#[inline]
fn settle(state: &mut LockState, env: &mut Env<'_>, host: &mut impl Host, changed: bool) -> bool {
    if !env.master {
        return false;
    }
    let changed = settle_state(state, env, host) || changed;
    publish(state, env, host, changed)
}

// ---- the operations ----

/// `FLOCK.ACQUIRE key owner ttl [BLOCK timeout]` on the key's state (a fresh, empty one when
/// the key did not exist). `can_block`: the caller's context allows blocking (not MULTI, not
/// a script).
#[inline]
pub fn acquire(
    state: &mut LockState,
    env: &mut Env<'_>,
    host: &mut impl Host,
    args: &AcquireArgs<'_>,
    can_block: bool,
) -> Reply<'static> {
    // Settle first (expiry, hand-off to waiters), publish once with the outcome.
    let (settled, waiting) = if env.master {
        let settled = settle_state(state, env, host);
        (settled, host.waiting())
    } else {
        (false, 0)
    };
    let now = env.now;
    match state.acquire(args.owner, args.ttl_ms, now, waiting, env.tokens) {
        Acquired::Granted(token) => {
            publish(state, env, host, true);
            host.effect(Effect::Notify(Event::Acquired {
                ttl_ms: args.ttl_ms,
            }));
            Reply::Int(token as i64)
        }
        Acquired::Refreshed(token) => {
            publish(state, env, host, true);
            Reply::Int(token as i64)
        }
        Acquired::Busy => {
            host.effect(Effect::Count(Count::Contended));
            let blocked = match args.block {
                Some(timeout_ms) if can_block => {
                    Some(host.block(args.owner, args.ttl_ms, timeout_ms))
                }
                _ => None,
            };
            publish(state, env, host, settled);
            match blocked {
                None => Reply::Null,
                Some(Ok(())) => Reply::Blocked,
                Some(Err(BlockRefused::TooMany)) => Reply::Error(ReplyError::TooManyWaiters),
                Some(Err(BlockRefused::Failed)) => Reply::Error(ReplyError::CouldNotBlock),
            }
        }
        Acquired::TokensExhausted => {
            publish(state, env, host, settled);
            Reply::Error(ReplyError::TokensExhausted)
        }
    }
}

/// `FLOCK.RELEASE key owner [token]` on an existing lock key.
#[inline]
pub fn release(
    state: &mut LockState,
    env: &mut Env<'_>,
    host: &mut impl Host,
    owner: &[u8],
    token: Option<u64>,
) -> Reply<'static> {
    let since = state.holder.as_ref().map(|g| g.since_mono_us);
    if settle(state, env, host, false) || !state.release_grant(owner, token, env.now) {
        return Reply::Int(0);
    }
    host.effect(Effect::Notify(Event::Released {
        held_ms: held_ms(since, env.now),
    }));
    settle(state, env, host, true);
    Reply::Int(1)
}

/// `FLOCK.RENEW key owner ttl [token]` on an existing lock key.
#[inline]
pub fn renew(
    state: &mut LockState,
    env: &mut Env<'_>,
    host: &mut impl Host,
    owner: &[u8],
    ttl_ms: u64,
    token: Option<u64>,
) -> Reply<'static> {
    if settle(state, env, host, false) {
        return Reply::Null;
    }
    match state.renew_grant(owner, ttl_ms, token, env.now) {
        Some(token) => {
            host.effect(Effect::Count(Count::Renewed));
            publish(state, env, host, true);
            Reply::Int(token as i64)
        }
        None => Reply::Null,
    }
}

/// `FLOCK.REVOKE key [owner]` on an existing lock key.
#[inline]
pub fn revoke(
    state: &mut LockState,
    env: &mut Env<'_>,
    host: &mut impl Host,
    owner: Option<&[u8]>,
) -> Reply<'static> {
    if settle(state, env, host, false)
        || state
            .revoke_owner(owner, env.now, env.lock_delay_ms)
            .is_none()
    {
        return Reply::Int(0);
    }
    host.effect(Effect::Notify(Event::Revoked));
    settle(state, env, host, true);
    Reply::Int(1)
}

/// `FLOCK.CHECK key token` (read-only: nothing is settled; `None`: no lock key).
#[inline]
pub fn check(state: Option<&LockState>, token: u64, now: Now) -> Reply<'static> {
    Reply::Int(state.map_or(0, |s| s.check(token, now)) as i64)
}

/// `FLOCK.INFO key` (read-only; `None`: no lock key). `waiters`: clients waiting for it.
#[inline]
pub fn info(state: Option<&LockState>, waiters: usize, now: Now) -> Reply<'_> {
    let Some(state) = state else {
        return Reply::Null;
    };
    let holder = state.live_holder(now);
    if holder.is_none() && waiters == 0 && !state.delay_active(now) {
        return Reply::Null;
    }
    Reply::Info {
        owner: holder.map(|g| &*g.owner),
        token: holder.map_or(state.last_token, |g| g.token),
        ttl_ms: holder.map_or(0, |g| g.remaining_ms(now)),
        waiters,
    }
}

/// The key's deadline came (its timer fired): end the lease or the lock-delay, hand the key
/// on, delete it when nothing is left.
pub fn expire(state: &mut LockState, env: &mut Env<'_>, host: &mut impl Host) {
    settle(state, env, host, false);
}

/// A look at a waited key after something happened to it (deleted, flushed, renamed,
/// overwritten, a waiter left), or after a waiter vanished before its grant's reply went out:
/// `ghost` is that grant's token, which is released first if it still holds the key.
pub fn revisit(state: &mut LockState, env: &mut Env<'_>, host: &mut impl Host, ghost: Option<u64>) {
    if !env.master {
        return;
    }
    let mut changed = false;
    if let Some(token) = ghost {
        if state.live_holder(env.now).is_some_and(|g| g.token == token) {
            let since = state.holder.take().map(|g| g.since_mono_us);
            host.effect(Effect::Notify(Event::Released {
                held_ms: held_ms(since, env.now),
            }));
            changed = true;
        }
    }
    settle(state, env, host, changed);
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
        Found::OtherType => {
            RevisitPlan::FailWaiters("ERR the lock key now holds a value of another type")
        }
        Found::Nothing if ghost.is_some() || waiting == 0 => RevisitPlan::Skip,
        // The key migrated away (or is migrating): granting it here would make a second copy
        // of the lock. Cluster clients retry TRYAGAIN and follow the redirect.
        Found::Nothing if !serves_stably() => RevisitPlan::FailWaiters(
            "TRYAGAIN the lock key moved to another node while you waited; retry",
        ),
        _ => RevisitPlan::Revisit,
    }
}

/// A snapshot that arrived from outside (RDB, RESTORE, AOF, replication), as the key's state
/// on this server; the token it carries raises the high-water mark (G3).
pub fn load(snapshot: Snapshot<'_>, now: Now, tokens: &mut TokenIssuer) -> LockState {
    tokens.observe(snapshot.token());
    snapshot.restore(now)
}

/// `FLOCK.APPLY`: a replica (or AOF loading) takes the master's state of the key as it is,
/// and passes the effect on to its own AOF and sub-replicas.
pub fn apply(
    state: &mut LockState,
    env: &mut Env<'_>,
    host: &mut impl Host,
    snapshot: Snapshot<'_>,
) -> Reply<'static> {
    *state = load(snapshot, env.now, env.tokens);
    host.effect(Effect::ReplicateVerbatim);
    Reply::Ok
}

#[cfg(test)]
mod tests;
