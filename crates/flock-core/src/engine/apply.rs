//! A state that arrives from outside: loaded (RDB, RESTORE, AOF) or applied from the master.

use super::{with_state, Context, Effect, Effects, Env, Outcome, Reply, Stored};
use crate::clock::{Deadline, Now};
use crate::snapshot::LockImage;
use crate::state::LockState;
use crate::tokens::TokenIssuer;

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
pub(super) fn apply_state(
    state: &mut LockState,
    env: &mut Env<'_>,
    fx: &mut Effects,
    image: LockImage,
) -> Reply<'static> {
    *state = load(image, env.now, env.tokens);
    fx.push(Effect::ReplicateVerbatim);
    Reply::Ok
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
