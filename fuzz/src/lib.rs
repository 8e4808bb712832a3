//! The pure parts of flock, compiled on their own for fuzzing, plus the fuzz drivers.
//!
//! `core.rs` and `args.rs` are included from the main crate's sources by path, so the fuzz
//! targets test exactly the code the module runs, without linking the module glue (whose
//! global allocator only works inside a Redis server).

#[path = "../../src/core.rs"]
pub mod core;

#[path = "../../src/args.rs"]
pub mod args;

pub mod drivers;
