//! `make bench`: flock side by side with the locks people build from plain Redis today.
//!
//! ```text
//! cargo bench --bench flock [-- --quick] [--out DIR] [--only 1,3] [--no-callgrind]
//! ```
//!
//! Starts its own redis-server(s) on loopback (free port, temp dir, the shared harness
//! crates/flock-testkit), with a private copy of target/release/libredis_flock.so (so that a rebuild
//! during the run cannot change what is measured), runs every scenario of issue 7 and prints
//! one table per scenario. Every result is a ratio against a baseline measured in the same run,
//! interleaved with it, because the machines this runs on are shared and noisy.
//!
//! A full run writes docs/BENCHMARKS.md and docs/benchmarks.svg. `--quick` (QUICK=1 make
//! bench) uses smaller counts and shorter runs, says so in its output, and writes its report
//! to target/bench-quick/ so that it never replaces the published full run.
//!
//! Scenarios:
//! 1. server cost per call (INFO commandstats), pipelined, 8 connections, many keys;
//! 2. throughput of a full acquire+release cycle, pipelined and not;
//! 3. memory per held lock and memory left by released locks;
//! 4. contention: N clients, one lock, a 1 ms critical section, BLOCK vs polling;
//! 5. scaling: ACQUIRE/RELEASE cost with many lock keys held and many waiters queued.
//!
//! In a full run, when valgrind is installed, a short callgrind run counts instructions per
//! call (noise-free) and lists where flock's commands spend them.

use flock_testkit::{Reply, Server};
use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Barrier;
use std::thread::{self, sleep};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

// ---------------------------------------------------------------------------------------------
// the baselines: what people run today
// ---------------------------------------------------------------------------------------------

/// Release: delete the key only when it still holds our owner (the Redis docs' recipe).
const CAD: &str = "if redis.call('get', KEYS[1]) == ARGV[1] then return redis.call('del', KEYS[1]) else return 0 end";
/// Fenced acquire: SET NX PX plus INCR of a per-lock token key.
const FENCE_ACQ: &str = "if redis.call('set', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then return redis.call('incr', KEYS[2]) else return false end";
/// Fenced write: compare the live token kept in a key, then write.
const FENCE_WRITE: &str = "if redis.call('get', KEYS[1]) == ARGV[1] then return redis.call('set', KEYS[2], ARGV[2]) else return redis.error_reply('FENCED stale token') end";

const TTL: &str = "60000";
const LONG_TTL: &str = "3600000";

// ---------------------------------------------------------------------------------------------
// options
// ---------------------------------------------------------------------------------------------

struct Cfg {
    quick: bool,
    out: PathBuf,
    only: Option<Vec<u32>>,
    callgrind: bool,
    s1_keys: usize,
    s1_rounds: usize,
    s2_secs: f64,
    s2_rounds: usize,
    s3_locks: usize,
    s4_secs: f64,
    s4_clients: Vec<usize>,
    s4_handoffs: usize,
    s5_levels: Vec<usize>,
    s5_waiters: Vec<usize>,
    s5_pairs: usize,
    s5_rounds: usize,
    s5_handoffs: usize,
    cg_calls: usize,
}

impl Cfg {
    fn from_args() -> Cfg {
        let root = Path::new(env!("CARGO_MANIFEST_DIR"));
        let mut quick = false;
        let mut out = None;
        let mut only = None;
        let mut callgrind = true;
        let mut args = std::env::args().skip(1);
        while let Some(a) = args.next() {
            match a.as_str() {
                "--quick" => quick = true,
                "--bench" => {} // cargo bench passes it to harness = false targets
                "--out" => out = args.next().map(PathBuf::from),
                "--only" => {
                    only = args.next().map(|s| {
                        s.split(',')
                            .filter_map(|x| x.trim().parse().ok())
                            .collect::<Vec<u32>>()
                    })
                }
                "--no-callgrind" => callgrind = false,
                "-h" | "--help" => {
                    println!(
                        "cargo bench --bench flock [-- --quick] [--out DIR] [--only 1,2,3,4,5,6 (6: callgrind)] [--no-callgrind]"
                    );
                    std::process::exit(0);
                }
                other if other.starts_with('-') => {
                    eprintln!("unknown option {other} (try --help)");
                    std::process::exit(2);
                }
                _ => {} // a benchmark name filter from cargo: ignore
            }
        }
        let out = out.unwrap_or_else(|| {
            if quick {
                root.join("target/bench-quick")
            } else {
                root.join("docs")
            }
        });
        if quick {
            Cfg {
                quick,
                out,
                only,
                callgrind: false,
                s1_keys: 50_000,
                s1_rounds: 2,
                s2_secs: 0.6,
                s2_rounds: 1,
                s3_locks: 100_000,
                s4_secs: 1.0,
                s4_clients: vec![2, 8, 32, 128],
                s4_handoffs: 400,
                s5_levels: vec![1, 10_000, 100_000],
                s5_waiters: vec![0, 100, 1_000],
                s5_pairs: 20_000,
                s5_rounds: 1,
                s5_handoffs: 300,
                cg_calls: 2_000,
            }
        } else {
            Cfg {
                quick,
                out,
                only,
                callgrind,
                s1_keys: 100_000,
                s1_rounds: 7,
                s2_secs: 3.0,
                s2_rounds: 3,
                s3_locks: 100_000,
                s4_secs: 5.0,
                s4_clients: vec![2, 8, 32, 128],
                s4_handoffs: 2_000,
                s5_levels: vec![1, 10_000, 1_000_000],
                s5_waiters: vec![0, 100, 10_000],
                s5_pairs: 50_000,
                s5_rounds: 3,
                s5_handoffs: 2_000,
                cg_calls: 20_000,
            }
        }
    }

    fn runs(&self, scenario: u32) -> bool {
        // 6 is the callgrind profile, see main()
        self.only.as_ref().is_none_or(|o| o.contains(&scenario))
    }
}

// ---------------------------------------------------------------------------------------------
// a small pipelining RESP client
// ---------------------------------------------------------------------------------------------

struct Conn {
    rd: BufReader<TcpStream>,
    wr: TcpStream,
    out: Vec<u8>,
    pending: usize,
}

#[derive(Default, Clone, Debug)]
struct Tally {
    int: u64,
    one: u64,
    nil: u64,
    ok: u64,
    err: u64,
    other: u64,
    first_err: Option<String>,
}

