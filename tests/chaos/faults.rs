//! The fault driver: stalls the server, rewrites the AOF, changes the lock-delay, kills the
//! master and restarts it from its AOF, kills it and promotes the replica; and the snapshots
//! of the lock keys it takes around a kill to check durability.

use crate::checker::check_durable_survivors;
use crate::history::*;
use flock_testkit::*;
use std::collections::HashMap;
use std::sync::atomic::Ordering::SeqCst;
use std::sync::Arc;
use std::thread::sleep;
use std::time::{Duration, Instant};

mod clock;
pub(crate) use clock::chaos_servers;

pub(crate) fn aof_server() -> Server {
    Server::builder()
        .arg("appendonly", "yes")
        .arg("appendfsync", "always")
        .start()
}

pub(crate) fn raw_call(port: u16, args: &[&str]) -> Result<Reply, String> {
    let mut c = RawConn::connect(port).map_err(|e| e.to_string())?;
    c.set_read_timeout(Duration::from_secs(30))
        .map_err(|e| e.to_string())?;
    c.call(args).map_err(|e| e.to_string())
}

pub(crate) fn info_of(port: u16, section: &str, field: &str) -> Option<String> {
    info_field(&mut RawConn::connect(port).ok()?, section, field)
}

pub(crate) fn replica_linked(replica: &Server, master: &Server) -> bool {
    info_of(replica.port(), "replication", "master_link_status").as_deref() == Some("up")
        && info_of(master.port(), "replication", "connected_slaves")
            .and_then(|v| v.parse::<i64>().ok())
            .unwrap_or(0)
            >= 1
}

pub(crate) struct Injector {
    pub(crate) sh: Arc<Shared>,
    pub(crate) servers: Vec<Server>,
    pub(crate) master: usize,
    pub(crate) rng: Rng,
    /// Each server's libfaketime clock file (faults/clock.rs); empty when the servers run on
    /// the real clock (Debian's redis-server does not run under libfaketime).
    pub(crate) clocks: Vec<std::path::PathBuf>,
}

impl Injector {
    pub(crate) fn master_port(&self) -> u16 {
        self.servers[self.master].port()
    }

    pub(crate) fn replica(&self) -> usize {
        1 - self.master
    }

    pub(crate) fn fault(&self, name: &'static str) {
        *self.sh.hist().faults.entry(name).or_default() += 1;
        eprintln!(
            "[{:>7.2}s] fault: {name}",
            self.sh.t0.elapsed().as_secs_f64()
        );
    }

    pub(crate) fn check(&self, name: &'static str, n: u64) {
        *self.sh.hist().checks.entry(name).or_default() += n;
    }

    pub(crate) fn set_lock_delay(&self, ms: u64) {
        self.delay_unknown();
        let mut on_master = false;
        for (i, s) in self.servers.iter().enumerate() {
            let r = raw_call(
                s.port(),
                &["CONFIG", "SET", "flock.lock-delay-ms", &ms.to_string()],
            );
            on_master |= i == self.master && matches!(r, Ok(Reply::Status(_)));
        }
        if on_master {
            let now = self.sh.now();
            self.sh.hist().lock_delay.push((now, Some(ms)));
        }
    }

    /// From now on the master's lock-delay is not known (a CONFIG SET on its way, a kill).
    pub(crate) fn delay_unknown(&self) {
        let now = self.sh.now();
        self.sh.hist().lock_delay.push((now, None));
    }

