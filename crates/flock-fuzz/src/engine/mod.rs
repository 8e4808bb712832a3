//! The lock engine against a reference model: random operation sequences on keys of every
//! kind (exclusive, shared, permits) run through `flock_core::engine` exactly as the module
//! runs them, with a host that plays the server (keyspace, wait queues, a replica fed by the
//! replicated effects over the wire). The operations: ACQUIRE in each mode, parsed from its
//! argv (with and without BLOCK, inside MULTI, with the key's limit, another one or one out of
//! range, with and without BOUND from one of a few client connections), RELEASE and RENEW with and without a token (the live one or a stale one), REVOKE of
//! all or of one owner, CHECK, FENCED's verdict, INFO, HOLDERS, timers, waiters leaving (then
//! a revisit) or vanishing, grants whose client left before the reply, a client connection
//! closing (its waits end, its bound grants end as on expiry), DEL, COPY (bound grants left
//! out; onto a waited name too: the waits of owners the copy holds grants of end with nil, and
//! shared waiters of another limit than the copy's are refused), RENAME (bound grants follow,
//! the bindings index moves them by key and token; the same look at the new name), travel through RDB (bound grants arrive without their connection), restarts with and without the token mark, failovers to the replica, clock steps (to
//! the microsecond of a deadline, too) and new settings (lock-delay, max-holders).
//!
//! The model is written from the contract (SPEC.md: "Lock kinds: exclusive, shared, counted",
//! "Token-qualified calls", "Connection-bound grants (BOUND)", G1-G7, G11), not from the
//! engine. Checked after every step: the replies, events, states and bindings against the
//! model, the bindings index against the bound grants (G11), G1 (an exclusive grant is alone, no key has more grants than
//! its limit), G2, G3 (tokens grow across kinds, restarts and failovers), G4, G5, G6
//! (hand-offs are the model's, in FIFO order; after a write a head that fits never waits and
//! the key is armed for its next deadline), G7 (the replica agrees with the master on
//! everything that travels), G9, and FLOCK.WATCH's rule (`watch.rs`: what a watcher of each
//! grant, and of token 0, is told after the step), and FLOCK.MACQUIRE without BLOCK (`multi.rs`:
//! the decision at the call against the model's, each key's grant against the model's ACQUIRE).

use crate::bytes::Bytes;
use flock_core::args::{self, AcquireArgs, ArgError};
use flock_core::engine::{self, Event, Reply, ReplyError};
use flock_core::fence::{self, Access};
use flock_core::state::Mode;
use flock_core::{Now, TokenIssuer, WaitQueue};
use flock_core::{MAX_OWNER_LEN, MAX_TOKEN};
use std::collections::VecDeque;
use std::sync::OnceLock;

/// FLOCK_FUZZ_TRACE set: every step is printed (to read a failing input's story).
fn tracing() -> bool {
    static ON: OnceLock<bool> = OnceLock::new();
    *ON.get_or_init(|| std::env::var_os("FLOCK_FUZZ_TRACE").is_some())
}

const KEYS: usize = 3;
/// Enough owners to fill a LIMIT 3 key and still have someone waiting.
const OWNERS: usize = 5;
/// A start time: 2023-11-14, in microseconds.
const WALL0_US: u64 = 1_700_000_000_000_000;
const MAX_TTL_MS: u64 = 86_400_000;
/// The settings a run picks from: `flock.max-holders` small enough that unlimited shared keys
/// reach it, and one above every LIMIT the run asks for.
const MAX_HOLDERS: [u32; 3] = [2, 3, 10];
const KEY_NAMES: [&[u8]; KEYS] = [b"k0", b"k1", b"k2"];

fn owner_bytes(o: usize) -> Vec<u8> {
    if o == OWNERS - 1 {
        vec![b'o'; MAX_OWNER_LEN]
    } else {
        vec![b'a' + o as u8]
    }
}

mod bound;
mod check;
mod model;
mod multi;
mod multi_block;
mod server;
mod travel;
mod watch;

