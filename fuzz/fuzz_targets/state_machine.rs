#![no_main]
libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    flock_fuzz::state_machine_target(data);
});
