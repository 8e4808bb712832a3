//! The drivers on a few hundred seeded random inputs, so that `cargo test -p flock-fuzz` runs
//! them (the long run is the root crate's tests/fuzz_smoke.rs; `make fuzz` runs libFuzzer).
//! FLOCK_FUZZ_CRATE_ITERS sets the number of inputs per driver.

/// xorshift64*: inputs that are the same on every run.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    fn bytes(&mut self, max_len: usize) -> Vec<u8> {
        let len = (self.next() % (max_len as u64 + 1)) as usize;
        (0..len).map(|_| self.next() as u8).collect()
    }
}

fn iterations() -> usize {
    std::env::var("FLOCK_FUZZ_CRATE_ITERS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(300)
}

#[test]
fn args_driver_on_random_inputs() {
    let mut rng = Rng(0x9E37_79B9_7F4A_7C15);
    for _ in 0..iterations() * 10 {
        flock_fuzz::args_target(&rng.bytes(200));
    }
}

#[test]
fn state_machine_driver_on_random_inputs() {
    let mut rng = Rng(0x5DEE_CE66_D1CE_4E5B);
    let steps: usize = (0..iterations())
        .map(|_| flock_fuzz::state_machine_run(&rng.bytes(4000)))
        .sum();
    eprintln!("state machine: {steps} steps");
    assert!(steps > iterations() * 10, "the driver ran: {steps} steps");
}
