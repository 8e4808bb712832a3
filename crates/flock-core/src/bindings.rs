//! The index of connection-bound grants (BOUND, G11): which client connection holds which
//! bound grant, so that when a connection closes its grants end within milliseconds. The
//! module keeps one, on Redis's main thread, fed by the engine's `Bind`/`Unbind` effects and
//! by the keyspace events that move a value (RENAME, MOVE, SWAPDB).
//!
//! A grant is its key and its token, never its token alone: COPY gives the copy the tokens of
//! its unbound grants, and the holder of such a twin may bind it again (a repeated ACQUIRE
//! with BOUND), so one connection may hold a bound grant of the same token under two keys.
//! Unbinding and moving one twin must leave the other's entry alone.
//!
//! The binding itself lives in the lock value (`Binding::Client`), which follows the value;
//! this index only says where to look when a connection closes: client id -> its (token,
//! key) entries. An entry whose grant is gone is harmless (the engine ends only grants still
//! bound to that client). Closing a connection with k bound grants costs O(k).

use crate::key_name::KeyName;
use std::collections::HashMap;
use std::ffi::c_int;
use std::hash::{BuildHasherDefault, Hasher};

/// Client ids and tokens are numbers the server hands out, never chosen by a client, so a
/// multiplicative hash is enough (SipHash would guard against keys no client can pick).
#[derive(Default, Clone, Copy)]
struct IdHasher(u64);

impl Hasher for IdHasher {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = (self.0.rotate_left(5) ^ u64::from(b)).wrapping_mul(0x51_7c_c1_b7_27_22_0a_95);
        }
    }
    fn write_u64(&mut self, v: u64) {
        self.0 = (self.0 ^ v).wrapping_mul(0x9e37_79b9_7f4a_7c15);
    }
}

type Ids<V> = HashMap<u64, V, BuildHasherDefault<IdHasher>>;

/// A key as the index names it: its database and name.
pub type KeyAt<'a> = (c_int, &'a [u8]);

/// The bound grants of one connection, in the order they were bound. Binding appends (no
/// hash table insert, which is a cache miss per grant once a connection holds thousands);
/// unbinding pops the newest entry when it is the one (a lock taken and released), else
/// notes the entry as gone, and the list is compacted once the gone ones outnumber the
/// live ones, so it never holds more than about twice the live grants.
#[derive(Default)]
struct Bound {
    /// (token, database, key name): the name inline when short, so binding a grant
    /// allocates nothing but the list's growth.
    grants: Vec<(u64, c_int, KeyName)>,
    /// The entries unbound out of order, by [`Gone::of`] (token and key: see the module
    /// docs on twins).
    gone: HashMap<Gone, ()>,
}

/// An entry of [`Bound::grants`] as `gone` knows it: token, database and the key name's hash
/// (two keys of one database with the same name hash and the same bound token would be
/// needed to mix two entries up).
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
struct Gone(u64, c_int, u64);

impl Gone {
    fn of(token: u64, db: c_int, key: &[u8]) -> Gone {
        Gone(token, db, std::hash::BuildHasher::hash_one(&NAME_HASH, key))
    }
}

/// Fixed keys: the hash only tells apart names already in one connection's list.
static NAME_HASH: std::hash::BuildHasherDefault<std::collections::hash_map::DefaultHasher> =
    std::hash::BuildHasherDefault::new();

impl Bound {
    /// Live entries (the engine unbinds only what it bound, so `gone` is a subset of the
    /// entries listed; saturating, and checked by [`Bound::settle_empty`] before a connection
    /// is forgotten, in case a grant was unbound twice).
    fn live(&self) -> usize {
        self.grants.len().saturating_sub(self.gone.len())
    }

    fn is_gone(&self, token: u64, db: c_int, key: &[u8]) -> bool {
        !self.gone.is_empty() && self.gone.contains_key(&Gone::of(token, db, key))
    }

    /// Whether the connection really holds no bound grant, once [`Bound::live`] says so. An
    /// unbind of an entry no longer listed (a grant unbound twice) leaves a gone mark that
    /// matches nothing, and `live` then counts one too few: the connection's other bound
    /// grants must not be forgotten for it (G11: they would outlive the connection). So the
    /// list is compacted here and only an empty one counts. Cheap: with `live` at 0 the gone
    /// marks are as many as the entries, at most 16 past the last compaction.
    fn settle_empty(&mut self) -> bool {
        let gone = std::mem::take(&mut self.gone);
        self.grants
            .retain(|(t, db, name)| !gone.contains_key(&Gone::of(*t, *db, name.bytes())));
        self.grants.is_empty()
    }

