//! Clients waiting for a lock (FLOCK.ACQUIRE ... BLOCK): real blocked clients of Redis.
//!
//! The queues live here, keyed by database and key name, not inside the lock value: a waiter
//! must outlive the value when the key is deleted, flushed, renamed or overwritten, and then
//! be handed the lock or told why not. Each waiter is one `RedisModule_BlockClient` handle,
//! unblocked exactly once: with its token (hand-off), with an error, or with nothing after its
//! timeout or disconnect.
//!
//! A grant whose client vanished before its reply is released again by a deferred job
//! (`jobs.rs`).

use super::jobs::{self, Job};
use crate::ffi::block::KeyId;
use crate::ffi::{self, BlockedClient, Ctx, RStr, Status};
use crate::server::{self, config, stats};
use flock_core::args::AcquireArgs;
use flock_core::engine::{BlockRefused, ReplyError};
use flock_core::queue;
use flock_core::state::Mode;
use flock_core::{WaitQueue, Waiter};
use std::collections::HashMap;
use std::ffi::c_int;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Mutex, MutexGuard};

struct Blocked {
    bc: BlockedClient<Waiting>,
    client_id: u64,
    key: KeyId,
    /// A FLOCK.MACQUIRE request (`None`: an ACQUIRE): its other keys, in the order given after
    /// `key` (it waits in the queue of each; none for one key). Boxed: one pointer in every
    /// waiter's entry, which the registry's table keeps the capacity of (a boxed slice would
    /// be two).
    #[allow(clippy::box_collection)]
    others: Option<Box<Vec<KeyId>>>,
    /// The waiter's own timeout timer (0: waits without limit). flock times waiters out
    /// itself rather than through Redis: Redis 7.0 drops the reply of a client whose timeout
    /// passes after the module unblocked it but before the reply went out.
    timer: u64,
    /// When the timeout is due on the monotonic clock (0: no timeout). The cron checks it too:
    /// module timers follow the wall clock on Redis 7.0 and Valkey 9.
    deadline_us: u64,
    /// When the client started waiting, on the monotonic clock (FLOCK.STATS wait times).
    since_us: u64,
}

impl Blocked {
    fn stop_timer(&self) {
        if self.timer != 0 {
            if let Some(ctx) = ffi::module_ctx() {
                ffi::stop_timer(ctx, self.timer);
            }
        }
    }

    /// Unblock the client with `delivery` (Redis owns it from now on and hands it to
    /// `Waiting::reply`, then to `Waiting::free`). Consumes the handle: it is never touched
    /// again (each `Blocked` is removed from the registry before it is unblocked, once).
    fn unblock(self, delivery: Option<Delivery>) {
        self.bc.unblock(delivery);
    }
}

#[derive(Default)]
struct Registry {
    /// Wait queues by database, then key name (two levels, so that a lookup by a borrowed
    /// name allocates nothing).
    queues: HashMap<c_int, HashMap<Vec<u8>, WaitQueue>>,
    blocked: HashMap<u64, Blocked>,
    by_client: HashMap<u64, u64>,
    next_id: u64,
}

impl Registry {
    fn queue(&self, db: c_int, name: &[u8]) -> Option<&WaitQueue> {
        self.queues.get(&db)?.get(name)
    }

    fn queue_mut(&mut self, db: c_int, name: &[u8]) -> Option<&mut WaitQueue> {
        self.queues.get_mut(&db)?.get_mut(name)
    }

    fn remove_queue(&mut self, db: c_int, name: &[u8]) -> Option<WaitQueue> {
        let per_db = self.queues.get_mut(&db)?;
        let q = per_db.remove(name);
        if per_db.is_empty() {
            self.queues.remove(&db);
        }
        q
    }

    /// Drop the queue of `db`/`name` if nobody is left in it.
    fn drop_if_empty(&mut self, db: c_int, name: &[u8]) {
        if self.queue(db, name).is_some_and(WaitQueue::is_empty) {
            self.remove_queue(db, name);
        }
    }

    fn keys(&self) -> impl Iterator<Item = KeyId> + '_ {
        self.queues
            .iter()
            .flat_map(|(db, m)| m.keys().map(move |k| (*db, k.clone())))
    }
}

static REGISTRY: Mutex<Option<Registry>> = Mutex::new(None);
/// Number of blocked waiters: lets keyspace events skip the registry when nobody waits.
static WAITING: AtomicUsize = AtomicUsize::new(0);

