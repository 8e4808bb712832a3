//! Locking the crate's std mutexes (a lease's clock, the shared connection slot). Their
//! critical sections are a few assignments of plain values, never held across an await, so a
//! mutex poisoned by a panic elsewhere still holds consistent values: it is used as it is,
//! rather than turning one panic into a panic in every lease.

use std::sync::{Mutex, MutexGuard};

pub(crate) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}
