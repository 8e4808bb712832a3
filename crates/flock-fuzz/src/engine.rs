//! The lock engine against a reference model: random operation sequences on keys of every
//! kind (exclusive, shared, permits) run through `flock_core::engine` exactly as the module
//! runs them, with a host that plays the server (keyspace, wait queues, a replica fed by the
//! replicated effects over the wire). The operations: ACQUIRE in each mode, parsed from its
//! argv (with and without BLOCK, inside MULTI, with the key's limit, another one or one out of
//! range), RELEASE and RENEW with and without a token (the live one or a stale one), REVOKE of
//! all or of one owner, CHECK, FENCED's verdict, INFO, HOLDERS, timers, waiters leaving (then
//! a revisit) or vanishing, grants whose client left before the reply, DEL, travel through
//! RDB, restarts with and without the token mark, failovers to the replica, clock steps (to
//! the microsecond of a deadline, too) and new settings (lock-delay, max-holders).
//!
//! The model is written from the contract (SPEC.md: "Lock kinds: exclusive, shared, counted",
//! "Token-qualified calls", G1-G7), not from the engine. Checked after every step: the replies
//! and states against the model, G1 (an exclusive grant is alone, no key has more grants than
//! its limit), G2, G3 (tokens grow across kinds, restarts and failovers), G4, G5, G6
//! (hand-offs are the model's, in FIFO order; after a write a head that fits never waits and
//! the key is armed for its next deadline), G7 (the replica agrees with the master on
//! everything that travels) and G9.

use crate::bytes::Bytes;
use flock_core::args::{self, AcquireArgs, ArgError};
use flock_core::engine::{
    self, BlockRefused, Effect, Env, Host, Info, LoneGrant, Reply, ReplyError,
};
use flock_core::snapshot::{self, LockImage};
use flock_core::state::Mode;
use flock_core::{Grant, LockState, Now, Snapshot, TokenIssuer, WaitQueue, Waiter};
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

impl MGrant {
    fn live(&self, now: Now) -> bool {
        now.mono_us < self.mono_us
    }

    fn remaining_ms(&self, now: Now) -> u64 {
        self.mono_us.saturating_sub(now.mono_us).div_ceil(1000)
    }
}

/// `ms` after `now` on both clocks (a lease's or a revoke's lock-delay end).
fn after(now: Now, ms: u64) -> (u64, i64) {
    (now.mono_us + ms * 1000, now.wall_ms + ms as i64)
}

#[derive(Clone, Debug, PartialEq, Eq)]
struct MWaiter {
    id: u64,
    owner: Vec<u8>,
    ttl_ms: u64,
    mode: Mode,
}

/// One key of the model: whether it exists in the keyspace, and its lock.
#[derive(Clone, Debug, Default)]
struct MKey {
    exists: bool,
    /// The kind of the grants and delayed slots (all alike); meaningless when it has neither.
    mode: Mode,
    /// In token order (a new grant has the largest token), run-out ones until a write clears
    /// them.
    grants: Vec<MGrant>,
    /// Ends of the delayed slots: (monotonic us, wall ms).
    delays: Vec<(u64, i64)>,
    last_token: u64,
    /// Waiting requests, first come first served; vanished ones stay until they are reached.
    queue: VecDeque<MWaiter>,
}

