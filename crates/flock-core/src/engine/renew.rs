//! `FLOCK.RENEW`: a holder extends its lease.

use super::settle::{publish, settle_first};
use super::{with_state, Context, Count, Effect, Effects, Env, Outcome, Reply, Stored, Waiters};
use crate::state::LockState;

/// `FLOCK.RENEW key owner ttl [token]` on an existing lock key.
#[inline]
pub(super) fn renew_state(
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
