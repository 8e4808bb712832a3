//! Connection-bound grants (BOUND, G11): which client connection holds which bound grant, so
//! that when a connection closes its grants end within milliseconds.
//!
//! The binding is memory of this process and never travels: each bound grant carries it in
//! the lock value (`Binding::Client`), which follows the value through RENAME, MOVE and
//! SWAPDB; this index only says where to look when a connection closes: client id -> its
//! (token, key) pairs. The engine says when a grant is bound and unbound (`Effect::Bind`/`Unbind`); an
//! entry left behind by a rename is corrected by the keyspace event (see `events.rs`), and an
//! entry whose grant is gone is harmless (the engine ends only grants still bound to that
//! client). Closing a connection with k bound grants costs O(k).

use super::key_name::KeyName;
use crate::ffi::block::KeyId;
use crate::ffi::{self, Ctx};
use std::cell::RefCell;
use std::collections::HashMap;
use std::ffi::c_int;
use std::hash::{BuildHasherDefault, Hasher};
use std::sync::atomic::{AtomicU64, Ordering};

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

/// The bound grants of one connection, in the order they were bound. Binding appends (no
/// hash table insert, which is a cache miss per grant once a connection holds thousands);
/// unbinding pops the newest entry when it is the one (a lock taken and released), else
/// notes the token as gone, and the list is compacted once the gone ones outnumber the
/// live ones, so it never holds more than about twice the live grants.
#[derive(Default)]
struct Bound {
    /// (token, database, key name): the name inline when short, so binding a grant
    /// allocates nothing but the list's growth.
    grants: Vec<(u64, c_int, KeyName)>,
    /// The entries unbound out of order, by [`Gone::of`]: a token alone is not enough, as
    /// COPY gives the copy the same tokens (its unbound grants), and one connection may then
    /// hold a bound grant of the same token on both keys.
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
    /// tokens listed; saturating all the same).
    fn live(&self) -> usize {
        self.grants.len().saturating_sub(self.gone.len())
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
type Index = Ids<Bound>;

thread_local! {
    // Bound grants are made, ended and looked up only on Redis's main thread (commands,
    // timers, the client-change event), so the index is that thread's and needs no lock.
    static INDEX: RefCell<Index> = RefCell::new(Index::default());
}

fn with_index<R>(f: impl FnOnce(&mut Index) -> R) -> R {
    INDEX.with(|ix| f(&mut ix.borrow_mut()))
}

/// The grant `token` of `key` is bound to connection `client` (a token is bound once: the
/// engine binds a grant when it is made or rebound to another connection).
pub fn bind(client: u64, token: u64, db: c_int, key: &[u8]) {
    with_index(|idx| {
        let b = idx.entry(client).or_default();
        if !b.gone.is_empty() {
            b.gone.remove(&Gone::of(token, db, key));
        }
        b.grants.push((token, db, KeyName::new(key)));
    });
}

/// The grant `token` of `key` in database `db` is no longer bound to `client`.
pub fn unbind(client: u64, token: u64, db: c_int, key: &[u8]) {
    with_index(|idx| {
        let Some(b) = idx.get_mut(&client) else {
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
        if b.live() == 0 {
            idx.remove(&client);
        }
    });
}

/// The grant `token` bound to `client` now lives under `key` (RENAME, MOVE).
pub fn moved(client: u64, token: u64, db: c_int, key: &[u8]) {
    with_index(|idx| {
        if let Some(entry) = idx
            .get_mut(&client)
            .and_then(|b| b.grants.iter_mut().rev().find(|(t, _, _)| *t == token))
        {
            entry.1 = db;
            entry.2 = KeyName::new(key);
        }
    });
}

/// SWAPDB swapped databases `a` and `b`: the values, and so their bindings, changed database.
pub fn swap_dbs(a: c_int, b: c_int) {
    with_index(|idx| {
        for bound in idx.values_mut() {
            for (_, db, _) in bound.grants.iter_mut() {
                if *db == a {
                    *db = b;
                } else if *db == b {
                    *db = a;
                }
            }
        }
    });
}

/// Connection `client` closed: the keys of its bound grants, each once (the index forgets
/// the client).
pub fn take(client: u64) -> Vec<KeyId> {
    let Some(b) = with_index(|idx| idx.remove(&client)) else {
        return Vec::new();
    };
    let mut keys: Vec<KeyId> = b
        .grants
        .into_iter()
        .filter(|(t, db, name)| !b.gone.contains_key(&Gone::of(*t, *db, name.bytes())))
        .map(|(_, db, name)| (db, name.bytes().to_vec()))
        .collect();
    keys.sort();
    keys.dedup();
    keys
}

/// Whether any connection holds a bound grant (lets a key's departure skip decoding it).
pub fn any() -> bool {
    with_index(|idx| !idx.is_empty())
}

/// Bound grants this index knows of (INFO `bound_grants`).
pub fn count() -> usize {
    with_index(|idx| idx.values().map(Bound::live).sum())
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
