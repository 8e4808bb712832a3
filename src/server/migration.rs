//! Slots moving by Valkey 9's atomic slot migration, as this node takes part: which slots it
//! imports (their locks are the source's until the import completes, so nothing here arms or
//! acts on them), and whether it exports (effects are then streamed to the target even when
//! nothing else consumes them). Set from the migration events (`registration/events.rs`).

use flock_core::migration::SlotRanges;
use flock_core::slots::key_slot;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

const WORDS: usize = 16384 / 64;

/// The slots being imported, one bit each.
static IMPORTING: [AtomicU64; WORDS] = [const { AtomicU64::new(0) }; WORDS];
/// Slots whose bit is set: lets every arming skip the bitmap while nothing is imported.
static IMPORTING_SLOTS: AtomicUsize = AtomicUsize::new(0);
/// Exports under way (the source's side).
static EXPORTS: AtomicUsize = AtomicUsize::new(0);

/// Mark `ranges` as importing (`true`) or not.
pub fn set_importing(ranges: &SlotRanges, on: bool) {
    for &(lo, hi) in ranges {
        for slot in lo..=hi.min(16383) {
            let (word, bit) = (usize::from(slot) / 64, 1u64 << (slot % 64));
            let Some(w) = IMPORTING.get(word) else {
                continue;
            };
            let before = if on {
                w.fetch_or(bit, Ordering::Relaxed)
            } else {
                w.fetch_and(!bit, Ordering::Relaxed)
            };
            match (on, before & bit != 0) {
                (true, false) => {
                    IMPORTING_SLOTS.fetch_add(1, Ordering::Relaxed);
                }
                (false, true) => {
                    IMPORTING_SLOTS.fetch_sub(1, Ordering::Relaxed);
                }
                _ => {}
            }
        }
    }
}

/// Whether `key` is in a slot being imported (one relaxed load while nothing is).
#[inline]
pub fn importing(key: &[u8]) -> bool {
    if IMPORTING_SLOTS.load(Ordering::Relaxed) == 0 {
        return false;
    }
    let slot = key_slot(key);
    IMPORTING
        .get(usize::from(slot) / 64)
        .is_some_and(|w| w.load(Ordering::Relaxed) & (1u64 << (slot % 64)) != 0)
}

/// An export started (`true`) or ended.
pub fn set_exporting(on: bool) {
    if on {
        EXPORTS.fetch_add(1, Ordering::Relaxed);
    } else {
        // An export that began before the module was loaded ends without having started.
        let _ = EXPORTS.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| n.checked_sub(1));
    }
}

/// Whether an export is under way.
pub fn exporting() -> bool {
    EXPORTS.load(Ordering::Relaxed) != 0
}
