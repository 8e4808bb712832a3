//! flock's fuzz drivers: they take raw bytes (libFuzzer's input in `fuzz/`, or a seeded
//! random generator's output in `tests/fuzz_smoke.rs`) and panic on any broken rule. They
//! depend on `flock-core` alone, so they run the very engine the module runs, without a
//! server.
//!
//! - [`args_target`]: every parser against an independent reference written from the
//!   contract.
//! - [`state_machine_target`]: random operation sequences on keys of every kind (exclusive,
//!   shared, permits) through the engine against a reference model written from the
//!   contract, with G1-G4, G6, G7, G9 and G11 (BOUND grants and the bindings index) as
//!   assertions.
//! - [`multi_block_target`]: FLOCK.MACQUIRE with BLOCK among one-key waiters, releases and
//!   time, through the engine as the module runs it, against a model of its own: G1 per key,
//!   nobody overtakes an earlier waiter, no missed wake-up or deadlock.
//!
//! A saved failing input replays without libFuzzer:
//! `FLOCK_FUZZ_TRACE=1 cargo run --release -p flock-fuzz --example replay -- state_machine FILE`.

mod args;
mod bytes;
mod engine;

pub use args::{args_target, check_args, ref_int};
pub use bytes::Bytes;
pub use engine::{
    multi_block_counted, multi_block_target, state_machine_counted, state_machine_run,
    state_machine_target, BoundSeen, MultiSeen,
};