    fn compact_if_sparse(&mut self) {
        if self.gone.len() > self.live() + 16 {
            let gone = std::mem::take(&mut self.gone);
            self.grants
                .retain(|(t, db, name)| !gone.contains_key(&Gone::of(*t, *db, name.bytes())));
        }
    }
}

/// Client id -> its bound grants.
#[derive(Default)]
pub struct BindingIndex {
    by_client: Ids<Bound>,
}

impl BindingIndex {
    /// The grant `token` of `key` is bound to connection `client` (a grant is bound once:
    /// the engine binds it when it is made or rebound to another connection).
    pub fn bind(&mut self, client: u64, token: u64, (db, key): KeyAt<'_>) {
        let b = self.by_client.entry(client).or_default();
        if !b.gone.is_empty() {
            b.gone.remove(&Gone::of(token, db, key));
        }
        b.grants.push((token, db, KeyName::new(key)));
    }

    /// The grant `token` of `key` is no longer bound to `client`.
    pub fn unbind(&mut self, client: u64, token: u64, (db, key): KeyAt<'_>) {
        let Some(b) = self.by_client.get_mut(&client) else {
            return;
        };
        let newest = b
            .grants
            .last()
            .is_some_and(|(t, d, name)| *t == token && *d == db && name.bytes() == key);
        if newest {
            b.grants.pop();
        } else {
            b.gone.insert(Gone::of(token, db, key), ());
            b.compact_if_sparse();
        }
        if b.live() == 0 && b.settle_empty() {
            self.by_client.remove(&client);
        }
    }

    /// The grant `token` of `from` bound to `client` now lives under `to` (RENAME, MOVE).
    /// Found by key and token, as [`BindingIndex::unbind`] finds it: a COPY's twin of the same
    /// token under another key keeps its entry.
    pub fn moved(&mut self, client: u64, token: u64, from: KeyAt<'_>, to: KeyAt<'_>) {
        if from == to {
            return;
        }
        let Some(b) = self.by_client.get_mut(&client) else {
            return;
        };
        let is = |(t, d, name): &(u64, c_int, KeyName), (db, key): KeyAt<'_>| {
            *t == token && *d == db && name.bytes() == key
        };
        // Entries of this token under `to` already are those of the value the move
        // overwrote (its grants ended without the engine hearing of it): dropped with their
        // gone mark, so that the moved grant's entry is `to`'s only one of this token.
        if b.grants.iter().any(|e| is(e, to)) {
            b.grants.retain(|e| !is(e, to));
            b.gone.remove(&Gone::of(token, to.0, to.1));
        }
        if let Some(entry) = b.grants.iter_mut().rev().find(|e| is(e, from)) {
            entry.1 = to.0;
            entry.2 = KeyName::new(to.1);
        }
        if b.live() == 0 && b.settle_empty() {
            self.by_client.remove(&client);
        }
    }

    /// SWAPDB swapped databases `a` and `b`: the values, and so their bindings, changed
    /// database.
    pub fn swap_dbs(&mut self, a: c_int, b: c_int) {
        for bound in self.by_client.values_mut() {
            for (_, db, _) in bound.grants.iter_mut() {
                if *db == a {
                    *db = b;
                } else if *db == b {
                    *db = a;
                }
            }
            // The gone marks name databases too.
            let gone = std::mem::take(&mut bound.gone);
            bound.gone = gone
                .into_keys()
                .map(|Gone(t, db, h)| {
                    let db = if db == a {
                        b
                    } else if db == b {
                        a
                    } else {
                        db
                    };
                    (Gone(t, db, h), ())
                })
                .collect();
        }
    }

    /// Connection `client` closed: the keys of its bound grants, each once, sorted (the index
    /// forgets the client).
    pub fn take(&mut self, client: u64) -> Vec<(c_int, Vec<u8>)> {
        let Some(b) = self.by_client.remove(&client) else {
            return Vec::new();
        };
        let mut keys: Vec<(c_int, Vec<u8>)> = b
            .grants
            .iter()
            .filter(|(t, db, name)| !b.is_gone(*t, *db, name.bytes()))
            .map(|(_, db, name)| (*db, name.bytes().to_vec()))
            .collect();
        keys.sort();
        keys.dedup();
        keys
    }

    /// Whether no connection is known to hold a bound grant (a key's departure then skips
    /// looking for its bound grants). A client whose grants all ended may linger until its
    /// connection closes, so this can say false with no live binding; never true with one.
    pub fn is_empty(&self) -> bool {
        self.by_client.is_empty()
    }

    /// Bound grants the index knows of (INFO `bound_grants`).
    pub fn count(&self) -> usize {
        self.by_client.values().map(Bound::live).sum()
    }
}

#[cfg(test)]
mod tests;
