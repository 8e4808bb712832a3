//! The lock engine against a reference model: random operation sequences (acquire, block,
//! a waiter leaving or vanishing, release, renew, revoke, check, timers, DEL, reload from
//! RDB/AOF/replica, restart, clock steps) run through `flock_core::engine` exactly as the
//! module runs them, with a host that plays the server (keyspace, wait queues, replicas).
//! Checked after every step: the replies and states against the model (written from the
//! contract alone), G1-G4, G6, G7 (a replica that applies the replicated effects agrees with
//! the master) and G9.

use crate::bytes::Bytes;
use flock_core::args::AcquireArgs;
use flock_core::engine::{self, BlockRefused, Effect, Env, Host, Reply, ReplyError};
use flock_core::snapshot::LockImage;
use flock_core::state::Mode;
use flock_core::{Grant, LockState, Now, Snapshot, TokenIssuer, WaitQueue, Waiter};
use flock_core::{MAX_OWNER_LEN, MAX_TOKEN};
use std::collections::VecDeque;

const KEYS: usize = 3;
const OWNERS: usize = 4;
/// A start time: 2023-11-14, in microseconds.
const WALL0_US: u64 = 1_700_000_000_000_000;

fn owner_bytes(o: usize) -> Vec<u8> {
    if o == OWNERS - 1 {
        vec![b'o'; MAX_OWNER_LEN]
    } else {
        vec![b'a' + o as u8]
    }
}

// ---- the reference model, from the contract ----

#[derive(Clone, Debug, PartialEq, Eq)]
struct MGrant {
    owner: Vec<u8>,
    token: u64,
    /// Deadline on the monotonic clock (decides on a running server: G9) and as an absolute
    /// wall-clock time (what travels).
    mono_us: u64,
    wall_ms: i64,
}

#[derive(Clone, Debug, PartialEq, Eq)]
struct MWaiter {
    id: u64,
    owner: Vec<u8>,
    ttl_ms: u64,
}

/// One key of the model: whether it exists in the keyspace, and its lock.
#[derive(Clone, Debug, Default)]
struct MKey {
    exists: bool,
    holder: Option<MGrant>,
    /// Lock-delay end: (monotonic us, wall ms).
    delay: Option<(u64, i64)>,
    last_token: u64,
    queue: VecDeque<MWaiter>,
}

impl MKey {
    fn vacant(&self, now: Now) -> bool {
        self.holder.is_none() && !self.delay.is_some_and(|(m, _)| now.mono_us < m)
    }

    fn forget_lock(&mut self) {
        self.exists = false;
        self.holder = None;
        self.delay = None;
        self.last_token = 0;
    }
}

struct Model {
    keys: Vec<MKey>,
    high_water: u64,
    /// Waiters whose client went away without their queue hearing of it.
    vanished: Vec<u64>,
    /// Every token granted, in order (G3).
    issued: Issued,
    /// The (waiter id, token) hand-offs of the current step.
    handed: Vec<(u64, u64)>,
    step: usize,
}

impl Model {
    fn issue(&mut self, now: Now) -> Option<u64> {
        let t = (self.high_water + 1).max(now.wall_us);
        if t > MAX_TOKEN {
            return None;
        }
        self.high_water = t;
        Some(t)
    }

    fn live(&self, k: usize, now: Now) -> Option<&MGrant> {
        self.keys[k]
            .holder
            .as_ref()
            .filter(|g| now.mono_us < g.mono_us)
    }

    fn delay_active(&self, k: usize, now: Now) -> bool {
        self.keys[k].delay.is_some_and(|(m, _)| now.mono_us < m)
    }

