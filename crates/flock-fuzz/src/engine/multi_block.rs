//! FLOCK.MACQUIRE with BLOCK, in a state machine of its own: MACQUIRE requests (with and
//! without BLOCK, with and without a timeout, some naming a key their owner holds already),
//! ACQUIRE ... BLOCK requests of one key, owners releasing, waiters leaving (timeout,
//! disconnect) and time passing (leases ending, timeouts firing in time order), on three
//! exclusive keys. The engine runs as the module runs it: a waiting request stands in the
//! queue of each of its keys (`WaitQueue`, one waiter id in all), the engine names it when it
//! is first in line on a free key (`Effect::TryMulti`), and a deferred job tries it on all its
//! keys together (`multi::ready`, then `multi::grant_key` on each, then it leaves every queue),
//! as `src/commands/macquire.rs` and `src/waiting/waiters.rs` do; a request that leaves looks
//! at each key it headed again (a revisit).
//!
//! The model is written from the contract (SPEC.md, MACQUIRE): a request is granted all its
//! keys at one instant once, on each of them, it is first in line on a key with no live grant
//! or its owner holds the key (which keeps its token, its lease renewed); a one-key request
//! once it is first in line on a key with no live grant; a new request waits behind everyone
//! queued before it. After every step the engine's holders (owner, token, lease end), queues
//! and waiting requests equal the model's, and so do the requests granted in the step; and,
//! on the engine's state alone: G1 (one live grant per key), nobody overtakes (a key is
//! handed to a request with no earlier request still waiting for it, unless its owner held
//! it), no missed wake-up or deadlock (no waiting request could be granted now: in particular,
//! when no key has a live grant, nobody waits), tokens grow (G3), and no key is kept with
//! neither grant nor waiter (G10).

use super::model::Settings;
use super::server::{Ran, Server};
use super::{KEYS, KEY_NAMES, MAX_TTL_MS, WALL0_US};
use crate::bytes::Bytes;
use flock_core::engine::{self, Reply, ReplyError};
use flock_core::multi::{self, Decision, KeyLook};
use flock_core::state::Mode;
use flock_core::{queue, LockState, Now, Waiter};
use std::collections::{BTreeMap, VecDeque};

const OWNERS: usize = 6;

/// How often each path ran (the smoke test asserts that every one did).
#[derive(Clone, Debug, Default)]
pub struct MultiSeen {
    /// MACQUIRE granted at the call.
    pub granted_at_call: usize,
    /// MACQUIRE requests queued (BLOCK).
    pub queued: usize,
    /// Waiting MACQUIRE requests of two keys or more granted all together.
    pub granted_together: usize,
    /// ... one of whose keys its owner held (kept, its token unchanged).
    pub kept_own: usize,
    /// Tries of a waiting request that left it waiting (a key of it was not free).
    pub tried_busy: usize,
    /// Waiting MACQUIRE requests that timed out.
    pub timed_out: usize,
    /// Waiting MACQUIRE requests that left otherwise (disconnect, CLIENT UNBLOCK).
    pub left: usize,
    /// One-key waiters handed a key.
    pub handed_single: usize,
    /// A MACQUIRE refused by `flock.max-waiters`.
    pub too_many: usize,
}

impl MultiSeen {
    pub fn add(&mut self, o: &MultiSeen) {
        self.granted_at_call += o.granted_at_call;
        self.queued += o.queued;
        self.granted_together += o.granted_together;
        self.kept_own += o.kept_own;
        self.tried_busy += o.tried_busy;
        self.timed_out += o.timed_out;
        self.left += o.left;
        self.handed_single += o.handed_single;
        self.too_many += o.too_many;
    }
}

/// A waiting request: as the module keeps it, and as the model does.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Req {
    owner: Vec<u8>,
    /// Its keys in the order given.
    keys: Vec<usize>,
    ttl_ms: u64,
    /// A MACQUIRE request (of one key or more), not an ACQUIRE.
    multi: bool,
    /// When its timeout fires (`None`: BLOCK 0).
    deadline_us: Option<u64>,
}

