#![doc = include_str!("../README.md")]
#![forbid(unsafe_code)]

// The modules are private: the public API is what is re-exported below, at the crate root.
// Imports point one way: in the order error, options, inspect, sync, retry, connection,
// durable, state, watchdog, lease, held, watch, queue, flock, many, election, each module uses
// only modules before it (`Flock::lock_many` is defined in many, `Flock::election` in election).
mod connection;
mod durable;
mod election;
mod error;
mod flock;
mod held;
mod inspect;
mod lease;
mod many;
mod options;
mod queue;
mod retry;
mod state;
mod sync;
mod watch;
mod watchdog;

/// The redis-rs this crate is built on (for `Client`, `ClusterClient`, `cmd`). Use it rather
/// than a `redis` dependency of your own: `Flock::new` takes this version's clients.
pub use redis;

pub use connection::Target;
pub use election::{Election, Leader, Observer};
pub use error::{Error, LossReason, Result};
pub use flock::{Flock, Guard};
pub use inspect::{Holder, Info, Stats, Waiter};
pub use lease::{Lease, LeaseHandle};
pub use many::{Leases, MAX_KEYS};
pub use options::{LockOptions, Mode, Wait};
