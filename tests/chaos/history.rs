//! What the chaos run records: every grant, FENCED write and operator action with its send
//! and acknowledgement times, and the state the clients, the operator and the fault injector
//! share (the current master's port, the gate that pauses clients during a failover).

pub(crate) mod coord;

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicU16, AtomicU64, AtomicUsize, Ordering::SeqCst};
use std::sync::{Condvar, Mutex};
use std::time::Instant;

/// The kind of one grant (SPEC "Lock kinds").
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) enum Kind {
    Exclusive,
    Shared,
    Permit,
}

impl Kind {
    pub(crate) fn name(self) -> &'static str {
        match self {
            Kind::Exclusive => "exclusive",
            Kind::Shared => "shared",
            Kind::Permit => "permit",
        }
    }
}

/// How the clients use a lock key, fixed per key for the whole run: a mutex, a read/write lock
/// (SHARED readers plus exclusive writers), or a semaphore of `n` permits (LIMIT n only). Mixing
/// SHARED and LIMIT on one key is an error by design (limit mismatch), so a key keeps one use.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum KeyKind {
    Exclusive,
    ReadWrite,
    Semaphore(u64),
}

impl KeyKind {
    /// The most live grants the key may have at one moment (G1). A read/write key's readers are
    /// bounded only by `flock.max-holders` (10000 by default), far above the clients of a run.
    pub(crate) fn limit(self) -> usize {
        match self {
            KeyKind::Exclusive => 1,
            KeyKind::ReadWrite => 10_000,
            KeyKind::Semaphore(n) => n as usize,
        }
    }
    pub(crate) fn name(self) -> String {
        match self {
            KeyKind::Exclusive => "exclusive".into(),
            KeyKind::ReadWrite => "read/write".into(),
            KeyKind::Semaphore(n) => format!("semaphore of {n}"),
        }
    }
}

#[derive(Debug, Clone)]
pub(crate) struct GrantRec {
    pub(crate) key: usize,
    pub(crate) owner: String,
    pub(crate) token: i64,
    pub(crate) kind: Kind,
    pub(crate) ttl_us: u64,
    pub(crate) send: u64,
    pub(crate) ack: u64,
    /// When the request that holds its place in the queue was sent: `send`, or for a retried
    /// wait its earlier request's (the retry takes that one's place).
    pub(crate) queue_send: u64,
    /// Send time of the last acknowledged extension (the grant itself, a RENEW, a repeated
    /// ACQUIRE): the lease runs at least until this + ttl.
    pub(crate) lower: u64,
    /// Latest time an extension may have happened (acknowledged or unknown outcome): the lease
    /// has ended by this + ttl.
    pub(crate) upper: u64,
    /// Moments the grant was live on the server: some instant inside each (send, ack).
    pub(crate) proofs: Vec<(u64, u64)>,
    /// The failover epoch of each proof's master (u64::MAX: a failover came while it ran). A
    /// failover can lose a release and so revive a grant on the new master: a grant's proofs
    /// show it live throughout a span only within one epoch.
    pub(crate) proof_epochs: Vec<u64>,
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
    /// A BOUND grant: the (client, connection generation) it is bound to (the last connection
    /// that made or repeated it with BOUND). None: not bound.
    pub(crate) bound: Option<(usize, u64)>,
    /// A durable grant: its ACQUIRE's pipelined `WAIT 1` answered 1 (the replica had it).
    pub(crate) durable: bool,
    /// Send time of the last extension the replica acknowledged (the ACQUIRE, a RENEW whose
    /// pipelined WAIT answered 1): on the replica the lease runs at least until this + ttl.
    pub(crate) durable_lower: u64,
}

/// A `CLIENT KILL ID` of a client's lock connection that killed it (replied 1): the bound
/// grants of that connection ended by `ack` at the latest (G11).
#[derive(Debug, Clone)]
pub(crate) struct KillRec {
    pub(crate) client: usize,
    /// The client's connection generation (its count of connects) that was killed.
    pub(crate) gen: u64,
    pub(crate) conn_id: i64,
    pub(crate) send: u64,
    pub(crate) ack: u64,
}

/// What the fault injector knows of a client's lock connection (for CLIENT KILL).
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct ConnSlot {
    pub(crate) id: Option<i64>,
    pub(crate) gen: u64,
    pub(crate) port: u16,
    /// The client holds a BOUND grant on it now.
    pub(crate) bound: bool,
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
    /// The kind of the grant whose token it carried (a shared one must always be refused).
    pub(crate) kind: Kind,
    /// The failover epoch it ran in (u64::MAX: a failover came while it ran).
    pub(crate) epoch: u64,
}

