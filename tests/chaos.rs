//! The history checker: many clients on real connections against a master and a replica (AOF,
//! `appendfsync always`), with faults injected, every operation recorded, and the history
//! checked against the guarantees of SPEC.md at the end.
//!
//! Clients take random leases (plain and BLOCK), write through FLOCK.FENCED into a per-key log,
//! check, renew, repeat ACQUIRE, try to release and renew as impostors, stall past their lease
//! and write anyway, release or abandon. Some waiters hang up while they wait. An operator
//! REVOKEs and DELs lock keys at random. A fault injector stalls the server (DEBUG SLEEP),
//! rewrites the AOF, changes the lock-delay, kills the master with SIGKILL and restarts it
//! from its AOF, and kills the master and promotes the replica.
//!
//! Checked (each violation is printed and fails the test):
//! - G1: no two grants of a key are live at one moment (a grant is live throughout the span
//!   between two of its proofs; no other grant of the key may prove itself inside that span),
//!   and the FENCED log of each key never goes back in token order.
//! - G2: an owner that never held the key cannot release or renew it.
//! - G3: no token is issued twice; a grant acknowledged before another was asked for has the
//!   smaller token (across restarts and failovers too).
//! - G4: the holder repeating ACQUIRE gets its token back while its lease runs.
//! - G5: a refused FENCED write never shows up in the log; a write after the holder's own
//!   release is refused.
//! - G9: no grant proves itself after its lease ran out (last extension acknowledged + ttl),
//!   and no lease ends early while nobody revoked or deleted it.
//! - durability: every grant and every FENCED write acknowledged before a SIGKILL is there
//!   after the restart (AOF, fsync always). Grants and writes lost to an (asynchronous)
//!   failover are counted, not failed.
//! - G6: every waiter ends with a grant, a timeout (not early) or an error.
//! - G7: master and replica have the same DEBUG DIGEST once the replica caught up.
//! - G8, G10: no crash or panic in any server log; at the end no lock key, no waiter is left.
//!
//! Environment: FLOCK_CHAOS_SECS (default 20), FLOCK_CHAOS_CLIENTS (8), FLOCK_CHAOS_KEYS (4),
//! FLOCK_CHAOS_SEED, FLOCK_CHAOS_REPORT (append a Markdown table row to this file),
//! REDIS_SERVER (the server binary, e.g. valkey-server).

use flock_testkit::*;
use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicBool, AtomicU16, AtomicU64, AtomicUsize, Ordering::SeqCst};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::sleep;
use std::time::{Duration, Instant};

fn env_num(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(default)
}

/// Slack for comparing the client's clock with the server's lease deadlines (deadlines that
/// travel through the AOF or replication are rounded to milliseconds).
const EPS_US: u64 = 5_000;

// ---------------------------------------------------------------------------------------------
// the history
// ---------------------------------------------------------------------------------------------

#[derive(Debug, Clone)]
struct GrantRec {
    key: usize,
    owner: String,
    token: i64,
    ttl_us: u64,
    send: u64,
    ack: u64,
    /// Send time of the last acknowledged extension (the grant itself, a RENEW, a repeated
    /// ACQUIRE): the lease runs at least until this + ttl.
    lower: u64,
    /// Latest time an extension may have happened (acknowledged or unknown outcome): the lease
    /// has ended by this + ttl.
    upper: u64,
    /// Moments the grant was live on the server: some instant inside each (send, ack).
    proofs: Vec<(u64, u64)>,
    /// Observations that the lease had ended: (send, ack, failover epoch, lower at that time).
    ends: Vec<(u64, u64, u64, u64)>,
    /// The holder released it (acknowledged 1) at this time.
    released: Option<u64>,
    /// An operation on it had an unknown outcome (the connection failed).
    unsure: bool,
    /// Latest send time of a RELEASE, RENEW or repeated ACQUIRE by its holder.
    touched: u64,
    failover_epoch: u64,
    lost_in_failover: bool,
}

#[derive(Debug, Clone, Copy, PartialEq)]
enum Outcome {
    Accepted,
    Refused,
    Unknown,
}

#[derive(Debug, Clone)]
struct WriteRec {
    key: usize,
    token: i64,
    tag: String,
    send: u64,
    ack: u64,
    outcome: Outcome,
    lost_in_failover: bool,
}

#[derive(Debug, Clone)]
struct OperatorOp {
    key: usize,
    send: u64,
    /// The reply time, or the time the connection failed (the effect came no later).
    done: u64,
}

#[derive(Default)]
struct History {
    grants: Vec<GrantRec>,
    writes: Vec<WriteRec>,
    operator: Vec<OperatorOp>,
    violations: Vec<String>,
    ops: BTreeMap<&'static str, u64>,
    faults: BTreeMap<&'static str, u64>,
    checks: BTreeMap<&'static str, u64>,
    waits: BTreeMap<&'static str, u64>,
    /// Do not print violations as they are found (the checker's own tests).
    quiet: bool,
}

impl History {
    fn op(&mut self, name: &'static str) {
        *self.ops.entry(name).or_default() += 1;
    }
    fn violation(&mut self, v: String) {
        if !self.quiet {
            eprintln!("VIOLATION: {v}");
        }
        self.violations.push(v);
    }
}

/// Pauses clients and the operator at their next step (for a restart's verification).
struct Gate {
    paused: Mutex<bool>,
    cv: Condvar,
    parked: AtomicUsize,
}

impl Gate {
    fn checkpoint(&self) {
        let mut p = self.paused.lock().unwrap();
        if *p {
            self.parked.fetch_add(1, SeqCst);
            while *p {
                p = self.cv.wait(p).unwrap();
            }
            self.parked.fetch_sub(1, SeqCst);
        }
    }
    fn pause(&self) {
        *self.paused.lock().unwrap() = true;
    }
    fn resume(&self) {
        *self.paused.lock().unwrap() = false;
        self.cv.notify_all();
    }
}

struct Shared {
    t0: Instant,
    port: AtomicU16,
    stop: AtomicBool,
    gate: Gate,
    hist: Mutex<History>,
    failover_epoch: AtomicU64,
    keys: usize,
    workers: usize,
}

impl Shared {
    fn now(&self) -> u64 {
        self.t0.elapsed().as_micros() as u64
    }
    fn hist(&self) -> std::sync::MutexGuard<'_, History> {
        self.hist.lock().unwrap_or_else(|e| e.into_inner())
    }
    fn lock_key(&self, k: usize) -> String {
        format!("{{chaos{k}}}:lock")
    }
    fn log_key(&self, k: usize) -> String {
        format!("{{chaos{k}}}:log")
    }
    fn epoch(&self) -> u64 {
        self.failover_epoch.load(SeqCst)
    }
}

// ---------------------------------------------------------------------------------------------
// clients
// ---------------------------------------------------------------------------------------------

struct Client {
    id: usize,
    sh: Arc<Shared>,
    rng: Rng,
    conn: Option<RawConn>,
    n: u64,
    seq: u64,
}

enum Call {
    Reply(Reply),
    /// The connection failed (server killed, read timeout): the outcome is unknown.
    Lost(String),
}

