//! The deadline index: which lock keys need attention when (the end of a lease or of a
//! lock-delay). Pure Rust, no Redis types: the glue (`expiry.rs`) stores one item per lock
//! (its record) and keeps one Redis timer armed for [`DeadlineIndex::next`].
//!
//! A binary min-heap of `(deadline, item)`, nothing else: every held lock has an entry, so
//! the entry is all an armed lock costs the index (16 bytes with a pointer-sized item). Each
//! item is told where it sits whenever it moves (the `place` callback, with [`NOWHERE`] once it
//! is out), so the host can keep that position beside the item: no second table maps handles
//! to entries. Insert is O(log n); removal is O(1), the entry emptied in place (a RELEASE
//! must not pay for sifting the heap) and dropped when it surfaces, the heap rebuilt once the
//! emptied entries outnumber the live ones twice, so memory stays proportional to the live
//! entries (G10). The heap lives in fixed chunks (no doubling vector's spare room).

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
        if i.is_multiple_of(N) && i / N == self.chunks.len() {
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
    /// The heap; a removed entry stays as `None` (its deadline still orders it) until it
    /// surfaces at the top or the heap is rebuilt.
    heap: Chunked<(u64, Option<T>), CHUNK>,
    live: usize,
}

impl<T> DeadlineIndex<T> {
    /// An empty index (a `const fn`: it can sit in a static).
    pub const fn new() -> Self {
        DeadlineIndex {
            heap: Chunked {
                chunks: Vec::new(),
                len: 0,
            },
            live: 0,
        }
    }
}

impl<T: Copy> Default for DeadlineIndex<T> {
    fn default() -> Self {
        DeadlineIndex::new()
    }
}

/// Removed entries are rebuilt away once they outnumber the live ones twice (and this many).
const GARBAGE_SLACK: usize = 1024;

impl<T: Copy> DeadlineIndex<T> {
    /// Bytes one entry takes in the index, besides the chunks' spare room (and, under churn,
    /// the removed entries not yet rebuilt away: at most twice the live ones).
    pub const ENTRY_BYTES: usize = std::mem::size_of::<(u64, Option<T>)>();

    pub fn len(&self) -> usize {
        self.live
    }

    pub fn is_empty(&self) -> bool {
        self.live == 0
    }

    /// Entries in the heap, removed ones included (for tests and memory accounting).
    pub fn heap_len(&self) -> usize {
        self.heap.len
    }

    /// The earliest deadline (removed entries on top are dropped on the way).
    pub fn next(&mut self, place: &mut impl FnMut(T, u32)) -> Option<u64> {
        self.drop_removed_top(place);
        self.heap.get(0).map(|(d, _)| d)
    }

    /// The deadline of the live entry at `pos`.
    pub fn deadline_at(&self, pos: u32) -> Option<u64> {
        match self.heap.get(pos as usize) {
            Some((d, Some(_))) => Some(d),
            _ => None,
        }
    }

    /// Add `item`, due at `deadline`; `place` learns where it (and each entry it moved) sits.
    /// Returns false when there was no memory for it (nothing added, `item` not placed).
    pub fn insert(&mut self, deadline: u64, item: T, place: &mut impl FnMut(T, u32)) -> bool {
        let Some(i) = self.heap.push((deadline, Some(item))) else {
            return false;
        };
        self.live += 1;
        // Deadlines mostly come in order (one ttl for a whole class of locks), so this
        // usually stops at the first comparison.
        self.sift_up(i, (deadline, Some(item)), place);
        true
    }

    /// Take out the entry at `pos` (the host's record of where its item is), in O(1): the
    /// entry stays in the heap, empty, until it surfaces or the heap is rebuilt. `place`
    /// hears [`NOWHERE`] for the item (and new positions if the heap is rebuilt).
    pub fn remove(&mut self, pos: u32, place: &mut impl FnMut(T, u32)) -> Option<(u64, T)> {
        let (deadline, item) = match self.heap.get(pos as usize) {
            Some((d, Some(item))) => (d, item),
            _ => return None,
        };
        self.heap.set(pos as usize, (deadline, None));
        self.live -= 1;
        place(item, NOWHERE);
        if self.heap.len - self.live > 2 * self.live + GARBAGE_SLACK {
            self.rebuild(|_| true, place);
        }
        Some((deadline, item))
    }

    /// Take out the earliest entry if it is due at `now`.
    pub fn pop_due(&mut self, now: u64, place: &mut impl FnMut(T, u32)) -> Option<T> {
        self.drop_removed_top(place);
        match self.heap.get(0)? {
            (d, Some(item)) if d <= now => {
                self.pop_top(place);
                self.live -= 1;
                place(item, NOWHERE);
                Some(item)
            }
            _ => None,
        }
    }

