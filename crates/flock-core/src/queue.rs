//! The waiters of one key (FLOCK.ACQUIRE ... BLOCK), first come first served.

use crate::state::Mode;
use std::collections::{HashMap, VecDeque};
use std::hash::{BuildHasher, RandomState};

/// A BLOCK timeout beyond this (ten years) means no limit: a huge period would wrap in the
/// server's timer arithmetic and fire at once.
pub const MAX_BLOCK_TIMEOUT_MS: u64 = 315_360_000_000;

/// A request waiting for a key (FLOCK.ACQUIRE ... BLOCK).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Waiter {
    pub id: u64,
    pub owner: Box<[u8]>,
    pub ttl_ms: u64,
    /// The kind of grant it waits for.
    pub mode: Mode,
    /// BOUND: the connection its grant is to live with.
    pub bind_to: Option<u64>,
    /// A FLOCK.MACQUIRE request, which waits in the queue of each of its keys at once: never
    /// granted one key alone (see [`crate::multi`]).
    pub multi: bool,
}

/// The waiters of one key, first come first served, all kinds in one queue.
///
/// Push and pop are O(1). A waiter that leaves early (timeout, disconnect) is only marked; the
/// queue skips it when it reaches the front, and compacts itself when the marked ones
/// outnumber the live ones, so memory stays proportional to the live waiters. The queue also
/// knows the mode of its shared waiters (they all have the key's limit): what a new shared
/// request is checked against when no grant gives the key a limit.
#[derive(Clone, Debug, Default)]
pub struct WaitQueue {
    entries: VecDeque<Waiter>,
    /// Live waiter ids: whether each waits for a shared grant or a permit, and its owner's
    /// hash (see `owner_hashes`).
    live: HashMap<u64, (bool, u64)>,
    shared_live: usize,
    shared_mode: Option<Mode>,
    /// How many live waiters have each owner hash: a new request's owner is looked for in the
    /// queue (one wait per owner) only when its hash is there, so a queue of 10,000 costs a
    /// newcomer O(1), not a scan. The hash is keyed per queue (clients cannot aim at it); a
    /// hit is checked against the entries.
    owner_hashes: HashMap<u64, u32>,
    hasher: RandomState,
}

