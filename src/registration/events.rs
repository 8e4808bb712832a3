//! What happens to lock keys outside their commands: keyspace and server events, a key's
//! deadline coming due (`expiry.rs` calls [`on_due`]) and deferred looks at waited keys
//! (`jobs.rs` calls [`revisit`]). Each runs the engine through the effects executor.

use crate::effects;
use crate::expiry::{self, DueKey};
use crate::ffi::{self, Ctx, Key, KeyKind, RStr};
use crate::jobs::{self, Job, Task};
use crate::record::{self, Found, RecordPtr};
use crate::{bindings, cluster, server, waiters};
use flock_core::engine::{self, Reply, RevisitPlan};
use redis_module::raw;
use std::os::raw::{c_char, c_int, c_void};
use std::sync::atomic::{AtomicI32, Ordering};

/// Generic keyspace events (rename, move, restore, copy, del), expiry and eviction: what can
/// move a lock or take it away. A lock value overwritten by another type is noticed in the
/// type's free callback instead, so that plain writes (SET, HSET, ...) of other keys pay
/// nothing for flock.
pub const SUBSCRIBED: c_int = raw::REDISMODULE_NOTIFY_GENERIC
    | raw::REDISMODULE_NOTIFY_EXPIRED
    | raw::REDISMODULE_NOTIFY_EVICTED;

/// The database MOVE moved a key from ("move_from" comes just before "move_to"), -1 when none.
static MOVE_SOURCE_DB: AtomicI32 = AtomicI32::new(-1);

/// A lock put under a new name, database or value (RESTORE, COPY, RENAME, MOVE) gets its
/// timer there. A key with waiters that was deleted, flushed, renamed away or overwritten is
/// looked at again right after the command: its waiters get the lock or an error.
///
/// Valkey 8.1 runs this callback on the client whose command caused the event, with the
/// event's database selected, and leaves that client in it: after `MOVE key 1` the client
/// (or, on a replica, the link to its master, whose next writes would land in the wrong
/// database) would be left in database 1. So after "move_to" the source database is selected
/// again; on servers that give the callback a client of its own this changes nothing.
pub unsafe extern "C" fn on_keyspace_event(
    ctx: Ctx,
    _type: c_int,
    event: *const c_char,
    key: RStr,
) -> c_int {
    if event.is_null() {
        return raw::REDISMODULE_OK as c_int;
    }
    // SAFETY: Redis passes the event name as a NUL-terminated string (checked non-null).
    let event = unsafe { std::ffi::CStr::from_ptr(event) }.to_bytes();
    match event {
        b"move_from" => {
            MOVE_SOURCE_DB.store(ffi::selected_db(ctx), Ordering::Relaxed);
        }
        b"move_to" => {
            if server::is_master() {
                look_at(ctx, event, key);
            }
            let source = MOVE_SOURCE_DB.swap(-1, Ordering::Relaxed);
            if source >= 0 {
                ffi::select_db(ctx, source);
            }
            return raw::REDISMODULE_OK as c_int;
        }
        _ => {}
    }
    if server::is_master() {
        look_at(ctx, event, key);
    }
    raw::REDISMODULE_OK as c_int
}