    /// Take out every entry whose item `pred` picks (each placed [`NOWHERE`]); the rest are
    /// rebuilt into a heap in O(n) and placed anew. Returns how many were taken.
    pub fn drain_where(
        &mut self,
        mut pred: impl FnMut(T) -> bool,
        place: &mut impl FnMut(T, u32),
    ) -> usize {
        let before = self.live;
        let mut gone = Vec::new();
        self.rebuild(
            |item| {
                if pred(item) {
                    gone.push(item);
                    false
                } else {
                    true
                }
            },
            place,
        );
        for item in gone {
            place(item, NOWHERE);
        }
        before - self.live
    }

    /// The live entries `keep` keeps, as a new heap (built in O(n), everyone placed anew).
    fn rebuild(&mut self, mut keep: impl FnMut(T) -> bool, place: &mut impl FnMut(T, u32)) {
        let kept: Vec<(u64, T)> = self
            .heap
            .iter()
            .filter_map(|(d, item)| item.map(|i| (d, i)))
            .filter(|&(_, item)| keep(item))
            .collect();
        self.heap = Chunked::new();
        self.live = kept.len();
        for (d, item) in kept {
            // Not reached for lack of memory: the chunks just given back were as many.
            let _ = self.heap.push((d, Some(item)));
        }
        for i in 0..self.heap.len {
            if let Some((_, Some(item))) = self.heap.get(i) {
                place(item, i as u32);
            }
        }
        for i in (0..self.heap.len / 2).rev() {
            if let Some(e) = self.heap.get(i) {
                self.sift_down(i, e, place);
            }
        }
    }

    fn drop_removed_top(&mut self, place: &mut impl FnMut(T, u32)) {
        while let Some((_, None)) = self.heap.get(0) {
            self.pop_top(place);
        }
    }

    /// Take the top entry out of the heap (the last one fills its place).
    fn pop_top(&mut self, place: &mut impl FnMut(T, u32)) {
        let Some(last) = self.heap.pop() else {
            return;
        };
        if self.heap.len > 0 {
            self.sift_down(0, last, place);
        }
    }

    /// Put `e` at `i`, moved up to its place (the hole technique: each entry passed over
    /// moves once).
    fn sift_up(&mut self, mut i: usize, e: (u64, Option<T>), place: &mut impl FnMut(T, u32)) {
        while i > 0 {
            let parent = (i - 1) / 2;
            match self.heap.get(parent) {
                Some(p) if e.0 < p.0 => {
                    self.put(i, p, place);
                    i = parent;
                }
                _ => break,
            }
        }
        self.put(i, e, place);
    }