impl WaitQueue {
    /// The live waiters, first in line first (FLOCK.WAITERS).
    pub fn iter_live(&self) -> impl Iterator<Item = &Waiter> + '_ {
        self.entries
            .iter()
            .filter(|w| self.live.contains_key(&w.id))
    }

    pub fn len(&self) -> usize {
        self.live.len()
    }

    pub fn is_empty(&self) -> bool {
        self.live.is_empty()
    }

    /// The mode of the shared requests waiting, if any wait.
    pub fn shared_mode(&self) -> Option<Mode> {
        self.shared_mode
    }

    /// Whether `owner` waits in this queue.
    pub fn has_owner(&self, owner: &[u8]) -> bool {
        self.position_of_owner(owner).is_some()
    }

    /// Where `owner`'s live request is in `entries` (a scan only when its hash is present).
    fn position_of_owner(&self, owner: &[u8]) -> Option<usize> {
        if !self.owner_hashes.contains_key(&self.hasher.hash_one(owner)) {
            return None;
        }
        self.entries
            .iter()
            .position(|w| *w.owner == *owner && self.live.contains_key(&w.id))
    }

    /// Queue `waiter` at the end. An owner waits at most once per key: when the same owner
    /// already waits, the new request takes the earlier one's place in the queue and the
    /// earlier one is returned (its client gets nil), so a retried wait is safe and keeps its
    /// turn.
    pub fn push(&mut self, waiter: Waiter) -> Option<Waiter> {
        if self.live.contains_key(&waiter.id) {
            return None;
        }
        let earlier = self.position_of_owner(&waiter.owner);
        let shared = !waiter.mode.is_exclusive();
        let id = waiter.id;
        let replaced = match earlier.and_then(|i| self.entries.get_mut(i)) {
            Some(slot) => Some(std::mem::replace(slot, waiter)),
            None => {
                self.entries.push_back(waiter);
                None
            }
        };
        if let Some(r) = &replaced {
            self.forget(r.id);
        }
        if shared {
            self.shared_live += 1;
        }
        let owner_hash = match earlier.and_then(|i| self.entries.get(i)) {
            Some(w) => self.hasher.hash_one(&*w.owner),
            None => self
                .entries
                .back()
                .map_or(0, |w| self.hasher.hash_one(&*w.owner)),
        };
        self.live.insert(id, (shared, owner_hash));
        *self.owner_hashes.entry(owner_hash).or_default() += 1;
        self.refresh_shared_mode();
        replaced
    }

    /// The mode of the shared waiters, after one joined or left (they all share the key's
    /// limit; a retried request may name a new one only when it is the only shared waiter).
    fn refresh_shared_mode(&mut self) {
        self.shared_mode = if self.shared_live == 0 {
            None
        } else {
            let live = &self.live;
            self.entries
                .iter()
                .find(|w| !w.mode.is_exclusive() && live.contains_key(&w.id))
                .map(|w| w.mode)
        };
    }

    /// Whether waiter `id` is the first live one (its leaving may let those behind it in).
    pub fn is_front(&mut self, id: u64) -> bool {
        self.front().is_some_and(|w| w.id == id)
    }

    /// Take `id` off the live set; false when it was not there.
    fn forget(&mut self, id: u64) -> bool {
        let Some((shared, h)) = self.live.remove(&id) else {
            return false;
        };
        if let Some(n) = self.owner_hashes.get_mut(&h) {
            *n -= 1;
            if *n == 0 {
                self.owner_hashes.remove(&h);
            }
        }
        if shared {
            self.shared_live -= 1;
            if self.shared_live == 0 {
                self.shared_mode = None;
            }
        }
        true
    }

    /// Remove waiter `id`; false when it was not waiting.
    pub fn cancel(&mut self, id: u64) -> bool {
        if !self.forget(id) {
            return false;
        }
        if self.entries.len() > 2 * self.live.len() + 16 {
            let live = &self.live;
            self.entries.retain(|w| live.contains_key(&w.id));
        }
        true
    }

    /// The first live waiter, left in the queue.
    pub fn front(&mut self) -> Option<&Waiter> {
        while let Some(w) = self.entries.front() {
            if self.live.contains_key(&w.id) {
                break;
            }
            self.entries.pop_front();
        }
        self.entries.front()
    }

    /// The first live waiter, taken off the queue.
    pub fn pop(&mut self) -> Option<Waiter> {
        while let Some(w) = self.entries.pop_front() {
            if self.forget(w.id) {
                return Some(w);
            }
        }
        None
    }

    /// The first live waiter, taken off the queue only when `fits` says it may be granted
    /// now (a head that does not fit holds everyone behind it).
    pub fn pop_if(&mut self, fits: impl FnOnce(&Waiter) -> bool) -> Option<Waiter> {
        if fits(self.front()?) {
            self.pop()
        } else {
            None
        }
    }

    /// Take every live waiter off the queue, in order.
    pub fn drain(&mut self) -> Vec<Waiter> {
        let mut out = Vec::with_capacity(self.live.len());
        while let Some(w) = self.pop() {
            out.push(w);
        }
        self.entries.clear();
        out
    }
}

/// Whether a BLOCK request of `owner` may join `queue` (`None`: nobody waits for the key)
/// under `flock.max-waiters` = `max_waiters`. A retried wait of an owner already in the
/// queue takes its earlier request's place, so it is admitted even when the queue is full.
pub fn admits(queue: Option<&WaitQueue>, owner: &[u8], max_waiters: usize) -> bool {
    let waiting = queue.map_or(0, WaitQueue::len);
    waiting < max_waiters || queue.is_some_and(|q| q.has_owner(owner))
}

/// The timeout a waiter is given for a BLOCK of `timeout_ms` (0: waits without limit).
/// A timeout beyond [`MAX_BLOCK_TIMEOUT_MS`] is no limit: a huge period would wrap in the
/// server's timer arithmetic and fire at once.
pub fn block_timeout_ms(timeout_ms: u64) -> u64 {
    if timeout_ms > MAX_BLOCK_TIMEOUT_MS {
        0
    } else {
        timeout_ms
    }
}