enum Job {
    Revisit(usize),
    TryMulti(u64),
}

/// The module's side: the engine's keys and queues, the registry of waiting requests, the
/// deferred jobs.
struct Host {
    server: Server,
    set: Settings,
    reqs: BTreeMap<u64, Req>,
    jobs: VecDeque<Job>,
    /// The requests granted in this step.
    granted: Vec<u64>,
    seen: MultiSeen,
}

fn name(k: usize) -> &'static [u8] {
    KEY_NAMES[k]
}

impl Host {
    /// Run `op` on key `k` and carry out what it did to waiters: hand-offs to one-key waiters
    /// (nobody earlier still waits for the key), tries of MACQUIRE requests (deferred).
    fn run(
        &mut self,
        k: usize,
        now: Now,
        create: bool,
        op: impl FnOnce(
            engine::Stored<'_>,
            &mut engine::Env<'_>,
            &mut super::server::KeyHost<'_>,
        ) -> engine::Outcome,
    ) -> Option<Reply<'static>> {
        let (reply, ran) = self.server.run(k, now, self.set, create, op)?;
        self.absorb(k, &ran);
        Some(reply)
    }

    fn absorb(&mut self, k: usize, ran: &Ran) {
        assert!(ran.dismissed.is_empty() && ran.refused.is_empty(), "{k}");
        for &(id, _token) in &ran.delivered {
            let req = self
                .reqs
                .remove(&id)
                .expect("a hand-off to a waiting request");
            assert!(!req.multi, "a MACQUIRE request handed one key alone: {id}");
            assert!(
                self.server.queues[k].iter_live().all(|w| w.id > id),
                "key {k} handed to {id} over an earlier waiter"
            );
            self.granted.push(id);
            self.seen.handed_single += 1;
        }
        self.jobs
            .extend(ran.try_multi.iter().map(|&w| Job::TryMulti(w)));
    }

    /// A waiter left its queues (timeout, disconnect): each key it headed is looked at again
    /// (a MACQUIRE request looks again at every key it headed: a free one was kept for it).
    fn leave(&mut self, id: u64) {
        let Some(req) = self.reqs.remove(&id) else {
            return;
        };
        for &k in &req.keys {
            let q = &mut self.server.queues[k];
            let first = q.is_front(id);
            if q.leave(id) || (req.multi && first) {
                self.jobs.push_back(Job::Revisit(k));
            }
        }
    }

    fn revisit(&mut self, k: usize, now: Now) {
        let found = match self.server.states[k] {
            Some(_) => engine::Found::Lock,
            None => engine::Found::Nothing,
        };
        let plan = engine::plan_revisit(true, found, None, self.server.queues[k].len(), || true);
        if plan == engine::RevisitPlan::Revisit {
            self.run(k, now, true, |s, env, host| {
                engine::revisit(s, env, host, None)
            });
        }
    }

    /// What a MACQUIRE request sees of its keys (`waiting_id`: a waiting request, which
    /// counts as in line when it is first in the key's queue).
    fn looks(&mut self, keys: &[usize], owner: &[u8], waiting_id: Option<u64>) -> Vec<Look> {
        keys.iter()
            .map(|&k| {
                let q = &mut self.server.queues[k];
                Look {
                    state: self.server.states[k].clone(),
                    waiting: q.len(),
                    owner_in_queue: match waiting_id {
                        Some(id) => q.is_front(id),
                        None => q.has_owner(owner),
                    },
                }
            })
            .collect()
    }

    /// Grant every key of `keys` to `owner` at `now` (as `grant_all`): the tokens.
    fn grant_all(&mut self, keys: &[usize], owner: &[u8], ttl_ms: u64, now: Now) -> Vec<u64> {
        let args = flock_core::args::AcquireArgs {
            owner,
            ttl_ms,
            mode: Mode::Exclusive,
            bound: false,
            block: None,
        };
        keys.iter()
            .map(|&k| {
                let reply = self
                    .run(k, now, true, |s, env, host| {
                        multi::grant_key(s, env, host, &args, None, now)
                    })
                    .expect("MACQUIRE creates the key");
                match reply {
                    Reply::Int(t) => t as u64,
                    other => panic!("MACQUIRE's grant of key {k}: {other:?}"),
                }
            })
            .collect()
    }

    /// The deferred try of the waiting MACQUIRE request `id` (as `try_waiting`).
    fn try_waiting(&mut self, id: u64, now: Now) {
        let Some(req) = self.reqs.get(&id).cloned() else {
            return;
        };
        assert!(req.multi, "a try of a one-key waiter {id}");
        let looks = self.looks(&req.keys, &req.owner, Some(id));
        let decided = multi::ready(&as_key_looks(&looks), &req.owner, now, 0);
        if decided != Decision::Grant {
            assert_eq!(
                decided,
                Decision::Busy,
                "a waiting request is never refused"
            );
            self.seen.tried_busy += 1;
            return;
        }
        let own: Vec<Option<u64>> = looks
            .iter()
            .map(|l| {
                l.state
                    .as_ref()
                    .and_then(|s| s.owner_grant(&req.owner, now).map(|g| g.token))
            })
            .collect();
        let tokens = self.grant_all(&req.keys, &req.owner, req.ttl_ms, now);
        // It leaves every queue (those behind it face a key it holds now).
        for &k in &req.keys {
            self.server.queues[k].cancel(id);
        }
        self.reqs.remove(&id);
        for ((&k, t), own) in req.keys.iter().zip(&tokens).zip(&own) {
            match own {
                Some(o) => assert_eq!(t, o, "key {k} held by the owner keeps its token (G4)"),
                None => assert!(
                    self.server.queues[k].iter_live().all(|w| w.id > id),
                    "key {k} granted to {id} over an earlier waiter"
                ),
            }
        }
        self.granted.push(id);
        if req.keys.len() > 1 {
            self.seen.granted_together += 1;
        }
        if own.iter().any(Option::is_some) {
            self.seen.kept_own += 1;
        }
    }

    fn drain_jobs(&mut self, now: Now) {
        let mut ran = 0;
        while let Some(job) = self.jobs.pop_front() {
            ran += 1;
            assert!(ran < 10_000, "the deferred jobs never end");
            match job {
                Job::Revisit(k) => self.revisit(k, now),
                Job::TryMulti(id) => self.try_waiting(id, now),
            }
        }
    }
}