impl MKey {
    fn live(&self, now: Now) -> impl Iterator<Item = &MGrant> + '_ {
        self.grants.iter().filter(move |g| g.live(now))
    }

    fn live_count(&self, now: Now) -> usize {
        self.live(now).count()
    }

    fn active_delays(&self, now: Now) -> usize {
        self.delays.iter().filter(|(m, _)| now.mono_us < *m).count()
    }

    /// A live grant or a running delayed slot gives the key its mode.
    fn taken(&self, now: Now) -> bool {
        self.live_count(now) > 0 || self.active_delays(now) > 0
    }

    /// The shared mode of the requests waiting, if any; the contract has them all alike.
    fn waiting_shared(&self) -> Option<Mode> {
        let mut modes = self
            .queue
            .iter()
            .map(|w| w.mode)
            .filter(|m| *m != Mode::Exclusive);
        let first = modes.next()?;
        assert!(
            modes.all(|m| m == first),
            "waiting shared requests of two limits: {:?}",
            self.queue
        );
        Some(first)
    }

    /// "A key's limit is that of its live shared grants and of the shared requests waiting
    /// on it" (delayed slots keep the key's limit).
    fn key_limit(&self, now: Now) -> Option<Mode> {
        if self.taken(now) && self.mode != Mode::Exclusive {
            return Some(self.mode);
        }
        self.waiting_shared()
    }

    /// Whether a request of `mode` could be granted now, waiters aside: an exclusive one when
    /// no grant is live and no slot delayed; a shared one or a permit when no exclusive grant
    /// is live (or delayed: "an exclusive key is then granted in no mode") and the limit is
    /// not reached (a delayed permit counts, a delayed shared slot holds off only exclusive
    /// requests; unlimited shared keys stop at max-holders).
    fn fits(&self, mode: Mode, now: Now, max_holders: u32) -> bool {
        if !self.taken(now) {
            return true;
        }
        if mode == Mode::Exclusive || self.mode != mode {
            return false;
        }
        match mode {
            Mode::Shared => self.live_count(now) < max_holders as usize,
            Mode::Permits(n) => self.live_count(now) + self.active_delays(now) < n as usize,
            Mode::Exclusive => false,
        }
    }

    fn forget_lock(&mut self) {
        self.exists = false;
        self.mode = Mode::Exclusive;
        self.grants.clear();
        self.delays.clear();
        self.last_token = 0;
    }
}

/// The settings of the moment.
#[derive(Clone, Copy)]
struct Settings {
    lock_delay_ms: u64,
    max_holders: u32,
    max_waiters: usize,
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
    /// Recent hand-offs as (key, token): grants whose reply may yet fail to reach the client.
    recent_handoffs: VecDeque<(usize, u64)>,
    step: usize,
    /// The largest max-holders of the run: a shared key keeps what it was granted under it.
    max_holders_seen: u32,
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

    fn grant(&mut self, k: usize, mode: Mode, owner: &[u8], ttl_ms: u64, token: u64, now: Now) {
        let key = &mut self.keys[k];
        let (mono_us, wall_ms) = after(now, ttl_ms);
        key.mode = mode;
        key.grants.push(MGrant {
            owner: owner.to_vec(),
            token,
            mono_us,
            wall_ms,
        });
        key.last_token = token;
    }

    /// Bring key `k` up to date: every run-out lease ends, leaving a delayed slot of the
    /// lock-delay counted from its deadline; finished slots end; then waiters are granted
    /// from the head while the head fits (a vanished one costs a token and is skipped).
    /// Hand-offs go to `handed`.
    fn settle_state(&mut self, k: usize, now: Now, set: Settings) {
        let d = set.lock_delay_ms;
        let key = &mut self.keys[k];
        let (kept, ended): (Vec<MGrant>, Vec<MGrant>) = std::mem::take(&mut key.grants)
            .into_iter()
            .partition(|g| g.live(now));
        key.grants = kept;
        if d > 0 {
            key.delays.extend(
                ended
                    .iter()
                    .map(|g| (g.mono_us + d * 1000, g.wall_ms + d as i64)),
            );
        }
        key.delays.retain(|(m, _)| now.mono_us < *m);
        loop {
            let key = &self.keys[k];
            let Some(head) = key.queue.front() else {
                return;
            };
            if !key.fits(head.mode, now, set.max_holders) {
                return;
            }
            let Some(token) = self.issue(now) else {
                return;
            };
            let w = self.keys[k].queue.pop_front().expect("head");
            self.grant(k, w.mode, &w.owner, w.ttl_ms, token, now);
            if self.vanished.contains(&w.id) {
                self.keys[k].grants.pop();
                continue;
            }
            self.issued.note(token, now, self.step);
            self.handed.push((w.id, token));
            self.recent_handoffs.push_back((k, token));
            if self.recent_handoffs.len() > 8 {
                self.recent_handoffs.pop_front();
            }
        }
    }

    /// The key leaves the keyspace when nothing is left of it. True when it did.
    fn publish(&mut self, k: usize, now: Now) -> bool {
        let key = &mut self.keys[k];
        if key.grants.is_empty() && key.active_delays(now) == 0 && key.queue.is_empty() {
            key.forget_lock();
            return true;
        }
        false
    }

