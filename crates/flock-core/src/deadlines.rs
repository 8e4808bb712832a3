//! The deadline index: which lock keys need attention when (the end of a lease or of a
//! lock-delay). Pure Rust, no Redis types: the glue (`expiry.rs`) stores a key reference per
//! entry and keeps one Redis timer armed for [`DeadlineIndex::next`].
//!
//! A binary heap of `(deadline, handle)` over a slab of entries. Insert is O(log n) with no
//! allocation in the steady state; remove is O(1): the slab slot is freed at once (so is the
//! key reference it holds) and the heap entry becomes garbage, skipped when it surfaces. When
//! garbage outnumbers live entries the heap is rebuilt, so memory stays proportional to the
//! live entries (G10: a lock that ended leaves nothing behind).
//!
//! Every held lock has an entry, so an entry is kept small: a slot is its generation, a
//! 32-bit group the host chooses (the glue: the database) and the item (the glue: the key
//! name, inline when short), with no padding; the deadline lives only in the heap entry
//! (16 bytes). A handle names its entry uniquely among every entry ever made (up to 2^32
//! reuses of one slot), so the host can tell its own entry from any other by the handle
//! alone.

use std::cmp::Reverse;
use std::collections::BinaryHeap;

/// An entry's handle: slot index in the low 32 bits, the slot's generation in the high ones.
pub type Handle = u64;

struct Slot<T> {
    generation: u32,
    group: u32,
    item: Option<T>,
}

/// An entry that came due, with the handle it had and its group.
#[derive(Debug, PartialEq, Eq)]
pub struct Due<T> {
    pub handle: Handle,
    pub group: u32,
    pub item: T,
}

pub struct DeadlineIndex<T> {
    slots: Slab<T>,
    free: Vec<u32>,
    heap: BinaryHeap<Reverse<(u64, Handle)>>,
    live: usize,
    /// Generation given to new slots; bumped when the slab is given back, so that handles
    /// from before can never match a slot made after.
    base_generation: u32,
}

impl<T> Default for DeadlineIndex<T> {
    fn default() -> Self {
        DeadlineIndex {
            slots: Slab::new(),
            free: Vec::new(),
            heap: BinaryHeap::new(),
            live: 0,
            // Handles are never 0, so 0 can mean "no entry".
            base_generation: 1,
        }
    }
}

fn handle(index: u32, generation: u32) -> Handle {
    (u64::from(generation) << 32) | u64::from(index)
}

fn split(h: Handle) -> (usize, u32) {
    ((h & 0xffff_ffff) as usize, (h >> 32) as u32)
}

/// Slots per chunk of the slab (8 KB of 32-byte slots).
const CHUNK: usize = 256;

/// The slots, in chunks of [`CHUNK`]: growing never moves or copies a slot, and the spare
/// room is at most one chunk. (A `Vec` doubles: 0-100% spare, about 40% on average, and at
/// one slot per held lock that spare room is memory per lock; growing it by a quarter
/// instead cost about 200 instructions per insert in reallocations.)
struct Slab<T> {
    chunks: Vec<Box<[Slot<T>; CHUNK]>>,
    /// Slots made so far: the first `len` of the chunks' slots.
    len: usize,
}

impl<T> Slab<T> {
    const fn new() -> Self {
        Slab {
            chunks: Vec::new(),
            len: 0,
        }
    }

    fn len(&self) -> usize {
        self.len
    }

    fn capacity(&self) -> usize {
        self.chunks.len() * CHUNK
    }

    /// Slot `i`. Slots of the last chunk not made yet are empty (generation 0, which no
    /// handle has), so no handle finds them either.
    #[inline]
    fn get(&self, i: usize) -> Option<&Slot<T>> {
        // A fixed-size chunk: the offset needs no bounds check.
        self.chunks.get(i / CHUNK)?.get(i % CHUNK)
    }

    #[inline]
    fn get_mut(&mut self, i: usize) -> Option<&mut Slot<T>> {
        self.chunks.get_mut(i / CHUNK)?.get_mut(i % CHUNK)
    }

