//! The one path by which a lock key's state changes on a master turn into effects: grants to
//! waiters, keyspace notifications, replication, deletion of keys nobody needs, and timers.

use crate::core::Now;
use crate::ffi::{self, Ctx, Key, RStr};
use crate::lock_type::LockRecord;
use crate::{config, expiry, replication, server, stats, waiters};

/// Bring `rec` (stored under `key`) up to date at `now` (end a run-out lease or lock-delay,
/// hand a free key to its first waiter), then publish the result. `changed` says that the
/// caller already changed the state (grant, release, revoke, renew) and it must be replicated.
/// Returns true when the key was deleted: `rec` is then gone.
pub fn settle(
    ctx: Ctx,
    key_name: RStr,
    key: &Key,
    rec: &mut LockRecord,
    now: Now,
    changed: bool,
) -> bool {
    if !server::is_master() {
        return false;
    }
    let changed = settle_state(ctx, key_name, rec, now).0 || changed;
    publish(ctx, key_name, key, rec, now, changed)
}

/// The first half of [`settle`]: update the state, notify, deliver to a waiter; publish
/// nothing. Returns whether the state changed, and how many clients still wait for the key.
pub fn settle_state(ctx: Ctx, key_name: RStr, rec: &mut LockRecord, now: Now) -> (bool, usize) {
    let mut changed = false;
    let mut waiting;
    let lock_delay = config::lock_delay_ms();
    loop {
        let had_delay = rec.state.delay.is_some();
        // Only a record that clients waited on consults the queues (see `watched`).
        let (s, left) = if rec.watched.is_none() {
            let s = rec
                .state
                .settle(now, lock_delay, None, &mut server::tokens());
            (s, 0)
        } else {
            waiters::with_queue(ctx, key_name, |mut q| {
                let s = rec
                    .state
                    .settle(now, lock_delay, q.as_deref_mut(), &mut server::tokens());
                (s, q.map_or(0, |q| q.len()))
            })
        };
        waiting = left;
        if s.expired.is_some() {
            stats::EXPIRATIONS.incr();
            ffi::notify(ctx, "flock.expired\0", key_name);
        }
        changed |= s.expired.is_some() || (had_delay && rec.state.delay.is_none());
        let Some((waiter, token)) = s.handed_to else {
            break;
        };
        changed = true;
        if waiters::deliver(waiter.id, token) {
            stats::GRANTS.incr();
            ffi::notify(ctx, "flock.acquired\0", key_name);
            break;
        }
        // The waiter vanished between its queueing and now: the grant goes to the next one.
        rec.state.holder = None;
    }
    (changed, waiting)
}

/// Replicate the state of `rec` when `changed`, delete the key when nothing is left (no
/// holder, no lock-delay, no waiter), else arm its timer. Returns true when deleted.
pub fn publish(
    ctx: Ctx,
    key_name: RStr,
    key: &Key,
    rec: &mut LockRecord,
    now: Now,
    changed: bool,
) -> bool {
    if rec.state.is_vacant(now) && (rec.watched.is_none() || waiters::count(ctx, key_name) == 0) {
        if changed {
            replication::delete(ctx, key_name);
        }
        key.delete();
        return true;
    }
    if changed {
        if let Some(g) = rec.state.holder.as_ref() {
            replication::grant(ctx, key_name, g);
        } else if let Some(d) = rec.state.delay {
            replication::delay(ctx, key_name, rec.state.last_token, d.wall_ms);
        }
    }
    expiry::arm(ctx, key_name, rec);
    false
}
