//! The steps every write operation is made of: bring the key up to date (end leases and
//! delayed slots, hand it to the waiters that fit), then replicate, arm or delete it.

use super::{Effect, Effects, Env, Event, Waiters};
use crate::clock::Now;
use crate::queue::Waiter;
use crate::snapshot::Snapshot;
use crate::state::{Binding, Grant, LockState};

/// How long `grant` was held at `now`, in ms.
pub(super) fn held_ms(grant: &Grant, now: Now) -> u64 {
    now.mono_us.saturating_sub(grant.since_mono_us) / 1000
}

/// A grant ended: its connection, if it was bound to one, no longer holds it.
pub(super) fn unbind(fx: &mut Effects, grant: &Grant) {
    if let Some(client) = grant.bound_client() {
        fx.push(Effect::Unbind {
            client,
            token: grant.token,
        });
    }
}

/// Bring the key up to date at `now`: end run-out leases (`flock.expired` each), end finished
/// delayed slots ([`end_due`]), and grant from the head of the queue while the head fits (a
/// run of readers goes together; a head that does not fit holds everyone behind it).
/// Publishes nothing. Returns whether the state changed (and so must be replicated).
#[inline]
pub(super) fn settle_state(
    state: &mut LockState,
    env: &mut Env<'_>,
    w: &mut impl Waiters,
    fx: &mut Effects,
) -> bool {
    let changed = end_due(state, env, fx);
    hand_off(state, env, w, fx, changed)
}

/// The first half of [`settle_state`]: end run-out leases (`flock.expired` each, or
/// `flock.closed` for a bound grant that lost its connection) and finished delayed slots.
/// Returns whether the state changed. Running it again at the same `now` changes nothing.
#[inline]
pub(super) fn end_due(state: &mut LockState, env: &Env<'_>, fx: &mut Effects) -> bool {
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
    changed
}

/// The second half of [`settle_state`]: grant from the head of the queue while the head
/// fits. `changed`: the state changed already. Returns whether it changed.
#[inline]
fn hand_off(
    state: &mut LockState,
    env: &mut Env<'_>,
    w: &mut impl Waiters,
    fx: &mut Effects,
    mut changed: bool,
) -> bool {
    let now = env.now;
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
        // A head whose owner holds a grant already (a value holding it arrived under the
        // key's name, and the look that ends such waits has not come yet) is not granted a
        // second one: its wait ends with nil, and the next head is asked.
        // Likewise a shared head of another limit than the key's (queued before that look,
        // see `refuse_other_limits`): it and its like are refused, never left to hold the
        // queue until the key's grants end.
        let mut holder = None;
        // A MACQUIRE request is never granted one key alone: at the head of a free key it is
        // named for the module to try on all its keys, and holds the queue until then.
        let mut multi_first = None;
        let mut other_limit = None;
        let fits = &mut |w: &Waiter| {
            let holds = state.owner_grant(&w.owner, now).is_some();
            if holds && !w.multi {
                holder = Some(w.owner.clone());
                return false;
            }
            if let Some(limit) = state.held_mode(now) {
                if !limit.is_exclusive() && !w.mode.is_exclusive() && limit != w.mode {
                    other_limit = Some(limit);
                    return false;
                }
            }
            let fits = state.fits(w.mode, now, max_holders);
            // A key its owner holds counts as free for a MACQUIRE request (it keeps that
            // token): the module looks at its other keys.
            if w.multi && (fits || holds) {
                multi_first = Some(w.id);
            }
            fits && !w.multi
        };
        let Some(waiter) = w.next_waiter_if(fits) else {
            match (holder, other_limit) {
                (Some(owner), _) if w.dismiss(&owner) => continue,
                (None, Some(limit)) if w.refuse_other_limits(limit) > 0 => continue,
                _ => {
                    if let Some(waiter) = multi_first {
                        fx.push(Effect::TryMulti { waiter });
                    }
                    return changed;
                }
            }
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

/// End the waits of the owners that hold a live grant of the key (answered nil, see
/// [`Waiters::dismiss`]): a value that arrived under a waited name (COPY, RENAME, MOVE,
/// RESTORE) may hold grants of its waiters. Their grants stand as they arrived; the owner's
/// next ACQUIRE returns its token (G4). Costs one look-up per live grant, so only a look at a
/// key something happened to runs it.
pub(super) fn dismiss_holders(state: &LockState, now: Now, w: &mut impl Waiters) {
    if w.waiting() == 0 {
        return;
    }
    for g in state.live(now) {
        w.dismiss(&g.owner);
    }
}

/// A key has one limit (SPEC "Lock kinds"): when a value that arrived under the key's name
/// gives it one (its live shared grants or delayed slots) other than its waiting shared
/// requests', those requests leave the queue answered the limit mismatch error for the key's
/// limit, as they would be if they asked now ([`Waiters::refuse_other_limits`]). Exclusive
/// waiters, and those of the key's limit, keep their places. Requests of the key's limit
/// queue behind those of another (a request naming another limit than the key's is refused,
/// never queued), so the first shared waiter's mode tells whether any must go, at no cost
/// per waiter; a shared head of another limit met at a hand-off goes too (`hand_off`).
pub(super) fn refuse_other_limits(state: &LockState, now: Now, w: &mut impl Waiters) {
    let Some(limit) = state.held_mode(now).filter(|m| !m.is_exclusive()) else {
        return;
    };
    if w.waiting() == 0 || w.waiting_mode().is_none_or(|m| m == limit) {
        return;
    }
    w.refuse_other_limits(limit);
}

/// Replicate the state when it `changed`; delete the key when nothing is left of it (no
/// grant, no delayed slot, no waiter), else arm it for its next deadline. Returns true when
/// the key is to be deleted.
#[inline]
pub(super) fn publish(
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
pub(super) fn publish_as(
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
pub(super) fn settle(
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
/// arms the key again through [`expire`](super::expire), so only the deletion of a key nothing is left of
/// needs checking here. Returns true when the key is to be deleted.
#[inline]
pub(super) fn settle_first(
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