    /// A new empty slot of generation `generation`, and its index.
    fn push(&mut self, generation: u32) -> Option<usize> {
        if self.len == self.capacity() {
            let chunk: Box<[Slot<T>]> = (0..CHUNK)
                .map(|_| Slot {
                    generation: 0,
                    group: 0,
                    item: None,
                })
                .collect();
            match chunk.try_into() {
                Ok(chunk) => self.chunks.push(chunk),
                Err(_) => return None, // not reached: the chunk has CHUNK slots
            }
        }
        let i = self.len;
        self.len += 1;
        self.get_mut(i)?.generation = generation;
        Some(i)
    }

    fn iter(&self) -> impl Iterator<Item = &Slot<T>> {
        self.chunks.iter().flat_map(|c| c.iter()).take(self.len)
    }

    fn iter_mut(&mut self) -> impl Iterator<Item = &mut Slot<T>> {
        self.chunks
            .iter_mut()
            .flat_map(|c| c.iter_mut())
            .take(self.len)
    }
}

impl<T> DeadlineIndex<T> {
    /// Bytes one entry takes in the index (its slot and its heap entry), besides what its
    /// item points to and the vectors' spare capacity.
    pub const ENTRY_BYTES: usize =
        std::mem::size_of::<Slot<T>>() + std::mem::size_of::<Reverse<(u64, Handle)>>();

    pub fn len(&self) -> usize {
        self.live
    }

    pub fn is_empty(&self) -> bool {
        self.live == 0
    }

    /// Entries in the heap, live or not (for tests and memory accounting).
    pub fn heap_len(&self) -> usize {
        self.heap.len()
    }

    /// Add `item` of `group`, due at `deadline`. Returns its handle.
    pub fn insert(&mut self, deadline: u64, group: u32, item: T) -> Handle {
        let made = match self.free.pop() {
            Some(i) => Some(i as usize),
            None => self.slots.push(self.base_generation),
        };
        // Not reached (a slot was just made or freed), but no panic on a command's path: 0 is
        // the handle of no entry.
        let Some((index, slot)) = made.and_then(|i| Some((i as u32, self.slots.get_mut(i)?)))
        else {
            return 0;
        };
        slot.item = Some(item);
        slot.group = group;
        let h = handle(index, slot.generation);
        self.heap.push(Reverse((deadline, h)));
        self.live += 1;
        h
    }

    /// Remove the entry `h`; `None` when it is no longer there.
    pub fn remove(&mut self, h: Handle) -> Option<T> {
        let (index, generation) = split(h);
        let item = self.take(index, generation)?;
        self.compact_if_needed();
        Some(item)
    }

    /// Empty slot `index` if it still holds generation `generation`: free the slot for reuse
    /// under a new generation, so that old handles can never reach what comes next.
    fn take(&mut self, index: usize, generation: u32) -> Option<T> {
        let slot = self.slots.get_mut(index)?;
        if slot.generation != generation {
            return None;
        }
        let item = slot.item.take()?;
        slot.generation = slot.generation.wrapping_add(1);
        self.free.push(index as u32);
        self.live -= 1;
        Some(item)
    }

    fn is_live(&self, h: Handle) -> bool {
        let (index, generation) = split(h);
        self.slots
            .get(index)
            .is_some_and(|s| s.generation == generation && s.item.is_some())
    }

    /// The earliest deadline of a live entry.
    pub fn next(&mut self) -> Option<u64> {
        self.drop_dead_top();
        self.heap.peek().map(|Reverse((d, _))| *d)
    }

    /// Take every entry due at or before `now`, earliest first.
    pub fn pop_due(&mut self, now: u64) -> Vec<Due<T>> {
        let mut due = Vec::new();
        while let Some(Reverse((deadline, h))) = self.heap.peek().copied() {
            if deadline > now {
                break;
            }
            self.heap.pop();
            let (index, generation) = split(h);
            let group = self.slots.get(index).map_or(0, |s| s.group);
            if let Some(item) = self.take(index, generation) {
                due.push(Due {
                    handle: h,
                    group,
                    item,
                });
            }
        }
        self.compact_if_needed();
        due
    }

