//! The grants of one key: a list with an owner index and a due hint, so that a key with a
//! thousand readers costs about what a key with one costs per command.
//!
//! - The list is unordered: a grant leaves by `swap_remove` (O(1)); whoever needs token order
//!   (HOLDERS, the persisted forms, the digest) sorts ([`Grants::by_token`]).
//! - Owners are unique per key (an owner holds at most one grant), so past [`INDEX_FROM`]
//!   grants a hash map from the owner's hash to its position finds it in O(1). The hash is
//!   SipHash with a per-index random key, so clients cannot choose colliding owners; should two
//!   owners still share a 64-bit hash the index says so and lookups fall back to a scan.
//! - `due_hint_us` is a lower bound of the moment the first grant stops being live (its
//!   lease's end, or 0 for a grant that lost its connection): until then no grant needs
//!   looking at, and the key's timer is armed for it. It is exact after [`Grants::retain`]
//!   and only ever lowered in between (an early timer costs one look, a late one would
//!   break G6).
//! - An exclusive key has one grant, kept inline: no allocation beyond the lock's record, and
//!   a key with several grants pays for the list, the index and the hint in a box of its own.

use crate::clock::{Deadline, Now};
use crate::grant::{Binding, Grant};
use std::collections::HashMap;
use std::hash::{BuildHasher, RandomState};

/// Keys with more grants than this index their owners.
pub const INDEX_FROM: usize = 16;

#[derive(Clone, Debug)]
struct OwnerIndex {
    hasher: RandomState,
    positions: HashMap<u64, u32>,
    /// Two owners of this key share a hash: the index is not used until rebuilt.
    collided: bool,
}

impl OwnerIndex {
    fn build(list: &[Grant]) -> OwnerIndex {
        let mut ix = OwnerIndex {
            hasher: RandomState::new(),
            positions: HashMap::with_capacity(list.len() * 2),
            collided: false,
        };
        for (i, g) in list.iter().enumerate() {
            ix.insert(&g.owner, i);
        }
        ix
    }

    fn hash(&self, owner: &[u8]) -> u64 {
        self.hasher.hash_one(owner)
    }

    fn insert(&mut self, owner: &[u8], position: usize) {
        let h = self.hash(owner);
        if self.positions.insert(h, position as u32).is_some() {
            self.collided = true;
        }
    }
}

/// The grants of one key, live or run out.
#[derive(Clone, Debug, Default)]
pub struct Grants {
    repr: Repr,
}

/// None, one inline (every exclusive key: no allocation beyond the lock's record, and no
/// bookkeeping either), or many in a box of their own.
#[derive(Clone, Debug, Default)]
enum Repr {
    #[default]
    Empty,
    One(Grant),
    Many(Box<Many>),
}

#[derive(Clone, Debug)]
struct Many {
    list: Vec<Grant>,
    index: Option<OwnerIndex>,
    due_hint_us: u64,
}

impl Many {
    fn index_if_large(&mut self) {
        self.index = (self.list.len() > INDEX_FROM).then(|| OwnerIndex::build(&self.list));
    }
}

impl PartialEq for Grants {
    /// The same grants, whatever their order in the list.
    fn eq(&self, other: &Grants) -> bool {
        self.by_token() == other.by_token()
    }
}

impl Eq for Grants {}

/// When a grant stops being live, on the monotonic clock.
fn due_us(g: &Grant) -> u64 {
    if g.binding() == Binding::Lost {
        0
    } else {
        g.deadline.mono_us
    }
}

impl Grants {
    /// Just `g` (no allocation: one grant is kept inline).
    #[inline]
    pub fn one(g: Grant) -> Grants {
        Grants { repr: Repr::One(g) }
    }

    pub fn len(&self) -> usize {
        self.as_slice().len()
    }

    pub fn is_empty(&self) -> bool {
        matches!(self.repr, Repr::Empty)
    }

