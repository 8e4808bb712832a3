//! flock: native fenced distributed locks for Redis.
//!
//! Layout, one concern per file:
//! - `core`: the lock state machine and token issuing (pure Rust, injected clock).
//! - `args`: argument parsing (pure).
//! - `commands`: the FLOCK.* command handlers (glue).
//! - `lock_type`: the `flocklock` data type and its persistence callbacks.
//! - `replication`: the effect command replicated and written to the AOF.
//! - `expiry`: active lease expiry with Redis timers.
//! - `settings`: the configs and their one validation (pure); `config`: their registration.
//! - `server`: server-wide state (tokens, role, clocks); `stats`: INFO.
//! - `ffi`: thin, panic-free access to the module API.

pub mod args;
pub mod core;
pub mod deadlines;
pub mod lock_stats;
pub mod settings;
pub mod slots;

#[cfg(not(test))]
mod cluster;
#[cfg(not(test))]
mod commands;
#[cfg(not(test))]
mod config;
#[cfg(not(test))]
mod events;
#[cfg(not(test))]
mod expiry;
#[cfg(not(test))]
mod fenced;
#[cfg(not(test))]
mod ffi;
#[cfg(not(test))]
mod handoff;
#[cfg(not(test))]
mod command_info;
#[cfg(not(test))]
mod lock_type;
#[cfg(not(test))]
mod module;
#[cfg(not(test))]
mod replication;
#[cfg(not(test))]
mod server;
#[cfg(not(test))]
mod stats;
#[cfg(not(test))]
mod waiters;
