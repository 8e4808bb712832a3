//! Rule 9 of docs/CLIENTS.md: a loss heard from the server, not found at the next renewal.
//!
//! One *lane* per server node (per slot in a cluster: WATCH takes keys of one slot), and one
//! more per further 64 leases (WATCH's most pairs), runs one `FLOCK.WATCH` naming the
//! `(key, token)` of every live lease of the lane, on a connection of its own (rule 8: nothing
//! else queues behind it). Its reply names the grant that ended and how; the lease is marked
//! lost at once with that reason. When a lease joins a lane whose WATCH is waiting, the WATCH
//! is ended with `CLIENT UNBLOCK` (its nil reply changes nothing) and sent again with the new
//! set; joining is deferred by `ARM_DELAY` so that a lease released within it costs no round
//! trip (a WATCH that names a grant already over answers `gone` at once, so nothing is
//! missed). A lease's own release needs nothing: its `released` event is expected and
//! ignored, and the WATCH is sent again without it. Leases are held weakly: the watcher never
//! keeps a forgotten lease alive.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use redis::Value;
use tokio::sync::Notify;
use tokio::time::Instant;

use crate::connection::{Conn, Shared, Target};
use crate::error::LossReason;
use crate::retry::{backoff, is_connection_error};
use crate::state::State;
use crate::sync::lock;

/// WATCH's most key/token pairs.
pub(crate) const MAX_PAIRS: usize = 64;
/// How long a new lease waits before it joins the WATCH (see above).
const ARM_DELAY: Duration = Duration::from_millis(5);
/// A WATCH's own timeout: it is sent again after this long even when nothing changed, so that
/// a watching connection that died without a word is found.
const WATCH_TIMEOUT_MS: u64 = 15_000;
/// A lane with nothing to watch closes its connection and ends after this long.
const IDLE: Duration = Duration::from_secs(2);
/// How often, and how long apart, CLIENT UNBLOCK is tried while the WATCH it must end has not
/// reached the server yet.
const UNBLOCK_TRIES: u32 = 200;
const UNBLOCK_PAUSE: Duration = Duration::from_millis(2);

type Pair = (String, u64);

/// The key slot of a cluster (CRC16/XMODEM of the key or its `{hash tag}`, mod 16384).
pub(crate) fn slot_of(key: &str) -> u16 {
    let b = key.as_bytes();
    let tagged = b.iter().position(|&c| c == b'{').and_then(|open| {
        let rest = &b[open + 1..];
        rest.iter()
            .position(|&c| c == b'}')
            .filter(|&close| close > 0)
            .map(|close| &rest[..close])
    });
    let mut crc: u16 = 0;
    for &byte in tagged.unwrap_or(b) {
        crc ^= u16::from(byte) << 8;
        for _ in 0..8 {
            crc = if crc & 0x8000 != 0 {
                (crc << 1) ^ 0x1021
            } else {
                crc << 1
            };
        }
    }
    crc % 16384
}

#[derive(Default)]
struct LaneState {
    /// Every live lease of the lane, watched or about to be, and when it is due to join the
    /// WATCH (ARM_DELAY after its grant).
    leases: HashMap<Pair, (Weak<State>, Instant)>,
    running: bool,
    /// The lane waits with nothing to watch and no lease due: a new lease must wake it.
    idle: bool,
    /// Whether a task is on its way to re-arm the WATCH.
    arming: bool,
    /// The pairs the WATCH under way names; `None` between WATCHes.
    in_flight: Option<HashSet<Pair>>,
    /// The watching connection's CLIENT ID (for CLIENT UNBLOCK).
    client_id: Option<i64>,
}

struct Lane {
    /// The cluster slot of its keys; `None` outside a cluster.
    slot: Option<u16>,
    st: Mutex<LaneState>,
    wake: Notify,
}

