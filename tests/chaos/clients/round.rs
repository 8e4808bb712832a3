//! A client's rounds: pick a key and a kind, acquire (plain, BLOCK, retried, hung up), and
//! record grants, proofs, extensions and ends for the checker.

use super::*;

impl Client {
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
        // A durable client takes plain leases only: rule 10 refuses BOUND with replicas=n,
        // and a BLOCK grant's WAIT would follow the RENEW that the clients send after it.
        let mode = if self.durable { mode % 60 } else { mode };
        let bound = !self.durable && !(90..95).contains(&mode) && self.rng.chance(35);
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
        let mut durable_acks = None;
        let (r, queued_by) = if block.is_some() && mode >= 90 {
            let (r, q, s) = self.call_block_retried(&args, limit, k, kind, ttl_ms, epoch);
            send = s;
            (r, q)
        } else if block.is_some() {
            self.call_block(&args, limit)
        } else if self.durable {
            let (r, acked) = self.call_durable(&args, limit);
            durable_acks = acked;
            (r, None)
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
                if self.durable {
                    if durable_acks.unwrap_or(0) < 1 {
                        return self.release_not_durable(g);
                    }
                    sh.hist().op("durable grant (WAIT 1 answered 1)");
                    sh.hist().grants[g].durable = true;
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
            durable: false,
            durable_lower: send,
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
}
