#![no_main]
libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    redis_flock_fuzz::drivers::args_target(data);
});
