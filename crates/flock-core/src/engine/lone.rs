//! The two operations most locks see, decided without building a [`LockState`]: ACQUIRE of a
//! key that does not exist, and RELEASE of a key whose whole state is one grant (the store's
//! compact copy of it, read in place).
//!
//! Why: these two are the hot path of every lock, and on a key this simple the general
//! operations spend most of their time building, settling and storing back a state that
//! holds one grant. The rules are not new ones: each function answers only the cases where
//! [`super::acquire()`] and [`super::release()`] on the equivalent state would do exactly this
//! (same reply, same effects in the same order, the same state after), which the tests check
//! against them, and leaves every other case to them (`None`).

use super::{Effect, Env, Event, KeyFate, Outcome, Reply, Waiters};
use crate::args::AcquireArgs;
use crate::clock::Deadline;
use crate::state::{Grant, LockState, Mode};

/// A key's one grant, as the store keeps it when that grant is all the key is (see
/// [`LockState::lone_grant`]): the fields of a [`Grant`], borrowed from the store's copy.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LoneGrant<'a> {
    /// Exclusive or shared (a permit key is never lone).
    pub mode: Mode,
    pub owner: &'a [u8],
    pub token: u64,
    pub deadline: Deadline,
    pub since_mono_us: u64,
    /// [`Grant::tie_word`]: 0 for a grant made without BOUND.
    pub tie_word: u64,
}

impl<'a> LoneGrant<'a> {
    /// `grant`, the one grant of a key of `mode` (as [`LockState::lone_grant`] gives them).
    pub fn of(mode: Mode, grant: &'a Grant) -> LoneGrant<'a> {
        LoneGrant {
            mode,
            owner: &grant.owner,
            token: grant.token,
            deadline: grant.deadline,
            since_mono_us: grant.since_mono_us,
            tie_word: grant.tie_word(),
        }
    }

    /// The grant itself, and the state of a key that holds it alone.
    pub fn state(&self) -> LockState {
        let grant = Grant::from_parts(
            self.owner,
            self.token,
            self.deadline,
            self.since_mono_us,
            self.tie_word,
        );
        LockState::with_grant(self.mode, grant)
    }
}

/// `FLOCK.ACQUIRE` on a key that does not exist: [`super::acquire()`] on an empty state, for an
/// exclusive or shared request (BOUND or not) on a master, when nobody waits for the key's
/// name and a token is left. Writes the reply, the effects, and the key's one grant and its
/// mode, which the store keeps as the new key ([`KeyFate::StoreLone`]; its replication is
/// that grant), into `out` (a fresh one: written in place, as the outcome is large).
/// False: another case (a permit key), for the general way, and nothing was done.
#[inline(always)]
pub(super) fn acquire_free(
    args: &AcquireArgs<'_>,
    env: &mut Env<'_>,
    w: &mut impl Waiters,
    out: &mut Outcome,
    bind_to: Option<u64>,
) -> bool {
    let now = env.now;
    let mode = args.mode;
    if !env.master || matches!(mode, Mode::Permits(_)) || w.waiting() > 0 {
        return false;
    }
    // No token left: nothing was issued, and `acquire` gives the error.
    let Some(token) = env.tokens.issue(now) else {
        return false;
    };
    // The grant is made in its place in the outcome (a grant made aside was copied there).
    out.fate = KeyFate::StoreLone {
        grant: Grant::new(args.owner, token, args.ttl_ms, now),
        mode,
    };
    let KeyFate::StoreLone { grant, .. } = &mut out.fate else {
        return false; // (not reached: just written)
    };
    grant.bind(bind_to);
    let deadline = grant.deadline;
    // As `acquire` publishes a grant: the new state, its timer, then the event (and the
    // binding). Written in one go (`out` is the operation's, still empty).
    let acquired = Effect::Notify(Event::Acquired {
        ttl_ms: args.ttl_ms,
    });
    let (bind, len) = match bind_to {
        Some(client) => (Effect::Bind { client, token }, 4),
        None => (Effect::DeleteKey, 3), // (not read: past `len`)
    };
    out.effects.set_inline(
        [
            Effect::Replicate,
            Effect::Arm(Some(deadline)),
            acquired,
            bind,
        ],
        len,
    );
    out.reply = Reply::Int(token as i64);
    true
}

/// `FLOCK.RELEASE key owner [token]` on a key held by `lone` alone: [`super::release()`] on its
/// state,
/// on a master, for a live grant made without BOUND, when nobody waits for the key. The
/// holder's release ends the grant and the key (the key is deleted, as the effects say); anyone
/// else's changes nothing and gets 0. False: another case (a lease that ran out must expire
/// first, a bound grant must be unbound), for [`super::release()`], and nothing was done.
///
/// Only the monotonic clock is asked for (`mono_us`, as in `Now::mono_us`): whether the lease
/// runs and how long it was held are measured on it (G9), and nothing here needs the wall
/// clock, which saves the server a clock read on the hottest path there is.
/// The reply and the effects are written into `out` (a fresh one, its fate `Keep`).
#[inline(always)]
pub(super) fn release_lone(
    lone: &LoneGrant<'_>,
    mono_us: u64,
    master: bool,
    w: &mut impl Waiters,
    out: &mut Outcome,
    owner: &[u8],
    token: Option<u64>,
) -> bool {
    let ran_out = mono_us >= lone.deadline.mono_us; // as `Deadline::passed`
    if !master || lone.tie_word != 0 || ran_out || w.waiting() > 0 {
        return false;
    }
    if lone.owner != owner || token.is_some_and(|t| t != lone.token) {
        out.reply = Reply::Int(0);
        return true;
    }
    let released = Effect::Notify(Event::Released {
        held_ms: mono_us.saturating_sub(lone.since_mono_us) / 1000,
        token: lone.token,
    });
    // Nothing is left of the key: its deletion travels, and the key goes. (Written in one
    // go: `out` is the operation's, still empty.)
    out.effects.set_inline(
        [
            released,
            Effect::ReplicateDelete,
            Effect::DeleteKey,
            Effect::DeleteKey,
        ],
        3,
    );
    out.reply = Reply::Int(1);
    true
}

#[cfg(test)]
mod tests;