    /// End a run-out lease (lock-delay from its deadline), end a finished delay, hand a free
    /// key to the first waiter still there (a vanished one costs a token and is skipped).
    /// Hand-offs go to `handed`.
    fn settle_state(&mut self, k: usize, now: Now, lock_delay_ms: u64) {
        loop {
            let key = &mut self.keys[k];
            if let Some(g) = key.holder.clone() {
                if now.mono_us >= g.mono_us {
                    key.holder = None;
                    if lock_delay_ms > 0 {
                        key.delay = Some((
                            g.mono_us + lock_delay_ms * 1000,
                            g.wall_ms + lock_delay_ms as i64,
                        ));
                    }
                }
            }
            if key.delay.is_some_and(|(m, _)| now.mono_us >= m) {
                key.delay = None;
            }
            if key.holder.is_some() || key.delay.is_some() || key.queue.is_empty() {
                return;
            }
            let Some(token) = self.issue(now) else {
                return;
            };
            let key = &mut self.keys[k];
            let Some(w) = key.queue.pop_front() else {
                return;
            };
            key.holder = Some(MGrant {
                owner: w.owner.clone(),
                token,
                mono_us: now.mono_us + w.ttl_ms * 1000,
                wall_ms: now.wall_ms + w.ttl_ms as i64,
            });
            key.last_token = token;
            if !self.vanished.contains(&w.id) {
                self.issued.note(token, now, self.step);
                self.handed.push((w.id, token));
                return;
            }
            self.keys[k].holder = None;
        }
    }

    /// The key leaves the keyspace when nothing is left of it. True when it did.
    fn publish(&mut self, k: usize, now: Now) -> bool {
        let key = &mut self.keys[k];
        if key.vacant(now) && key.queue.is_empty() {
            key.forget_lock();
            return true;
        }
        false
    }

    /// What a write command on an existing key does first. True when the key went away.
    fn settle(&mut self, k: usize, now: Now, lock_delay_ms: u64) -> bool {
        self.settle_state(k, now, lock_delay_ms);
        self.publish(k, now)
    }
}

// ---- the engine's side: a host that plays the server ----

/// What a replica that applied every replicated effect holds for a key.
type ReplicaKey = Option<LockState>;

struct Server {
    /// The keyspace: `None` when the key does not exist.
    states: Vec<Option<LockState>>,
    queues: Vec<WaitQueue>,
    tokens: TokenIssuer,
    replica: Vec<ReplicaKey>,
    vanished: Vec<u64>,
    next_waiter: u64,
}

/// The host of one operation on key `k`.
struct KeyHost<'s> {
    queue: &'s mut WaitQueue,
    replica: &'s mut ReplicaKey,
    vanished: &'s [u64],
    next_waiter: &'s mut u64,
    now: Now,
    /// (waiter id, token) handed over in this operation.
    delivered: Vec<(u64, u64)>,
    blocked: Option<u64>,
    deleted: bool,
    deleted_then_touched: bool,
}

impl Host for KeyHost<'_> {
    fn effect(&mut self, e: Effect<'_>) {
        if self.deleted {
            self.deleted_then_touched = true;
        }
        match e {
            Effect::Replicate(s) => {
                let mut sink = TokenIssuer::new();
                let image = s.image().validate().expect("a replicated effect is valid");
                *self.replica = Some(engine::load(image, self.now, &mut sink));
            }
            Effect::ReplicateDelete => *self.replica = None,
            Effect::DeleteKey => self.deleted = true,
            Effect::Notify(_)
            | Effect::Count(_)
            | Effect::ReplicateVerbatim
            | Effect::Arm(_)
            | Effect::Bind { .. }
            | Effect::Unbind { .. } => {}
        }
    }
    fn waiting(&mut self) -> usize {
        self.queue.len()
    }
    fn waiting_mode(&mut self) -> Option<Mode> {
        self.queue.shared_mode()
    }
    fn next_waiter_if(&mut self, fits: &mut dyn FnMut(&Waiter) -> bool) -> Option<Waiter> {
        self.queue.pop_if(fits)
    }
    fn deliver(&mut self, w: &Waiter, token: u64) -> bool {
        if self.vanished.contains(&w.id) {
            return false;
        }
        self.delivered.push((w.id, token));
        true
    }
    fn block(
        &mut self,
        args: &AcquireArgs<'_>,
        _timeout_ms: u64,
        bind_to: Option<u64>,
    ) -> Result<(), BlockRefused> {
        *self.next_waiter += 1;
        let id = *self.next_waiter;
        // An earlier request of the same owner leaves the queue (the model does the same).
        let _replaced = self.queue.push(Waiter {
            id,
            owner: args.owner.into(),
            ttl_ms: args.ttl_ms,
            mode: args.mode,
            bind_to,
        });
        self.blocked = Some(id);
        Ok(())
    }
}