    /// Put `e` at `i`, moved down to its place.
    fn sift_down(&mut self, mut i: usize, e: (u64, Option<T>), place: &mut impl FnMut(T, u32)) {
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
            self.put(i, c, place);
            i = child;
        }
        self.put(i, e, place);
    }

    fn put(&mut self, i: usize, e: (u64, Option<T>), place: &mut impl FnMut(T, u32)) {
        self.heap.set(i, e);
        if let Some(item) = e.1 {
            place(item, i as u32);
        }
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

    /// Every live item is where the host believes, the heap is ordered, and nothing else is
    /// placed.
    fn check(ix: &DeadlineIndex<usize>, host: &Host) {
        let mut live = 0;
        for i in 0..ix.heap.len {
            let (d, item) = ix.heap.get(i).unwrap();
            if let Some(item) = item {
                assert_eq!(host.pos[item], i as u32, "item {item} misplaced");
                live += 1;
            }
            if i > 0 {
                assert!(
                    ix.heap.get((i - 1) / 2).unwrap().0 <= d,
                    "heap order at {i}"
                );
            }
        }
        assert_eq!(live, ix.len());
        let placed = host.pos.iter().filter(|&&p| p != NOWHERE).count();
        assert_eq!(placed, ix.len(), "items placed but not in the index");
    }

    fn all_due(ix: &mut DeadlineIndex<usize>, now: u64, host: &mut Host) -> Vec<usize> {
        let mut out = vec![];
        while let Some(item) = ix.pop_due(now, &mut host.place()) {
            out.push(item);
        }
        out
    }

    #[test]
    fn pops_in_deadline_order_and_skips_removed() {
        let mut ix = DeadlineIndex::default();
        let mut host = Host::new(4);
        for (item, d) in [(0, 30), (1, 10), (2, 20), (3, 5)] {
            assert!(ix.insert(d, item, &mut host.place()));
        }
        check(&ix, &host);
        let at = host.pos[3];
        assert_eq!(ix.remove(at, &mut host.place()), Some((5, 3)));
        assert_eq!(host.pos[3], NOWHERE);
        assert_eq!(ix.remove(at, &mut host.place()), None, "removed twice");
        check(&ix, &host);
        assert_eq!(ix.next(&mut host.place()), Some(10));
        assert_eq!(all_due(&mut ix, 20, &mut host), vec![1, 2]);
        check(&ix, &host);
        assert_eq!(ix.deadline_at(host.pos[0]), Some(30));
        assert_eq!(ix.remove(host.pos[0], &mut host.place()), Some((30, 0)));
        assert_eq!(ix.next(&mut host.place()), None);
        assert!(ix.is_empty());
        assert_eq!(ix.heap_len(), 0, "removed entries dropped once on top");
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
            assert!(ix.heap_len() <= 3 * ix.len() + GARBAGE_SLACK + 1);
        }
        assert!(ix.is_empty());
        assert!(ix.heap_len() <= GARBAGE_SLACK + 1, "{}", ix.heap_len());
        assert!(
            ix.heap.capacity() <= 2 * CHUNK + GARBAGE_SLACK,
            "{}",
            ix.heap.capacity()
        );
        check(&ix, &host);
        // Churn: a few live entries among many removed.
        let mut ix = DeadlineIndex::default();
        let mut host = Host::new(60_010);
        for i in 0..10 {
            ix.insert(i as u64, i, &mut host.place());
        }
        for i in 10..60_010 {
            ix.insert(500 + i as u64, i, &mut host.place());
            ix.remove(host.pos[i], &mut host.place());
        }
        assert!(ix.heap_len() <= 3 * 10 + GARBAGE_SLACK + 1);
        check(&ix, &host);
        assert_eq!(all_due(&mut ix, u64::MAX, &mut host).len(), 10);
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
            assert_eq!(
                ix.remove(host.pos[i], &mut host.place()),
                Some((i as u64, i))
            );
        }
        check(&ix, &host);
        let due = all_due(&mut ix, u64::MAX, &mut host);
        assert_eq!(due.len(), n - (0..n).rev().step_by(7).count());
        assert!(due.windows(2).all(|w| w[0] < w[1]), "earliest first");
        check(&ix, &host);
    }

    #[test]
    fn random_deadlines_come_due_in_order_through_removals_rebuilds_and_drains() {
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
        let mut rebuilt = false;
        let mut alive: Vec<usize> = vec![];
        for item in 0..n {
            deadline[item] = next() % 1_000_000;
            ix.insert(deadline[item], item, &mut host.place());
            alive.push(item);
            // Remove a live one from anywhere in the heap, three times in four (enough for
            // the heap to be rebuilt on the way).
            if item % 4 != 0 {
                let victim = alive.swap_remove((next() % alive.len() as u64) as usize);
                let before = ix.heap_len();
                let got = ix.remove(host.pos[victim], &mut host.place());
                assert_eq!(got, Some((deadline[victim], victim)));
                rebuilt |= ix.heap_len() < before;
            }
        }
        assert!(rebuilt, "the heap was never rebuilt");
        check(&ix, &host);
        // Drain the odd items, as a flushed database's.
        let drained = ix.drain_where(|item| item % 2 == 1, &mut host.place());
        check(&ix, &host);
        let mut want: Vec<(u64, usize)> = (0..n)
            .filter(|&item| host.pos[item] != NOWHERE)
            .map(|item| (deadline[item], item))
            .collect();
        assert!(drained > 0 && !want.is_empty());
        assert!(want.iter().all(|(_, item)| item % 2 == 0));
        want.sort();
        let mut got = vec![];
        let mut t = 0;
        while !ix.is_empty() {
            t += 50_000;
            for item in all_due(&mut ix, t, &mut host) {
                assert!(deadline[item] <= t);
                got.push((deadline[item], item));
            }
            assert!(ix.next(&mut host.place()).is_none_or(|d| d > t));
            check(&ix, &host);
        }
        got.sort();
        assert_eq!(got, want);
    }

    #[test]
    fn an_entry_is_a_deadline_and_a_pointer() {
        assert_eq!(
            DeadlineIndex::<std::ptr::NonNull<u8>>::ENTRY_BYTES,
            16,
            "a pointer's niche holds the removed mark"
        );
    }
}