    /// Pause clients and operator; wait until all of them have parked.
    pub(crate) fn pause_all(&self) {
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

    pub(crate) fn attach_replica(&mut self) {
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
    pub(crate) fn compare_digests(&self) {
        let (m, r) = (self.master_port(), self.servers[self.replica()].port());
        if !replica_linked(&self.servers[self.replica()], &self.servers[self.master]) {
            return;
        }
        // A waiting MACQUIRE's headed free key exists on the master alone (SPEC MACQUIRE).
        let mut multi_waited = false;
        for _ in 0..40 {
            multi_waited |= self.sh.multi_in_flight.load(SeqCst) > 0;
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
        if multi_waited {
            self.check("G7 digests not compared: a MACQUIRE waited", 1);
            return;
        }
        self.sh
            .hist()
            .violation("master and replica digests still differ after 40 tries (G7)".into());
    }

    /// Grants that must be live now: acknowledged before `cut`, not ended, released, revoked,
    /// deleted or replaced since, and whose lease runs at least another 100 ms.
    pub(crate) fn expected_live(&self, h: &History, cut: u64, now: u64) -> Vec<usize> {
        let mut out = Vec::new();
        for (i, g) in h.grants.iter().enumerate() {
            if g.ack >= cut
                || g.bound.is_some()
                || g.touched >= cut
                || g.released.is_some()
                || g.unsure
                || g.lost_in_failover
                || !g.ends.is_empty()
                || g.lower + g.ttl_us < now + 100_000
            {
                continue;
            }
            let touched = h.operator.iter().any(|o| o.may_end(g) && o.done > g.send);
            // A later grant that cannot live beside this one means this one ended.
            let replaced = h.grants.iter().any(|o| {
                o.key == g.key
                    && o.token != g.token
                    && o.ack > g.send
                    && (o.kind == Kind::Exclusive || g.kind == Kind::Exclusive)
            });
            if !touched && !replaced {
                out.push(i);
            }
        }
        out
    }

    /// What the server holds right after a restart or a promotion, before any client is let
    /// back in: each lock key's live grants (FLOCK.HOLDERS) and each key's log.
    pub(crate) fn snapshot(&self) -> Option<Snapshot> {
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
            let r = c.call(&["FLOCK.HOLDERS", &self.sh.lock_key(k)]);
            let list = match r.as_ref().map(parse_holders) {
                Ok(Ok(list)) => list.into_iter().map(|(o, t, _)| (o, t)).collect(),
                Ok(Err(e)) => {
                    self.sh.hist().violation(e);
                    Vec::new()
                }
                Err(_) => Vec::new(),
            };
            holders.insert(k, list);
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
    pub(crate) fn verify_survivors(&self, snap: &Snapshot, cut: u64, lossless: bool) {
        let mut h = self.sh.hist();
        // G11: a bound grant has no binding on a restarted or promoted master: none is listed
        // live (it ended with the connections at the kill).
        let mut gone = 0u64;
        let mut listed = Vec::new();
        // Those that may have been live at the kill (not released, lease not surely over).
        let may_be_live = |g: &&GrantRec| {
            g.bound.is_some()
                && g.ack < cut
                && g.released.is_none()
                && g.ends.is_empty()
                && g.upper + g.ttl_us > cut
        };
        for g in h.grants.iter().filter(may_be_live) {
            if snap.holders[&g.key]
                .iter()
                .any(|(o, t)| *o == g.owner && *t == g.token)
            {
                listed.push(format!(
                    "bound grant {} of {} (owner {}) still listed by FLOCK.HOLDERS after the \
                     master was killed (G11)",
                    g.token,
                    self.sh.lock_key(g.key),
                    g.owner
                ));
            } else {
                gone += 1;
            }
        }
        for x in listed {
            h.violation(x);
        }
        *h.checks
            .entry("G11 bound grants live at a kill -9 or failover, gone after it")
            .or_default() += gone;
        // Durable grants: the replica acknowledged them, so no failover may lose one.
        if !lossless {
            check_durable_survivors(&self.sh, &mut h, &snap.holders, cut, snap.at);
        }
        let live = self.expected_live(&h, cut, snap.at);
        let (mut kept, mut lost) = (0u64, 0u64);
        for i in live {
            let g = h.grants[i].clone();
            let info = &snap.holders[&g.key];
            let same = info.iter().any(|(o, t)| *o == g.owner && *t == g.token);
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
        if !lossless {
            // What the old master acknowledged between the cut and its death ran there (sent
            // before the epoch moved on): lost too when the new master does not have it, or a
            // later kill -9 would count it against the new master's AOF.
            let epoch = self.sh.epoch();
            for w in h.writes.iter_mut() {
                if w.outcome == Outcome::Accepted
                    && w.ack >= cut
                    && w.epoch != epoch
                    && !w.lost_in_failover
                    && !snap.logs[&w.key].contains(&w.tag)
                {
                    w_lost += 1;
                    w.lost_in_failover = true;
                }
            }
            for i in 0..h.grants.len() {
                let g = &h.grants[i];
                let there = snap.holders[&g.key]
                    .iter()
                    .any(|(o, t)| *o == g.owner && *t == g.token);
                if g.ack >= cut && g.failover_epoch != epoch && !g.lost_in_failover && !there {
                    h.grants[i].lost_in_failover = true;
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

    /// Every connection to the master closes now (kill -9, failover): bound grants end, and the
    /// injector forgets the clients' connection ids (a new process reuses them).
    fn connections_reset(&self) {
        let now = self.sh.now();
        self.sh.hist().resets.push(now);
        for s in self.sh.conns().iter_mut() {
            s.id = None;
        }
    }

    /// CLIENT KILL ID of one client's lock connection, most often one that holds a BOUND grant
    /// now. The client finds out at its next call, reconnects and carries on; the checker treats
    /// that connection's bound grants as ended by the kill's reply (G11).
    pub(crate) fn kill_client(&mut self) {
        let port = self.master_port();
        let slots: Vec<(usize, ConnSlot)> = self
            .sh
            .conns()
            .iter()
            .copied()
            .enumerate()
            .filter(|(_, s)| s.id.is_some() && s.port == port)
            .collect();
        let holding: Vec<&(usize, ConnSlot)> = slots.iter().filter(|(_, s)| s.bound).collect();
        let (client, slot) = if !holding.is_empty() && self.rng.chance(85) {
            *holding[self.rng.below(holding.len() as u64) as usize]
        } else if !slots.is_empty() {
            slots[self.rng.below(slots.len() as u64) as usize]
        } else {
            return;
        };
        let Some(id) = slot.id else { return };
        let mut c = match RawConn::connect(port) {
            Ok(c) => c,
            Err(_) => return,
        };
        let _ = c.set_read_timeout(Duration::from_secs(30));
        let send = self.sh.now();
        {
            // The connection may close from now on.
            let mut h = self.sh.hist();
            h.closed.entry((client, slot.gen)).or_insert(send);
        }
        let r = c.call(&["CLIENT", "KILL", "ID", &id.to_string()]);
        let ack = self.sh.now();
        if matches!(r, Ok(Reply::Int(1))) {
            self.fault("CLIENT KILL ID of a client's lock connection");
            self.sh.hist().kills.push(KillRec {
                client,
                gen: slot.gen,
                conn_id: id,
                send,
                ack,
            });
        } else {
            // Not killed (already gone): it did not close because of this kill.
            let mut h = self.sh.hist();
            if h.closed.get(&(client, slot.gen)) == Some(&send) {
                h.closed.remove(&(client, slot.gen));
            }
        }
    }

    pub(crate) fn kill_and_restart(&mut self) {
        self.fault("kill -9 master, restart from AOF");
        self.delay_unknown();
        self.connections_reset();
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
    /// With `behind` (lagging too) the replica's clock is set a day back first, and the clients
    /// get a while on it as the master before its clock is set right (faults/clock.rs).
    pub(crate) fn failover(&mut self, lagging: bool, behind: bool) {
        let r = self.replica();
        if !replica_linked(&self.servers[r], &self.servers[self.master]) {
            return;
        }
        self.compare_digests();
        if behind {
            self.fault("kill -9 master, promote a replica a day behind that missed writes");
            if !self.clock_back(r) {
                return;
            }
        }
        if lagging {
            if !behind {
                self.fault("kill -9 master, promote a replica that missed writes");
            }
            self.servers[r].signal("STOP");
            let _ = raw_call(self.master_port(), &["CLIENT", "KILL", "TYPE", "replica"]);
            sleep(Duration::from_millis(300 + self.rng.below(700)));
        } else {
            self.fault("kill -9 master, promote replica");
        }
        self.delay_unknown();
        self.connections_reset();
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
        // The epoch first: whatever runs on the new master was sent in the new epoch.
        self.sh.failover_epoch.fetch_add(1, SeqCst);
        self.sh.port.store(rp, SeqCst);
        let snap = self.snapshot();
        self.pause_all();
        if let Some(snap) = snap {
            self.verify_survivors(&snap, cut, false);
        }
        if behind {
            self.skew_begins();
        }
        self.sh.gate.resume();
        // The old master comes back from its own AOF and follows the new one.
        self.servers[old].start_again();
        self.attach_replica();
        if behind {
            sleep(Duration::from_millis(1500 + self.rng.below(1500)));
            self.skew_ends();
        }
    }

    pub(crate) fn run(&mut self, until: Instant) {
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
            "client kill",
            "lagging failover",
            "client kill",
            "digest",
            "client kill",
            "failover a day behind",
        ];
        // Without libfaketime (the real clock) that last fault is a lagging failover.
        let behind = !self.clocks.is_empty();
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
                "client kill" => {
                    // A few kills in a row, a moment apart.
                    for _ in 0..2 + self.rng.below(4) {
                        self.kill_client();
                        sleep(Duration::from_millis(self.rng.below(200)));
                    }
                }
                "failover" => self.failover(false, false),
                "lagging failover" => self.failover(true, false),
                "failover a day behind" => self.failover(true, behind),
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

pub(crate) struct Snapshot {
    pub(crate) at: u64,
    /// (owner, token) of every live grant of each key.
    pub(crate) holders: HashMap<usize, Vec<(String, i64)>>,
    pub(crate) logs: HashMap<usize, std::collections::HashSet<String>>,
}