fn look_at(ctx: Ctx, event: &[u8], key: RStr) {
    if matches!(event, b"restore" | b"copy_to" | b"rename_to" | b"move_to") {
        // Opened for reading (a write-mode close would signal the key as modified again);
        // only what Redis never sees changes: the timer slot, and the binding of grants that
        // arrived without one (RESTORE, MIGRATE), which the timer then ends and replicates.
        let mut k = Key::open(ctx, key, false);
        let mut vacant = false;
        let mut unnamed = false;
        if let Found::Lock(mut lock) = record::lock_mut(&mut k) {
            let state = lock.state();
            if event == b"restore" {
                engine::orphan_bound(state, true);
            }
            if matches!(event, b"rename_to" | b"move_to") {
                // The binding followed the value: the index must find it under its new name.
                for g in state.grants().iter() {
                    if let Some(client) = g.bound_client() {
                        bindings::moved(client, g.token, ffi::selected_db(ctx), ffi::bytes(&key));
                    }
                }
            }
            let next = state.next_deadline();
            vacant = next.is_none();
            let block = lock.block();
            drop(lock);
            unnamed = expiry::rearm(ctx, key, block, next).is_err();
        }
        drop(k);
        if unnamed {
            // A block under a new name (RENAME, COPY, RESTORE) gets one that carries it.
            let mut k = Key::open(ctx, key, true);
            expiry::name_and_arm(ctx, key, &mut k, true);
        }
        if vacant {
            // A COPY that left bound grants out may hold nothing: a look right after the
            // command deletes it (the engine decides).
            jobs::schedule(Job::Revisit((
                ffi::selected_db(ctx),
                ffi::bytes(&key).to_vec(),
            )));
        }
    }
    if waiters::blocked_now() > 0 {
        let db = ffi::selected_db(ctx);
        let name = ffi::bytes(&key);
        if waiters::is_waited(db, name) {
            jobs::schedule(Job::Revisit((db, name.to_vec())));
        }
    }
}

/// Role changes, the end of loading, flushes and SWAPDB.
pub unsafe extern "C" fn on_server_event(
    ctx: Ctx,
    event: raw::RedisModuleEvent,
    subevent: u64,
    data: *mut c_void,
) {
    if matches!(
        event.id,
        raw::REDISMODULE_EVENT_REPLICATION_ROLE_CHANGED
            | raw::REDISMODULE_EVENT_LOADING
            | raw::REDISMODULE_EVENT_PERSISTENCE
            | raw::REDISMODULE_EVENT_REPLICA_CHANGE
            | raw::REDISMODULE_EVENT_CONFIG
    ) {
        server::assume_replication_consumed();
    }
    match event.id {
        raw::REDISMODULE_EVENT_CRON_LOOP => {
            let tick = CRON_TICKS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            if tick.is_multiple_of(10) {
                server::recheck_replication(ctx);
            }
            jobs::run_queued(ctx);
            expiry::on_cron(ctx);
            waiters::time_out_due();
            crate::cluster::broadcast_high_water(ctx);
        }
        raw::REDISMODULE_EVENT_REPLICATION_ROLE_CHANGED => {
            let master = subevent == raw::REDISMODULE_EVENT_REPLROLECHANGED_NOW_MASTER;
            server::set_master(master);
            if master {
                expiry::arm_all(ctx);
            } else {
                // Redis disconnects blocked clients itself on demotion; make sure none is
                // left waiting for a grant this server can no longer make.
                waiters::fail_everyone("UNBLOCKED this server is now a replica");
                // A replica arms nothing (it follows its master's effects), and its values
                // may yet be freed by a full sync without a flush event first.
                expiry::forget_db(None);
            }
        }
        raw::REDISMODULE_EVENT_LOADING if subevent == raw::REDISMODULE_SUBEVENT_LOADING_ENDED => {
            server::refresh_role(ctx);
            expiry::arm_all(ctx);
            revisit_all();
        }
        raw::REDISMODULE_EVENT_FLUSHDB if subevent == raw::REDISMODULE_SUBEVENT_FLUSHDB_START => {
            let info = data.cast::<raw::RedisModuleFlushInfoV1>();
            // SAFETY: for FLUSHDB events Redis passes a `RedisModuleFlushInfoV1` (or null).
            let db = unsafe { info.as_ref() }.map_or(-1, |i| i.dbnum);
            expiry::forget_db((db >= 0).then_some(db));
        }
        raw::REDISMODULE_EVENT_FLUSHDB if subevent == raw::REDISMODULE_SUBEVENT_FLUSHDB_END => {
            revisit_all();
        }
        raw::REDISMODULE_EVENT_SWAPDB => {
            let info = data.cast::<raw::RedisModuleSwapDbInfo>();
            // SAFETY: for SWAPDB events Redis passes a `RedisModuleSwapDbInfo` (or null).
            if let Some(info) = unsafe { info.as_ref() } {
                bindings::swap_dbs(info.dbnum_first, info.dbnum_second);
            }
            expiry::arm_all(ctx);
            revisit_all();
        }
        raw::REDISMODULE_EVENT_CLIENT_CHANGE
            if subevent == raw::REDISMODULE_SUBEVENT_CLIENT_CHANGE_DISCONNECTED =>
        {
            let info = data.cast::<raw::RedisModuleClientInfo>();
            // SAFETY: for client change events Redis passes a `RedisModuleClientInfo` (or null).
            if let Some(info) = unsafe { info.as_ref() } {
                // Its waits ended already (the blocked client's disconnect callback); its
                // bound grants end from the event loop, right after this disconnection.
                for key in bindings::take(info.id) {
                    jobs::schedule(Job::Close {
                        key,
                        client: info.id,
                    });
                }
            }
        }
        _ => {}
    }
}

