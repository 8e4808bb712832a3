//! Module registration: data type, commands, configuration, INFO, events.

use crate::ffi;
use crate::lock_type::LOCK_TYPE;
use crate::{commands, config, events, rm, server, stats};
use redis_module::{raw, redis_module, Context, RedisString, Status};

fn init(ctx: &Context, args: &[RedisString]) -> Status {
    let raw_ctx = ctx.ctx;
    if let Err(e) = config::init(ctx, args) {
        ctx.log_warning(&format!("refusing to load: {e}"));
        return Status::Err;
    }
    if let Some(name) = ffi::missing_api() {
        ctx.log_warning(&format!(
            "this server lacks {name}; refusing to load"
        ));
        return Status::Err;
    }
    let lock_type = *LOCK_TYPE.raw_type.borrow();
    server::init(raw_ctx, lock_type);
    ctx.set_module_options(raw::ModuleOptions::HANDLE_IO_ERRORS);
    if let Err(e) = commands::register(raw_ctx).and_then(|()| crate::command_info::describe(raw_ctx)) {
        ctx.log_warning(&format!("refusing to load: {e}"));
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
    // Configs are registered by config::init, which validates the load arguments first.
}