impl Client {
    fn connect(&mut self) -> bool {
        if self.conn.is_some() {
            return true;
        }
        match RawConn::connect(self.sh.port.load(SeqCst)) {
            Ok(c) => {
                self.conn = Some(c);
                true
            }
            Err(_) => {
                sleep(Duration::from_millis(20));
                false
            }
        }
    }

    fn call(&mut self, args: &[String], timeout: Duration) -> Call {
        let Some(c) = self.conn.as_mut() else {
            return Call::Lost("not connected".into());
        };
        let _ = c.set_read_timeout(timeout);
        match c.call(args) {
            Ok(Reply::Err(e)) if e.starts_with("LOADING") || e.starts_with("READONLY") => {
                // Not a master (yet): go find the current one.
                self.conn = None;
                Call::Reply(Reply::Err(e))
            }
            Ok(r) => Call::Reply(r),
            Err(e) => {
                self.conn = None;
                Call::Lost(e.to_string())
            }
        }
    }

    fn run(&mut self) {
        while !self.sh.stop.load(SeqCst) {
            self.sh.gate.checkpoint();
            if !self.connect() {
                continue;
            }
            self.one_round();
        }
    }

    fn one_round(&mut self) {
        let sh = self.sh.clone();
        let k = self.rng.below(sh.keys as u64) as usize;
        let key = sh.lock_key(k);
        self.n += 1;
        let owner = format!("c{}-{}", self.id, self.n);
        let ttl_ms = self.rng.pick(&[40u64, 100, 100, 250, 600, 1500, 4000]);
        let mode = self.rng.below(100);
        let mut args = vec![
            "FLOCK.ACQUIRE".to_string(),
            key.clone(),
            owner.clone(),
            ttl_ms.to_string(),
        ];
        if mode >= 95 {
            return self.hang_up_while_waiting(args);
        }
        let block = if mode >= 60 {
            let t = self.rng.pick(&[0u64, 30, 150, 150, 600, 2000]);
            args.push("BLOCK".into());
            args.push(t.to_string());
            Some(t)
        } else {
            None
        };
        // A waiter must end with a grant, a timeout or an error: 10 s past its timeout (or
        // 120 s for BLOCK 0) without an answer is a hung waiter.
        let limit = match block {
            Some(0) => Duration::from_secs(120),
            Some(t) => Duration::from_millis(t + 10_000),
            None => Duration::from_secs(20),
        };
        let epoch = sh.epoch();
        let send = sh.now();
        let r = self.call(&args, limit);
        let ack = sh.now();
        sh.hist().op(if block.is_some() {
            "acquire block"
        } else {
            "acquire"
        });
        match r {
            Call::Reply(Reply::Int(token)) => {
                if block.is_some() {
                    *sh.hist().waits.entry("granted").or_default() += 1;
                }
                let g = self.new_grant(k, &owner, token, ttl_ms, send, ack, epoch);
                self.hold(g);
            }
            Call::Reply(Reply::Nil) => {
                if let Some(t) = block {
                    let waited = (ack - send) / 1000;
                    let mut h = sh.hist();
                    *h.waits.entry("timed out").or_default() += 1;
                    if t == 0 {
                        h.violation(format!("{args:?}: BLOCK 0 answered nil after {waited} ms"));
                    } else if waited + 2 < t {
                        h.violation(format!(
                            "{args:?}: timed out after {waited} ms, before its {t} ms (G6)"
                        ));
                    }
                }
            }
            Call::Reply(Reply::Err(e)) => {
                let mut h = sh.hist();
                h.op("error reply");
                if block.is_some() {
                    *h.waits.entry("error").or_default() += 1;
                }
                if !(e.starts_with("LOADING") || e.starts_with("READONLY")) {
                    h.violation(format!("{args:?}: unexpected error {e}"));
                }
            }
            Call::Reply(other) => sh
                .hist()
                .violation(format!("{args:?}: unexpected reply {other:?}")),
            Call::Lost(e) => {
                let mut h = sh.hist();
                h.op("connection lost");
                if block.is_some() {
                    *h.waits.entry("connection lost").or_default() += 1;
                }
                if e.contains("timed out") || e.contains("WouldBlock") || e.contains("temporarily")
                {
                    h.violation(format!(
                        "{args:?}: no answer within {limit:?} (a hung waiter, G6)"
                    ));
                }
            }
        }
    }

    /// A waiter that disconnects while it waits (or just as it is granted): the server must
    /// drop it from the queue or release the grant again.
    fn hang_up_while_waiting(&mut self, mut args: Vec<String>) {
        args.push("BLOCK".into());
        args.push("0".into());
        let pause = self.rng.below(300);
        if let Some(mut c) = self.conn.take() {
            if c.send(&args).is_ok() {
                sleep(Duration::from_millis(pause));
            }
            drop(c);
        }
        self.sh.hist().op("waiter hung up");
    }

    #[allow(clippy::too_many_arguments)]
    fn new_grant(
        &mut self,
        k: usize,
        owner: &str,
        token: i64,
        ttl_ms: u64,
        send: u64,
        ack: u64,
        epoch: u64,
    ) -> usize {
        let mut h = self.sh.hist();
        if token <= 0 || token >= TWO_POW_53 {
            h.violation(format!("token {token} out of range"));
        }
        h.grants.push(GrantRec {
            key: k,
            owner: owner.to_string(),
            token,
            ttl_us: ttl_ms * 1000,
            send,
            ack,
            lower: send,
            upper: ack,
            proofs: vec![(send, ack)],
            ends: Vec::new(),
            released: None,
            unsure: false,
            touched: send,
            failover_epoch: epoch,
            lost_in_failover: false,
        });
        h.grants.len() - 1
    }

    /// A proof that grant `g` was live at some instant in (send, ack): it must not come after
    /// the lease ran out (G9).
    fn proof(&self, g: usize, send: u64, ack: u64, what: &str) {
        let mut h = self.sh.hist();
        let rec = &mut h.grants[g];
        rec.proofs.push((send, ack));
        let deadline = rec.upper + rec.ttl_us;
        if send > deadline + EPS_US {
            let (tok, late) = (rec.token, (send - deadline) / 1000);
            h.violation(format!(
                "{what} with token {tok} accepted {late} ms after its lease ran out (G9/G5)"
            ));
        }
    }

    fn ended(&self, g: usize, send: u64, ack: u64) {
        let epoch = self.sh.epoch();
        let mut h = self.sh.hist();
        let lower = h.grants[g].lower;
        h.grants[g].ends.push((send, ack, epoch, lower));
    }

