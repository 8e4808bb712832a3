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
    let mut seen = flock_fuzz::BoundSeen::default();
    let mut steps = 0;
    for _ in 0..iterations() {
        let (n, s) = flock_fuzz::state_machine_counted(&rng.bytes(4000));
        steps += n;
        seen.add(&s);
    }
    eprintln!("state machine: {steps} steps; BOUND paths: {seen:#?}");
    assert!(steps > iterations() * 10, "the driver ran: {steps} steps");
    // The BOUND paths are reached: granted at once and handed to a waiter, rebound, closed
    // with grants, orphaned by travel while live; and a COPY onto a waited name that ends the
    // waits of the owners it brings grants of, or refuses the waiters of another limit.
    if iterations() >= 300 {
        for (what, n) in [
            ("granted", seen.bound_granted),
            ("handed", seen.bound_handed),
            ("rebound", seen.rebound),
            ("bound to unbound", seen.bound_to_unbound),
            ("unbound to bound", seen.unbound_to_bound),
            ("closed", seen.closed_grants),
            ("waiters left", seen.bound_waiters_left),
            ("orphaned live", seen.orphaned_live),
            ("holders dismissed", seen.holders_dismissed),
            ("limits refused", seen.limits_refused),
            ("renames", seen.renames),
        ] {
            assert!(n > 0, "no BOUND path {what} in {steps} steps: {seen:?}");
        }
    }
}

#[test]
fn multi_block_driver_on_random_inputs() {
    let mut rng = Rng(0xA076_1D64_78BD_642F);
    let mut seen = flock_fuzz::MultiSeen::default();
    let mut steps = 0;
    for _ in 0..iterations() {
        let (n, s) = flock_fuzz::multi_block_counted(&rng.bytes(4000));
        steps += n;
        seen.add(&s);
    }
    eprintln!("MACQUIRE BLOCK: {steps} steps; paths: {seen:#?}");
    assert!(steps > iterations() * 10, "the driver ran: {steps} steps");
    // Every path is reached: granted at the call, queued, granted all together after waiting
    // (also with a key its owner held), tried while a key was busy, timed out, left, a
    // one-key waiter handed its key, refused by max-waiters.
    if iterations() >= 300 {
        for (what, n) in [
            ("granted at the call", seen.granted_at_call),
            ("queued", seen.queued),
            ("granted together", seen.granted_together),
            ("kept own", seen.kept_own),
            ("tried busy", seen.tried_busy),
            ("timed out", seen.timed_out),
            ("left", seen.left),
            ("handed single", seen.handed_single),
            ("too many", seen.too_many),
        ] {
            assert!(
                n > 0,
                "no MACQUIRE BLOCK path {what} in {steps} steps: {seen:?}"
            );
        }
    }
}