    /// What a write command on an existing key does first. True when the key went away.
    fn settle(&mut self, k: usize, now: Now, set: Settings) -> bool {
        self.settle_state(k, now, set);
        self.publish(k, now)
    }

    /// FLOCK.ACQUIRE (parsed), from the contract: the owner's own grant (mode, then limit),
    /// then the key's limit, then room (nobody jumps the queue). `blocked`: the id of the
    /// request when the engine queued it.
    fn acquire(
        &mut self,
        k: usize,
        a: &AcquireArgs<'_>,
        now: Now,
        set: Settings,
        blocked: Option<u64>,
    ) -> Reply<'static> {
        self.keys[k].exists = true;
        self.settle_state(k, now, set);
        let key = &mut self.keys[k];
        let mode = key.mode;
        if let Some(g) = key
            .grants
            .iter_mut()
            .find(|g| g.live(now) && g.owner == a.owner)
        {
            if mode != a.mode {
                return Reply::Error(ReplyError::OwnerHolds(mode));
            }
            (g.mono_us, g.wall_ms) = after(now, a.ttl_ms);
            return Reply::Int(g.token as i64);
        }
        if a.mode != Mode::Exclusive {
            if let Some(limit) = key.key_limit(now) {
                if limit != a.mode {
                    return Reply::Error(ReplyError::LimitMismatch(limit));
                }
            }
        }
        if key.queue.is_empty() && key.fits(a.mode, now, set.max_holders) {
            let Some(token) = self.issue(now) else {
                return Reply::Error(ReplyError::TokensExhausted);
            };
            self.grant(k, a.mode, a.owner, a.ttl_ms, token, now);
            self.issued.note(token, now, self.step);
            return Reply::Int(token as i64);
        }
        if a.block.is_none() {
            return Reply::Null;
        }
        // An owner waits at most once: a BLOCK request of an owner that waits takes its
        // earlier one's place in the queue (the earlier one gets nil).
        let replaces = key.queue.iter().position(|w| w.owner == a.owner);
        if key.queue.len() >= set.max_waiters && replaces.is_none() {
            return Reply::Error(ReplyError::TooManyWaiters);
        }
        let waiter = MWaiter {
            id: blocked.expect("the engine queued the request"),
            owner: a.owner.to_vec(),
            ttl_ms: a.ttl_ms,
            mode: a.mode,
        };
        match replaces.and_then(|i| key.queue.get_mut(i)) {
            Some(slot) => *slot = waiter,
            None => key.queue.push_back(waiter),
        }
        // The request that left may have been the head that held everyone behind it.
        self.settle_state(k, now, set);
        Reply::Blocked
    }

    /// The live grant of `owner` (with `token`, when given).
    fn find(&self, k: usize, owner: &[u8], token: Option<u64>, now: Now) -> Option<usize> {
        self.keys[k]
            .grants
            .iter()
            .position(|g| g.live(now) && g.owner == owner && token.is_none_or(|t| t == g.token))
    }

    fn release(
        &mut self,
        k: usize,
        owner: &[u8],
        token: Option<u64>,
        now: Now,
        set: Settings,
    ) -> Reply<'static> {
        if self.settle(k, now, set) {
            return Reply::Int(0);
        }
        let Some(i) = self.find(k, owner, token, now) else {
            return Reply::Int(0);
        };
        // A released slot frees at once: no lock-delay.
        self.keys[k].grants.remove(i);
        self.settle(k, now, set);
        Reply::Int(1)
    }

    fn renew(
        &mut self,
        k: usize,
        owner: &[u8],
        ttl_ms: u64,
        token: Option<u64>,
        now: Now,
        set: Settings,
    ) -> Reply<'static> {
        if self.settle(k, now, set) {
            return Reply::Null;
        }
        let Some(i) = self.find(k, owner, token, now) else {
            return Reply::Null;
        };
        let g = &mut self.keys[k].grants[i];
        (g.mono_us, g.wall_ms) = after(now, ttl_ms);
        Reply::Int(g.token as i64)
    }

    fn revoke(
        &mut self,
        k: usize,
        owner: Option<&[u8]>,
        now: Now,
        set: Settings,
    ) -> Reply<'static> {
        if self.settle(k, now, set) {
            return Reply::Int(0);
        }
        let key = &mut self.keys[k];
        let hit = |g: &MGrant| g.live(now) && owner.is_none_or(|o| g.owner == o);
        let n = key.grants.iter().filter(|g| hit(g)).count();
        if n == 0 {
            return Reply::Int(0);
        }
        key.grants.retain(|g| !hit(g));
        // Each revoked grant's slot stays taken for the lock-delay, from now.
        if set.lock_delay_ms > 0 {
            key.delays
                .extend((0..n).map(|_| after(now, set.lock_delay_ms)));
        }
        self.settle(k, now, set);
        Reply::Int(n as i64)
    }

    /// FLOCK.INFO from the contract.
    fn info(&self, k: usize, now: Now) -> Reply<'_> {
        let key = &self.keys[k];
        let holders = key.live_count(now);
        let delayed = key.active_delays(now);
        if !key.exists || (holders == 0 && delayed == 0 && key.queue.is_empty()) {
            return Reply::Null;
        }
        Reply::Info(Info {
            owner: (key.mode == Mode::Exclusive)
                .then(|| key.live(now).next().map(|g| &g.owner[..]))
                .flatten(),
            token: key
                .live(now)
                .map(|g| g.token)
                .max()
                .unwrap_or(key.last_token),
            ttl_ms: key
                .live(now)
                .map(|g| g.remaining_ms(now))
                .max()
                .unwrap_or(0),
            waiters: key.queue.len(),
            mode: (holders > 0).then_some(key.mode),
            holders,
            limit: key.key_limit(now).map_or(0, Mode::limit),
            delayed,
        })
    }
}

