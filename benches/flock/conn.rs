//! The benchmark's view of the shared raw RESP client: pipelines that panic on I/O errors (a
//! benchmark cannot go on without its server), reply tallies, `INFO commandstats`, and a driver
//! that spreads commands over several connections.

use flock_testkit::*;
use std::collections::BTreeMap;
use std::thread::{self, sleep};
use std::time::{Duration, Instant};

/// A connection for the benchmark: the shared [`RawConn`] with a long read timeout (a large
/// pipeline or a full preload can take minutes on a busy machine) and errors as panics.
pub(crate) struct Conn(RawConn);

#[derive(Default, Clone, Debug)]
pub(crate) struct Tally {
    pub(crate) int: u64,
    pub(crate) one: u64,
    pub(crate) nil: u64,
    pub(crate) ok: u64,
    pub(crate) err: u64,
    pub(crate) other: u64,
    pub(crate) first_err: Option<String>,
}

impl Tally {
    pub(crate) fn add(&mut self, r: &Reply) {
        match r {
            Reply::Int(i) => {
                self.int += 1;
                if *i == 1 {
                    self.one += 1;
                }
            }
            Reply::Nil => self.nil += 1,
            Reply::Status(s) if s == "OK" => self.ok += 1,
            Reply::Err(e) => {
                self.err += 1;
                if self.first_err.is_none() {
                    self.first_err = Some(e.clone());
                }
            }
            _ => self.other += 1,
        }
    }
    pub(crate) fn merge(&mut self, o: &Tally) {
        self.int += o.int;
        self.one += o.one;
        self.nil += o.nil;
        self.ok += o.ok;
        self.err += o.err;
        self.other += o.other;
        if self.first_err.is_none() {
            self.first_err = o.first_err.clone();
        }
    }
}

impl Conn {
    pub(crate) fn open(port: u16) -> Conn {
        let c = RawConn::connect_with_timeout(port, Duration::from_secs(300))
            .unwrap_or_else(|e| panic!("connect 127.0.0.1:{port}: {e}"));
        Conn(c)
    }

    /// Queue one command (sent by the next `flush`, `drain` or `call`).
    pub(crate) fn push(&mut self, args: &[&str]) {
        self.0.queue(args);
    }

    pub(crate) fn flush(&mut self) {
        self.0.flush().expect("write to server");
    }

    /// Send what is queued and read every pending reply into `t`.
    pub(crate) fn drain(&mut self, t: &mut Tally) {
        self.flush();
        while self.0.pending() > 0 {
            let r = self.read();
            t.add(&r);
        }
    }

    /// One command and its reply, after the replies still pending (which are dropped).
    pub(crate) fn call(&mut self, args: &[&str]) -> Reply {
        let mut t = Tally::default();
        self.drain(&mut t);
        self.push(args);
        self.flush();
        self.read()
    }

    pub(crate) fn read(&mut self) -> Reply {
        self.0.read_reply().expect("read from server")
    }

    pub(crate) fn info(&mut self, section: &str) -> String {
        self.call(&["INFO", section]).string().unwrap_or_default()
    }

    pub(crate) fn info_num(&mut self, section: &str, field: &str) -> f64 {
        info_text_field(&self.info(section), field)
            .and_then(|v| v.parse().ok())
            .unwrap_or(f64::NAN)
    }

    pub(crate) fn script(&mut self, body: &str) -> String {
        self.call(&["SCRIPT", "LOAD", body])
            .string()
            .expect("SCRIPT LOAD")
    }

    pub(crate) fn reset_stats(&mut self) {
        self.call(&["CONFIG", "RESETSTAT"]);
    }

    /// INFO commandstats, by command.
    pub(crate) fn cmdstats(&mut self) -> Stats {
        Stats(parse_commandstats(&self.info("commandstats")))
    }

    pub(crate) fn blocked_clients(&mut self) -> usize {
        self.info_num("clients", "blocked_clients") as usize
    }
}

pub(crate) struct Stats(pub(crate) BTreeMap<String, CommandStat>);

impl Stats {
    /// usec per call of `cmd` (lower case, e.g. "flock.acquire").
    pub(crate) fn cost(&self, cmd: &str) -> f64 {
        match self.0.get(cmd) {
            Some(s) if s.calls > 0.0 => s.usec / s.calls,
            _ => f64::NAN,
        }
    }
    pub(crate) fn calls(&self, cmd: &str) -> f64 {
        self.0.get(cmd).map_or(0.0, |s| s.calls)
    }
    pub(crate) fn usec(&self, cmd: &str) -> f64 {
        self.0.get(cmd).map_or(0.0, |s| s.usec)
    }
}

/// Send `n` commands, made by `make(i, conn)` for i in 0..n, over `conns` connections with
/// `depth` commands per pipeline (indices are split in runs of `unit`, so that pairs stay in
/// one connection and one pipeline). Returns the tally of the replies.
pub(crate) fn drive(
    port: u16,
    conns: usize,
    depth: usize,
    n: usize,
    unit: usize,
    make: &(dyn Fn(usize, &mut Conn) + Sync),
) -> Tally {
    let units = n / unit;
    thread::scope(|s| {
        let hs: Vec<_> = (0..conns)
            .map(|t| {
                let lo = units * t / conns * unit;
                let hi = units * (t + 1) / conns * unit;
                s.spawn(move || {
                    let mut c = Conn::open(port);
                    let mut tally = Tally::default();
                    let mut i = lo;
                    while i < hi {
                        let end = (i + depth).min(hi);
                        for j in i..end {
                            make(j, &mut c);
                        }
                        c.drain(&mut tally);
                        i = end;
                    }
                    tally
                })
            })
            .collect();
        let mut all = Tally::default();
        for h in hs {
            all.merge(&h.join().expect("driver thread"));
        }
        all
    })
}

/// Warn when a pass did not get the replies it should have (the numbers would be about
/// something else than what the table says).
pub(crate) fn expect(what: &str, t: &Tally, n: usize, field: fn(&Tally) -> u64) {
    let got = field(t);
    if got != n as u64 {
        eprintln!("  warning: {what}: expected {n} matching replies, got {got} ({t:?})");
    }
}

pub(crate) fn wait_for(what: &str, timeout: Duration, mut cond: impl FnMut() -> bool) {
    let start = Instant::now();
    while !cond() {
        if start.elapsed() > timeout {
            panic!("timed out after {timeout:?} waiting for {what}");
        }
        sleep(Duration::from_millis(2));
    }
}

/// Wait until the server is not rehashing the keyspace (so that a measurement does not pay
/// for the last growth of the main dict), at most 30 s.
pub(crate) fn wait_rehash(c: &mut Conn) {
    let start = Instant::now();
    while start.elapsed() < Duration::from_secs(30) {
        let r = c.call(&["DEBUG", "HTSTATS", "0"]);
        let text = r.string().unwrap_or_default();
        if !text.contains("rehashing target") {
            return;
        }
        sleep(Duration::from_millis(50));
    }
}
