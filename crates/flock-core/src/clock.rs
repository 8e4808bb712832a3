//! The two clocks a command reads once ([`Now`]) and points in time on both ([`Deadline`]).
//!
//! Plain Rust, no Redis types: time is injected, so every rule built on it is tested
//! table-style with `cargo test`.

/// A reading of the two clocks, taken once per command.
///
/// `wall_ms` is the Unix wall clock (it travels: replication, RDB and AOF carry absolute
/// deadlines). `mono_us` is a monotonic clock local to this process (lease time on a running
/// server is measured on it, so a wall-clock step neither shortens nor stretches a lease: G9).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Now {
    /// Unix wall clock in microseconds: the floor of every new token.
    pub wall_us: u64,
    /// The same reading in milliseconds: what deadlines are written in.
    pub wall_ms: i64,
    pub mono_us: u64,
}

impl Now {
    /// A reading from a wall clock in microseconds and a monotonic clock.
    pub fn new(wall_us: u64, mono_us: u64) -> Now {
        Now {
            wall_us,
            wall_ms: i64::try_from(wall_us / 1000).unwrap_or(i64::MAX),
            mono_us,
        }
    }
}

/// A point in time on both clocks: the wall-clock value travels (replication, RDB, AOF), the
/// monotonic one decides on this server.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Deadline {
    /// Absolute wall-clock time in Unix milliseconds.
    pub wall_ms: i64,
    /// The same moment on this process's monotonic clock.
    pub mono_us: u64,
}

impl Deadline {
    /// `ms` milliseconds after `now`.
    pub fn after(ms: u64, now: Now) -> Deadline {
        Deadline {
            wall_ms: now
                .wall_ms
                .saturating_add(i64::try_from(ms).unwrap_or(i64::MAX)),
            mono_us: now.mono_us.saturating_add(ms.saturating_mul(1000)),
        }
    }

    /// A deadline that arrived as an absolute wall-clock time: on this server it is what is
    /// left of it by the local wall clock.
    pub fn from_wall(wall_ms: i64, now: Now) -> Deadline {
        let left_ms = u64::try_from(wall_ms.saturating_sub(now.wall_ms)).unwrap_or(0);
        Deadline {
            wall_ms,
            mono_us: now.mono_us.saturating_add(left_ms.saturating_mul(1000)),
        }
    }

    /// `ms` milliseconds after this deadline.
    pub fn plus(self, ms: u64) -> Deadline {
        Deadline {
            wall_ms: self
                .wall_ms
                .saturating_add(i64::try_from(ms).unwrap_or(i64::MAX)),
            mono_us: self.mono_us.saturating_add(ms.saturating_mul(1000)),
        }
    }

    pub fn passed(self, now: Now) -> bool {
        now.mono_us >= self.mono_us
    }

    /// Microseconds until the deadline (0 once passed).
    pub fn remaining_us(self, now: Now) -> u64 {
        self.mono_us.saturating_sub(now.mono_us)
    }

    /// Whole milliseconds until the deadline, rounded up: at least 1 before it, 0 after.
    pub fn remaining_ms(self, now: Now) -> u64 {
        self.remaining_us(now).div_ceil(1000)
    }
}
