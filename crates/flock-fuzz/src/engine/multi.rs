//! FLOCK.MACQUIRE (without BLOCK) in the state machine: the model's decision, from the
//! contract (SPEC.md, MACQUIRE), to compare with `flock_core::multi::at_call` on the real keys.

use super::model::Model;
use flock_core::multi::{Decision, Refusal};
use flock_core::Now;

/// MACQUIRE of `keys` (in that order) by `owner` at `now`, by the model: refused on the first
/// key the owner holds in another mode or waits for; else granted when every key is the
/// owner's own (a live exclusive grant) or free (no live grant, no running delayed slot, none
/// that a grant which stopped being live leaves when the key is settled, nobody waiting).
pub(super) fn decide(
    model: &Model,
    keys: &[usize],
    owner: &[u8],
    now: Now,
    lock_delay_ms: u64,
) -> Decision {
    let mut busy = false;
    for (i, &k) in keys.iter().enumerate() {
        let key = &model.keys[k];
        let holds = key.live(now).any(|g| g.owner == owner);
        let waits = key.queue.iter().any(|w| w.owner == owner);
        if holds && key.mode != flock_core::state::Mode::Exclusive {
            return Decision::Refused(i, Refusal::Holds(key.mode));
        }
        if waits {
            return Decision::Refused(i, Refusal::Waits);
        }
        if holds {
            continue;
        }
        // The slot each grant that stopped being live leaves (as the model's settle does).
        let slots_run_out = lock_delay_ms == 0
            || key.grants.iter().all(|g| {
                let closed = g.lost && now.mono_us < g.mono_us;
                let from = if closed { now.mono_us } else { g.mono_us };
                from + lock_delay_ms * 1000 <= now.mono_us
            });
        let free = key.live_count(now) == 0
            && key.active_delays(now) == 0
            && slots_run_out
            && key.queue.is_empty();
        busy |= !free;
    }
    if busy {
        Decision::Busy
    } else {
        Decision::Grant
    }
}
