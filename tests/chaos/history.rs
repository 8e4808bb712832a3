//! What the chaos run records: every grant, FENCED write and operator action with its send
//! and acknowledgement times, and the state the clients, the operator and the fault injector
//! share (the current master's port, the gate that pauses clients during a failover).

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicU16, AtomicU64, AtomicUsize, Ordering::SeqCst};
use std::sync::{Condvar, Mutex};
use std::time::Instant;

#[derive(Debug, Clone)]
pub(crate) struct GrantRec {
    pub(crate) key: usize,
    pub(crate) owner: String,
    pub(crate) token: i64,
    pub(crate) ttl_us: u64,
    pub(crate) send: u64,
    pub(crate) ack: u64,
    /// Send time of the last acknowledged extension (the grant itself, a RENEW, a repeated
    /// ACQUIRE): the lease runs at least until this + ttl.
    pub(crate) lower: u64,
    /// Latest time an extension may have happened (acknowledged or unknown outcome): the lease
    /// has ended by this + ttl.
    pub(crate) upper: u64,
    /// Moments the grant was live on the server: some instant inside each (send, ack).
    pub(crate) proofs: Vec<(u64, u64)>,
    /// Observations that the lease had ended: (send, ack, failover epoch, lower at that time).
    pub(crate) ends: Vec<(u64, u64, u64, u64)>,
    /// The holder released it (acknowledged 1) at this time.
    pub(crate) released: Option<u64>,
    /// An operation on it had an unknown outcome (the connection failed).
    pub(crate) unsure: bool,
    /// Latest send time of a RELEASE, RENEW or repeated ACQUIRE by its holder.
    pub(crate) touched: u64,
    pub(crate) failover_epoch: u64,
    pub(crate) lost_in_failover: bool,
}

#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) enum Outcome {
    Accepted,
    Refused,
    Unknown,
}

#[derive(Debug, Clone)]
pub(crate) struct WriteRec {
    pub(crate) key: usize,
    pub(crate) token: i64,
    pub(crate) tag: String,
    pub(crate) send: u64,
    pub(crate) ack: u64,
    pub(crate) outcome: Outcome,
    pub(crate) lost_in_failover: bool,
}

#[derive(Debug, Clone)]
pub(crate) struct OperatorOp {
    pub(crate) key: usize,
    pub(crate) send: u64,
    /// The reply time, or the time the connection failed (the effect came no later).
    pub(crate) done: u64,
}

#[derive(Default)]
pub(crate) struct History {
    pub(crate) grants: Vec<GrantRec>,
    pub(crate) writes: Vec<WriteRec>,
    pub(crate) operator: Vec<OperatorOp>,
    pub(crate) violations: Vec<String>,
    pub(crate) ops: BTreeMap<&'static str, u64>,
    pub(crate) faults: BTreeMap<&'static str, u64>,
    pub(crate) checks: BTreeMap<&'static str, u64>,
    pub(crate) waits: BTreeMap<&'static str, u64>,
    /// Do not print violations as they are found (the checker's own tests).
    pub(crate) quiet: bool,
}

impl History {
    pub(crate) fn op(&mut self, name: &'static str) {
        *self.ops.entry(name).or_default() += 1;
    }
    pub(crate) fn violation(&mut self, v: String) {
        if !self.quiet {
            eprintln!("VIOLATION: {v}");
        }
        self.violations.push(v);
    }
}

/// Pauses clients and the operator at their next step (for a restart's verification).
pub(crate) struct Gate {
    pub(crate) paused: Mutex<bool>,
    pub(crate) cv: Condvar,
    pub(crate) parked: AtomicUsize,
}

impl Gate {
    pub(crate) fn checkpoint(&self) {
        let mut p = self.paused.lock().unwrap();
        if *p {
            self.parked.fetch_add(1, SeqCst);
            while *p {
                p = self.cv.wait(p).unwrap();
            }
            self.parked.fetch_sub(1, SeqCst);
        }
    }
    pub(crate) fn pause(&self) {
        *self.paused.lock().unwrap() = true;
    }
    pub(crate) fn resume(&self) {
        *self.paused.lock().unwrap() = false;
        self.cv.notify_all();
    }
}

pub(crate) struct Shared {
    pub(crate) t0: Instant,
    pub(crate) port: AtomicU16,
    pub(crate) stop: AtomicBool,
    pub(crate) gate: Gate,
    pub(crate) hist: Mutex<History>,
    pub(crate) failover_epoch: AtomicU64,
    pub(crate) keys: usize,
    pub(crate) workers: usize,
}

impl Shared {
    /// The shared state of a run against the master on `port` (0: none, a synthetic history)
    /// with `keys` lock keys and `workers` threads that the gate pauses.
    pub(crate) fn new(port: u16, keys: usize, workers: usize) -> Shared {
        Shared {
            t0: Instant::now(),
            port: AtomicU16::new(port),
            stop: AtomicBool::new(false),
            gate: Gate {
                paused: Mutex::new(false),
                cv: Condvar::new(),
                parked: AtomicUsize::new(0),
            },
            hist: Mutex::new(History::default()),
            failover_epoch: AtomicU64::new(0),
            keys,
            workers,
        }
    }

    pub(crate) fn now(&self) -> u64 {
        self.t0.elapsed().as_micros() as u64
    }
    pub(crate) fn hist(&self) -> std::sync::MutexGuard<'_, History> {
        self.hist.lock().unwrap_or_else(|e| e.into_inner())
    }
    pub(crate) fn lock_key(&self, k: usize) -> String {
        format!("{{chaos{k}}}:lock")
    }
    pub(crate) fn log_key(&self, k: usize) -> String {
        format!("{{chaos{k}}}:log")
    }
    pub(crate) fn epoch(&self) -> u64 {
        self.failover_epoch.load(SeqCst)
    }
}