impl WaitQueue {
    /// Waiter `id` leaves early (timeout, disconnect, CLIENT UNBLOCK). Returns whether the
    /// key must be looked at again: when the leaver was the head and others wait behind it,
    /// they may fit now (a reader behind a writer that timed out), and nothing else would
    /// grant them until the key next changes.
    pub fn leave(&mut self, id: u64) -> bool {
        let was_front = self.is_front(id);
        self.cancel(id);
        was_front && !self.is_empty()
    }

    /// Every live shared request whose limit is not `limit` leaves the queue, returned in
    /// order to be answered (a value that arrived under the key's name gave it that limit).
    /// O(n): only then is it asked for.
    pub fn take_other_limits(&mut self, limit: Mode) -> Vec<Waiter> {
        let live = &self.live;
        let out: Vec<Waiter> = self
            .entries
            .iter()
            .filter(|w| !w.mode.is_exclusive() && w.mode != limit && live.contains_key(&w.id))
            .cloned()
            .collect();
        for w in &out {
            self.cancel(w.id);
        }
        self.refresh_shared_mode();
        out
    }

    /// `owner`'s request leaves the queue, returned to be answered (its owner came to hold
    /// the key another way: an owner never both holds and waits for one key). O(1) when
    /// `owner` does not wait. A FLOCK.MACQUIRE request stays: it waits for its other keys too,
    /// and a key its owner holds counts as free for it (it keeps that grant's token).
    pub fn take_owner(&mut self, owner: &[u8]) -> Option<Waiter> {
        let w = self.entries.get(self.position_of_owner(owner)?)?;
        if w.multi {
            return None;
        }
        let w = w.clone();
        self.cancel(w.id);
        Some(w)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn waiter(id: u64, owner: &str, ttl_ms: u64) -> Waiter {
        Waiter {
            id,
            owner: owner.as_bytes().into(),
            ttl_ms,
            mode: Mode::Exclusive,
            bind_to: None,
            multi: false,
        }
    }

    #[test]
    fn queue_is_first_come_first_served_and_skips_cancelled() {
        let mut q = WaitQueue::default();
        for id in 1..=5 {
            q.push(waiter(id, &format!("w{id}"), 10));
        }
        assert_eq!(q.len(), 5);
        assert!(q.cancel(2));
        assert!(!q.cancel(2), "cancelled twice");
        assert!(!q.cancel(99), "never queued");
        assert_eq!(q.len(), 4);
        let order: Vec<u64> = std::iter::from_fn(|| q.pop()).map(|w| w.id).collect();
        assert_eq!(order, vec![1, 3, 4, 5]);
        assert!(q.is_empty());
        assert!(!q.cancel(1), "popped waiters cannot be cancelled");
    }

    #[test]
    fn queue_compacts_cancelled_entries() {
        let mut q = WaitQueue::default();
        for id in 0..10_000 {
            q.push(waiter(id, &format!("w{id}"), 10));
        }
        for id in 0..9_990 {
            assert!(q.cancel(id));
        }
        assert_eq!(q.len(), 10);
        assert!(
            q.entries.len() <= 2 * 10 + 16,
            "entries {}",
            q.entries.len()
        );
        assert_eq!(q.pop().map(|w| w.id), Some(9_990));
    }

    #[test]
    fn an_owner_waits_once_and_the_queue_knows_its_shared_mode() {
        let mut q = WaitQueue::default();
        let shared = |id, owner: &str| Waiter {
            mode: Mode::Permits(3),
            ..waiter(id, owner, 10)
        };
        assert_eq!(q.push(waiter(1, "a", 10)), None);
        assert_eq!(q.shared_mode(), None);
        assert_eq!(q.push(shared(2, "b")), None);
        assert_eq!(q.push(shared(3, "c")), None);
        assert_eq!(q.shared_mode(), Some(Mode::Permits(3)));
        // "b" waits again: its earlier request leaves (and is handed back), the new one takes
        // its place, ahead of "c".
        assert_eq!(q.push(shared(4, "b")).map(|w| w.id), Some(2));
        assert_eq!(q.len(), 3);
        assert!(q.is_front(1));
        assert_eq!(q.shared_mode(), Some(Mode::Permits(3)));
        // A head that does not fit holds everyone behind it.
        assert_eq!(q.pop_if(|w| !w.mode.is_exclusive()), None);
        assert_eq!(q.pop_if(|w| w.mode.is_exclusive()).map(|w| w.id), Some(1));
        assert_eq!(q.pop().map(|w| w.id), Some(4));
        assert!(q.cancel(3));
        assert_eq!(q.shared_mode(), None);
        assert!(q.is_empty());
    }

    #[test]
    fn admission_counts_live_waiters_and_lets_a_retry_in() {
        let mut q = WaitQueue::default();
        assert!(admits(None, b"a", 1));
        assert!(!admits(None, b"a", 0));
        q.push(waiter(1, "a", 10));
        assert!(!admits(Some(&q), b"b", 1), "full");
        assert!(
            admits(Some(&q), b"a", 1),
            "a retried wait takes its own place"
        );
        assert!(admits(Some(&q), b"b", 2));
        q.cancel(1);
        assert!(
            admits(Some(&q), b"b", 1),
            "a waiter that left frees its place"
        );
    }

    #[test]
    fn block_timeouts_past_ten_years_mean_no_limit() {
        assert_eq!(block_timeout_ms(0), 0);
        assert_eq!(block_timeout_ms(1), 1);
        assert_eq!(block_timeout_ms(MAX_BLOCK_TIMEOUT_MS), MAX_BLOCK_TIMEOUT_MS);
        assert_eq!(block_timeout_ms(MAX_BLOCK_TIMEOUT_MS + 1), 0);
        assert_eq!(block_timeout_ms(u64::MAX), 0);
    }

    #[test]
    fn shared_requests_of_other_limits_are_taken_out_in_order() {
        let mut q = WaitQueue::default();
        let of = |id, mode| Waiter {
            mode,
            ..waiter(id, &format!("w{id}"), 10)
        };
        q.push(of(1, Mode::Permits(3)));
        q.push(of(2, Mode::Exclusive));
        q.push(of(3, Mode::Permits(3)));
        q.push(of(4, Mode::Permits(2)));
        assert!(q.cancel(3));
        let out: Vec<u64> = q
            .take_other_limits(Mode::Permits(2))
            .iter()
            .map(|w| w.id)
            .collect();
        assert_eq!(out, vec![1], "a cancelled one is not taken again");
        assert_eq!(q.shared_mode(), Some(Mode::Permits(2)));
        assert!(q.take_other_limits(Mode::Permits(2)).is_empty());
        let left: Vec<u64> = std::iter::from_fn(|| q.pop()).map(|w| w.id).collect();
        assert_eq!(left, vec![2, 4]);
    }

    #[test]
    fn an_owner_s_request_is_taken_out_wherever_it_waits() {
        let mut q = WaitQueue::default();
        for id in 1..=3 {
            q.push(waiter(id, &format!("w{id}"), 10));
        }
        assert_eq!(q.take_owner(b"w2").map(|w| w.id), Some(2));
        assert_eq!(q.take_owner(b"w2"), None, "taken once");
        assert_eq!(q.take_owner(b"nobody"), None);
        assert!(!q.has_owner(b"w2"));
        assert_eq!(q.len(), 2);
        let order: Vec<u64> = std::iter::from_fn(|| q.pop()).map(|w| w.id).collect();
        assert_eq!(order, vec![1, 3]);
    }

    #[test]
    fn a_head_that_leaves_with_others_behind_asks_for_a_look() {
        let mut q = WaitQueue::default();
        for id in 1..=3 {
            q.push(waiter(id, &format!("w{id}"), 10));
        }
        assert!(!q.leave(2), "not the head");
        assert!(q.leave(1), "the head, with w3 behind it");
        assert!(!q.leave(3), "the head, nobody behind");
        assert!(!q.leave(99), "never queued");
        assert!(q.is_empty());
    }

    /// An owner that comes to hold the key leaves a single-key wait (answered nil), but its
    /// FLOCK.MACQUIRE request stays in the queue: it waits for its other keys.
    #[test]
    fn take_owner_takes_a_single_key_wait_and_leaves_a_macquire_request() {
        let mut q = WaitQueue::default();
        q.push(waiter(1, "a", 10));
        q.push(Waiter {
            multi: true,
            ..waiter(2, "m", 10)
        });
        assert_eq!(q.take_owner(b"a").map(|w| w.id), Some(1));
        assert!(q.take_owner(b"m").is_none());
        assert_eq!(q.len(), 1);
        assert!(q.take_owner(b"nobody").is_none());
    }
}