// ---- the engine's side: a host that plays the server ----

/// A replica: the keys as the applied `FLOCK.APPLY` effects left them, and its own token mark.
struct Replica {
    keys: Vec<Option<LockState>>,
    tokens: TokenIssuer,
}

struct Server {
    /// The keyspace: `None` when the key does not exist.
    states: Vec<Option<LockState>>,
    queues: Vec<WaitQueue>,
    tokens: TokenIssuer,
    replica: Replica,
    vanished: Vec<u64>,
    next_waiter: u64,
}

/// The host of a replica applying its master's effect: it only passes the effect on.
struct ReplicaHost {
    verbatim: usize,
}

impl Host for ReplicaHost {
    fn effect(&mut self, e: Effect<'_>) {
        assert_eq!(e, Effect::ReplicateVerbatim, "a replica applying an effect");
        self.verbatim += 1;
    }
    fn waiting(&mut self) -> usize {
        0
    }
    fn waiting_mode(&mut self) -> Option<Mode> {
        None
    }
    fn next_waiter_if(&mut self, _: &mut dyn FnMut(&Waiter) -> bool) -> Option<Waiter> {
        None
    }
    fn deliver(&mut self, _: &Waiter, _: u64) -> bool {
        panic!("a replica hands nothing off")
    }
    fn block(&mut self, _: &AcquireArgs<'_>, _: u64, _: Option<u64>) -> Result<(), BlockRefused> {
        panic!("a replica blocks nobody")
    }
}

/// `FLOCK.APPLY key ...` as the module replicates `snapshot` (src/replication.rs).
fn apply_argv(key: &[u8], snapshot: Snapshot<'_>) -> Vec<Vec<u8>> {
    let num = |v: i128| v.to_string().into_bytes();
    let mut argv = vec![b"FLOCK.APPLY".to_vec(), key.to_vec()];
    match snapshot {
        Snapshot::Held(g) => argv.extend([
            b"GRANT".to_vec(),
            g.owner.to_vec(),
            num(i128::from(g.token)),
            num(i128::from(g.deadline.wall_ms)),
        ]),
        Snapshot::Delayed {
            last_token,
            until_wall_ms,
        } => argv.extend([
            b"DELAY".to_vec(),
            num(i128::from(last_token)),
            num(i128::from(until_wall_ms)),
        ]),
        Snapshot::Full(state) => {
            argv.push(b"STATE".to_vec());
            argv.extend(snapshot::state_fields(state));
        }
    }
    argv
}