/// A key as a MACQUIRE saw it (owned, so that the host can run on while it is kept).
struct Look {
    state: Option<LockState>,
    waiting: usize,
    owner_in_queue: bool,
}

fn as_key_looks(looks: &[Look]) -> Vec<KeyLook<'_>> {
    looks
        .iter()
        .map(|l| KeyLook {
            state: l.state.as_ref(),
            waiting: l.waiting,
            owner_in_queue: l.owner_in_queue,
        })
        .collect()
}

/// A holder in the model: owner, lease end, and its token once the engine issued it.
#[derive(Clone, Debug)]
struct MHold {
    owner: Vec<u8>,
    until_us: u64,
    token: Option<u64>,
}

/// The reference: who holds each key, the queues, the waiting requests.
#[derive(Default)]
struct Model {
    holds: Vec<Option<MHold>>,
    queues: Vec<VecDeque<u64>>,
    reqs: BTreeMap<u64, Req>,
    granted: Vec<u64>,
}

impl Model {
    fn live(&self, k: usize, now_us: u64) -> Option<&MHold> {
        self.holds[k].as_ref().filter(|h| now_us < h.until_us)
    }

    fn holds_it(&self, k: usize, owner: &[u8], now_us: u64) -> bool {
        self.live(k, now_us).is_some_and(|h| h.owner == owner)
    }

    /// `owner` is granted key `k` (a holder's lease is renewed, its token kept).
    fn grant(&mut self, k: usize, owner: &[u8], ttl_ms: u64, now_us: u64) {
        let until_us = now_us + ttl_ms * 1000;
        match &mut self.holds[k] {
            Some(h) if h.owner == owner && now_us < h.until_us => h.until_us = until_us,
            slot => {
                *slot = Some(MHold {
                    owner: owner.to_vec(),
                    until_us,
                    token: None,
                })
            }
        }
    }