use bound::{check_bindings, close_conn, copy_key, rename_key};
use check::{assert_same, events_view, short, show, Issued};
pub use model::BoundSeen;
use model::{MGrant, MKey, Model, Settings};
pub use multi_block::{multi_block_counted, multi_block_target, MultiSeen};
use server::Server;
use travel::travel;

/// The kind an ACQUIRE asks for: each key has a usual LIMIT, and now and then another one
/// (a limit mismatch, or a LIMIT above max-holders).
fn pick_mode(r: &mut Bytes<'_>, k: usize, max_holders: u32) -> Mode {
    let b = r.u8();
    match b % 8 {
        0..=2 => Mode::Exclusive,
        3 | 4 => Mode::Shared,
        _ if b >= 0xe0 => Mode::Permits([1, 2, 3, 4][usize::from(b & 3)]),
        _ => Mode::Permits((k as u32 + 1).min(max_holders)),
    }
}

/// FLOCK.ACQUIRE's argument list.
fn acquire_argv(
    k: usize,
    owner: &[u8],
    ttl_ms: u64,
    mode: Mode,
    bound: bool,
    block: bool,
) -> Vec<Vec<u8>> {
    let mut argv = vec![
        b"FLOCK.ACQUIRE".to_vec(),
        KEY_NAMES[k].to_vec(),
        owner.to_vec(),
        ttl_ms.to_string().into_bytes(),
    ];
    match mode {
        Mode::Exclusive => {}
        Mode::Shared => argv.push(b"SHARED".to_vec()),
        Mode::Permits(n) => argv.extend([b"LIMIT".to_vec(), n.to_string().into_bytes()]),
    }
    if bound {
        argv.push(b"BOUND".to_vec());
    }
    if block {
        argv.extend([b"BLOCK".to_vec(), b"0".to_vec()]);
    }
    argv
}

/// The live grants of key `k` other than `owner`'s, as (token, deadline): what an operation
/// of `owner` must leave alone (G2).
fn others(real: &Server, k: usize, owner: Option<&[u8]>, now: Now) -> Vec<(u64, u64)> {
    real.states[k].as_ref().map_or_else(Vec::new, |s| {
        s.live(now)
            .filter(|g| owner.is_some_and(|o| *g.owner != *o))
            .map(|g| (g.token, g.deadline.mono_us))
            .collect()
    })
}

/// libFuzzer target: a random sequence of operations on three keys.
pub fn state_machine_target(data: &[u8]) {
    state_machine_run(data);
}

/// [`state_machine_target`], returning the number of steps it ran (what the smoke test
/// reports, so a driver that stops early shows).
pub fn state_machine_run(data: &[u8]) -> usize {
    state_machine_counted(data).0
}

/// Client connections: a few at a time, each with an id the server never gives again once
/// it closed.
const CONNS: usize = 3;