/// The host of one operation on key `k`.
struct KeyHost<'s> {
    key: &'static [u8],
    queue: &'s mut WaitQueue,
    replica: &'s mut Option<LockState>,
    replica_tokens: &'s mut TokenIssuer,
    vanished: &'s [u64],
    next_waiter: &'s mut u64,
    now: Now,
    max_waiters: usize,
    /// (waiter id, token) handed over in this operation.
    delivered: Vec<(u64, u64)>,
    blocked: Option<u64>,
    /// The last timer the operation armed (its monotonic time; `None` inside: disarmed).
    armed: Option<Option<u64>>,
    deleted: bool,
    deleted_then_touched: bool,
}

impl Host for KeyHost<'_> {
    fn effect(&mut self, e: Effect<'_>) {
        if self.deleted {
            self.deleted_then_touched = true;
        }
        match e {
            // The replica gets the effect over the wire: argv, parsed, applied (G7).
            Effect::Replicate(s) => {
                let argv = apply_argv(self.key, s);
                let refs: Vec<&[u8]> = argv.iter().map(|a| &a[..]).collect();
                let image = args::parse_apply(&refs)
                    .unwrap_or_else(|e| panic!("a replicated effect parses: {e:?} {s:?}"));
                assert_eq!(image, s.image(), "FLOCK.APPLY carries the snapshot's image");
                let state = self.replica.get_or_insert_with(LockState::default);
                let mut env = Env {
                    now: self.now,
                    lock_delay_ms: 0,
                    max_holders: 1,
                    master: false,
                    tokens: self.replica_tokens,
                };
                let mut host = ReplicaHost { verbatim: 0 };
                assert_eq!(engine::apply(state, &mut env, &mut host, image), Reply::Ok);
                assert_eq!(host.verbatim, 1, "the effect goes on to the replica's AOF");
            }
            Effect::ReplicateDelete => *self.replica = None,
            Effect::DeleteKey => self.deleted = true,
            Effect::Arm(d) => self.armed = Some(d.map(|d| d.mono_us)),
            // No BOUND grants here: the bindings are the module's business.
            Effect::Notify(_)
            | Effect::Count(_)
            | Effect::ReplicateVerbatim
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
        // As the module does: the limit of waiters does not stop an owner's retried wait.
        if self.queue.len() >= self.max_waiters && !self.queue.has_owner(args.owner) {
            return Err(BlockRefused::TooMany);
        }
        *self.next_waiter += 1;
        let id = *self.next_waiter;
        let replaced = self.queue.push(Waiter {
            id,
            owner: args.owner.into(),
            ttl_ms: args.ttl_ms,
            mode: args.mode,
            bind_to,
        });
        if let Some(r) = replaced {
            assert_eq!(
                *r.owner, *args.owner,
                "only the owner's own wait is replaced"
            );
        }
        self.blocked = Some(id);
        Ok(())
    }
}

/// What one operation did, besides its reply.
struct Outcome {
    delivered: Vec<(u64, u64)>,
    blocked: Option<u64>,
    armed: Option<Option<u64>>,
}

