//! Connection-bound grants (BOUND, G11): which client connection holds which bound grant, so
//! that when a connection closes its grants end within milliseconds.
//!
//! The binding is memory of this process and never travels: each bound grant carries it in
//! the lock value (`Binding::Client`), which follows the value through RENAME, MOVE and
//! SWAPDB; this index only says where to look when a connection closes: client id -> (token
//! -> key). The engine says when a grant is bound and unbound (`Effect::Bind`/`Unbind`); an
//! entry left behind by a rename is corrected by the keyspace event (see `events.rs`), and an
//! entry whose grant is gone is harmless (the engine ends only grants still bound to that
//! client). Closing a connection with k bound grants costs O(k).

use crate::record::KeyId;
use std::collections::HashMap;
use std::sync::{Mutex, MutexGuard};

type Index = HashMap<u64, HashMap<u64, KeyId>>;

static INDEX: Mutex<Option<Index>> = Mutex::new(None);

fn index() -> MutexGuard<'static, Option<Index>> {
    INDEX.lock().unwrap_or_else(|p| p.into_inner())
}

/// The grant `token` of `key` is bound to connection `client`.
pub fn bind(client: u64, token: u64, key: KeyId) {
    index()
        .get_or_insert_with(HashMap::new)
        .entry(client)
        .or_default()
        .insert(token, key);
}

/// The grant `token` is no longer bound to `client`.
pub fn unbind(client: u64, token: u64) {
    let mut guard = index();
    let Some(idx) = guard.as_mut() else {
        return;
    };
    if let Some(grants) = idx.get_mut(&client) {
        grants.remove(&token);
        if grants.is_empty() {
            idx.remove(&client);
        }
    }
}

/// The grant `token` bound to `client` now lives under `key` (RENAME, MOVE).
pub fn moved(client: u64, token: u64, key: KeyId) {
    if let Some(entry) = index()
        .as_mut()
        .and_then(|idx| idx.get_mut(&client))
        .and_then(|grants| grants.get_mut(&token))
    {
        *entry = key;
    }
}

/// Connection `client` closed: the keys of its bound grants, each once (the index forgets
/// the client).
pub fn take(client: u64) -> Vec<KeyId> {
    let Some(grants) = index().as_mut().and_then(|idx| idx.remove(&client)) else {
        return Vec::new();
    };
    let mut keys: Vec<KeyId> = grants.into_values().collect();
    keys.sort();
    keys.dedup();
    keys
}

/// Bound grants this index knows of (INFO `bound_grants`).
pub fn count() -> usize {
    index()
        .as_ref()
        .map_or(0, |idx| idx.values().map(HashMap::len).sum())
}
