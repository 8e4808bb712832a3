//! Keyspace and server events that concern locks and their waiters.

use crate::ffi::{self, Ctx, Key, KeyKind, RStr};
use crate::lock_type::LockRecord;
use crate::waiters::{self, Job};
use crate::{expiry, rm, server};
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
    let event = unsafe { std::ffi::CStr::from_ptr(event) }.to_bytes();
    match event {
        b"move_from" => {
            MOVE_SOURCE_DB.store(rm!(RedisModule_GetSelectedDb, -1; ctx), Ordering::Relaxed);
        }
        b"move_to" => {
            if server::is_master() {
                look_at(ctx, event, key);
            }
            let source = MOVE_SOURCE_DB.swap(-1, Ordering::Relaxed);
            if source >= 0 {
                rm!(RedisModule_SelectDb, 0; ctx, source);
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
        let k = Key::open(ctx, key, false);
        if matches!(k.kind(server::lock_type()), KeyKind::Ours) {
            if let Some(rec) = unsafe { k.value::<LockRecord>().as_mut() } {
                expiry::rearm(ctx, key, rec);
            }
        }
    }
    if waiters::blocked_now() > 0 {
        let db = rm!(RedisModule_GetSelectedDb, 0; ctx);
        let name = ffi::bytes(key);
        if waiters::is_waited(db, name) {
            waiters::schedule(Job::Revisit((db, name.to_vec())));
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
            if tick % 10 == 0 {
                server::recheck_replication(ctx);
            }
            waiters::run_queued(ctx);
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
                waiters::fail_everyone("UNBLOCKED this server is now a replica\0");
            }
        }
        raw::REDISMODULE_EVENT_LOADING if subevent == raw::REDISMODULE_SUBEVENT_LOADING_ENDED => {
            server::refresh_role(ctx);
            expiry::arm_all(ctx);
            revisit_all();
        }
        raw::REDISMODULE_EVENT_FLUSHDB if subevent == raw::REDISMODULE_SUBEVENT_FLUSHDB_START => {
            let info = data.cast::<raw::RedisModuleFlushInfoV1>();
            let db = unsafe { info.as_ref() }.map_or(-1, |i| i.dbnum);
            expiry::forget_db((db >= 0).then_some(db));
        }
        raw::REDISMODULE_EVENT_FLUSHDB if subevent == raw::REDISMODULE_SUBEVENT_FLUSHDB_END => {
            revisit_all();
        }
        raw::REDISMODULE_EVENT_SWAPDB => {
            expiry::arm_all(ctx);
            revisit_all();
        }
        _ => {}
    }
}

static CRON_TICKS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

fn revisit_all() {
    for key in waiters::waited_keys(None) {
        waiters::schedule(Job::Revisit(key));
    }
}

pub fn subscribe(ctx: Ctx) {
    rm!(RedisModule_SubscribeToKeyspaceEvents, 0; ctx, SUBSCRIBED, Some(on_keyspace_event));
    for event in [
        raw::REDISMODULE_EVENT_REPLICATION_ROLE_CHANGED,
        raw::REDISMODULE_EVENT_LOADING,
        raw::REDISMODULE_EVENT_FLUSHDB,
        raw::REDISMODULE_EVENT_SWAPDB,
        raw::REDISMODULE_EVENT_PERSISTENCE,
        raw::REDISMODULE_EVENT_REPLICA_CHANGE,
        raw::REDISMODULE_EVENT_CONFIG,
        raw::REDISMODULE_EVENT_CRON_LOOP,
    ] {
        rm!(RedisModule_SubscribeToServerEvent, 0;
            ctx, raw::RedisModuleEvent { id: event, dataver: 1 }, Some(on_server_event));
    }
}
