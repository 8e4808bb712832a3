//! flock: native fenced distributed locks for Redis (the loadable module).
//!
//! What a lock does is decided by the `flock-core` crate (its engine); this crate is the
//! glue that runs it inside Redis. Its folders, from the leaves up (each imports only from
//! the ones before it):
//! - `ffi/`: the module API, and the only unsafe code of the crate (denied everywhere else,
//!   below). Safe handles with lifetimes (`Ctx`, `RStr`, `Key`), safe decodings (context
//!   flags, server events, key flags), the lock's memory block (`ffi/block.rs`, its layout
//!   private there), and a thin trampoline for every callback Redis calls, handing safe
//!   arguments to a handler given to it as a type parameter.
//! - `server/`: the shared server state: the token issuer, the role, the clocks, the
//!   replication consumers (`mod.rs`), the configs' live values (`config.rs`), the INFO
//!   counters and FLOCK.STATS's table (`stats.rs`).
//! - `store/`: what is kept per lock key beside its block: the deadline index and its timer
//!   (`expiry.rs`), and the one index of which connection holds which BOUND grant
//!   (`bindings.rs`: flock-core's `BindingIndex`, kept on the main thread).
//! - `waiting/`: blocked clients and their queues (`waiters.rs`), deferred work on keys
//!   (`jobs.rs`), blocked FLOCK.WATCH clients and what they are told (`watchers.rs`).
//! - `peers/`: what other servers are told: the replication effects (`replication.rs`), the
//!   cluster bus and slot checks (`cluster.rs`).
//! - `commands/`: the one executor (`executor.rs`: opens the key as the store holds it, runs
//!   an engine operation, carries out the outcome), replies (`reply.rs`), the command
//!   handlers (`handlers.rs`), FLOCK.FENCED (`fenced.rs`), FLOCK.STATS (`stats.rs`),
//!   FLOCK.WATCH and FLOCK.WAITERS (`watch.rs`), FLOCK.MACQUIRE (`macquire.rs`).
//! - `registration/`: the module's init and everything it registers (`module.rs`, with the
//!   one command table: flock-core's descriptions paired with their handlers), the configs
//!   (`config.rs`), the data type's callbacks
//!   (`lock_type.rs`), keyspace and server events, due deadlines and deferred jobs
//!   (`events.rs`).
//!
//! The mechanisms never call upward: what a due deadline or a deferred job does is handed to
//! them by the registration (`expiry::set_due_handler`, `jobs::set_runner`).

#![deny(unsafe_code)]

#[allow(unsafe_code)]
mod ffi;

mod server;

mod store {
    pub mod bindings;
    pub mod expiry;
}

mod waiting {
    pub mod jobs;
    pub mod waiters;
    pub mod watchers;
}

mod peers {
    pub mod cluster;
    pub mod replication;
}

mod commands {
    pub mod executor;
    pub mod fenced;
    pub mod handlers;
    pub mod macquire;
    pub mod reply;
    pub mod stats;
    pub mod watch;
}

mod registration {
    pub mod config;
    pub mod events;
    pub mod lock_type;
    pub mod module;
}

/// The module's entry point: Redis calls `RedisModule_OnLoad`, which runs the registration's
/// init through `ffi::on_load` (the crate root is the one place that names both).
fn on_load(
    load: &redis_module::Context,
    args: &[redis_module::RedisString],
) -> redis_module::Status {
    ffi::on_load::<registration::module::Flock>(load, args)
}

redis_module::redis_module! {
    name: "flock",
    // MODULE LIST's `ver`: the crate's version 0.1.0 as major * 10000 + minor * 100 + patch
    // (the form Redis's own modules use), checked against Cargo.toml by tests/commands.rs.
    version: 100,
    allocator: (redis_module::alloc::RedisAlloc, redis_module::alloc::RedisAlloc),
    // The data type is created by the init (`create_lock_type`), first thing.
    data_types: [],
    init: on_load,
    commands: [],
    // Configs are registered by registration::config::init, which validates the load
    // arguments first.
}
