//! The machine: file descriptor limit, load, CPUs, memory, kernel, and running tools.

use std::process::{Command, Stdio};
use std::thread::{self};

/// Raise RLIMIT_NOFILE's soft limit to the hard limit (the waiters scenario opens one socket
/// per waiter, and the server it starts inherits the limit).
pub(crate) fn raise_nofile() -> u64 {
    #[repr(C)]
    struct RLimit {
        cur: u64,
        max: u64,
    }
    extern "C" {
        fn getrlimit(resource: i32, rlim: *mut RLimit) -> i32;
        fn setrlimit(resource: i32, rlim: *const RLimit) -> i32;
    }
    const RLIMIT_NOFILE: i32 = 7;
    let mut r = RLimit { cur: 0, max: 0 };
    // SAFETY: plain libc calls with a valid pointer to a properly laid out struct.
    unsafe {
        if getrlimit(RLIMIT_NOFILE, &mut r) != 0 {
            return 1024;
        }
        let want = RLimit {
            cur: r.max,
            max: r.max,
        };
        if setrlimit(RLIMIT_NOFILE, &want) == 0 {
            return r.max;
        }
    }
    r.cur
}

pub(crate) fn read_to_string(p: &str) -> String {
    std::fs::read_to_string(p).unwrap_or_default()
}

pub(crate) fn loadavg() -> String {
    read_to_string("/proc/loadavg")
        .split_whitespace()
        .take(3)
        .collect::<Vec<_>>()
        .join(" ")
}

pub(crate) fn run_out(cmd: &str, args: &[&str]) -> Option<String> {
    let o = Command::new(cmd)
        .args(args)
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .stderr(Stdio::null())
        .output()
        .ok()?;
    o.status
        .success()
        .then(|| String::from_utf8_lossy(&o.stdout).trim().to_string())
}

pub(crate) fn ncpu() -> usize {
    thread::available_parallelism().map_or(1, |n| n.get())
}

pub(crate) fn machine() -> Vec<(String, String)> {
    let cpu = read_to_string("/proc/cpuinfo")
        .lines()
        .find(|l| l.starts_with("model name"))
        .and_then(|l| l.split_once(':'))
        .map_or("unknown".to_string(), |(_, v)| v.trim().to_string());
    let mem = read_to_string("/proc/meminfo")
        .lines()
        .find(|l| l.starts_with("MemTotal"))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|v| v.parse::<f64>().ok())
        .map_or("unknown".to_string(), |kb| {
            format!("{:.1} GiB", kb / 1024.0 / 1024.0)
        });
    let kernel = read_to_string("/proc/sys/kernel/osrelease")
        .trim()
        .to_string();
    vec![
        ("CPUs (nproc)".into(), ncpu().to_string()),
        ("CPU model".into(), cpu),
        ("memory".into(), mem),
        ("kernel".into(), kernel),
    ]
}

pub(crate) fn date_utc() -> String {
    run_out("date", &["-u", "+%Y-%m-%d %H:%M UTC"]).unwrap_or_else(|| "unknown".into())
}
