//! What a holder does with its grant: CHECK, HOLDERS, FENCED writes and reads, RENEW, repeated
//! ACQUIRE, impostors, stalls past the lease, release or abandon; and a bound grant's holder
//! carrying on after its connection was killed.

use super::*;

impl Client {
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
                    let (r, acked) = if self.durable {
                        self.call_durable(&args, timeout)
                    } else {
                        (self.call(&args, timeout), None)
                    };
                    let ack = sh.now();
                    sh.hist().op(if with_token {
                        "renew with token"
                    } else {
                        "renew"
                    });
                    match r {
                        Call::Reply(Reply::Int(t)) if t == token => {
                            self.extended(g, send, ack, "RENEW");
                            // The replica has the extension too: a failover keeps the lease
                            // at least this long.
                            if acked.unwrap_or(0) >= 1 {
                                sh.hist().grants[g].durable_lower = send;
                            }
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
