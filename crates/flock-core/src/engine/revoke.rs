//! `FLOCK.REVOKE`: end grants whatever their owners think.

use super::settle::{settle, settle_first, unbind};
use super::{with_state, Context, Effect, Effects, Env, Event, Outcome, Reply, Stored, Waiters};
use crate::state::LockState;

/// `FLOCK.REVOKE key [owner]` on an existing lock key: the number of grants ended.
#[inline]
pub(super) fn revoke_state(
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
