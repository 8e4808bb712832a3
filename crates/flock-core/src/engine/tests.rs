//! Table tests of the engine: each case runs operations on one key through a host that
//! records every effect, and checks replies and effects step by step.

use super::*;
use crate::queue::WaitQueue;
use crate::snapshot::Snapshot;
use crate::state::LockState;

const T0: Now = Now {
    wall_us: 1_700_000_000_000_000,
    wall_ms: 1_700_000_000_000,
    mono_us: 5_000_000,
};

fn at(ms: u64) -> Now {
    Now::new(T0.wall_us + ms * 1000, T0.mono_us + ms * 1000)
}

/// A host that keeps the key's waiters and writes down, in a short notation, what happened to
/// the queue as the engine asked (`replaced`, `vanished`) and then every effect, in order, as
/// the executor carries them out after the operation.
#[derive(Default)]
struct Recorder {
    queue: WaitQueue,
    /// Waiters that left without the queue knowing (deliver fails for them).
    vanished: Vec<u64>,
    delivered: Vec<(u64, u64)>,
    blocked: Vec<Vec<u8>>,
    max_waiters: usize,
    log: Vec<String>,
    deleted: bool,
}

/// The short notation of what a replication effect sends.
fn snapshot_text(s: Option<Snapshot<'_>>) -> String {
    match s {
        Some(Snapshot::Held(g)) if g.bound() => {
            format!("repl bound grant {}", String::from_utf8_lossy(&g.owner))
        }
        Some(Snapshot::Held(g)) => format!("repl grant {}", String::from_utf8_lossy(&g.owner)),
        Some(Snapshot::Delayed { .. }) => "repl delay".into(),
        Some(Snapshot::Full(s)) => {
            let owners: Vec<String> = s
                .grants()
                .by_token()
                .into_iter()
                .map(|g| String::from_utf8_lossy(&g.owner).into_owned())
                .collect();
            format!(
                "repl {} [{}] delays {}",
                s.mode.name(),
                owners.join(" "),
                s.delays.len()
            )
        }
        None => "repl nothing".into(),
    }
}

impl Recorder {
    /// Write `e` down; `snapshot` is what a replication sends (the state the operation left).
    fn log_effect(&mut self, e: Effect, snapshot: impl FnOnce() -> String) {
        let s = match e {
            Effect::Notify(ev) => ev.name().trim_start_matches("flock.").to_string(),
            Effect::Count(Count::Renewed) => "renewed".into(),
            Effect::Count(Count::Contended) => "contended".into(),
            Effect::Replicate | Effect::ReplicateSoFar(_) => snapshot(),
            Effect::ReplicateDelete => "repl del".into(),
            Effect::ReplicateVerbatim => "repl verbatim".into(),
            Effect::DeleteKey => {
                self.deleted = true;
                "delete".into()
            }
            Effect::Arm(Some(_)) => "arm".into(),
            Effect::Arm(None) => "disarm".into(),
            Effect::Bind { client, .. } => format!("bind {client}"),
            Effect::Unbind { client, .. } => format!("unbind {client}"),
            Effect::TryMulti { waiter } => format!("try multi {waiter}"),
        };
        self.log.push(s);
    }
}

/// Run `op` as the module's executor does: on the key as its store holds it (its one grant
/// read in place when that is all it is and nobody waits, as the compact form; else its whole
/// state; `Free` when there is no key), then carry the outcome out: each effect written down
/// in order (a replication as the state the operation left), the key's fate kept, the key
/// deleted when told.
fn execute(
    slot: &mut Option<LockState>,
    host: &mut Recorder,
    op: impl FnOnce(Stored<'_>, &mut Recorder) -> Outcome,
) -> Reply<'static> {
    let lone = slot
        .as_ref()
        .filter(|_| host.queue.is_empty())
        .and_then(LockState::lone_grant)
        .map(|(mode, g)| (mode, g.clone()));
    let outcome = match (&lone, slot.as_mut()) {
        (Some((mode, g)), _) => op(Stored::Lone(LoneGrant::of(*mode, g)), host),
        (None, Some(state)) => op(Stored::Full(state), host),
        (None, None) => op(Stored::Free, host),
    };
    let Outcome {
        reply,
        effects,
        fate,
    } = outcome;
    let mut scratch = None;
    for &e in effects.as_slice() {
        let kept = slot.as_ref();
        host.log_effect(e, || snapshot_text(fate.snapshot_with(kept, &mut scratch)));
    }
    if let Some(state) = fate.into_state() {
        *slot = Some(state);
    }
    if effects.deletes_key() {
        *slot = None;
    }
    reply
}