    /// On every key: first in line on a free key, or its owner holds it (MACQUIRE).
    fn grantable(&self, id: u64, r: &Req, now_us: u64) -> bool {
        r.keys.iter().all(|&k| match self.live(k, now_us) {
            Some(h) => r.multi && h.owner == r.owner,
            None => self.queues[k].front() == Some(&id),
        })
    }

    /// Leases that ended end; every request that can be granted is, until none can.
    fn settle(&mut self, now_us: u64) {
        for h in &mut self.holds {
            if h.as_ref().is_some_and(|h| h.until_us <= now_us) {
                *h = None;
            }
        }
        loop {
            let pick = self
                .reqs
                .iter()
                .find(|(id, r)| self.grantable(**id, r, now_us))
                .map(|(id, _)| *id);
            let Some(id) = pick else { break };
            let r = self.reqs.remove(&id).expect("picked");
            for &k in &r.keys {
                self.queues[k].retain(|x| *x != id);
                self.grant(k, &r.owner, r.ttl_ms, now_us);
            }
            self.granted.push(id);
        }
    }

    /// MACQUIRE at the call: every key is its owner's or free (no live grant, nobody
    /// waiting).
    fn decide(&self, keys: &[usize], owner: &[u8], now_us: u64) -> Decision {
        let busy = keys.iter().any(|&k| {
            !self.holds_it(k, owner, now_us)
                && (self.live(k, now_us).is_some() || !self.queues[k].is_empty())
        });
        if busy {
            Decision::Busy
        } else {
            Decision::Grant
        }
    }

    fn waits(&self, owner: &[u8]) -> bool {
        self.reqs.values().any(|r| r.owner == owner)
    }

    fn enqueue(&mut self, id: u64, req: Req) {
        for &k in &req.keys {
            self.queues[k].push_back(id);
        }
        self.reqs.insert(id, req);
    }

    fn leave(&mut self, id: u64) {
        if let Some(r) = self.reqs.remove(&id) {
            for &k in &r.keys {
                self.queues[k].retain(|x| *x != id);
            }
        }
    }
}

fn owner_bytes(o: usize) -> Vec<u8> {
    vec![b'a' + o as u8]
}

/// libFuzzer target: MACQUIRE with BLOCK among one-key waiters, releases and time.
pub fn multi_block_target(data: &[u8]) {
    multi_block_counted(data);
}

