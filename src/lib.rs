//! flock: native fenced distributed locks for Redis (the loadable module).
//!
//! What a lock does is decided by the `flock-core` crate (its engine); this crate is the
//! glue that runs it inside Redis. Its files, from the leaves up (each imports only from
//! the layers before it):
//! - leaves: `ffi` (the module API, unsafe at each call), `config`, `stats`, `server`
//!   (tokens, role, clocks, the type handle).
//! - the record: `record` (the value under a lock key, reached through its open key).
//! - mechanisms, which never call upward: `expiry` (the deadline index and its timer),
//!   `waiters` (blocked clients and their queues), `jobs` (deferred work), `replication`
//!   (the effect commands), `cluster` (the high-water mark broadcast, slot checks),
//!   `bindings` (which connection holds which BOUND grant).
//! - the effects executor: `effects` (runs an engine operation, carries out its effects).
//! - entry points: `commands`, `fenced`, `stats_command` (FLOCK.STATS), `lock_type` (the
//!   type's callbacks), `events`.
//! - registration: `module` (commands, configs, INFO, events, handlers; `redis_module!`),
//!   with `command_info` (what each command is: arity, key specs, COMMAND DOCS).

#[path = "store/bindings.rs"]
mod bindings;
#[path = "peers/cluster.rs"]
mod cluster;
#[path = "registration/command_info.rs"]
mod command_info;
#[path = "commands/handlers.rs"]
mod commands;
#[path = "server/config.rs"]
mod config;
#[path = "commands/effects.rs"]
mod effects;
#[path = "registration/events.rs"]
mod events;
#[path = "store/expiry.rs"]
mod expiry;
#[path = "commands/fenced.rs"]
mod fenced;
#[path = "ffi/mod.rs"]
mod ffi;
#[path = "waiting/jobs.rs"]
mod jobs;
#[path = "store/key_name.rs"]
mod key_name;
#[path = "registration/lock_type.rs"]
mod lock_type;
#[path = "registration/module.rs"]
mod module;
#[path = "ffi/block.rs"]
mod record;
#[path = "peers/replication.rs"]
mod replication;
#[path = "server/mod.rs"]
mod server;
#[path = "server/stats.rs"]
mod stats;
#[path = "commands/stats.rs"]
mod stats_command;
#[path = "waiting/waiters.rs"]
mod waiters;