/// What one operation did, besides its reply.
struct Outcome {
    delivered: Vec<(u64, u64)>,
    blocked: Option<u64>,
}

impl Server {
    /// Run `op` on key `k` the way the module's executor does: on the stored state (or a
    /// fresh one when `create`), deleting the key when the engine says so. `None`: the key
    /// does not exist and nothing ran.
    fn run(
        &mut self,
        k: usize,
        now: Now,
        lock_delay_ms: u64,
        create: bool,
        op: impl FnOnce(&mut LockState, &mut Env<'_>, &mut KeyHost<'_>) -> Reply<'static>,
    ) -> Option<(Reply<'static>, Outcome)> {
        if self.states[k].is_none() && !create {
            return None;
        }
        let state = self.states[k].get_or_insert_with(LockState::default);
        let mut host = KeyHost {
            queue: &mut self.queues[k],
            replica: &mut self.replica[k],
            vanished: &self.vanished,
            next_waiter: &mut self.next_waiter,
            now,
            delivered: Vec::new(),
            blocked: None,
            deleted: false,
            deleted_then_touched: false,
        };
        let mut env = Env {
            now,
            lock_delay_ms,
            max_holders: 10,
            master: true,
            tokens: &mut self.tokens,
        };
        let reply = op(state, &mut env, &mut host);
        assert!(!host.deleted_then_touched, "an effect after DeleteKey");
        let (deleted, outcome) = (
            host.deleted,
            Outcome {
                delivered: host.delivered,
                blocked: host.blocked,
            },
        );
        if deleted {
            self.states[k] = None;
        }
        Some((reply, outcome))
    }
}

fn grant_view(g: &Grant) -> MGrant {
    MGrant {
        owner: g.owner.to_vec(),
        token: g.token,
        mono_us: g.deadline.mono_us,
        wall_ms: g.deadline.wall_ms,
    }
}

/// A key's state (existence, holder, delay, waiters) must be the model's, and a replica
/// must agree with it (G7).
fn assert_same(real: &Server, model: &Model, k: usize, now: Now, step: usize, what: &str) {
    let mk = &model.keys[k];
    assert_eq!(
        real.states[k].is_some(),
        mk.exists,
        "step {step} ({what}): existence of key {k}"
    );
    assert_eq!(
        real.queues[k].len(),
        mk.queue.len(),
        "step {step} ({what}): waiters of key {k}"
    );
    let Some(st) = &real.states[k] else {
        assert!(
            real.replica[k].is_none(),
            "step {step} ({what}): the replica still has deleted key {k} (G7)"
        );
        return;
    };
    assert!(st.mode.is_exclusive() && st.grants().len() <= 1 && st.delays.len() <= 1);
    assert_eq!(
        st.grants().as_slice().first().map(grant_view),
        mk.holder,
        "step {step} ({what}): holder of key {k}"
    );
    assert_eq!(
        st.delays.first().map(|d| (d.mono_us, d.wall_ms)),
        mk.delay,
        "step {step} ({what}): lock-delay of key {k}"
    );
    if let Some(s) = Snapshot::of(st) {
        assert_eq!(
            real.replica[k]
                .as_ref()
                .and_then(Snapshot::of)
                .map(Snapshot::image),
            Some(s.image()),
            "step {step} ({what}): the replica disagrees on key {k} (G7)"
        );
    }
    // G1: the live holder is one owner; CHECK agrees with it.
    let live = st.live(now).next();
    assert_eq!(live.map(grant_view).as_ref(), model.live(k, now));
    if let Some(g) = live {
        let left = st.check(g.token, now);
        assert!(left >= 1, "step {step}: live grant checks as {left}");
        assert_eq!(left, (g.deadline.mono_us - now.mono_us).div_ceil(1000));
        assert_eq!(st.check(g.token + 1, now), 0);
    }
    // G6: after a write command, a free key has nobody waiting (unless tokens ran out).
    let free = st.fits(Mode::Exclusive, now, u32::MAX);
    if what == "write" && free && real.tokens.high_water() < MAX_TOKEN {
        assert!(
            real.queues[k].is_empty(),
            "step {step}: key {k} is free with {} waiters",
            real.queues[k].len()
        );
    }
}

