//! The deadline index: which lock keys need attention when (the end of a lease or of a
//! lock-delay). Pure Rust, no Redis types: the glue (`expiry.rs`) stores one item per lock
//! (its record) and keeps one Redis timer armed for [`DeadlineIndex::next`].
//!
//! A binary min-heap of `(deadline, item)`, nothing else: every held lock has an entry, so
//! the entry is all an armed lock costs the index (16 bytes with a pointer-sized item). Each
//! item is told where it sits whenever it moves (the `place` callback, with [`NOWHERE`] once it
//! is out), so the host can keep that position beside the item and remove an entry in place:
//! O(log n), no garbage left behind under grant/release churn, and no second table to map
//! handles to entries. The heap lives in fixed chunks (no doubling vector's spare room).

/// The position of an item that is not in the index.
pub const NOWHERE: u32 = u32::MAX;

/// Heap entries per chunk: 8 KB chunks with 16-byte entries.
const CHUNK: usize = 512;

/// A vector in fixed chunks of `N`: growing never moves or copies an element, and the spare
/// room is at most one chunk (two while shrinking). A `Vec` doubles: 0-100% spare, about 40% on
/// average, and with one heap entry per held lock that spare room is memory per lock.
struct Chunked<E, const N: usize> {
    chunks: Vec<Box<[E; N]>>,
    /// Elements so far: the first `len` of the chunks' places.
    len: usize,
}

impl<E: Default + Copy, const N: usize> Chunked<E, N> {
    const fn new() -> Self {
        Chunked {
            chunks: Vec::new(),
            len: 0,
        }
    }

    #[cfg(test)]
    fn capacity(&self) -> usize {
        self.chunks.len() * N
    }

    #[inline]
    fn get(&self, i: usize) -> Option<E> {
        if i >= self.len {
            return None;
        }
        self.chunks.get(i / N)?.get(i % N).copied()
    }

    #[inline]
    fn set(&mut self, i: usize, e: E) {
        if i < self.len {
            if let Some(place) = self.chunks.get_mut(i / N).and_then(|c| c.get_mut(i % N)) {
                *place = e;
            }
        }
    }

    /// Append `e`; its index (`None`: no memory for a chunk, nothing appended).
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
        let last = self.get(self.len.checked_sub(1)?)?;
        self.len -= 1;
        if self.chunks.len() * N - self.len > 2 * N {
            self.chunks.pop();
        }
        Some(last)
    }

    fn iter(&self) -> impl Iterator<Item = E> + '_ {
        self.chunks
            .iter()
            .flat_map(|c| c.iter().copied())
            .take(self.len)
    }
}

/// Deadlines (on the host's monotonic clock) with one item each; see the module docs.
pub struct DeadlineIndex<T> {
    heap: Chunked<(u64, T), CHUNK>,
}

impl<T: Default + Copy> Default for DeadlineIndex<T> {
    fn default() -> Self {
        DeadlineIndex {
            heap: Chunked::new(),
        }
    }
}

impl<T> DeadlineIndex<T> {
    /// An empty index (a `const fn`: it can sit in a static).
    pub const fn new() -> Self {
        DeadlineIndex {
            heap: Chunked {
                chunks: Vec::new(),
                len: 0,
            },
        }
    }
}

impl<T: Default + Copy> DeadlineIndex<T> {
    /// Bytes one entry takes in the index, besides the chunks' spare room.
    pub const ENTRY_BYTES: usize = std::mem::size_of::<(u64, T)>();

    pub fn len(&self) -> usize {
        self.heap.len
    }

    pub fn is_empty(&self) -> bool {
        self.heap.len == 0
    }

    /// The earliest deadline.
    pub fn next(&self) -> Option<u64> {
        self.heap.get(0).map(|(d, _)| d)
    }

    /// The deadline of the entry at `pos`.
    pub fn deadline_at(&self, pos: u32) -> Option<u64> {
        self.heap.get(pos as usize).map(|(d, _)| d)
    }

    /// Add `item`, due at `deadline`; `place` learns where it (and each entry it moved) sits.
    /// Returns false when there was no memory for it (nothing added, `item` not placed).
    pub fn insert(&mut self, deadline: u64, item: T, place: &mut impl FnMut(T, u32)) -> bool {
        let Some(i) = self.heap.push((deadline, item)) else {
            return false;
        };
        // Deadlines mostly come in order (one ttl for a whole class of locks), so this
        // usually stops at the first comparison.
        self.sift_up(i, (deadline, item), place);
        true
    }

