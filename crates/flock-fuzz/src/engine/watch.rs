//! FLOCK.WATCH's rule against the model: after every step, each grant of the touched key that
//! was live before it is told what the model says happened to it (the model's own ending
//! event for it, else nothing while the model keeps it, else `lost`), and token 0 is told the
//! model's oldest live grant.

use super::model::{MKey, Model};
use flock_core::engine::Event;
use flock_core::watch::{self, WatchEvent};
use flock_core::{LockState, Now};

/// The live grants of `state` before a step: (token, owner).
pub(super) fn live_before(state: Option<&LockState>, now: Now) -> Vec<(u64, Vec<u8>)> {
    state.map_or_else(Vec::new, |s| {
        s.live(now).map(|g| (g.token, g.owner.to_vec())).collect()
    })
}

/// What the model says a watcher of `token` (live before the step) is told after it.
fn expected(key: &MKey, model_events: &[Event], token: u64) -> Option<WatchEvent> {
    let how = model_events
        .iter()
        .filter_map(|e| watch::ended_by(*e))
        .find(|(t, _)| *t == token)
        .map(|(_, how)| how);
    if how.is_some() {
        return how;
    }
    if key.grants.iter().any(|g| g.token == token) {
        return None;
    }
    Some(WatchEvent::Lost)
}

/// Check the rule on the touched key's state after a step (`events`: the engine's).
pub(super) fn check(
    before: &[(u64, Vec<u8>)],
    state: Option<&LockState>,
    events: &[Event],
    model: &Model,
    key: usize,
    now: Now,
    step: usize,
) {
    let Some(mk) = model.keys.get(key) else {
        return;
    };
    let ended: Vec<(u64, WatchEvent)> = events.iter().filter_map(|e| watch::ended_by(*e)).collect();
    for (token, owner) in before {
        let got = watch::after_change(state, *token, owner, &ended, now, false).map(|f| f.event);
        assert_eq!(
            got,
            expected(mk, &model.events, *token),
            "step {step}: a watcher of token {token} on key {key}"
        );
    }
    let held = watch::after_change(state, 0, b"", &ended, now, false).map(|f| f.token);
    let oldest = mk.live(now).map(|g| g.token).min();
    assert_eq!(held, oldest, "step {step}: a token-0 watcher of key {key}");
}