/// Every token issued, in order, with its owner (G3).
#[derive(Default)]
struct Issued {
    tokens: Vec<u64>,
    /// Set by a restart that lost the high-water mark (an AOF without preamble): the mark
    /// before it. The contract keeps tokens growing across such a restart only while the
    /// clock is past that mark; when the next token shows that it is not, the old history no
    /// longer binds.
    clock_floor: Option<u64>,
}

impl Issued {
    /// A new token must exceed every token issued before it (G3), stay below 2^53, and be no
    /// lower than the wall clock in microseconds.
    fn note(&mut self, t: u64, now: Now, step: usize) {
        if let Some(floor) = self.clock_floor.take() {
            if t <= floor {
                self.tokens.clear();
            }
        }
        if let Some(last) = self.tokens.last() {
            assert!(t > *last, "step {step}: token {t} not above {last} (G3)");
        }
        assert!(
            (1..=MAX_TOKEN).contains(&t),
            "step {step}: token {t} out of range"
        );
        assert!(
            t >= now.wall_us.min(MAX_TOKEN),
            "step {step}: token below the clock"
        );
        self.tokens.push(t);
    }
}

/// libFuzzer target: a random sequence of operations on three keys.
pub fn state_machine_target(data: &[u8]) {
    let mut r = Bytes::new(data);
    let mut wall_us: u64 = WALL0_US + u64::from(r.u32());
    let mut mono_us: u64 = 1_000_000 + u64::from(r.u16());
    let mut lock_delay_ms: u64 = [0, 0, 0, 5, 50, 400][r.below(6)];
    let mut real = Server {
        states: vec![None; KEYS],
        queues: vec![WaitQueue::default(); KEYS],
        tokens: TokenIssuer::new(),
        replica: vec![None; KEYS],
        vanished: Vec::new(),
        next_waiter: 0,
    };
    let mut model = Model {
        keys: vec![MKey::default(); KEYS],
        high_water: 0,
        vanished: Vec::new(),
        issued: Issued::default(),
        handed: Vec::new(),
        step: 0,
    };
    let mut steps = 0usize;

    while !r.done() && steps < 4000 {
        steps += 1;
        model.step = steps;
        model.handed.clear();
        // The engine's hand-offs in this step, to compare with the model's (FIFO, G6).
        let mut delivered: Vec<(u64, u64)> = Vec::new();
        let now = Now::new(wall_us, mono_us);
        let op = r.u8() % 17;
        let k = r.below(KEYS);
        let o = r.below(OWNERS);
        let owner = owner_bytes(o);
        let ttl_ms: u64 = match r.u8() % 4 {
            0 => 1,
            1 => 1 + u64::from(r.u8()),
            2 => 1 + u64::from(r.u16()),
            _ => 1000,
        };
        let mut what = "write";

        match op {
            // FLOCK.ACQUIRE, with or without BLOCK
            0..=3 => {
                if real.tokens.high_water() >= MAX_TOKEN {
                    continue;
                }
                let block = (op >= 2).then_some(0);
                let before = real.states[k]
                    .as_ref()
                    .and_then(|s| s.live(now).next().cloned());
                let args = AcquireArgs {
                    owner: &owner,
                    ttl_ms,
                    mode: Mode::Exclusive,
                    bound: false,
                    block,
                };
                let (got, out) = real
                    .run(k, now, lock_delay_ms, true, |s, env, host| {
                        engine::acquire(s, env, host, &args, true, None)
                    })
                    .expect("ACQUIRE creates the key");
                // The model.
                delivered = out.delivered.clone();
                model.keys[k].exists = true;
                model.settle_state(k, now, lock_delay_ms);
                let want = match model.live(k, now).cloned() {
                    Some(g) if g.owner == owner => {
                        let h = model.keys[k].holder.as_mut().expect("holder");
                        h.mono_us = now.mono_us + ttl_ms * 1000;
                        h.wall_ms = now.wall_ms + ttl_ms as i64;
                        Reply::Int(g.token as i64)
                    }
                    Some(_) => Reply::Null,
                    None if model.delay_active(k, now) || !model.keys[k].queue.is_empty() => {
                        Reply::Null
                    }
                    None => match model.issue(now) {
                        Some(t) => {
                            let key = &mut model.keys[k];
                            key.holder = Some(MGrant {
                                owner: owner.clone(),
                                token: t,
                                mono_us: now.mono_us + ttl_ms * 1000,
                                wall_ms: now.wall_ms + ttl_ms as i64,
                            });
                            key.last_token = t;
                            key.delay = None;
                            model.issued.note(t, now, steps);
                            Reply::Int(t as i64)
                        }
                        None => Reply::Error(ReplyError::TokensExhausted),
                    },
                };
                let want = match (want, block) {
                    (Reply::Null, Some(_)) => {
                        let id = out.blocked.expect("blocked");
                        // An owner waits at most once: its earlier request gives way.
                        model.keys[k].queue.retain(|w| w.owner != owner);
                        model.keys[k].queue.push_back(MWaiter {
                            id,
                            owner: owner.clone(),
                            ttl_ms,
                        });
                        Reply::Blocked
                    }
                    (w, _) => w,
                };
                model.publish(k, now);
                assert_eq!(got, want, "step {steps}: ACQUIRE key {k} owner {o}");
                // G1 / G4, from the state before the call alone.
                if let Some(h) = &before {
                    match got {
                        Reply::Int(t) => {
                            assert_eq!(*h.owner, *owner, "step {steps}: granted while held (G1)");
                            assert_eq!(h.token, t as u64, "step {steps}: G4 same token");
                        }
                        other => assert!(
                            *h.owner != *owner && matches!(other, Reply::Null | Reply::Blocked),
                            "step {steps}: {other:?} while {:?} holds (G1/G4)",
                            h.owner
                        ),
                    }
                }
            }
            // FLOCK.RELEASE, FLOCK.RENEW, FLOCK.REVOKE (on an existing lock only)
            4..=7 => {
                let before = real.states[k]
                    .as_ref()
                    .and_then(|s| s.live(now).next().cloned());
                let ran = match op {
                    4 | 5 => real.run(k, now, lock_delay_ms, false, |s, env, host| {
                        engine::release(s, env, host, &owner, None)
                    }),
                    6 => real.run(k, now, lock_delay_ms, false, |s, env, host| {
                        engine::renew(s, env, host, &owner, ttl_ms, None)
                    }),
                    _ => real.run(k, now, lock_delay_ms, false, |s, env, host| {
                        engine::revoke(s, env, host, None)
                    }),
                };
                let missing = if op == 6 { Reply::Null } else { Reply::Int(0) };
                let Some((got, out)) = ran else {
                    assert!(!model.keys[k].exists, "step {steps}: key {k} should exist");
                    continue;
                };
                delivered = out.delivered.clone();
                let gone = model.settle(k, now, lock_delay_ms);
                let want = if gone {
                    missing
                } else {
                    match op {
                        4 | 5 => match model.live(k, now) {
                            Some(g) if g.owner == owner => {
                                model.keys[k].holder = None;
                                model.settle(k, now, lock_delay_ms);
                                Reply::Int(1)
                            }
                            _ => Reply::Int(0),
                        },
                        6 => match model.live(k, now).cloned() {
                            Some(g) if g.owner == owner => {
                                let h = model.keys[k].holder.as_mut().expect("holder");
                                h.mono_us = now.mono_us + ttl_ms * 1000;
                                h.wall_ms = now.wall_ms + ttl_ms as i64;
                                Reply::Int(g.token as i64)
                            }
                            _ => Reply::Null,
                        },
                        _ => match model.live(k, now).cloned() {
                            Some(_) => {
                                let key = &mut model.keys[k];
                                key.holder = None;
                                if lock_delay_ms > 0 {
                                    key.delay = Some((
                                        now.mono_us + lock_delay_ms * 1000,
                                        now.wall_ms + lock_delay_ms as i64,
                                    ));
                                }
                                model.settle(k, now, lock_delay_ms);
                                Reply::Int(1)
                            }
                            None => Reply::Int(0),
                        },
                    }
                };
                assert_eq!(got, want, "step {steps}: op {op} key {k} owner {o}");
                if matches!(got, Reply::Int(0) | Reply::Null) {
                    // G2: a call that did nothing changed no grant.
                    if let Some(st) = &real.states[k] {
                        if let Some(h) = &before {
                            if st.live(now).next().is_some_and(|g| g.token == h.token) {
                                assert_eq!(st.live(now).next().map(|g| &g.owner), Some(&h.owner));
                            }
                        }
                    }
                }
            }
            // FLOCK.CHECK of a recent token (read-only: no settle)
            8 => {
                what = "read";
                let t = match model.issued.tokens.len() {
                    0 => 1 + u64::from(r.u8()),
                    n => model.issued.tokens[n - 1 - r.below(n.min(4))],
                };
                let got = engine::check(real.states[k].as_ref(), t, now);
                let want = model
                    .live(k, now)
                    .filter(|g| g.token == t)
                    .map_or(0, |g| (g.mono_us - now.mono_us).div_ceil(1000));
                assert_eq!(
                    got,
                    Reply::Int(want as i64),
                    "step {steps}: CHECK key {k} token {t}"
                );
            }
            // Time passes; now and then the wall clock steps (NTP, an operator, a VM resume).
            9 | 10 => {
                what = "time";
                let d_us = match r.u8() % 4 {
                    0 => u64::from(r.u8()) * 10,
                    1 => u64::from(r.u16()),
                    2 => u64::from(r.u16()) * 20,
                    _ => 1000 * u64::from(r.u16()),
                };
                mono_us += d_us;
                wall_us += d_us;
                match r.u8() % 8 {
                    0 => wall_us += 3_600_000_000,
                    1 => wall_us = wall_us.saturating_sub(86_400_000_000),
                    2 => wall_us = wall_us.saturating_sub(u64::from(r.u32())),
                    _ => {}
                }
            }
            // The key's timer fires.
            11 => {
                let ran = real.run(k, now, lock_delay_ms, false, |s, env, host| {
                    engine::expire(s, env, host);
                    Reply::Null
                });
                if let Some((_, out)) = ran {
                    delivered = out.delivered;
                    model.settle(k, now, lock_delay_ms);
                }
            }
            // A waiter leaves: timeout, disconnect, CLIENT UNBLOCK (its queue hears of it).
            12 => {
                what = "leave";
                let mk = &mut model.keys[k];
                if !mk.queue.is_empty() {
                    let i = r.below(mk.queue.len());
                    let w = mk.queue.remove(i).expect("waiter");
                    assert!(real.queues[k].cancel(w.id), "step {steps}: cancel");
                    assert!(
                        !real.queues[k].cancel(w.id),
                        "step {steps}: cancelled twice"
                    );
                }
            }
            // A waiter's client goes away unnoticed by its queue: the grant skips it.
            13 => {
                what = "leave";
                if let Some(w) = model.keys[k].queue.front() {
                    real.vanished.push(w.id);
                    model.vanished.push(w.id);
                }
            }
            // DEL / UNLINK / FLUSHALL / eviction of the key: the lock is gone (Redis
            // replicates the DEL), the waiters stay and get the key right after (G3: tokens
            // keep growing), through a revisit.
            14 => {
                real.states[k] = None;
                real.replica[k] = None;
                model.keys[k].forget_lock();
                let found = engine::Found::Nothing;
                let plan = engine::plan_revisit(true, found, None, real.queues[k].len(), || true);
                if plan == engine::RevisitPlan::Revisit {
                    let (_, out) = real
                        .run(k, now, lock_delay_ms, true, |s, env, host| {
                            engine::revisit(s, env, host, None);
                            Reply::Null
                        })
                        .expect("revisit creates the key");
                    delivered = out.delivered;
                    model.keys[k].exists = true;
                    model.settle(k, now, lock_delay_ms);
                } else {
                    assert!(model.keys[k].queue.is_empty());
                }
            }
            // The key travels: RDB save/load, AOF, a replica's copy, DUMP/RESTORE. What
            // travels is owner, token and the absolute wall-clock deadline (G7); waiters stay
            // (DEBUG RELOAD keeps the clients).
            15 => {
                what = "travel";
                for kk in 0..KEYS {
                    travel(&mut real, &mut model, kk, now);
                }
            }
            // A restart or a failover: state travels, waiters are gone; the high-water mark
            // comes along (RDB aux data, replication) or not (an AOF without preamble).
            _ => {
                what = "travel";
                let keep_mark = r.u8() & 3 != 0;
                let old_mark = real.tokens.high_water();
                real.tokens = TokenIssuer::new();
                if keep_mark {
                    real.tokens.observe(old_mark);
                } else {
                    model.high_water = 0;
                }
                for kk in 0..KEYS {
                    real.queues[kk] = WaitQueue::default();
                    model.keys[kk].queue.clear();
                    travel(&mut real, &mut model, kk, now);
                }
                real.vanished.clear();
                model.vanished.clear();
                // Without the mark, G3 across the restart rests on the clock alone: the first
                // token issued after it must be above the old mark when the clock is.
                if !keep_mark {
                    model.high_water = real.tokens.high_water();
                    let floor = model.issued.clock_floor.unwrap_or(0).max(old_mark);
                    model.issued.clock_floor = Some(floor);
                }
                // A new lock-delay setting now and then (CONFIG SET).
                lock_delay_ms = [0, 0, 3, 100][r.below(4)];
            }
        }
        assert_eq!(
            delivered, model.handed,
            "step {steps}: hand-offs of key {k} (FIFO)"
        );
        for kk in 0..KEYS {
            assert_same(
                &real,
                &model,
                kk,
                now,
                steps,
                if kk == k { what } else { "any" },
            );
        }
    }
}

/// The keyspace leaves this server and comes back through RDB: owner, token and the
/// absolute wall-clock deadline of each key; the monotonic deadline is what is left of it
/// by the local wall clock now. A replica resyncs from the same data.
fn travel(real: &mut Server, model: &mut Model, k: usize, now: Now) {
    if let Some(st) = &real.states[k] {
        let image = LockImage::of(st).validate().expect("a saved lock loads");
        let loaded = engine::load(image, now, &mut real.tokens);
        real.replica[k] = Some(loaded.clone());
        real.states[k] = Some(loaded);
    } else {
        real.replica[k] = None;
    }

    let left = |wall_ms: i64| -> u64 {
        let ms = wall_ms.saturating_sub(now.wall_ms).max(0) as u64;
        now.mono_us + ms * 1000
    };
    let mk = &mut model.keys[k];
    if !mk.exists {
        return;
    }
    if let Some(g) = mk.holder.as_mut() {
        g.mono_us = left(g.wall_ms);
        mk.last_token = g.token;
        mk.delay = None;
    } else if let Some((_, wall)) = mk.delay {
        mk.delay = Some((left(wall), wall));
    }
    model.high_water = model.high_water.max(mk.last_token);
}