impl Tally {
    fn add(&mut self, r: &Reply) {
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
    fn merge(&mut self, o: &Tally) {
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
    fn open(port: u16) -> Conn {
        let s = TcpStream::connect(("127.0.0.1", port))
            .unwrap_or_else(|e| panic!("connect 127.0.0.1:{port}: {e}"));
        s.set_nodelay(true).ok();
        s.set_read_timeout(Some(Duration::from_secs(300))).ok();
        Conn {
            rd: BufReader::with_capacity(1 << 16, s.try_clone().expect("clone socket")),
            wr: s,
            out: Vec::with_capacity(1 << 16),
            pending: 0,
        }
    }

    fn push(&mut self, args: &[&str]) {
        let _ = write!(self.out, "*{}\r\n", args.len());
        for a in args {
            let _ = write!(self.out, "${}\r\n", a.len());
            self.out.extend_from_slice(a.as_bytes());
            self.out.extend_from_slice(b"\r\n");
        }
        self.pending += 1;
    }

    fn flush(&mut self) {
        if !self.out.is_empty() {
            self.wr.write_all(&self.out).expect("write to server");
            self.out.clear();
        }
    }

    /// Send what is queued and read every pending reply into `t`.
    fn drain(&mut self, t: &mut Tally) {
        self.flush();
        while self.pending > 0 {
            let r = self.read();
            t.add(&r);
        }
    }

    fn call(&mut self, args: &[&str]) -> Reply {
        let mut t = Tally::default();
        self.drain(&mut t);
        self.push(args);
        self.flush();
        self.read()
    }

    fn line(&mut self) -> Vec<u8> {
        let mut l = Vec::new();
        let n = self.rd.read_until(b'\n', &mut l).expect("read from server");
        assert!(n > 0, "server closed the connection");
        l.truncate(l.len().saturating_sub(2));
        l
    }

    fn read(&mut self) -> Reply {
        self.pending = self.pending.saturating_sub(1);
        self.read_one()
    }

    fn read_one(&mut self) -> Reply {
        let l = self.line();
        let rest = String::from_utf8_lossy(&l[1..]).into_owned();
        let num = || rest.parse::<i64>().expect("number in reply");
        match l[0] {
            b'+' => Reply::Status(rest),
            b'-' => Reply::Err(rest),
            b':' => Reply::Int(num()),
            b'$' => {
                let n = num();
                if n < 0 {
                    return Reply::Nil;
                }
                let mut b = vec![0u8; n as usize + 2];
                self.rd.read_exact(&mut b).expect("read bulk");
                b.truncate(n as usize);
                Reply::Bulk(b)
            }
            b'*' => {
                let n = num();
                if n < 0 {
                    return Reply::Nil;
                }
                Reply::Array((0..n).map(|_| self.read_one()).collect())
            }
            c => panic!("unexpected reply type {:?}", c as char),
        }
    }

    fn info(&mut self, section: &str) -> String {
        self.call(&["INFO", section]).string().unwrap_or_default()
    }

    fn info_num(&mut self, section: &str, field: &str) -> f64 {
        let text = self.info(section);
        for line in text.lines() {
            if let Some((k, v)) = line.split_once(':') {
                if k == field {
                    return v.trim().parse().unwrap_or(f64::NAN);
                }
            }
        }
        f64::NAN
    }

    fn script(&mut self, body: &str) -> String {
        self.call(&["SCRIPT", "LOAD", body])
            .string()
            .expect("SCRIPT LOAD")
    }

    fn reset_stats(&mut self) {
        self.call(&["CONFIG", "RESETSTAT"]);
    }

    /// INFO commandstats: command -> (calls, usec).
    fn cmdstats(&mut self) -> Stats {
        let mut m = BTreeMap::new();
        for line in self.info("commandstats").lines() {
            let Some(rest) = line.strip_prefix("cmdstat_") else {
                continue;
            };
            let Some((name, fields)) = rest.split_once(':') else {
                continue;
            };
            let mut calls = 0.0;
            let mut usec = 0.0;
            for f in fields.split(',') {
                if let Some(v) = f.strip_prefix("calls=") {
                    calls = v.parse().unwrap_or(0.0);
                } else if let Some(v) = f.strip_prefix("usec=") {
                    usec = v.parse().unwrap_or(0.0);
                }
            }
            m.insert(name.to_string(), (calls, usec));
        }
        Stats(m)
    }

    fn blocked_clients(&mut self) -> usize {
        self.info_num("clients", "blocked_clients") as usize
    }
}

struct Stats(BTreeMap<String, (f64, f64)>);

impl Stats {
    /// usec per call of `cmd` (lower case, e.g. "flock.acquire").
    fn cost(&self, cmd: &str) -> f64 {
        match self.0.get(cmd) {
            Some((calls, usec)) if *calls > 0.0 => usec / calls,
            _ => f64::NAN,
        }
    }
    fn calls(&self, cmd: &str) -> f64 {
        self.0.get(cmd).map_or(0.0, |v| v.0)
    }
    fn usec(&self, cmd: &str) -> f64 {
        self.0.get(cmd).map_or(0.0, |v| v.1)
    }
}

/// Send `n` commands, made by `make(i, conn)` for i in 0..n, over `conns` connections with
/// `depth` commands per pipeline (indices are split in runs of `unit`, so that pairs stay in
/// one connection and one pipeline). Returns the tally of the replies.
fn drive(
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
fn expect(what: &str, t: &Tally, n: usize, field: fn(&Tally) -> u64) {
    let got = field(t);
    if got != n as u64 {
        eprintln!("  warning: {what}: expected {n} matching replies, got {got} ({t:?})");
    }
}

// ---------------------------------------------------------------------------------------------
// small helpers
// ---------------------------------------------------------------------------------------------

fn splitmix(mut x: u64) -> u64 {
    x = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
    x = (x ^ (x >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    x ^ (x >> 31)
}

struct Rng(u64);

impl Rng {
    fn new(seed: u64) -> Rng {
        Rng(splitmix(seed ^ now_nanos()))
    }
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        splitmix(self.0)
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

fn now_nanos() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or(0)
}

/// A 36-byte owner that looks like a UUID, derived from `i`.
fn uuid(i: usize) -> String {
    let a = splitmix(i as u64);
    let b = splitmix(a);
    format!(
        "{:08x}-{:04x}-4{:03x}-{:x}{:03x}-{:012x}",
        a >> 32,
        (a >> 16) & 0xffff,
        a & 0xfff,
        8 + (b >> 62),
        (b >> 48) & 0xfff,
        b & 0xffff_ffff_ffff
    )
}

fn rotate<T: Copy>(v: &[T], by: usize) -> Vec<T> {
    let mut r = v.to_vec();
    let k = by % r.len().max(1);
    r.rotate_left(k);
    r
}

fn median(v: &[f64]) -> f64 {
    let mut v: Vec<f64> = v.iter().copied().filter(|x| x.is_finite()).collect();
    if v.is_empty() {
        return f64::NAN;
    }
    v.sort_by(|a, b| a.partial_cmp(b).unwrap());
    let n = v.len();
    if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    }
}

/// The q-quantile (nearest rank) of sorted values.
fn pct(sorted: &[u64], q: f64) -> u64 {
    if sorted.is_empty() {
        return 0;
    }
    let idx = ((q * sorted.len() as f64).ceil() as usize).clamp(1, sorted.len()) - 1;
    sorted[idx]
}

#[derive(Default)]
struct Samples(BTreeMap<String, Vec<f64>>);

impl Samples {
    fn add(&mut self, k: &str, v: f64) {
        self.0.entry(k.to_string()).or_default().push(v);
    }
    fn last(&self, k: &str) -> f64 {
        self.0
            .get(k)
            .and_then(|v| v.last().copied())
            .unwrap_or(f64::NAN)
    }
    fn med(&self, k: &str) -> f64 {
        self.0.get(k).map_or(f64::NAN, |v| median(v))
    }
    fn range(&self, k: &str) -> (f64, f64) {
        let v = self.0.get(k).cloned().unwrap_or_default();
        let lo = v.iter().copied().fold(f64::INFINITY, f64::min);
        let hi = v.iter().copied().fold(f64::NEG_INFINITY, f64::max);
        (lo, hi)
    }
    /// Record `a / b` of the latest samples under `k` (a per-round ratio).
    fn ratio(&mut self, k: &str, a: &str, b: &str) {
        let r = self.last(a) / self.last(b);
        self.add(k, r);
    }
    /// "1.09x" or, with several rounds, "1.09x (1.02-1.15)".
    fn show_ratio(&self, k: &str) -> String {
        let n = self.0.get(k).map_or(0, |v| v.len());
        let (lo, hi) = self.range(k);
        if n > 1 {
            format!("{} ({:.2}-{:.2})", x(self.med(k)), lo, hi)
        } else {
            x(self.med(k))
        }
    }
}

fn x(r: f64) -> String {
    if !r.is_finite() {
        "n/a".into()
    } else if r >= 10.0 {
        format!("{r:.1}x")
    } else if r < 0.1 {
        format!("{r:.3}x")
    } else {
        format!("{r:.2}x")
    }
}

fn us(v: f64) -> String {
    if !v.is_finite() {
        "n/a".into()
    } else {
        format!("{v:.2}")
    }
}

fn ms(us: u64) -> String {
    let m = us as f64 / 1000.0;
    if m >= 100.0 {
        format!("{m:.0}")
    } else if m >= 10.0 {
        format!("{m:.1}")
    } else {
        format!("{m:.2}")
    }
}

fn thousands(n: usize) -> String {
    let s = n.to_string();
    let mut out = String::new();
    for (i, ch) in s.chars().enumerate() {
        if i > 0 && (s.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(ch);
    }
    out
}

fn table(headers: &[&str], rows: &[Vec<String>]) -> String {
    let mut s = String::new();
    let _ = writeln!(s, "| {} |", headers.join(" | "));
    let _ = writeln!(
        s,
        "|{}|",
        headers
            .iter()
            .enumerate()
            .map(|(i, _)| if i == 0 { "---" } else { "---:" })
            .collect::<Vec<_>>()
            .join("|")
    );
    for r in rows {
        let _ = writeln!(s, "| {} |", r.join(" | "));
    }
    s
}

fn wait_for(what: &str, timeout: Duration, mut cond: impl FnMut() -> bool) {
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
fn wait_rehash(c: &mut Conn) {
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

/// Raise RLIMIT_NOFILE's soft limit to the hard limit (the waiters scenario opens one socket
/// per waiter, and the server it starts inherits the limit).
fn raise_nofile() -> u64 {
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

fn read_to_string(p: &str) -> String {
    std::fs::read_to_string(p).unwrap_or_default()
}

fn loadavg() -> String {
    read_to_string("/proc/loadavg")
        .split_whitespace()
        .take(3)
        .collect::<Vec<_>>()
        .join(" ")
}

fn run_out(cmd: &str, args: &[&str]) -> Option<String> {
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

// ---------------------------------------------------------------------------------------------
// the report
// ---------------------------------------------------------------------------------------------

#[derive(Clone, Copy)]
enum Goal {
    AtMost(f64),
    AtLeast(f64),
    Below(f64),
}

impl Goal {
    fn holds(&self, v: f64) -> bool {
        match *self {
            Goal::AtMost(t) => v <= t,
            Goal::AtLeast(t) => v >= t,
            Goal::Below(t) => v < t,
        }
    }
    fn show(&self) -> String {
        match *self {
            Goal::AtMost(t) => format!("≤ {t:.2}x"),
            Goal::AtLeast(t) => format!("≥ {t:.2}x"),
            Goal::Below(t) => format!("< {t:.2}x"),
        }
    }
    fn value(&self) -> f64 {
        match *self {
            Goal::AtMost(t) | Goal::AtLeast(t) | Goal::Below(t) => t,
        }
    }
}

/// One ratio, with its target when the issue sets one.
struct Check {
    section: &'static str,
    what: String,
    value: f64,
    goal: Option<Goal>,
    /// false for an absolute number (not charted)
    ratio: bool,
    /// a bigger ratio is better (throughput); else smaller is better (cost, memory, waits)
    higher: bool,
    shown: String,
    target_text: String,
}

impl Check {
    fn pass(&self) -> Option<bool> {
        self.goal
            .map(|g| self.value.is_finite() && g.holds(self.value))
    }
    fn mark(&self) -> &'static str {
        match self.pass() {
            Some(true) => "**met**",
            Some(false) => "**missed**",
            None => "",
        }
    }
}

#[derive(Default)]
struct Report {
    sections: Vec<(String, String)>,
    checks: Vec<Check>,
    notes: Vec<String>,
    profile: Option<String>,
    /// measured numbers that the "where the time goes" notes quote
    facts: BTreeMap<String, f64>,
}

impl Report {
    fn check(&mut self, section: &'static str, what: &str, value: f64, goal: Option<Goal>) {
        self.checks.push(Check {
            section,
            what: what.to_string(),
            value,
            goal,
            ratio: true,
            higher: matches!(goal, Some(Goal::AtLeast(_)))
                || what.starts_with("cycles/s")
                || what.starts_with("grants/s"),
            shown: x(value),
            target_text: goal.map_or("—".into(), |g| g.show()),
        });
    }
    fn fact(&mut self, k: &str, v: f64) {
        self.facts.insert(k.to_string(), v);
    }
    fn get(&self, k: &str) -> f64 {
        self.facts.get(k).copied().unwrap_or(f64::NAN)
    }
    fn missed(&self, what_prefix: &str) -> bool {
        self.checks
            .iter()
            .any(|c| c.what.starts_with(what_prefix) && c.pass() == Some(false))
    }
    fn value_of(&self, what: &str) -> f64 {
        self.checks
            .iter()
            .rev()
            .find(|c| c.what == what)
            .map_or(f64::NAN, |c| c.value)
    }
    fn mark_of(&self, what: &str) -> String {
        self.checks
            .iter()
            .rev()
            .find(|c| c.what == what)
            .map_or(String::new(), |c| c.mark().to_string())
    }
    fn section(&mut self, title: &str, body: String) {
        println!("\n## {title}\n\n{body}");
        self.sections.push((title.to_string(), body));
    }
}

// ---------------------------------------------------------------------------------------------
// scenario 1: server cost per call
// ---------------------------------------------------------------------------------------------

fn lock_key(i: usize) -> String {
    format!("lock:{i:07}")
}

fn scenario1(cfg: &Cfg, rep: &mut Report) {
    let n = cfg.s1_keys;
    eprintln!(
        "[1] server cost per call: {} rounds x 10 passes of {} calls",
        cfg.s1_rounds,
        thousands(n)
    );
    let srv = Server::builder().start();
    let port = srv.port();
    let mut c = Conn::open(port);
    let cad = c.script(CAD);
    let facq = c.script(FENCE_ACQ);
    let fw = c.script(FENCE_WRITE);
    let mut s = Samples::default();
    let (conns, depth) = (8, 16);
    // warm up the fresh server (page faults, allocator); not measured
    for kind in [Kind::Flock, Kind::SetNx, Kind::LuaFenced] {
        let m = n.min(20_000);
        drive(port, conns, depth, m, 1, &|i, c| {
            push_acquire(c, kind, &lock_key(i), &uuid(i), &facq)
        });
        drive(port, conns, depth, m, 1, &|i, c| {
            push_release(c, kind, &lock_key(i), &uuid(i), &cad)
        });
        c.call(&["FLUSHALL"]);
    }
    for round in 0..cfg.s1_rounds {
        eprintln!("  round {}/{}", round + 1, cfg.s1_rounds);
        for g in rotate(&[0, 1, 2], round) {
            c.call(&["FLUSHALL"]);
            wait_rehash(&mut c);
            c.reset_stats();
            match g {
                0 => {
                    let t = drive(port, conns, depth, n, 1, &|i, c| {
                        c.push(&["FLOCK.ACQUIRE", &lock_key(i), &uuid(i), TTL])
                    });
                    expect("FLOCK.ACQUIRE", &t, n, |t| t.int);
                    s.add("acq.flock", c.cmdstats().cost("flock.acquire"));
                    c.reset_stats();
                    let t = drive(port, conns, depth, n, 1, &|i, c| {
                        c.push(&["FLOCK.RELEASE", &lock_key(i), &uuid(i)])
                    });
                    expect("FLOCK.RELEASE", &t, n, |t| t.one);
                    s.add("rel.flock", c.cmdstats().cost("flock.release"));
                }
                1 => {
                    let t = drive(port, conns, depth, n, 1, &|i, c| {
                        c.push(&["SET", &lock_key(i), &uuid(i), "NX", "PX", TTL])
                    });
                    expect("SET NX PX", &t, n, |t| t.ok);
                    s.add("acq.set", c.cmdstats().cost("set"));
                    c.reset_stats();
                    let t = drive(port, conns, depth, n, 1, &|i, c| {
                        c.push(&["EVALSHA", &cad, "1", &lock_key(i), &uuid(i)])
                    });
                    expect("Lua compare-and-delete", &t, n, |t| t.one);
                    s.add("rel.cad", c.cmdstats().cost("evalsha"));
                }
                _ => {
                    let t = drive(port, conns, depth, n, 1, &|i, c| {
                        let k = lock_key(i);
                        c.push(&[
                            "EVALSHA",
                            &facq,
                            "2",
                            &k,
                            &format!("{k}:tok"),
                            &uuid(i),
                            TTL,
                        ])
                    });
                    expect("Lua fenced acquire", &t, n, |t| t.int);
                    s.add("acq.lua", c.cmdstats().cost("evalsha"));
                }
            }
        }
        // checks and fenced writes under one live lock
        c.call(&["FLUSHALL"]);
        let owner = uuid(999_999_999);
        let tok = c
            .call(&["FLOCK.ACQUIRE", "wlk", &owner, LONG_TTL])
            .int()
            .expect("FLOCK.ACQUIRE wlk");
        let tok = tok.to_string();
        c.call(&["SET", "wlk:tok", &tok]);
        c.call(&["SET", "wlk:owner", &owner]);
        for w in rotate(&[0, 1, 2, 3, 4], round) {
            c.reset_stats();
            match w {
                0 => {
                    let t = drive(port, conns, depth, n, 1, &|_, c| {
                        c.push(&["FLOCK.CHECK", "wlk", &tok])
                    });
                    expect("FLOCK.CHECK", &t, n, |t| t.int);
                    s.add("check", c.cmdstats().cost("flock.check"));
                }
                1 => {
                    let t = drive(port, conns, depth, n, 1, &|_, c| {
                        c.push(&["GET", "wlk:owner"])
                    });
                    expect("GET", &t, n, |t| t.other);
                    s.add("get", c.cmdstats().cost("get"));
                }
                2 => {
                    let t = drive(port, conns, depth, n, 1, &|i, c| {
                        c.push(&[
                            "FLOCK.FENCED",
                            "wlk",
                            &tok,
                            "SET",
                            &format!("data:{i:07}"),
                            "v",
                        ])
                    });
                    expect("FLOCK.FENCED SET", &t, n, |t| t.ok);
                    s.add("fenced", c.cmdstats().cost("flock.fenced"));
                }
                3 => {
                    let t = drive(port, conns, depth, n, 1, &|i, c| {
                        c.push(&[
                            "EVALSHA",
                            &fw,
                            "2",
                            "wlk:tok",
                            &format!("data:{i:07}"),
                            &tok,
                            "v",
                        ])
                    });
                    expect("Lua token check + SET", &t, n, |t| t.ok);
                    s.add("luaw", c.cmdstats().cost("evalsha"));
                }
                _ => {
                    let t = drive(port, conns, depth, n, 1, &|i, c| {
                        c.push(&["SET", &format!("data:{i:07}"), "v"])
                    });
                    expect("SET", &t, n, |t| t.ok);
                    s.add("set", c.cmdstats().cost("set"));
                }
            }
        }
        s.ratio("r.acq_set", "acq.flock", "acq.set");
        s.ratio("r.acq_lua", "acq.flock", "acq.lua");
        s.ratio("r.rel_cad", "rel.flock", "rel.cad");
        s.ratio("r.check_get", "check", "get");
        s.ratio("r.fenced_luaw", "fenced", "luaw");
        s.ratio("r.fenced_set", "fenced", "set");
        eprintln!(
            "    acquire/SET {:.2}  acquire/Lua {:.2}  release/CAD {:.2}  check/GET {:.2}  fenced/Lua {:.2}   (flock acquire {:.2} us, SET {:.2} us)",
            s.last("r.acq_set"),
            s.last("r.acq_lua"),
            s.last("r.rel_cad"),
            s.last("r.check_get"),
            s.last("r.fenced_luaw"),
            s.last("acq.flock"),
            s.last("acq.set")
        );
    }
    drop(srv);
    rep.fact("s1.acq.flock", s.med("acq.flock"));
    rep.fact("s1.acq.set", s.med("acq.set"));
    rep.fact("s1.acq_set.lo", s.range("r.acq_set").0);
    rep.fact("s1.acq_set.hi", s.range("r.acq_set").1);

    let sec = "1. Server cost per call";
    rep.check(
        sec,
        "FLOCK.ACQUIRE / SET NX PX",
        s.med("r.acq_set"),
        Some(Goal::AtMost(1.0)),
    );
    rep.check(
        sec,
        "FLOCK.ACQUIRE / Lua fenced acquire",
        s.med("r.acq_lua"),
        Some(Goal::AtMost(0.35)),
    );
    rep.check(
        sec,
        "FLOCK.RELEASE / Lua compare-and-delete",
        s.med("r.rel_cad"),
        Some(Goal::AtMost(0.4)),
    );
    rep.check(sec, "FLOCK.CHECK / GET", s.med("r.check_get"), None);
    rep.check(
        sec,
        "FLOCK.FENCED+SET / Lua check+SET",
        s.med("r.fenced_luaw"),
        None,
    );
    rep.check(
        sec,
        "FLOCK.FENCED+SET / SET alone",
        s.med("r.fenced_set"),
        None,
    );

    let row = |flock: &str, fk: &str, base: &str, bk: &str, rk: &str, what: &str, goal: &str| {
        vec![
            flock.to_string(),
            us(s.med(fk)),
            base.to_string(),
            us(s.med(bk)),
            s.show_ratio(rk),
            goal.to_string(),
            rep.mark_of(what),
        ]
    };
    let rows = vec![
        row(
            "`FLOCK.ACQUIRE`",
            "acq.flock",
            "`SET key owner NX PX ttl`",
            "acq.set",
            "r.acq_set",
            "FLOCK.ACQUIRE / SET NX PX",
            "≤ 1.00x",
        ),
        row(
            "`FLOCK.ACQUIRE`",
            "acq.flock",
            "Lua `SET NX PX` + `INCR` token key",
            "acq.lua",
            "r.acq_lua",
            "FLOCK.ACQUIRE / Lua fenced acquire",
            "≤ 0.35x",
        ),
        row(
            "`FLOCK.RELEASE`",
            "rel.flock",
            "Lua compare-and-delete",
            "rel.cad",
            "r.rel_cad",
            "FLOCK.RELEASE / Lua compare-and-delete",
            "≤ 0.40x",
        ),
        row(
            "`FLOCK.CHECK`",
            "check",
            "`GET`",
            "get",
            "r.check_get",
            "",
            "—",
        ),
        row(
            "`FLOCK.FENCED` + `SET`",
            "fenced",
            "Lua token check + `SET`",
            "luaw",
            "r.fenced_luaw",
            "",
            "—",
        ),
        row(
            "`FLOCK.FENCED` + `SET`",
            "fenced",
            "`SET` alone (no check)",
            "set",
            "r.fenced_set",
            "",
            "—",
        ),
    ];
    let mut body = format!(
        "`INFO commandstats` usec per call (usec / calls), lower is better. {} rounds; each round \
         runs every command over {} keys (each key acquired once and released once, so every \
         ACQUIRE is a grant and every RELEASE releases), 8 connections, 16 commands per \
         pipeline, `CONFIG RESETSTAT` before each pass, `FLUSHALL` between the lock kinds, the \
         order rotated from round to round. usec columns are medians over the rounds; the ratio \
         is the median of the per-round ratios (range in brackets). The Lua scripts run with \
         `EVALSHA`, as client libraries do. The load comes from the bench's own pipelining \
         client rather than `redis-benchmark`, whose random keys cannot make every RELEASE \
         find its lock held (nor every ACQUIRE find its key free); the server time per call \
         that `INFO commandstats` reports does not depend on the client.\n\n",
        cfg.s1_rounds,
        thousands(n)
    );
    body += &table(
        &[
            "flock",
            "usec/call",
            "baseline",
            "usec/call",
            "ratio",
            "target",
            "",
        ],
        &rows,
    );
    rep.section(sec, body);
}

// ---------------------------------------------------------------------------------------------
// scenario 2: acquire+release cycles per second
// ---------------------------------------------------------------------------------------------

#[derive(Clone, Copy, PartialEq)]
enum Kind {
    Flock,
    SetNx,
    LuaFenced,
}

fn push_acquire(c: &mut Conn, kind: Kind, key: &str, owner: &str, facq: &str) {
    match kind {
        Kind::Flock => c.push(&["FLOCK.ACQUIRE", key, owner, TTL]),
        Kind::SetNx => c.push(&["SET", key, owner, "NX", "PX", TTL]),
        Kind::LuaFenced => c.push(&["EVALSHA", facq, "2", key, &format!("{key}:tok"), owner, TTL]),
    }
}

fn push_release(c: &mut Conn, kind: Kind, key: &str, owner: &str, cad: &str) {
    match kind {
        Kind::Flock => c.push(&["FLOCK.RELEASE", key, owner]),
        _ => c.push(&["EVALSHA", cad, "1", key, owner]),
    }
}

fn cycle_rate(
    port: u16,
    threads: usize,
    secs: f64,
    pipe: usize,
    kind: Kind,
    cad: &str,
    facq: &str,
) -> f64 {
    let barrier = Barrier::new(threads + 1);
    let dur = Duration::from_secs_f64(secs);
    thread::scope(|s| {
        let hs: Vec<_> = (0..threads)
            .map(|t| {
                let barrier = &barrier;
                s.spawn(move || {
                    let mut c = Conn::open(port);
                    let owner = uuid(70_000 + t);
                    let mut rng = Rng::new(t as u64 + 1);
                    let mut tally = Tally::default();
                    let mut n = 0u64;
                    barrier.wait();
                    let start = Instant::now();
                    while start.elapsed() < dur {
                        for _ in 0..pipe {
                            let key = format!("cyc:{:06}", rng.below(100_000));
                            push_acquire(&mut c, kind, &key, &owner, facq);
                            if pipe == 1 {
                                c.drain(&mut tally);
                            }
                            push_release(&mut c, kind, &key, &owner, cad);
                            if pipe == 1 {
                                c.drain(&mut tally);
                            }
                        }
                        c.drain(&mut tally);
                        n += pipe as u64;
                    }
                    if tally.err > 0 {
                        eprintln!("  warning: errors in cycles: {tally:?}");
                    }
                    (n, start.elapsed().as_secs_f64())
                })
            })
            .collect();
        barrier.wait();
        let mut total = 0u64;
        let mut el = 0.0f64;
        for h in hs {
            let (n, e) = h.join().expect("cycle thread");
            total += n;
            el = el.max(e);
        }
        total as f64 / el
    })
}

fn scenario2(cfg: &Cfg, rep: &mut Report) {
    let threads = 8;
    eprintln!(
        "[2] acquire+release cycles: {} rounds x 6 runs of {:.1} s",
        cfg.s2_rounds, cfg.s2_secs
    );
    let srv = Server::builder().start();
    let port = srv.port();
    let mut c = Conn::open(port);
    let cad = c.script(CAD);
    let facq = c.script(FENCE_ACQ);
    let mut s = Samples::default();
    let kinds = [
        (Kind::Flock, "flock"),
        (Kind::SetNx, "set"),
        (Kind::LuaFenced, "lua"),
    ];
    for round in 0..cfg.s2_rounds {
        eprintln!("  round {}/{}", round + 1, cfg.s2_rounds);
        for (pipe, mode) in [(1usize, "np"), (16usize, "p")] {
            for (kind, name) in rotate(&kinds, round) {
                c.call(&["FLUSHALL"]);
                wait_rehash(&mut c);
                let r = cycle_rate(port, threads, cfg.s2_secs, pipe, kind, &cad, &facq);
                s.add(&format!("{mode}.{name}"), r);
            }
            s.ratio(
                &format!("r.{mode}.set"),
                &format!("{mode}.flock"),
                &format!("{mode}.set"),
            );
            s.ratio(
                &format!("r.{mode}.lua"),
                &format!("{mode}.flock"),
                &format!("{mode}.lua"),
            );
        }
    }
    drop(srv);
    let sec = "2. Acquire+release cycles per second";
    rep.check(
        sec,
        "cycles/s, flock / SET NX PX + Lua release (no pipeline)",
        s.med("r.np.set"),
        None,
    );
    rep.check(
        sec,
        "cycles/s, flock / Lua fenced acquire + Lua release (no pipeline)",
        s.med("r.np.lua"),
        None,
    );
    rep.check(
        sec,
        "cycles/s, flock / SET NX PX + Lua release (pipelined)",
        s.med("r.p.set"),
        None,
    );
    rep.check(
        sec,
        "cycles/s, flock / Lua fenced acquire + Lua release (pipelined)",
        s.med("r.p.lua"),
        None,
    );
    let mut rows = vec![];
    for (mode, label) in [
        ("np", "one command at a time"),
        ("p", "16 cycles per pipeline"),
    ] {
        rows.push(vec![
            label.to_string(),
            format!("{:.0}", s.med(&format!("{mode}.flock"))),
            format!("{:.0}", s.med(&format!("{mode}.set"))),
            s.show_ratio(&format!("r.{mode}.set")),
            format!("{:.0}", s.med(&format!("{mode}.lua"))),
            s.show_ratio(&format!("r.{mode}.lua")),
        ]);
    }
    let mut body = format!(
        "Cycles per second, higher is better: {threads} client threads, each with its own \
         connection, for {:.1} s per run, {} round(s), order rotated; one cycle takes a random \
         key of 100,000 and releases it. flock: `FLOCK.ACQUIRE` + `FLOCK.RELEASE`. Baseline A: \
         `SET key owner NX PX ttl` + Lua compare-and-delete. Baseline B: Lua `SET NX PX` + \
         `INCR key:tok` + Lua compare-and-delete. Client and server share the machine's {} \
         cores, so this measures the whole round trip, not only the server.\n\n",
        cfg.s2_secs,
        cfg.s2_rounds,
        ncpu()
    );
    body += &table(
        &[
            "mode",
            "flock",
            "A: SET NX PX",
            "flock / A",
            "B: Lua fenced",
            "flock / B",
        ],
        &rows,
    );
    rep.section(sec, body);
}

// ---------------------------------------------------------------------------------------------
// scenario 3: memory
// ---------------------------------------------------------------------------------------------

fn used_memory(c: &mut Conn) -> f64 {
    sleep(Duration::from_millis(300));
    c.info_num("memory", "used_memory")
}

fn scenario3(cfg: &Cfg, rep: &mut Report) {
    let n = cfg.s3_locks;
    eprintln!("[3] memory: {} locks per kind", thousands(n));
    let srv = Server::builder().start();
    let port = srv.port();
    let mut c = Conn::open(port);
    let cad = c.script(CAD);
    let facq = c.script(FENCE_ACQ);
    let mut held = BTreeMap::new();
    let mut left = BTreeMap::new();
    let mut usage = BTreeMap::new();
    for (kind, name) in [
        (Kind::Flock, "flock"),
        (Kind::SetNx, "set"),
        (Kind::LuaFenced, "lua"),
    ] {
        c.call(&["FLUSHALL"]);
        sleep(Duration::from_millis(300));
        let before = used_memory(&mut c);
        let mut t = Tally::default();
        for i in 0..n {
            push_acquire(&mut c, kind, &lock_key(i), &uuid(i), &facq);
            if i % 1000 == 999 {
                c.drain(&mut t);
            }
        }
        c.drain(&mut t);
        let want = if kind == Kind::SetNx { t.ok } else { t.int };
        if want != n as u64 {
            eprintln!("  warning: memory {name}: {t:?}");
        }
        wait_rehash(&mut c);
        let after = used_memory(&mut c);
        let mu = c
            .call(&["MEMORY", "USAGE", &lock_key(n / 2)])
            .int()
            .unwrap_or(0);
        usage.insert(name, mu);
        let mut t = Tally::default();
        for i in 0..n {
            push_release(&mut c, kind, &lock_key(i), &uuid(i), &cad);
            if i % 1000 == 999 {
                c.drain(&mut t);
            }
        }
        c.drain(&mut t);
        if t.one != n as u64 {
            eprintln!("  warning: memory {name} release: {t:?}");
        }
        // let serverCron shrink the emptied dicts
        sleep(Duration::from_millis(1000));
        wait_rehash(&mut c);
        let end = used_memory(&mut c);
        held.insert(name, (after - before) / n as f64);
        left.insert(name, (end - before) / n as f64);
    }
    drop(srv);
    let sec = "3. Memory per lock";
    rep.fact("s3.flock", held["flock"]);
    rep.fact("s3.set", held["set"]);
    rep.fact("s3.mu.flock", usage["flock"] as f64);
    rep.fact("s3.mu.set", usage["set"] as f64);
    let r_set = held["flock"] / held["set"];
    let r_lua = held["flock"] / held["lua"];
    rep.check(
        sec,
        "bytes per held lock, flock / SET NX PX",
        r_set,
        Some(Goal::AtMost(1.0)),
    );
    rep.check(
        sec,
        "bytes per held lock, flock / SET NX PX + token key",
        r_lua,
        None,
    );
    // residue: an absolute number, compared with what Redis itself keeps after SET + DEL
    let residue = left["flock"];
    let allowed = left["set"].max(0.0) + 1.0;
    rep.checks.push(Check {
        section: sec,
        what: "bytes left per released lock".into(),
        value: residue,
        goal: Some(Goal::AtMost(allowed)),
        ratio: false,
        higher: false,
        shown: format!("{residue:.2} B"),
        target_text: format!("≤ {allowed:.2} B (SET+DEL's {:.2} B + 1 B)", left["set"]),
    });
    let rows = vec![
        vec![
            "flock (`FLOCK.ACQUIRE`)".into(),
            format!("{:.1}", held["flock"]),
            x(r_set),
            format!("{:.2}", left["flock"]),
            usage["flock"].to_string(),
        ],
        vec![
            "`SET key owner NX PX ttl`".into(),
            format!("{:.1}", held["set"]),
            "1.00x".into(),
            format!("{:.2}", left["set"]),
            usage["set"].to_string(),
        ],
        vec![
            "`SET NX PX` + `INCR key:tok` (Lua)".into(),
            format!("{:.1}", held["lua"]),
            x(held["lua"] / held["set"]),
            format!("{:.2}", left["lua"]),
            format!("{} + token key", usage["lua"]),
        ],
    ];
    let mut body = format!(
        "`used_memory` after minus before taking {} locks (keys `lock:0000000` ..., a different \
         36-byte UUID-like owner per lock, ttl {TTL} ms) on a `FLUSHALL`ed server, divided by \
         the number of locks; then every lock is released (`FLOCK.RELEASE`, or the Lua \
         compare-and-delete) and, after a 1.3 s pause for the server's cron to shrink its \
         tables, what `used_memory` still holds above the start is divided by the same number. \
         The token keys of the Lua recipe stay behind by design: that is the residue it is \
         known for. `MEMORY USAGE` is what the server reports for one key (for flock, what the \
         module's callback says); the used_memory delta is what the server really spent.\n\n",
        thousands(n)
    );
    body += &table(
        &[
            "lock",
            "bytes per held lock",
            "vs SET NX PX",
            "bytes left per released lock",
            "`MEMORY USAGE` of one lock key",
        ],
        &rows,
    );
    let _ = write!(
        body,
        "\nflock / `SET NX PX`: {} (target ≤ 1.00x) {}; flock / `SET NX PX` + token key: {}; \
         left per released flock lock: {:.2} B (target: no more than plain `SET` + `DEL` leaves, \
         {:.2} B, + 1 B) {}.\n",
        x(r_set),
        rep.mark_of("bytes per held lock, flock / SET NX PX"),
        x(r_lua),
        residue,
        left["set"],
        rep.mark_of("bytes left per released lock"),
    );
    rep.section(sec, body);
}

// ---------------------------------------------------------------------------------------------
// scenario 4: contention
// ---------------------------------------------------------------------------------------------

#[derive(Clone, Copy, PartialEq)]
enum Method {
    Block,
    Poll10,
    Redlock,
}

struct Cont {
    grants_per_s: f64,
    waits: Vec<u64>,
    per_client: Vec<u64>,
}

/// `clients` threads compete for one lock for `secs`; each holds it for 1 ms, then works
/// `think` outside the lock before it tries again.
fn contention(
    port: u16,
    clients: usize,
    secs: f64,
    think: Duration,
    method: Method,
    cad: &str,
) -> Cont {
    let dur = Duration::from_secs_f64(secs);
    let barrier = Barrier::new(clients);
    // every client connects first; the clock starts when the last one is ready
    let start_at = std::sync::OnceLock::new();
    let results: Vec<(u64, Vec<u64>)> = thread::scope(|s| {
        let hs: Vec<_> = (0..clients)
            .map(|i| {
                let barrier = &barrier;
                let start_at = &start_at;
                s.spawn(move || {
                    let mut c = Conn::open(port);
                    let owner = uuid(500_000 + i);
                    let mut rng = Rng::new(i as u64 + 77);
                    let mut waits = Vec::new();
                    let mut grants = 0u64;
                    barrier.wait();
                    let start: Instant = *start_at.get_or_init(Instant::now);
                    let end = start + dur;
                    'outer: loop {
                        let t0 = Instant::now();
                        if t0 >= end {
                            break;
                        }
                        let got = loop {
                            let granted = match method {
                                Method::Block => matches!(
                                    c.call(&[
                                        "FLOCK.ACQUIRE",
                                        "lk",
                                        &owner,
                                        "10000",
                                        "BLOCK",
                                        "2000"
                                    ]),
                                    Reply::Int(_)
                                ),
                                _ => matches!(
                                    c.call(&["SET", "lk", &owner, "NX", "PX", "10000"]),
                                    Reply::Status(ref s) if s == "OK"
                                ),
                            };
                            if granted {
                                break true;
                            }
                            if Instant::now() >= end {
                                break false;
                            }
                            match method {
                                Method::Block => {}
                                Method::Poll10 => sleep(Duration::from_millis(10)),
                                Method::Redlock => {
                                    sleep(Duration::from_millis(50 + rng.below(201)))
                                }
                            }
                            if Instant::now() >= end {
                                break false;
                            }
                        };
                        let t1 = Instant::now();
                        let release = |c: &mut Conn| {
                            let r = match method {
                                Method::Block => c.call(&["FLOCK.RELEASE", "lk", &owner]),
                                _ => c.call(&["EVALSHA", cad, "1", "lk", &owner]),
                            };
                            assert_eq!(r, Reply::Int(1), "release in the contention scenario");
                        };
                        if got && t1 < end {
                            waits.push((t1 - t0).as_micros() as u64);
                            grants += 1;
                            sleep(Duration::from_millis(1)); // the critical section
                            release(&mut c);
                            if !think.is_zero() {
                                sleep(think); // work outside the lock
                            }
                        } else {
                            // a wait still going on at the end counts with what it has lasted
                            waits.push((end.min(t1) - t0).as_micros() as u64);
                            if got {
                                release(&mut c);
                            }
                            break 'outer;
                        }
                    }
                    (grants, waits)
                })
            })
            .collect();
        hs.into_iter()
            .map(|h| h.join().expect("client thread"))
            .collect()
    });
    let per_client: Vec<u64> = results.iter().map(|r| r.0).collect();
    let mut waits: Vec<u64> = results.into_iter().flat_map(|r| r.1).collect();
    waits.sort_unstable();
    let total: u64 = per_client.iter().sum();
    Cont {
        grants_per_s: total as f64 / secs,
        waits,
        per_client,
    }
}

fn jain(v: &[u64]) -> f64 {
    let s: f64 = v.iter().map(|&x| x as f64).sum();
    let s2: f64 = v.iter().map(|&x| (x as f64) * (x as f64)).sum();
    if s2 == 0.0 {
        return 0.0;
    }
    s * s / (v.len() as f64 * s2)
}

fn scenario4(cfg: &Cfg, rep: &mut Report) {
    eprintln!(
        "[4] contention: {:?} clients x 3 methods x {:.1} s",
        cfg.s4_clients, cfg.s4_secs
    );
    let max_c = *cfg.s4_clients.iter().max().unwrap_or(&128);
    let srv = Server::builder()
        .arg("maxclients", &(max_c + 1000).to_string())
        .start();
    let port = srv.port();
    let mut c = Conn::open(port);
    let cad = c.script(CAD);
    let methods = [
        (Method::Block, "flock `BLOCK`"),
        (Method::Poll10, "`SET NX` + 10 ms sleep"),
        (Method::Redlock, "`SET NX` + 50-250 ms back-off"),
    ];
    let mut rows = vec![];
    let sec = "4. Contention: one lock, many clients";
    // the issue's loop (no pause between critical sections), plus 32 clients that work 10 ms
    // outside the lock between critical sections
    let mut configs: Vec<(usize, u64)> = cfg.s4_clients.iter().map(|&n| (n, 0)).collect();
    if cfg.s4_clients.contains(&32) {
        configs.push((32, 10));
    }
    let label = |n: usize, think: u64| {
        if think == 0 {
            format!("{n}")
        } else {
            format!("{n} + {think} ms work")
        }
    };
    for (ci, &(n, think)) in configs.iter().enumerate() {
        eprintln!("  {}", label(n, think));
        let mut res = vec![];
        for (m, name) in rotate(&methods, ci) {
            c.call(&["FLUSHALL"]);
            let r = contention(port, n, cfg.s4_secs, Duration::from_millis(think), m, &cad);
            res.push((m, name, r));
        }
        res.sort_by_key(|(m, _, _)| *m as u8);
        for (_, name, r) in &res {
            let mn = r.per_client.iter().min().copied().unwrap_or(0);
            let mx = r.per_client.iter().max().copied().unwrap_or(0);
            rows.push(vec![
                label(n, think),
                name.to_string(),
                format!("{:.0}", r.grants_per_s),
                ms(pct(&r.waits, 0.5)),
                ms(pct(&r.waits, 0.99)),
                ms(r.waits.last().copied().unwrap_or(0)),
                format!("{:.3}", jain(&r.per_client)),
                format!("{mn} / {mx}"),
            ]);
        }
        let flock = &res[0].2;
        if n == 32 && think == 0 {
            rep.fact("s4.gps.flock", flock.grants_per_s);
            rep.fact("s4.gps.poll", res[1].2.grants_per_s);
            rep.fact("s4.gps.redlock", res[2].2.grants_per_s);
            rep.fact("s4.p99.flock", pct(&flock.waits, 0.99) as f64 / 1000.0);
            rep.fact("s4.p99.poll", pct(&res[1].2.waits, 0.99) as f64 / 1000.0);
            rep.fact("s4.p99.redlock", pct(&res[2].2.waits, 0.99) as f64 / 1000.0);
            rep.fact("s4.jain.flock", jain(&flock.per_client));
            rep.fact("s4.jain.poll", jain(&res[1].2.per_client));
            rep.fact("s4.jain.redlock", jain(&res[2].2.per_client));
        }
        let best = if res[1].2.grants_per_s >= res[2].2.grants_per_s {
            &res[1].2
        } else {
            &res[2].2
        };
        let gps = flock.grants_per_s / best.grants_per_s;
        let p99_best_poll = pct(&res[1].2.waits, 0.99)
            .min(pct(&res[2].2.waits, 0.99))
            .max(1);
        let p99 = pct(&flock.waits, 0.99) as f64 / p99_best_poll as f64;
        let (g1, g2) = if n == 32 && think == 0 {
            (Some(Goal::AtLeast(5.0)), Some(Goal::Below(1.0)))
        } else {
            (None, None)
        };
        rep.check(
            sec,
            &format!(
                "grants/s with {} clients, flock / best polling",
                label(n, think)
            ),
            gps,
            g1,
        );
        rep.check(
            sec,
            &format!(
                "p99 wait with {} clients, flock / lower polling p99",
                label(n, think)
            ),
            p99,
            g2,
        );
    }
    eprintln!("  hand-off latency, one waiter");
    let mut lat = vec![];
    for (m, name) in methods.iter().take(2) {
        c.call(&["FLUSHALL"]);
        let n = if *m == Method::Block {
            cfg.s4_handoffs
        } else {
            cfg.s4_handoffs / 4
        };
        lat.push((*name, handoff_latency(port, n, *m, &cad)));
    }
    let lat_ratio = pct(&lat[0].1, 0.5) as f64 / pct(&lat[1].1, 0.5).max(1) as f64;
    rep.check(
        sec,
        "hand-off latency p50, flock / SET NX + 10 ms polling",
        lat_ratio,
        None,
    );
    drop(srv);
    let mut body = format!(
        "N clients (threads, each with its own connection) compete for one lock for {:.1} s: \
         acquire, hold it for a 1 ms critical section (`sleep(1 ms)`), release, repeat. flock \
         waits with `FLOCK.ACQUIRE lk owner 10000 BLOCK 2000`; the polling clients retry \
         `SET lk owner NX PX 10000` after a fixed 10 ms sleep, or after a Redlock-style random \
         50-250 ms back-off, and release with the Lua compare-and-delete. A wait runs from the \
         first try to the grant; a wait still going on when time is up counts with what it has \
         lasted. Fairness: Jain's index over the clients' grant counts (1 = all equal) and the \
         fewest / most grants of one client. The machine has {} cores for the server and all \
         client threads.\n\n\
         In that loop a polling client that releases tries again at once and usually takes the \
         lock straight back (its wait is a few microseconds), so the lock is never idle and \
         grants/s is bounded by the 1 ms critical section for every method; what differs is who \
         gets the grants (fairness) and how long the others wait. The extra \"32 + 10 ms work\" \
         rows (no target) let each client work 10 ms outside the lock before it tries again, as \
         real workers do; then a lock released while every poller sleeps stays idle until the \
         next poll.\n\n\
         Read the p99 column with the fairness columns: with few polling clients most grants go \
         to the client that has just released (a wait of microseconds), so the polling p99 can \
         be tiny while another client waits the whole run (max wait, and 0 grants in min / max \
         grants).\n\n",
        cfg.s4_secs,
        ncpu()
    );
    body += &table(
        &[
            "clients",
            "method",
            "grants/s",
            "wait p50 ms",
            "wait p99 ms",
            "wait max ms",
            "Jain",
            "min / max grants",
        ],
        &rows,
    );
    body +=
        "\nRatios (flock / best polling baseline; for p99 the lower of the two polling p99s):\n\n";
    let mut rrows = vec![];
    for &(n, think) in &configs {
        let g = format!(
            "grants/s with {} clients, flock / best polling",
            label(n, think)
        );
        let p = format!(
            "p99 wait with {} clients, flock / lower polling p99",
            label(n, think)
        );
        let gv = rep
            .checks
            .iter()
            .rev()
            .find(|c| c.what == g)
            .map(|c| c.value)
            .unwrap_or(f64::NAN);
        let pv = rep
            .checks
            .iter()
            .rev()
            .find(|c| c.what == p)
            .map(|c| c.value)
            .unwrap_or(f64::NAN);
        let targeted = n == 32 && think == 0;
        rrows.push(vec![
            label(n, think),
            x(gv),
            if targeted {
                "≥ 5.00x".into()
            } else {
                "—".into()
            },
            rep.mark_of(&g),
            x(pv),
            if targeted {
                "< 1.00x".into()
            } else {
                "—".into()
            },
            rep.mark_of(&p),
        ]);
    }
    body += &table(
        &[
            "clients",
            "grants/s ratio",
            "target",
            "",
            "p99 wait ratio",
            "target",
            "",
        ],
        &rrows,
    );
    let _ = write!(
        body,
        "\n**Hand-off latency.** One client holds the lock and one waits for it (flock: blocked \
         in `FLOCK.ACQUIRE ... BLOCK 0`; polling: `SET NX` every 10 ms, the release landing at \
         a random point of its sleep). Time from sending the release to the waiter holding the \
         lock, measured by the clients, {} hand-offs for flock, {} for polling:\n\n",
        thousands(lat[0].1.len()),
        thousands(lat[1].1.len())
    );
    let lrows: Vec<Vec<String>> = lat
        .iter()
        .map(|(name, l)| {
            vec![
                name.to_string(),
                ms(pct(l, 0.5)),
                ms(pct(l, 0.99)),
                ms(l.last().copied().unwrap_or(0)),
            ]
        })
        .collect();
    body += &table(&["waiter", "p50 ms", "p99 ms", "max ms"], &lrows);
    let _ = writeln!(body, "\nflock / polling, p50: {}.", x(lat_ratio));
    rep.section(sec, body);
}

/// Time (us) from the holder sending its release until one waiting client holds the lock,
/// `n` times. The holder uses its own connection; the waiter is a thread with its own.
fn handoff_latency(port: u16, n: usize, method: Method, cad: &str) -> Vec<u64> {
    use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
    use std::sync::mpsc;
    let mut holder = Conn::open(port);
    let tries = AtomicUsize::new(0);
    let granted_at = AtomicU64::new(0);
    let origin = Instant::now();
    let (go_tx, go_rx) = mpsc::channel::<Option<usize>>();
    let (done_tx, done_rx) = mpsc::channel::<()>();
    let mut out = Vec::with_capacity(n);
    thread::scope(|s| {
        let (tries, granted_at) = (&tries, &granted_at);
        s.spawn(move || {
            let mut c = Conn::open(port);
            while let Ok(Some(i)) = go_rx.recv() {
                let owner = format!("waiter-{i}");
                match method {
                    Method::Block => {
                        tries.fetch_add(1, Ordering::SeqCst);
                        let r = c.call(&["FLOCK.ACQUIRE", "hk", &owner, "10000", "BLOCK", "0"]);
                        assert!(matches!(r, Reply::Int(_)), "hand-off: {r:?}");
                    }
                    _ => loop {
                        let r = c.call(&["SET", "hk", &owner, "NX", "PX", "10000"]);
                        if matches!(r, Reply::Status(ref s) if s == "OK") {
                            break;
                        }
                        tries.fetch_add(1, Ordering::SeqCst);
                        sleep(Duration::from_millis(10));
                    },
                }
                granted_at.store(origin.elapsed().as_micros() as u64, Ordering::SeqCst);
                let r = match method {
                    Method::Block => c.call(&["FLOCK.RELEASE", "hk", &owner]),
                    _ => c.call(&["EVALSHA", cad, "1", "hk", &owner]),
                };
                assert_eq!(r, Reply::Int(1), "hand-off: waiter release");
                done_tx.send(()).expect("done");
            }
        });
        let mut rng = Rng::new(4242);
        for i in 0..n {
            let r = match method {
                Method::Block => holder.call(&["FLOCK.ACQUIRE", "hk", "holder", "10000"]),
                _ => holder.call(&["SET", "hk", "holder", "NX", "PX", "10000"]),
            };
            assert!(!r.is_nil() && !r.is_err(), "hand-off: holder acquire {r:?}");
            tries.store(0, Ordering::SeqCst);
            go_tx.send(Some(i)).expect("go");
            match method {
                Method::Block => wait_for("the waiter to block", Duration::from_secs(10), || {
                    tries.load(Ordering::SeqCst) > 0 && holder.blocked_clients() == 1
                }),
                _ => {
                    wait_for("the waiter to poll", Duration::from_secs(10), || {
                        tries.load(Ordering::SeqCst) > 0
                    });
                    sleep(Duration::from_micros(rng.below(10_000)));
                }
            }
            let t0 = origin.elapsed().as_micros() as u64;
            let r = match method {
                Method::Block => holder.call(&["FLOCK.RELEASE", "hk", "holder"]),
                _ => holder.call(&["EVALSHA", cad, "1", "hk", "holder"]),
            };
            assert_eq!(r, Reply::Int(1), "hand-off: holder release");
            done_rx.recv().expect("waiter done");
            out.push(granted_at.load(Ordering::SeqCst).saturating_sub(t0));
        }
        go_tx.send(None).expect("stop");
    });
    out.sort_unstable();
    out
}

// ---------------------------------------------------------------------------------------------
// scenario 5: scaling with held keys and with waiters
// ---------------------------------------------------------------------------------------------

/// ACQUIRE+RELEASE pairs on `pairs` fresh probe keys; returns (acquire, release) usec/call.
fn probe_pairs(c: &mut Conn, port: u16, pairs: usize, kind: Kind, cad: &str) -> (f64, f64) {
    c.reset_stats();
    let t = drive(port, 4, 32, pairs * 2, 2, &|i, c| {
        let k = format!("p:{:07}", i / 2);
        let o = uuid(i / 2);
        if i % 2 == 0 {
            push_acquire(c, kind, &k, &o, "");
        } else {
            push_release(c, kind, &k, &o, cad);
        }
    });
    if t.one != pairs as u64 {
        eprintln!("  warning: probe pairs: {t:?}");
    }
    let st = c.cmdstats();
    match kind {
        Kind::Flock => (st.cost("flock.acquire"), st.cost("flock.release")),
        _ => (st.cost("set"), st.cost("evalsha")),
    }
}

/// One measurement of the waiters part of scenario 5: `nw` clients wait on `busy`; then
/// ACQUIRE+RELEASE of free keys, ACQUIRE of `busy` (nil), and RELEASE of `busy` (a hand-off
/// when somebody waits), in an order rotated by `round`. The waiters leave at the end.
fn measure_waiters(c: &mut Conn, port: u16, cfg: &Cfg, nw: usize, round: usize, w: &mut Samples) {
    c.call(&["FLUSHALL"]);
    assert!(c
        .call(&["FLOCK.ACQUIRE", "busy", "holder", LONG_TTL])
        .int()
        .is_some());
    let h = cfg.s5_handoffs;
    let per_waiter = h.checked_div(nw).map_or(0, |q| q + 3);
    let mut socks = Vec::with_capacity(nw);
    for i in 0..nw {
        let mut out = Vec::new();
        for j in 0..per_waiter {
            out.extend(flock_testkit::resp_command(&[
                "FLOCK.ACQUIRE",
                "busy",
                &format!("w{i}-{}", j % 2),
                LONG_TTL,
                "BLOCK",
                "0",
            ]));
        }
        let mut s = TcpStream::connect(("127.0.0.1", port)).expect("waiter connect");
        s.write_all(&out).expect("waiter write");
        socks.push(s);
        if i % 500 == 499 {
            wait_for("waiters to queue", Duration::from_secs(60), || {
                c.blocked_clients() > i
            });
        }
    }
    wait_for("waiters to queue", Duration::from_secs(60), || {
        c.blocked_clients() == nw
    });
    for step in rotate(&[0, 1, 2], round) {
        match step {
            0 => {
                let (a, r) = probe_pairs(c, port, cfg.s5_pairs, Kind::Flock, "");
                w.add(&format!("w{nw}.acq_free"), a);
                w.add(&format!("w{nw}.rel_free"), r);
            }
            1 => {
                c.reset_stats();
                let t = drive(port, 4, 32, cfg.s5_pairs, 1, &|_, c| {
                    c.push(&["FLOCK.ACQUIRE", "busy", "newcomer", TTL])
                });
                expect("ACQUIRE busy key", &t, cfg.s5_pairs, |t| t.nil);
                w.add(
                    &format!("w{nw}.acq_busy"),
                    c.cmdstats().cost("flock.acquire"),
                );
            }
            _ => {
                c.reset_stats();
                if nw == 0 {
                    // plain release of the busy key, taken again at once
                    let mut t = Tally::default();
                    for _ in 0..h {
                        c.push(&["FLOCK.RELEASE", "busy", "holder"]);
                        c.push(&["FLOCK.ACQUIRE", "busy", "holder", LONG_TTL]);
                    }
                    c.drain(&mut t);
                    w.add(
                        &format!("w{nw}.rel_busy"),
                        c.cmdstats().cost("flock.release"),
                    );
                } else {
                    for _ in 0..h {
                        let info = c.call(&["FLOCK.INFO", "busy"]);
                        let owner = flock_testkit::parse_info(&info, "FLOCK.INFO busy")
                            .and_then(|i| i.owner)
                            .expect("busy key has an owner");
                        let owner = String::from_utf8_lossy(&owner).into_owned();
                        let r = c.call(&["FLOCK.RELEASE", "busy", &owner]);
                        assert_eq!(r, Reply::Int(1), "hand-off release");
                    }
                    wait_for("waiters to queue again", Duration::from_secs(60), || {
                        c.blocked_clients() == nw
                    });
                    let st = c.cmdstats();
                    w.add(&format!("w{nw}.rel_busy"), st.cost("flock.release"));
                    let cyc = (st.usec("flock.release") + st.usec("flock.acquire"))
                        / st.calls("flock.release");
                    w.add(&format!("w{nw}.handoff"), cyc);
                }
            }
        }
    }
    drop(socks);
    wait_for("waiters to leave", Duration::from_secs(60), || {
        c.blocked_clients() == 0
    });
}

fn scenario5(cfg: &Cfg, rep: &mut Report, nofile: u64) {
    let sec = "5. Scaling";
    eprintln!(
        "[5] scaling: held keys {:?}, waiters {:?}",
        cfg.s5_levels, cfg.s5_waiters
    );
    // --- held keys ---
    let srv = Server::builder().start();
    let port = srv.port();
    let mut c = Conn::open(port);
    let cad = c.script(CAD);
    let mut s = Samples::default();
    // warm up the fresh server (page faults, allocator) before the first level is measured
    for kind in [Kind::Flock, Kind::SetNx] {
        probe_pairs(&mut c, port, cfg.s5_pairs, kind, &cad);
    }
    let mut have = 0usize;
    for &level in &cfg.s5_levels {
        eprintln!("  {} lock keys held", thousands(level));
        let from = have;
        let t = drive(port, 4, 256, level - from, 1, &|i, c| {
            let i = from + i;
            c.push(&["FLOCK.ACQUIRE", &format!("h:{i:07}"), &uuid(i), LONG_TTL])
        });
        expect("preload FLOCK.ACQUIRE", &t, level - from, |t| t.int);
        let t = drive(port, 4, 256, level - from, 1, &|i, c| {
            let i = from + i;
            c.push(&["SET", &format!("s:{i:07}"), &uuid(i), "NX", "PX", LONG_TTL])
        });
        expect("preload SET NX PX", &t, level - from, |t| t.ok);
        have = level;
        wait_rehash(&mut c);
        for round in 0..cfg.s5_rounds {
            for kind in rotate(&[Kind::Flock, Kind::SetNx], round) {
                let (a, r) = probe_pairs(&mut c, port, cfg.s5_pairs, kind, &cad);
                let tag = if kind == Kind::Flock { "flock" } else { "set" };
                s.add(&format!("k{level}.{tag}.acq"), a);
                s.add(&format!("k{level}.{tag}.rel"), r);
            }
        }
    }
    drop(srv);
    let base = cfg.s5_levels[0];
    let mut rows = vec![];
    for &level in &cfg.s5_levels {
        let g = |tag: &str, op: &str| {
            s.med(&format!("k{level}.{tag}.{op}")) / s.med(&format!("k{base}.{tag}.{op}"))
        };
        rows.push(vec![
            thousands(level),
            us(s.med(&format!("k{level}.flock.acq"))),
            x(g("flock", "acq")),
            us(s.med(&format!("k{level}.set.acq"))),
            x(g("set", "acq")),
            us(s.med(&format!("k{level}.flock.rel"))),
            x(g("flock", "rel")),
            us(s.med(&format!("k{level}.set.rel"))),
            x(g("set", "rel")),
        ]);
        if level != base {
            rep.check(
                sec,
                &format!(
                    "ACQUIRE growth at {} keys, relative to SET NX PX's",
                    thousands(level)
                ),
                g("flock", "acq") / g("set", "acq"),
                Some(Goal::AtMost(1.25)),
            );
            rep.check(
                sec,
                &format!(
                    "RELEASE growth at {} keys, relative to Lua release's",
                    thousands(level)
                ),
                g("flock", "rel") / g("set", "rel"),
                Some(Goal::AtMost(1.25)),
            );
        }
    }
    let mut body = format!(
        "**Held lock keys.** The server holds N flock locks and N `SET NX PX` locks (keys \
         `h:...` and `s:...`, ttl 1 h); then {} ACQUIRE+RELEASE pairs on other keys are timed \
         with `INFO commandstats` (4 connections, 32 commands per pipeline), flock and the \
         `SET NX PX` / Lua compare-and-delete baseline alternately, {} round(s), medians. \
         \"growth\" is the cost at N over the cost at {} key(s). Target: flat within noise, \
         i.e. flock's growth at most 1.25x the baseline's growth at the same N (the baseline \
         shows what a bigger keyspace costs Redis itself).{}\n\n",
        thousands(cfg.s5_pairs),
        cfg.s5_rounds,
        thousands(base),
        if cfg.quick {
            " QUICK mode: at most 100,000 keys instead of 1,000,000."
        } else {
            ""
        }
    );
    body += &table(
        &[
            "lock keys held",
            "FLOCK.ACQUIRE usec",
            "growth",
            "SET NX PX usec",
            "growth",
            "FLOCK.RELEASE usec",
            "growth",
            "Lua release usec",
            "growth",
        ],
        &rows,
    );
    let mut krows = vec![];
    for &level in &cfg.s5_levels[1..] {
        for op in ["ACQUIRE", "RELEASE"] {
            let w = if op == "ACQUIRE" {
                format!(
                    "ACQUIRE growth at {} keys, relative to SET NX PX's",
                    thousands(level)
                )
            } else {
                format!(
                    "RELEASE growth at {} keys, relative to Lua release's",
                    thousands(level)
                )
            };
            let v = rep
                .checks
                .iter()
                .rev()
                .find(|c| c.what == w)
                .map(|c| c.value)
                .unwrap_or(f64::NAN);
            krows.push(vec![
                format!("{} at {} keys", op, thousands(level)),
                x(v),
                "≤ 1.25x".into(),
                rep.mark_of(&w),
            ]);
        }
    }
    body += "\n";
    body += &table(
        &["flock growth / baseline growth", "ratio", "target", ""],
        &krows,
    );

    // --- waiters ---
    let wmax = *cfg.s5_waiters.iter().max().unwrap_or(&0);
    let need_fd = wmax as u64 + 2000;
    let waiters: Vec<usize> = if nofile < need_fd {
        let keep: Vec<usize> = cfg
            .s5_waiters
            .iter()
            .copied()
            .filter(|&w| (w as u64) + 2000 <= nofile)
            .collect();
        rep.notes.push(format!(
            "RLIMIT_NOFILE is {nofile}: waiter counts above {} were skipped (raise `ulimit -n`).",
            nofile.saturating_sub(2000)
        ));
        keep
    } else {
        cfg.s5_waiters.clone()
    };
    let srv = Server::builder()
        .arg("maxclients", &(wmax + 1000).to_string())
        .module_args(&["max-waiters", "1000000"])
        .start();
    let port = srv.port();
    let mut c = Conn::open(port);
    let mut w = Samples::default();
    let rounds = cfg.s5_rounds;
    let w0 = waiters.first().copied().unwrap_or(0);
    let w1 = waiters.iter().copied().find(|&v| v > 0).unwrap_or(0);
    // each round sets up every waiter count in turn (order rotated), so that every count has
    // a 0-waiter measurement close in time to compare with
    for round in 0..rounds {
        eprintln!(
            "  round {}/{rounds}: waiters {:?}",
            round + 1,
            rotate(&waiters, round)
        );
        for nw in rotate(&waiters, round) {
            measure_waiters(&mut c, port, cfg, nw, round, &mut w);
        }
        for &nw in &waiters {
            for k in ["acq_free", "rel_free", "acq_busy"] {
                w.ratio(
                    &format!("r{nw}.{k}"),
                    &format!("w{nw}.{k}"),
                    &format!("w{w0}.{k}"),
                );
            }
            w.ratio(
                &format!("r{nw}.rel_busy"),
                &format!("w{nw}.rel_busy"),
                &format!("w{w1}.rel_busy"),
            );
        }
    }
    drop(srv);
    let mut rows = vec![];
    for &nw in &waiters {
        // median of the per-round ratios against the same round's baseline count
        let g = |k: &str, _b: usize| w.med(&format!("r{nw}.{k}"));
        rows.push(vec![
            thousands(nw),
            format!(
                "{} ({})",
                us(w.med(&format!("w{nw}.acq_free"))),
                x(g("acq_free", w0))
            ),
            format!(
                "{} ({})",
                us(w.med(&format!("w{nw}.rel_free"))),
                x(g("rel_free", w0))
            ),
            format!(
                "{} ({})",
                us(w.med(&format!("w{nw}.acq_busy"))),
                x(g("acq_busy", w0))
            ),
            if nw == 0 {
                format!("{} (no hand-off)", us(w.med(&format!("w{nw}.rel_busy"))))
            } else {
                format!(
                    "{} ({})",
                    us(w.med(&format!("w{nw}.rel_busy"))),
                    x(g("rel_busy", w1))
                )
            },
            if nw == 0 {
                "—".into()
            } else {
                us(w.med(&format!("w{nw}.handoff")))
            },
        ]);
        if nw != w0 {
            for (k, label) in [
                ("acq_free", "ACQUIRE of a free key"),
                ("rel_free", "RELEASE of a free key"),
                ("acq_busy", "ACQUIRE of the waited key (nil)"),
            ] {
                rep.check(
                    sec,
                    &format!("{label} with {} waiters / with {w0}", thousands(nw)),
                    g(k, w0),
                    Some(Goal::AtMost(1.25)),
                );
            }
        }
        if nw > w1 {
            rep.check(
                sec,
                &format!(
                    "RELEASE with hand-off, {} waiters / {} waiters",
                    thousands(nw),
                    thousands(w1)
                ),
                g("rel_busy", w1),
                Some(Goal::AtMost(1.25)),
            );
        }
    }
    let _ = write!(
        body,
        "\n**Waiters.** One key (`busy`) is held and N clients wait on it with \
         `FLOCK.ACQUIRE busy w<i> 3600000 BLOCK 0` (raw connections, each with a few such \
         commands pipelined so that it queues again after its grant). Timed with `INFO \
         commandstats`; each of {} round(s) sets up every count in turn; usec are medians, the \
         growth in brackets is the median of the per-round ratios against {} waiters: {} \
         ACQUIRE+RELEASE pairs on other keys; {} `FLOCK.ACQUIRE busy newcomer` (nil: the key is \
         held, and a caller without `BLOCK` never overtakes the queue); {} `FLOCK.RELEASE` of \
         the waited key, each handing it to the first waiter (its growth is against {} waiters: \
         with 0 waiters a release has no hand-off to do). \"hand-off, all in\" adds the server \
         time of the waiter's side (its reply, and its next `ACQUIRE ... BLOCK` queueing \
         again) per release. Target: flat, at most 1.25x.{}\n\n",
        rounds,
        w0,
        thousands(cfg.s5_pairs),
        thousands(cfg.s5_pairs),
        thousands(cfg.s5_handoffs),
        thousands(w1),
        if cfg.quick {
            " QUICK mode: at most 1,000 waiters instead of 10,000."
        } else {
            ""
        }
    );
    body += &table(
        &[
            "waiters",
            "ACQUIRE free key usec",
            "RELEASE free key usec",
            "ACQUIRE waited key usec",
            "RELEASE waited key usec",
            "hand-off, all in, usec",
        ],
        &rows,
    );
    let mut wrows = vec![];
    for ch in rep
        .checks
        .iter()
        .filter(|c| c.section == sec && c.what.contains("waiters"))
    {
        wrows.push(vec![
            ch.what.clone(),
            ch.shown.clone(),
            ch.target_text.clone(),
            ch.mark().into(),
        ]);
    }
    body += "\n";
    body += &table(&["growth with waiters", "ratio", "target", ""], &wrows);
    rep.section(sec, body);
}

// ---------------------------------------------------------------------------------------------
// callgrind: instructions per call, and where flock's go
// ---------------------------------------------------------------------------------------------

fn callgrind(cfg: &Cfg, rep: &mut Report) {
    let have = |cmd: &str| {
        Command::new(cmd)
            .arg("--version")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_ok()
    };
    if !have("valgrind") || !have("callgrind_annotate") || !have("callgrind_control") {
        rep.notes
            .push("valgrind/callgrind_annotate not installed: no instruction counts.".into());
        return;
    }
    eprintln!(
        "[callgrind] instructions per call ({} calls per command)",
        thousands(cfg.cg_calls)
    );
    let dir = std::env::temp_dir().join(format!("flock-bench-cg-{}", std::process::id()));
    let _ = std::fs::create_dir_all(&dir);
    let port = flock_testkit::free_port();
    let module = flock_testkit::module_path();
    let mut child = match Command::new("valgrind")
        .args([
            "--tool=callgrind",
            "--cache-sim=yes",
            "--dump-instr=no",
            &format!("--callgrind-out-file={}/cg.out", dir.display()),
            &flock_testkit::server_binary(),
            "--port",
            &port.to_string(),
            "--bind",
            "127.0.0.1",
            "--dir",
            &dir.display().to_string(),
            "--save",
            "",
            "--appendonly",
            "no",
            "--loadmodule",
            &module.display().to_string(),
        ])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
    {
        Ok(c) => c,
        Err(e) => {
            rep.notes.push(format!("could not run valgrind: {e}"));
            return;
        }
    };
    let pid = child.id().to_string();
    let start = Instant::now();
    let mut c = loop {
        if let Ok(s) = TcpStream::connect(("127.0.0.1", port)) {
            drop(s);
            let mut c = Conn::open(port);
            if matches!(c.call(&["PING"]), Reply::Status(_)) {
                break c;
            }
        }
        if start.elapsed() > Duration::from_secs(120) {
            let _ = child.kill();
            rep.notes
                .push("redis-server under valgrind did not start.".into());
            return;
        }
        sleep(Duration::from_millis(200));
    };
    let cad = c.script(CAD);
    let facq = c.script(FENCE_ACQ);
    let fw = c.script(FENCE_WRITE);
    let owner = uuid(424242);
    let tok = c
        .call(&["FLOCK.ACQUIRE", "wlk", &owner, LONG_TTL])
        .int()
        .unwrap_or(0)
        .to_string();
    c.call(&["SET", "wlk:tok", &tok]);
    c.call(&["SET", "wlk:owner", &owner]);
    let n = cfg.cg_calls;
    type Maker<'a> = Box<dyn Fn(usize, &mut Conn) + 'a>;
    let phases: Vec<(&str, &str, Maker)> = vec![
        (
            "FLOCK.ACQUIRE",
            "flock",
            Box::new(|i, c: &mut Conn| {
                c.push(&["FLOCK.ACQUIRE", &format!("f:{i:07}"), &uuid(i), TTL])
            }),
        ),
        (
            "SET NX PX",
            "set",
            Box::new(|i, c: &mut Conn| {
                c.push(&["SET", &format!("s:{i:07}"), &uuid(i), "NX", "PX", TTL])
            }),
        ),
        (
            "Lua fenced acquire",
            "lua",
            Box::new(|i, c: &mut Conn| {
                let k = format!("l:{i:07}");
                c.push(&[
                    "EVALSHA",
                    &facq,
                    "2",
                    &k,
                    &format!("{k}:tok"),
                    &uuid(i),
                    TTL,
                ])
            }),
        ),
        (
            "FLOCK.RELEASE",
            "flock",
            Box::new(|i, c: &mut Conn| c.push(&["FLOCK.RELEASE", &format!("f:{i:07}"), &uuid(i)])),
        ),
        (
            "Lua compare-and-delete",
            "set",
            Box::new(|i, c: &mut Conn| {
                c.push(&["EVALSHA", &cad, "1", &format!("s:{i:07}"), &uuid(i)])
            }),
        ),
        (
            "FLOCK.CHECK",
            "flock",
            Box::new(|_, c: &mut Conn| c.push(&["FLOCK.CHECK", "wlk", &tok])),
        ),
        (
            "GET",
            "get",
            Box::new(|_, c: &mut Conn| c.push(&["GET", "wlk:owner"])),
        ),
        (
            "FLOCK.FENCED + SET",
            "flock",
            Box::new(|i, c: &mut Conn| {
                c.push(&[
                    "FLOCK.FENCED",
                    "wlk",
                    &tok,
                    "SET",
                    &format!("data:{i:07}"),
                    "v",
                ])
            }),
        ),
        (
            "Lua token check + SET",
            "lua",
            Box::new(|i, c: &mut Conn| {
                c.push(&[
                    "EVALSHA",
                    &fw,
                    "2",
                    "wlk:tok",
                    &format!("data:{i:07}"),
                    &tok,
                    "v",
                ])
            }),
        ),
    ];
    let mut files = vec![];
    let _ = run_out("callgrind_control", &["-z", &pid]);
    for (pi, (name, _, make)) in phases.iter().enumerate() {
        let mut t = Tally::default();
        for i in 0..n {
            make(i, &mut c);
            if i % 16 == 15 {
                c.drain(&mut t);
            }
        }
        c.drain(&mut t);
        if t.err > 0 {
            eprintln!("  warning: callgrind phase {name}: {t:?}");
        }
        let _ = run_out("callgrind_control", &[&format!("--dump=phase{pi}"), &pid]);
        files.push(pi);
    }
    c.push(&["SHUTDOWN", "NOSAVE"]); // no reply: the server closes the connection
    c.flush();
    let _ = child.wait();
    // parse the dumps: cg.out.<pid>.<n> in order (the first dump after -z)
    let mut dumps: Vec<PathBuf> = std::fs::read_dir(&dir)
        .map(|rd| rd.flatten().map(|e| e.path()).collect())
        .unwrap_or_default();
    dumps.retain(|p| {
        let s = p.display().to_string();
        s.contains("cg.out") && std::fs::read_to_string(p).is_ok_and(|t| t.contains("phase"))
    });
    let phase_of = |p: &Path| -> Option<usize> {
        let t = std::fs::read_to_string(p).ok()?;
        let l = t.lines().find(|l| l.starts_with("desc: Trigger:"))?;
        let i = l.find("phase")?;
        l[i + 5..]
            .trim()
            .trim_end_matches(|ch: char| !ch.is_ascii_digit())
            .parse()
            .ok()
    };
    let mut per_phase: BTreeMap<usize, PathBuf> = BTreeMap::new();
    for p in dumps {
        if let Some(i) = phase_of(&p) {
            per_phase.insert(i, p);
        }
    }
    let mut ir = BTreeMap::new();
    let mut details = String::new();
    for (pi, (name, _, _)) in phases.iter().enumerate() {
        let Some(p) = per_phase.get(&pi) else {
            continue;
        };
        let Some(out) = run_out(
            "callgrind_annotate",
            &[
                "--inclusive=yes",
                "--tree=calling",
                "--threshold=100",
                &p.display().to_string(),
            ],
        ) else {
            continue;
        };
        let (tree, events, names) = parse_tree(&out);
        let total: f64 = out
            .lines()
            .find(|l| l.contains("PROGRAM TOTALS"))
            .and_then(|l| l.split_whitespace().next())
            .map(|v| v.replace(',', "").parse().unwrap_or(f64::NAN))
            .unwrap_or(f64::NAN);
        // per call, inside call(): Ir, I1 misses, D1 misses, LL data misses
        let ev = |e: &[&str]| -> f64 {
            let Some(v) = events.get("call") else {
                return f64::NAN;
            };
            let mut sum = 0.0;
            for name in e {
                match names.iter().position(|x| x == name) {
                    Some(i) if i < v.len() => sum += v[i],
                    _ => return f64::NAN,
                }
            }
            sum / n as f64
        };
        ir.insert(
            *name,
            [
                ev(&["Ir"]),
                ev(&["I1mr"]),
                ev(&["D1mr", "D1mw"]),
                ev(&["DLmr", "DLmw"]),
                total / n as f64,
            ],
        );
        if [
            "FLOCK.ACQUIRE",
            "SET NX PX",
            "FLOCK.RELEASE",
            "FLOCK.CHECK",
            "FLOCK.FENCED + SET",
        ]
        .contains(name)
        {
            details += &breakdown(name, &tree, n as f64);
        }
    }
    if std::env::var_os("FLOCK_BENCH_KEEP_CG").is_some() {
        eprintln!("  callgrind dumps kept in {}", dir.display());
    } else {
        let _ = std::fs::remove_dir_all(&dir);
    }
    if ir.is_empty() {
        rep.notes.push("callgrind produced no usable dumps.".into());
        return;
    }
    let get = |k: &str| ir.get(k).copied().unwrap_or([f64::NAN; 5]);
    let pairs = [
        ("FLOCK.ACQUIRE", "SET NX PX"),
        ("FLOCK.ACQUIRE", "Lua fenced acquire"),
        ("FLOCK.RELEASE", "Lua compare-and-delete"),
        ("FLOCK.CHECK", "GET"),
        ("FLOCK.FENCED + SET", "Lua token check + SET"),
    ];
    let mut rows = vec![];
    for (i, k) in ["ir", "i1", "d1", "ll"].iter().enumerate() {
        rep.fact(&format!("cg.{k}.acq"), get("FLOCK.ACQUIRE")[i]);
        rep.fact(&format!("cg.{k}.set"), get("SET NX PX")[i]);
    }
    for (a, b) in pairs {
        let (va, vb) = (get(a), get(b));
        rows.push(vec![
            format!("{a} vs {b}"),
            format!("{:.0} / {:.0} = {}", va[0], vb[0], x(va[0] / vb[0])),
            format!("{:.0} / {:.0}", va[1], vb[1]),
            format!("{:.1} / {:.1}", va[2], vb[2]),
            format!("{:.2} / {:.2}", va[3], vb[3]),
            format!("{:.0} / {:.0} = {}", va[4], vb[4], x(va[4] / vb[4])),
        ]);
    }
    let mut body = format!(
        "Counted by `valgrind --tool=callgrind --cache-sim=yes` on redis-server (one \
         connection, 16 commands per pipeline, {} calls per command on fresh keys, one dump per \
         command with `callgrind_control --dump`), per call, flock / baseline. Unlike time, \
         these counts do not depend on what else the machine runs. Ir: instructions inside \
         Redis's `call()`, i.e. the command itself (for the scripts: the whole script); I1, D1: \
         instruction and data cache misses of the first level; LL: data misses of the last \
         level (callgrind simulates this machine's cache sizes); whole server: all instructions \
         per call, with reading, parsing and replying. Callgrind does not see the time of clock \
         reads (vDSO) or what a cache miss costs: where a ratio of time is worse than the ratio \
         of instructions, look at the misses.\n\n",
        thousands(n)
    );
    body += &table(
        &[
            "flock vs baseline",
            "Ir in call()",
            "I1 misses",
            "D1 misses",
            "LL misses",
            "Ir, whole server",
        ],
        &rows,
    );
    body += &details;
    rep.profile = Some(body);
}

/// A function of a callgrind dump: inclusive Ir and its callees (name, inclusive Ir).
type Tree = BTreeMap<String, (f64, Vec<(String, f64)>)>;

/// Parse `callgrind_annotate --inclusive=yes --tree=calling`: blocks of `<` callers, one `*`
/// line (the function, inclusive), `>` callees. Returns the tree (Ir only) and, per function,
/// every event's inclusive count (in the order of `Events shown:`), with the event names.
fn parse_tree(out: &str) -> (Tree, BTreeMap<String, Vec<f64>>, Vec<String>) {
    let mut tree = Tree::new();
    let mut events = BTreeMap::new();
    let mut names = vec![];
    let mut current: Option<String> = None;
    for l in out.lines() {
        let t = l.trim();
        if let Some(e) = t.strip_prefix("Events shown:") {
            names = e.split_whitespace().map(str::to_string).collect();
            continue;
        }
        if t.is_empty() {
            current = None;
            continue;
        }
        // "1,234 (5.0%) 567 ( 1.2%) * file:function (2,000x) [object]"
        let mut vals = vec![];
        let mut kind = None;
        let mut rest = "";
        let mut pos = 0;
        for tok in t.split_whitespace() {
            let at = t[pos..].find(tok).map_or(pos, |i| pos + i);
            pos = at + tok.len();
            if let Ok(v) = tok.replace(',', "").parse::<f64>() {
                vals.push(v);
            } else if tok == "." {
                vals.push(0.0); // callgrind_annotate shows a zero count as "."
            } else if tok.starts_with('(') || tok.ends_with("%)") {
                continue;
            } else if matches!(tok, "*" | ">" | "<") {
                kind = tok.chars().next();
                rest = t[pos..].trim();
                break;
            } else {
                break;
            }
        }
        let (Some(kind), Some(&ir)) = (kind, vals.first()) else {
            continue;
        };
        let f = rest.split(" [").next().unwrap_or(rest);
        let f = f.split(" (").next().unwrap_or(f);
        let f = f.split_once(':').map_or(f, |r| r.1).trim().to_string();
        match kind {
            '*' => {
                tree.entry(f.clone()).or_insert((ir, vec![]));
                events.entry(f.clone()).or_insert(vals);
                current = Some(f);
            }
            '>' => {
                if let Some(cur) = &current {
                    if let Some(e) = tree.get_mut(cur) {
                        e.1.push((f, ir));
                    }
                }
            }
            _ => {}
        }
    }
    (tree, events, names)
}

/// Where one command's instructions go: from `call()` follow the callee that takes (nearly)
/// all of it down to the command's own function, then list what that one calls (and, for a
/// callee with a big share, what it calls).
fn breakdown(name: &str, tree: &Tree, calls: f64) -> String {
    let Some(&(call_ir, _)) = tree.get("call") else {
        return String::new();
    };
    let mut at = "call".to_string();
    for _ in 0..8 {
        let Some((inc, callees)) = tree.get(&at) else {
            break;
        };
        match callees.iter().max_by(|a, b| a.1.partial_cmp(&b.1).unwrap()) {
            Some((f, v)) if *v >= 0.7 * inc && tree.contains_key(f) => at = f.clone(),
            _ => break,
        }
    }
    let Some((inc, callees)) = tree.get(&at) else {
        return String::new();
    };
    let short = |f: &str| -> String {
        let f = f.replace("redis_flock::", "");
        let f = if f.len() > 70 {
            format!("{}...", &f[..70])
        } else {
            f
        };
        format!("`{}`", f.replace('|', "\\|"))
    };
    let mut rows = vec![vec![
        format!("{} (all of it)", short(&at)),
        format!("{:.0}", inc / calls),
        format!("{:.0}%", inc / call_ir * 100.0),
    ]];
    let mut listed = 0.0;
    for (f, v) in callees
        .iter()
        .filter(|(_, v)| *v >= 0.01 * call_ir)
        .take(12)
    {
        listed += v;
        rows.push(vec![
            format!("&nbsp;&nbsp;{}", short(f)),
            format!("{:.0}", v / calls),
            format!("{:.0}%", v / call_ir * 100.0),
        ]);
        if *v >= 0.2 * call_ir {
            if let Some((_, sub)) = tree.get(f) {
                for (g, w) in sub.iter().filter(|(_, w)| *w >= 0.02 * call_ir).take(5) {
                    rows.push(vec![
                        format!("&nbsp;&nbsp;&nbsp;&nbsp;↳ {}", short(g)),
                        format!("{:.0}", w / calls),
                        format!("{:.0}%", w / call_ir * 100.0),
                    ]);
                }
            }
        }
    }
    rows.push(vec![
        format!("&nbsp;&nbsp;its own code and smaller calls"),
        format!("{:.0}", (inc - listed) / calls),
        format!("{:.0}%", (inc - listed) / call_ir * 100.0),
    ]);
    format!(
        "\n**{name}**: {:.0} instructions per call in `call()`.\n\n{}",
        call_ir / calls,
        table(&["function", "Ir per call", "of call()"], &rows)
    )
}

/// Notes, from this run's numbers, on each missed target.
fn where_time_goes(rep: &Report, cfg: &Cfg) -> String {
    let mut out = String::new();
    let f = |k: &str| rep.get(k);
    if rep.missed("FLOCK.ACQUIRE / SET NX PX") {
        let _ = write!(
            out,
            "- **FLOCK.ACQUIRE vs SET NX PX** ({}): {:.2} against {:.2} usec per call (medians; \
             per-round ratios from {:.2} to {:.2}).",
            x(rep.value_of("FLOCK.ACQUIRE / SET NX PX")),
            f("s1.acq.flock"),
            f("s1.acq.set"),
            f("s1.acq_set.lo"),
            f("s1.acq_set.hi"),
        );
        if f("cg.ir.acq").is_finite() {
            let _ = write!(
                out,
                " By instructions flock is cheaper ({:.0} against {:.0}, {}), so the time goes \
                 elsewhere: per call it has {:.0} against {:.0} instruction-cache misses and \
                 {:.1} against {:.1} last-level data misses (callgrind's simulation, below).",
                f("cg.ir.acq"),
                f("cg.ir.set"),
                x(f("cg.ir.acq") / f("cg.ir.set")),
                f("cg.i1.acq"),
                f("cg.i1.set"),
                f("cg.ll.acq"),
                f("cg.ll.set"),
            );
        }
        if f("s3.flock").is_finite() {
            let _ = write!(
                out,
                " Each lock also takes {:.0} bytes against {:.0} (scenario 3): more memory to \
                 allocate and write per grant.",
                f("s3.flock"),
                f("s3.set")
            );
        }
        out += "\n";
    }
    if rep.missed("bytes per held lock, flock / SET NX PX") {
        let _ = writeln!(
            out,
            "- **Memory per held lock** ({}): {:.0} bytes of `used_memory` per lock against \
             {:.0} for `SET NX PX`. `MEMORY USAGE` reports {:.0} against {:.0} for one key, so \
             about {:.0} bytes per lock (against {:.0}) sit outside what the key's value reports: \
             the keyspace's own entry and table slots, and whatever the module keeps beside the \
             value, with allocator rounding.",
            x(rep.value_of("bytes per held lock, flock / SET NX PX")),
            f("s3.flock"),
            f("s3.set"),
            f("s3.mu.flock"),
            f("s3.mu.set"),
            f("s3.flock") - f("s3.mu.flock"),
            f("s3.set") - f("s3.mu.set"),
        );
    }
    if rep.missed("grants/s with 32 clients") {
        let _ = writeln!(
            out,
            "- **Grants per second with 32 clients** ({}): every method grants about as fast \
             as the 1 ms critical section allows ({:.0} flock, {:.0} 10 ms polling, {:.0} \
             back-off grants/s, one grant every {:.2} ms: the critical section, `sleep`'s \
             overshoot and the release). In a tight loop the polling client that releases takes the lock \
             straight back, so the lock never sits idle and no waiting strategy can be 5x \
             faster. What flock changes is who waits and for how long: p99 wait {:.1} ms \
             against {:.0} ms and {:.0} ms, Jain's fairness {:.3} against {:.3} and {:.3}; and \
             when clients work between critical sections, the polled lock does sit idle (the \
             \"32 + 10 ms work\" rows: {}).",
            x(rep.value_of("grants/s with 32 clients, flock / best polling")),
            f("s4.gps.flock"),
            f("s4.gps.poll"),
            f("s4.gps.redlock"),
            1000.0 / f("s4.gps.flock"),
            f("s4.p99.flock"),
            f("s4.p99.poll"),
            f("s4.p99.redlock"),
            f("s4.jain.flock"),
            f("s4.jain.poll"),
            f("s4.jain.redlock"),
            x(rep.value_of("grants/s with 32 + 10 ms work clients, flock / best polling")),
        );
    }
    let wmax = cfg.s5_waiters.iter().copied().max().unwrap_or(0);
    let waiter_misses: Vec<&Check> = rep
        .checks
        .iter()
        .filter(|c| c.what.contains("waiters / with") && c.pass() == Some(false))
        .collect();
    if !waiter_misses.is_empty() {
        let list: Vec<String> = waiter_misses
            .iter()
            .map(|c| format!("{} {}", c.what, x(c.value)))
            .collect();
        // does it grow with the count, or switch on with the first waiter?
        let w1 = cfg.s5_waiters.iter().copied().find(|&v| v > 0).unwrap_or(0);
        let pairs: Vec<(f64, f64)> = [
            "ACQUIRE of a free key",
            "RELEASE of a free key",
            "ACQUIRE of the waited key (nil)",
        ]
        .iter()
        .map(|l| {
            (
                rep.value_of(&format!("{l} with {} waiters / with 0", thousands(w1))),
                rep.value_of(&format!("{l} with {} waiters / with 0", thousands(wmax))),
            )
        })
        .filter(|(a, b)| a.is_finite() && b.is_finite())
        .collect();
        // "step": no ratio at the most waiters is more than 15% above the one at the fewest
        let step = !pairs.is_empty() && pairs.iter().all(|(a, b)| *b <= a * 1.15);
        let shape = if step {
            format!(
                "the growth is a step, not a slope: it is there with {} waiters and no bigger \
                 with {} (compare the rows). So it is a fixed cost per call that switches on \
                 while anybody waits on any key, not a cost that grows with the queue.",
                thousands(w1),
                thousands(wmax)
            )
        } else {
            format!(
                "the growth differs between {} and {} waiters ({}){}",
                thousands(w1),
                thousands(wmax),
                pairs
                    .iter()
                    .map(|(a, b)| format!("{} -> {}", x(*a), x(*b)))
                    .collect::<Vec<_>>()
                    .join(", "),
                if cfg.quick {
                    "; QUICK mode measures each count once, and one noisy moment can do that: \
                     check it against a full run."
                } else {
                    ": part of the cost grows with the number of waiters."
                }
            )
        };
        let _ = writeln!(out, "- **Waiters** ({}): {shape}", list.join("; "));
    }
    out
}

// ---------------------------------------------------------------------------------------------
// chart
// ---------------------------------------------------------------------------------------------

fn esc(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
}

fn svg_chart(checks: &[&Check], title: &str) -> String {
    let lo_ticks = [0.01, 0.03, 0.1, 0.3, 1.0, 3.0, 10.0, 30.0, 100.0];
    let mut vmin: f64 = 1.0;
    let mut vmax: f64 = 1.0;
    for c in checks {
        if c.value.is_finite() && c.value > 0.0 {
            vmin = vmin.min(c.value);
            vmax = vmax.max(c.value);
        }
        if let Some(g) = c.goal {
            vmin = vmin.min(g.value());
            vmax = vmax.max(g.value());
        }
    }
    let lo = lo_ticks
        .iter()
        .copied()
        .filter(|t| *t <= vmin / 1.15)
        .fold(0.01, f64::max);
    let hi = lo_ticks
        .iter()
        .copied()
        .rev()
        .filter(|t| *t >= vmax * 1.15)
        .fold(100.0, f64::min);
    let (w, left, right) = (1120.0, 420.0, 880.0);
    let row_h = 22.0;
    let head_h = 26.0;
    let mut y = 70.0;
    let mut body = String::new();
    let xpos =
        |v: f64| left + (v.clamp(lo, hi).ln() - lo.ln()) / (hi.ln() - lo.ln()) * (right - left);
    let mut last_section = "";
    for c in checks {
        if c.section != last_section {
            last_section = c.section;
            y += 6.0;
            let _ = write!(
                body,
                r##"<text x="10" y="{:.1}" font-weight="bold" font-size="13">{}</text>"##,
                y + 15.0,
                esc(c.section)
            );
            y += head_h;
        }
        let (color, mark) = match c.pass() {
            Some(true) => ("#2e7d32", " ✓"),
            Some(false) => ("#c62828", " ✗"),
            None => ("#9e9e9e", ""),
        };
        let _ = write!(
            body,
            r##"<text x="{:.1}" y="{:.1}" font-size="11.5" text-anchor="end">{}</text>"##,
            left - 8.0,
            y + 15.0,
            esc(&c.what)
        );
        if c.value.is_finite() && c.value > 0.0 {
            let (x0, x1) = (xpos(1.0), xpos(c.value));
            let (a, b) = if x0 <= x1 { (x0, x1) } else { (x1, x0) };
            let _ = write!(
                body,
                r##"<rect x="{a:.1}" y="{:.1}" width="{:.1}" height="{:.1}" fill="{color}" opacity="0.85"/>"##,
                y + 4.0,
                (b - a).max(1.5),
                row_h - 8.0
            );
        }
        if let Some(g) = c.goal {
            let gx = xpos(g.value());
            let _ = write!(
                body,
                r##"<line x1="{gx:.1}" x2="{gx:.1}" y1="{:.1}" y2="{:.1}" stroke="#000" stroke-width="2"/>"##,
                y + 1.0,
                y + row_h - 1.0
            );
        }
        let target = c
            .goal
            .map_or(String::new(), |g| format!(" (target {})", g.show()));
        let _ = write!(
            body,
            r##"<text x="{:.1}" y="{:.1}" font-size="11.5" fill="{color}">{}{}{}</text>"##,
            right + 8.0,
            y + 15.0,
            esc(&format!(
                "{} {}",
                if c.higher { "↑" } else { "↓" },
                x(c.value)
            )),
            mark,
            esc(&target)
        );
        y += row_h;
    }
    let h = y + 40.0;
    let mut s = format!(
        r##"<svg xmlns="http://www.w3.org/2000/svg" width="{w:.0}" height="{h:.0}" viewBox="0 0 {w:.0} {h:.0}" font-family="Helvetica, Arial, sans-serif">
<rect width="100%" height="100%" fill="#fff"/>
<text x="10" y="22" font-size="16" font-weight="bold">{}</text>
<text x="10" y="42" font-size="11.5" fill="#444">flock / baseline, measured in the same run, log scale. Bars start at 1x; black tick = target; ↓ lower is better, ↑ higher is better. Green: met, red: missed, grey: no target.</text>
"##,
        esc(title)
    );
    // grid
    for t in lo_ticks.iter().copied().filter(|t| *t >= lo && *t <= hi) {
        let gx = xpos(t);
        let strong = (t - 1.0).abs() < 1e-9;
        let _ = write!(
            s,
            r##"<line x1="{gx:.1}" x2="{gx:.1}" y1="56" y2="{:.1}" stroke="{}" stroke-width="{}"/>"##,
            h - 30.0,
            if strong { "#555" } else { "#ddd" },
            if strong { 1.5 } else { 1.0 }
        );
        let _ = write!(
            s,
            r##"<text x="{gx:.1}" y="{:.1}" font-size="11" text-anchor="middle" fill="#444">{}x</text>"##,
            h - 14.0,
            if t < 1.0 {
                format!("{t}")
            } else {
                format!("{t:.0}")
            }
        );
        let _ = write!(
            s,
            r##"<text x="{gx:.1}" y="66" font-size="10" text-anchor="middle" fill="#888">{}x</text>"##,
            if t < 1.0 {
                format!("{t}")
            } else {
                format!("{t:.0}")
            }
        );
    }
    s += &body;
    s += "</svg>\n";
    s
}

// ---------------------------------------------------------------------------------------------
// main
// ---------------------------------------------------------------------------------------------

fn ncpu() -> usize {
    thread::available_parallelism().map_or(1, |n| n.get())
}

fn machine() -> Vec<(String, String)> {
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

fn date_utc() -> String {
    run_out("date", &["-u", "+%Y-%m-%d %H:%M UTC"]).unwrap_or_else(|| "unknown".into())
}

/// Copy the module to a private path so a rebuild during the run changes nothing measured.
fn private_module(dir: &Path) -> PathBuf {
    let src = flock_testkit::module_path();
    let dst = dir.join("libredis_flock.so");
    std::fs::copy(&src, &dst).unwrap_or_else(|e| panic!("copy {}: {e}", src.display()));
    std::env::set_var("FLOCK_MODULE", &dst);
    src
}

fn main() {
    let cfg = Cfg::from_args();
    let started = Instant::now();
    let nofile = raise_nofile();
    let tmp = std::env::temp_dir().join(format!("flock-bench-{}", std::process::id()));
    std::fs::create_dir_all(&tmp).expect("temp dir");
    let module_src = private_module(&tmp);
    let load_before = loadavg();
    let date = date_utc();
    let server_version =
        run_out(&flock_testkit::server_binary(), &["--version"]).unwrap_or_else(|| "unknown".into());
    let commit =
        run_out("git", &["rev-parse", "--short", "HEAD"]).unwrap_or_else(|| "unknown".into());
    let dirty = run_out(
        "git",
        &[
            "status",
            "--porcelain",
            "--",
            "src",
            "Cargo.toml",
            "Cargo.lock",
        ],
    )
    .is_some_and(|s| !s.is_empty());
    eprintln!(
        "flock bench ({} mode): module {} (commit {commit}{}), {server_version}, load {load_before}",
        if cfg.quick { "QUICK" } else { "full" },
        module_src.display(),
        if dirty { ", uncommitted changes" } else { "" },
    );
    if load_before
        .split_whitespace()
        .next()
        .and_then(|v| v.parse::<f64>().ok())
        .is_some_and(|l| l > ncpu() as f64 * 0.5)
    {
        eprintln!("  note: the machine is busy (load {load_before}); the ratios hold up better than absolute numbers");
    }

    let mut rep = Report::default();
    type Scenario = fn(&Cfg, &mut Report, u64);
    let scenarios: [(u32, Scenario); 5] = [
        (1, |c, r, _| scenario1(c, r)),
        (2, |c, r, _| scenario2(c, r)),
        (3, |c, r, _| scenario3(c, r)),
        (4, |c, r, _| scenario4(c, r)),
        (5, scenario5),
    ];
    for (i, run) in scenarios {
        if cfg.runs(i) {
            let t = Instant::now();
            run(&cfg, &mut rep, nofile);
            eprintln!("  [{i}] took {:.1} s", t.elapsed().as_secs_f64());
        }
    }
    // callgrind is "scenario 6": on by default in a full run, on request (--only 6) otherwise
    if cfg
        .only
        .as_ref()
        .map_or(cfg.callgrind && !cfg.quick, |o| o.contains(&6))
    {
        callgrind(&cfg, &mut rep);
    }
    let load_after = loadavg();
    let elapsed = started.elapsed().as_secs_f64();
    let _ = std::fs::remove_dir_all(&tmp);

    // ---- summary ----
    let targets: Vec<&Check> = rep.checks.iter().filter(|c| c.goal.is_some()).collect();
    let met = targets.iter().filter(|c| c.pass() == Some(true)).count();
    let mut summary = format!("{met} of {} targets met.\n\n", targets.len());
    summary += &table(
        &["scenario", "flock / baseline", "measured", "target", ""],
        &targets
            .iter()
            .map(|c| {
                vec![
                    c.section.to_string(),
                    c.what.clone(),
                    c.shown.clone(),
                    c.target_text.clone(),
                    c.mark().into(),
                ]
            })
            .collect::<Vec<_>>(),
    );
    println!("\n## Targets\n\n{summary}");
    println!(
        "\n{} mode, {:.0} s, load average {load_before} at the start, {load_after} at the end.",
        if cfg.quick { "QUICK" } else { "full" },
        elapsed
    );

    // ---- files ----
    let _ = std::fs::create_dir_all(&cfg.out);
    let chart_checks: Vec<&Check> = rep.checks.iter().filter(|c| c.ratio).collect();
    let title = format!(
        "flock vs the usual Redis locks{} ({})",
        if cfg.quick { ", QUICK run" } else { "" },
        date
    );
    let svg = svg_chart(&chart_checks, &title);
    let svg_path = cfg.out.join("benchmarks.svg");
    std::fs::write(&svg_path, svg).expect("write benchmarks.svg");

    let mut md = String::new();
    let _ = writeln!(md, "# flock benchmarks\n");
    let _ =
        writeln!(
        md,
        "flock next to the locks people build from plain Redis today, measured by `make bench` \
         ([benches/flock.rs](../benches/flock.rs)) on {date}{}. Every number that matters here is \
         a **ratio against a baseline measured in the same run** (interleaved with it), because \
         the machine is shared and noisy: absolute numbers move from run to run, the ratios much \
         less.\n",
        if cfg.quick { " in **QUICK mode** (smaller counts, shorter runs)" } else { "" }
    );
    let _ = writeln!(md, "![flock / baseline ratios](benchmarks.svg)\n");
    let _ = writeln!(md, "## Targets\n\n{summary}");
    let _ = writeln!(md, "## Setup\n");
    let mut setup_rows = machine();
    setup_rows.push((
        "load average (1, 5, 15 min)".into(),
        format!("{load_before} at the start, {load_after} at the end"),
    ));
    setup_rows.push(("server".into(), server_version.clone()));
    setup_rows.push((
        "module".into(),
        format!(
            "`target/release/libredis_flock.so` built by `cargo build --release` from commit `{commit}`{}",
            if dirty { " plus uncommitted changes to src/" } else { "" }
        ),
    ));
    setup_rows.push((
        "run".into(),
        format!(
            "{} mode, {elapsed:.0} s",
            if cfg.quick { "QUICK" } else { "full" }
        ),
    ));
    md += &table(
        &["", ""],
        &setup_rows
            .into_iter()
            .map(|(a, b)| vec![a, b])
            .collect::<Vec<_>>(),
    );
    let _ = writeln!(
        md,
        "\nEach scenario starts its own `redis-server` on 127.0.0.1 and a free port, in a temp \
         dir, with no persistence (as the test harness does: `redis-server --port P --bind \
         127.0.0.1 --dir D --save \"\" --appendonly no --loadmodule libredis_flock.so`; the \
         contention and waiters servers add `--maxclients`, the waiters one the module argument \
         `max-waiters 1000000`). Server and clients share the machine's {} cores over \
         loopback. Nothing consumes replication, so neither flock nor `SET` builds \
         replication effects (flock's `INFO flock_replicating_effects:0`).\n",
        ncpu()
    );
    for (title, body) in &rep.sections {
        let _ = writeln!(md, "## {title}\n\n{body}");
    }
    let notes = where_time_goes(&rep, &cfg);
    if !notes.is_empty() || rep.profile.is_some() {
        let _ = writeln!(md, "## Where the time goes\n");
        if !notes.is_empty() {
            let _ = writeln!(md, "For the targets this run missed:\n\n{notes}");
            println!("\n## Where the time goes\n\n{notes}");
        }
        if let Some(p) = &rep.profile {
            let _ = writeln!(md, "{p}");
        }
    }
    let _ = writeln!(md, "## Exact commands\n");
    let _ = writeln!(
        md,
        "```sh\nmake bench            # = make build, then: cargo bench --bench flock\nQUICK=1 make bench    # = cargo bench --bench flock -- --quick (report in target/bench-quick/)\n```\n"
    );
    let _ = writeln!(md, "Options after `--`: `--quick`, `--only 1,3` (scenarios), `--out DIR`, `--no-callgrind`. `REDIS_SERVER` and `FLOCK_MODULE` work as for the tests.\n");
    let _ = writeln!(
        md,
        "The Lua baselines (loaded with `SCRIPT LOAD`, run with `EVALSHA`):\n"
    );
    let _ = writeln!(md, "```lua\n-- compare-and-delete release: EVALSHA sha 1 key owner\n{CAD}\n\n-- fenced acquire: EVALSHA sha 2 key key:tok owner ttl\n{FENCE_ACQ}\n\n-- fenced write: EVALSHA sha 2 lock:tok data:key token value\n{FENCE_WRITE}\n```\n");
    let _ = writeln!(md, "Commands per scenario (`<owner>` is a 36-byte UUID-like string, `<T>` the lock's token):\n");
    let cmds = [
        "1: `FLOCK.ACQUIRE lock:NNNNNNN <owner> 60000`, `SET lock:NNNNNNN <owner> NX PX 60000`, `EVALSHA <fenced acquire> 2 lock:NNNNNNN lock:NNNNNNN:tok <owner> 60000`, `FLOCK.RELEASE lock:NNNNNNN <owner>`, `EVALSHA <compare-and-delete> 1 lock:NNNNNNN <owner>`, `FLOCK.CHECK wlk <T>`, `GET wlk:owner`, `FLOCK.FENCED wlk <T> SET data:NNNNNNN v`, `EVALSHA <fenced write> 2 wlk:tok data:NNNNNNN <T> v`, `SET data:NNNNNNN v`",
        "2: as in 1, on `cyc:NNNNNN` (random of 100,000), acquire then release",
        "3: as in 1, 100,000 locks, then `INFO memory` `used_memory`",
        "4: `FLOCK.ACQUIRE lk <owner> 10000 BLOCK 2000` / `FLOCK.RELEASE lk <owner>`; `SET lk <owner> NX PX 10000` / `EVALSHA <compare-and-delete> 1 lk <owner>`",
        "5: preload `FLOCK.ACQUIRE h:NNNNNNN <owner> 3600000` and `SET s:NNNNNNN <owner> NX PX 3600000`; probes `FLOCK.ACQUIRE p:NNNNNNN <owner> 60000` + `FLOCK.RELEASE p:NNNNNNN <owner>` (baseline `SET ... NX PX` + compare-and-delete); waiters `FLOCK.ACQUIRE busy w<i>-<j> 3600000 BLOCK 0`; `FLOCK.ACQUIRE busy newcomer 60000`; `FLOCK.INFO busy` then `FLOCK.RELEASE busy <owner>`",
    ];
    for c in cmds {
        let _ = writeln!(md, "- {c}");
    }
    let _ = writeln!(md, "\nusec per call comes from `INFO commandstats` (`usec` / `calls`) after `CONFIG RESETSTAT`: the server's time inside the command, without reading, parsing and replying.");
    if !rep.notes.is_empty() {
        let _ = writeln!(md, "\n## Notes\n");
        for n in &rep.notes {
            let _ = writeln!(md, "- {n}");
        }
    }
    let md_path = cfg.out.join("BENCHMARKS.md");
    std::fs::write(&md_path, md).expect("write BENCHMARKS.md");
    for n in &rep.notes {
        println!("note: {n}");
    }
    println!("wrote {} and {}", md_path.display(), svg_path.display());
}
