//! Registration, all in one place: the data type, the commands (with their flags and key
//! positions; `command_info.rs` describes them), the configuration (`config::init`), the INFO
//! section, the server and keyspace events, and the handlers the mechanisms call back (due
//! deadlines, deferred jobs).

use crate::ffi::{self, Ctx, RStr};
use crate::lock_type::LOCK_TYPE;
use crate::{
    api, cluster, command_info, commands, config, events, expiry, jobs, server, stats,
    stats_command, waiters,
};
use redis_module::{raw, redis_module, Context, RedisString, Status};
use std::ffi::CStr;
use std::os::raw::{c_char, c_int};

fn init(ctx: &Context, args: &[RedisString]) -> Status {
    let raw_ctx = ctx.ctx;
    if let Err(e) = config::init(ctx, args) {
        ctx.log_warning(&format!("refusing to load: {e}"));
        return Status::Err;
    }
    if let Some(name) = ffi::missing_api() {
        ctx.log_warning(&format!("this server lacks {name}; refusing to load"));
        return Status::Err;
    }
    let lock_type = *LOCK_TYPE.raw_type.borrow();
    server::init(raw_ctx, lock_type);
    ctx.set_module_options(raw::ModuleOptions::HANDLE_IO_ERRORS);
    expiry::set_due_handler(events::on_due);
    jobs::set_runner(events::run_job);
    if let Err(e) = register_commands(raw_ctx).and_then(|()| command_info::describe(raw_ctx)) {
        ctx.log_warning(&format!("refusing to load: {e}"));
        return Status::Err;
    }
    // SAFETY: the init context; `info` is a plain function of this file.
    unsafe { api!(RedisModule_RegisterInfoFunc, 0; raw_ctx, Some(info)) };
    subscribe(raw_ctx);
    cluster::init(raw_ctx);
    Status::Ok
}

type Handler = unsafe extern "C" fn(Ctx, *mut RStr, c_int) -> c_int;

/// Register every command. Flags and key positions matter to cluster clients and ACLs.
fn register_commands(ctx: Ctx) -> Result<(), String> {
    macro_rules! handler {
        ($f:path) => {{
            unsafe extern "C" fn h(ctx: Ctx, argv: *mut RStr, argc: c_int) -> c_int {
                // SAFETY: Redis passes `argc` argument strings that live while the command
                // runs.
                let args = unsafe { ffi::argv_slice(argv, argc) };
                $f(ctx, args)
            }
            h as Handler
        }};
    }
    let table: [(&CStr, Handler, &CStr); 9] = [
        (
            c"flock.acquire",
            handler!(commands::acquire),
            c"write deny-oom",
        ),
        (c"flock.release", handler!(commands::release), c"write fast"),
        (c"flock.renew", handler!(commands::renew), c"write fast"),
        (c"flock.check", handler!(commands::check), c"readonly fast"),
        (c"flock.info", handler!(commands::info), c"readonly fast"),
        (c"flock.holders", handler!(commands::holders), c"readonly"),
        (c"flock.revoke", handler!(commands::revoke), c"write fast"),
        (c"flock.apply", handler!(commands::apply), c"write"),
        (
            c"flock.fenced",
            crate::fenced::command,
            c"write getkeys-api",
        ),
    ];
    for (name, h, flags) in table {
        // SAFETY: the init context; name and flags are NUL-terminated; the handler is a
        // plain function.
        let ok = unsafe {
            api!(RedisModule_CreateCommand, raw::REDISMODULE_ERR as c_int;
                ctx, name.as_ptr(), Some(h), flags.as_ptr(), 1, 1, 1)
        };
        if ok != raw::REDISMODULE_OK as c_int {
            return Err(format!("could not register {}", name.to_string_lossy()));
        }
    }
    // FLOCK.STATS, a container of GET and RESET (so that an ACL can allow GET alone).
    // SAFETY: the init context; the names and flags are NUL-terminated; no handler on the
    // container itself (Redis answers for a missing or unknown subcommand).
    let container = unsafe {
        api!(RedisModule_CreateCommand, raw::REDISMODULE_ERR as c_int;
            ctx, c"flock.stats".as_ptr(), None, c"".as_ptr(), 0, 0, 0)
    };
    // SAFETY: as above; the command was just created in this context.
    let parent =
        unsafe { api!(RedisModule_GetCommand, std::ptr::null_mut(); ctx, c"flock.stats".as_ptr()) };
    if container != raw::REDISMODULE_OK as c_int || parent.is_null() {
        return Err("could not register flock.stats".to_string());
    }
    let subs: [(&CStr, Handler, &CStr); 2] = [
        (c"get", handler!(stats_command::get), c"readonly fast"),
        (c"reset", handler!(stats_command::reset), c"fast"),
    ];
    for (name, h, flags) in subs {
        // SAFETY: `parent` is the container created above; names and flags NUL-terminated.
        let ok = unsafe {
            api!(RedisModule_CreateSubcommand, raw::REDISMODULE_ERR as c_int;
                parent, name.as_ptr(), Some(h), flags.as_ptr(), 0, 0, 0)
        };
        if ok != raw::REDISMODULE_OK as c_int {
            return Err(format!(
                "could not register flock.stats|{}",
                name.to_string_lossy()
            ));
        }
    }
    Ok(())
}