struct RegistryGuard(MutexGuard<'static, Option<Registry>>);

impl RegistryGuard {
    fn get(&mut self) -> &mut Registry {
        self.0.get_or_insert_with(Registry::default)
    }
}

impl Drop for RegistryGuard {
    fn drop(&mut self) {
        let n = self.0.as_ref().map_or(0, |r| r.blocked.len());
        WAITING.store(n, Ordering::Relaxed);
    }
}

fn registry() -> RegistryGuard {
    RegistryGuard(REGISTRY.lock().unwrap_or_else(|p| p.into_inner()))
}

/// Clients blocked in FLOCK.ACQUIRE now.
pub fn blocked_now() -> usize {
    WAITING.load(Ordering::Relaxed)
}

pub fn key_id(ctx: Ctx<'_>, key: RStr<'_>) -> KeyId {
    (ctx.selected_db(), ffi::bytes(&key).to_vec())
}

/// Number of clients waiting for `key`. Inlined: while nobody waits anywhere (the usual
/// case, asked by every ACQUIRE of a free key), one load.
#[inline(always)]
pub fn count(ctx: Ctx<'_>, key: RStr<'_>) -> usize {
    if blocked_now() == 0 {
        return 0;
    }
    count_queued(ctx, key)
}

#[inline(never)]
fn count_queued(ctx: Ctx<'_>, key: RStr<'_>) -> usize {
    let db = ctx.selected_db();
    registry()
        .get()
        .queue(db, ffi::bytes(&key))
        .map_or(0, WaitQueue::len)
}

/// The mode of the shared requests waiting for `key`, if any wait.
pub fn shared_mode(ctx: Ctx<'_>, key: RStr<'_>) -> Option<Mode> {
    if blocked_now() == 0 {
        return None;
    }
    let db = ctx.selected_db();
    registry()
        .get()
        .queue(db, ffi::bytes(&key))
        .and_then(WaitQueue::shared_mode)
}

/// The first waiter of `key`, taken off its queue (dropped when emptied) when `fits` says
/// it can be granted now. It stays blocked until [`deliver`] unblocks it.
pub fn pop_if(
    ctx: Ctx<'_>,
    key: RStr<'_>,
    fits: &mut dyn FnMut(&Waiter) -> bool,
) -> Option<Waiter> {
    if blocked_now() == 0 {
        return None;
    }
    let db = ctx.selected_db();
    let name = ffi::bytes(&key);
    let mut guard = registry();
    let reg = guard.get();
    let w = reg.queue_mut(db, name)?.pop_if(fits);
    reg.drop_if_empty(db, name);
    w
}

/// Whether this context may block its client (not inside MULTI, a script, or a context
/// that denies blocking).
pub fn can_block(ctx: Ctx<'_>) -> bool {
    let flags = ctx.flags();
    !(flags.is_multi() || flags.is_lua() || flags.denies_blocking())
}

/// Block the calling client until it is handed `key` (or times out: 0 = never) for the
/// request `args`. An earlier request of the same owner for the key leaves the queue and
/// gets nil (the queue decides: an owner waits at most once).
pub fn block(
    ctx: Ctx<'_>,
    key: RStr<'_>,
    args: &AcquireArgs<'_>,
    timeout_ms: u64,
    bind_to: Option<u64>,
) -> Result<(), BlockRefused> {
    let id = key_id(ctx, key);
    let mut guard = registry();
    let reg = guard.get();
    if !queue::admits(reg.queue(id.0, &id.1), args.owner, config::max_waiters()) {
        return Err(BlockRefused::TooMany);
    }
    // A command context that may block (see `can_block`), with the callbacks of `Waiting`.
    // Timeouts are ours (see `Blocked::timer`): none from Redis.
    let Some(bc) = BlockedClient::<Waiting>::block(ctx) else {
        return Err(BlockRefused::Failed);
    };
    let client_id = ctx.client_id();
    reg.next_id += 1;
    let waiter_id = reg.next_id;
    let timeout_ms = queue::block_timeout_ms(timeout_ms);
    let timer = if timeout_ms > 0 {
        let period = i64::try_from(timeout_ms).unwrap_or(i64::MAX);
        // The timer's data is the waiter id.
        ffi::create_timer::<WaiterTimeout>(ctx, period, waiter_id)
    } else {
        0
    };
    let replaced = reg
        .queues
        .entry(id.0)
        .or_default()
        .entry(id.1.clone())
        .or_default()
        .push(Waiter {
            id: waiter_id,
            owner: args.owner.into(),
            ttl_ms: args.ttl_ms,
            mode: args.mode,
            bind_to,
            multi: false,
        });
    if let Some((earlier_id, earlier)) =
        replaced.and_then(|w| reg.blocked.remove(&w.id).map(|b| (w.id, b)))
    {
        reg.by_client.remove(&earlier.client_id);
        // A MACQUIRE replaced in one of its queues leaves the others too (this one's queue
        // is `key`, where the new request took its place).
        let others: Vec<KeyId> = std::iter::once(earlier.key.clone())
            .chain(earlier.others.iter().flat_map(|o| o.iter().cloned()))
            .filter(|k| *k != id)
            .collect();
        leave_others(reg, earlier_id, &others);
        earlier.stop_timer();
        earlier.unblock(Some(Delivery::TimedOut));
    }
    reg.blocked.insert(
        waiter_id,
        Blocked {
            bc,
            client_id,
            key: id,
            others: None,
            timer,
            deadline_us: if timeout_ms > 0 {
                server::now()
                    .mono_us
                    .saturating_add(timeout_ms.saturating_mul(1000))
            } else {
                0
            },
            since_us: server::now().mono_us,
        },
    );
    reg.by_client.insert(client_id, waiter_id);
    stats::BLOCKED.incr();
    Ok(())
}

/// What a waiter is told when it is unblocked.
pub enum Delivery {
    /// It holds the key with this token. `delivered` turns true once the reply is sent; a
    /// token never delivered (the client went away first) is released again.
    Token {
        token: u64,
        key: KeyId,
        delivered: bool,
    },
    /// A MACQUIRE request holds each of its keys with its token (in the order given), as
    /// `Token` for several keys.
    Tokens {
        grants: Vec<(KeyId, u64)>,
        delivered: bool,
    },
    Error(&'static str),
    /// An error whose text names the key (the limit mismatch).
    Refused(String),
    TimedOut,
}

/// Hand `token` to the waiter `waiter_id` (taken off its queue by [`pop_if`]): how long it
/// waited (µs), or `None` when it is gone (the engine then gives the grant to the next one).
pub fn deliver(waiter_id: u64, token: u64) -> Option<u64> {
    let mut guard = registry();
    let reg = guard.get();
    let mut b = reg.blocked.remove(&waiter_id)?;
    let waited_us = server::now().mono_us.saturating_sub(b.since_us);
    reg.by_client.remove(&b.client_id);
    b.stop_timer();
    let key = std::mem::take(&mut b.key);
    b.unblock(Some(Delivery::Token {
        token,
        key,
        delivered: false,
    }));
    Some(waited_us)
}

/// `owner`'s request waiting for `key` leaves its queue and gets nil: the owner came to hold
/// the key another way (the engine's rule: `Waiters::dismiss`). False when it does not wait.
pub fn dismiss(ctx: Ctx<'_>, key: RStr<'_>, owner: &[u8]) -> bool {
    if blocked_now() == 0 {
        return false;
    }
    let db = ctx.selected_db();
    let name = ffi::bytes(&key);
    let mut guard = registry();
    let reg = guard.get();
    let Some(w) = reg.queue_mut(db, name).and_then(|q| q.take_owner(owner)) else {
        return false;
    };
    reg.drop_if_empty(db, name);
    if let Some(b) = reg.blocked.remove(&w.id) {
        reg.by_client.remove(&b.client_id);
        b.stop_timer();
        b.unblock(Some(Delivery::TimedOut));
    }
    true
}

/// Every shared request waiting for `key` with another limit than `limit` leaves its queue
/// and gets the limit mismatch error for `limit` (the engine's rule:
/// `Waiters::refuse_other_limits`). Returns how many.
pub fn refuse_other_limits(ctx: Ctx<'_>, key: RStr<'_>, limit: Mode) -> usize {
    if blocked_now() == 0 {
        return 0;
    }
    let db = ctx.selected_db();
    let name = ffi::bytes(&key);
    let mut guard = registry();
    let reg = guard.get();
    let Some(q) = reg.queue_mut(db, name) else {
        return 0;
    };
    let out = q.take_other_limits(limit);
    reg.drop_if_empty(db, name);
    for w in &out {
        if let Some(b) = reg.blocked.remove(&w.id) {
            reg.by_client.remove(&b.client_id);
            b.stop_timer();
            let text = ReplyError::LimitMismatch(limit).message(name);
            b.unblock(Some(Delivery::Refused(text)));
        }
    }
    out.len()
}

/// Unblock every waiter of `key` with an error (`msg` ends with NUL).
pub fn fail_all(key: &KeyId, msg: &'static str) {
    let mut guard = registry();
    let reg = guard.get();
    let Some(mut q) = reg.remove_queue(key.0, &key.1) else {
        return;
    };
    for w in q.drain() {
        if let Some(b) = reg.blocked.remove(&w.id) {
            reg.by_client.remove(&b.client_id);
            // A MACQUIRE request leaves its other queues (this one is gone already).
            let mut rest: Vec<KeyId> = b.others.as_deref().cloned().unwrap_or_default();
            rest.push(b.key.clone());
            rest.retain(|k| k != key);
            leave_others(reg, w.id, &rest);
            b.stop_timer();
            b.unblock(Some(Delivery::Error(msg)));
        }
    }
}

/// Unblock every waiter of every key with an error (`msg` ends with NUL).
pub fn fail_everyone(msg: &'static str) {
    let keys: Vec<KeyId> = registry().get().keys().collect();
    for k in keys {
        fail_all(&k, msg);
    }
}

/// Every key that has waiters (optionally only in database `db`).
pub fn waited_keys(db: Option<c_int>) -> Vec<KeyId> {
    if blocked_now() == 0 {
        return Vec::new();
    }
    registry()
        .get()
        .keys()
        .filter(|(d, _)| db.is_none_or(|want| *d == want))
        .collect()
}

pub fn is_waited(db: c_int, key: &[u8]) -> bool {
    if blocked_now() == 0 {
        return false;
    }
    registry().get().queue(db, key).is_some()
}

/// Take waiter `waiter_id` out of its queue and the registry. When it was the head of its
/// queue, those behind it may fit now (a reader behind a writer that timed out): the key is
/// looked at again right after.
fn leave(reg: &mut Registry, waiter_id: u64) -> Option<Blocked> {
    let b = reg.blocked.remove(&waiter_id)?;
    reg.by_client.remove(&b.client_id);
    leave_queue(reg, waiter_id, &b.key, b.others.is_some());
    if let Some(others) = &b.others {
        leave_others(reg, waiter_id, others);
    }
    Some(b)
}

/// Take waiter `waiter_id` out of the queue of `key`; when it was the head and others wait
/// behind it, the key is looked at again right after (they may fit now). A MACQUIRE request
/// that headed the queue of a free key kept that key in the keyspace, with no grant: the key
/// is looked at again even with nobody behind (to be deleted, G10).
fn leave_queue(reg: &mut Registry, waiter_id: u64, key: &KeyId, multi: bool) {
    let look_again = reg.queue_mut(key.0, &key.1).is_some_and(|q| {
        let first = q.is_front(waiter_id);
        q.leave(waiter_id) || (multi && first)
    });
    reg.drop_if_empty(key.0, &key.1);
    if look_again {
        jobs::schedule(Job::Revisit(key.clone()));
    }
}

/// A MACQUIRE request leaves the queues of `keys` (its keys but the one already handled).
fn leave_others(reg: &mut Registry, waiter_id: u64, keys: &[KeyId]) {
    for key in keys {
        leave_queue(reg, waiter_id, key, true);
    }
}

/// Take the calling blocked client out of its queue (CLIENT UNBLOCK, disconnect).
fn leave_by_client(ctx: Ctx<'_>) -> Option<Blocked> {
    // The live context of a blocked client's callback.
    let client_id = ctx.client_id();
    let mut guard = registry();
    let reg = guard.get();
    let waiter_id = *reg.by_client.get(&client_id)?;
    let b = leave(reg, waiter_id)?;
    b.stop_timer();
    Some(b)
}

/// From the cron: time out every waiter whose deadline passed on the monotonic clock (a
/// backstop for its timer).
pub fn time_out_due() {
    if blocked_now() == 0 {
        return;
    }
    let now = server::now().mono_us;
    let mut guard = registry();
    let reg = guard.get();
    let due: Vec<u64> = reg
        .blocked
        .iter()
        .filter(|(_, b)| b.deadline_us != 0 && b.deadline_us <= now)
        .map(|(id, _)| *id)
        .collect();
    for waiter_id in due {
        if let Some(b) = leave(reg, waiter_id) {
            b.stop_timer();
            stats::TIMEOUTS.incr();
            b.unblock(Some(Delivery::TimedOut));
        }
    }
}

/// The waiter's timeout: it leaves the queue and gets nil.
struct WaiterTimeout;

impl ffi::Timer for WaiterTimeout {
    fn fire(_ctx: Ctx<'_>, waiter_id: u64) {
        let mut guard = registry();
        if let Some(b) = leave(guard.get(), waiter_id) {
            stats::TIMEOUTS.incr();
            b.unblock(Some(Delivery::TimedOut));
        }
    }
}

/// The callbacks of a blocked FLOCK.ACQUIRE client.
struct Waiting;

impl ffi::BlockedClientHandler for Waiting {
    type Data = Delivery;

    fn reply(ctx: Ctx<'_>, delivery: Option<&mut Delivery>) -> Status {
        match delivery {
            Some(Delivery::Token {
                token, delivered, ..
            }) => {
                *delivered = true;
                ffi::reply_int(ctx, *token as i64)
            }
            Some(Delivery::Tokens { grants, delivered }) => {
                *delivered = true;
                ffi::reply_array(ctx, grants.len());
                for (_, token) in grants.iter() {
                    ffi::reply_int(ctx, *token as i64);
                }
                Status::OK
            }
            Some(Delivery::Error(msg)) => ffi::reply_error_string(ctx, msg),
            Some(Delivery::Refused(text)) => ffi::reply_error_string(ctx, text),
            Some(Delivery::TimedOut) | None => ffi::reply_null(ctx),
        }
    }

    /// CLIENT UNBLOCK: nil, and the waiter leaves the queue.
    fn unblocked(ctx: Ctx<'_>) -> Status {
        if let Some(b) = leave_by_client(ctx) {
            stats::TIMEOUTS.incr();
            b.unblock(None);
        }
        ffi::reply_null(ctx)
    }

    /// The client went away while waiting (or Redis unblocked it with an error).
    fn disconnected(ctx: Ctx<'_>) {
        if let Some(b) = leave_by_client(ctx) {
            b.unblock(None);
        }
    }

    fn free(d: Box<Delivery>) {
        match *d {
            Delivery::Token {
                token,
                key,
                delivered: false,
            } => {
                // Granted to a client that disconnected before its reply: release it again.
                jobs::schedule(Job::ReleaseGhost { key, token });
            }
            Delivery::Tokens {
                grants,
                delivered: false,
            } => {
                // Every key of a MACQUIRE granted to a client that went away.
                for (key, token) in grants {
                    jobs::schedule(Job::ReleaseGhost { key, token });
                }
            }
            _ => {}
        }
    }
}

/// The requests waiting for `key`, first in line first: owner, mode, and when it began to
/// wait on the monotonic clock (FLOCK.WAITERS).
pub fn in_line(ctx: Ctx<'_>, key: RStr<'_>) -> Vec<(Box<[u8]>, Mode, u64)> {
    if blocked_now() == 0 {
        return Vec::new();
    }
    let db = ctx.selected_db();
    let mut guard = registry();
    let reg = guard.get();
    let Some(q) = reg.queue(db, ffi::bytes(&key)) else {
        return Vec::new();
    };
    q.iter_live()
        .map(|w| {
            let since = reg.blocked.get(&w.id).map_or(0, |b| b.since_us);
            (w.owner.clone(), w.mode, since)
        })
        .collect()
}

// ---- FLOCK.MACQUIRE requests: one blocked client waiting in the queue of each of its keys ----

/// Whether `owner` waits for `key` (a MACQUIRE of it is refused).
pub fn has_owner(ctx: Ctx<'_>, key: RStr<'_>, owner: &[u8]) -> bool {
    if blocked_now() == 0 {
        return false;
    }
    let db = ctx.selected_db();
    registry()
        .get()
        .queue(db, ffi::bytes(&key))
        .is_some_and(|q| q.has_owner(owner))
}

/// Block the calling client until it is handed every key of `keys` (or times out: 0 =
/// never) for the exclusive request `args`: one waiter, queued in each key's queue in one
/// step (the same order as every other request in every queue they share). `flock.max-waiters`
/// reached on any key: refused, nothing queued. The caller checked that `args.owner` waits for
/// none of them.
pub fn block_multi(
    ctx: Ctx<'_>,
    keys: &[RStr<'_>],
    args: &AcquireArgs<'_>,
    timeout_ms: u64,
    bind_to: Option<u64>,
) -> Result<(), BlockRefused> {
    let ids: Vec<KeyId> = keys.iter().map(|k| key_id(ctx, *k)).collect();
    let Some((first, others)) = ids.split_first() else {
        return Err(BlockRefused::Failed);
    };
    let mut guard = registry();
    let reg = guard.get();
    let max = config::max_waiters();
    if !ids
        .iter()
        .all(|k| queue::admits(reg.queue(k.0, &k.1), args.owner, max))
    {
        return Err(BlockRefused::TooMany);
    }
    let Some(bc) = BlockedClient::<Waiting>::block(ctx) else {
        return Err(BlockRefused::Failed);
    };
    let client_id = ctx.client_id();
    reg.next_id += 1;
    let waiter_id = reg.next_id;
    let timeout_ms = queue::block_timeout_ms(timeout_ms);
    let timer = if timeout_ms > 0 {
        let period = i64::try_from(timeout_ms).unwrap_or(i64::MAX);
        ffi::create_timer::<WaiterTimeout>(ctx, period, waiter_id)
    } else {
        0
    };
    for k in &ids {
        // Nobody is replaced: the owner waits for none of the keys.
        let _ = reg
            .queues
            .entry(k.0)
            .or_default()
            .entry(k.1.clone())
            .or_default()
            .push(Waiter {
                id: waiter_id,
                owner: args.owner.into(),
                ttl_ms: args.ttl_ms,
                mode: Mode::Exclusive,
                bind_to,
                multi: true,
            });
    }
    let now = server::now().mono_us;
    reg.blocked.insert(
        waiter_id,
        Blocked {
            bc,
            client_id,
            key: first.clone(),
            others: Some(Box::new(others.to_vec())),
            timer,
            deadline_us: if timeout_ms > 0 {
                now.saturating_add(timeout_ms.saturating_mul(1000))
            } else {
                0
            },
            since_us: now,
        },
    );
    reg.by_client.insert(client_id, waiter_id);
    stats::BLOCKED.incr();
    Ok(())
}

/// A waiting MACQUIRE request as its keys' queues hold it now.
pub struct MultiRequest {
    pub owner: Box<[u8]>,
    pub ttl_ms: u64,
    pub bind_to: Option<u64>,
    /// Its keys in the order given, each with: how many wait for it, and whether this request
    /// is first in its queue.
    pub keys: Vec<(KeyId, usize, bool)>,
}

/// The waiting MACQUIRE request `waiter_id` (`None`: it is gone, or not a MACQUIRE).
pub fn multi_request(waiter_id: u64) -> Option<MultiRequest> {
    let mut guard = registry();
    let reg = guard.get();
    let b = reg.blocked.get(&waiter_id)?;
    let keys: Vec<KeyId> = std::iter::once(b.key.clone())
        .chain(b.others.iter().flat_map(|o| o.iter().cloned()))
        .collect();
    let mut found = None;
    let mut out = Vec::with_capacity(keys.len());
    for k in keys {
        let q = reg.queue_mut(k.0, &k.1)?;
        let first = q.is_front(waiter_id);
        if found.is_none() {
            found = q
                .iter_live()
                .find(|w| w.id == waiter_id && w.multi)
                .cloned();
        }
        out.push((k, q.len(), first));
    }
    let w = found?;
    Some(MultiRequest {
        owner: w.owner,
        ttl_ms: w.ttl_ms,
        bind_to: w.bind_to,
        keys: out,
    })
}

/// Hand the MACQUIRE request `waiter_id` its keys with their tokens (in its keys' order): it
/// leaves every queue and is unblocked. How long it waited (µs), or `None` when it is gone.
pub fn deliver_multi(waiter_id: u64, tokens: &[u64]) -> Option<u64> {
    let mut guard = registry();
    let reg = guard.get();
    let b = reg.blocked.remove(&waiter_id)?;
    reg.by_client.remove(&b.client_id);
    let keys: Vec<KeyId> = std::iter::once(b.key.clone())
        .chain(b.others.iter().flat_map(|o| o.iter().cloned()))
        .collect();
    for k in &keys {
        // Those behind it face a key it holds now: nothing to look at again.
        if let Some(q) = reg.queue_mut(k.0, &k.1) {
            q.cancel(waiter_id);
        }
        reg.drop_if_empty(k.0, &k.1);
    }
    let waited_us = server::now().mono_us.saturating_sub(b.since_us);
    b.stop_timer();
    let grants = keys.into_iter().zip(tokens.iter().copied()).collect();
    b.unblock(Some(Delivery::Tokens {
        grants,
        delivered: false,
    }));
    Some(waited_us)
}