/// [`multi_block_target`], returning the steps it ran and how often each path ran.
pub fn multi_block_counted(data: &[u8]) -> (usize, MultiSeen) {
    let mut r = Bytes::new(data);
    let mono0: u64 = 1_000_000 + u64::from(r.u16());
    let mut mono_us = mono0;
    let at = |mono_us: u64| Now::new(WALL0_US + (mono_us - mono0), mono_us);
    let set = Settings {
        lock_delay_ms: 0,
        max_holders: 3,
        max_waiters: [2, 3, 100, 100][r.below(4)],
    };
    let mut h = Host {
        server: Server::empty(),
        set,
        reqs: BTreeMap::new(),
        jobs: VecDeque::new(),
        granted: Vec::new(),
        seen: MultiSeen::default(),
    };
    let mut m = Model {
        holds: vec![None; KEYS],
        queues: vec![VecDeque::new(); KEYS],
        ..Model::default()
    };
    let mut top_token = 0u64;
    let mut steps = 0;
    while !r.done() && steps < 2000 {
        steps += 1;
        h.granted.clear();
        m.granted.clear();
        let now = at(mono_us);
        let op = r.u8() % 8;
        let k = r.below(KEYS);
        let owner = owner_bytes(r.below(OWNERS));
        let ttl_ms: u64 = match r.u8() % 3 {
            0 => 1 + u64::from(r.u8()),
            1 => 1 + u64::from(r.u16()) % 5000,
            _ => 100_000,
        };
        let timeout_ms: u64 = match r.u8() % 3 {
            0 => 0,
            1 => 1 + u64::from(r.u8()),
            _ => 1 + u64::from(r.u16()) % 5000,
        };
        match op {
            // FLOCK.MACQUIRE of 1 to 3 keys in some order, BLOCK most of the time.
            0..=2 => {
                if m.waits(&owner) {
                    continue;
                }
                let n = 1 + r.below(KEYS);
                let mut ks: Vec<usize> = (0..KEYS).collect();
                ks.rotate_left(r.below(KEYS));
                if r.u8() & 1 == 1 {
                    ks.reverse();
                }
                ks.truncate(n);
                let block = !r.u8().is_multiple_of(4);
                let mut argv: Vec<Vec<u8>> =
                    vec![b"FLOCK.MACQUIRE".to_vec(), n.to_string().into_bytes()];
                argv.extend(ks.iter().map(|&k| name(k).to_vec()));
                argv.extend([owner.clone(), ttl_ms.to_string().into_bytes()]);
                if block {
                    argv.extend([b"BLOCK".to_vec(), timeout_ms.to_string().into_bytes()]);
                }
                let refs: Vec<&[u8]> = argv.iter().map(|a| &a[..]).collect();
                let a = multi::parse_macquire(&refs, MAX_TTL_MS, set.max_holders)
                    .unwrap_or_else(|e| panic!("step {steps}: {argv:?}: {e:?}"));
                assert_eq!(a.acquire.block, block.then_some(timeout_ms));
                let looks = h.looks(&ks, &owner, None);
                let got = multi::at_call(&as_key_looks(&looks), &owner, now, 0);
                let want = m.decide(&ks, &owner, now.mono_us);
                assert_eq!(got, want, "step {steps}: MACQUIRE {ks:?} {owner:?}");
                match got {
                    Decision::Grant => {
                        let tokens = h.grant_all(&ks, &owner, ttl_ms, now);
                        assert_eq!(tokens.len(), ks.len());
                        for &kk in &ks {
                            m.grant(kk, &owner, ttl_ms, now.mono_us);
                        }
                        h.seen.granted_at_call += 1;
                    }
                    Decision::Busy if block => {
                        let full = ks.iter().any(|&kk| {
                            !queue::admits(Some(&h.server.queues[kk]), &owner, set.max_waiters)
                        });
                        let model_full = ks.iter().any(|&kk| m.queues[kk].len() >= set.max_waiters);
                        assert_eq!(full, model_full, "step {steps}: max-waiters");
                        if full {
                            h.seen.too_many += 1;
                            continue;
                        }
                        h.server.next_waiter += 1;
                        let id = h.server.next_waiter;
                        for &kk in &ks {
                            let replaced = h.server.queues[kk].push(Waiter {
                                id,
                                owner: owner.clone().into(),
                                ttl_ms,
                                mode: Mode::Exclusive,
                                bind_to: None,
                                multi: true,
                            });
                            assert!(replaced.is_none(), "step {steps}: nobody is replaced");
                        }
                        let req = Req {
                            owner: owner.clone(),
                            keys: ks.clone(),
                            ttl_ms,
                            multi: true,
                            deadline_us: (timeout_ms > 0).then(|| now.mono_us + timeout_ms * 1000),
                        };
                        h.reqs.insert(id, req.clone());
                        m.enqueue(id, req);
                        h.seen.queued += 1;
                        // Each key now knows it is waited for, and is settled.
                        for &kk in &ks {
                            h.run(kk, now, true, |s, env, host| {
                                engine::revisit(s, env, host, None)
                            });
                        }
                    }
                    Decision::Busy => {}
                    Decision::Refused(i, why) => panic!("step {steps}: refused {i} {why:?}"),
                }
            }
            // FLOCK.ACQUIRE of one key, with BLOCK or not.
            3 => {
                if m.waits(&owner) {
                    continue;
                }
                let block = r.u8() & 1 == 0;
                let args = flock_core::args::AcquireArgs {
                    owner: &owner,
                    ttl_ms,
                    mode: Mode::Exclusive,
                    bound: false,
                    block: block.then_some(timeout_ms),
                };
                let next_id = h.server.next_waiter + 1;
                let got = h
                    .run(k, now, true, |s, env, host| {
                        engine::acquire(s, env, host, &args, true, None)
                    })
                    .expect("ACQUIRE creates the key");
                let t = now.mono_us;
                let req = Req {
                    owner: owner.clone(),
                    keys: vec![k],
                    ttl_ms,
                    multi: false,
                    deadline_us: (timeout_ms > 0).then(|| t + timeout_ms * 1000),
                };
                let want = if m.holds_it(k, &owner, t)
                    || (m.live(k, t).is_none() && m.queues[k].is_empty())
                {
                    m.grant(k, &owner, ttl_ms, t);
                    "granted"
                } else if !block {
                    "nil"
                } else if m.queues[k].len() >= set.max_waiters {
                    "too many"
                } else {
                    m.enqueue(next_id, req.clone());
                    "blocked"
                };
                let said = match got {
                    Reply::Int(_) => "granted",
                    Reply::Null => "nil",
                    Reply::Error(ReplyError::TooManyWaiters) => "too many",
                    Reply::Blocked => {
                        assert_eq!(h.server.next_waiter, next_id, "step {steps}");
                        h.reqs.insert(next_id, req);
                        "blocked"
                    }
                    other => panic!("step {steps}: ACQUIRE: {other:?}"),
                };
                assert_eq!(said, want, "step {steps}: ACQUIRE key {k} {owner:?}");
            }
            // The key's holder (most of the time) or someone else releases it.
            4 => {
                let holder = m.live(k, now.mono_us).map(|x| x.owner.clone());
                let who = match holder {
                    Some(o) if !r.u8().is_multiple_of(4) => o,
                    _ => owner,
                };
                let got = h.run(k, now, false, |s, env, host| {
                    engine::release(s, env, host, &who, None)
                });
                let held = m.holds_it(k, &who, now.mono_us);
                if held {
                    m.holds[k] = None;
                }
                let released = got.as_ref().is_some_and(|g| *g == Reply::Int(1));
                assert_eq!(
                    released, held,
                    "step {steps}: RELEASE key {k} {who:?}: {got:?}"
                );
            }
            // A waiting request leaves (disconnect, CLIENT UNBLOCK).
            5 => {
                let ids: Vec<u64> = h.reqs.keys().copied().collect();
                if !ids.is_empty() {
                    let id = ids[r.below(ids.len())];
                    if h.reqs.get(&id).is_some_and(|q| q.multi) {
                        h.seen.left += 1;
                    }
                    h.leave(id);
                    m.leave(id);
                }
            }
            // Time passes: leases end and timeouts fire, in time order (a lease first at the
            // same instant).
            _ => {
                let target = mono_us
                    + match r.u8() % 4 {
                        0 => u64::from(r.u8()) * 10,
                        1 => u64::from(r.u16()),
                        2 => u64::from(r.u16()) * 20,
                        _ => 1000 * u64::from(r.u16() % 4096),
                    };
                for round in 0.. {
                    assert!(round < 10_000, "step {steps}: time never reaches {target}");
                    let lease = h
                        .server
                        .states
                        .iter()
                        .flatten()
                        .filter_map(|s| s.next_deadline().map(|d| d.mono_us))
                        .min();
                    let timeout = h.reqs.values().filter_map(|q| q.deadline_us).min();
                    let Some(t) = lease
                        .into_iter()
                        .chain(timeout)
                        .min()
                        .filter(|t| *t <= target)
                    else {
                        break;
                    };
                    mono_us = mono_us.max(t);
                    let now = at(mono_us);
                    for kk in 0..KEYS {
                        let due = h.server.states[kk]
                            .as_ref()
                            .and_then(LockState::next_deadline)
                            .is_some_and(|d| d.mono_us <= mono_us);
                        if due {
                            h.run(kk, now, false, |s, env, host| engine::expire(s, env, host));
                        }
                    }
                    h.drain_jobs(now);
                    m.settle(mono_us);
                    let due: Vec<u64> = h
                        .reqs
                        .iter()
                        .filter(|(_, q)| q.deadline_us.is_some_and(|d| d <= mono_us))
                        .map(|(id, _)| *id)
                        .collect();
                    for id in due {
                        if h.reqs.get(&id).is_some_and(|q| q.multi) {
                            h.seen.timed_out += 1;
                        }
                        h.leave(id);
                        m.leave(id);
                    }
                    h.drain_jobs(now);
                    m.settle(mono_us);
                }
                mono_us = target.max(mono_us);
            }
        }
        let now = at(mono_us);
        h.drain_jobs(now);
        m.settle(now.mono_us);
        top_token = check(&mut h, &mut m, now, steps, top_token);
    }
    (steps, h.seen)
}

