//! The cargo-fuzz drivers (crates/flock-fuzz) on seeded random inputs, so that `make test`
//! runs them without libFuzzer: the argument parsers against a reference, and the lock engine
//! against a reference model with G1-G4, G6, G7 and G9 as assertions. `make fuzz` runs the
//! same drivers under libFuzzer with coverage guidance.
//!
//! FLOCK_FUZZ_SMOKE_ITERS sets the number of inputs per driver (default 20000).

use flock_fuzz as drivers;
use flock_testkit::rng::Rng;

fn iterations() -> usize {
    std::env::var("FLOCK_FUZZ_SMOKE_ITERS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(20_000)
}

fn seed() -> u64 {
    std::env::var("FLOCK_FUZZ_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(0x5DEE_CE66_D1CE_4E5B)
}

/// Run `f` on random inputs; a failing input is saved to a file that the cargo-fuzz target of
/// the same name replays: `cd fuzz && RUSTC_BOOTSTRAP=1 cargo fuzz run NAME FILE`.
fn run(name: &str, max_len: usize, f: fn(&[u8])) {
    let mut rng = Rng::new(seed());
    let n = iterations();
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
    run("args", 200, drivers::args_target);
}

#[test]
fn state_machine_matches_the_model_and_keeps_g1_to_g6() {
    run("state_machine", 4000, drivers::state_machine_target);
}
