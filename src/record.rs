//! The value stored under a lock key: the engine's state plus what this server keeps beside
//! it (its timer entry, whether clients wait for it). Reached only through an open [`Key`],
//! whose borrow bounds every reference into the record.

use crate::ffi::{Key, KeyKind};
use crate::server;
use flock_core::lock_stats::ClassRef;
use flock_core::LockState;
use std::os::raw::c_int;

/// A key by database and name, owned (it outlives commands: waiter queues, deferred jobs).
pub type KeyId = (c_int, Vec<u8>);

/// What this server keeps of a record beside its state, which Redis never sees: its
/// deadline-index entry (see `expiry.rs`) and its FLOCK.STATS class.
#[derive(Debug, Default)]
pub struct TimerSlot {
    /// The lock class of the key, found on its first counted event (see `ClassRef`); cleared
    /// when the record is put under another name (`expiry::rearm`), whose class may differ.
    pub class: ClassRef,
    /// The index entry (0: none) and when it is due, on the monotonic clock. Handles are
    /// unique, so an entry that comes due acts only on the record that holds its handle.
    pub handle: u64,
    pub at_us: u64,
}

#[derive(Debug)]
pub struct LockRecord {
    pub state: LockState,
    pub timer: TimerSlot,
    /// Set once clients wait for this value's key (and only then are the wait queues
    /// consulted, which keeps the uncontended path off the registry): the key to look at
    /// again when the value is freed (deleted, overwritten by another type, flushed, evicted).
    pub watched: Option<Box<KeyId>>,
}

impl LockRecord {
    pub fn new(state: LockState) -> LockRecord {
        LockRecord {
            state,
            timer: TimerSlot::default(),
            watched: None,
        }
    }

    pub fn boxed(state: LockState) -> *mut LockRecord {
        Box::into_raw(Box::new(LockRecord::new(state)))
    }
}

/// What an open key holds.
pub enum Found<T> {
    Lock(T),
    Nothing,
    OtherType,
}

/// The lock record of `key`, borrowed from it.
pub fn lock_of(key: &Key) -> Found<&LockRecord> {
    match key.kind(server::lock_type()) {
        KeyKind::Empty => Found::Nothing,
        KeyKind::Other => Found::OtherType,
        // SAFETY: every value of our type is a `LockRecord` boxed by this module.
        KeyKind::Ours => match unsafe { key.value::<LockRecord>() } {
            Some(rec) => Found::Lock(rec),
            None => Found::Nothing,
        },
    }
}

/// The lock record of `key`, mutably borrowed from it.
pub fn lock_of_mut(key: &mut Key) -> Found<&mut LockRecord> {
    match key.kind(server::lock_type()) {
        KeyKind::Empty => Found::Nothing,
        KeyKind::Other => Found::OtherType,
        // SAFETY: every value of our type is a `LockRecord` boxed by this module.
        KeyKind::Ours => match unsafe { key.value_mut::<LockRecord>() } {
            Some(rec) => Found::Lock(rec),
            None => Found::Nothing,
        },
    }
}

/// The lock record of a key already known to hold our type (saves asking Redis for the
/// key's type twice on the write path).
///
/// # Safety
/// `key.kind(server::lock_type())` must have been `KeyKind::Ours`, with the key unchanged
/// since.
pub unsafe fn lock_of_ours(key: &mut Key) -> Option<&mut LockRecord> {
    // SAFETY: by the caller, the value is a `LockRecord` boxed by this module.
    unsafe { key.value_mut::<LockRecord>() }
}

/// Why [`create`] stored nothing.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StoreError {
    /// Redis would not store the value.
    Refused,
}

/// Store a fresh record with `state` under the (empty, writable) `key`.
pub fn create(key: &mut Key, state: LockState) -> Result<&mut LockRecord, StoreError> {
    let rec = LockRecord::boxed(state);
    if !key.set_value(server::lock_type(), rec.cast()) {
        // SAFETY: Redis refused the value, so we still own the box made above.
        drop(unsafe { Box::from_raw(rec) });
        return Err(StoreError::Refused);
    }
    // SAFETY: Redis now owns the record and keeps it while the key is open and unchanged;
    // the returned borrow is tied to the exclusive borrow of the key, so the key cannot be
    // deleted or overwritten while it lives. (Saves asking Redis for the value just stored.)
    unsafe { rec.as_mut() }.ok_or(StoreError::Refused)
}