    fn hold(&mut self, mut g: usize) {
        let sh = self.sh.clone();
        let (k, owner, ttl_ms) = {
            let h = sh.hist();
            (
                h.grants[g].key,
                h.grants[g].owner.clone(),
                h.grants[g].ttl_us / 1000,
            )
        };
        let key = sh.lock_key(k);
        let log = sh.log_key(k);
        let steps = 1 + self.rng.below(8);
        let timeout = Duration::from_secs(20);
        for _ in 0..steps {
            if sh.stop.load(SeqCst) {
                break;
            }
            sh.gate.checkpoint();
            if !self.connect() {
                return;
            }
            let token = sh.hist().grants[g].token;
            let what = self.rng.below(100);
            match what {
                // a fenced write, now and then after stalling past the lease
                0..=44 | 95..=99 => {
                    if what >= 95 {
                        let nap = ttl_ms + 20 + self.rng.below(300);
                        sleep(Duration::from_millis(nap));
                        sh.hist().op("stall past the lease");
                        sh.gate.checkpoint();
                        if !self.connect() {
                            return;
                        }
                    }
                    if !self.fenced_write(g, k, token, &key, &log).0 {
                        return;
                    }
                }
                45..=59 => {
                    let send = sh.now();
                    let r = self.call(
                        &["FLOCK.CHECK".into(), key.clone(), token.to_string()],
                        timeout,
                    );
                    let ack = sh.now();
                    sh.hist().op("check");
                    match r {
                        Call::Reply(Reply::Int(ms)) if ms > 0 => {
                            self.proof(g, send, ack, "CHECK");
                            if ms as u64 > ttl_ms {
                                sh.hist().violation(format!(
                                    "CHECK {key} {token}: {ms} ms left of a {ttl_ms} ms lease"
                                ));
                            }
                        }
                        Call::Reply(Reply::Int(0)) => {
                            self.ended(g, send, ack);
                            return;
                        }
                        Call::Reply(Reply::Err(_)) | Call::Lost(_) => return,
                        Call::Reply(r) => {
                            sh.hist()
                                .violation(format!("CHECK: unexpected reply {r:?}"));
                            return;
                        }
                    }
                }
                60..=74 => {
                    let send = sh.now();
                    sh.hist().grants[g].touched = send;
                    let r = self.call(
                        &[
                            "FLOCK.RENEW".into(),
                            key.clone(),
                            owner.clone(),
                            ttl_ms.to_string(),
                        ],
                        timeout,
                    );
                    let ack = sh.now();
                    sh.hist().op("renew");
                    match r {
                        Call::Reply(Reply::Int(t)) if t == token => {
                            self.proof(g, send, ack, "RENEW");
                            let mut h = sh.hist();
                            h.grants[g].lower = send;
                            h.grants[g].upper = ack;
                        }
                        Call::Reply(Reply::Nil) => {
                            self.ended(g, send, ack);
                            return;
                        }
                        Call::Lost(_) => {
                            let mut h = sh.hist();
                            h.grants[g].upper = ack;
                            h.grants[g].unsure = true;
                            return;
                        }
                        Call::Reply(Reply::Err(_)) => return,
                        Call::Reply(r) => {
                            sh.hist().violation(format!(
                                "RENEW {key} {owner}: {r:?}, expected {token} or nil"
                            ));
                            return;
                        }
                    }
                }
                // the holder repeats its ACQUIRE (G4)
                75..=79 => {
                    let epoch = sh.epoch();
                    let send = sh.now();
                    sh.hist().grants[g].touched = send;
                    let r = self.call(
                        &[
                            "FLOCK.ACQUIRE".into(),
                            key.clone(),
                            owner.clone(),
                            ttl_ms.to_string(),
                        ],
                        timeout,
                    );
                    let ack = sh.now();
                    sh.hist().op("repeat acquire");
                    match r {
                        Call::Reply(Reply::Int(t)) if t == token => {
                            self.proof(g, send, ack, "repeated ACQUIRE");
                            let mut h = sh.hist();
                            h.grants[g].lower = send;
                            h.grants[g].upper = ack;
                        }
                        Call::Reply(Reply::Int(t)) => {
                            // The old lease had ended: a new grant, for the same owner.
                            self.ended(g, send, ack);
                            g = self.new_grant(k, &owner, t, ttl_ms, send, ack, epoch);
                        }
                        Call::Reply(Reply::Nil) => {
                            self.ended(g, send, ack);
                            return;
                        }
                        Call::Lost(_) => {
                            let mut h = sh.hist();
                            h.grants[g].upper = ack;
                            h.grants[g].unsure = true;
                            return;
                        }
                        Call::Reply(Reply::Err(_)) => return,
                        Call::Reply(r) => {
                            sh.hist()
                                .violation(format!("repeated ACQUIRE: unexpected reply {r:?}"));
                            return;
                        }
                    }
                }
                // an impostor tries to release and renew (G2)
                80..=84 => {
                    let imp = format!("impostor-{}-{}", self.id, self.n);
                    let r1 =
                        self.call(&["FLOCK.RELEASE".into(), key.clone(), imp.clone()], timeout);
                    let r2 = self.call(
                        &["FLOCK.RENEW".into(), key.clone(), imp, "60000".into()],
                        timeout,
                    );
                    let mut h = sh.hist();
                    h.op("impostor release+renew");
                    if let Call::Reply(r) = &r1 {
                        if *r != Reply::Int(0) && !r.is_err() {
                            h.violation(format!("impostor RELEASE of {key}: {r:?} (G2)"));
                        }
                    }
                    if let Call::Reply(r) = &r2 {
                        if !r.is_nil() && !r.is_err() {
                            h.violation(format!("impostor RENEW of {key}: {r:?} (G2)"));
                        }
                    }
                }
                _ => {
                    let nap = self.rng.below(ttl_ms / 2 + 1);
                    sleep(Duration::from_millis(nap));
                }
            }
        }
        if sh.stop.load(SeqCst) || !self.connect() {
            return;
        }
        // Release, or abandon a short lease to its expiry.
        if ttl_ms <= 1500 && self.rng.chance(25) {
            sh.hist().op("abandon");
            return;
        }
        sh.gate.checkpoint();
        if !self.connect() {
            return;
        }
        let token = sh.hist().grants[g].token;
        let release_epoch = sh.epoch();
        let send = sh.now();
        sh.hist().grants[g].touched = send;
        let r = self.call(
            &["FLOCK.RELEASE".into(), key.clone(), owner.clone()],
            timeout,
        );
        let ack = sh.now();
        sh.hist().op("release");
        match r {
            Call::Reply(Reply::Int(1)) => {
                self.proof(g, send, ack, "RELEASE");
                sh.hist().grants[g].released = Some(ack);
            }
            Call::Reply(Reply::Int(0)) => {
                self.ended(g, send, ack);
                return;
            }
            Call::Lost(_) => {
                sh.hist().grants[g].unsure = true;
                return;
            }
            Call::Reply(Reply::Err(_)) => return,
            Call::Reply(r) => {
                sh.hist()
                    .violation(format!("RELEASE {key} {owner}: unexpected reply {r:?}"));
                return;
            }
        }
        // A late write with the released token must be refused (G5), unless a failover since
        // lost the release.
        if self.rng.chance(30) {
            let released_at = ack;
            let (_, outcome, send, ack) = self.fenced_write(g, k, token, &key, &log);
            let mut h = sh.hist();
            h.op("write after release");
            if outcome == Outcome::Accepted && sh.epoch() == release_epoch {
                h.violation(format!(
                    "FENCED with token {token} on {key} accepted at {:.3}s..{:.3}s, after its \
                     holder's release was acknowledged at {:.3}s (G5)",
                    send as f64 / 1e6,
                    ack as f64 / 1e6,
                    released_at as f64 / 1e6
                ));
            }
        }
    }

