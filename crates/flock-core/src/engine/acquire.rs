//! `FLOCK.ACQUIRE`: the fast path of a free key is in `lone.rs`; this is the general one.

use super::settle::{publish, settle_state};
use super::{
    lone, with_state, BlockRefused, Context, Count, Effect, Effects, Env, Event, Outcome, Reply,
    ReplyError, Stored, Waiters,
};
use crate::args::AcquireArgs;
use crate::state::{Acquired, Grant, LockState};

/// `FLOCK.ACQUIRE key owner ttl [SHARED | LIMIT n] [BOUND] [BLOCK timeout]` on the key's
/// state (a fresh, empty one when the key did not exist). `can_block`: the caller's context
/// allows blocking (not MULTI, not a script). `bind_to`: with BOUND, the caller's connection.
#[inline]
pub(super) fn acquire_state(
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

/// `FLOCK.ACQUIRE key owner ttl [SHARED | LIMIT n] [BOUND] [BLOCK timeout]`. `can_block`: the
/// caller's context allows blocking (not MULTI, not a script). `bind_to`: with BOUND, the
/// caller's connection.
#[inline(always)]
pub fn acquire(
    stored: Stored<'_>,
    cx: &mut impl Context,
    w: &mut impl Waiters,
    args: &AcquireArgs<'_>,
    can_block: bool,
    bind_to: Option<u64>,
) -> Outcome {
    let mut out = Outcome::keep(Reply::Null);
    acquire_into(stored, cx, w, args, can_block, bind_to, &mut out);
    out
}

/// [`acquire`], its outcome written into `out`, a fresh one ([`Outcome::keep`]): the
/// executor's own, so that the fast path writes its reply, effects and grant where they are
/// carried out from (an outcome is large, and a returned one was copied on the way).
#[inline(always)]
pub fn acquire_into(
    stored: Stored<'_>,
    cx: &mut impl Context,
    w: &mut impl Waiters,
    args: &AcquireArgs<'_>,
    can_block: bool,
    bind_to: Option<u64>,
    out: &mut Outcome,
) {
    let mut env = cx.env();
    if matches!(stored, Stored::Free) && lone::acquire_free(args, &mut env, w, out, bind_to) {
        return;
    }
    let fx = std::mem::take(&mut out.effects);
    *out = acquire_general(stored, &mut env, w, fx, args, can_block, bind_to);
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
