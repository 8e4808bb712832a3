//! The lock under an open key: what a command reads or changes, reached only through the
//! key, whose borrow bounds every access to the block (the parent module's invariant).

use super::{form_for, Form, KeyId, LockRecord, RecordPtr, StateRef, Work};
use crate::ffi::key::{Key, KeyKind};
use flock_core::engine::LoneGrant;
use flock_core::lock_stats::ClassRef;
use flock_core::state::Mode;
use flock_core::{Grant, LockState};
use std::marker::PhantomData;
use std::os::raw::c_int;

/// What an open key holds.
pub enum Found<T> {
    Lock(T),
    Nothing,
    OtherType,
}

/// A lock's state and the waiters' key for the length of a command; stored back into its
/// block (in the form that fits) when dropped. Holds the key's exclusive borrow.
pub struct LockMut<'k> {
    block: RecordPtr,
    work: Work<'k>,
    /// Leave the block as it is on drop ([`LockMut::discard`]).
    keep: bool,
    _key: PhantomData<&'k mut Key>,
}

impl<'k> LockMut<'k> {
    /// The state and the waiters' key.
    pub fn parts(&mut self) -> (&mut LockState, &mut Option<Box<KeyId>>) {
        let rec = match &mut self.work {
            Work::Own(rec) => rec,
            Work::Full(rec) => &mut **rec,
        };
        (&mut rec.state, &mut rec.watched)
    }

    pub fn state(&mut self) -> &mut LockState {
        self.parts().0
    }

    /// The block (for the deadline index and the class, reached through its raw methods).
    pub fn block(&self) -> RecordPtr {
        self.block
    }

    /// Let go of the state without storing it back: the key is about to be deleted (which
    /// frees the block, and a full form's box with it).
    pub fn discard(mut self) {
        // A decoded state is dropped here; a full form's box stays in the block for its free.
        self.keep = true;
    }
}

impl Drop for LockMut<'_> {
    fn drop(&mut self) {
        if self.keep {
            return;
        }
        // (An empty state in the place of the one taken: no allocation.)
        match std::mem::replace(&mut self.work, Work::Own(LockRecord::default())) {
            // SAFETY: the block is live (the key is still borrowed by this guard) and its body
            // holds no box (it was compact or empty).
            Work::Own(rec) => unsafe { self.block.store(rec) },
            // A full form that now fits a smaller one leaves its box. SAFETY: as above; the
            // box is taken out of the body before the state is stored.
            Work::Full(rec) => unsafe {
                let area = self.block.area();
                if !matches!(form_for(rec, Some(area)), Form::Full) {
                    let head = self.block.head();
                    let boxed = Box::from_raw((*head).body.full);
                    self.block.store(*boxed);
                }
            },
        }
    }
}

#[inline(always)]
fn block_of(key: &Key) -> Found<RecordPtr> {
    match key.kind() {
        KeyKind::Empty => Found::Nothing,
        KeyKind::Other => Found::OtherType,
        // SAFETY: every value of our type is a block made by this module.
        KeyKind::Ours => match unsafe { RecordPtr::from_value(key.raw_value()) } {
            Some(b) => Found::Lock(b),
            None => Found::Nothing,
        },
    }
}

/// The block of the lock under `key`, if it holds one (for its class and timer slot, which
/// Redis never sees).
pub fn record_of(key: &Key) -> Option<RecordPtr> {
    match block_of(key) {
        Found::Lock(b) => Some(b),
        _ => None,
    }
}

/// The state of the lock under `key`, for reading.
pub fn lock_of(key: &Key) -> Found<StateRef<'_>> {
    match block_of(key) {
        // SAFETY: a live block of the open key; the full form's state is borrowed for as
        // long as the key is (shared borrow: the key cannot change meanwhile).
        Found::Lock(b) => Found::Lock(unsafe { b.state() }),
        Found::Nothing => Found::Nothing,
        Found::OtherType => Found::OtherType,
    }
}

/// The state of the lock under `key`, for a command that may change it.
pub fn lock_mut(key: &mut Key) -> Found<LockMut<'_>> {
    match block_of(key) {
        Found::Lock(b) => Found::Lock(LockMut {
            block: b,
            // SAFETY: a live block of the open key, which the guard borrows exclusively.
            work: unsafe { b.load() },
            keep: false,
            _key: PhantomData,
        }),
        Found::Nothing => Found::Nothing,
        Found::OtherType => Found::OtherType,
    }
}