impl Waiters for Recorder {
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
            self.log.push(format!("vanished {}", w.id));
            return false;
        }
        self.delivered.push((w.id, token));
        true
    }
    fn dismiss(&mut self, owner: &[u8]) -> bool {
        let Some(w) = self.queue.take_owner(owner) else {
            return false;
        };
        self.log.push(format!("dismissed {}", w.id));
        true
    }
    fn refuse_other_limits(&mut self, limit: Mode) -> usize {
        let out = self.queue.take_other_limits(limit);
        for w in &out {
            let text = ReplyError::LimitMismatch(limit).message(b"k");
            self.log.push(format!("refused {}: {text}", w.id));
        }
        out.len()
    }
    fn block(
        &mut self,
        args: &AcquireArgs<'_>,
        _timeout: u64,
        bind_to: Option<u64>,
    ) -> Result<(), BlockRefused> {
        if self.queue.len() >= self.max_waiters {
            return Err(BlockRefused::TooMany);
        }
        let id = self.blocked.len() as u64 + 1;
        self.blocked.push(args.owner.to_vec());
        let replaced = self.queue.push(Waiter {
            id,
            owner: args.owner.into(),
            ttl_ms: args.ttl_ms,
            mode: args.mode,
            bind_to,
            multi: false,
        });
        if let Some(r) = replaced {
            self.log.push(format!("replaced {}", r.id));
        }
        Ok(())
    }
}

