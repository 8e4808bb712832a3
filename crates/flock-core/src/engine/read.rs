//! The read-only operations: FLOCK.CHECK, FLOCK.INFO, FLOCK.HOLDERS (nothing is settled:
//! they look at the key as it is at `now`).

use super::{Info, Reply};
use crate::clock::Now;
use crate::state::{LockState, Mode};

/// `FLOCK.CHECK key token` (read-only: nothing is settled; `None`: no lock key).
#[inline]
pub fn check(state: Option<&LockState>, token: u64, now: Now) -> Reply<'static> {
    Reply::Int(state.map_or(0, |s| s.check(token, now)) as i64)
}

/// `FLOCK.INFO key` (read-only; `None`: no lock key). `waiters`: requests waiting for it,
/// `waiting_mode`: the mode of the shared ones among them.
#[inline]
pub fn info(
    state: Option<&LockState>,
    waiters: usize,
    waiting_mode: Option<Mode>,
    now: Now,
) -> Reply<'_> {
    let Some(state) = state else {
        if waiters == 0 {
            return Reply::Null;
        }
        return Reply::Info(Info {
            owner: None,
            token: 0,
            ttl_ms: 0,
            waiters,
            mode: None,
            holders: 0,
            limit: waiting_mode.map_or(0, Mode::limit),
            delayed: 0,
        });
    };
    let holders = state.live_count(now);
    let delayed = state.active_delays(now);
    if holders == 0 && waiters == 0 && delayed == 0 {
        return Reply::Null;
    }
    Reply::Info(Info {
        owner: state.exclusive_holder(now).map(|g| &*g.owner),
        token: state
            .live(now)
            .map(|g| g.token)
            .max()
            .unwrap_or(state.last_token),
        ttl_ms: state
            .live(now)
            .map(|g| g.remaining_ms(now))
            .max()
            .unwrap_or(0),
        waiters,
        mode: (holders > 0).then_some(state.mode),
        holders,
        limit: state
            .limit_of_key(now, || waiting_mode)
            .map_or(0, Mode::limit),
        delayed,
    })
}

/// `FLOCK.HOLDERS key` (read-only; `None`: no lock key).
pub fn holders(state: Option<&LockState>, now: Now) -> Reply<'_> {
    Reply::Holders(state.map_or_else(Vec::new, |s| {
        s.grants()
            .by_token()
            .into_iter()
            .filter(|g| g.is_live(now))
            .map(|g| (&*g.owner, g.token, g.remaining_ms(now)))
            .collect()
    }))
}