    /// Take every live entry (e.g. when a database is flushed).
    pub fn drain(&mut self) -> Vec<T> {
        let mut out = Vec::with_capacity(self.live);
        for slot in self.slots.iter_mut() {
            if let Some(item) = slot.item.take() {
                out.push(item);
            }
        }
        self.release_memory();
        out
    }

    /// Take the live entries of the groups for which `pred` holds.
    pub fn drain_where(&mut self, mut pred: impl FnMut(u32) -> bool) -> Vec<T> {
        let chosen: Vec<(usize, u32)> = self
            .slots
            .iter()
            .enumerate()
            .filter(|(_, s)| s.item.is_some() && pred(s.group))
            .map(|(index, s)| (index, s.generation))
            .collect();
        let out: Vec<T> = chosen
            .into_iter()
            .filter_map(|(index, generation)| self.take(index, generation))
            .collect();
        self.compact_if_needed();
        out
    }

    fn drop_dead_top(&mut self) {
        while let Some(Reverse((_, h))) = self.heap.peek().copied() {
            if self.is_live(h) {
                break;
            }
            self.heap.pop();
        }
    }

    fn compact_if_needed(&mut self) {
        if self.heap.len() > 2 * self.live + 1024 {
            let heap = std::mem::take(&mut self.heap);
            let live: Vec<Reverse<(u64, Handle)>> = heap
                .into_iter()
                .filter(|Reverse((_, h))| self.is_live(*h))
                .collect();
            self.heap = BinaryHeap::from(live);
            self.heap.shrink_to(self.heap.len() * 2);
        }
        // Give the slab back once it is empty.
        if self.live == 0 && self.slots.len() > 1024 {
            self.release_memory();
        }
    }

