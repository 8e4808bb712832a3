//! The waiters of one key (FLOCK.ACQUIRE ... BLOCK), first come first served.

/// A BLOCK timeout beyond this (ten years) means no limit: a huge period would wrap in the
/// server's timer arithmetic and fire at once.
pub const MAX_BLOCK_TIMEOUT_MS: u64 = 315_360_000_000;

/// A client waiting for a key (FLOCK.ACQUIRE ... BLOCK).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Waiter {
    pub id: u64,
    pub owner: Box<[u8]>,
    pub ttl_ms: u64,
}

/// The waiters of one key, first come first served.
///
/// Push and pop are O(1). A waiter that leaves early (timeout, disconnect) is only marked; the
/// queue skips it when it reaches the front, and compacts itself when the marked ones
/// outnumber the live ones, so memory stays proportional to the live waiters.
#[derive(Clone, Debug, Default)]
pub struct WaitQueue {
    entries: std::collections::VecDeque<Waiter>,
    live: std::collections::HashSet<u64>,
}

impl WaitQueue {
    pub fn len(&self) -> usize {
        self.live.len()
    }

    pub fn is_empty(&self) -> bool {
        self.live.is_empty()
    }

    pub fn push(&mut self, waiter: Waiter) {
        if self.live.insert(waiter.id) {
            self.entries.push_back(waiter);
        }
    }

    /// Remove waiter `id`; false when it was not waiting.
    pub fn cancel(&mut self, id: u64) -> bool {
        if !self.live.remove(&id) {
            return false;
        }
        if self.entries.len() > 2 * self.live.len() + 16 {
            let live = &self.live;
            self.entries.retain(|w| live.contains(&w.id));
        }
        true
    }

    /// The first live waiter, taken off the queue.
    pub fn pop(&mut self) -> Option<Waiter> {
        while let Some(w) = self.entries.pop_front() {
            if self.live.remove(&w.id) {
                return Some(w);
            }
        }
        None
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

#[cfg(test)]
mod tests {
    use super::*;

    fn waiter(id: u64, owner: &str, ttl_ms: u64) -> Waiter {
        Waiter {
            id,
            owner: owner.as_bytes().into(),
            ttl_ms,
        }
    }

    #[test]
    fn queue_is_first_come_first_served_and_skips_cancelled() {
        let mut q = WaitQueue::default();
        for id in 1..=5 {
            q.push(waiter(id, "w", 10));
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
            q.push(waiter(id, "w", 10));
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
}