/// Keyspace events (see `events::SUBSCRIBED`) and the server events flock follows.
fn subscribe(ctx: Ctx) {
    // SAFETY: the init context; the callbacks are plain functions of `events.rs`.
    unsafe {
        api!(RedisModule_SubscribeToKeyspaceEvents, 0;
            ctx, events::SUBSCRIBED, Some(events::on_keyspace_event))
    };
    for event in [
        raw::REDISMODULE_EVENT_REPLICATION_ROLE_CHANGED,
        raw::REDISMODULE_EVENT_LOADING,
        raw::REDISMODULE_EVENT_FLUSHDB,
        raw::REDISMODULE_EVENT_SWAPDB,
        raw::REDISMODULE_EVENT_PERSISTENCE,
        raw::REDISMODULE_EVENT_REPLICA_CHANGE,
        raw::REDISMODULE_EVENT_CONFIG,
        raw::REDISMODULE_EVENT_CRON_LOOP,
        raw::REDISMODULE_EVENT_CLIENT_CHANGE,
    ] {
        // SAFETY: as above.
        unsafe {
            api!(RedisModule_SubscribeToServerEvent, 0;
                ctx, raw::RedisModuleEvent { id: event, dataver: 1 }, Some(events::on_server_event))
        };
    }
}

/// The `INFO flock` section (fields appear as `flock_<name>`).
unsafe extern "C" fn info(ctx: *mut raw::RedisModuleInfoCtx, _for_crash_report: i32) {
    // SAFETY: the INFO context Redis passed; the names are NUL-terminated.
    unsafe { api!(RedisModule_InfoAddSection, 0; ctx, c"".as_ptr()) };
    let holds = stats::with_classes(|table| {
        let h = &table.all_holds;
        [
            h.quantile(0.5).unwrap_or(0),
            h.quantile(0.99).unwrap_or(0),
            h.max(),
        ]
    });
    let fields: [(&CStr, u64); 19] = [
        (c"grants", stats::GRANTS.get()),
        (c"releases", stats::RELEASES.get()),
        (c"expirations", stats::EXPIRATIONS.get()),
        (c"revokes", stats::REVOKES.get()),
        (c"renewals", stats::RENEWALS.get()),
        (c"contended_acquires", stats::CONTENDED.get()),
        (c"blocked_acquires", stats::BLOCKED.get()),
        (c"blocked_clients", waiters::blocked_now() as u64),
        (c"timeouts", stats::TIMEOUTS.get()),
        (c"fenced_accepted", stats::FENCED_ACCEPTED.get()),
        (c"fenced_rejected", stats::FENCED_REJECTED.get()),
        (c"fenced_inner_errors", stats::FENCED_INNER_ERRORS.get()),
        // Bound grants ended because their connection closed (or had none on this master).
        (c"bound_closed", stats::BOUND_CLOSED.get()),
        (c"bound_grants", crate::bindings::count() as u64),
        (c"token_high_water", server::tokens().high_water()),
        (
            c"replicating_effects",
            server::replication_consumed() as u64,
        ),
        // How long grants ended by RELEASE were held, over all lock classes (FLOCK.STATS).
        (c"hold_ms_p50", holds[0]),
        (c"hold_ms_p99", holds[1]),
        (c"hold_ms_max", holds[2]),
    ];
    for (name, value) in fields {
        // SAFETY: as above.
        unsafe {
            api!(RedisModule_InfoAddFieldULongLong, 0; ctx, name.as_ptr() as *const c_char, value)
        };
    }
}

redis_module! {
    name: "flock",
    version: 1,
    allocator: (redis_module::alloc::RedisAlloc, redis_module::alloc::RedisAlloc),
    data_types: [LOCK_TYPE],
    init: init,
    commands: [],
    // Configs are registered by config::init, which validates the load arguments first.
}