/// A FENCED LINDEX log -1 under a shared (read) token that was accepted: the read ran right
/// after the log entry `last` (None: the log was empty) and before the entry that follows it
/// on the same master.
#[derive(Debug, Clone)]
pub(crate) struct ReadRec {
    pub(crate) key: usize,
    pub(crate) token: i64,
    pub(crate) last: Option<String>,
    /// The failover epoch it ran in (u64::MAX: a failover came while it ran).
    pub(crate) epoch: u64,
}

/// One BLOCK request, for the FIFO check (G6).
#[derive(Debug, Clone)]
pub(crate) struct WaitRec {
    pub(crate) key: usize,
    pub(crate) kind: Kind,
    pub(crate) send: u64,
    /// A retried wait: `send` is the retry's, `queued_by` its earlier request's, whose place
    /// it took.
    pub(crate) retried: bool,
    /// A moment by which it surely waited in the key's queue: the acknowledgement of a CLIENT
    /// LIST on another connection that showed the request's connection blocked in
    /// FLOCK.ACQUIRE. None when no probe saw it blocked.
    pub(crate) queued_by: Option<u64>,
    /// The token it was granted.
    pub(crate) granted: Option<i64>,
    /// When its answer came.
    pub(crate) ack: u64,
    /// It timed out (nil): it waited in the queue at least until this moment (its send time
    /// plus its timeout, less the slack).
    pub(crate) waited_until: Option<u64>,
    pub(crate) epoch: u64,
}

/// A FLOCK.HOLDERS reply: every live grant of the key at one instant inside (send, ack).
#[derive(Debug, Clone)]
pub(crate) struct HoldersRec {
    pub(crate) key: usize,
    pub(crate) send: u64,
    pub(crate) ack: u64,
    /// (owner, token, ttl ms) as listed.
    pub(crate) grants: Vec<(String, i64, i64)>,
    /// The failover epoch it ran in (u64::MAX: a failover came while it ran).
    pub(crate) epoch: u64,
}

#[derive(Debug, Clone)]
pub(crate) struct OperatorOp {
    pub(crate) key: usize,
    /// REVOKE key owner: only that owner's grant can have ended; None for REVOKE key and DEL.
    pub(crate) owner: Option<String>,
    pub(crate) send: u64,
    /// The reply time, or the time the connection failed (the effect came no later).
    pub(crate) done: u64,
}

#[derive(Default)]
pub(crate) struct History {
    pub(crate) grants: Vec<GrantRec>,
    pub(crate) writes: Vec<WriteRec>,
    pub(crate) operator: Vec<OperatorOp>,
    pub(crate) reads: Vec<ReadRec>,
    pub(crate) waiters: Vec<WaitRec>,
    pub(crate) holders: Vec<HoldersRec>,
    /// `flock.lock-delay-ms` on the master from each moment on: Some(ms) once CONFIG SET
    /// answered; None (unknown) from when it was sent, and from each kill (a restarted server
    /// has the default until the next CONFIG SET) and failover.
    pub(crate) lock_delay: Vec<(u64, Option<u64>)>,
    /// CLIENT KILLs of client lock connections (G11).
    pub(crate) kills: Vec<KillRec>,
    /// The earliest moment each (client, connection generation) may have closed: a CLIENT KILL
    /// sent, or the client dropping it (a lost reply, a hang-up, LOADING/READONLY).
    pub(crate) closed: std::collections::HashMap<(usize, u64), u64>,
    /// Moments every connection to the master closed: kill -9 and failover (bound grants end).
    pub(crate) resets: Vec<u64>,
    /// Spans (from, to) in which the master was a replica promoted with its clock a day behind.
    pub(crate) skewed: Vec<(u64, u64)>,
    /// Every FLOCK.WATCH the watchers sent and what they were told (history/coord.rs).
    pub(crate) watches: Vec<coord::WatchRec>,
    /// Every FLOCK.MACQUIRE the multi-key clients sent and how it ended (history/coord.rs).
    pub(crate) multis: Vec<coord::MultiRec>,
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
    pub(crate) kinds: Vec<KeyKind>,
    /// Keys from this index on are mutexes of one slot (`{chaosm}:lock<k>`), which the
    /// MACQUIRE clients take 2 or 3 at a time (with_multi_keys); the others use them too.
    pub(crate) multi_from: usize,
    /// MACQUIREs sent and not answered yet: while one waits, a free key it heads exists on the
    /// master and not on the replica (SPEC MACQUIRE), so the digests may differ (G7).
    pub(crate) multi_in_flight: AtomicUsize,
    pub(crate) workers: usize,
    /// Each client's lock connection, for the injector's CLIENT KILL.
    pub(crate) conns: Mutex<Vec<ConnSlot>>,
}