    /// FLOCK.FENCED key token RPUSH log tag: (accepted, outcome, send, ack); not accepted also
    /// when the connection failed.
    fn fenced_write(
        &mut self,
        g: usize,
        k: usize,
        token: i64,
        key: &str,
        log: &str,
    ) -> (bool, Outcome, u64, u64) {
        let sh = self.sh.clone();
        self.seq += 1;
        let tag = format!("{token}:{}:{}", self.id, self.seq);
        let send = sh.now();
        let r = self.call(
            &[
                "FLOCK.FENCED".into(),
                key.to_string(),
                token.to_string(),
                "RPUSH".into(),
                log.to_string(),
                tag.clone(),
            ],
            Duration::from_secs(20),
        );
        let ack = sh.now();
        let (outcome, ok) = match &r {
            Call::Reply(Reply::Int(_)) => (Outcome::Accepted, true),
            Call::Reply(Reply::Err(e)) if e.starts_with("FENCED") => (Outcome::Refused, true),
            Call::Reply(Reply::Err(_)) => (Outcome::Refused, false),
            Call::Reply(other) => {
                sh.hist()
                    .violation(format!("FENCED RPUSH: unexpected reply {other:?}"));
                (Outcome::Unknown, false)
            }
            Call::Lost(_) => (Outcome::Unknown, false),
        };
        {
            let mut h = sh.hist();
            h.op(match outcome {
                Outcome::Accepted => "fenced write accepted",
                Outcome::Refused => "fenced write refused",
                Outcome::Unknown => "fenced write unknown",
            });
            h.writes.push(WriteRec {
                key: k,
                token,
                tag,
                send,
                ack,
                outcome,
                lost_in_failover: false,
            });
        }
        match outcome {
            Outcome::Accepted => self.proof(g, send, ack, "FENCED write"),
            Outcome::Refused if ok => self.ended(g, send, ack),
            _ => {}
        }
        (ok && outcome == Outcome::Accepted, outcome, send, ack)
    }
}

fn operator(sh: Arc<Shared>, seed: u64) {
    let mut rng = Rng::new(seed);
    let mut conn: Option<RawConn> = None;
    while !sh.stop.load(SeqCst) {
        sleep(Duration::from_millis(100 + rng.below(600)));
        sh.gate.checkpoint();
        if conn.is_none() {
            conn = RawConn::connect(sh.port.load(SeqCst)).ok();
        }
        let Some(c) = conn.as_mut() else { continue };
        let k = rng.below(sh.keys as u64) as usize;
        let key = sh.lock_key(k);
        let revoke = rng.chance(70);
        let send = sh.now();
        let r = if revoke {
            c.call(&["FLOCK.REVOKE", &key])
        } else {
            c.call(&["DEL", &key])
        };
        let done = sh.now();
        let mut h = sh.hist();
        h.op(if revoke {
            "operator REVOKE"
        } else {
            "operator DEL"
        });
        h.operator.push(OperatorOp { key: k, send, done });
        match r {
            Ok(Reply::Int(_)) => {}
            Ok(Reply::Err(e)) if e.starts_with("LOADING") || e.starts_with("READONLY") => {
                conn = None
            }
            Ok(other) => h.violation(format!("operator on {key}: unexpected reply {other:?}")),
            Err(_) => conn = None,
        }
    }
}

// ---------------------------------------------------------------------------------------------
// faults
// ---------------------------------------------------------------------------------------------

fn aof_server() -> Server {
    Server::builder()
        .arg("appendonly", "yes")
        .arg("appendfsync", "always")
        .start()
}

fn raw_call(port: u16, args: &[&str]) -> Result<Reply, String> {
    let mut c = RawConn::connect(port).map_err(|e| e.to_string())?;
    c.set_read_timeout(Duration::from_secs(30))
        .map_err(|e| e.to_string())?;
    c.call(args).map_err(|e| e.to_string())
}

fn info_of(port: u16, section: &str, field: &str) -> Option<String> {
    info_field(&mut RawConn::connect(port).ok()?, section, field)
}

fn replica_linked(replica: &Server, master: &Server) -> bool {
    info_of(replica.port(), "replication", "master_link_status").as_deref() == Some("up")
        && info_of(master.port(), "replication", "connected_slaves")
            .and_then(|v| v.parse::<i64>().ok())
            .unwrap_or(0)
            >= 1
}

struct Injector {
    sh: Arc<Shared>,
    servers: Vec<Server>,
    master: usize,
    rng: Rng,
}

impl Injector {
    fn master_port(&self) -> u16 {
        self.servers[self.master].port()
    }

    fn replica(&self) -> usize {
        1 - self.master
    }

    fn fault(&self, name: &'static str) {
        *self.sh.hist().faults.entry(name).or_default() += 1;
        eprintln!(
            "[{:>7.2}s] fault: {name}",
            self.sh.t0.elapsed().as_secs_f64()
        );
    }

    fn check(&self, name: &'static str, n: u64) {
        *self.sh.hist().checks.entry(name).or_default() += n;
    }

    fn set_lock_delay(&self, ms: u64) {
        for s in &self.servers {
            let _ = raw_call(
                s.port(),
                &["CONFIG", "SET", "flock.lock-delay-ms", &ms.to_string()],
            );
        }
    }

    /// Pause clients and operator; wait until all of them have parked.
    fn pause_all(&self) {
        self.sh.gate.pause();
        let ok = poll_until(Duration::from_secs(60), || {
            self.sh.gate.parked.load(SeqCst) >= self.sh.workers
        });
        if !ok {
            self.sh.hist().violation(format!(
                "only {} of {} workers paused within 60 s (a client is stuck)",
                self.sh.gate.parked.load(SeqCst),
                self.sh.workers
            ));
        }
    }

    fn attach_replica(&mut self) {
        let r = self.replica();
        let mport = self.master_port().to_string();
        let _ = raw_call(self.servers[r].port(), &["REPLICAOF", "127.0.0.1", &mport]);
        let (m, rr) = (&self.servers[self.master], &self.servers[r]);
        if !poll_until(Duration::from_secs(30), || replica_linked(rr, m)) {
            self.sh
                .hist()
                .violation("the replica did not link up within 30 s".into());
        }
    }

    /// G7: once the replica has caught up, master and replica hold the same data.
    fn compare_digests(&self) {
        let (m, r) = (self.master_port(), self.servers[self.replica()].port());
        if !replica_linked(&self.servers[self.replica()], &self.servers[self.master]) {
            return;
        }
        for _ in 0..40 {
            let _ = raw_call(m, &["WAIT", "1", "1000"]);
            let d1 = raw_call(m, &["DEBUG", "DIGEST"]);
            let dr = raw_call(r, &["DEBUG", "DIGEST"]);
            let d2 = raw_call(m, &["DEBUG", "DIGEST"]);
            if d1.is_ok() && d1 == d2 && d1 == dr {
                self.check("G7 master/replica digests equal", 1);
                return;
            }
            sleep(Duration::from_millis(50));
        }
        self.sh
            .hist()
            .violation("master and replica digests still differ after 40 tries (G7)".into());
    }

