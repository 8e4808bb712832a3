//! Clients blocked in FLOCK.WATCH: a registry of watchers by key, and their delivery.
//!
//! What a watcher is told is flock-core's `watch` rule; here it is kept and delivered. A
//! change to a watched key reaches [`key_changed`] from the executor, right after the
//! operation that made it (the same command, no polling), with the grants the operation ended
//! and how ([`note`]). A key changed by Redis itself (DEL, UNLINK, FLUSHALL, eviction, RENAME
//! away, MIGRATE) is looked at from a zero-delay timer right after the command ([`look_soon`]).
//!
//! A watcher is unblocked once, with its id; its answer is read when Redis asks for the
//! reply, which it does after the command (or MULTI/EXEC, or script) is over: until then a
//! pair earlier in argument order that fires too takes the answer's place, so the first
//! firing pair in argument order is the reply.
//!
//! When nobody watches anything, the executor pays one relaxed atomic load per operation
//! ([`any`]) and nothing else: an unwatched key pays nothing for watching.

use crate::ffi::block::{self, Found, KeyId};
use crate::ffi::{self, BlockedClient, Ctx, Key, RStr, RString, Status};
use crate::server::{self, config};
use flock_core::engine::{Effect, Outcome};
use flock_core::errors::Fixed;
use flock_core::watch::{self, Fired, WatchEvent};
use smallvec::SmallVec;
use std::collections::HashMap;
use std::ffi::c_int;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Mutex, MutexGuard, OnceLock};

/// One watched pair: the key (database and name), the token (0: "held"), and the watched
/// grant's owner. 48 bytes: the name is a boxed slice (no capacity kept), the database beside
/// the flag.
pub struct Pair {
    pub name: Box<[u8]>,
    pub owner: Box<[u8]>,
    pub token: u64,
    pub db: c_int,
    /// The watch began on a replica (see `watch::after_change`).
    pub on_replica: bool,
}

/// A watcher's pairs: one inline (the common case: a holder watching its own grant), so an
/// idle watcher costs no allocation for them.
pub type Pairs = SmallVec<[Pair; 1]>;

/// A blocked watcher: 128 bytes, kept boxed in the registry (see `Registry::watchers`).
struct Watcher {
    /// The blocked client, until it is unblocked (then Redis asks for the reply).
    bc: Option<BlockedClient<Watching>>,
    client_id: u64,
    pairs: Pairs,
    /// The answer so far: what the firing pair first in argument order says (its index is
    /// `answer_at`).
    answer: Option<Fired>,
    timer: u64,
    /// When the timeout is due on the monotonic clock (0: none); the cron checks it too.
    deadline_us: u64,
    /// The index of the pair that `answer` is for (at most `watch::MAX_PAIRS`).
    answer_at: u8,
    /// An error instead (TRYAGAIN, UNBLOCKED).
    error: Option<Fixed>,
}

/// Take pair `i`'s answer `f` if it comes first in argument order (the answer so far is for
/// pair `at`).
fn offer(answer: &mut Option<Fired>, at: &mut u8, i: usize, f: Fired) {
    let current = answer.as_ref().map(|_| usize::from(*at));
    if watch::first_in_order(current, i) {
        if let Ok(i) = u8::try_from(i) {
            *at = i;
            *answer = Some(f);
        }
    }
}

#[derive(Default)]
struct Registry {
    /// Watcher ids by database, then key name (a watcher of two pairs on one key is listed
    /// once per pair).
    /// Two ids inline: most watched keys have one or two watchers.
    by_key: HashMap<c_int, HashMap<Vec<u8>, SmallVec<[u64; 2]>>>,
    /// Boxed: a table slot is 16 bytes and the watcher one allocation of its own size, where
    /// an unboxed slot would be the watcher's size times the table's spare room (a hash table
    /// grows to twice what it holds).
    watchers: HashMap<u64, Box<Watcher>>,
    by_client: HashMap<u64, u64>,
    next_id: u64,
}

impl Registry {
    fn of_key(&self, db: c_int, name: &[u8]) -> Option<&[u64]> {
        self.by_key.get(&db)?.get(name).map(|ids| &ids[..])
    }

    /// Take watcher `id` out of every index; the caller owns it from now on.
    fn remove(&mut self, id: u64) -> Option<Box<Watcher>> {
        let w = self.watchers.remove(&id)?;
        if self.by_client.get(&w.client_id) == Some(&id) {
            self.by_client.remove(&w.client_id);
        }
        for p in &w.pairs {
            let Some(per_db) = self.by_key.get_mut(&p.db) else {
                continue;
            };
            if let Some(ids) = per_db.get_mut(&p.name[..]) {
                ids.retain(|i| *i != id);
                if ids.is_empty() {
                    per_db.remove(&p.name[..]);
                }
            }
            if per_db.is_empty() {
                self.by_key.remove(&p.db);
            }
        }
        Some(w)
    }
}

