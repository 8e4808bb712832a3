//! Token anchors: what a narrow block's 24-bit token distance is measured from while tokens
//! run ahead of the wall clock.
//!
//! A narrow block keeps its token as a distance from a guess that decoding can repeat: the
//! grant's start time on the wall clock, which is where `token = max(high water + 1, wall
//! clock)` puts a grant made here. After a start, a load or a promotion the mark is raised a
//! margin (a day by default) above the clock (G3), and until the clock catches up tokens count
//! up from the mark one per grant: every grant of that day is a day from the clock guess, too
//! far for 24 bits, and took a wide block (16 bytes more per lock). A replica sees the same
//! for the grants its master replicates.
//!
//! An anchor says: a grant that started at or after `from` (monotonic microseconds) is
//! guessed at `max(clock guess, base)`. A grant whose token does not pack because it is ahead
//! of its guess sets one, from the next microsecond on, with its token as the base: the grants
//! after it are then a few grants from the base. Nothing already stored changes meaning: an
//! anchor only covers start times after the moment it was set, and every stored grant started
//! at or before that moment (a grant starts when it is made or arrives here, never later).
//! The guess of a start time therefore never changes once a block uses it, which is what
//! makes the packing exact.
//!
//! Anchors are never dropped (a block may keep a grant for days); at most [`MAX_ANCHORS`] are
//! set, after which grants that do not pack take wide blocks as before.

use super::super::server;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

/// A day of counting from the mark takes one anchor per 2^23 grants (a busy server's hour), or
/// one per raise: 1024 is years of both. 16 bytes each.
const MAX_ANCHORS: usize = 1024;

/// (from, base), `from` strictly increasing.
static ANCHORS: Mutex<Vec<(u64, u64)>> = Mutex::new(Vec::new());
/// The newest anchor, for the common case of a grant started after it: `from` (`u64::MAX`:
/// none yet) and `base`. Set and read on Redis's main thread (blocks are packed and unpacked
/// only there); atomics only so that statics allow it.
static LAST_FROM: AtomicU64 = AtomicU64::new(u64::MAX);
static LAST_BASE: AtomicU64 = AtomicU64::new(0);

/// The base a grant that started at `since_mono_us` is guessed from (0: none).
#[inline]
pub(super) fn base_for(since_mono_us: u64) -> u64 {
    let from = LAST_FROM.load(Ordering::Acquire);
    if from == u64::MAX {
        return 0;
    }
    if since_mono_us >= from {
        return LAST_BASE.load(Ordering::Relaxed);
    }
    older_base(since_mono_us)
}

#[cold]
fn older_base(since_mono_us: u64) -> u64 {
    let anchors = ANCHORS.lock().unwrap_or_else(|p| p.into_inner());
    // The last anchor with from <= since.
    let i = anchors.partition_point(|&(from, _)| from <= since_mono_us);
    match i.checked_sub(1).and_then(|i| anchors.get(i)) {
        Some(&(_, base)) => base,
        None => 0,
    }
}

/// A grant's `token` did not pack: it is ahead of its guess by more than a narrow block can
/// say. Anchor the grants made from the next microsecond on at it.
#[cold]
pub(super) fn ahead(token: u64) {
    let mut anchors = ANCHORS.lock().unwrap_or_else(|p| p.into_inner());
    if anchors.len() >= MAX_ANCHORS {
        return;
    }
    let now = server::now().mono_us;
    let from = match anchors.last() {
        // Not behind the newest base (an older grant re-stored), nor twice in a microsecond.
        Some(&(last_from, last_base)) if token <= last_base || now < last_from => return,
        Some(&(last_from, _)) => now.saturating_add(1).max(last_from.saturating_add(1)),
        None => now.saturating_add(1),
    };
    anchors.push((from, token));
    LAST_BASE.store(token, Ordering::Relaxed);
    LAST_FROM.store(from, Ordering::Release);
}