    /// Grants that must be live now: acknowledged before `cut`, not ended, released, revoked,
    /// deleted or replaced since, and whose lease runs at least another 100 ms.
    fn expected_live(&self, h: &History, cut: u64, now: u64) -> Vec<usize> {
        let mut out = Vec::new();
        for (i, g) in h.grants.iter().enumerate() {
            if g.ack >= cut
                || g.touched >= cut
                || g.released.is_some()
                || g.unsure
                || g.lost_in_failover
                || !g.ends.is_empty()
                || g.lower + g.ttl_us < now + 100_000
            {
                continue;
            }
            let touched = h.operator.iter().any(|o| o.key == g.key && o.done > g.send);
            let replaced = h
                .grants
                .iter()
                .any(|o| o.key == g.key && o.token != g.token && o.ack > g.send);
            if !touched && !replaced {
                out.push(i);
            }
        }
        out
    }

    /// What the server holds right after a restart or a promotion, before any client is let
    /// back in: each lock key's holder and each key's log.
    fn snapshot(&self) -> Option<Snapshot> {
        let port = self.master_port();
        let mut c = match RawConn::connect(port) {
            Ok(c) => c,
            Err(e) => {
                self.sh
                    .hist()
                    .violation(format!("cannot connect after restart: {e}"));
                return None;
            }
        };
        let at = self.sh.now();
        let mut holders = HashMap::new();
        let mut logs = HashMap::new();
        for k in 0..self.sh.keys {
            let r = c.call(&["FLOCK.INFO", &self.sh.lock_key(k)]);
            holders.insert(k, r.ok().and_then(|r| parse_info_opt(&r)));
            let r = c.call(&["LRANGE", &self.sh.log_key(k), "0", "-1"]);
            let set: std::collections::HashSet<String> = r
                .ok()
                .and_then(|r| {
                    r.array()
                        .map(|a| a.iter().filter_map(Reply::string).collect())
                })
                .unwrap_or_default();
            logs.insert(k, set);
        }
        Some(Snapshot { at, holders, logs })
    }