static REGISTRY: Mutex<Option<Registry>> = Mutex::new(None);
/// Watchers in the registry: lets every operation skip it when nobody watches.
static WATCHING: AtomicUsize = AtomicUsize::new(0);
/// The ending events of the operation running now, while someone watches ([`note`]).
static ENDED: Mutex<Vec<(u64, WatchEvent)>> = Mutex::new(Vec::new());
/// Keys changed by Redis itself, looked at from a zero-delay timer.
static LOOKS: Mutex<Vec<KeyId>> = Mutex::new(Vec::new());
/// Whether this node still serves a key's slot (set at init: the cluster check lives above).
static SERVES: OnceLock<fn(Ctx<'_>, &[u8]) -> bool> = OnceLock::new();

struct RegistryGuard(MutexGuard<'static, Option<Registry>>);

impl RegistryGuard {
    fn get(&mut self) -> &mut Registry {
        self.0.get_or_insert_with(Registry::default)
    }
}

impl Drop for RegistryGuard {
    fn drop(&mut self) {
        let n = self.0.as_ref().map_or(0, |r| r.watchers.len());
        if n == 0 {
            // Nobody watches: the tables go too, with the room they grew (G10).
            *self.0 = None;
        }
        WATCHING.store(n, Ordering::Relaxed);
    }
}

fn registry() -> RegistryGuard {
    RegistryGuard(REGISTRY.lock().unwrap_or_else(|p| p.into_inner()))
}

/// Whether anyone watches anything (one relaxed load: the executor's only cost).
#[inline(always)]
pub fn any() -> bool {
    WATCHING.load(Ordering::Relaxed) != 0
}

/// Clients blocked in FLOCK.WATCH now.
pub fn watching_now() -> usize {
    WATCHING.load(Ordering::Relaxed)
}

/// Set how to tell whether this node still serves a key's slot (the cluster's check).
pub fn set_slot_check(check: fn(Ctx<'_>, &[u8]) -> bool) {
    let _ = SERVES.set(check);
}

/// Watchers of `db`/`name` now.
pub fn count(db: c_int, name: &[u8]) -> usize {
    if !any() {
        return 0;
    }
    registry().get().of_key(db, name).map_or(0, <[u64]>::len)
}

/// Keep the grants `out` ends and how, for [`key_changed`] after the operation.
#[inline(always)]
pub fn note(out: &Outcome) {
    if any() {
        note_ends(out);
    }
}

#[cold]
#[inline(never)]
fn note_ends(out: &Outcome) {
    let mut ended = ENDED.lock().unwrap_or_else(|p| p.into_inner());
    for effect in out.effects.as_slice() {
        if let Effect::Notify(event) = effect {
            ended.extend(watch::ended_by(*event));
        }
    }
}

/// The key `key_name` (open as `key`) was changed by an operation: tell its watchers what
/// the rule says, from its state now and the ends [`note`] kept.
#[cold]
#[inline(never)]
pub fn key_changed(ctx: Ctx<'_>, key_name: RStr<'_>, key: &Key) {
    let ended = std::mem::take(&mut *ENDED.lock().unwrap_or_else(|p| p.into_inner()));
    let db = ctx.selected_db();
    let name = ffi::bytes(&key_name);
    if count(db, name) == 0 {
        return;
    }
    let now = server::now();
    let found = block::lock_of(key);
    let state = match &found {
        Found::Lock(s) => Some(&**s),
        _ => None,
    };
    let mut guard = registry();
    let reg = guard.get();
    let ids: SmallVec<[u64; 2]> = reg
        .of_key(db, name)
        .map(SmallVec::from_slice)
        .unwrap_or_default();
    for id in ids {
        let Some(w) = reg.watchers.get_mut(&id) else {
            continue;
        };
        let w: &mut Watcher = w;
        for (i, p) in w.pairs.iter().enumerate() {
            if p.db != db || *p.name != *name {
                continue;
            }
            if let Some(f) =
                watch::after_change(state, p.token, &p.owner, &ended, now, p.on_replica)
            {
                offer(&mut w.answer, &mut w.answer_at, i, f);
            }
        }
        if w.answer.is_some() {
            unblock(id, w);
        }
    }
}

/// Unblock watcher `id` (once: its reply callback reads the answer from the registry).
fn unblock(id: u64, w: &mut Watcher) {
    if let Some(bc) = w.bc.take() {
        stop_timer(w);
        bc.unblock(Some(Delivery(id)));
    }
}

fn stop_timer(w: &mut Watcher) {
    if w.timer != 0 {
        if let Some(ctx) = ffi::module_ctx() {
            ffi::stop_timer(ctx, w.timer);
        }
        w.timer = 0;
    }
}

/// Why a watch could not begin.
pub enum Refused {
    /// `flock.max-watchers` clients watch one of its keys.
    TooMany,
    /// The server would not block the client.
    Failed,
}

/// Block the calling client until one of `pairs` fires or `timeout_ms` (0: no limit) passes.
pub fn block(ctx: Ctx<'_>, pairs: Pairs, timeout_ms: u64) -> Result<(), Refused> {
    let mut guard = registry();
    let reg = guard.get();
    let max = config::max_watchers();
    for p in &pairs {
        let n = reg.of_key(p.db, &p.name).map_or(0, <[u64]>::len);
        if !watch::admits(n, max) {
            return Err(Refused::TooMany);
        }
    }
    let Some(bc) = BlockedClient::<Watching>::block(ctx) else {
        return Err(Refused::Failed);
    };
    reg.next_id += 1;
    let id = reg.next_id;
    let timeout_ms = flock_core::queue::block_timeout_ms(timeout_ms);
    let timer = if timeout_ms > 0 {
        let period = i64::try_from(timeout_ms).unwrap_or(i64::MAX);
        ffi::create_timer::<WatchTimeout>(ctx, period, id)
    } else {
        0
    };
    for p in &pairs {
        reg.by_key
            .entry(p.db)
            .or_default()
            .entry(p.name.to_vec())
            .or_default()
            .push(id);
    }
    let client_id = ctx.client_id();
    reg.by_client.insert(client_id, id);
    let deadline_us = if timeout_ms > 0 {
        server::now()
            .mono_us
            .saturating_add(timeout_ms.saturating_mul(1000))
    } else {
        0
    };
    reg.watchers.insert(
        id,
        Box::new(Watcher {
            bc: Some(bc),
            client_id,
            pairs,
            answer: None,
            timer,
            deadline_us,
            answer_at: 0,
            error: None,
        }),
    );
    Ok(())
}

/// Unblock every watcher with an error (`msg`: a fixed text).
pub fn fail_everyone(msg: Fixed) {
    if !any() {
        return;
    }
    let mut guard = registry();
    for (id, w) in guard.get().watchers.iter_mut() {
        if w.bc.is_some() && w.answer.is_none() {
            w.error = Some(msg);
        }
        unblock(*id, w);
    }
}

/// Every watched key (of database `db`, or all).
fn watched_keys(db: Option<c_int>) -> Vec<KeyId> {
    if !any() {
        return Vec::new();
    }
    let mut guard = registry();
    let reg = guard.get();
    reg.by_key
        .iter()
        .filter(|(d, _)| db.is_none_or(|want| **d == want))
        .flat_map(|(d, m)| m.keys().map(move |k| (*d, k.clone())))
        .collect()
}

/// Look at `db`/`name` right after the command (Redis changed it: DEL, RENAME, eviction...).
pub fn look_soon(db: c_int, name: &[u8]) {
    if count(db, name) == 0 {
        return;
    }
    schedule_look((db, name.to_vec()));
}

/// Look at every watched key of `db` (all: `None`) right after the command (a flush).
pub fn look_all_soon(db: Option<c_int>) {
    for k in watched_keys(db) {
        schedule_look(k);
    }
}

fn schedule_look(key: KeyId) {
    let mut looks = LOOKS.lock().unwrap_or_else(|p| p.into_inner());
    let first = looks.is_empty();
    looks.push(key);
    drop(looks);
    if first {
        if let Some(ctx) = ffi::module_ctx() {
            ffi::create_timer::<LookTimer>(ctx, 0, 0);
        }
    }
}

/// The zero-delay timer of [`look_soon`].
struct LookTimer;

impl ffi::Timer for LookTimer {
    fn fire(ctx: Ctx<'_>, _data: u64) {
        run_looks(ctx);
    }
}

/// From the timer (and the cron, as a backstop): look at the keys Redis changed.
pub fn run_looks(ctx: Ctx<'_>) {
    let looks = std::mem::take(&mut *LOOKS.lock().unwrap_or_else(|p| p.into_inner()));
    if looks.is_empty() {
        return;
    }
    let db_before = ctx.selected_db();
    for (db, name) in looks {
        if !ctx.select_db(db) {
            continue;
        }
        let Some(rname) = RString::new(ctx, &name) else {
            continue;
        };
        let key = Key::open(ctx, rname.get(), false);
        let gone = matches!(block::lock_of(&key), Found::Nothing);
        let plan = watch::plan_look(gone, || {
            SERVES.get().is_none_or(|serves| serves(ctx, &name))
        });
        match plan {
            watch::LookPlan::Compare => key_changed(ctx, rname.get(), &key),
            watch::LookPlan::Fail(msg) => fail_key(db, &name, msg),
        }
    }
    ctx.select_db(db_before);
}

/// Unblock every watcher of a key `which` accepts with an error (the key's slot moved away).
pub fn fail_where(which: impl Fn(&[u8]) -> bool, msg: Fixed) {
    for (db, name) in watched_keys(None) {
        if which(&name) {
            fail_key(db, &name, msg);
        }
    }
}

/// Unblock every watcher of `db`/`name` with an error.
fn fail_key(db: c_int, name: &[u8], msg: Fixed) {
    let mut guard = registry();
    let reg = guard.get();
    let ids: SmallVec<[u64; 2]> = reg
        .of_key(db, name)
        .map(SmallVec::from_slice)
        .unwrap_or_default();
    for id in ids {
        if let Some(w) = reg.watchers.get_mut(&id) {
            if w.answer.is_none() {
                w.error = Some(msg);
            }
            unblock(id, w);
        }
    }
}

/// From the cron: time out watchers whose deadline passed on the monotonic clock (a backstop
/// for their timers), and run looks a timer could not be made for.
pub fn on_cron(ctx: Ctx<'_>) {
    if !any() {
        return;
    }
    run_looks(ctx);
    let now = server::now().mono_us;
    let mut guard = registry();
    for (id, w) in guard.get().watchers.iter_mut() {
        if w.deadline_us != 0 && w.deadline_us <= now && w.answer.is_none() {
            unblock(*id, w);
        }
    }
}

/// What a watcher is unblocked with: its id (its answer stays in the registry until the
/// reply, so that an earlier pair can still take its place).
struct Delivery(u64);

/// The watcher's timeout: nil, unless a pair fired first.
struct WatchTimeout;

impl ffi::Timer for WatchTimeout {
    fn fire(_ctx: Ctx<'_>, id: u64) {
        let mut guard = registry();
        if let Some(w) = guard.get().watchers.get_mut(&id) {
            // The timer is spent: unblocking must not stop it.
            w.timer = 0;
            unblock(id, w);
        }
    }
}

/// Take the calling client's watcher out of the registry.
fn leave_by_client(ctx: Ctx<'_>) -> Option<Box<Watcher>> {
    let client_id = ctx.client_id();
    let mut guard = registry();
    let reg = guard.get();
    let id = *reg.by_client.get(&client_id)?;
    reg.remove(id)
}

/// Reply `[key, event, owner, token]` for `f` on `key`.
fn reply_fired(ctx: Ctx<'_>, key: &[u8], f: &Fired) -> Status {
    ffi::reply_array(ctx, 4);
    ffi::reply_bulk(ctx, key);
    ffi::reply_bulk(ctx, f.event.name().as_bytes());
    match &f.owner {
        Some(o) => ffi::reply_bulk(ctx, o),
        None => ffi::reply_null(ctx),
    };
    ffi::reply_int(ctx, f.token as i64)
}

/// Reply for one pair that fired at the call (WATCH's immediate answer).
pub fn reply_now(ctx: Ctx<'_>, key: &[u8], f: &Fired) -> Status {
    reply_fired(ctx, key, f)
}

/// The callbacks of a blocked FLOCK.WATCH client.
struct Watching;

impl ffi::BlockedClientHandler for Watching {
    type Data = Delivery;

    fn reply(ctx: Ctx<'_>, data: Option<&mut Delivery>) -> Status {
        let w = data.and_then(|d| registry().get().remove(d.0));
        let Some(w) = w else {
            return ffi::reply_null(ctx);
        };
        if let Some(f) = &w.answer {
            if let Some(p) = w.pairs.get(usize::from(w.answer_at)) {
                return reply_fired(ctx, &p.name, f);
            }
        }
        match w.error {
            Some(msg) => ffi::reply_error_string(ctx, msg.as_str()),
            None => ffi::reply_null(ctx),
        }
    }

    /// CLIENT UNBLOCK: nil, and the watcher leaves.
    fn unblocked(ctx: Ctx<'_>) -> Status {
        if let Some(mut w) = leave_by_client(ctx) {
            stop_timer(&mut w);
            // Every blocked client is unblocked once, also one Redis unblocked itself.
            if let Some(bc) = w.bc.take() {
                bc.unblock(None);
            }
        }
        ffi::reply_null(ctx)
    }

    /// The client went away while watching: it leaves, and nothing is left of it.
    fn disconnected(ctx: Ctx<'_>) {
        if let Some(mut w) = leave_by_client(ctx) {
            stop_timer(&mut w);
            if let Some(bc) = w.bc.take() {
                bc.unblock(None);
            }
        }
    }

    /// Redis is done with the watcher (after its reply, or without one when its client went
    /// away after it was unblocked): whatever is left of it goes.
    fn free(data: Box<Delivery>) {
        let w = registry().get().remove(data.0);
        drop(w);
    }
}
