//! flock-core: the lock engine of flock, in plain Rust with no Redis types.
//!
//! Everything that decides what a lock does lives here, so that unit tests, table tests and
//! fuzzers run it without a server (`cargo test -p flock-core`). The Redis module
//! (`redis-flock`, the crate at the repository root) reads the clocks, opens keys, calls the
//! [`engine`] and executes the effects it returns; it decides nothing itself.
//!
//! One concern per file, lowest first:
//! - [`clock`]: the two clocks of a command ([`clock::Now`]) and deadlines on both.
//! - [`tokens`]: the fencing token issuer and the token space.
//! - [`queue`]: the waiters of one key.
//! - [`grant`]: one grant (owner, token, lease, binding).
//! - [`grants`]: the grants of one key (owner index, due hint).
//! - [`state`]: the state of one lock key and its rules.
//! - [`snapshot`]: the persisted form of a lock (RDB, AOF, digest, replication, FLOCK.APPLY).
//! - [`args`]: argument parsing (Redis's integer rules) and the error texts of malformed calls.
//! - [`commands`]: the command table: names, flags, arity, key specs, COMMAND DOCS.
//! - [`settings`]: the module's configs: defaults, ranges and their one validation.
//! - [`lock_stats`]: FLOCK.STATS: lock classes, histograms, TTL advice (the module keeps
//!   one table and records every grant's end in it).
//! - [`deadlines`]: the deadline index behind the module's timers.
//! - [`slots`]: Redis Cluster key slots and `CLUSTER NODES` parsing.
//! - [`engine`]: every operation on a key: state and clock in, reply and effects out.
//! - [`fence`]: FLOCK.FENCED's rules: what a token lets the inner command do.
//! - [`key_name`]: a key name kept inline when short (the bindings index, the module's
//!   deadline entries).
//! - [`bindings`]: which connection holds which BOUND grant, by key and token.
//! - [`keyspace`]: what becomes of locks when Redis moves keys or the server changes role,
//!   loads, flushes or swaps databases.
//! - [`migration`]: Valkey 9's atomic slot migration: whether to declare it, and what each of
//!   its events asks.
//! - [`apply`]: the `FLOCK.APPLY` effect command's encoder (its decoder is
//!   [`args::parse_apply`]).
//! - [`rdb`]: the RDB layout of a lock value (encoding versions 1 and 2), its digest, and the
//!   token high-water mark saved as aux data.
//! - [`errors`]: every error reply the module sends, in one table.
//! - [`watch`]: FLOCK.WATCH's rules (what a watcher is told, and when) and FLOCK.WAITERS'.
//! - [`multi`]: FLOCK.MACQUIRE's rules: parsing, when a request is granted (at the call or
//!   while it waits on all its keys), each key's grant as an ordinary ACQUIRE.
//!
//! No `unsafe` here: the module's glue (`src/`) holds every FFI call.

#![forbid(unsafe_code)]

pub mod apply;
pub mod args;
pub mod bindings;
pub mod clock;
pub mod commands;
pub mod deadlines;
pub mod engine;
pub mod errors;
pub mod fence;
pub mod grant;
pub mod grants;
pub mod key_name;
pub mod keyspace;
pub mod lock_stats;
pub mod migration;
pub mod multi;
pub mod queue;
pub mod rdb;
pub mod settings;
pub mod slots;
pub mod snapshot;
pub mod state;
pub mod tokens;
pub mod watch;

#[cfg(test)]
mod test_states;

pub use clock::{Deadline, Now};
pub use queue::{WaitQueue, Waiter};
pub use snapshot::Snapshot;
pub use state::{Acquired, Grant, LockState, MAX_OWNER_LEN};
pub use tokens::{TokenIssuer, MAX_TOKEN};