/// A `Flock`'s watching lanes.
pub(crate) struct Watcher {
    shared: Arc<Shared>,
    lanes: Mutex<HashMap<Option<u16>, Vec<Arc<Lane>>>>,
    /// Why watching stopped for good (a server without FLOCK.WATCH, an ACL): renewals find
    /// losses then, as before rule 9.
    disabled: Mutex<Option<String>>,
}

impl Watcher {
    pub(crate) fn new(shared: Arc<Shared>) -> Self {
        Watcher {
            shared,
            lanes: Mutex::new(HashMap::new()),
            disabled: Mutex::new(None),
        }
    }

    /// Why watching is off, if it is.
    pub(crate) fn disabled(&self) -> Option<String> {
        lock(&self.disabled).clone()
    }

    /// The watching connections open or opening (one per running lane).
    pub(crate) fn lanes_running(&self) -> usize {
        lock(&self.lanes)
            .values()
            .flatten()
            .filter(|l| lock(&l.st).running)
            .count()
    }

    /// Watch a new lease (rule 9).
    pub(crate) fn add(self: &Arc<Self>, st: &Arc<State>) {
        if lock(&self.disabled).is_some() {
            return;
        }
        let Ok(rt) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let slot = match self.shared.target {
            Target::Cluster(_) => Some(slot_of(&st.key)),
            Target::Single(_) => None,
        };
        let lane = {
            let mut lanes = lock(&self.lanes);
            let list = lanes.entry(slot).or_default();
            // A full lane may hold leases released since it last looked (a lane forgets them
            // only when it wakes): those do not count, or a burst of short locks would start
            // lanes for nothing.
            let has_room = |l: &&Arc<Lane>| {
                let mut s = lock(&l.st);
                if s.leases.len() >= MAX_PAIRS {
                    s.leases
                        .retain(|_, (w, _)| w.upgrade().is_some_and(|st| !ended(&st)));
                }
                s.leases.len() < MAX_PAIRS
            };
            match list.iter().find(has_room) {
                Some(l) => l.clone(),
                None => {
                    let l = Arc::new(Lane {
                        slot,
                        st: Mutex::new(LaneState::default()),
                        wake: Notify::new(),
                    });
                    list.push(l.clone());
                    l
                }
            }
        };
        let (start, arm, wake) = {
            let mut s = lock(&lane.st);
            s.leases.insert(
                (st.key.clone(), st.token),
                (Arc::downgrade(st), Instant::now() + ARM_DELAY),
            );
            if !s.running {
                s.running = true;
                (true, false, false)
            } else if s.in_flight.is_some() {
                let arm = !s.arming;
                s.arming = true;
                (false, arm, false)
            } else {
                // Between WATCHes or waiting for an earlier lease to be due: the lane looks
                // at the new one by itself; only an idle lane needs waking.
                let wake = s.idle;
                s.idle = false;
                (false, false, wake)
            }
        };
        if start {
            rt.spawn(run(self.clone(), lane));
        } else if arm {
            rt.spawn(rearm(self.shared.clone(), lane));
        } else if wake {
            lane.wake.notify_one();
        }
    }
}

/// Released, or marked lost: no longer watched.
fn ended(st: &State) -> bool {
    st.is_released() || *st.lost.borrow()
}

/// The live leases of a lane that are due to be watched, at most MAX_PAIRS, and when the
/// next one not yet due will be (the ended leases are forgotten). A lease released within
/// ARM_DELAY of its grant never costs a WATCH.
fn live(s: &mut LaneState) -> (Vec<Pair>, Option<Instant>) {
    let now = Instant::now();
    s.leases
        .retain(|_, (w, _)| w.upgrade().is_some_and(|st| !ended(&st)));
    let mut soonest: Option<Instant> = None;
    let mut due = Vec::new();
    for (pair, (_, at)) in &s.leases {
        if *at <= now {
            if due.len() < MAX_PAIRS {
                due.push(pair.clone());
            }
        } else if soonest.is_none_or(|t| *at < t) {
            soonest = Some(*at);
        }
    }
    (due, soonest)
}

