//! Waiting for things that "should happen soon", and the clocks tests compare with.

use std::thread::sleep;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

/// Generous bound for anything that "should happen soon" on a loaded 2-core CI box.
pub const DEADLINE: Duration = Duration::from_secs(10);
/// Poll interval for `wait_until`.
pub const POLL: Duration = Duration::from_millis(15);

/// Poll `cond` every ~15 ms until it holds or `timeout` passes; returns whether it held.
pub fn poll_until(timeout: Duration, mut cond: impl FnMut() -> bool) -> bool {
    let start = Instant::now();
    loop {
        if cond() {
            return true;
        }
        if start.elapsed() > timeout {
            return false;
        }
        sleep(POLL);
    }
}

/// Wait (up to `DEADLINE`) for `cond`; panic with `what` otherwise.
#[track_caller]
pub fn wait_until(what: &str, cond: impl FnMut() -> bool) {
    if !poll_until(DEADLINE, cond) {
        panic!("timed out after {DEADLINE:?} waiting for: {what}");
    }
}

/// Microseconds since the epoch (local wall clock).
pub fn now_us() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_micros() as i64)
        .unwrap_or(0)
}

/// Milliseconds since the epoch (local wall clock).
pub fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or(0)
}

/// Byte-substring search (ASCII case-insensitive).
pub fn contains_bytes(hay: &[u8], needle: &[u8]) -> bool {
    needle.is_empty()
        || hay
            .windows(needle.len())
            .any(|w| w.eq_ignore_ascii_case(needle))
}
