//! The MACQUIRE clients: each round takes 2 or 3 of the keys that share one hash tag
//! (`Shared::with_multi_keys`), named in a random order, with FLOCK.MACQUIRE (most often with
//! BLOCK, a third of the time BOUND), records how it ended (history/coord.rs `MultiRec`: the checker
//! wants every BLOCK to finish, which it cannot in a deadlock), and holds each grant as any
//! client holds one (FENCED writes, CHECK, RENEW, release or abandon): the checker's per-key
//! checks (G1 and the rest) see them beside the single-key clients' grants of the same keys.

use super::*;
use crate::history::coord::*;

impl Client {
    pub(crate) fn run_multi(&mut self) {
        while !self.sh.stop.load(SeqCst) {
            self.sh.gate.checkpoint();
            if !self.connect() {
                continue;
            }
            self.multi_round();
        }
    }

    fn multi_round(&mut self) {
        let sh = self.sh.clone();
        let mut pool: Vec<usize> = (sh.multi_from..sh.keys).collect();
        let n = (2 + self.rng.below(2) as usize).min(pool.len());
        let mut keys = Vec::with_capacity(n);
        for _ in 0..n {
            keys.push(pool.remove(self.rng.below(pool.len() as u64) as usize));
        }
        self.n += 1;
        let owner = format!("m{}-{}", self.id, self.n);
        let ttl_ms = self.rng.pick(&[100u64, 250, 600, 1500]);
        let mut args = vec!["FLOCK.MACQUIRE".to_string(), n.to_string()];
        args.extend(keys.iter().map(|&k| sh.lock_key(k)));
        args.push(owner.clone());
        args.push(ttl_ms.to_string());
        let bound = self.rng.chance(30);
        if bound {
            args.push("BOUND".into());
        }
        let block = self
            .rng
            .chance(75)
            .then(|| self.rng.pick(&[50u64, 300, 1000, 3000]));
        if let Some(t) = block {
            args.push("BLOCK".into());
            args.push(t.to_string());
        }
        let limit = Duration::from_millis(block.unwrap_or(0) + 10_000);
        let epoch = sh.epoch();
        let send = sh.now();
        sh.multi_in_flight.fetch_add(1, SeqCst);
        let r = self.call(&args, limit);
        sh.multi_in_flight.fetch_sub(1, SeqCst);
        let ack = sh.now();
        let end = match r {
            Call::Reply(Reply::Array(a)) => {
                let tokens: Vec<i64> = a.iter().filter_map(Reply::int).collect();
                if tokens.len() == a.len() {
                    MultiEnd::Granted(tokens)
                } else {
                    MultiEnd::Error(format!("not an array of tokens: {a:?}"))
                }
            }
            Call::Reply(Reply::Nil) => MultiEnd::Nil,
            Call::Reply(Reply::Err(e)) => MultiEnd::Error(e),
            Call::Reply(other) => MultiEnd::Error(format!("unexpected reply {other:?}")),
            Call::Lost(e) => {
                if e.contains("timed out") || e.contains("WouldBlock") || e.contains("temporarily")
                {
                    MultiEnd::Hung
                } else {
                    MultiEnd::Lost
                }
            }
        };
        {
            let mut h = sh.hist();
            h.op(match (&end, block.is_some()) {
                (MultiEnd::Granted(_), true) => "macquire block granted",
                (MultiEnd::Granted(_), false) => "macquire granted",
                (MultiEnd::Nil, true) => "macquire block timed out",
                (MultiEnd::Nil, false) => "macquire refused (nil)",
                (MultiEnd::Error(_), _) => "macquire error",
                (MultiEnd::Lost, _) => "macquire connection lost",
                (MultiEnd::Hung, _) => "macquire hung",
            });
            h.multis.push(MultiRec {
                client: self.id,
                keys: keys.clone(),
                block,
                send,
                ack,
                end: end.clone(),
            });
        }
        let MultiEnd::Granted(tokens) = end else {
            return;
        };
        if tokens.len() != keys.len() {
            return; // flagged by the checker
        }
        let mut held = Vec::with_capacity(n);
        for (&k, &t) in keys.iter().zip(&tokens) {
            let g = self.new_grant(k, &owner, t, Kind::Exclusive, ttl_ms, send, ack, epoch);
            if bound {
                sh.hist().grants[g].bound = Some((self.id, self.gen));
            }
            held.push(g);
        }
        if bound {
            sh.hist().op("bound grant");
        }
        // Each grant is held on its own, in another random order.
        while !held.is_empty() {
            let g = held.remove(self.rng.below(held.len() as u64) as usize);
            if sh.stop.load(SeqCst) {
                return;
            }
            self.hold(g);
        }
    }
}