impl Key {
    /// Whether this key holds `block` now (the block is only compared, never read: a due
    /// entry's block may have been replaced since).
    pub fn holds(&self, block: RecordPtr) -> bool {
        matches!(self.kind(), KeyKind::Ours) && self.raw_value() == block.as_value()
    }
}

/// What an open key holds, told with one look at it (the executor's first step).
pub enum Opened<'k> {
    /// No key.
    Nothing,
    /// A value of another type.
    OtherType,
    /// A lock whose whole state is one grant (the compact form), read in place.
    Lone(RecordPtr, LoneGrant<'k>),
    /// A lock in any other form (see [`lock_mut`]).
    Other,
}

/// What `key` holds (one kind check and one value read).
#[inline(always)]
pub fn open(key: &Key) -> Opened<'_> {
    match block_of(key) {
        Found::Nothing => Opened::Nothing,
        Found::OtherType => Opened::OtherType,
        // SAFETY: a live block of the open key, unchanged while the key is borrowed.
        Found::Lock(b) => match unsafe { b.lone() } {
            Some(lone) => Opened::Lone(b, lone),
            None => Opened::Other,
        },
    }
}

/// Why [`create`] stored nothing.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StoreError {
    /// Redis would not store the value (or there was no memory for it).
    Refused,
}

/// Store a new block for `rec` under the (empty, writable) `key`, named `db`/`name`.
pub fn create(
    key: &mut Key,
    rec: LockRecord,
    db: c_int,
    name: &[u8],
    class: ClassRef,
) -> Result<RecordPtr, StoreError> {
    let b = RecordPtr::new(rec, Some((db, name)), class).ok_or(StoreError::Refused)?;
    if !key.set_value(b.as_value()) {
        // SAFETY: Redis refused the value, so the block is still only ours.
        drop(unsafe { b.free() });
        return Err(StoreError::Refused);
    }
    Ok(b)
}

/// [`create`] for a new key held by `grant` alone (exclusive or shared, made by this
/// command): its block is written in the compact form straight from the grant.
#[inline(always)]
pub fn create_lone(
    key: &mut Key,
    grant: &Grant,
    mode: Mode,
    db: c_int,
    name: &[u8],
    class: ClassRef,
) -> Result<RecordPtr, StoreError> {
    let b = RecordPtr::new_lone(grant, mode, db, name, class).ok_or(StoreError::Refused)?;
    if !key.set_value(b.as_value()) {
        // SAFETY: Redis refused the value, so the block is still only ours.
        drop(unsafe { b.free() });
        return Err(StoreError::Refused);
    }
    Ok(b)
}

/// Put the lock of `key` (whose block is `old`) in a new block named `db`/`name` (RENAME and
/// the like), calling `moved(old, new)` once Redis holds the new block (to move `old`'s index
/// entry to it) and freeing `old` after. `None`: no memory, or Redis refused (then `old`
/// stays as it was). The key must be open for writing.
pub fn rename_in(
    key: &mut Key,
    old: RecordPtr,
    db: c_int,
    name: &[u8],
    moved: impl FnOnce(RecordPtr, RecordPtr),
) -> Option<RecordPtr> {
    // `old` is live (the invariant); it must also be this key's value (a live block is the
    // value of one key only, so the pointers alone tell).
    if key.raw_value() != old.as_value() {
        return None;
    }
    // SAFETY: the key's live block (checked just above).
    let new = unsafe { old.renamed(db, name) }?;
    match key.replace_value(new.as_value()) {
        Some(_) => {
            moved(old, new);
            // SAFETY: out of the keyspace and the index now; a full form's box went to `new`
            // as a copy, so `old` frees its own.
            drop(unsafe { old.free() });
            Some(new)
        }
        None => {
            // SAFETY: Redis did not take it.
            drop(unsafe { new.free() });
            None
        }
    }
}

/// Put `rec` in place of the lock under `key` (open for writing, holding a lock of ours), in
/// the form that fits it: the state an operation made of a compact lock (its one grant
/// decoded) goes back into the same block. False when the key holds no lock of ours.
pub fn put(key: &mut Key, mut rec: LockRecord) -> bool {
    let Found::Lock(b) = block_of(key) else {
        return false;
    };
    // SAFETY: a live block of the open key, which `key`'s exclusive borrow keeps unchanged
    // by anyone else; a full form's box is taken out of the body before the new record is
    // stored, so the body holds no box when `store` runs.
    unsafe {
        if let Some(old) = b.take_box() {
            // The waiters' key stays with the value (its free must tell them).
            if rec.watched.is_none() {
                rec.watched = old.watched;
            }
        }
        b.store(rec);
    }
    true
}