impl Server {
    /// Run `op` on key `k` the way the module's executor does: on the stored state (or a
    /// fresh one when `create`), deleting the key when the engine says so. `None`: the key
    /// does not exist and nothing ran.
    fn run(
        &mut self,
        k: usize,
        now: Now,
        set: Settings,
        create: bool,
        op: impl FnOnce(&mut LockState, &mut Env<'_>, &mut KeyHost<'_>) -> Reply<'static>,
    ) -> Option<(Reply<'static>, Outcome)> {
        if self.states[k].is_none() && !create {
            return None;
        }
        let state = self.states[k].get_or_insert_with(LockState::default);
        let mut host = KeyHost {
            key: KEY_NAMES[k],
            queue: &mut self.queues[k],
            replica: &mut self.replica.keys[k],
            replica_tokens: &mut self.replica.tokens,
            vanished: &self.vanished,
            next_waiter: &mut self.next_waiter,
            now,
            max_waiters: set.max_waiters,
            delivered: Vec::new(),
            blocked: None,
            armed: None,
            deleted: false,
            deleted_then_touched: false,
        };
        let mut env = Env {
            now,
            lock_delay_ms: set.lock_delay_ms,
            max_holders: set.max_holders,
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
                armed: host.armed,
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

fn waiter_view(w: &Waiter) -> MWaiter {
    MWaiter {
        id: w.id,
        owner: w.owner.to_vec(),
        ttl_ms: w.ttl_ms,
        mode: w.mode,
    }
}

/// An owner as the trace shows it (the long one abbreviated).
fn short(owner: &[u8]) -> String {
    match owner.len() {
        n if n > 8 => format!("o*{n}"),
        _ => String::from_utf8_lossy(owner).into_owned(),
    }
}

/// A state as the trace shows it.
fn show(st: &LockState) -> String {
    let grants: Vec<String> = st
        .grants()
        .by_token()
        .into_iter()
        .map(|g| {
            format!(
                "{}:{}:{}",
                short(&g.owner),
                g.token % 100_000,
                g.deadline.mono_us
            )
        })
        .collect();
    let delays: Vec<u64> = st.delays.iter().map(|d| d.mono_us).collect();
    format!(
        "{:?} {grants:?} delays {delays:?} last {}",
        st.mode,
        st.last_token % 100_000
    )
}

fn sorted(mut v: Vec<(u64, i64)>) -> Vec<(u64, i64)> {
    v.sort_unstable();
    v
}

/// Key `k` must be the model's (existence, kind, grants, delayed slots, waiters), a replica
/// must agree with it (G7), and the guarantees must hold on the engine's state alone (G1, G6).
/// `write`: a write command on this key just ran. `full`: compare every waiter, not only
/// their number.
#[allow(clippy::too_many_arguments)]
fn assert_same(
    real: &mut Server,
    model: &Model,
    k: usize,
    now: Now,
    set: Settings,
    step: usize,
    write: bool,
    full: bool,
) {
    let mk = &model.keys[k];
    let at = || format!("step {step}, key {k}");
    assert_eq!(real.states[k].is_some(), mk.exists, "{}: existence", at());
    assert_eq!(real.queues[k].len(), mk.queue.len(), "{}: waiters", at());
    assert_eq!(
        real.queues[k].shared_mode(),
        mk.waiting_shared(),
        "{}: the waiting shared requests' limit",
        at()
    );
    if full {
        let queue: Vec<MWaiter> = real.queues[k]
            .clone()
            .drain()
            .iter()
            .map(waiter_view)
            .collect();
        assert!(
            queue.iter().eq(mk.queue.iter()),
            "{}: queue {queue:?}",
            at()
        );
    }
    // G6: after a write, a head that fits does not wait (unless no token is left).
    if write && real.tokens.high_water() < MAX_TOKEN {
        if let (Some(st), Some(head)) = (&real.states[k], real.queues[k].front()) {
            assert!(
                !st.fits(head.mode, now, set.max_holders),
                "{}: head waiter {head:?} fits {st:?} and waits (G6)",
                at()
            );
        }
    }
    let Some(st) = &real.states[k] else {
        assert!(
            real.replica.keys[k].is_none(),
            "{}: the replica still has the deleted key (G7)",
            at()
        );
        return;
    };
    let grants: Vec<MGrant> = st.grants().by_token().into_iter().map(grant_view).collect();
    assert_eq!(grants, mk.grants, "{}: grants", at());
    let delays = sorted(st.delays.iter().map(|d| (d.mono_us, d.wall_ms)).collect());
    assert_eq!(delays, sorted(mk.delays.clone()), "{}: delayed slots", at());
    if !st.grants().is_empty() || !st.delays.is_empty() {
        assert_eq!(st.mode, mk.mode, "{}: mode", at());
    }
    assert_eq!(st.last_token, mk.last_token, "{}: last token", at());
    // The module keeps a lone grant in a compact form of its own (`record.rs`): the grant's
    // fields must be the whole state.
    if let Some((mode, g)) = st.lone_grant() {
        let rebuilt = LockState::with_grant(
            mode,
            Grant::from_parts(&g.owner, g.token, g.deadline, g.since_mono_us, g.tie_word()),
        );
        assert_eq!(&rebuilt, st, "{}: a lone grant rebuilt", at());
    }
    // G7: what the replica holds is what the master would send now.
    if let Some(s) = Snapshot::of(st) {
        assert_eq!(
            real.replica.keys[k]
                .as_ref()
                .and_then(Snapshot::of)
                .map(Snapshot::image),
            Some(s.image()),
            "{}: the replica disagrees (G7)",
            at()
        );
    }
    // G1, on the engine's state: an exclusive grant is alone (no other grant, no delayed
    // slot); a permit key never has more grants and slots than its limit; a shared key never
    // more live grants than max-holders allowed.
    let live = st.live_count(now);
    match st.mode {
        Mode::Exclusive => assert!(
            st.grants().len() + st.delays.len() <= 1,
            "{}: exclusive key with {} grants and {} slots (G1)",
            at(),
            st.grants().len(),
            st.delays.len()
        ),
        Mode::Permits(n) => assert!(
            st.grants().len() + st.delays.len() <= n as usize,
            "{}: LIMIT {n} key with {} grants and {} slots (G1)",
            at(),
            st.grants().len(),
            st.delays.len()
        ),
        Mode::Shared => assert!(
            live <= model.max_holders_seen as usize,
            "{}: {live} shared grants (G1)",
            at()
        ),
    }
    // Owners are unique per key: one grant at most, and never both holding and waiting.
    for (i, g) in st.grants().iter().enumerate() {
        assert!(
            st.grants().as_slice()[..i]
                .iter()
                .all(|h| h.owner != g.owner),
            "{}: two grants of one owner",
            at()
        );
        if g.is_live(now) {
            assert!(
                !real.queues[k].has_owner(&g.owner) || model.vanished_owner_waits(k, &g.owner),
                "{}: an owner holds and waits",
                at()
            );
            // CHECK agrees with the lease (G9: by the monotonic clock).
            let left = st.check(g.token, now);
            assert_eq!(left, g.remaining_ms(now), "{}: CHECK", at());
            assert!(left >= 1, "{}: live grant checks as {left}", at());
        }
    }
}

impl Model {
    /// Whether `owner` waits for key `k` only through a vanished request (its client went
    /// away; the server has not noticed yet).
    fn vanished_owner_waits(&self, k: usize, owner: &[u8]) -> bool {
        self.keys[k]
            .queue
            .iter()
            .filter(|w| w.owner == owner)
            .all(|w| self.vanished.contains(&w.id))
    }
}

/// Every token issued, in order (G3).
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

    /// One of the last few tokens (or a made-up one when none was issued yet).
    fn recent(&self, r: &mut Bytes<'_>) -> u64 {
        match self.tokens.len() {
            0 => 1 + u64::from(r.u8()),
            n => self.tokens[n - 1 - r.below(n.min(6))],
        }
    }
}

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
fn acquire_argv(k: usize, owner: &[u8], ttl_ms: u64, mode: Mode, block: bool) -> Vec<Vec<u8>> {
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
    let mut r = Bytes::new(data);
    let mut wall_us: u64 = WALL0_US + u64::from(r.u32());
    let mut mono_us: u64 = 1_000_000 + u64::from(r.u16());
    let mut set = Settings {
        lock_delay_ms: [0, 0, 0, 5, 50, 400][r.below(6)],
        max_holders: MAX_HOLDERS[r.below(3)],
        max_waiters: [2, 3, 100, 100][r.below(4)],
    };
    let mut real = Server {
        states: vec![None; KEYS],
        queues: vec![WaitQueue::default(); KEYS],
        tokens: TokenIssuer::new(),
        replica: Replica {
            keys: vec![None; KEYS],
            tokens: TokenIssuer::new(),
        },
        vanished: Vec::new(),
        next_waiter: 0,
    };
    let mut model = Model {
        keys: vec![MKey::default(); KEYS],
        high_water: 0,
        vanished: Vec::new(),
        issued: Issued::default(),
        handed: Vec::new(),
        recent_handoffs: VecDeque::new(),
        step: 0,
        max_holders_seen: set.max_holders,
    };
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
        // The engine's hand-offs in this step, to compare with the model's (FIFO, G6).
        let mut delivered: Vec<(u64, u64)> = Vec::new();
        // The timer the engine armed for the key in this step.
        let mut armed = None;
        let now = Now::new(wall_us, mono_us);
        let op = r.u8() % 21;
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
                let argv = acquire_argv(k, &owner, ttl_ms, mode, op >= 3);
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
                    (a.mode, a.ttl_ms, a.block.is_some()),
                    (mode, ttl_ms, op >= 3)
                );
                let before = real.states[k]
                    .as_ref()
                    .and_then(|s| s.owner_grant(&owner, now).map(|g| (g.token, s.mode)));
                // As the glue does: a key that does not exist is offered to the engine's
                // free-key path first (which leaves the other cases to `acquire`).
                let fresh = real.states[k].is_none();
                let (got, out) = real
                    .run(k, now, set, true, |s, env, host| {
                        if fresh {
                            if let Some((reply, grant, mode)) =
                                engine::acquire_free(&a, env, host, None)
                            {
                                *s = LockState::with_grant(mode, grant);
                                return reply;
                            }
                        }
                        engine::acquire(s, env, host, &a, can_block, None)
                    })
                    .expect("ACQUIRE creates the key");
                delivered = out.delivered;
                armed = out.armed;
                write = true;
                let asked = AcquireArgs {
                    block: a.block.filter(|_| can_block),
                    ..a
                };
                let want = model.acquire(k, &asked, now, set, out.blocked);
                model.publish(k, now);
                assert_eq!(got, want, "step {steps}: ACQUIRE {argv:?}");
                said = format!("{:?} {got:?}", a.mode);
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
                        let lone = s.lone_grant().map(|(mode, g)| LoneGrant::of(mode, g));
                        if let Some(lone) = lone {
                            let master = env.master;
                            let fast = engine::release_lone(
                                &lone,
                                env.now.mono_us,
                                master,
                                host,
                                &owner,
                                token,
                            );
                            if let Some(reply) = fast {
                                return reply;
                            }
                        }
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
                assert_eq!(
                    engine::fence(real.states[k].as_ref(), t, now),
                    live.then_some(model.keys[k].mode),
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
                    engine::expire(s, env, host);
                    Reply::Null
                });
                if let Some((_, out)) = ran {
                    delivered = out.delivered;
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
                                engine::revisit(s, env, host, None);
                                Reply::Null
                            })
                            .expect("revisit runs");
                        delivered = out.delivered;
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
                                engine::revisit(s, env, host, Some(t));
                                Reply::Null
                            })
                            .expect("the key exists");
                        delivered = out.delivered;
                        armed = out.armed;
                        write = true;
                        let key = &mut model.keys[kk];
                        // Only a live grant is released (one that ran out expires instead).
                        key.grants.retain(|g| !(g.token == t && g.live(now)));
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
                model.keys[k].forget_lock();
                let found = engine::Found::Nothing;
                let plan = engine::plan_revisit(true, found, None, real.queues[k].len(), || true);
                if plan == engine::RevisitPlan::Revisit {
                    let (_, out) = real
                        .run(k, now, set, true, |s, env, host| {
                            engine::revisit(s, env, host, None);
                            Reply::Null
                        })
                        .expect("revisit creates the key");
                    delivered = out.delivered;
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
                .map(|g| g.mono_us)
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
    steps
}