/// After a step: the engine against the model, and the rules on the engine alone.
fn check(h: &mut Host, m: &mut Model, now: Now, steps: usize, top_token: u64) -> u64 {
    let mut top = top_token;
    let mut got = h.granted.clone();
    let mut want = m.granted.clone();
    got.sort_unstable();
    want.sort_unstable();
    assert_eq!(got, want, "step {steps}: the requests granted");
    let waiting: Vec<&u64> = h.reqs.keys().collect();
    let model_waiting: Vec<&u64> = m.reqs.keys().collect();
    assert_eq!(waiting, model_waiting, "step {steps}: the waiting requests");
    let mut any_live = false;
    for k in 0..KEYS {
        let q: Vec<u64> = h.server.queues[k].iter_live().map(|w| w.id).collect();
        assert_eq!(
            q,
            Vec::from(m.queues[k].clone()),
            "step {steps}: queue of key {k}"
        );
        let state = h.server.states[k].as_ref();
        let live: Vec<_> = state.map_or_else(Vec::new, |s| s.live(now).collect());
        assert!(
            live.len() <= 1,
            "step {steps}: key {k} has {} live grants (G1)",
            live.len()
        );
        any_live |= !live.is_empty();
        let want = m.live(k, now.mono_us).cloned();
        match (live.first(), want) {
            (None, None) => {}
            (Some(g), Some(hold)) => {
                assert_eq!(*g.owner, *hold.owner, "step {steps}: holder of key {k}");
                assert_eq!(
                    g.deadline.mono_us, hold.until_us,
                    "step {steps}: lease of {k}"
                );
                match hold.token {
                    Some(t) => assert_eq!(g.token, t, "step {steps}: token of key {k} kept"),
                    None => {
                        // Above every token seen before this step (G3).
                        assert!(g.token > top_token, "step {steps}: tokens grow (G3)");
                        top = top.max(g.token);
                        if let Some(x) = m.holds[k].as_mut() {
                            x.token = Some(g.token);
                        }
                    }
                }
            }
            (g, hold) => panic!("step {steps}: key {k}: engine {g:?}, model {hold:?}"),
        }
        // G10: a key is kept only for a grant or a waiter.
        if let Some(s) = state {
            assert!(
                !s.grants().is_empty() || !h.server.queues[k].is_empty(),
                "step {steps}: key {k} kept with neither grant nor waiter"
            );
        }
    }
    // No missed wake-up, no deadlock: nobody waiting could be granted now.
    for (&id, req) in &h.reqs {
        let grantable = req.keys.iter().all(|&k| {
            let holder = h.server.states[k]
                .as_ref()
                .and_then(|s| s.live(now).next().map(|g| g.owner.clone()));
            match holder {
                Some(o) => req.multi && *o == *req.owner,
                None => h.server.queues[k].is_front(id),
            }
        });
        assert!(
            !grantable,
            "step {steps}: request {id} {req:?} could be granted, waits"
        );
    }
    assert!(
        any_live || h.reqs.is_empty(),
        "step {steps}: no key is held, yet {} requests wait (deadlock)",
        h.reqs.len()
    );
    top
}