/// Ends the lane's waiting WATCH (CLIENT UNBLOCK from the shared connection) so that it is
/// sent again with the leases that joined since.
async fn rearm(shared: Arc<Shared>, lane: Arc<Lane>) {
    tokio::time::sleep(ARM_DELAY).await;
    for _ in 0..UNBLOCK_TRIES {
        let id = {
            let mut s = lock(&lane.st);
            let (want, _) = live(&mut s);
            let covered = match &s.in_flight {
                // Between WATCHes: the next one names the new set.
                None => true,
                Some(f) => want.iter().all(|p| f.contains(p)),
            };
            if covered || !s.running {
                s.arming = false;
                return;
            }
            s.client_id
        };
        if let Some(id) = id {
            let mut cmd = redis::cmd("CLIENT");
            cmd.arg("UNBLOCK").arg(id);
            match shared.query_at::<i64>(&cmd, lane.slot).await {
                Ok(1) => {
                    lock(&lane.st).arming = false;
                    return;
                }
                Ok(_) => {}
                Err(_) => break,
            }
        }
        tokio::time::sleep(UNBLOCK_PAUSE).await;
    }
    // The WATCH goes on with the old set; the next change (or its timeout) re-arms it.
    lock(&lane.st).arming = false;
}

/// What a WATCH reply names: (key, event, token).
fn event_of(v: &Value) -> Option<(String, String, u64)> {
    let Value::Array(a) = v else {
        return None;
    };
    let text = |v: &Value| match v {
        Value::BulkString(b) => Some(String::from_utf8_lossy(b).into_owned()),
        Value::SimpleString(s) => Some(s.clone()),
        _ => None,
    };
    match a.as_slice() {
        [key, event, _owner, token] => {
            let token = match token {
                Value::Int(n) => u64::try_from(*n).ok()?,
                other => text(other)?.parse().ok()?,
            };
            Some((text(key)?, text(event)?, token))
        }
        _ => None,
    }
}

/// The server ended the grant of `pair` with `event`: the lease is lost, unless it is being
/// released by its holder.
fn fire(lane: &Lane, pair: &Pair, event: &str) {
    let w = lock(&lane.st).leases.remove(pair);
    let Some(st) = w.and_then(|(w, _)| w.upgrade()) else {
        return;
    };
    {
        // While the lease's own RELEASE is on its way, whatever WATCH says (its `released`,
        // or `gone` from a WATCH that arrived after it) is that release: the RELEASE's own
        // reply says whether the grant was still live.
        let t = lock(&st.timing);
        if t.released || t.releasing {
            return;
        }
    }
    // A local deadline already passed is the truer reason (rule 1): `is_lost` marks it first.
    if !st.is_lost() {
        st.mark_lost(LossReason::of_event(event));
    }
}

/// Marks the lane stopped when its runtime drops its loop midway (a runtime shut down while
/// the `Flock` lives on, to be used from another): the next lease starts it again.
struct Alive(Option<Arc<Lane>>);

impl Drop for Alive {
    fn drop(&mut self) {
        if let Some(lane) = self.0.take() {
            let mut s = lock(&lane.st);
            s.running = false;
            s.idle = false;
            s.arming = false;
            s.in_flight = None;
            s.client_id = None;
        }
    }
}