    /// After a SIGKILL and restart (`lossless`) or a failover: every acknowledged grant still
    /// live and every acknowledged write must be in the snapshot; after a failover missing
    /// ones are counted as lost. Called once every client has paused, so that the history
    /// is complete up to the snapshot.
    fn verify_survivors(&self, snap: &Snapshot, cut: u64, lossless: bool) {
        let mut h = self.sh.hist();
        let live = self.expected_live(&h, cut, snap.at);
        let (mut kept, mut lost) = (0u64, 0u64);
        for i in live {
            let g = h.grants[i].clone();
            let info = &snap.holders[&g.key];
            let same = info
                .as_ref()
                .is_some_and(|(o, t)| o.as_deref() == Some(g.owner.as_bytes()) && *t == g.token);
            if same {
                kept += 1;
            } else if lossless {
                h.violation(format!(
                    "acknowledged grant {} of {} (owner {}) lost across kill -9 with \
                     appendfsync always; the server shows {info:?}",
                    g.token,
                    self.sh.lock_key(g.key),
                    g.owner
                ));
            } else {
                lost += 1;
                h.grants[i].lost_in_failover = true;
            }
        }
        let (mut w_kept, mut w_lost) = (0u64, 0u64);
        for w in h.writes.iter_mut() {
            if w.outcome != Outcome::Accepted || w.ack >= cut || w.lost_in_failover {
                continue;
            }
            if snap.logs[&w.key].contains(&w.tag) {
                w_kept += 1;
            } else {
                w_lost += 1;
                if !lossless {
                    w.lost_in_failover = true;
                }
            }
        }
        let what = if lossless { "restart" } else { "failover" };
        if lossless && w_lost > 0 {
            h.violation(format!(
                "{w_lost} acknowledged FENCED writes lost across kill -9 with appendfsync always"
            ));
        }
        let entries: [(&'static str, u64); 3] = if lossless {
            [
                ("acknowledged live grants present after kill -9", kept),
                ("acknowledged writes present after kill -9", w_kept),
                ("", 0),
            ]
        } else {
            [
                ("acknowledged live grants present after failover", kept),
                ("acknowledged writes present after failover", w_kept),
                ("acknowledged grants lost in failover (allowed)", lost),
            ]
        };
        for (name, n) in entries {
            if !name.is_empty() {
                *h.checks.entry(name).or_default() += n;
            }
        }
        if !lossless {
            *h.checks
                .entry("acknowledged writes lost in failover (allowed)")
                .or_default() += w_lost;
        }
        eprintln!(
            "          {what}: {kept} live grants kept, {lost} lost; {w_kept} writes kept, {w_lost} lost"
        );
    }

    fn kill_and_restart(&mut self) {
        self.fault("kill -9 master, restart from AOF");
        let cut = self.sh.now();
        let m = self.master;
        self.servers[m].stop();
        self.sh.gate.pause();
        self.servers[m].start_again();
        let snap = self.snapshot();
        self.pause_all();
        if let Some(snap) = snap {
            self.verify_survivors(&snap, cut, true);
        }
        self.sh.gate.resume();
        let (mm, r) = (&self.servers[self.master], &self.servers[self.replica()]);
        if !poll_until(Duration::from_secs(30), || replica_linked(r, mm)) {
            self.sh
                .hist()
                .violation("replica did not re-link after the master restarted".into());
        }
    }

    /// Kill the master and promote the replica. With `lagging`, the replica is first cut off
    /// (SIGSTOP, then the master drops its link) while clients go on, so that it misses grants
    /// and writes: those are lost, and what G3 promises for lost grants is put to the test.
    fn failover(&mut self, lagging: bool) {
        let r = self.replica();
        if !replica_linked(&self.servers[r], &self.servers[self.master]) {
            return;
        }
        self.compare_digests();
        if lagging {
            self.fault("kill -9 master, promote a replica that missed writes");
            self.servers[r].signal("STOP");
            let _ = raw_call(self.master_port(), &["CLIENT", "KILL", "TYPE", "replica"]);
            sleep(Duration::from_millis(300 + self.rng.below(700)));
        } else {
            self.fault("kill -9 master, promote replica");
        }
        let cut = self.sh.now();
        let old = self.master;
        self.servers[old].stop();
        self.sh.gate.pause();
        if lagging {
            self.servers[r].signal("CONT");
        }
        let rp = self.servers[r].port();
        let _ = raw_call(rp, &["REPLICAOF", "NO", "ONE"]);
        let promoted = poll_until(Duration::from_secs(10), || {
            info_of(rp, "replication", "role").as_deref() == Some("master")
        });
        if !promoted {
            self.sh
                .hist()
                .violation("replica did not become master".into());
        }
        self.master = r;
        self.sh.port.store(rp, SeqCst);
        self.sh.failover_epoch.fetch_add(1, SeqCst);
        let snap = self.snapshot();
        self.pause_all();
        if let Some(snap) = snap {
            self.verify_survivors(&snap, cut, false);
        }
        self.sh.gate.resume();
        // The old master comes back from its own AOF and follows the new one.
        self.servers[old].start_again();
        self.attach_replica();
    }

    fn run(&mut self, until: Instant) {
        let plan: &[&str] = &[
            "sleep",
            "rewrite",
            "kill",
            "digest",
            "sleep",
            "failover",
            "delay",
            "sleep",
            "kill",
            "lagging failover",
            "digest",
        ];
        let mut i = self.rng.below(plan.len() as u64) as usize;
        let start = Instant::now();
        let half = (until - start) / 2;
        let mut killed = false;
        while Instant::now() < until {
            sleep(Duration::from_millis(700 + self.rng.below(1300)));
            if Instant::now() >= until {
                break;
            }
            // Every run, even a short one, restarts the master at least once.
            let mut fault = plan[i % plan.len()];
            if !killed && start.elapsed() > half {
                fault = "kill";
            }
            killed |= fault == "kill";
            match fault {
                "sleep" => {
                    let secs = self.rng.pick(&["0.05", "0.2", "0.4", "0.8"]);
                    self.fault("DEBUG SLEEP (server stalled)");
                    let _ = raw_call(self.master_port(), &["DEBUG", "SLEEP", secs]);
                }
                "rewrite" => {
                    self.fault("BGREWRITEAOF");
                    let _ = raw_call(self.master_port(), &["BGREWRITEAOF"]);
                }
                "kill" => self.kill_and_restart(),
                "failover" => self.failover(false),
                "lagging failover" => self.failover(true),
                "delay" => {
                    let ms = self.rng.pick(&[0u64, 0, 50, 200]);
                    self.fault("CONFIG SET flock.lock-delay-ms");
                    self.set_lock_delay(ms);
                }
                _ => self.compare_digests(),
            }
            i += 1;
        }
        self.set_lock_delay(0);
    }
}

/// (owner, token) of a lock's live grant, as FLOCK.INFO shows it.
type Holder = (Option<Vec<u8>>, i64);

struct Snapshot {
    at: u64,
    holders: HashMap<usize, Option<Holder>>,
    logs: HashMap<usize, std::collections::HashSet<String>>,
}

/// (owner, token) of a FLOCK.INFO reply, None when nil.
fn parse_info_opt(r: &Reply) -> Option<Holder> {
    if r.is_nil() || r.is_err() {
        return None;
    }
    let i = parse_info(r, "FLOCK.INFO");
    i.map(|i| (i.owner, i.token))
}

// ---------------------------------------------------------------------------------------------
// the checker
// ---------------------------------------------------------------------------------------------

fn check_history(sh: &Shared, h: &mut History, logs: &HashMap<usize, Vec<String>>) {
    let mut v: Vec<String> = Vec::new();

    // G3: no token twice (tokens are server-wide: across keys too).
    let mut by_token: HashMap<i64, (usize, &str)> = HashMap::new();
    for g in &h.grants {
        if let Some((k, o)) = by_token.insert(g.token, (g.key, &g.owner)) {
            if k != g.key || o != g.owner {
                v.push(format!(
                    "token {} issued twice: to {o} on key {k} and to {} on key {} (G3)",
                    g.token, g.owner, g.key
                ));
            }
        }
    }
    *h.checks.entry("G3 distinct tokens").or_default() += by_token.len() as u64;

    // G3: real-time order. A grant acknowledged before another was asked for has the smaller
    // token.
    let mut by_ack: Vec<(u64, i64)> = h.grants.iter().map(|g| (g.ack, g.token)).collect();
    by_ack.sort_unstable();
    let mut by_send: Vec<(u64, i64)> = h.grants.iter().map(|g| (g.send, g.token)).collect();
    by_send.sort_unstable();
    let (mut j, mut max_before) = (0usize, (0i64, 0u64));
    let mut pairs = 0u64;
    for (send, token) in &by_send {
        while j < by_ack.len() && by_ack[j].0 < *send {
            if by_ack[j].1 > max_before.0 {
                max_before = (by_ack[j].1, by_ack[j].0);
            }
            j += 1;
        }
        pairs += j as u64;
        if max_before.0 != 0 && *token <= max_before.0 && *token != max_before.0 {
            v.push(format!(
                "token {token} asked for at {:.3}s is not above token {} acknowledged at \
                 {:.3}s (G3)",
                *send as f64 / 1e6,
                max_before.0,
                max_before.1 as f64 / 1e6
            ));
        }
    }
    *h.checks.entry("G3 ordered grant pairs").or_default() += pairs;

    // G1: sure-live spans per key.
    for k in 0..sh.keys {
        let grants: Vec<&GrantRec> = h.grants.iter().filter(|g| g.key == k).collect();
        // spans: (start, end, token)
        let mut spans: Vec<(u64, u64, i64)> = Vec::new();
        for g in &grants {
            let first_ack = g.proofs.iter().map(|p| p.1).min().unwrap_or(u64::MAX);
            let last_send = g.proofs.iter().map(|p| p.0).max().unwrap_or(0);
            if first_ack < last_send {
                spans.push((first_ack, last_send, g.token));
            }
        }
        spans.sort_unstable();
        // prefix: the two largest ends (with different tokens) among spans starting <= s
        let mut prefix: Vec<[(u64, i64); 2]> = Vec::with_capacity(spans.len());
        let mut best = [(0u64, 0i64); 2];
        for s in &spans {
            let cand = (s.1, s.2);
            if cand.0 > best[0].0 {
                if best[0].1 != cand.1 {
                    best[1] = best[0];
                }
                best[0] = cand;
            } else if cand.0 > best[1].0 && cand.1 != best[0].1 {
                best[1] = cand;
            }
            prefix.push(best);
        }
        let mut n = 0u64;
        for g in &grants {
            for p in &g.proofs {
                // spans starting at or before p.0
                let idx = spans.partition_point(|s| s.0 <= p.0);
                if idx == 0 {
                    continue;
                }
                n += 1;
                let b = prefix[idx - 1];
                let other = if b[0].1 != g.token { b[0] } else { b[1] };
                if other.1 != 0 && other.0 >= p.1 {
                    v.push(format!(
                        "two live grants of {}: token {} proved live within ({:.3}s, {:.3}s) \
                         while token {} was live throughout it (G1)",
                        sh.lock_key(k),
                        g.token,
                        p.0 as f64 / 1e6,
                        p.1 as f64 / 1e6,
                        other.1
                    ));
                }
            }
        }
        *h.checks
            .entry("G1 proofs checked against other grants")
            .or_default() += n;
    }

    // G9: no lease ended early (unless revoked, deleted or lost in a failover).
    let mut early_checked = 0u64;
    for g in &h.grants {
        for &(send, ack, epoch, lower) in &g.ends {
            let deadline = lower + g.ttl_us;
            if ack + EPS_US >= deadline
                || epoch != g.failover_epoch
                || g.lost_in_failover
                || g.released.is_some_and(|r| r <= send)
            {
                continue;
            }
            let touched = h
                .operator
                .iter()
                .any(|o| o.key == g.key && o.send < ack && o.done > g.send);
            if touched {
                continue;
            }
            v.push(format!(
                "lease of token {} on {} ({} ms) ended early: seen over at {:.3}s..{:.3}s, \
                 {} ms before its end, with no REVOKE or DEL (G9)",
                g.token,
                sh.lock_key(g.key),
                g.ttl_us / 1000,
                send as f64 / 1e6,
                ack as f64 / 1e6,
                (deadline - ack) / 1000
            ));
        }
        early_checked += g.ends.len() as u64;
    }
    *h.checks.entry("G9 lease ends checked").or_default() += early_checked;

    // Writes and logs.
    let tags: HashMap<&str, &WriteRec> = h.writes.iter().map(|w| (w.tag.as_str(), w)).collect();
    for k in 0..sh.keys {
        let log = &logs[&k];
        let mut last = 0i64;
        for (i, entry) in log.iter().enumerate() {
            let token: i64 = entry
                .split(':')
                .next()
                .and_then(|t| t.parse().ok())
                .unwrap_or(0);
            if token < last {
                v.push(format!(
                    "log of {} goes back in token order at entry {i}: {token} after {last} (G1/G5)",
                    sh.lock_key(k)
                ));
            }
            last = last.max(token);
            match tags.get(entry.as_str()) {
                Some(w) if w.outcome == Outcome::Refused => v.push(format!(
                    "a refused FENCED write is in the log of {}: {entry} (G5)",
                    sh.lock_key(k)
                )),
                None => v.push(format!(
                    "the log of {} holds {entry}, which no client wrote",
                    sh.lock_key(k)
                )),
                _ => {}
            }
        }
        *h.checks.entry("log entries checked").or_default() += log.len() as u64;
        let present: std::collections::HashSet<&str> = log.iter().map(String::as_str).collect();
        for w in h.writes.iter().filter(|w| w.key == k) {
            if w.outcome == Outcome::Accepted
                && !w.lost_in_failover
                && !present.contains(w.tag.as_str())
            {
                v.push(format!(
                    "acknowledged FENCED write {} missing from the log of {}",
                    w.tag,
                    sh.lock_key(k)
                ));
            }
        }
        // Real-time order of accepted writes.
        let mut acc: Vec<&WriteRec> = h
            .writes
            .iter()
            .filter(|w| w.key == k && w.outcome == Outcome::Accepted)
            .collect();
        acc.sort_by_key(|w| w.ack);
        let mut by_send = acc.clone();
        by_send.sort_by_key(|w| w.send);
        let (mut j, mut max_tok) = (0usize, 0i64);
        for w in &by_send {
            while j < acc.len() && acc[j].ack < w.send {
                max_tok = max_tok.max(acc[j].token);
                j += 1;
            }
            if w.token < max_tok {
                v.push(format!(
                    "FENCED write with token {} accepted after a write with token {max_tok} was \
                     acknowledged (G5)",
                    w.token
                ));
            }
        }
    }
    for x in v {
        h.violation(x);
    }
}

// ---------------------------------------------------------------------------------------------
// the run
// ---------------------------------------------------------------------------------------------

#[test]
fn history_checker_under_faults() {
    let secs = env_num("FLOCK_CHAOS_SECS", 20);
    let clients = env_num("FLOCK_CHAOS_CLIENTS", 8) as usize;
    let keys = env_num("FLOCK_CHAOS_KEYS", 4) as usize;
    let seed = env_num("FLOCK_CHAOS_SEED", now_us() as u64);
    let server = server_binary();
    eprintln!(
        "chaos: {secs} s, {clients} clients, {keys} keys, seed {seed} \
         (FLOCK_CHAOS_SEED to replay the choices), server {server}"
    );
    let a = aof_server();
    let b = aof_server();
    let sh = Arc::new(Shared {
        t0: Instant::now(),
        port: AtomicU16::new(a.port()),
        stop: AtomicBool::new(false),
        gate: Gate {
            paused: Mutex::new(false),
            cv: Condvar::new(),
            parked: AtomicUsize::new(0),
        },
        hist: Mutex::new(History::default()),
        failover_epoch: AtomicU64::new(0),
        keys,
        workers: clients + 1,
    });
    let mut inj = Injector {
        sh: sh.clone(),
        servers: vec![a, b],
        master: 0,
        rng: Rng::new(seed ^ 0xFA17),
    };
    inj.attach_replica();

    let mut threads = Vec::new();
    for id in 0..clients {
        let sh = sh.clone();
        threads.push(std::thread::spawn(move || {
            let mut c = Client {
                id,
                sh,
                rng: Rng::new(seed.wrapping_add(id as u64 + 1)),
                conn: None,
                n: 0,
                seq: 0,
            };
            c.run();
        }));
    }
    {
        let sh = sh.clone();
        threads.push(std::thread::spawn(move || operator(sh, seed ^ 0x0BE7)));
    }
    let until = Instant::now() + Duration::from_secs(secs);
    inj.run(until);
    sh.stop.store(true, SeqCst);
    sh.gate.resume();
    for t in threads {
        t.join().expect("worker thread panicked");
    }

    // Quiesce: every lease ends (at most 4 s, plus lock-delay), the replica catches up.
    let port = inj.master_port();
    let mut c = RawConn::connect(port).expect("connect to the master at the end");
    let lock_keys: Vec<String> = (0..keys).map(|k| sh.lock_key(k)).collect();
    let drained = poll_until(Duration::from_secs(15), || {
        lock_keys
            .iter()
            .all(|k| c.call(&["EXISTS", k]).ok() == Some(Reply::Int(0)))
    });
    let mut h = std::mem::take(&mut *sh.hist());
    if !drained {
        h.violation("lock keys still exist 15 s after the last client stopped (G10)".into());
    }
    let blocked = info_of(port, "flock", "flock_blocked_clients");
    if blocked.as_deref() != Some("0") {
        h.violation(format!(
            "flock_blocked_clients is {blocked:?} at the end (G10)"
        ));
    }
    inj.compare_digests();
    let mut logs = HashMap::new();
    for k in 0..keys {
        let r = c
            .call(&["LRANGE", &sh.log_key(k), "0", "-1"])
            .expect("LRANGE");
        let v: Vec<String> = r
            .array()
            .map(|a| a.iter().filter_map(Reply::string).collect())
            .unwrap_or_default();
        logs.insert(k, v);
    }
    // Faults and checks recorded by the injector after the take above.
    {
        let late = std::mem::take(&mut *sh.hist());
        for (k, n) in late.checks {
            *h.checks.entry(k).or_default() += n;
        }
        for (k, n) in late.faults {
            *h.faults.entry(k).or_default() += n;
        }
        for x in late.violations {
            h.violations.push(x);
        }
    }
    check_history(&sh, &mut h, &logs);
    for s in inj.servers.iter_mut() {
        let log = std::fs::read_to_string(s.log_path()).unwrap_or_default();
        if log.contains("BUG REPORT") || log.contains("panicked") {
            h.violation(format!(
                "server on port {} logged a crash or panic (G8):\n{}",
                s.port(),
                s.log_tail(40)
            ));
        }
    }

    // Report.
    let total_ops: u64 = h.ops.values().sum();
    let total_faults: u64 = h.faults.values().sum();
    eprintln!(
        "\n=== chaos report: {secs} s, {clients} clients, {keys} keys, seed {seed}, {server} ==="
    );
    eprintln!("operations ({total_ops}):");
    for (k, n) in &h.ops {
        eprintln!("  {k:<45} {n}");
    }
    eprintln!("waiters (BLOCK) ended with:");
    for (k, n) in &h.waits {
        eprintln!("  {k:<45} {n}");
    }
    eprintln!("faults injected ({total_faults}):");
    for (k, n) in &h.faults {
        eprintln!("  {k:<45} {n}");
    }
    eprintln!("checks:");
    for (k, n) in &h.checks {
        eprintln!("  {k:<45} {n}");
    }
    eprintln!(
        "grants: {}, FENCED writes: {}",
        h.grants.len(),
        h.writes.len()
    );
    eprintln!("violations: {}", h.violations.len());
    for x in h.violations.iter().take(30) {
        eprintln!("  - {x}");
    }
    if let Ok(path) = std::env::var("FLOCK_CHAOS_REPORT") {
        use std::io::Write;
        let name = std::path::Path::new(&server)
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or(server.clone());
        let faults: Vec<String> = h.faults.iter().map(|(k, n)| format!("{k}: {n}")).collect();
        let row = format!(
            "| history checker, {name}, {secs} s, {clients} clients, {keys} keys | {total_ops} ({} grants, {} FENCED writes) | {total_faults} ({}) | {} |\n",
            h.grants.len(),
            h.writes.len(),
            faults.join(", "),
            h.violations.len()
        );
        if let Ok(mut f) = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&path)
        {
            let _ = f.write_all(row.as_bytes());
        }
    }
    assert!(
        h.violations.is_empty(),
        "{} violations (first: {})",
        h.violations.len(),
        h.violations[0]
    );
    assert!(
        h.grants.len() > 50 && h.faults.contains_key("kill -9 master, restart from AOF"),
        "the run exercised too little: {} grants, faults {:?}",
        h.grants.len(),
        h.faults
    );
}