#[derive(Clone, Copy, Debug)]
enum Op {
    Acquire(&'static str, u64),
    AcquireBlock(&'static str, u64),
    /// ACQUIRE in a mode, with BLOCK when the flag says so.
    Kind(&'static str, Mode, u64, bool),
    /// Exclusive ACQUIRE ... BOUND from connection `client`, with BLOCK when the flag says so.
    Bound(&'static str, u64, u64, bool),
    /// Connection `client` closed.
    Close(u64),
    /// The key arrived on a master from outside (restart, RESTORE, promotion).
    Orphan,
    RevokeOwner(&'static str),
    Release(&'static str),
    Renew(&'static str, u64),
    Revoke,
    Expire,
    /// The waiter with this id left without the queue hearing of it.
    Vanish(u64),
    /// A grant's client went away before its reply: release that grant (the n-th delivered).
    Ghost(usize),
    /// The waiter with this id left (timeout, disconnect) and its queue heard of it; the
    /// host then looks at the key again.
    Leave(u64),
    /// A value holding one grant of this owner, kind and lease arrives under the key's name
    /// (COPY, RENAME, MOVE, RESTORE), replacing what was there; with the flag, the look the
    /// module takes right after the command follows (without it, another command on the key
    /// comes first, as inside MULTI).
    Arrive(&'static str, Mode, u64, bool),
    /// The module looks at the key again (a deferred revisit).
    Look,
}

/// The key as the module keeps it: absent, or a state.
struct Key {
    state: Option<LockState>,
    tokens: TokenIssuer,
    host: Recorder,
}

impl Key {
    fn run(&mut self, op: Op, now: Now, lock_delay_ms: u64) -> (String, Vec<String>) {
        self.host.log.clear();
        self.host.deleted = false;
        let mut env = Env {
            now,
            lock_delay_ms,
            max_holders: 3,
            master: true,
            tokens: &mut self.tokens,
        };
        let host = &mut self.host;
        // Commands that need an existing lock answer for a missing key without the engine,
        // as the module does; ACQUIRE starts from a fresh state.
        let needs_lock = !matches!(
            op,
            Op::Acquire(..)
                | Op::AcquireBlock(..)
                | Op::Kind(..)
                | Op::Bound(..)
                | Op::Vanish(_)
                | Op::Arrive(..)
        );
        if needs_lock && self.state.is_none() {
            return ("missing".into(), Vec::new());
        }
        let ex = |slot: &mut Option<LockState>,
                  host: &mut Recorder,
                  op: &mut dyn FnMut(Stored<'_>, &mut Recorder) -> Outcome| {
            format!("{:?}", execute(slot, host, op))
        };
        let slot = &mut self.state;
        let reply = match op {
            Op::Acquire(o, ttl)
            | Op::AcquireBlock(o, ttl)
            | Op::Kind(o, _, ttl, _)
            | Op::Bound(o, _, ttl, _) => {
                let (mode, block, bind_to) = match op {
                    Op::Kind(_, mode, _, block) => (mode, block, None),
                    Op::Bound(_, client, _, block) => (Mode::Exclusive, block, Some(client)),
                    _ => (Mode::Exclusive, matches!(op, Op::AcquireBlock(..)), None),
                };
                let args = AcquireArgs {
                    owner: o.as_bytes(),
                    ttl_ms: ttl,
                    mode,
                    bound: bind_to.is_some(),
                    block: block.then_some(0),
                };
                ex(slot, host, &mut |st, h| {
                    acquire(st, &mut env, h, &args, true, bind_to)
                })
            }
            Op::Close(client) => {
                ex(slot, host, &mut |st, h| close(st, &mut env, h, client));
                "-".into()
            }
            Op::Orphan => {
                // The key travels (RDB, RESTORE, a replica's copy) and arrives on a master.
                let state = slot.get_or_insert_with(LockState::default);
                let image = crate::snapshot::LockImage::of(state);
                *state = load(image, now, env.tokens);
                let lost = orphan_bound(state, true);
                let live = state.live_count(now);
                format!("{lost} live {live}")
            }
            Op::RevokeOwner(o) => ex(slot, host, &mut |st, h| {
                revoke(st, &mut env, h, Some(o.as_bytes()))
            }),
            Op::Release(o) => ex(slot, host, &mut |st, h| {
                release(st, &mut env, h, o.as_bytes(), None)
            }),
            Op::Renew(o, ttl) => ex(slot, host, &mut |st, h| {
                renew(st, &mut env, h, o.as_bytes(), ttl, None)
            }),
            Op::Revoke => ex(slot, host, &mut |st, h| revoke(st, &mut env, h, None)),
            Op::Expire => {
                ex(slot, host, &mut |st, h| expire(st, &mut env, h));
                "-".into()
            }
            Op::Vanish(id) => {
                // (As before: the key, if absent, is there as an empty lock from now on.)
                slot.get_or_insert_with(LockState::default);
                host.vanished.push(id);
                "-".into()
            }
            Op::Ghost(n) => {
                let token = host.delivered[n].1;
                ex(slot, host, &mut |st, h| {
                    revisit(st, &mut env, h, Some(token))
                });
                "-".into()
            }
            Op::Arrive(o, mode, ttl, look) => {
                let token = env.tokens.issue(now).expect("a token is left");
                let grant = crate::state::Grant::new(o.as_bytes(), token, ttl, now);
                *slot = Some(LockState::with_grant(mode, grant));
                if look {
                    ex(slot, host, &mut |st, h| revisit(st, &mut env, h, None));
                }
                "-".into()
            }
            Op::Look => {
                ex(slot, host, &mut |st, h| revisit(st, &mut env, h, None));
                "-".into()
            }
            Op::Leave(id) => {
                assert!(host.queue.cancel(id), "waiter {id} waits");
                ex(slot, host, &mut |st, h| revisit(st, &mut env, h, None));
                "-".into()
            }
        };
        // Tokens differ per run: show replies without them.
        let reply = if reply.starts_with("Int(") && reply.len() > 10 {
            "Int(token)".to_string()
        } else {
            reply
        };
        (reply, self.host.log.clone())
    }
}

/// (time ms, operation, reply, effects): one step of a table case.
type Step = (u64, Op, &'static str, &'static [&'static str]);

/// Run the table case `name` with `lock_delay` ms of lock-delay: each step at its time, its
/// reply and effects checked.
fn run_case(name: &str, lock_delay: u64, steps: &[Step]) {
    let mut key = Key {
        state: None,
        tokens: TokenIssuer::new(),
        host: Recorder {
            max_waiters: 10,
            ..Recorder::default()
        },
    };
    for (i, (t, op, reply, effects)) in steps.iter().enumerate() {
        let (got, log) = key.run(*op, at(*t), lock_delay);
        assert_eq!(got, *reply, "case '{name}', step {i} ({op:?}): reply");
        assert_eq!(log, *effects, "case '{name}', step {i} ({op:?}): effects");
    }
}

mod arrivals;
mod table;

#[test]
fn block_refused_by_max_waiters_and_context() {
    let mut tokens = TokenIssuer::new();
    let mut host = Recorder::default(); // max_waiters 0
    let mut state = None;
    let mut env = Env {
        now: T0,
        lock_delay_ms: 0,
        max_holders: 3,
        master: true,
        tokens: &mut tokens,
    };
    let a = AcquireArgs {
        owner: b"a",
        ttl_ms: 100,
        mode: Mode::Exclusive,
        bound: false,
        block: None,
    };
    assert!(matches!(
        execute(&mut state, &mut host, |st, h| acquire(
            st, &mut env, h, &a, true, None
        )),
        Reply::Int(_)
    ));
    let b = AcquireArgs {
        owner: b"b",
        ttl_ms: 100,
        mode: Mode::Exclusive,
        bound: false,
        block: Some(0),
    };
    assert_eq!(
        execute(&mut state, &mut host, |st, h| acquire(
            st, &mut env, h, &b, true, None
        )),
        Reply::Error(ReplyError::TooManyWaiters)
    );
    // Inside MULTI or a script the caller cannot wait: nil.
    assert_eq!(
        execute(&mut state, &mut host, |st, h| acquire(
            st, &mut env, h, &b, false, None
        )),
        Reply::Null
    );
}

#[test]
fn a_replica_settles_nothing_on_its_own() {
    let mut tokens = TokenIssuer::new();
    let mut host = Recorder::default();
    let mut state = None;
    let mut env = Env {
        now: T0,
        lock_delay_ms: 0,
        max_holders: 3,
        master: false,
        tokens: &mut tokens,
    };
    let held = crate::snapshot::LockImage::from_rdb_v1(7, T0.wall_ms + 100, b"a").expect("valid");
    assert_eq!(
        execute(&mut state, &mut host, |st, _| apply(st, &mut env, held)),
        Reply::Ok
    );
    assert_eq!(host.log, ["repl verbatim"]);
    assert_eq!(
        env.tokens.high_water(),
        7,
        "a replicated token raises the mark"
    );
    host.log.clear();
    env.now = at(200);
    execute(&mut state, &mut host, |st, h| expire(st, &mut env, h));
    execute(&mut state, &mut host, |st, h| {
        revisit(st, &mut env, h, Some(7))
    });
    assert!(host.log.is_empty(), "{:?}", host.log);
    let state = state.expect("the replica keeps the key");
    assert!(
        !state.grants().is_empty(),
        "the master's DEL ends it, not the replica's clock"
    );
    assert_eq!(check(Some(&state), 7, at(200)), Reply::Int(0));
}

#[test]
fn info_and_check_read_without_settling() {
    let mut tokens = TokenIssuer::new();
    let mut state = LockState::default();
    state.acquire(
        b"a",
        Mode::Exclusive,
        100,
        T0,
        0,
        || None,
        3,
        None,
        &mut tokens,
    );
    let t = state.last_token;
    assert_eq!(check(Some(&state), t, at(40)), Reply::Int(60));
    assert_eq!(check(None, t, at(40)), Reply::Int(0));
    assert_eq!(
        info(Some(&state), 2, None, at(40)),
        Reply::Info(Info {
            owner: Some(b"a"),
            token: t,
            ttl_ms: 60,
            waiters: 2,
            mode: Some(Mode::Exclusive),
            holders: 1,
            limit: 0,
            delayed: 0,
        })
    );
    assert_eq!(
        info(Some(&state), 0, None, at(100)),
        Reply::Null,
        "run out, nobody waits"
    );
    assert_eq!(
        info(Some(&state), 1, Some(Mode::Permits(4)), at(100)),
        Reply::Info(Info {
            owner: None,
            token: t,
            ttl_ms: 0,
            waiters: 1,
            mode: None,
            holders: 0,
            limit: 4,
            delayed: 0,
        })
    );
    assert_eq!(info(None, 0, None, T0), Reply::Null);
}

#[test]
fn revisit_plans() {
    use Found::*;
    let never = || -> bool { panic!("asked CLUSTER NODES without need") };
    assert_eq!(
        plan_revisit(false, OtherType, None, 3, never),
        RevisitPlan::Skip
    );
    assert!(matches!(
        plan_revisit(true, OtherType, None, 3, never),
        RevisitPlan::FailWaiters(m) if m.starts_with("ERR ")
    ));
    assert_eq!(
        plan_revisit(true, Nothing, Some(1), 3, never),
        RevisitPlan::Skip
    );
    assert_eq!(
        plan_revisit(true, Nothing, None, 0, never),
        RevisitPlan::Skip
    );
    assert!(matches!(
        plan_revisit(true, Nothing, None, 3, || false),
        RevisitPlan::FailWaiters(m) if m.starts_with("TRYAGAIN ")
    ));
    assert_eq!(
        plan_revisit(true, Nothing, None, 3, || true),
        RevisitPlan::Revisit
    );
    assert_eq!(
        plan_revisit(true, Lock, Some(1), 0, never),
        RevisitPlan::Revisit
    );
}
