//! The clients of the chaos run: each loops over random lock operations on real connections
//! and records what it sent and what came back; and the operator, who REVOKEs and DELs lock
//! keys at random. This file: a client's connections and how it sends a call and reads the
//! answer; `clients/round.rs` one round of random operations, `clients/hold.rs` what a
//! holder does with its grant, `clients/durable.rs` the durable clients' pipelined WAIT,
//! `clients/operator.rs` the operator, `clients/watch.rs` the watchers (FLOCK.WATCH) and
//! `clients/multi.rs` the MACQUIRE clients.

use crate::history::*;
use crate::EPS_US;
use flock_testkit::*;
use std::sync::atomic::Ordering::SeqCst;
use std::sync::Arc;
use std::thread::sleep;
use std::time::Duration;

mod durable;
mod hold;
mod multi;
mod operator;
mod round;
#[cfg(test)]
mod selftest_stop;
mod watch;

pub(crate) use operator::operator;
pub(crate) use watch::watcher;

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
    /// A durable client: plain acquires only (no BLOCK, no BOUND, as rule 10 has it), each
    /// ACQUIRE and RENEW followed by `WAIT 1` on the same connection (clients/durable.rs).
    pub(crate) durable: bool,
}

/// A client whose thread ends at the run's stop closes its connection here, and records it:
/// the watchers still running then may be told "closed" for its bound grants.
impl Drop for Client {
    fn drop(&mut self) {
        self.drop_conn();
    }
}

pub(crate) enum Call {
    Reply(Reply),
    /// The connection failed (server killed, read timeout): the outcome is unknown.
    Lost(String),
}

impl Client {
    /// Client `id` (its slot in `sh`'s connections), not connected yet.
    pub(crate) fn new(id: usize, sh: Arc<Shared>, rng: Rng, durable: bool) -> Client {
        Client {
            id,
            sh,
            rng,
            conn: None,
            conn_id: None,
            side: None,
            side_id: None,
            sent_epoch: 0,
            n: 0,
            seq: 0,
            gen: 0,
            holding: 0,
            durable,
        }
    }

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
    /// it may have closed. The moment is read before the socket closes: read after, the server
    /// could already have ended a bound grant (and told a watcher "closed") before it.
    pub(crate) fn drop_conn(&mut self) {
        let Some(conn) = self.conn.take() else {
            return;
        };
        let now = self.sh.now();
        self.sh
            .hist()
            .closed
            .entry((self.id, self.gen))
            .or_insert(now);
        drop(conn);
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
}