// ---------------------------------------------------------------------------------------------
// the checker catches what it should (synthetic histories)
// ---------------------------------------------------------------------------------------------

fn synthetic_shared(keys: usize) -> Shared {
    Shared {
        t0: Instant::now(),
        port: AtomicU16::new(0),
        stop: AtomicBool::new(false),
        gate: Gate {
            paused: Mutex::new(false),
            cv: Condvar::new(),
            parked: AtomicUsize::new(0),
        },
        hist: Mutex::new(History::default()),
        failover_epoch: AtomicU64::new(0),
        keys,
        workers: 0,
    }
}

fn grant_rec(key: usize, owner: &str, token: i64, ttl_ms: u64, proofs: &[(u64, u64)]) -> GrantRec {
    GrantRec {
        key,
        owner: owner.into(),
        token,
        ttl_us: ttl_ms * 1000,
        send: proofs[0].0,
        ack: proofs[0].1,
        lower: proofs[0].0,
        upper: proofs[0].1,
        proofs: proofs.to_vec(),
        ends: Vec::new(),
        released: None,
        unsure: false,
        touched: proofs[0].0,
        failover_epoch: 0,
        lost_in_failover: false,
    }
}

fn violations_of(h: &mut History, logs: &[(usize, &[&str])]) -> Vec<String> {
    let sh = synthetic_shared(2);
    h.quiet = true;
    let mut l: HashMap<usize, Vec<String>> = (0..2).map(|k| (k, Vec::new())).collect();
    for (k, entries) in logs {
        l.insert(*k, entries.iter().map(|s| s.to_string()).collect());
    }
    check_history(&sh, h, &l);
    std::mem::take(&mut h.violations)
}

