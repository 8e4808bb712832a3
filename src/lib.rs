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

mod bindings;
mod cluster;
mod command_info;
mod commands;
mod config;
mod effects;
mod events;
mod expiry;
mod fenced;
mod ffi;
mod jobs;
mod key_name;
mod lock_type;
mod module;
mod record;
mod replication;
mod server;
mod stats;
mod stats_command;
mod waiters;