    /// Take out the entry at `pos` (the host's record of where its item is); `place` hears
    /// [`NOWHERE`] for it and the new position of the entry that takes its place.
    pub fn remove(&mut self, pos: u32, place: &mut impl FnMut(T, u32)) -> Option<(u64, T)> {
        let at = pos as usize;
        let gone = self.heap.get(at)?;
        let last = self.heap.pop()?;
        place(gone.1, NOWHERE);
        if at < self.heap.len {
            // The last entry fills the hole, moved up or down to its place.
            if at > 0 && self.heap.get((at - 1) / 2).is_some_and(|p| last.0 < p.0) {
                self.sift_up(at, last, place);
            } else {
                self.sift_down(at, last, place);
            }
        }
        Some(gone)
    }

    /// Take every entry due at or before `now`, earliest first.
    pub fn pop_due(&mut self, now: u64, place: &mut impl FnMut(T, u32)) -> Vec<T> {
        let mut due = Vec::new();
        while let Some((deadline, _)) = self.heap.get(0) {
            if deadline > now {
                break;
            }
            if let Some((_, item)) = self.remove(0, place) {
                due.push(item);
            }
        }
        due
    }

    /// Take out every entry whose item `pred` picks (each placed [`NOWHERE`]); the rest are
    /// rebuilt into a heap in O(n) and placed anew. Returns how many were taken.
    pub fn drain_where(
        &mut self,
        mut pred: impl FnMut(T) -> bool,
        place: &mut impl FnMut(T, u32),
    ) -> usize {
        let (gone, kept): (Vec<(u64, T)>, Vec<(u64, T)>) =
            self.heap.iter().partition(|&(_, item)| pred(item));
        for &(_, item) in &gone {
            place(item, NOWHERE);
        }
        self.heap = Chunked::new();
        for e in kept {
            // Not reached for lack of memory: the chunks just given back were as many.
            let _ = self.heap.push(e);
        }
        for i in 0..self.heap.len {
            if let Some(e) = self.heap.get(i) {
                place(e.1, i as u32);
            }
        }
        for i in (0..self.heap.len / 2).rev() {
            if let Some(e) = self.heap.get(i) {
                self.sift_down(i, e, place);
            }
        }
        gone.len()
    }

    /// Put `e` at `i`, moved up to its place (the hole technique: each entry passed over
    /// moves once).
    fn sift_up(&mut self, mut i: usize, e: (u64, T), place: &mut impl FnMut(T, u32)) {
        while i > 0 {
            let parent = (i - 1) / 2;
            match self.heap.get(parent) {
                Some(p) if e.0 < p.0 => {
                    self.heap.set(i, p);
                    place(p.1, i as u32);
                    i = parent;
                }
                _ => break,
            }
        }
        self.heap.set(i, e);
        place(e.1, i as u32);
    }

    /// Put `e` at `i`, moved down to its place.
    fn sift_down(&mut self, mut i: usize, e: (u64, T), place: &mut impl FnMut(T, u32)) {
        loop {
            let left = 2 * i + 1;
            let Some(l) = self.heap.get(left) else {
                break;
            };
            let (child, c) = match self.heap.get(left + 1) {
                Some(r) if r.0 < l.0 => (left + 1, r),
                _ => (left, l),
            };
            if c.0 >= e.0 {
                break;
            }
            self.heap.set(i, c);
            place(c.1, i as u32);
            i = child;
        }
        self.heap.set(i, e);
        place(e.1, i as u32);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The host's side: where each item (an index into `pos`) says it is.
    struct Host {
        pos: Vec<u32>,
    }

    impl Host {
        fn new(n: usize) -> Host {
            Host {
                pos: vec![NOWHERE; n],
            }
        }
        fn place(&mut self) -> impl FnMut(usize, u32) + '_ {
            |item, p| self.pos[item] = p
        }
    }

    /// Every item is where the host believes, and the heap is ordered.
    fn check(ix: &DeadlineIndex<usize>, host: &Host) {
        for i in 0..ix.len() {
            let (d, item) = ix.heap.get(i).unwrap();
            assert_eq!(host.pos[item], i as u32, "item {item} misplaced");
            if i > 0 {
                assert!(ix.heap.get((i - 1) / 2).unwrap().0 <= d, "heap order at {i}");
            }
        }
        let placed = host.pos.iter().filter(|&&p| p != NOWHERE).count();
        assert_eq!(placed, ix.len(), "items placed but not in the index");
    }

