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

use crate::ffi::{self, Ctx, RStr};
use crate::jobs::{self, Job};
use crate::record::KeyId;
use crate::{api, server, stats};
use flock_core::args::AcquireArgs;
use flock_core::engine::BlockRefused;
use flock_core::state::Mode;
use flock_core::{WaitQueue, Waiter};
use redis_module::raw;
use std::collections::HashMap;
use std::os::raw::{c_int, c_void};
use std::ptr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Mutex, MutexGuard};

struct Blocked {
    bc: *mut raw::RedisModuleBlockedClient,
    client_id: u64,
    key: KeyId,
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
            ffi::stop_timer(server::module_ctx(), self.timer);
        }
    }

    /// Unblock the client with `delivery` (Redis owns it from now on and hands it to
    /// `on_reply`, then to `free_delivery`). Consumes the handle: it is never touched again.
    fn unblock(self, delivery: Option<Delivery>) {
        let data = delivery.map_or(ptr::null_mut(), |d| {
            Box::into_raw(Box::new(d)).cast::<c_void>()
        });
        // SAFETY: `bc` is a handle from BlockClient not unblocked before (each `Blocked` is
        // removed from the registry before it is unblocked, exactly once).
        unsafe { api!(RedisModule_UnblockClient, 0; self.bc, data) };
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

// The raw handles are only touched on Redis's main thread.
unsafe impl Send for Registry {}

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

pub fn key_id(ctx: Ctx, key: RStr) -> KeyId {
    (ffi::selected_db(ctx), ffi::bytes(&key).to_vec())
}

/// Number of clients waiting for `key`.
pub fn count(ctx: Ctx, key: RStr) -> usize {
    if blocked_now() == 0 {
        return 0;
    }
    let db = ffi::selected_db(ctx);
    registry()
        .get()
        .queue(db, ffi::bytes(&key))
        .map_or(0, WaitQueue::len)
}

/// The mode of the shared requests waiting for `key`, if any wait.
pub fn shared_mode(ctx: Ctx, key: RStr) -> Option<Mode> {
    if blocked_now() == 0 {
        return None;
    }
    let db = ffi::selected_db(ctx);
    registry()
        .get()
        .queue(db, ffi::bytes(&key))
        .and_then(WaitQueue::shared_mode)
}

/// The first waiter of `key`, taken off its queue (dropped when emptied) when `fits` says
/// it can be granted now. It stays blocked until [`deliver`] unblocks it.
pub fn pop_if(ctx: Ctx, key: RStr, fits: &mut dyn FnMut(&Waiter) -> bool) -> Option<Waiter> {
    if blocked_now() == 0 {
        return None;
    }
    let db = ffi::selected_db(ctx);
    let name = ffi::bytes(&key);
    let mut guard = registry();
    let reg = guard.get();
    let w = reg.queue_mut(db, name)?.pop_if(fits);
    reg.drop_if_empty(db, name);
    w
}

/// Whether this context may block its client (not inside MULTI, a script, or a context
/// that denies blocking).
pub fn can_block(ctx: Ctx) -> bool {
    let flags = ffi::context_flags(ctx);
    flags
        & (raw::REDISMODULE_CTX_FLAGS_MULTI
            | raw::REDISMODULE_CTX_FLAGS_LUA
            | raw::REDISMODULE_CTX_FLAGS_DENY_BLOCKING)
        == 0
}

/// Block the calling client until it is handed `key` (or times out: 0 = never) for the
/// request `args`. An earlier request of the same owner for the key leaves the queue and
/// gets nil (the queue decides: an owner waits at most once).
pub fn block(
    ctx: Ctx,
    key: RStr,
    args: &AcquireArgs<'_>,
    timeout_ms: u64,
    bind_to: Option<u64>,
) -> Result<(), BlockRefused> {
    let id = key_id(ctx, key);
    let mut guard = registry();
    let reg = guard.get();
    let queue = reg.queue(id.0, &id.1);
    let waiting = queue.map_or(0, WaitQueue::len);
    let replaces = queue.is_some_and(|q| q.has_owner(args.owner));
    if waiting >= crate::config::max_waiters() && !replaces {
        return Err(BlockRefused::TooMany);
    }
    // SAFETY: a live command context that may block (see `can_block`); the callbacks are
    // plain functions of this file. Timeouts are ours (see `Blocked::timer`): 0 here.
    let bc = unsafe {
        api!(RedisModule_BlockClient, ptr::null_mut();
            ctx,
            Some(on_reply),
            Some(on_client_unblock),
            Some(free_delivery),
            0
        )
    };
    if bc.is_null() {
        return Err(BlockRefused::Failed);
    }
    // SAFETY: the handle made above, not yet unblocked.
    unsafe { api!(RedisModule_SetDisconnectCallback, (); bc, Some(on_disconnect)) };
    // SAFETY: a live command context.
    let client_id = unsafe { api!(RedisModule_GetClientId, 0; ctx) };
    reg.next_id += 1;
    let waiter_id = reg.next_id;
    // A timeout beyond ten years is no limit (a huge period would wrap in the server's
    // timer arithmetic and fire at once).
    let timeout_ms = if timeout_ms > flock_core::queue::MAX_BLOCK_TIMEOUT_MS {
        0
    } else {
        timeout_ms
    };
    let timer = if timeout_ms > 0 {
        let period = i64::try_from(timeout_ms).unwrap_or(i64::MAX);
        // The timer's data is the waiter id, not a pointer.
        ffi::create_timer(
            ctx,
            period,
            on_waiter_timeout,
            waiter_id as usize as *mut c_void,
        )
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
        });
    if let Some(earlier) = replaced.and_then(|w| reg.blocked.remove(&w.id)) {
        reg.by_client.remove(&earlier.client_id);
        earlier.stop_timer();
        earlier.unblock(Some(Delivery::TimedOut));
    }
    reg.blocked.insert(
        waiter_id,
        Blocked {
            bc,
            client_id,
            key: id,
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
    Error(&'static str),
    TimedOut,
}

/// Hand `token` to waiter `waiter_id` (taken off its queue by [`pop`]). False when the
/// waiter is gone: the engine then gives the grant to the next one.
/// Hand `token` to the waiter `waiter_id`: how long it waited (µs), or None when it is gone.
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
    let mut look_again = false;
    if let Some(q) = reg.queue_mut(b.key.0, &b.key.1) {
        let was_front = q.is_front(waiter_id);
        q.cancel(waiter_id);
        look_again = was_front && !q.is_empty();
    }
    reg.drop_if_empty(b.key.0, &b.key.1);
    if look_again {
        jobs::schedule(Job::Revisit(b.key.clone()));
    }
    Some(b)
}

/// Take the calling blocked client out of its queue (CLIENT UNBLOCK, disconnect).
fn leave_by_client(ctx: Ctx) -> Option<Blocked> {
    // SAFETY: the live context of a blocked client's callback.
    let client_id = unsafe { api!(RedisModule_GetClientId, 0; ctx) };
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
unsafe extern "C" fn on_waiter_timeout(_ctx: Ctx, data: *mut c_void) {
    let waiter_id = data as usize as u64;
    let mut guard = registry();
    if let Some(b) = leave(guard.get(), waiter_id) {
        stats::TIMEOUTS.incr();
        b.unblock(Some(Delivery::TimedOut));
    }
}

unsafe extern "C" fn on_reply(ctx: Ctx, _argv: *mut RStr, _argc: c_int) -> c_int {
    // SAFETY: the reply callback's live context; the private data is the `Delivery` boxed by
    // `Blocked::unblock` (or null), owned by Redis until `free_delivery`.
    let d = unsafe { api!(RedisModule_GetBlockedClientPrivateData, ptr::null_mut(); ctx) }
        .cast::<Delivery>();
    // SAFETY: as above; nothing else touches the delivery while its reply is made.
    match unsafe { d.as_mut() } {
        Some(Delivery::Token {
            token, delivered, ..
        }) => {
            *delivered = true;
            ffi::reply_int(ctx, *token as i64)
        }
        Some(Delivery::Error(msg)) => ffi::reply_error_string(ctx, msg),
        Some(Delivery::TimedOut) | None => ffi::reply_null(ctx),
    }
}

/// CLIENT UNBLOCK: nil, and the waiter leaves the queue.
unsafe extern "C" fn on_client_unblock(ctx: Ctx, _argv: *mut RStr, _argc: c_int) -> c_int {
    if let Some(b) = leave_by_client(ctx) {
        stats::TIMEOUTS.incr();
        b.unblock(None);
    }
    ffi::reply_null(ctx)
}

/// The client went away while waiting (or Redis unblocked it with an error).
unsafe extern "C" fn on_disconnect(ctx: Ctx, _bc: *mut raw::RedisModuleBlockedClient) {
    if let Some(b) = leave_by_client(ctx) {
        b.unblock(None);
    }
}

unsafe extern "C" fn free_delivery(_ctx: Ctx, privdata: *mut c_void) {
    if privdata.is_null() {
        return;
    }
    // SAFETY: Redis hands back, once, the `Delivery` boxed by `Blocked::unblock`.
    let d = unsafe { Box::from_raw(privdata.cast::<Delivery>()) };
    if let Delivery::Token {
        token,
        key,
        delivered: false,
    } = *d
    {
        // Granted to a client that disconnected before its reply: release it again.
        jobs::schedule(Job::ReleaseGhost { key, token });
    }
}
