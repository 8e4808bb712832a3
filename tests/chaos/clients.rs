//! The clients of the chaos run: each loops over random lock operations on real connections
//! and records what it sent and what came back; and the operator, who REVOKEs and DELs lock
//! keys at random.

use crate::history::*;
use crate::EPS_US;
use flock_testkit::*;
use std::sync::atomic::Ordering::SeqCst;
use std::sync::Arc;
use std::thread::sleep;
use std::time::Duration;

pub(crate) struct Client {
    pub(crate) id: usize,
    pub(crate) sh: Arc<Shared>,
    pub(crate) rng: Rng,
    pub(crate) conn: Option<RawConn>,
    pub(crate) n: u64,
    pub(crate) seq: u64,
}

pub(crate) enum Call {
    Reply(Reply),
    /// The connection failed (server killed, read timeout): the outcome is unknown.
    Lost(String),
}

impl Client {
    pub(crate) fn connect(&mut self) -> bool {
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

    pub(crate) fn call(&mut self, args: &[String], timeout: Duration) -> Call {
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

    pub(crate) fn run(&mut self) {
        while !self.sh.stop.load(SeqCst) {
            self.sh.gate.checkpoint();
            if !self.connect() {
                continue;
            }
            self.one_round();
        }
    }

    pub(crate) fn one_round(&mut self) {
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
    pub(crate) fn hang_up_while_waiting(&mut self, mut args: Vec<String>) {
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
    pub(crate) fn new_grant(
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
    pub(crate) fn proof(&self, g: usize, send: u64, ack: u64, what: &str) {
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

    /// The holder extended its lease (RENEW, or ACQUIRE repeated): a proof, and the lease now
    /// runs at least until `send` + ttl and at most until `ack` + ttl.
    pub(crate) fn extended(&self, g: usize, send: u64, ack: u64, what: &str) {
        self.proof(g, send, ack, what);
        let mut h = self.sh.hist();
        h.grants[g].lower = send;
        h.grants[g].upper = ack;
    }

    pub(crate) fn ended(&self, g: usize, send: u64, ack: u64) {
        let epoch = self.sh.epoch();
        let mut h = self.sh.hist();
        let lower = h.grants[g].lower;
        h.grants[g].ends.push((send, ack, epoch, lower));
    }

    pub(crate) fn hold(&mut self, mut g: usize) {
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
                            self.extended(g, send, ack, "RENEW");
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
                            self.extended(g, send, ack, "repeated ACQUIRE");
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
    pub(crate) fn fenced_write(
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

pub(crate) fn operator(sh: Arc<Shared>, seed: u64) {
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
