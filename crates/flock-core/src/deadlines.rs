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
//! (16 bytes). Slab and heap are stored in fixed chunks (no doubling vector's spare room). A handle names its entry uniquely among every entry ever made (up to 2^32
//! reuses of one slot), so the host can tell its own entry from any other by the handle
//! alone.

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
    slots: Chunked<Slot<T>, SLOT_CHUNK>,
    free: Vec<u32>,
    heap: Heap,
    live: usize,
    /// Generation given to new slots; bumped when the slab is given back, so that handles
    /// from before can never match a slot made after.
    base_generation: u32,
}

impl<T> Default for DeadlineIndex<T> {
    fn default() -> Self {
        DeadlineIndex {
            slots: Chunked::new(),
            free: Vec::new(),
            heap: Heap::new(),
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

impl<T> Default for Slot<T> {
    fn default() -> Self {
        Slot {
            generation: 0,
            group: 0,
            item: None,
        }
    }
}

/// Slots per chunk of the slab, heap entries per chunk of the heap: 8 KB chunks.
const SLOT_CHUNK: usize = 256;
const HEAP_CHUNK: usize = 512;

/// A vector in fixed chunks of `N`: growing never moves or copies an element, and the spare
/// room is at most one chunk (two while shrinking). A `Vec` doubles: 0-100% spare, about 40% on
/// average, and with one slot and one heap entry per held lock that spare room is memory per
/// lock; growing a `Vec` by a quarter instead cost about 200 instructions per insert in
/// reallocations. A fixed-size chunk also needs no bounds check on the offset.
struct Chunked<E, const N: usize> {
    chunks: Vec<Box<[E; N]>>,
    /// Elements so far: the first `len` of the chunks' places.
    len: usize,
}

impl<E: Default, const N: usize> Chunked<E, N> {
    const fn new() -> Self {
        Chunked {
            chunks: Vec::new(),
            len: 0,
        }
    }

    fn len(&self) -> usize {
        self.len
    }

    fn capacity(&self) -> usize {
        self.chunks.len() * N
    }

    #[inline]
    fn get(&self, i: usize) -> Option<&E> {
        if i >= self.len {
            return None;
        }
        self.chunks.get(i / N)?.get(i % N)
    }

    #[inline]
    fn get_mut(&mut self, i: usize) -> Option<&mut E> {
        if i >= self.len {
            return None;
        }
        self.chunks.get_mut(i / N)?.get_mut(i % N)
    }

    /// Append `e`; its index.
    #[inline]
    fn push(&mut self, e: E) -> Option<usize> {
        let i = self.len;
        if i % N == 0 && i / N == self.chunks.len() {
            self.grow()?;
        }
        *self.chunks.get_mut(i / N)?.get_mut(i % N)? = e;
        self.len += 1;
        Some(i)
    }

    /// One more chunk (once every N pushes).
    #[cold]
    fn grow(&mut self) -> Option<()> {
        let chunk: Box<[E]> = (0..N).map(|_| E::default()).collect();
        // Not reached: the chunk has N places.
        self.chunks.push(chunk.try_into().ok()?);
        Some(())
    }

    /// Take the last element; a second spare chunk is given back.
    fn pop(&mut self) -> Option<E> {
        let last = std::mem::take(self.get_mut(self.len.checked_sub(1)?)?);
        self.len -= 1;
        if self.capacity() - self.len > 2 * N {
            self.chunks.pop();
        }
        Some(last)
    }

    fn iter(&self) -> impl Iterator<Item = &E> {
        self.chunks.iter().flat_map(|c| c.iter()).take(self.len)
    }

    fn iter_mut(&mut self) -> impl Iterator<Item = &mut E> {
        self.chunks
            .iter_mut()
            .flat_map(|c| c.iter_mut())
            .take(self.len)
    }
}

/// A min-heap of `(deadline, handle)` on chunks (std's `BinaryHeap` is a doubling `Vec`).
struct Heap {
    v: Chunked<(u64, Handle), HEAP_CHUNK>,
}

impl Heap {
    const fn new() -> Self {
        Heap { v: Chunked::new() }
    }

    fn len(&self) -> usize {
        self.v.len()
    }

    fn peek(&self) -> Option<(u64, Handle)> {
        self.v.get(0).copied()
    }

    #[inline]
    fn push(&mut self, e: (u64, Handle)) {
        let Some(mut i) = self.v.push(e) else {
            return;
        };
        // Sift up: deadlines mostly come in order (one ttl for a whole class of locks), so
        // this usually stops at the first comparison, with `e` already in place.
        while i > 0 {
            let parent = (i - 1) / 2;
            match self.v.get(parent) {
                Some(&p) if e < p => {
                    self.set(i, p);
                    self.set(parent, e);
                    i = parent;
                }
                _ => break,
            }
        }
    }

    fn pop(&mut self) -> Option<(u64, Handle)> {
        let last = self.v.pop()?;
        if self.v.len() == 0 {
            return Some(last);
        }
        let top = self.peek();
        self.sift_down(0, last);
        top
    }

    /// Put `e` at `i`, moved down to its place (the hole technique: no swaps).
    fn sift_down(&mut self, mut i: usize, e: (u64, Handle)) {
        loop {
            let left = 2 * i + 1;
            let Some(&l) = self.v.get(left) else {
                break;
            };
            let (child, c) = match self.v.get(left + 1) {
                Some(&r) if r < l => (left + 1, r),
                _ => (left, l),
            };
            if c >= e {
                break;
            }
            self.set(i, c);
            i = child;
        }
        self.set(i, e);
    }

    fn set(&mut self, i: usize, e: (u64, Handle)) {
        if let Some(place) = self.v.get_mut(i) {
            *place = e;
        }
    }

    /// A heap of `entries`, in O(n).
    fn from(entries: Vec<(u64, Handle)>) -> Heap {
        let mut h = Heap::new();
        for e in entries {
            let _ = h.v.push(e);
        }
        for i in (0..h.len() / 2).rev() {
            if let Some(&e) = h.v.get(i) {
                h.sift_down(i, e);
            }
        }
        h
    }
}

impl<T> DeadlineIndex<T> {
    /// Bytes one entry takes in the index (its slot and its heap entry), besides what its
    /// item points to and the vectors' spare capacity.
    pub const ENTRY_BYTES: usize =
        std::mem::size_of::<Slot<T>>() + std::mem::size_of::<(u64, Handle)>();

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
            None => self.slots.push(Slot {
                generation: self.base_generation,
                ..Slot::default()
            }),
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
        self.heap.push((deadline, h));
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
    #[inline]
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

    #[inline]
    fn is_live(&self, h: Handle) -> bool {
        let (index, generation) = split(h);
        self.slots
            .get(index)
            .is_some_and(|s| s.generation == generation && s.item.is_some())
    }

    /// The earliest deadline of a live entry.
    pub fn next(&mut self) -> Option<u64> {
        self.drop_dead_top();
        self.heap.peek().map(|(d, _)| d)
    }

    /// Take every entry due at or before `now`, earliest first.
    pub fn pop_due(&mut self, now: u64) -> Vec<Due<T>> {
        let mut due = Vec::new();
        while let Some((deadline, h)) = self.heap.peek() {
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
        while let Some((_, h)) = self.heap.peek() {
            if self.is_live(h) {
                break;
            }
            self.heap.pop();
        }
    }

    fn compact_if_needed(&mut self) {
        if self.heap.len() > 2 * self.live + 1024 {
            let live: Vec<(u64, Handle)> = self
                .heap
                .v
                .iter()
                .filter(|(_, h)| self.is_live(*h))
                .copied()
                .collect();
            self.heap = Heap::from(live);
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
        self.slots = Chunked::new();
        self.free = Vec::new();
        self.heap = Heap::new();
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
    fn slab_and_heap_grow_by_chunks_and_keep_their_entries() {
        let mut ix = DeadlineIndex::default();
        let mut handles = vec![];
        for n in 0..10_000u64 {
            handles.push(ix.insert(n, (n % 3) as u32, n));
            let len = n as usize + 1;
            let cap = ix.slots.capacity();
            assert!(cap >= len && cap < len + SLOT_CHUNK, "{len} slots in {cap}");
            let cap = ix.heap.v.capacity();
            assert!(
                cap >= len && cap < len + HEAP_CHUNK,
                "{len} heap entries in {cap}"
            );
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
    fn random_deadlines_come_due_in_order_through_removals_and_rebuilds() {
        let mut seed = 0x1234_5678_9abc_def1u64;
        let mut next = move || {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed
        };
        let mut ix = DeadlineIndex::default();
        let mut want: Vec<u64> = vec![];
        for round in 0..4u64 {
            let mut hs = vec![];
            for _ in 0..6_000 {
                let d = round * 1_000_000 + next() % 1_000_000;
                hs.push((ix.insert(d, 0, d), d));
            }
            // Remove two in three (enough garbage for the heap to be rebuilt).
            for (i, (h, d)) in hs.into_iter().enumerate() {
                if i % 3 == 0 {
                    want.push(d);
                } else {
                    assert_eq!(ix.remove(h), Some(d));
                }
            }
            assert_eq!(ix.len(), want.len());
        }
        assert!(ix.heap_len() < 2 * ix.len() + 1024 + 1, "{}", ix.heap_len());
        want.sort();
        let mut got = vec![];
        let mut t = 0;
        while !ix.is_empty() {
            t += 50_000;
            let due = items(ix.pop_due(t));
            assert!(due.iter().all(|&d| d <= t));
            got.extend(due);
            assert!(ix.next().is_none_or(|n| n > t));
        }
        assert_eq!(got, want);
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
