//! What happens to a key without a command on it: its deadline came, or a connection that
//! held bound grants of it closed, or it arrived from outside with bound grants.

use super::settle::settle;
use super::{with_state, Context, Effects, Env, Outcome, Reply, Stored, Waiters};
use crate::state::LockState;

/// The key's deadline came (its timer fired): end leases and delayed slots, hand the key on,
/// delete it when nothing is left.
pub(super) fn expire_state(
    state: &mut LockState,
    env: &mut Env<'_>,
    w: &mut impl Waiters,
    fx: &mut Effects,
) {
    settle(state, env, w, fx, false);
}

/// Connection `client` closed (it left every wait queue already): its bound grants of this
/// key end now, as on expiry (`flock.closed`, lock-delay, the next waiters are granted).
pub(super) fn close_state(
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