static CRON_TICKS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

fn revisit_all() {
    for key in waiters::waited_keys(None) {
        jobs::schedule(Job::Revisit(key));
    }
}

/// A key's deadline came (`expiry.rs`): settle it, if the entry's record is still there.
pub fn on_due(ctx: Ctx, due: &DueKey) {
    if !ffi::select_db(ctx, due.db) {
        return;
    }
    let name = ffi::create_string(ctx, due.name.bytes());
    if name.is_null() {
        return;
    }
    settle_due(ctx, name, due.block);
    ffi::free_string(name);
}

fn settle_due(ctx: Ctx, name: RStr, block: RecordPtr) {
    let mut key = Key::open(ctx, name, true);
    // Only the block this entry was armed for (not one that replaced it: a block's entry
    // leaves the index before the block is freed, so a due block is still live).
    if !matches!(key.kind(server::lock_type()), KeyKind::Ours)
        || key.raw_value() != block.as_value()
    {
        return;
    }
    let _ = effects::with_lock(ctx, name, &mut key, false, |state, env, host| {
        engine::expire(state, env, host);
        Reply::Null
    });
}

/// A deferred job on a key (`jobs.rs`).
pub fn run_job(ctx: Ctx, key_name: RStr, task: Task) {
    match task {
        Task::Revisit(ghost) => revisit(ctx, key_name, ghost),
        Task::Close(client) => close(ctx, key_name, client),
    }
}

/// Connection `client` closed: end its bound grants of `key_name` (if the lock is still
/// there; a grant it no longer holds is left alone by the engine).
fn close(ctx: Ctx, key_name: RStr, client: u64) {
    let mut key = Key::open(ctx, key_name, true);
    let _ = effects::with_lock(ctx, key_name, &mut key, false, |state, env, host| {
        engine::close(state, env, host, client);
        Reply::Null
    });
}

/// A deferred look at a waited key: hand it to its first waiter when it is free, fail its
/// waiters when it now holds another type or moved away, and release `ghost` (a grant whose
/// client vanished before its reply) first.
fn revisit(ctx: Ctx, key_name: RStr, ghost: Option<u64>) {
    let mut key = Key::open(ctx, key_name, true);
    let found = match key.kind(server::lock_type()) {
        KeyKind::Ours => engine::Found::Lock,
        KeyKind::Empty => engine::Found::Nothing,
        KeyKind::Other => engine::Found::OtherType,
    };
    let waiting = waiters::count(ctx, key_name);
    let plan = engine::plan_revisit(server::is_master(), found, ghost, waiting, || {
        cluster::serves_stably(ctx, ffi::bytes(&key_name))
    });
    match plan {
        RevisitPlan::Skip => {}
        RevisitPlan::FailWaiters(msg) => waiters::fail_all(&waiters::key_id(ctx, key_name), msg),
        RevisitPlan::Revisit => {
            let _ = effects::with_lock(ctx, key_name, &mut key, true, |state, env, host| {
                host.watch_if_waited();
                engine::revisit(state, env, host, ghost);
                Reply::Null
            });
        }
    }
}
