//! Module registration: data type, commands, configuration, INFO, events.

use crate::ffi::{self, Ctx};
use crate::lock_type::LOCK_TYPE;
use crate::{commands, config, expiry, rm, server, stats};
use redis_module::configuration::ConfigurationFlags;
use redis_module::{raw, redis_module, Context, RedisString, Status};
use std::os::raw::c_void;

fn init(ctx: &Context, _args: &[RedisString]) -> Status {
    let raw_ctx = ctx.ctx;
    if let Some(name) = ffi::missing_api() {
        ctx.log_warning(&format!("flock: this server lacks {name}; refusing to load"));
        return Status::Err;
    }
    let lock_type = *LOCK_TYPE.raw_type.borrow();
    server::init(raw_ctx, lock_type);
    ctx.set_module_options(raw::ModuleOptions::HANDLE_IO_ERRORS);
    if let Err(e) = commands::register(raw_ctx) {
        ctx.log_warning(&format!("flock: {e}"));
        return Status::Err;
    }
    rm!(RedisModule_RegisterInfoFunc, 0; raw_ctx, Some(stats::info));
    rm!(RedisModule_SubscribeToKeyspaceEvents, 0;
        raw_ctx, raw::REDISMODULE_NOTIFY_GENERIC, Some(expiry::on_keyspace_event));
    for event in [
        raw::REDISMODULE_EVENT_REPLICATION_ROLE_CHANGED,
        raw::REDISMODULE_EVENT_LOADING,
    ] {
        rm!(RedisModule_SubscribeToServerEvent, 0;
            raw_ctx, raw::RedisModuleEvent { id: event, dataver: 1 }, Some(on_server_event));
    }
    Status::Ok
}

/// Role changes and the end of loading: refresh the role, and on a master arm expiry timers
/// for every lock (a replica never expires leases on its own).
unsafe extern "C" fn on_server_event(
    ctx: Ctx,
    event: raw::RedisModuleEvent,
    subevent: u64,
    _data: *mut c_void,
) {
    let relevant = match event.id {
        raw::REDISMODULE_EVENT_REPLICATION_ROLE_CHANGED => true,
        raw::REDISMODULE_EVENT_LOADING => subevent == raw::REDISMODULE_SUBEVENT_LOADING_ENDED,
        _ => false,
    };
    if relevant {
        server::refresh_role(ctx);
        if event.id == raw::REDISMODULE_EVENT_REPLICATION_ROLE_CHANGED {
            server::set_master(subevent == raw::REDISMODULE_EVENT_REPLROLECHANGED_NOW_MASTER);
        }
        expiry::arm_all(ctx);
    }
}

#[cfg(not(test))]
redis_module! {
    name: "flock",
    version: 1,
    allocator: (redis_module::alloc::RedisAlloc, redis_module::alloc::RedisAlloc),
    data_types: [LOCK_TYPE],
    init: init,
    commands: [],
    configurations: [
        i64: [
            ["max-ttl-ms", &config::MAX_TTL_MS, config::MAX_TTL_DEFAULT, 1, config::MAX_TTL_LIMIT, ConfigurationFlags::DEFAULT, None],
        ],
        string: [],
        bool: [],
        enum: [],
        module_args_as_configuration: true,
    ]
}