    #[test]
    fn pops_in_deadline_order_and_removes_in_place() {
        let mut ix = DeadlineIndex::default();
        let mut host = Host::new(4);
        for (item, d) in [(0, 30), (1, 10), (2, 20), (3, 5)] {
            assert!(ix.insert(d, item, &mut host.place()));
        }
        check(&ix, &host);
        assert_eq!(ix.remove(host.pos[3], &mut host.place()), Some((5, 3)));
        assert_eq!(host.pos[3], NOWHERE);
        check(&ix, &host);
        assert_eq!(ix.next(), Some(10));
        assert_eq!(ix.pop_due(20, &mut host.place()), vec![1, 2]);
        check(&ix, &host);
        assert_eq!(ix.deadline_at(host.pos[0]), Some(30));
        assert_eq!(ix.remove(host.pos[0], &mut host.place()), Some((30, 0)));
        assert_eq!(ix.next(), None);
        assert!(ix.is_empty());
        assert_eq!(ix.remove(0, &mut host.place()), None, "nothing at 0");
    }

    #[test]
    fn memory_follows_the_live_entries() {
        let mut ix = DeadlineIndex::default();
        let n = 100_000;
        let mut host = Host::new(n);
        for i in 0..n {
            ix.insert(1_000_000 + i as u64, i, &mut host.place());
        }
        for i in 0..n {
            ix.remove(host.pos[i], &mut host.place());
        }
        assert!(ix.is_empty());
        assert!(ix.heap.capacity() <= 2 * CHUNK, "{}", ix.heap.capacity());
        check(&ix, &host);
    }

    #[test]
    fn grows_by_chunks_and_keeps_its_entries() {
        let mut ix = DeadlineIndex::default();
        let n = 10_000;
        let mut host = Host::new(n);
        for i in 0..n {
            ix.insert(i as u64, i, &mut host.place());
            let cap = ix.heap.capacity();
            assert!(cap > i && cap <= i + CHUNK, "{} entries in {cap}", i + 1);
        }
        check(&ix, &host);
        for i in (0..n).rev().step_by(7) {
            assert_eq!(ix.remove(host.pos[i], &mut host.place()), Some((i as u64, i)));
        }
        check(&ix, &host);
        let due = ix.pop_due(u64::MAX, &mut host.place());
        assert_eq!(due.len(), n - (0..n).rev().step_by(7).count());
        assert!(due.windows(2).all(|w| w[0] < w[1]), "earliest first");
        check(&ix, &host);
    }

    #[test]
    fn random_deadlines_come_due_in_order_through_removals_and_drains() {
        let mut seed = 0x1234_5678_9abc_def1u64;
        let mut next = move || {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed
        };
        let n = 24_000;
        let mut ix = DeadlineIndex::default();
        let mut host = Host::new(n);
        let mut deadline = vec![0u64; n];
        let mut want: Vec<(u64, usize)> = vec![];
        for item in 0..n {
            deadline[item] = next() % 1_000_000;
            ix.insert(deadline[item], item, &mut host.place());
            // Remove an earlier one now and then, from anywhere in the heap.
            if item % 3 == 2 {
                let victim = (next() % item as u64) as usize;
                if host.pos[victim] != NOWHERE {
                    let got = ix.remove(host.pos[victim], &mut host.place());
                    assert_eq!(got, Some((deadline[victim], victim)));
                }
            }
        }
        check(&ix, &host);
        // Drain the odd items, as a flushed database's.
        let drained = ix.drain_where(|item| item % 2 == 1, &mut host.place());
        check(&ix, &host);
        for item in 0..n {
            if host.pos[item] != NOWHERE {
                want.push((deadline[item], item));
            }
        }
        assert!(drained > 0 && !want.is_empty());
        assert!(want.iter().all(|(_, item)| item % 2 == 0));
        want.sort();
        let mut got = vec![];
        let mut t = 0;
        while !ix.is_empty() {
            t += 50_000;
            for item in ix.pop_due(t, &mut host.place()) {
                assert!(deadline[item] <= t);
                got.push((deadline[item], item));
            }
            assert!(ix.next().is_none_or(|d| d > t));
            check(&ix, &host);
        }
        got.sort();
        assert_eq!(got, want);
    }

    #[test]
    fn an_entry_is_a_deadline_and_a_pointer() {
        assert_eq!(DeadlineIndex::<usize>::ENTRY_BYTES, 16);
    }
}
