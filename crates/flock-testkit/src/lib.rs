//! The test harness shared by flock's integration tests (`tests/*.rs`) and its benchmark
//! (`benches/flock`): throw-away redis-server (or valkey-server) processes with the module
//! loaded, each in its own temp dir on its own loopback port and killed on drop; two RESP
//! clients (redis-rs for ordinary tests, a raw pipelining one for fuzzing and benchmarks);
//! INFO parsing; one seeded RNG; and the flock command helpers the tests assert with.
//!
//! Environment:
//! - `REDIS_SERVER`: server binary (default `redis-server`; `valkey-server` works too).
//! - `FLOCK_MODULE`: module path (default `<workspace>/target/release/libredis_flock.so`).
//! - `VALKEY_SERVER`, `FLOCK_FAKETIME_LIB`: see [`env::valkey_server`], [`env::faketime_lib`].
//! - `FLOCK_KEEP_TMP=1`: keep the temp dirs (logs, RDB, AOF) for post-mortem.
//!
//! Tests do `use flock_testkit::*;`: every module's items are re-exported here, except the
//! async helpers of [`aio`] (feature `aio`), which tests on tokio import as
//! `flock_testkit::aio::*`.

#[cfg(feature = "aio")]
pub mod aio;
pub mod builder;
pub mod cluster;
pub mod env;
pub mod events;
pub mod files;
pub mod flock;
pub mod info;
pub mod raw;
pub mod reply;
pub mod rng;
pub mod server;
pub mod wait;

pub use builder::*;
pub use cluster::*;
pub use env::*;
pub use events::*;
pub use flock::*;
pub use info::*;
pub use raw::*;
pub use reply::*;
pub use rng::*;
pub use server::*;
pub use wait::*;
