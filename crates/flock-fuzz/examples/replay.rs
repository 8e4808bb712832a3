//! Replays saved fuzz inputs without libFuzzer (for a failure of tests/fuzz_smoke.rs or of
//! `make fuzz`): `cargo run --release -p flock-fuzz --example replay -- state_machine FILE...`
//! (or `args`, `multi_block`). FLOCK_FUZZ_TRACE=1 prints every step of the state machine.

fn main() {
    let mut argv = std::env::args().skip(1);
    let target: fn(&[u8]) = match argv.next().as_deref() {
        Some("state_machine") => flock_fuzz::state_machine_target,
        Some("args") => flock_fuzz::args_target,
        Some("multi_block") => flock_fuzz::multi_block_target,
        _ => {
            eprintln!("usage: replay state_machine|args|multi_block FILE...");
            std::process::exit(2);
        }
    };
    for path in argv {
        let data = std::fs::read(&path).unwrap_or_else(|e| panic!("{path}: {e}"));
        target(&data);
        eprintln!("{path}: no violation");
    }
}