    pub fn iter(&self) -> std::slice::Iter<'_, Grant> {
        self.as_slice().iter()
    }

    pub fn as_slice(&self) -> &[Grant] {
        match &self.repr {
            Repr::Empty => &[],
            Repr::One(g) => std::slice::from_ref(g),
            Repr::Many(m) => &m.list,
        }
    }

    fn as_mut_slice(&mut self) -> &mut [Grant] {
        match &mut self.repr {
            Repr::Empty => &mut [],
            Repr::One(g) => std::slice::from_mut(g),
            Repr::Many(m) => &mut m.list,
        }
    }

    /// The bytes the grants take outside the lock's record (a key with more than one grant),
    /// owners aside: what MEMORY USAGE counts.
    pub fn heap_bytes(&self) -> usize {
        match &self.repr {
            Repr::Many(m) => {
                std::mem::size_of::<Many>()
                    + m.list.capacity() * std::mem::size_of::<Grant>()
                    + m.index
                        .as_ref()
                        .map_or(0, |ix| ix.positions.capacity() * 16)
            }
            _ => 0,
        }
    }

    /// The grants in token order (oldest first).
    pub fn by_token(&self) -> Vec<&Grant> {
        let mut v: Vec<&Grant> = self.iter().collect();
        v.sort_unstable_by_key(|g| g.token);
        v
    }

    /// The newest grant (the one `push` added last, as long as none left since).
    pub fn last(&self) -> Option<&Grant> {
        self.as_slice().last()
    }

    /// A lower bound of the moment the first grant stops being live (see the module doc).
    pub fn due_hint_us(&self) -> u64 {
        match &self.repr {
            Repr::Empty => 0,
            Repr::One(g) => due_us(g),
            Repr::Many(m) => m.due_hint_us,
        }
    }

    /// Whether some grant may have stopped being live at `now`.
    pub fn maybe_due(&self, now: Now) -> bool {
        !self.is_empty() && now.mono_us >= self.due_hint_us()
    }

    /// The earliest moment a grant needs attention, as a deadline to arm for.
    pub fn next_due(&self) -> Option<Deadline> {
        let first = self.as_slice().first()?;
        let due = self.due_hint_us();
        if due == 0 {
            return Some(Deadline::default());
        }
        // The wall-clock part only travels; for arming, the monotonic part decides.
        Some(Deadline {
            wall_ms: first.deadline.wall_ms,
            mono_us: due,
        })
    }

    pub fn push(&mut self, g: Grant) {
        match std::mem::take(&mut self.repr) {
            Repr::Empty => self.repr = Repr::One(g),
            Repr::One(first) => {
                let due_hint_us = due_us(&first).min(due_us(&g));
                self.repr = Repr::Many(Box::new(Many {
                    list: vec![first, g],
                    index: None,
                    due_hint_us,
                }));
            }
            Repr::Many(mut m) => {
                m.due_hint_us = m.due_hint_us.min(due_us(&g));
                m.list.push(g);
                let at = m.list.len() - 1;
                match m.index.as_mut() {
                    Some(ix) => ix.insert(&m.list[at].owner, at),
                    None if m.list.len() > INDEX_FROM => m.index_if_large(),
                    None => {}
                }
                self.repr = Repr::Many(m);
            }
        }
    }

    /// The position of `owner`'s grant, live or not.
    pub fn position_of(&self, owner: &[u8]) -> Option<usize> {
        if let Repr::Many(m) = &self.repr {
            if let Some(ix) = m.index.as_ref().filter(|ix| !ix.collided) {
                let at = *ix.positions.get(&ix.hash(owner))? as usize;
                return m.list.get(at).filter(|g| *g.owner == *owner).map(|_| at);
            }
        }
        self.iter().position(|g| *g.owner == *owner)
    }

    /// The position of the grant with `token`.
    pub fn position_of_token(&self, token: u64) -> Option<usize> {
        self.iter().position(|g| g.token == token)
    }

    pub fn get(&self, at: usize) -> Option<&Grant> {
        self.as_slice().get(at)
    }

    /// A new lease end (and binding) for the grant at `at`.
    pub fn refresh(&mut self, at: usize, deadline: Deadline, bind_to: Option<Option<u64>>) {
        let Some(g) = self.as_mut_slice().get_mut(at) else {
            return;
        };
        g.deadline = deadline;
        if let Some(client) = bind_to {
            g.bind(client);
        }
        let due = due_us(g);
        if let Repr::Many(m) = &mut self.repr {
            m.due_hint_us = m.due_hint_us.min(due);
        }
    }

    /// Take the grant at `at` out (the last one takes its place).
    pub fn take(&mut self, at: usize) -> Option<Grant> {
        match std::mem::take(&mut self.repr) {
            Repr::Empty => None,
            Repr::One(g) if at == 0 => Some(g),
            one @ Repr::One(_) => {
                self.repr = one;
                None
            }
            Repr::Many(mut m) => {
                if at >= m.list.len() {
                    self.repr = Repr::Many(m);
                    return None;
                }
                let g = m.list.swap_remove(at);
                if m.list.len() == 1 {
                    // Back to one: inline again, the box goes.
                    if let Some(last) = m.list.pop() {
                        self.repr = Repr::One(last);
                    }
                    return Some(g);
                }
                if let Some(ix) = m.index.as_mut().filter(|ix| !ix.collided) {
                    ix.positions.remove(&ix.hash(&g.owner));
                    if let Some(moved) = m.list.get(at) {
                        let h = ix.hash(&moved.owner);
                        ix.positions.insert(h, at as u32);
                    }
                }
                self.repr = Repr::Many(m);
                Some(g)
            }
        }
    }

    /// Take the newest grant out (its waiter vanished before it could be told).
    pub fn pop(&mut self) -> Option<Grant> {
        let last = self.len().checked_sub(1)?;
        self.take(last)
    }

    /// Mark the grants that `lost` picks as having lost their connection; returns how many.
    pub fn mark_lost(&mut self, mut lost: impl FnMut(&Grant) -> bool) -> usize {
        let mut n = 0;
        for g in self.as_mut_slice() {
            if lost(g) {
                g.lose_binding();
                n += 1;
            }
        }
        if n > 0 {
            if let Repr::Many(m) = &mut self.repr {
                m.due_hint_us = 0;
            }
        }
        n
    }

    /// Keep the grants `keep` says to keep; the others go to `gone`, in list order. Rebuilds
    /// the index and makes the due hint exact. O(n): only when something may have ended.
    pub fn retain(&mut self, mut keep: impl FnMut(&Grant) -> bool, mut gone: impl FnMut(Grant)) {
        let list: Vec<Grant> = match std::mem::take(&mut self.repr) {
            Repr::Empty => Vec::new(),
            Repr::One(g) => vec![g],
            Repr::Many(m) => m.list,
        };
        let mut kept = Vec::with_capacity(list.len());
        for g in list {
            if keep(&g) {
                kept.push(g);
            } else {
                gone(g);
            }
        }
        for g in kept {
            self.push(g);
        }
        // Pushing built the index (past INDEX_FROM); the hint becomes exact.
        if let Repr::Many(m) = &mut self.repr {
            m.due_hint_us = m.list.iter().map(due_us).min().unwrap_or(0);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn grant(owner: &str, token: u64, ttl_ms: u64) -> Grant {
        Grant::new(owner.as_bytes(), token, ttl_ms, Now::new(1_000_000_000, 0))
    }

    #[test]
    fn owners_are_found_with_and_without_the_index() {
        for n in [1, INDEX_FROM, INDEX_FROM + 1, 300] {
            let mut gs = Grants::default();
            for i in 0..n {
                gs.push(grant(&format!("o{i}"), i as u64 + 1, 1000 + i as u64));
            }
            let indexed = matches!(&gs.repr, Repr::Many(m) if m.index.is_some());
            assert_eq!(indexed, n > INDEX_FROM, "{n} grants");
            for i in 0..n {
                let at = gs.position_of(format!("o{i}").as_bytes()).expect("found");
                assert_eq!(gs.get(at).map(|g| g.token), Some(i as u64 + 1));
            }
            assert_eq!(gs.position_of(b"nobody"), None);
            // Take every other grant out: the rest are still found where they are.
            let mut i = 0;
            while i < n {
                let at = gs.position_of(format!("o{i}").as_bytes()).expect("found");
                assert_eq!(gs.take(at).map(|g| g.token), Some(i as u64 + 1));
                i += 2;
            }
            for i in 0..n {
                let found = gs.position_of(format!("o{i}").as_bytes());
                assert_eq!(found.is_some(), i % 2 == 1, "o{i} of {n}");
                if let Some(at) = found {
                    assert_eq!(&*gs.as_slice()[at].owner, format!("o{i}").as_bytes());
                }
            }
            let tokens: Vec<u64> = gs.by_token().iter().map(|g| g.token).collect();
            let mut sorted = tokens.clone();
            sorted.sort();
            assert_eq!(tokens, sorted, "by_token is in token order");
        }
    }

    #[test]
    fn the_due_hint_is_a_lower_bound_made_exact_by_retain() {
        let mut gs = Grants::default();
        gs.push(grant("a", 1, 500));
        gs.push(grant("b", 2, 100));
        gs.push(grant("c", 3, 300));
        assert_eq!(gs.due_hint_us(), 100_000);
        // The earliest leaves: the hint stays (a lower bound), retain makes it exact.
        let at = gs.position_of(b"b").expect("b");
        gs.take(at);
        assert_eq!(gs.due_hint_us(), 100_000);
        gs.retain(|_| true, |_| {});
        assert_eq!(gs.due_hint_us(), 300_000);
        // A shorter lease lowers it at once; a lost connection makes it due now.
        let at = gs.position_of(b"a").expect("a");
        gs.refresh(
            at,
            Deadline {
                wall_ms: 0,
                mono_us: 50_000,
            },
            None,
        );
        assert_eq!(gs.due_hint_us(), 50_000);
        assert_eq!(gs.mark_lost(|g| &*g.owner == b"c"), 1);
        assert_eq!(gs.due_hint_us(), 0);
        assert!(gs.maybe_due(Now::new(0, 0)));
    }
}
