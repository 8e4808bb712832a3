//! Keyspace and server events: subscribed here, decoded into safe values ([`ServerEvent`],
//! the event name and key of a keyspace event) and passed to a safe [`EventHandler`].

use super::handle::{Ctx, RStr};
use redis_module::raw;
use std::os::raw::{c_char, c_int, c_void};

/// Classes of keyspace events (`REDISMODULE_NOTIFY_*`).
#[derive(Clone, Copy)]
pub struct NotifyClasses(c_int);

impl NotifyClasses {
    /// Generic commands (DEL, RENAME, MOVE, RESTORE, COPY, ...).
    pub const GENERIC: NotifyClasses = NotifyClasses(raw::REDISMODULE_NOTIFY_GENERIC as c_int);
    /// Keys that expired.
    pub const EXPIRED: NotifyClasses = NotifyClasses(raw::REDISMODULE_NOTIFY_EXPIRED as c_int);
    /// Keys evicted under maxmemory.
    pub const EVICTED: NotifyClasses = NotifyClasses(raw::REDISMODULE_NOTIFY_EVICTED as c_int);

    pub const fn and(self, other: NotifyClasses) -> NotifyClasses {
        NotifyClasses(self.0 | other.0)
    }
}

/// A server event, as far as flock follows them (every other event or subevent of the
/// subscribed ones is [`ServerEvent::Other`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ServerEvent {
    /// The cron loop (every 100 ms at hz 10).
    Cron,
    /// The server became a master (`true`) or a replica.
    RoleChanged {
        now_master: bool,
    },
    /// Loading started or stopped (`ended`: it ended and succeeded).
    Loading {
        ended: bool,
    },
    /// A persistence event (a fork for RDB or AOF).
    Persistence,
    /// A fork child was born (seen in the parent, after an AOF rewrite opened its new incr
    /// file).
    ForkBorn,
    /// A replica connected or went away.
    ReplicaChange,
    /// A config changed.
    Config,
    /// A flush is about to free database `db` (`None`: all of them).
    FlushStarting {
        db: Option<c_int>,
    },
    /// A flush ended.
    FlushEnded,
    /// SWAPDB swapped these two databases (`None`: the server did not say which).
    SwapDb {
        dbs: Option<(c_int, c_int)>,
    },
    /// The client with this id disconnected.
    ClientDisconnected {
        id: u64,
    },
    Other,
}

