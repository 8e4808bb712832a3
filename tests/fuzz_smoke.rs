//! The cargo-fuzz drivers (crates/flock-fuzz) on seeded random inputs, so that `make test`
//! runs them without libFuzzer: the argument parsers against a reference, and the lock engine
//! (every lock kind) against a reference model with G1-G7 and G9 as assertions, and MACQUIRE
//! with BLOCK against a model of its own (G1, nobody overtakes, no deadlock). `make fuzz`
//! runs the same drivers under libFuzzer with coverage guidance.
//!
//! FLOCK_FUZZ_SMOKE_ITERS sets the number of inputs per driver (default 20000 for the parsers,
//! 40000, about ten million steps, for the state machine); FLOCK_FUZZ_SEED another seed.

use flock_fuzz as drivers;
use flock_testkit::rng::Rng;
use std::sync::atomic::{AtomicUsize, Ordering};

fn iterations(default: usize) -> usize {
    std::env::var("FLOCK_FUZZ_SMOKE_ITERS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(default)
}

fn seed() -> u64 {
    std::env::var("FLOCK_FUZZ_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(0x5DEE_CE66_D1CE_4E5B)
}

/// Run `f` on random inputs; a failing input is saved to a file that the cargo-fuzz target of
/// the same name replays: `cd fuzz && RUSTC_BOOTSTRAP=1 cargo fuzz run NAME FILE`.
fn run(name: &str, n: usize, max_len: usize, f: fn(&[u8])) {
    let mut rng = Rng::new(seed());
    for i in 0..n {
        let input = rng.bytes(max_len);
        let r = std::panic::catch_unwind(|| f(&input));
        if r.is_err() {
            let path = std::env::temp_dir().join(format!("flock-fuzz-smoke-{name}-{i}.bin"));
            let _ = std::fs::write(&path, &input);
            panic!(
                "{name}: input {i} of {n} failed (see the panic above); saved to {}; replay: \
                 cd fuzz && RUSTC_BOOTSTRAP=1 cargo fuzz run {name} {}",
                path.display(),
                path.display()
            );
        }
    }
    eprintln!("{name}: {n} random inputs, no violation");
}

#[test]
fn args_parsers_match_the_reference() {
    run("args", iterations(20_000), 200, drivers::args_target);
}

/// Steps the state machine ran in this process.
static STEPS: AtomicUsize = AtomicUsize::new(0);

#[test]
fn state_machine_matches_the_model_and_keeps_g1_to_g6() {
    let n = iterations(40_000);
    run("state_machine", n, 4000, |data| {
        STEPS.fetch_add(drivers::state_machine_run(data), Ordering::Relaxed);
    });
    // Inputs average 2000 bytes, some 8 bytes a step: a driver that gives up early (every
    // step skipped, or the input misread) shows here rather than passing vacuously.
    let steps = STEPS.load(Ordering::Relaxed);
    eprintln!("state_machine: {steps} steps");
    assert!(steps >= n * 100, "only {steps} steps in {n} inputs");
}

#[test]
fn macquire_block_matches_its_model_without_overtaking_or_deadlock() {
    static MB_STEPS: AtomicUsize = AtomicUsize::new(0);
    let n = iterations(20_000);
    run("multi_block", n, 4000, |data| {
        MB_STEPS.fetch_add(drivers::multi_block_counted(data).0, Ordering::Relaxed);
    });
    let steps = MB_STEPS.load(Ordering::Relaxed);
    eprintln!("multi_block: {steps} steps");
    assert!(steps >= n * 100, "only {steps} steps in {n} inputs");
}