    fn release_memory(&mut self) {
        let next = self
            .slots
            .iter()
            .map(|s| s.generation)
            .max()
            .unwrap_or(self.base_generation)
            .max(self.base_generation)
            .wrapping_add(1);
        self.slots = Slab::new();
        self.free = Vec::new();
        self.heap = BinaryHeap::new();
        self.live = 0;
        self.base_generation = next;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn items<T>(due: Vec<Due<T>>) -> Vec<T> {
        due.into_iter().map(|d| d.item).collect()
    }

    #[test]
    fn pops_in_deadline_order_and_skips_removed() {
        let mut ix = DeadlineIndex::default();
        let a = ix.insert(30, 0, "a");
        ix.insert(10, 0, "b");
        ix.insert(20, 0, "c");
        let d = ix.insert(5, 0, "d");
        assert_eq!(ix.remove(d), Some("d"));
        assert_eq!(ix.remove(d), None, "removed twice");
        assert_eq!(ix.len(), 3);
        assert_eq!(ix.next(), Some(10));
        assert_eq!(items(ix.pop_due(20)), vec!["b", "c"]);
        assert_eq!(ix.remove(a), Some("a"));
        assert_eq!(ix.next(), None);
        assert!(ix.is_empty());
    }

    #[test]
    fn stale_handles_never_touch_reused_slots() {
        let mut ix = DeadlineIndex::default();
        let old = ix.insert(10, 0, 1);
        assert_eq!(ix.remove(old), Some(1));
        let new = ix.insert(20, 0, 2);
        assert_ne!(old, new, "a reused slot gets a new generation");
        assert_eq!(ix.remove(old), None);
        let due = ix.pop_due(100);
        assert_eq!(due.len(), 1);
        assert_eq!(
            (due[0].handle, due[0].item),
            (new, 2),
            "due with its handle"
        );
        assert_eq!(ix.remove(new), None, "popped entries are gone");
    }

    #[test]
    fn memory_follows_the_live_entries() {
        let mut ix = DeadlineIndex::default();
        let handles: Vec<Handle> = (0..100_000)
            .map(|i| ix.insert(1_000_000 + i, 0, i))
            .collect();
        for h in handles {
            ix.remove(h);
        }
        assert!(ix.is_empty());
        assert!(
            ix.heap_len() <= 1024,
            "heap keeps {} dead entries",
            ix.heap_len()
        );
        assert!(
            ix.slots.capacity() <= 1024,
            "slab keeps {} slots",
            ix.slots.capacity()
        );
        // Interleaved: a few live entries among many removed.
        let keep: Vec<Handle> = (0..10).map(|i| ix.insert(i, 0, i)).collect();
        for i in 0..50_000 {
            let h = ix.insert(500 + i, 0, i);
            ix.remove(h);
        }
        assert!(ix.heap_len() <= 2 * 10 + 1024);
        assert_eq!(ix.pop_due(u64::MAX).len(), keep.len());
    }

    #[test]
    fn handles_from_before_the_slab_was_given_back_stay_dead() {
        let mut ix = DeadlineIndex::default();
        let old: Vec<Handle> = (0..2000).map(|i| ix.insert(i, 0, i)).collect();
        for h in &old {
            ix.remove(*h);
        }
        let fresh: Vec<Handle> = (0..2000).map(|i| ix.insert(i, 0, i + 10_000)).collect();
        for h in &old {
            assert_eq!(ix.remove(*h), None, "an old handle matched a new slot");
        }
        assert_eq!(ix.len(), fresh.len());
    }

    #[test]
    fn handles_are_never_zero_and_drain_where_filters() {
        let mut ix = DeadlineIndex::default();
        let hs: Vec<Handle> = (0..10u64)
            .map(|i| ix.insert(i, (i % 2) as u32, i))
            .collect();
        assert!(hs.iter().all(|&h| h != 0));
        let mut even = ix.drain_where(|group| group == 0);
        even.sort();
        assert_eq!(even, vec![0, 2, 4, 6, 8]);
        let due = ix.pop_due(100);
        assert!(due
            .iter()
            .all(|d| d.group == 1 && hs[d.item as usize] == d.handle));
        assert_eq!(items(due), vec![1, 3, 5, 7, 9]);
    }

    #[test]
    fn a_slot_is_its_item_and_eight_bytes() {
        // An item with a niche (here a box) makes `Option` free: generation and group add 8.
        assert_eq!(std::mem::size_of::<Slot<Box<[u8]>>>(), 16 + 8);
        assert_eq!(DeadlineIndex::<Box<[u8]>>::ENTRY_BYTES, 24 + 16);
    }

    #[test]
    fn the_slab_grows_by_chunks_and_keeps_its_slots_in_place() {
        let mut ix = DeadlineIndex::default();
        let mut handles = vec![];
        for n in 0..10_000u64 {
            handles.push(ix.insert(n, (n % 3) as u32, n));
            let len = n as usize + 1;
            let cap = ix.slots.capacity();
            assert!(cap >= len && cap < len + CHUNK, "{len} slots in {cap}");
        }
        // Every entry is where its handle says, with its group, across the chunks.
        for (n, h) in handles.iter().enumerate().rev().step_by(7) {
            assert_eq!(ix.remove(*h), Some(n as u64));
        }
        let due = ix.pop_due(u64::MAX);
        assert_eq!(due.len(), 10_000 - (0..10_000).rev().step_by(7).count());
        assert!(due.iter().all(|d| d.group == (d.item % 3) as u32));
    }

    #[test]
    fn drain_takes_everything() {
        let mut ix = DeadlineIndex::default();
        ix.insert(1, 0, 'x');
        let h = ix.insert(2, 0, 'y');
        ix.insert(3, 0, 'z');
        ix.remove(h);
        let mut all = ix.drain();
        all.sort();
        assert_eq!(all, vec!['x', 'z']);
        assert!(ix.is_empty());
        assert_eq!(ix.next(), None);
    }
}
