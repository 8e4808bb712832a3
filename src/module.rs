//! Module registration: data type, commands, configuration, INFO, events.

use crate::ffi;
use crate::lock_type::LOCK_TYPE;
use crate::{commands, config, events, rm, server, stats};
use redis_module::configuration::ConfigurationFlags;
use redis_module::{raw, redis_module, Context, RedisString, Status};

fn init(ctx: &Context, _args: &[RedisString]) -> Status {
    let raw_ctx = ctx.ctx;
    if let Some(name) = ffi::missing_api() {
        ctx.log_warning(&format!(
            "flock: this server lacks {name}; refusing to load"
        ));
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
    events::subscribe(raw_ctx);
    crate::cluster::init(raw_ctx);
    Status::Ok
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
            ["max-waiters", &config::MAX_WAITERS, config::MAX_WAITERS_DEFAULT, 0, config::MAX_WAITERS_LIMIT, ConfigurationFlags::DEFAULT, None],
            ["lock-delay-ms", &config::LOCK_DELAY_MS, 0, 0, config::LOCK_DELAY_LIMIT, ConfigurationFlags::DEFAULT, None],
        ],
        string: [],
        bool: [],
        enum: [],
        module_args_as_configuration: true,
    ]
}