/// The keyspace leaves this server and comes back through RDB: each key's kind, grants
/// (owner, token, absolute wall-clock deadline) and delayed slots; the monotonic deadlines
/// are what is left of them by the local wall clock now. A replica resyncs from the same data.
fn travel(real: &mut Server, model: &mut Model, k: usize, now: Now) {
    if let Some(st) = &real.states[k] {
        let image = LockImage::of(st).validate().expect("a saved lock loads");
        let loaded = engine::load(image.clone(), now, &mut real.tokens);
        let copy = engine::load(image, now, &mut real.replica.tokens);
        real.replica.keys[k] = Some(copy);
        real.states[k] = Some(loaded);
    } else {
        real.replica.keys[k] = None;
    }
    // A resync carries the master's token mark (RDB aux data); between resyncs the replica
    // raises its own from the effects it applies.
    let mark = real.tokens.high_water();
    real.replica.tokens.observe(mark);

    let left = |wall_ms: i64| -> u64 {
        let ms = wall_ms.saturating_sub(now.wall_ms).max(0) as u64;
        now.mono_us + ms * 1000
    };
    let mk = &mut model.keys[k];
    if !mk.exists {
        return;
    }
    for g in &mut mk.grants {
        g.mono_us = left(g.wall_ms);
        mk.last_token = mk.last_token.max(g.token);
    }
    for d in &mut mk.delays {
        d.0 = left(d.1);
    }
    model.high_water = model.high_water.max(mk.last_token);
}
