//! `FLOCK.RELEASE`: the fast path of a one-grant key is in `lone.rs`; this is the general one.

use super::settle::{held_ms, settle, settle_first, unbind};
use super::{
    lone, with_state, Context, Effect, Effects, Env, Event, Outcome, Reply, Stored, Waiters,
};
use crate::state::LockState;

/// `FLOCK.RELEASE key owner [token]` on an existing lock key.
#[inline]
pub(super) fn release_state(
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

/// `FLOCK.RELEASE key owner [token]` on an existing lock key.
#[inline(always)]
pub fn release(
    stored: Stored<'_>,
    cx: &mut impl Context,
    w: &mut impl Waiters,
    owner: &[u8],
    token: Option<u64>,
) -> Outcome {
    let mut out = Outcome::keep(Reply::Int(0));
    release_into(stored, cx, w, owner, token, &mut out);
    out
}

/// [`release`], its outcome written into `out`, a fresh one (as [`super::acquire_into`]).
#[inline(always)]
pub fn release_into(
    stored: Stored<'_>,
    cx: &mut impl Context,
    w: &mut impl Waiters,
    owner: &[u8],
    token: Option<u64>,
    out: &mut Outcome,
) {
    if let Stored::Lone(lone) = &stored {
        let (mono_us, master) = (cx.mono_us(), cx.master());
        if lone::release_lone(lone, mono_us, master, w, out, owner, token) {
            return;
        }
    }
    let fx = std::mem::take(&mut out.effects);
    *out = release_general(stored, cx, w, fx, owner, token);
}

/// [`release`] past its fast path: out of line and cold, as `acquire_general` (in `acquire.rs`) is.
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