/// What flock does on events.
pub trait EventHandler {
    /// A keyspace event `event` (its name, as `del` or `move_to`) on `key`, with the event's
    /// database selected in `ctx`.
    fn keyspace(ctx: Ctx<'_>, event: &[u8], key: RStr<'_>);
    /// A server event.
    fn server(ctx: Ctx<'_>, event: ServerEvent);
    /// Valkey 9's atomic slot migration event: its subevent number and the slot ranges it
    /// names, as the server passed them (inclusive `(start, end)` pairs, unchecked).
    fn slot_migration(ctx: Ctx<'_>, subevent: u64, ranges: &[(i64, i64)]);
}

unsafe extern "C" fn on_keyspace<H: EventHandler>(
    ctx: *mut raw::RedisModuleCtx,
    _type: c_int,
    event: *const c_char,
    key: *mut raw::RedisModuleString,
) -> c_int {
    if event.is_null() {
        return raw::REDISMODULE_OK as c_int;
    }
    // SAFETY: the callback's live context and key name (valid during the callback).
    let (Some(ctx), Some(key)) = (unsafe { Ctx::from_raw(ctx) }, unsafe {
        RStr::from_raw(key)
    }) else {
        return raw::REDISMODULE_OK as c_int;
    };
    // SAFETY: Redis passes the event name as a NUL-terminated string (checked non-null).
    let event = unsafe { std::ffi::CStr::from_ptr(event) }.to_bytes();
    H::keyspace(ctx, event, key);
    raw::REDISMODULE_OK as c_int
}

/// Decode the event Redis passed (`data` as the event's documentation says it is).
///
/// # Safety
/// `data` must be null or what Redis passes with `event`/`subevent`.
unsafe fn decode(event: raw::RedisModuleEvent, subevent: u64, data: *mut c_void) -> ServerEvent {
    match event.id {
        raw::REDISMODULE_EVENT_CRON_LOOP => ServerEvent::Cron,
        raw::REDISMODULE_EVENT_REPLICATION_ROLE_CHANGED => ServerEvent::RoleChanged {
            now_master: subevent == raw::REDISMODULE_EVENT_REPLROLECHANGED_NOW_MASTER,
        },
        raw::REDISMODULE_EVENT_LOADING => ServerEvent::Loading {
            ended: subevent == raw::REDISMODULE_SUBEVENT_LOADING_ENDED,
        },
        raw::REDISMODULE_EVENT_PERSISTENCE => ServerEvent::Persistence,
        raw::REDISMODULE_EVENT_FORK_CHILD
            if subevent == raw::REDISMODULE_SUBEVENT_FORK_CHILD_BORN =>
        {
            ServerEvent::ForkBorn
        }
        raw::REDISMODULE_EVENT_REPLICA_CHANGE => ServerEvent::ReplicaChange,
        raw::REDISMODULE_EVENT_CONFIG => ServerEvent::Config,
        raw::REDISMODULE_EVENT_FLUSHDB if subevent == raw::REDISMODULE_SUBEVENT_FLUSHDB_START => {
            let info = data.cast::<raw::RedisModuleFlushInfoV1>();
            // SAFETY: for FLUSHDB events Redis passes a `RedisModuleFlushInfoV1` (or null).
            let db = unsafe { info.as_ref() }.map_or(-1, |i| i.dbnum);
            ServerEvent::FlushStarting {
                db: (db >= 0).then_some(db),
            }
        }
        raw::REDISMODULE_EVENT_FLUSHDB if subevent == raw::REDISMODULE_SUBEVENT_FLUSHDB_END => {
            ServerEvent::FlushEnded
        }
        raw::REDISMODULE_EVENT_SWAPDB => {
            let info = data.cast::<raw::RedisModuleSwapDbInfo>();
            // SAFETY: for SWAPDB events Redis passes a `RedisModuleSwapDbInfo` (or null).
            let dbs = unsafe { info.as_ref() }.map(|i| (i.dbnum_first, i.dbnum_second));
            ServerEvent::SwapDb { dbs }
        }
        raw::REDISMODULE_EVENT_CLIENT_CHANGE
            if subevent == raw::REDISMODULE_SUBEVENT_CLIENT_CHANGE_DISCONNECTED =>
        {
            let info = data.cast::<raw::RedisModuleClientInfo>();
            // SAFETY: for client change events Redis passes a `RedisModuleClientInfo` (or null).
            match unsafe { info.as_ref() } {
                Some(info) => ServerEvent::ClientDisconnected { id: info.id },
                None => ServerEvent::Other,
            }
        }
        _ => ServerEvent::Other,
    }
}

unsafe extern "C" fn on_server<H: EventHandler>(
    ctx: *mut raw::RedisModuleCtx,
    event: raw::RedisModuleEvent,
    subevent: u64,
    data: *mut c_void,
) {
    // SAFETY: the callback's live context.
    let Some(ctx) = (unsafe { Ctx::from_raw(ctx) }) else {
        return;
    };
    // SAFETY: what Redis passed with this event.
    H::server(ctx, unsafe { decode(event, subevent, data) });
}

/// Subscribe `H` to the keyspace events of `classes` and to every server event
/// [`ServerEvent`] tells apart.
pub fn subscribe<H: EventHandler>(ctx: Ctx<'_>, classes: NotifyClasses) {
    // SAFETY: the init context; the callbacks are plain functions of this file.
    unsafe {
        api!(RedisModule_SubscribeToKeyspaceEvents, 0;
            ctx.ptr(), classes.0, Some(on_keyspace::<H>))
    };
    for event in [
        raw::REDISMODULE_EVENT_REPLICATION_ROLE_CHANGED,
        raw::REDISMODULE_EVENT_LOADING,
        raw::REDISMODULE_EVENT_FLUSHDB,
        raw::REDISMODULE_EVENT_SWAPDB,
        raw::REDISMODULE_EVENT_PERSISTENCE,
        raw::REDISMODULE_EVENT_FORK_CHILD,
        raw::REDISMODULE_EVENT_REPLICA_CHANGE,
        raw::REDISMODULE_EVENT_CONFIG,
        raw::REDISMODULE_EVENT_CRON_LOOP,
        raw::REDISMODULE_EVENT_CLIENT_CHANGE,
    ] {
        // SAFETY: as above.
        unsafe {
            api!(RedisModule_SubscribeToServerEvent, 0;
                ctx.ptr(), raw::RedisModuleEvent { id: event, dataver: 1 }, Some(on_server::<H>))
        };
    }
}

/// `ValkeyModuleSlotRange` (Valkey 9's valkeymodule.h): one inclusive range of slots.
#[repr(C)]
struct SlotRange {
    start: c_int,
    end: c_int,
}

/// `ValkeyModuleAtomicSlotMigrationInfoV1`, the data of Valkey 9's atomic slot migration
/// event: the crate's bundled header predates it.
#[repr(C)]
struct SlotMigrationInfoV1 {
    version: u64,
    job_name: [c_char; 41],
    slot_ranges: *const SlotRange,
    num_slot_ranges: u32,
}

unsafe extern "C" fn on_slot_migration<H: EventHandler>(
    ctx: *mut raw::RedisModuleCtx,
    _event: raw::RedisModuleEvent,
    subevent: u64,
    data: *mut c_void,
) {
    // SAFETY: the callback's live context.
    let Some(ctx) = (unsafe { Ctx::from_raw(ctx) }) else {
        return;
    };
    // SAFETY: for this event Valkey passes a `SlotMigrationInfoV1` (we subscribed with
    // dataver 1), or null; its array holds `num_slot_ranges` ranges and lives during the
    // callback.
    let ranges: Vec<(i64, i64)> = match unsafe { data.cast::<SlotMigrationInfoV1>().as_ref() } {
        Some(info) if !info.slot_ranges.is_null() => {
            // SAFETY: as above.
            let raw_ranges = unsafe {
                std::slice::from_raw_parts(info.slot_ranges, info.num_slot_ranges as usize)
            };
            raw_ranges
                .iter()
                .map(|r| (i64::from(r.start), i64::from(r.end)))
                .collect()
        }
        _ => Vec::new(),
    };
    H::slot_migration(ctx, subevent, &ranges);
}

/// Subscribe `H` to server event `event` (Valkey 9's atomic slot migration, whose number the
/// caller knows: the crate's header lacks it); false when the server refused (it has no such
/// event).
pub fn subscribe_slot_migration<H: EventHandler>(ctx: Ctx<'_>, event: u64) -> bool {
    // SAFETY: the init context; the callback is a plain function of this file, and decodes
    // the data as version 1 of the event's structure, the version asked for here.
    let rc = unsafe {
        api!(RedisModule_SubscribeToServerEvent, raw::REDISMODULE_ERR as c_int;
            ctx.ptr(), raw::RedisModuleEvent { id: event, dataver: 1 }, Some(on_slot_migration::<H>))
    };
    rc == raw::REDISMODULE_OK as c_int
}