/// The lane's loop, on a connection of its own, until it has had nothing to watch for IDLE.
async fn run(w: Arc<Watcher>, lane: Arc<Lane>) {
    let mut alive = Alive(Some(lane.clone()));
    let mut conn: Option<Conn> = None;
    let mut failures = 0u32;
    let cluster = lane.slot.is_some();
    let mut idle_since = Instant::now();
    loop {
        let (pairs, soonest) = {
            let mut s = lock(&lane.st);
            let (pairs, soonest) = live(&mut s);
            if !pairs.is_empty() {
                s.in_flight = Some(pairs.iter().cloned().collect());
                // A lease not yet due joins this WATCH when it is (CLIENT UNBLOCK then).
                if soonest.is_some() && !s.arming {
                    s.arming = true;
                    tokio::spawn(rearm(w.shared.clone(), lane.clone()));
                }
            } else if soonest.is_none() {
                if idle_since.elapsed() >= IDLE {
                    s.running = false;
                    s.client_id = None;
                    alive.0 = None;
                    return;
                }
                s.idle = true;
            }
            (pairs, soonest)
        };
        if pairs.is_empty() {
            match soonest {
                Some(at) => {
                    idle_since = Instant::now();
                    tokio::time::sleep_until(at).await;
                }
                None => {
                    let until = idle_since + IDLE;
                    let _ = tokio::time::timeout_at(until, lane.wake.notified()).await;
                }
            }
            continue;
        }
        idle_since = Instant::now();
        let c = match conn.as_mut() {
            Some(c) => c,
            None => match w.shared.dedicated().await {
                Ok(c) => {
                    lock(&lane.st).client_id = None;
                    conn.insert(c)
                }
                Err(_) => {
                    lock(&lane.st).in_flight = None;
                    failures += 1;
                    tokio::time::sleep(backoff(failures)).await;
                    continue;
                }
            },
        };
        // The connection's id, for CLIENT UNBLOCK: once per connection; on a cluster before
        // each WATCH (its connection to the node may have been replaced).
        if cluster || lock(&lane.st).client_id.is_none() {
            let mut id = redis::cmd("CLIENT");
            id.arg("ID");
            match c.query_at::<i64>(&id, lane.slot).await {
                Ok(id) => lock(&lane.st).client_id = Some(id),
                Err(_) => {
                    lock(&lane.st).in_flight = None;
                    conn = None;
                    failures += 1;
                    tokio::time::sleep(backoff(failures)).await;
                    continue;
                }
            }
        }
        let mut cmd = redis::cmd("FLOCK.WATCH");
        cmd.arg(WATCH_TIMEOUT_MS);
        for (k, t) in &pairs {
            cmd.arg(k).arg(*t);
        }
        let limit = Duration::from_millis(WATCH_TIMEOUT_MS + 5_000);
        let reply = match tokio::time::timeout(limit, c.query::<Value>(&cmd)).await {
            Ok(r) => r,
            Err(_) => Err(redis::RedisError::from((
                redis::ErrorKind::Io,
                "no reply to FLOCK.WATCH within its timeout",
            ))),
        };
        lock(&lane.st).in_flight = None;
        idle_since = Instant::now();
        match reply {
            Ok(v) => {
                failures = 0;
                if let Some((key, event, token)) = event_of(&v) {
                    fire(&lane, &(key, token), &event);
                }
            }
            Err(e) => {
                let code = e.code().unwrap_or("").to_string();
                if code == "WRONGTYPE" {
                    // A value of another type replaced one of the keys: which one?
                    for (k, t) in &pairs {
                        let mut chk = redis::cmd("FLOCK.CHECK");
                        chk.arg(k).arg(*t);
                        match w.shared.query::<u64>(&chk).await {
                            Ok(0) => fire(&lane, &(k.clone(), *t), "gone"),
                            Err(e) if e.code() == Some("WRONGTYPE") => {
                                fire(&lane, &(k.clone(), *t), "lost")
                            }
                            _ => {}
                        }
                    }
                } else if is_connection_error(&e) {
                    conn = None;
                } else if ![
                    "TRYAGAIN",
                    "UNBLOCKED",
                    "LOADING",
                    "CLUSTERDOWN",
                    "MASTERDOWN",
                    "MOVED",
                    "ASK",
                ]
                .contains(&code.as_str())
                {
                    // Refused for good (no FLOCK.WATCH on this server, an ACL): losses are
                    // found at the next renewal, as before rule 9.
                    *lock(&w.disabled) = Some(e.to_string());
                    let mut s = lock(&lane.st);
                    s.running = false;
                    s.leases.clear();
                    alive.0 = None;
                    return;
                }
                failures += 1;
                tokio::time::sleep(backoff(failures)).await;
            }
        }
    }
}