#[test]
fn the_checker_finds_planted_violations() {
    let ms = |x: u64| x * 1000;
    // A clean history: two grants of key 0 one after the other, one of key 1.
    let mut h = History::default();
    h.grants
        .push(grant_rec(0, "a", 10, 100, &[(0, ms(1)), (ms(50), ms(51))]));
    h.grants.push(grant_rec(
        0,
        "b",
        20,
        100,
        &[(ms(60), ms(61)), (ms(90), ms(91))],
    ));
    h.grants
        .push(grant_rec(1, "c", 30, 100, &[(ms(95), ms(96))]));
    assert!(
        violations_of(&mut h, &[]).is_empty(),
        "clean history flagged"
    );

    // G1: b proves itself while a is live throughout (a proved live at 1 ms and at 50 ms).
    let mut h = History::default();
    h.grants
        .push(grant_rec(0, "a", 10, 100, &[(0, ms(1)), (ms(50), ms(51))]));
    h.grants
        .push(grant_rec(0, "b", 20, 100, &[(ms(10), ms(11))]));
    let v = violations_of(&mut h, &[]);
    assert!(v.iter().any(|x| x.contains("(G1)")), "G1 not found: {v:?}");

    // G3: the same token for two owners; a later grant with a smaller token.
    let mut h = History::default();
    h.grants.push(grant_rec(0, "a", 10, 10, &[(0, ms(1))]));
    h.grants
        .push(grant_rec(1, "b", 10, 10, &[(ms(20), ms(21))]));
    h.grants.push(grant_rec(1, "c", 5, 10, &[(ms(40), ms(41))]));
    let v = violations_of(&mut h, &[]);
    assert!(v.iter().any(|x| x.contains("issued twice")), "{v:?}");
    assert!(v.iter().any(|x| x.contains("is not above")), "{v:?}");

    // G9: a lease seen over long before its end, with nobody revoking it.
    let mut h = History::default();
    let mut g = grant_rec(0, "a", 10, 1000, &[(0, ms(1))]);
    g.ends.push((ms(100), ms(101), 0, 0));
    h.grants.push(g.clone());
    let v = violations_of(&mut h, &[]);
    assert!(v.iter().any(|x| x.contains("ended early")), "{v:?}");
    // ...but not when the operator revoked it meanwhile.
    h.grants = vec![g];
    h.operator.push(OperatorOp {
        key: 0,
        send: ms(50),
        done: ms(51),
    });
    assert!(violations_of(&mut h, &[]).is_empty());

    // Logs: back in token order, a refused write present, an accepted write missing.
    let mut h = History::default();
    for (tag, token, outcome) in [
        ("20:1:1", 20, Outcome::Accepted),
        ("10:1:2", 10, Outcome::Refused),
        ("20:1:3", 20, Outcome::Accepted),
    ] {
        h.writes.push(WriteRec {
            key: 0,
            token,
            tag: tag.into(),
            send: 0,
            ack: 1,
            outcome,
            lost_in_failover: false,
        });
    }
    let v = violations_of(&mut h, &[(0, &["20:1:1", "10:1:2"])]);
    assert!(
        v.iter().any(|x| x.contains("goes back in token order")),
        "{v:?}"
    );
    assert!(
        v.iter()
            .any(|x| x.contains("refused FENCED write is in the log")),
        "{v:?}"
    );
    assert!(v.iter().any(|x| x.contains("20:1:3 missing")), "{v:?}");
}