/// The use of key `k`: every third key a mutex, a read/write lock, a semaphore (of 2 or 3 in
/// turn), so that the 4 keys of `make test` have each kind and `make chaos`'s 6 both semaphores.
pub(crate) fn key_kind(k: usize) -> KeyKind {
    match k % 3 {
        0 => KeyKind::Exclusive,
        1 => KeyKind::ReadWrite,
        _ => KeyKind::Semaphore(2 + (k / 3) as u64 % 2),
    }
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
            kinds: (0..keys).map(key_kind).collect(),
            multi_from: keys,
            multi_in_flight: AtomicUsize::new(0),
            workers,
            conns: Mutex::new(vec![ConnSlot::default(); workers]),
        }
    }

    /// `n` more keys, mutexes that share one hash tag, for the MACQUIRE clients.
    pub(crate) fn with_multi_keys(mut self, n: usize) -> Shared {
        self.multi_from = self.keys;
        self.keys += n;
        self.kinds
            .extend(std::iter::repeat_n(KeyKind::Exclusive, n));
        self
    }

    pub(crate) fn now(&self) -> u64 {
        self.t0.elapsed().as_micros() as u64
    }
    pub(crate) fn hist(&self) -> std::sync::MutexGuard<'_, History> {
        self.hist.lock().unwrap_or_else(|e| e.into_inner())
    }
    pub(crate) fn lock_key(&self, k: usize) -> String {
        if k >= self.multi_from {
            return format!("{{chaosm}}:lock{k}");
        }
        format!("{{chaos{k}}}:lock")
    }
    pub(crate) fn log_key(&self, k: usize) -> String {
        if k >= self.multi_from {
            return format!("{{chaosm}}:log{k}");
        }
        format!("{{chaos{k}}}:log")
    }
    pub(crate) fn epoch(&self) -> u64 {
        self.failover_epoch.load(SeqCst)
    }
    pub(crate) fn conns(&self) -> std::sync::MutexGuard<'_, Vec<ConnSlot>> {
        self.conns.lock().unwrap_or_else(|e| e.into_inner())
    }
}

impl History {
    /// Whether bound grant `g`'s connection may have closed (a kill, a drop, a server reset)
    /// before `t`: then its grant may have ended before `t` without anyone ending it.
    pub(crate) fn bound_closed_before(&self, g: &GrantRec, t: u64) -> bool {
        let Some(conn) = g.bound else { return false };
        self.closed.get(&conn).is_some_and(|&c| c <= t)
            || self.resets.iter().any(|&r| r > g.send && r <= t)
    }
}

impl OperatorOp {
    /// Whether this operator action can have ended grant `g` (REVOKE key owner ends only that
    /// owner's grant; REVOKE key and DEL end every grant of the key).
    pub(crate) fn may_end(&self, g: &GrantRec) -> bool {
        self.key == g.key && self.owner.as_ref().is_none_or(|o| *o == g.owner)
    }
}

/// The (owner, token, ttl) triples of a FLOCK.HOLDERS reply; Err when its shape is wrong.
pub(crate) fn parse_holders(r: &flock_testkit::Reply) -> Result<Vec<(String, i64, i64)>, String> {
    let a = r
        .array()
        .ok_or_else(|| format!("FLOCK.HOLDERS: not an array: {r:?}"))?;
    let mut out = Vec::with_capacity(a.len());
    for e in a {
        match e.array() {
            Some([o, flock_testkit::Reply::Int(t), flock_testkit::Reply::Int(ttl)])
                if o.string().is_some() =>
            {
                out.push((o.string().unwrap_or_default(), *t, *ttl))
            }
            _ => {
                return Err(format!(
                    "FLOCK.HOLDERS: entry is not [owner, token, ttl]: {e:?}"
                ))
            }
        }
    }
    Ok(out)
}
