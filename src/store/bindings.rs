//! Connection-bound grants (BOUND, G11): the module's one bindings index
//! ([`flock_core::bindings::BindingIndex`], whose rules and tests live in flock-core), kept
//! on Redis's main thread and fed by the engine's `Bind`/`Unbind` effects and by the keyspace
//! events that move a value (RENAME, MOVE, SWAPDB: see `events.rs`). When a connection closes,
//! the keys of its bound grants are looked at and those grants end within milliseconds.

use crate::ffi::block::KeyId;
use crate::ffi::{self, Ctx};
use flock_core::bindings::BindingIndex;
use std::cell::RefCell;
use std::ffi::c_int;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

thread_local! {
    // Bound grants are made, ended and looked up only on Redis's main thread (commands,
    // timers, the client-change event), so the index is that thread's and needs no lock.
    static INDEX: RefCell<BindingIndex> = RefCell::new(BindingIndex::default());
}

/// Whether the index holds any binding, kept beside it by every change ([`with_index`]):
/// every lock key's departure asks ([`any`]), and a load is cheaper than reaching the
/// thread-local index (its lazy initialisation check and the `RefCell` borrow).
static NOT_EMPTY: AtomicBool = AtomicBool::new(false);

fn with_index<R>(f: impl FnOnce(&mut BindingIndex) -> R) -> R {
    INDEX.with(|ix| {
        let mut idx = ix.borrow_mut();
        let r = f(&mut idx);
        NOT_EMPTY.store(!idx.is_empty(), Ordering::Relaxed);
        r
    })
}

/// The grant `token` of `key` in database `db` is bound to connection `client`.
pub fn bind(client: u64, token: u64, db: c_int, key: &[u8]) {
    with_index(|idx| idx.bind(client, token, (db, key)));
}

/// The grant `token` of `key` in database `db` is no longer bound to `client`.
pub fn unbind(client: u64, token: u64, db: c_int, key: &[u8]) {
    with_index(|idx| idx.unbind(client, token, (db, key)));
}

/// The grant `token` of `from` bound to `client` now lives under `to` (RENAME, MOVE), each
/// key as (database, name): found by key and token, so a COPY's twin keeps its entry.
pub fn moved(client: u64, token: u64, from: (c_int, &[u8]), to: (c_int, &[u8])) {
    with_index(|idx| idx.moved(client, token, from, to));
}

/// SWAPDB swapped databases `a` and `b`: the values, and so their bindings, changed database.
pub fn swap_dbs(a: c_int, b: c_int) {
    with_index(|idx| idx.swap_dbs(a, b));
}

/// Connection `client` closed: the keys of its bound grants, each once (the index forgets
/// the client).
pub fn take(client: u64) -> Vec<KeyId> {
    with_index(|idx| idx.take(client))
}

/// Whether any connection holds a bound grant (lets a key's departure skip decoding it).
#[inline]
pub fn any() -> bool {
    NOT_EMPTY.load(Ordering::Relaxed)
}

/// Bound grants this index knows of (INFO `bound_grants`).
pub fn count() -> usize {
    with_index(|idx| idx.count())
}

/// The id of the client connection behind `ctx`, or `None` when there is none: a script, a
/// function or a module's call runs on a client of the server's own, which is not in the
/// server's client table (BOUND needs a real connection to live with).
pub fn client_connection(ctx: Ctx<'_>) -> Option<u64> {
    let flags = ctx.flags();
    if flags.is_lua() || flags.is_replicated() {
        return None;
    }
    let id = ctx.client_id();
    if id == 0 {
        return None;
    }
    // A client that sends one BOUND request usually sends more (pipelines, many locks): the
    // last id found in the client table is remembered. Sound because ids are never reused
    // and a server's own clients (scripts, module calls) are never in that table.
    if LAST_CONNECTION.load(Ordering::Relaxed) == id {
        return Some(id);
    }
    if !ffi::is_connected_client(id) {
        return None;
    }
    LAST_CONNECTION.store(id, Ordering::Relaxed);
    Some(id)
}

/// The id of the last client found to be a real connection (see [`client_connection`]).
static LAST_CONNECTION: AtomicU64 = AtomicU64::new(0);
