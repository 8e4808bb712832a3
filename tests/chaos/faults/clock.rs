//! The fault that takes the clock out of G3: the replica's wall clock is set a day back, it
//! misses the old master's last grants, and it is promoted. Every token it issues must still
//! be above every token the old master issued, lost ones included (SPEC "Tokens without a
//! clock assumption"; the checker holds every grant to that).
//!
//! The servers run under libfaketime (a clock file per server, read at every clock call) and
//! load a copy of the module that names libfaketime as a needed library: servers open modules
//! with RTLD_DEEPBIND, so a preloaded libfaketime alone would fake the server's clock but not
//! the module's. Debian's redis-server (jemalloc) dies at start under libfaketime, so `make
//! chaos` asks for this (FLOCK_CHAOS_FAKETIME=1) on its valkey-server run only.
//!
//! Lease deadlines travel as wall-clock times (G9): on the promoted server the leases that
//! crossed over would last a day longer, and leases it grants would end at once on a server
//! with the right clock; a lock-delay slot that crossed over would hold its key a day. That is
//! the documented cost of a wrong clock for leases, not for tokens, so the injector keeps it
//! out of the history: it deletes every lock key (recorded as an operator's DEL; tokens must
//! grow through DEL too) right after the promotion and again before it sets the clock right,
//! both while every client is paused.

use super::*;
use std::path::PathBuf;
use std::time::{SystemTime, UNIX_EPOCH};

/// The two servers of a run: on the real clock, or (`faked`) under libfaketime, each with its
/// clock file (reading "+0" for now).
pub(crate) fn chaos_servers(faked: bool) -> (Vec<Server>, Vec<PathBuf>) {
    if !faked {
        return (vec![aof_server(), aof_server()], Vec::new());
    }
    const TEST: &str = "chaos with FLOCK_CHAOS_FAKETIME=1";
    let Some(lib) = faketime_lib() else {
        missing(TEST, "libfaketime (apt-get install faketime)");
    };
    let mut servers = Vec::new();
    let mut clocks = Vec::new();
    for _ in 0..2 {
        let dir = temp_dir("chaos-clock");
        let Some(module) = module_with_faketime(&dir, &lib) else {
            missing(TEST, "patchelf (apt-get install patchelf)");
        };
        let clock = dir.join("faketime.rc");
        std::fs::write(&clock, "+0\n").expect("clock file");
        servers.push(
            Server::builder()
                .module(&module)
                .dir(dir)
                .env("LD_PRELOAD", &lib.display().to_string())
                .env("FAKETIME_TIMESTAMP_FILE", &clock.display().to_string())
                .env("FAKETIME_NO_CACHE", "1")
                .env("DONT_FAKE_MONOTONIC", "1")
                .arg("appendonly", "yes")
                .arg("appendfsync", "always")
                .start_timeout(Duration::from_secs(15))
                .start(),
        );
        clocks.push(clock);
    }
    (servers, clocks)
}

/// Milliseconds since the epoch on this machine's clock.
fn wall_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or(0)
}

/// A server's wall clock in ms (TIME).
fn server_ms(port: u16) -> Option<i64> {
    let r = raw_call(port, &["TIME"]).ok()?;
    let a = r.array()?;
    let s: i64 = a.first()?.string()?.parse().ok()?;
    let us: i64 = a.get(1)?.string()?.parse().ok()?;
    Some(s * 1000 + us / 1000)
}

impl Injector {
    /// Set server `i`'s clock to `offset` ("-1d", "+0") and make sure it took: its TIME must
    /// then be `behind_ms` behind this machine's clock, give or take a minute.
    fn set_clock(&self, i: usize, offset: &str, behind_ms: i64) -> bool {
        let Some(file) = self.clocks.get(i) else {
            return false;
        };
        if std::fs::write(file, format!("{offset}\n")).is_err() {
            self.sh
                .hist()
                .violation(format!("cannot write the clock file {}", file.display()));
            return false;
        }
        sleep(Duration::from_millis(20));
        let port = self.servers[i].port();
        let got = server_ms(port).map(|ms| wall_ms() - ms);
        if got.is_some_and(|d| (d - behind_ms).abs() < 60_000) {
            return true;
        }
        self.sh.hist().violation(format!(
            "the clock of the server on port {port} did not move to {offset}: it is {got:?} ms \
             behind this machine's, not {behind_ms}"
        ));
        false
    }

    /// Before the promotion of a replica a day behind: set its clock back.
    pub(crate) fn clock_back(&self, replica: usize) -> bool {
        self.set_clock(replica, "-1d", 86_400_000)
    }

    /// DEL of every lock key on the master (grants, waiters and lock-delay slots), recorded as
    /// an operator's action. Called while every client is paused.
    fn delete_all(&self) {
        let port = self.master_port();
        for k in 0..self.sh.keys {
            let send = self.sh.now();
            let _ = raw_call(port, &["DEL", &self.sh.lock_key(k)]);
            let done = self.sh.now();
            self.sh.hist().operator.push(OperatorOp {
                key: k,
                owner: None,
                send,
                done,
            });
        }
        self.check("lock keys deleted around a promotion a day behind", 1);
    }

    /// Right after the promotion of a replica a day behind (clients paused, survivors
    /// verified): end the leases and delays that crossed over (a day too long here) and note
    /// the span.
    pub(crate) fn skew_begins(&self) {
        self.delete_all();
        let now = self.sh.now();
        self.sh.hist().skewed.push((now, u64::MAX));
    }

    /// After the clients have had a while on the master a day behind: pause them, end the
    /// leases it granted (their deadlines are a day behind every other clock), set its clock
    /// right, let them go on.
    pub(crate) fn skew_ends(&self) {
        self.pause_all();
        self.delete_all();
        let now = self.sh.now();
        if let Some(s) = self.sh.hist().skewed.last_mut() {
            s.1 = now;
        }
        self.set_clock(self.master, "+0", 0);
        self.sh.gate.resume();
    }
}