/// [`state_machine_run`], with how often each BOUND path ran.
pub fn state_machine_counted(data: &[u8]) -> (usize, BoundSeen) {
    let mut r = Bytes::new(data);
    let mut wall_us: u64 = WALL0_US + u64::from(r.u32());
    let mut mono_us: u64 = 1_000_000 + u64::from(r.u16());
    let mut set = Settings {
        lock_delay_ms: [0, 0, 0, 5, 50, 400][r.below(6)],
        max_holders: MAX_HOLDERS[r.below(3)],
        max_waiters: [2, 3, 100, 100][r.below(4)],
    };
    let mut real = Server::empty();
    let mut model = Model {
        keys: vec![MKey::default(); KEYS],
        high_water: 0,
        vanished: Vec::new(),
        issued: Issued::default(),
        handed: Vec::new(),
        dismissed: Vec::new(),
        refused: Vec::new(),
        recent_handoffs: VecDeque::new(),
        step: 0,
        max_holders_seen: set.max_holders,
        events: Vec::new(),
        waiter_conn: Default::default(),
        seen: BoundSeen::default(),
    };
    // The open connections' ids (Redis's client ids count up from 1).
    let mut conns: [u64; CONNS] = [1, 2, 3];
    let mut next_conn = CONNS as u64;
    let mut steps = 0usize;
    // Each key's timer as the glue's deadline index keeps it: the last deadline the engine
    // armed it for (`Some(None)`: disarmed), kept across steps that arm nothing (an operation
    // that leaves the key as it was does not arm it again), gone with the key, and set anew
    // for every key after it travelled (the glue arms every lock when loading ends).
    let mut timers: Vec<Option<Option<u64>>> = vec![None; KEYS];

    while !r.done() && steps < 4000 {
        steps += 1;
        model.step = steps;
        model.handed.clear();
        model.dismissed.clear();
        model.refused.clear();
        model.events.clear();
        // The engine's hand-offs in this step, to compare with the model's (FIFO, G6).
        let mut delivered: Vec<(u64, u64)> = Vec::new();
        // The engine's keyspace notifications in this step.
        let mut events: Vec<Event> = Vec::new();
        // The timer the engine armed for the key in this step.
        let mut armed = None;
        let now = Now::new(wall_us, mono_us);
        // What FLOCK.WATCH's watchers of each key watch before the step.
        let watched: Vec<Vec<(u64, Vec<u8>)>> = real
            .states
            .iter()
            .map(|s| watch::live_before(s.as_ref(), now))
            .collect();
        let op = r.u8() % 25;
        let k = r.below(KEYS);
        let o = r.below(OWNERS);
        let owner = owner_bytes(o);
        let ttl_ms: u64 = match r.u8() % 4 {
            0 => 1,
            1 => 1 + u64::from(r.u8()),
            2 => 1 + u64::from(r.u16()),
            _ => 1000,
        };
        // A token for RELEASE and RENEW: none, the owner's live one, or a recent one (often
        // stale, or another owner's).
        let token = match r.u8() % 4 {
            0 | 1 => None,
            2 => model.keys[k]
                .live(now)
                .find(|g| g.owner == owner)
                .map(|g| g.token)
                .or_else(|| Some(model.issued.recent(&mut r))),
            _ => Some(model.issued.recent(&mut r)),
        };
        // A write command ran on the key (G6 is checked after it).
        let mut write = false;
        let mut full = false;
        // The key the step wrote to (a ghost's key may be another).
        let mut touched = k;
        // The reply of the step, for the trace.
        let mut said = String::new();

        match op {
            // FLOCK.ACQUIRE in some mode, with or without BLOCK
            0..=5 => {
                if real.tokens.high_water() >= MAX_TOKEN {
                    continue;
                }
                let mode = pick_mode(&mut r, k, set.max_holders);
                // Inside MULTI/EXEC or a script BLOCK answers at once.
                let can_block = !r.u8().is_multiple_of(8);
                // From one of the open connections, with BOUND half of the time (inside
                // MULTI/EXEC too: it binds to the client).
                let c = r.u8();
                let conn = conns[usize::from(c) % CONNS];
                let argv = acquire_argv(k, &owner, ttl_ms, mode, c & 0x80 != 0, op >= 3);
                let refs: Vec<&[u8]> = argv.iter().map(|a| &a[..]).collect();
                let a = match args::parse_acquire(&refs, MAX_TTL_MS, set.max_holders) {
                    Ok(a) => a,
                    Err(e) => {
                        // The limit's range comes before anything about the key.
                        assert_eq!(
                            e,
                            ArgError::Limit {
                                max: set.max_holders
                            },
                            "step {steps}: {argv:?}"
                        );
                        assert!(mode.limit() > set.max_holders, "step {steps}: {e:?}");
                        continue;
                    }
                };
                assert_eq!(
                    (a.mode, a.ttl_ms, a.block.is_some(), a.bound),
                    (mode, ttl_ms, op >= 3, c & 0x80 != 0)
                );
                let bind_to = a.bound.then_some(conn);
                let before = real.states[k]
                    .as_ref()
                    .and_then(|s| s.owner_grant(&owner, now).map(|g| (g.token, s.mode)));
                // As the glue does: a key that does not exist is offered to the engine's
                // free-key path first (which leaves the other cases to `acquire`).
                let (got, out) = real
                    .run(k, now, set, true, |s, env, host| {
                        engine::acquire(s, env, host, &a, can_block, bind_to)
                    })
                    .expect("ACQUIRE creates the key");
                delivered = out.delivered;
                events.extend(out.events);
                armed = out.armed;
                write = true;
                let asked = AcquireArgs {
                    block: a.block.filter(|_| can_block),
                    ..a
                };
                let want = model.acquire(k, &asked, now, set, out.blocked, bind_to, conn);
                model.publish(k, now);
                assert_eq!(got, want, "step {steps}: ACQUIRE {argv:?}");
                said = format!("{:?} bind {bind_to:?} {got:?}", a.mode);
                // G4 from the state before the call alone: the holder gets its own token in
                // the mode it holds, an error in another.
                if let Some((t, held)) = before {
                    let want = if held == mode {
                        Reply::Int(t as i64)
                    } else {
                        Reply::Error(ReplyError::OwnerHolds(held))
                    };
                    assert_eq!(got, want, "step {steps}: the holder repeats ACQUIRE (G4)");
                }
                full = true;
            }
            // FLOCK.RELEASE, FLOCK.RENEW, FLOCK.REVOKE (on an existing lock only)
            6..=9 => {
                let revoke_owner = (r.u8() & 1 == 0).then_some(&owner[..]);
                let spared = match op {
                    9 => revoke_owner,
                    _ => Some(&owner[..]),
                };
                let before = others(&real, k, spared, now);
                let ran = match op {
                    // As the glue does: a key held by one grant alone (its compact form)
                    // is offered to the engine's one-grant path first.
                    6 | 7 => real.run(k, now, set, false, |s, env, host| {
                        engine::release(s, env, host, &owner, token)
                    }),
                    8 => real.run(k, now, set, false, |s, env, host| {
                        engine::renew(s, env, host, &owner, ttl_ms, token)
                    }),
                    _ => real.run(k, now, set, false, |s, env, host| {
                        engine::revoke(s, env, host, revoke_owner)
                    }),
                };
                let Some((got, out)) = ran else {
                    assert!(!model.keys[k].exists, "step {steps}: key {k} should exist");
                    continue;
                };
                delivered = out.delivered;
                events.extend(out.events);
                armed = out.armed;
                write = true;
                let want = match op {
                    6 | 7 => model.release(k, &owner, token, now, set),
                    8 => model.renew(k, &owner, ttl_ms, token, now, set),
                    _ => model.revoke(k, revoke_owner, now, set),
                };
                assert_eq!(
                    got, want,
                    "step {steps}: op {op} key {k} owner {o} token {token:?}"
                );
                said = format!("{got:?}");
                // G2: nothing but its owner (or REVOKE) ends or extends a live grant.
                let after = others(&real, k, spared, now);
                for g in &before {
                    assert!(after.contains(g), "step {steps}: grant {g:?} touched (G2)");
                }
            }
            // FLOCK.MACQUIRE (no BLOCK) of 1 to 3 keys in some order: the decision at the call
            // against the model's, then each key granted as the module grants it (an ordinary
            // ACQUIRE at the call's instant) against the model's ACQUIRE of that key.
            24 => {
                if real.tokens.high_water() >= MAX_TOKEN {
                    continue;
                }
                let n = 1 + r.below(KEYS);
                let mut ks: Vec<usize> = (0..KEYS).collect();
                ks.rotate_left(r.below(KEYS));
                if r.u8() & 1 == 1 {
                    ks.reverse();
                }
                ks.truncate(n);
                let c = r.u8();
                let conn = conns[usize::from(c) % CONNS];
                let mut argv: Vec<Vec<u8>> =
                    vec![b"FLOCK.MACQUIRE".to_vec(), n.to_string().into_bytes()];
                argv.extend(ks.iter().map(|&k| KEY_NAMES[k].to_vec()));
                argv.extend([owner.clone(), ttl_ms.to_string().into_bytes()]);
                if c & 0x80 != 0 {
                    argv.push(b"BOUND".to_vec());
                }
                let refs: Vec<&[u8]> = argv.iter().map(|a| &a[..]).collect();
                let a = flock_core::multi::parse_macquire(&refs, MAX_TTL_MS, set.max_holders)
                    .unwrap_or_else(|e| panic!("step {steps}: {argv:?}: {e:?}"));
                let bind_to = a.acquire.bound.then_some(conn);
                let looks: Vec<flock_core::multi::KeyLook<'_>> = ks
                    .iter()
                    .map(|&k| flock_core::multi::KeyLook {
                        state: real.states[k].as_ref(),
                        waiting: real.queues[k].len(),
                        owner_in_queue: real.queues[k].has_owner(&owner),
                    })
                    .collect();
                let got = flock_core::multi::at_call(&looks, &owner, now, set.lock_delay_ms);
                let want = multi::decide(&model, &ks, &owner, now, set.lock_delay_ms);
                assert_eq!(got, want, "step {steps}: MACQUIRE {ks:?} owner {o}");
                said = format!("MACQUIRE {ks:?} {got:?}");
                if got == flock_core::multi::Decision::Grant {
                    for &kk in &ks {
                        let (reply, out) = real
                            .run(kk, now, set, true, |s, env, host| {
                                flock_core::multi::grant_key(s, env, host, &a.acquire, bind_to, now)
                            })
                            .expect("MACQUIRE creates the key");
                        delivered.extend(out.delivered);
                        events.extend(out.events);
                        if out.armed.is_some() {
                            timers[kk] = out.armed;
                        }
                        armed = out.armed;
                        let want = model.acquire(kk, &a.acquire, now, set, None, bind_to, conn);
                        model.publish(kk, now);
                        assert!(matches!(reply, Reply::Int(_)), "step {steps}: {reply:?}");
                        assert_eq!(reply, want, "step {steps}: MACQUIRE key {kk}");
                        touched = kk;
                    }
                    write = true;
                    full = true;
                }
            }
            // FLOCK.CHECK of a recent token (read-only: no settle)
            10 => {
                let t = model.issued.recent(&mut r);
                let got = engine::check(real.states[k].as_ref(), t, now);
                let want = model.keys[k]
                    .live(now)
                    .find(|g| g.token == t)
                    .map_or(0, |g| g.remaining_ms(now));
                assert_eq!(
                    got,
                    Reply::Int(want as i64),
                    "step {steps}: CHECK key {k} token {t}"
                );
                // FENCED runs under a live grant only, read-only under a shared one (G5).
                let live = model.keys[k].live(now).any(|g| g.token == t);
                let want = match model.keys[k].mode {
                    _ if !live => Access::Refused,
                    Mode::Shared => Access::ReadOnly,
                    Mode::Exclusive | Mode::Permits(_) => Access::ReadWrite,
                };
                assert_eq!(
                    fence::access(real.states[k].as_ref(), t, now),
                    want,
                    "step {steps}: FENCED key {k} token {t}"
                );
            }
            // FLOCK.INFO and FLOCK.HOLDERS (read-only)
            11 => {
                let q = &real.queues[k];
                let got = engine::info(real.states[k].as_ref(), q.len(), q.shared_mode(), now);
                assert_eq!(got, model.info(k, now), "step {steps}: INFO key {k}");
                let got = engine::holders(real.states[k].as_ref(), now);
                let want: Vec<(&[u8], u64, u64)> = model.keys[k]
                    .live(now)
                    .map(|g| (&g.owner[..], g.token, g.remaining_ms(now)))
                    .collect();
                assert_eq!(got, Reply::Holders(want), "step {steps}: HOLDERS key {k}");
            }
            // Time passes; now and then the wall clock steps (NTP, an operator, a VM resume).
            12 | 13 => {
                // A key with a bound grant that lost its connection is due at once: its timer
                // fires before time goes on.
                for (kk, timer) in timers.iter_mut().enumerate() {
                    if model.has_lost(kk) {
                        let (_, out) = real
                            .run(kk, now, set, false, |s, env, host| {
                                engine::expire(s, env, host)
                            })
                            .expect("a key with grants exists");
                        delivered.extend(out.delivered);
                        events.extend(out.events);
                        if out.armed.is_some() {
                            *timer = out.armed;
                        }
                        model.settle(kk, now, set);
                    }
                }
                let d_us = match r.u8() % 5 {
                    // To the key's next lease or slot end, to the microsecond: the edge
                    // where a lease stops being live.
                    4 => {
                        let mk = &model.keys[k];
                        mk.grants
                            .iter()
                            .map(|g| g.mono_us)
                            .chain(mk.delays.iter().map(|d| d.0))
                            .filter(|&m| m > mono_us)
                            .min()
                            .map_or(0, |m| m - mono_us)
                    }
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
            14 => {
                let ran = real.run(k, now, set, false, |s, env, host| {
                    engine::expire(s, env, host)
                });
                if let Some((_, out)) = ran {
                    delivered = out.delivered;
                    events.extend(out.events);
                    armed = out.armed;
                    write = true;
                    model.settle(k, now, set);
                }
            }
            // A waiter leaves (timeout, disconnect, CLIENT UNBLOCK: its queue hears of it),
            // and the key is looked at again, as `engine::revisit` is for: the waiter may
            // have been a head that held those behind it.
            15 => {
                let mk = &mut model.keys[k];
                if !mk.queue.is_empty() {
                    let i = r.below(mk.queue.len());
                    let w = mk.queue.remove(i).expect("waiter");
                    model.waiter_conn.remove(&w.id);
                    assert!(real.queues[k].cancel(w.id), "step {steps}: cancel");
                    assert!(
                        !real.queues[k].cancel(w.id),
                        "step {steps}: cancelled twice"
                    );
                    let found = if real.states[k].is_some() {
                        engine::Found::Lock
                    } else {
                        engine::Found::Nothing
                    };
                    let plan =
                        engine::plan_revisit(true, found, None, real.queues[k].len(), || true);
                    if plan == engine::RevisitPlan::Revisit {
                        let (_, out) = real
                            .run(k, now, set, true, |s, env, host| {
                                engine::revisit(s, env, host, None)
                            })
                            .expect("revisit runs");
                        delivered = out.delivered;
                        events.extend(out.events);
                        armed = out.armed;
                        write = true;
                        model.keys[k].exists = true;
                        model.settle(k, now, set);
                    }
                }
                full = true;
            }
            // A waiter's client goes away unnoticed by its queue: the grant skips it.
            16 => {
                let mk = &model.keys[k];
                if !mk.queue.is_empty() {
                    let w = &mk.queue[r.below(mk.queue.len())];
                    real.vanished.push(w.id);
                    model.vanished.push(w.id);
                }
            }
            // A grant handed to a waiter whose client went away before the reply: the
            // module releases it again by its token (a revisit with a ghost).
            17 => {
                let pick = match model.recent_handoffs.len() {
                    0 => None,
                    n => Some(model.recent_handoffs[r.below(n)]),
                };
                if let Some((kk, t)) = pick {
                    model.recent_handoffs.retain(|&(_, x)| x != t);
                    let found = match real.states[kk] {
                        Some(_) => engine::Found::Lock,
                        None => engine::Found::Nothing,
                    };
                    let plan =
                        engine::plan_revisit(true, found, Some(t), real.queues[kk].len(), || true);
                    if plan == engine::RevisitPlan::Revisit {
                        let (_, out) = real
                            .run(kk, now, set, false, |s, env, host| {
                                engine::revisit(s, env, host, Some(t))
                            })
                            .expect("the key exists");
                        delivered = out.delivered;
                        events.extend(out.events);
                        armed = out.armed;
                        write = true;
                        let key = &mut model.keys[kk];
                        // Only a live grant is released (one that ran out expires instead).
                        let before = key.grants.len();
                        key.grants.retain(|g| !(g.token == t && g.live(now)));
                        if key.grants.len() < before {
                            model.events.push(Event::Released {
                                held_ms: 0,
                                token: t,
                            });
                        }
                        model.settle(kk, now, set);
                    } else {
                        assert!(!model.keys[kk].exists, "step {steps}: ghost plan");
                    }
                    touched = kk;
                    full = true;
                }
            }
            // DEL / UNLINK / FLUSHALL / eviction of the key: the lock is gone (Redis
            // replicates the DEL), the waiters stay and get the key right after (G3: tokens
            // keep growing), through a revisit.
            18 => {
                real.states[k] = None;
                real.replica.keys[k] = None;
                real.bindings.key_gone(k);
                model.keys[k].forget_lock();
                let found = engine::Found::Nothing;
                let plan = engine::plan_revisit(true, found, None, real.queues[k].len(), || true);
                if plan == engine::RevisitPlan::Revisit {
                    let (_, out) = real
                        .run(k, now, set, true, |s, env, host| {
                            engine::revisit(s, env, host, None)
                        })
                        .expect("revisit creates the key");
                    delivered = out.delivered;
                    events.extend(out.events);
                    armed = out.armed;
                    write = true;
                    model.keys[k].exists = true;
                    model.settle(k, now, set);
                } else {
                    assert!(model.keys[k].queue.is_empty());
                }
                full = true;
            }
            // The key travels: RDB save/load, AOF, a replica's copy, DUMP/RESTORE. What
            // travels is the kind, the grants (owner, token, absolute wall-clock deadline)
            // and the delayed slots' ends (G7); waiters stay (DEBUG RELOAD keeps the clients).
            19 => {
                full = true;
                for kk in 0..KEYS {
                    travel(&mut real, &mut model, kk, now);
                }
                for (kk, timer) in timers.iter_mut().enumerate() {
                    *timer = real.states[kk]
                        .as_ref()
                        .map(|s| s.next_deadline().map(|d| d.mono_us));
                }
            }
            // A client connection closes (exit, kill, CLIENT KILL, timeout).
            21 => {
                let slot = r.below(CONNS);
                let c = conns[slot];
                next_conn += 1;
                conns[slot] = next_conn;
                let (d, e, t) = close_conn(&mut real, &mut model, c, now, set, &mut timers);
                delivered = d;
                events = e;
                if let Some(t) = t {
                    touched = t;
                    write = true;
                }
                said = format!("client {c} closed");
                full = true;
            }
            // COPY of the key to another one, with or without REPLACE.
            22 => {
                let dst = (k + 1 + r.below(KEYS - 1)) % KEYS;
                let replace = r.u8() & 1 == 0;
                let done = copy_key(
                    &mut real,
                    &mut model,
                    k,
                    dst,
                    replace,
                    now,
                    set,
                    &mut timers,
                );
                if let Some((d, e, t)) = done {
                    (delivered, events) = (d, e);
                    touched = t.unwrap_or(dst);
                    write = true;
                    said = format!("COPY to {dst} replace {replace}");
                }
                full = true;
            }
            // RENAME of the key to another name (over a lock there, or not).
            23 => {
                let dst = (k + 1 + r.below(KEYS - 1)) % KEYS;
                if let Some((d, e, t)) =
                    rename_key(&mut real, &mut model, k, dst, now, set, &mut timers)
                {
                    (delivered, events) = (d, e);
                    touched = t.unwrap_or(dst);
                    write = true;
                    said = format!("RENAME to {dst}");
                }
                full = true;
            }
            // A restart or a failover: state travels, waiters are gone; the high-water mark
            // comes along (RDB aux data; a failover has the replica's) or not (an AOF
            // without preamble).
            _ => {
                full = true;
                let how = r.u8() & 7;
                let keep_mark = how >= 2;
                let old_mark = real.tokens.high_water();
                if how == 7 {
                    // A failover: the replica becomes the master with what it applied and
                    // the token mark it raised on the way (G3 for grants that reached it).
                    for kk in 0..KEYS {
                        real.states[kk] = real.replica.keys[kk].clone();
                    }
                    real.tokens = std::mem::take(&mut real.replica.tokens);
                    model.high_water = 0;
                } else {
                    real.tokens = TokenIssuer::new();
                    if keep_mark {
                        real.tokens.observe(old_mark);
                    } else {
                        model.high_water = 0;
                    }
                }
                for kk in 0..KEYS {
                    real.queues[kk] = WaitQueue::default();
                    model.keys[kk].queue.clear();
                    travel(&mut real, &mut model, kk, now);
                }
                for (kk, timer) in timers.iter_mut().enumerate() {
                    *timer = real.states[kk]
                        .as_ref()
                        .map(|s| s.next_deadline().map(|d| d.mono_us));
                }
                real.vanished.clear();
                model.vanished.clear();
                model.recent_handoffs.clear();
                // A new process: no binding, every client connects anew.
                real.bindings.clear();
                model.waiter_conn.clear();
                for c in &mut conns {
                    next_conn += 1;
                    *c = next_conn;
                }
                // Without the mark, G3 across the restart rests on the clock alone: the first
                // token issued after it must be above the old mark when the clock is.
                if how == 7 {
                    model.high_water = real.tokens.high_water();
                }
                if !keep_mark {
                    model.high_water = real.tokens.high_water();
                    let floor = model.issued.clock_floor.unwrap_or(0).max(old_mark);
                    model.issued.clock_floor = Some(floor);
                }
                // New settings now and then (CONFIG SET): lowering max-holders changes no
                // live key's limit.
                set.lock_delay_ms = [0, 0, 3, 100][r.below(4)];
                set.max_holders = MAX_HOLDERS[r.below(3)];
                model.max_holders_seen = model.max_holders_seen.max(set.max_holders);
            }
        }
        if tracing() {
            let q: Vec<String> = real.queues[touched]
                .clone()
                .drain()
                .iter()
                .map(|w| format!("{}:{}:{:?}", w.id, short(&w.owner), w.mode))
                .collect();
            eprintln!(
                "step {steps}: op {op} key {k} owner {} ttl {ttl_ms} token {token:?} at \
                 {}/{}: {said} handed {:?}\n  real {} queue {q:?}",
                short(&owner),
                now.mono_us,
                now.wall_ms,
                model.handed,
                real.states[touched].as_ref().map_or("-".into(), show),
            );
        }
        assert_eq!(
            delivered, model.handed,
            "step {steps}: hand-offs of key {touched} (FIFO)"
        );
        assert_eq!(
            events_view(&events),
            events_view(&model.events),
            "step {steps}: events (engine, model): {events:?} {:?}",
            model.events
        );
        check_bindings(&real, &model, steps);
        if let Some(before) = watched.get(touched) {
            watch::check(
                before,
                real.states[touched].as_ref(),
                &events,
                &model,
                touched,
                now,
                steps,
            );
        }
        // G6: a key that stays is armed no later than its next lease or slot end, so that
        // an expiry hands it on at once rather than at the next command. (Earlier is allowed:
        // a key with several grants keeps a lower bound of its next end, made exact when its
        // timer fires; a timer that comes early settles nothing and is armed again.)
        if armed.is_some() {
            timers[touched] = armed;
        }
        if real.states[touched].is_none() {
            timers[touched] = None;
        }
        let armed = timers[touched];
        if write && real.states[touched].is_some() {
            let mk = &model.keys[touched];
            let next = mk
                .grants
                .iter()
                .map(MGrant::due_us)
                .chain(mk.delays.iter().map(|d| d.0))
                .min();
            let in_time = match (armed, next) {
                (Some(Some(at)), Some(due)) => at <= due,
                (Some(a), n) => a == n,
                (None, _) => false,
            };
            assert!(
                in_time,
                "step {steps}: the timer of key {touched}: armed {armed:?}, next end {next:?}"
            );
            // Exact for a key with one grant or none (its due time is the grant's).
            if mk.grants.len() <= 1 && mk.delays.is_empty() {
                assert_eq!(
                    armed,
                    Some(next),
                    "step {steps}: the timer of key {touched}"
                );
            }
        }
        for kk in 0..KEYS {
            let here = kk == touched;
            assert_same(
                &mut real,
                &model,
                kk,
                now,
                set,
                steps,
                write && here,
                full || here && steps.is_multiple_of(16),
            );
        }
    }
    model.seen.twin_binds = real.bindings.twin_binds;
    model.seen.twin_moves = real.bindings.twin_moves;
    (steps, model.seen)
}
