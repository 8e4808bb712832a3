//! A second look at a waited key after something happened to it outside the lock commands
//! (deleted, flushed, renamed, overwritten, a waiter left or vanished).

use super::settle::{dismiss_holders, end_due, held_ms, refuse_other_limits, settle, unbind};
use super::{with_state, Context, Effect, Effects, Env, Event, Outcome, Reply, Stored, Waiters};
use crate::errors::Fixed;
use crate::state::LockState;

/// A look at a waited key after something happened to it (deleted, flushed, renamed,
/// overwritten, a waiter left), or after a waiter vanished before its grant's reply went out:
/// `ghost` is that grant's token, which is released first if it is still a live grant.
pub(super) fn revisit_state(
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
    // What ran out ends first: a grant that arrived run out holds nothing and has no say.
    changed |= end_due(state, env, fx);
    // After the ghost's release (its owner may wait again), before any hand-off.
    dismiss_holders(state, env.now, w);
    refuse_other_limits(state, env.now, w);
    settle(state, env, w, fx, changed);
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
