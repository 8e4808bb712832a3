#![no_main]
libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    flock_fuzz::multi_block_target(data);
});
