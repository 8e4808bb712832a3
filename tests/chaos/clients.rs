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
    /// The server's CLIENT ID of `conn`, and a second connection to the same server that
    /// looks at it (CLIENT LIST) while it waits in a BLOCK: proof that it is queued.
    pub(crate) conn_id: Option<i64>,
    pub(crate) side: Option<RawConn>,
    pub(crate) side_id: Option<i64>,
    /// The failover epoch when the last command was sent (the proof it gives belongs to it).
    pub(crate) sent_epoch: u64,
    pub(crate) n: u64,
    pub(crate) seq: u64,
    /// How many times `conn` was (re)connected: names the connection a BOUND grant is bound to.
    pub(crate) gen: u64,
    /// The grant `hold` works on now (a repeated ACQUIRE can replace it).
    pub(crate) holding: usize,
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
        let port = self.sh.port.load(SeqCst);
        match RawConn::connect(port) {
            Ok(mut c) => {
                self.conn_id = c.call(&["CLIENT", "ID"]).ok().and_then(|r| r.int());
                self.side = RawConn::connect(port).ok();
                self.side_id = self
                    .side
                    .as_mut()
                    .and_then(|s| s.call(&["CLIENT", "ID"]).ok())
                    .and_then(|r| r.int());
                self.conn = Some(c);
                self.gen += 1;
                let slot = ConnSlot {
                    id: self.conn_id,
                    gen: self.gen,
                    port,
                    bound: false,
                };
                if let Some(s) = self.sh.conns().get_mut(self.id) {
                    *s = slot;
                }
                true
            }
            Err(_) => {
                sleep(Duration::from_millis(20));
                false
            }
        }
    }

    /// Drop the lock connection (its bound grants end on the server): recorded as the moment
    /// it may have closed.
    pub(crate) fn drop_conn(&mut self) {
        if self.conn.take().is_some() {
            let now = self.sh.now();
            self.sh
                .hist()
                .closed
                .entry((self.id, self.gen))
                .or_insert(now);
        }
    }

    /// Whether the injector's CLIENT KILL killed connection generation `gen` of this client.
    pub(crate) fn was_killed(&self, gen: u64) -> bool {
        self.sh
            .hist()
            .kills
            .iter()
            .any(|k| k.client == self.id && k.gen == gen)
    }

    fn set_slot_bound(&self, bound: bool) {
        if let Some(s) = self.sh.conns().get_mut(self.id) {
            s.bound = bound;
        }
    }

    pub(crate) fn call(&mut self, args: &[String], timeout: Duration) -> Call {
        let Some(c) = self.conn.as_mut() else {
            return Call::Lost("not connected".into());
        };
        let _ = c.set_read_timeout(timeout);
        self.sent_epoch = self.sh.epoch();
        let r = c.call(args);
        self.finish(r)
    }

    fn finish(&mut self, r: std::io::Result<Reply>) -> Call {
        match r {
            Ok(Reply::Err(e)) if e.starts_with("LOADING") || e.starts_with("READONLY") => {
                // Not a master (yet): go find the current one.
                self.drop_conn();
                Call::Reply(Reply::Err(e))
            }
            Ok(r) => Call::Reply(r),
            Err(e) => {
                self.drop_conn();
                Call::Lost(e.to_string())
            }
        }
    }

    /// Send a BLOCK request, look from the side connection whether it waits in the queue, then
    /// read its answer: (answer, the acknowledgement time of a look that saw it queued).
    pub(crate) fn call_block(&mut self, args: &[String], timeout: Duration) -> (Call, Option<u64>) {
        let Some(c) = self.conn.as_mut() else {
            return (Call::Lost("not connected".into()), None);
        };
        let _ = c.set_read_timeout(timeout);
        self.sent_epoch = self.sh.epoch();
        if let Err(e) = c.send(args) {
            self.drop_conn();
            return (Call::Lost(e.to_string()), None);
        }
        // A short random pause, so that the look comes both before and after the server has
        // read the request (and often while a BLOCK 30 still waits).
        sleep(Duration::from_millis(self.rng.below(15)));
        let queued = self.queued_now();
        let r = match self.conn.as_mut() {
            Some(c) => c.read_reply(),
            None => return (Call::Lost("not connected".into()), queued),
        };
        (self.finish(r), queued)
    }

    /// The acknowledgement time of a CLIENT LIST that shows this client's connection blocked
    /// in FLOCK.ACQUIRE (a module-blocked client has flag `b`): it was in the key's queue then.
    /// The side connection looks at the main one, or (`of_side`) the main one at the side one.
    fn queued_now(&mut self) -> Option<u64> {
        self.looks_queued(false)
    }

    fn looks_queued(&mut self, of_side: bool) -> Option<u64> {
        let (id, looker) = if of_side {
            (self.side_id?, self.conn.as_mut()?)
        } else {
            (self.conn_id?, self.side.as_mut()?)
        };
        let _ = looker.set_read_timeout(Duration::from_secs(20));
        let r = looker.call(&["CLIENT", "LIST", "ID", &id.to_string()]);
        let ack = self.sh.now();
        let text = match r {
            Ok(r) => r.string()?,
            Err(_) => {
                if of_side {
                    self.drop_conn();
                } else {
                    self.side = None;
                }
                return None;
            }
        };
        let field = |name: &str| {
            text.split_whitespace()
                .find_map(|f| f.strip_prefix(name))
                .map(str::to_string)
        };
        let blocked = field("flags=").is_some_and(|f| f.contains('b'))
            && field("cmd=").as_deref() == Some("flock.acquire");
        blocked.then_some(ack)
    }

    /// A retried wait: a BLOCK request, and once it is seen queued the same request again from
    /// the side connection (a client that gave up on its first connection's answer). The first
    /// must answer nil (the retry takes its place), or its grant if it came before the retry was
    /// read, and then the retry is the holder repeating ACQUIRE (G4: the same token). Returns
    /// the answer that counts, the time from which the retry surely waited in the queue (in the
    /// earlier request's place), and its request's send time.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn call_block_retried(
        &mut self,
        args: &[String],
        timeout: Duration,
        k: usize,
        kind: Kind,
        ttl_ms: u64,
        epoch: u64,
    ) -> (Call, Option<u64>, u64) {
        let sh = self.sh.clone();
        let send = sh.now();
        let Some(c) = self.conn.as_mut() else {
            return (Call::Lost("not connected".into()), None, send);
        };
        let _ = c.set_read_timeout(timeout);
        if let Err(e) = c.send(args) {
            self.drop_conn();
            return (Call::Lost(e.to_string()), None, send);
        }
        sleep(Duration::from_millis(self.rng.below(15)));
        let queued = self.queued_now();
        // The client gives up on the first answer a while later, as a client-side timeout
        // would: others may queue meanwhile, behind the place that the retry takes over.
        if queued.is_some() {
            sleep(Duration::from_millis(self.rng.below(250)));
        }
        let retry_send = sh.now();
        let retried = queued.is_some()
            && self.side.as_mut().is_some_and(|s| {
                let _ = s.set_read_timeout(timeout);
                s.send(args).is_ok()
            });
        let first = match self.conn.as_mut() {
            Some(c) => c.read_reply(),
            None => return (Call::Lost("not connected".into()), None, send),
        };
        let first_ack = sh.now();
        let first = self.finish(first);
        if !retried {
            return (first, None, send);
        }
        sh.hist().op("retried wait");
        let earlier = match first {
            Call::Reply(Reply::Nil) => {
                sh.hist()
                    .op("retried wait: the earlier request answered nil");
                None
            }
            Call::Reply(Reply::Int(t)) => {
                sh.hist()
                    .op("retried wait: the earlier request granted before the retry");
                Some(t)
            }
            other => {
                // The first connection failed or errored: the retry is not followed further.
                self.side = None;
                return (other, None, send);
            }
        };
        // The retry takes the earlier request's place in the queue (SPEC Lock kinds): it waited
        // there since the earlier one was seen queued, unless the earlier one's nil may have
        // been its own timeout (then the retry is a new arrival, seen queued or not).
        let block_ms: u64 = args.last().and_then(|t| t.parse().ok()).unwrap_or(0);
        let replaced = block_ms == 0 || first_ack + EPS_US < send + block_ms * 1000;
        let queued = match earlier {
            None if replaced => queued,
            None => self.looks_queued(true),
            Some(_) => None,
        };
        let r = match self.side.as_mut() {
            Some(s) => s.read_reply(),
            None => return (Call::Lost("side connection gone".into()), None, retry_send),
        };
        let r = match r {
            Ok(r) => Call::Reply(r),
            Err(e) => {
                self.side = None;
                Call::Lost(e.to_string())
            }
        };
        let Some(t) = earlier else {
            return (r, queued, retry_send);
        };
        // The retry came from the holder of `t`: its token back while the lease ran (the
        // caller records the grant, acknowledged with the retry's answer), else (the lease
        // ended meanwhile) a new request's answer, and `t` is recorded here as a grant that ended.
        match r {
            Call::Reply(Reply::Int(t2)) if t2 == t => (Call::Reply(Reply::Int(t)), None, send),
            Call::Reply(Reply::Int(_) | Reply::Nil) => {
                let owner = args[2].clone();
                let ack = sh.now();
                let g = self.new_grant(k, &owner, t, kind, ttl_ms, send, first_ack, epoch);
                self.ended(g, retry_send, ack);
                (r, None, retry_send)
            }
            other => (other, None, retry_send),
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

    /// The ACQUIRE options of a grant of `kind` on key `k`.
    pub(crate) fn mode_args(&self, k: usize, kind: Kind) -> Vec<String> {
        match (kind, self.sh.kinds[k]) {
            (Kind::Shared, _) => vec!["SHARED".into()],
            (Kind::Permit, KeyKind::Semaphore(n)) => vec!["LIMIT".into(), n.to_string()],
            _ => Vec::new(),
        }
    }

    pub(crate) fn one_round(&mut self) {
        let sh = self.sh.clone();
        let k = self.rng.below(sh.keys as u64) as usize;
        let key = sh.lock_key(k);
        self.n += 1;
        let owner = format!("c{}-{}", self.id, self.n);
        let ttl_ms = self.rng.pick(&[40u64, 100, 100, 250, 600, 1500, 4000]);
        // Readers outnumber writers on a read/write key, as they do where such locks are used;
        // enough writers remain to meet the readers in the queue.
        let kind = match sh.kinds[k] {
            KeyKind::Exclusive => Kind::Exclusive,
            KeyKind::ReadWrite if self.rng.chance(65) => Kind::Shared,
            KeyKind::ReadWrite => Kind::Exclusive,
            KeyKind::Semaphore(_) => Kind::Permit,
        };
        let mode = self.rng.below(100);
        let mut args = vec![
            "FLOCK.ACQUIRE".to_string(),
            key.clone(),
            owner.clone(),
            ttl_ms.to_string(),
        ];
        args.extend(self.mode_args(k, kind));
        // BOUND on some acquires of every kind of key (not on a retried wait: its grant would be
        // bound to the side connection that retried).
        let bound = !(90..95).contains(&mode) && self.rng.chance(35);
        if bound {
            args.push("BOUND".into());
        }
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
        let mut send = sh.now();
        let first_send = send;
        let (r, queued_by) = if block.is_some() && mode >= 90 {
            let (r, q, s) = self.call_block_retried(&args, limit, k, kind, ttl_ms, epoch);
            send = s;
            (r, q)
        } else if block.is_some() {
            self.call_block(&args, limit)
        } else {
            (self.call(&args, limit), None)
        };
        let ack = sh.now();
        sh.hist().op(if block.is_some() {
            "acquire block"
        } else {
            "acquire"
        });
        let mut wait = block.map(|_| WaitRec {
            key: k,
            kind,
            send,
            retried: block.is_some() && mode >= 90,
            queued_by,
            granted: None,
            ack,
            waited_until: None,
            epoch,
        });
        match r {
            Call::Reply(Reply::Int(token)) => {
                if let Some(w) = wait.as_mut() {
                    w.granted = Some(token);
                    *sh.hist().waits.entry("granted").or_default() += 1;
                }
                if let Some(w) = wait.take() {
                    sh.hist().waiters.push(w);
                }
                let g = self.new_grant(k, &owner, token, kind, ttl_ms, send, ack, epoch);
                sh.hist().grants[g].queue_send = first_send;
                if bound {
                    sh.hist().grants[g].bound = Some((self.id, self.gen));
                    sh.hist().op("bound grant");
                }
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
                    if let Some(mut w) = wait.take() {
                        // The server starts the timeout when it reads the request, after `send`.
                        w.waited_until = Some((send + t * 1000).saturating_sub(EPS_US));
                        h.waiters.push(w);
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
        if let Some(c) = self.conn.as_mut() {
            if c.send(&args).is_ok() {
                sleep(Duration::from_millis(pause));
            }
        }
        self.drop_conn();
        self.sh.hist().op("waiter hung up");
    }

    #[allow(clippy::too_many_arguments)]
    pub(crate) fn new_grant(
        &mut self,
        k: usize,
        owner: &str,
        token: i64,
        kind: Kind,
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
            kind,
            ttl_us: ttl_ms * 1000,
            send,
            ack,
            queue_send: send,
            lower: send,
            upper: ack,
            proofs: vec![(send, ack)],
            proof_epochs: vec![if self.sh.epoch() == epoch {
                epoch
            } else {
                u64::MAX
            }],
            ends: Vec::new(),
            released: None,
            unsure: false,
            touched: send,
            failover_epoch: epoch,
            lost_in_failover: false,
            bound: None,
        });
        h.grants.len() - 1
    }

    /// A proof that grant `g` was live at some instant in (send, ack): it must not come after
    /// the lease ran out (G9).
    pub(crate) fn proof(&self, g: usize, send: u64, ack: u64, what: &str) {
        let epoch = match self.sh.epoch() {
            e if e == self.sent_epoch => e,
            _ => u64::MAX,
        };
        let mut h = self.sh.hist();
        let rec = &mut h.grants[g];
        rec.proofs.push((send, ack));
        rec.proof_epochs.push(epoch);
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

    /// Hold grant `g`; when it was BOUND and its connection was killed meanwhile, reconnect and
    /// carry on with it: every proof under its token must now be refused (G11).
    pub(crate) fn hold(&mut self, g: usize) {
        self.holding = g;
        let bound = self.sh.hist().grants[g].bound.is_some();
        self.set_slot_bound(bound);
        self.hold_steps(g);
        self.set_slot_bound(false);
        let g = self.holding;
        let Some((_, gen)) = self.sh.hist().grants[g].bound else {
            return;
        };
        // The client may see its connection fail before the injector has the kill's reply.
        if self.conn.is_none() && self.gen == gen && !self.was_killed(gen) {
            sleep(Duration::from_millis(30));
        }
        if self.sh.stop.load(SeqCst) || !self.was_killed(gen) {
            return;
        }
        if self.gen == gen {
            self.drop_conn();
        }
        self.after_kill(g);
    }

    /// The holder of bound grant `g`, whose connection was killed, carries on from a new
    /// connection: a FENCED write (or read), a CHECK and a RENEW under its token. Each reply is
    /// recorded as usual (an accepted one is a proof, which the checker flags when it was sent
    /// after the kill).
    fn after_kill(&mut self, g: usize) {
        let sh = self.sh.clone();
        sh.gate.checkpoint();
        if !self.connect() {
            return;
        }
        let (k, token, kind, owner, ttl_ms) = {
            let h = sh.hist();
            let r = &h.grants[g];
            (r.key, r.token, r.kind, r.owner.clone(), r.ttl_us / 1000)
        };
        let (key, log) = (sh.lock_key(k), sh.log_key(k));
        sh.hist().op("carry on after CLIENT KILL");
        let (_, outcome, _, _) = if kind == Kind::Shared {
            self.fenced_read(g, k, token, &key, &log)
        } else {
            self.fenced_write(g, k, token, &key, &log)
        };
        if outcome == Outcome::Unknown {
            return;
        }
        let timeout = Duration::from_secs(20);
        let send = sh.now();
        let r = self.call(
            &["FLOCK.CHECK".into(), key.clone(), token.to_string()],
            timeout,
        );
        let ack = sh.now();
        match r {
            Call::Reply(Reply::Int(ms)) if ms > 0 => self.proof(g, send, ack, "CHECK"),
            Call::Reply(Reply::Int(0)) => self.ended(g, send, ack),
            Call::Lost(_) => return,
            _ => {}
        }
        let send = sh.now();
        sh.hist().grants[g].touched = send;
        let r = self.call(
            &[
                "FLOCK.RENEW".into(),
                key,
                owner,
                ttl_ms.to_string(),
                token.to_string(),
            ],
            timeout,
        );
        let ack = sh.now();
        match r {
            Call::Reply(Reply::Int(t)) if t == token => self.extended(g, send, ack, "RENEW"),
            Call::Reply(Reply::Nil) => self.ended(g, send, ack),
            Call::Lost(_) => sh.hist().grants[g].unsure = true,
            _ => {}
        }
    }

    fn hold_steps(&mut self, mut g: usize) {
        let sh = self.sh.clone();
        let (k, owner, ttl_ms, mut kind) = {
            let h = sh.hist();
            (
                h.grants[g].key,
                h.grants[g].owner.clone(),
                h.grants[g].ttl_us / 1000,
                h.grants[g].kind,
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
                // a fenced write (a reader: a fenced read, and now and then a write that must
                // be refused), now and then after stalling past the lease
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
                    let ok = if kind != Kind::Shared || what < 8 {
                        self.fenced_write(g, k, token, &key, &log).0
                    } else {
                        self.fenced_read(g, k, token, &key, &log).0
                    };
                    if !ok {
                        return;
                    }
                }
                // every live grant of the key, at one instant
                45..=49 => {
                    if !self.holders(Some(g), k) {
                        return;
                    }
                }
                50..=59 => {
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
                // RENEW, half of the time naming the grant's token
                60..=74 => {
                    let send = sh.now();
                    sh.hist().grants[g].touched = send;
                    let mut args = vec![
                        "FLOCK.RENEW".into(),
                        key.clone(),
                        owner.clone(),
                        ttl_ms.to_string(),
                    ];
                    let with_token = what >= 67;
                    if with_token {
                        args.push(token.to_string());
                    }
                    let r = self.call(&args, timeout);
                    let ack = sh.now();
                    sh.hist().op(if with_token {
                        "renew with token"
                    } else {
                        "renew"
                    });
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
                            sh.hist()
                                .violation(format!("{args:?}: {r:?}, expected {token} or nil"));
                            return;
                        }
                    }
                }
                // the holder repeats its ACQUIRE in its mode (G4); a reader now and then asks
                // for the exclusive mode instead, which must be refused while its grant lives
                75..=79 => {
                    let epoch = sh.epoch();
                    let send = sh.now();
                    sh.hist().grants[g].touched = send;
                    let other_mode = kind == Kind::Shared && what == 79;
                    let mut args = vec![
                        "FLOCK.ACQUIRE".into(),
                        key.clone(),
                        owner.clone(),
                        ttl_ms.to_string(),
                    ];
                    let asked = if other_mode { Kind::Exclusive } else { kind };
                    args.extend(self.mode_args(k, asked));
                    // A bound grant is repeated with BOUND (else it would become unbound): the
                    // binding moves to this connection.
                    let bound = sh.hist().grants[g].bound.is_some();
                    if bound {
                        args.push("BOUND".into());
                    }
                    let r = self.call(&args, timeout);
                    let ack = sh.now();
                    sh.hist().op(if other_mode {
                        "repeat acquire in another mode"
                    } else {
                        "repeat acquire"
                    });
                    match r {
                        Call::Reply(Reply::Int(t)) if t == token && !other_mode => {
                            self.extended(g, send, ack, "repeated ACQUIRE");
                            if bound {
                                sh.hist().grants[g].bound = Some((self.id, self.gen));
                            }
                        }
                        Call::Reply(Reply::Int(t)) if t == token => {
                            sh.hist().violation(format!(
                                "{args:?}: the exclusive request got the owner's shared token \
                                 {t} back (no upgrade, SPEC Lock kinds)"
                            ));
                            return;
                        }
                        Call::Reply(Reply::Int(t)) => {
                            // The old lease had ended: a new grant, for the same owner.
                            self.ended(g, send, ack);
                            g = self.new_grant(k, &owner, t, asked, ttl_ms, send, ack, epoch);
                            if bound {
                                sh.hist().grants[g].bound = Some((self.id, self.gen));
                            }
                            self.holding = g;
                            kind = asked;
                        }
                        Call::Reply(Reply::Nil) => {
                            self.ended(g, send, ack);
                            return;
                        }
                        Call::Lost(_) => {
                            let mut h = sh.hist();
                            if !other_mode {
                                h.grants[g].upper = ack;
                            }
                            h.grants[g].unsure = true;
                            return;
                        }
                        Call::Reply(Reply::Err(e))
                            if other_mode && e.starts_with("ERR owner already holds a shared") =>
                        {
                            // The owner's own grant is checked first: it was live (a proof).
                            self.proof(g, send, ack, "ACQUIRE in another mode refused");
                        }
                        Call::Reply(Reply::Err(e)) => {
                            if !(e.starts_with("LOADING") || e.starts_with("READONLY")) {
                                sh.hist()
                                    .violation(format!("{args:?}: unexpected error {e}"));
                            }
                            return;
                        }
                        Call::Reply(r) => {
                            sh.hist()
                                .violation(format!("repeated ACQUIRE: unexpected reply {r:?}"));
                            return;
                        }
                    }
                }
                // an impostor tries to release and renew (G2); the owner itself names a token
                // that is not its grant's (token-qualified calls act on that grant only)
                80..=84 => {
                    let imp = format!("impostor-{}-{}", self.id, self.n);
                    // The impostor names the holder's token too: the token is no password.
                    let r1 = self.call(
                        &[
                            "FLOCK.RELEASE".into(),
                            key.clone(),
                            imp.clone(),
                            token.to_string(),
                        ],
                        timeout,
                    );
                    let r2 = self.call(
                        &["FLOCK.RENEW".into(), key.clone(), imp, "60000".into()],
                        timeout,
                    );
                    // Not a token of this owner: the latest grant of another owner on this key
                    // (on a shared or counted key most often live beside this one), else one
                    // below this grant's (this owner's other tokens are larger: a repeated
                    // ACQUIRE that granted anew).
                    let wrong = {
                        let h = sh.hist();
                        h.grants
                            .iter()
                            .rev()
                            .take(200)
                            .find(|o| o.key == k && o.owner != owner)
                            .map_or(token - 1, |o| o.token)
                    }
                    .to_string();
                    let r3 = self.call(
                        &[
                            "FLOCK.RELEASE".into(),
                            key.clone(),
                            owner.clone(),
                            wrong.clone(),
                        ],
                        timeout,
                    );
                    let r4 = self.call(
                        &[
                            "FLOCK.RENEW".into(),
                            key.clone(),
                            owner.clone(),
                            "60000".into(),
                            wrong,
                        ],
                        timeout,
                    );
                    let mut h = sh.hist();
                    h.op("impostor release+renew");
                    h.op("wrong-token release+renew");
                    for (what, r) in [
                        ("impostor RELEASE", &r1),
                        ("RELEASE with another token", &r3),
                    ] {
                        if let Call::Reply(r) = r {
                            if *r != Reply::Int(0) && !r.is_err() {
                                h.violation(format!("{what} of {key}: {r:?} (G2)"));
                            }
                        }
                    }
                    for (what, r) in [("impostor RENEW", &r2), ("RENEW with another token", &r4)] {
                        if let Call::Reply(r) = r {
                            if !r.is_nil() && !r.is_err() {
                                h.violation(format!("{what} of {key}: {r:?} (G2)"));
                            }
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
        let mut args = vec!["FLOCK.RELEASE".into(), key.clone(), owner.clone()];
        let with_token = self.rng.chance(50);
        if with_token {
            args.push(token.to_string());
        }
        let r = self.call(&args, timeout);
        let ack = sh.now();
        sh.hist().op(if with_token {
            "release with token"
        } else {
            "release"
        });
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
                    .violation(format!("{args:?}: unexpected reply {r:?}"));
                return;
            }
        }
        // A late FENCED (a write, or a reader's read) with the released token must be refused
        // (G5), unless a failover since lost the release.
        if self.rng.chance(30) {
            let released_at = ack;
            let (_, outcome, send, ack) = if kind == Kind::Shared {
                self.fenced_read(g, k, token, &key, &log)
            } else {
                self.fenced_write(g, k, token, &key, &log)
            };
            let mut h = sh.hist();
            h.op("fenced after release");
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

    /// FLOCK.HOLDERS of key `k`, recorded for the checker; a proof of grant `g` (the caller's)
    /// when it is listed. False when the connection failed.
    pub(crate) fn holders(&mut self, g: Option<usize>, k: usize) -> bool {
        let sh = self.sh.clone();
        let send = sh.now();
        let r = self.call(
            &["FLOCK.HOLDERS".into(), sh.lock_key(k)],
            Duration::from_secs(20),
        );
        let ack = sh.now();
        sh.hist().op("holders");
        match r {
            Call::Reply(Reply::Err(_)) => true,
            Call::Reply(r) => {
                match parse_holders(&r) {
                    Ok(list) => {
                        let mine = g.map(|g| sh.hist().grants[g].token);
                        if let Some(g) = g.filter(|_| list.iter().any(|e| Some(e.1) == mine)) {
                            self.proof(g, send, ack, "HOLDERS");
                        }
                        let epoch = match sh.epoch() {
                            e if e == self.sent_epoch => e,
                            _ => u64::MAX,
                        };
                        sh.hist().holders.push(HoldersRec {
                            key: k,
                            send,
                            ack,
                            grants: list,
                            epoch,
                        });
                    }
                    Err(e) => sh.hist().violation(e),
                }
                true
            }
            Call::Lost(_) => false,
        }
    }

    /// FLOCK.FENCED key token LINDEX log -1, a reader's read of the last entry: (accepted,
    /// outcome, send, ack).
    pub(crate) fn fenced_read(
        &mut self,
        g: usize,
        k: usize,
        token: i64,
        key: &str,
        log: &str,
    ) -> (bool, Outcome, u64, u64) {
        let sh = self.sh.clone();
        let epoch = sh.epoch();
        let send = sh.now();
        let r = self.call(
            &[
                "FLOCK.FENCED".into(),
                key.to_string(),
                token.to_string(),
                "LINDEX".into(),
                log.to_string(),
                "-1".into(),
            ],
            Duration::from_secs(20),
        );
        let ack = sh.now();
        let outcome = match &r {
            Call::Reply(r @ (Reply::Bulk(_) | Reply::Nil)) => {
                sh.hist().reads.push(ReadRec {
                    key: k,
                    token,
                    last: r.string(),
                    epoch: if sh.epoch() == epoch { epoch } else { u64::MAX },
                });
                self.proof(g, send, ack, "FENCED read");
                Outcome::Accepted
            }
            Call::Reply(Reply::Err(e)) if e.starts_with("FENCED") => {
                self.ended(g, send, ack);
                Outcome::Refused
            }
            Call::Reply(Reply::Err(_)) => Outcome::Refused,
            Call::Reply(other) => {
                sh.hist()
                    .violation(format!("FENCED LINDEX: unexpected reply {other:?}"));
                Outcome::Unknown
            }
            Call::Lost(_) => Outcome::Unknown,
        };
        sh.hist().op(match outcome {
            Outcome::Accepted => "fenced read accepted",
            Outcome::Refused => "fenced read refused",
            Outcome::Unknown => "fenced read unknown",
        });
        (outcome == Outcome::Accepted, outcome, send, ack)
    }

    /// FLOCK.FENCED key token RPUSH log tag: (the grant may live on, outcome, send, ack); the
    /// first is false when the write was refused as stale or the connection failed. With a shared grant's token it must be refused: as a
    /// read-only grant's while the grant lives (a proof), as stale after.
    pub(crate) fn fenced_write(
        &mut self,
        g: usize,
        k: usize,
        token: i64,
        key: &str,
        log: &str,
    ) -> (bool, Outcome, u64, u64) {
        let sh = self.sh.clone();
        let kind = sh.hist().grants[g].kind;
        self.seq += 1;
        let tag = format!("{token}:{}:{}", self.id, self.seq);
        let epoch = sh.epoch();
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
        let read_only = |e: &str| e.starts_with("ERR FLOCK.FENCED with a shared grant");
        let (outcome, ok) = match &r {
            Call::Reply(Reply::Int(_)) => (Outcome::Accepted, true),
            Call::Reply(Reply::Err(e)) if e.starts_with("FENCED") => (Outcome::Refused, true),
            Call::Reply(Reply::Err(e)) if read_only(e) => (Outcome::Refused, true),
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
            h.op(match (outcome, kind) {
                (Outcome::Accepted, Kind::Shared) => "fenced write under a shared token accepted",
                (_, Kind::Shared) => "fenced write under a shared token refused",
                (Outcome::Accepted, _) => "fenced write accepted",
                (Outcome::Refused, _) => "fenced write refused",
                (Outcome::Unknown, _) => "fenced write unknown",
            });
            if outcome == Outcome::Accepted && kind == Kind::Shared {
                h.violation(format!(
                    "FENCED RPUSH under the shared token {token} of {key} was accepted (G5)"
                ));
            }
            if let Call::Reply(Reply::Err(e)) = &r {
                if read_only(e) && kind != Kind::Shared {
                    h.violation(format!(
                        "FENCED RPUSH under the {} token {token} of {key}: {e}",
                        kind.name()
                    ));
                }
            }
            h.writes.push(WriteRec {
                key: k,
                token,
                tag,
                send,
                ack,
                outcome,
                lost_in_failover: false,
                kind,
                epoch: if sh.epoch() == epoch { epoch } else { u64::MAX },
            });
        }
        match (&r, outcome) {
            (_, Outcome::Accepted) => self.proof(g, send, ack, "FENCED write"),
            (Call::Reply(Reply::Err(e)), Outcome::Refused) if read_only(e) => {
                self.proof(g, send, ack, "FENCED refused as read-only")
            }
            (_, Outcome::Refused) if ok => self.ended(g, send, ack),
            _ => {}
        }
        let live = match &r {
            Call::Reply(Reply::Err(e)) => read_only(e),
            _ => outcome == Outcome::Accepted,
        };
        (live, outcome, send, ack)
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
        // First a look at the key's holders (for the checker, and an owner to revoke).
        let epoch = sh.epoch();
        let send = sh.now();
        let listed = c.call(&["FLOCK.HOLDERS", &key]);
        let ack = sh.now();
        let mut victim = None;
        match &listed {
            Ok(r) if !r.is_err() => match parse_holders(r) {
                Ok(list) => {
                    if !list.is_empty() {
                        victim = Some(list[rng.below(list.len() as u64) as usize].0.clone());
                    }
                    let mut h = sh.hist();
                    h.op("operator HOLDERS");
                    h.holders.push(HoldersRec {
                        key: k,
                        send,
                        ack,
                        grants: list,
                        epoch: if sh.epoch() == epoch { epoch } else { u64::MAX },
                    });
                }
                Err(e) => sh.hist().violation(e),
            },
            Ok(_) => {}
            Err(_) => {
                conn = None;
                continue;
            }
        }
        let Some(c) = conn.as_mut() else { continue };
        if let Ok(r) = c.call(&["FLOCK.INFO", &key]) {
            if !r.is_nil() && !r.is_err() {
                check_info(&sh, k, &r);
            }
        }
        let pick = rng.below(100);
        // REVOKE key, REVOKE key owner (a holder just listed), DEL.
        let (name, owner, args): (&'static str, Option<String>, Vec<String>) = match pick {
            0..=39 => (
                "operator REVOKE",
                None,
                vec!["FLOCK.REVOKE".into(), key.clone()],
            ),
            40..=69 => {
                let o = victim.unwrap_or_else(|| "nobody".into());
                (
                    "operator REVOKE owner",
                    Some(o.clone()),
                    vec!["FLOCK.REVOKE".into(), key.clone(), o],
                )
            }
            _ => ("operator DEL", None, vec!["DEL".into(), key.clone()]),
        };
        let send = sh.now();
        let r = c.call(&args);
        let done = sh.now();
        let mut h = sh.hist();
        h.op(name);
        let one_owner = owner.is_some();
        h.operator.push(OperatorOp {
            key: k,
            owner,
            send,
            done,
        });
        // REVOKE's reply is the number of grants it ended: at most one per owner, at most the
        // key's limit, and at most one client's grant each (a client holds one grant at once).
        let most = if one_owner || name == "operator DEL" {
            1
        } else {
            sh.kinds[k].limit().min(sh.workers) as i64
        };
        match r {
            Ok(Reply::Int(n)) if (0..=most).contains(&n) => {}
            Ok(Reply::Err(e)) if e.starts_with("LOADING") || e.starts_with("READONLY") => {
                conn = None
            }
            Ok(other) => h.violation(format!(
                "{args:?}: unexpected reply {other:?} (at most {most} grants can end)"
            )),
            Err(_) => conn = None,
        }
    }
}

/// One FLOCK.INFO reply of key `k` (one instant) agrees with the key's use: `mode` one of those
/// its requests can make, `holders` within the limit (one for an exclusive grant, none for
/// `none`), `limit` that of its requests (a semaphore's n, else 0), `owner` only when exclusive.
fn check_info(sh: &Shared, k: usize, r: &Reply) {
    let key = sh.lock_key(k);
    let mut h = sh.hist();
    h.op("operator INFO");
    let Some(pairs) = r.pairs() else {
        h.violation(format!("FLOCK.INFO {key}: not a map: {r:?}"));
        return;
    };
    let get = |name: &str| {
        pairs
            .iter()
            .find(|(f, _)| f.string().as_deref() == Some(name))
            .map(|(_, v)| v.clone())
    };
    let int = |name: &str| get(name).and_then(|v| v.int());
    let (mode, holders, limit) = (
        get("mode").and_then(|m| m.string()),
        int("holders"),
        int("limit"),
    );
    let kind = sh.kinds[k];
    let (modes, want_limit): (&[&str], i64) = match kind {
        KeyKind::Exclusive => (&["exclusive", "none"], 0),
        KeyKind::ReadWrite => (&["exclusive", "shared", "none"], 0),
        KeyKind::Semaphore(n) => (&["permits", "none"], n as i64),
    };
    let owner_set = get("owner").is_some_and(|o| !o.is_nil());
    let ok = match (mode.as_deref(), holders, limit) {
        (Some(m), Some(n), Some(l)) if modes.contains(&m) && l == want_limit => match m {
            "exclusive" => n == 1 && owner_set,
            "none" => n == 0 && !owner_set,
            _ => n >= 1 && n as usize <= kind.limit() && !owner_set,
        },
        _ => false,
    };
    *h.checks
        .entry("INFO mode/holders/limit checked")
        .or_default() += 1;
    if !ok {
        h.violation(format!(
            "FLOCK.INFO {key} ({}): {r:?} (mode one of {modes:?}, holders within the limit, \
             limit {want_limit})",
            kind.name()
        ));
    }
}
