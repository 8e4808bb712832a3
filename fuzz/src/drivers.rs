//! Fuzz drivers for flock's pure code. They take raw bytes (libFuzzer's input, or a seeded
//! random generator's output in `tests/fuzz_smoke.rs`) and panic on any broken rule.
//!
//! This file is compiled in two places, both of which provide `crate::core` and `crate::args`
//! (the main crate's `src/core.rs` and `src/args.rs`, included by path):
//! - `fuzz/src/lib.rs`, for the cargo-fuzz targets in `fuzz/fuzz_targets/`;
//! - `tests/fuzz_smoke.rs`, which runs both drivers on random inputs inside `make test`.
//!
//! - [`args_target`]: every parser against an independent reference written from the
//!   contract (SPEC.md, "Errors").
//! - [`state_machine_target`]: random operation sequences (acquire, block, cancel, release,
//!   renew, revoke, check, timer, DEL, reload from RDB/AOF/replica, restart, clock steps)
//!   driven through the core the way the module's glue drives it, against a simple
//!   reference model, with G1-G4, G6 and G9 as assertions.
#![allow(dead_code)]

use crate::args::{self, ArgError, Effect};
use crate::core::{
    Acquired, Deadline, Grant, LockState, Now, TokenIssuer, WaitQueue, Waiter, MAX_OWNER_LEN,
    MAX_TOKEN,
};
use std::collections::VecDeque;

/// Reads an input as a stream of small decisions; past the end it reads zeros.
pub struct Bytes<'a> {
    data: &'a [u8],
    pos: usize,
}

impl<'a> Bytes<'a> {
    pub fn new(data: &'a [u8]) -> Self {
        Bytes { data, pos: 0 }
    }
    pub fn done(&self) -> bool {
        self.pos >= self.data.len()
    }
    pub fn u8(&mut self) -> u8 {
        let b = self.data.get(self.pos).copied().unwrap_or(0);
        self.pos += 1;
        b
    }
    pub fn u16(&mut self) -> u16 {
        u16::from(self.u8()) | (u16::from(self.u8()) << 8)
    }
    pub fn u32(&mut self) -> u32 {
        u32::from(self.u16()) | (u32::from(self.u16()) << 16)
    }
    pub fn u64(&mut self) -> u64 {
        u64::from(self.u32()) | (u64::from(self.u32()) << 32)
    }
    pub fn below(&mut self, n: usize) -> usize {
        if n <= 256 {
            usize::from(self.u8()) % n
        } else {
            usize::from(self.u16()) % n
        }
    }
    pub fn slice(&mut self, n: usize) -> &'a [u8] {
        let start = self.pos.min(self.data.len());
        let end = (start + n).min(self.data.len());
        self.pos += n;
        &self.data[start..end]
    }
}

// -------------------------------------------------------------------------------------------
// arguments
// -------------------------------------------------------------------------------------------

/// Interesting argument values: limits of every range, option names, odd spellings.
const DICTIONARY: &[&[u8]] = &[
    b"0",
    b"1",
    b"-1",
    b"-0",
    b"+1",
    b"007",
    b"100",
    b"86400000",
    b"86400001",
    b"315360000000",
    b"9007199254740991",
    b"9007199254740992",
    b"9223372036854775807",
    b"9223372036854775808",
    b"-9223372036854775808",
    b"-9223372036854775809",
    b"00000000000000000001",
    b"18446744073709551616",
    b"1.5",
    b"1e3",
    b" 1",
    b"1 ",
    b"0x10",
    b"",
    b"BLOCK",
    b"block",
    b"BlOcK",
    b"GRANT",
    b"grant",
    b"DELAY",
    b"delay",
    b"o",
    b"\0",
    b"\r\n",
    b"blpop",
    b"XREAD",
    b"xreadgroup",
    b"FLOCK.ACQUIRE",
    b"flock.fenced",
    b"Flock.",
    b"SET",
    b"MULTI",
    b"evalsha_ro",
];

fn fuzz_arg(r: &mut Bytes<'_>) -> Vec<u8> {
    match r.u8() % 8 {
        0..=3 => DICTIONARY[r.below(DICTIONARY.len())].to_vec(),
        4 => {
            // owners at and past the length limit
            let n = [0, 1, MAX_OWNER_LEN - 1, MAX_OWNER_LEN, MAX_OWNER_LEN + 1][r.below(5)];
            vec![b'x'; n]
        }
        5 => (r.u64() as i64).to_string().into_bytes(),
        _ => {
            let n = r.below(24);
            r.slice(n).to_vec()
        }
    }
}

/// The integer format of the contract: an optional '-', then 1 to 19 decimal digits, whose
/// value fits in a signed 64-bit integer. Written without `str::parse`, from the digits.
pub fn ref_int(b: &[u8]) -> Option<i64> {
    let (neg, digits) = match b.first() {
        Some(b'-') => (true, &b[1..]),
        _ => (false, b),
    };
    if digits.is_empty() || digits.len() > 19 || !digits.iter().all(|c| c.is_ascii_digit()) {
        return None;
    }
    // Redis's string2ll: "0" alone, else no leading zero (so no "-0" either).
    if digits[0] == b'0' && (digits.len() > 1 || neg) {
        return None;
    }
    let mut v: i128 = 0;
    for d in digits {
        v = v * 10 + i128::from(d - b'0');
    }
    if neg {
        v = -v;
    }
    i64::try_from(v).ok()
}

fn ref_owner(b: &[u8]) -> Result<&[u8], ArgError> {
    if (1..=256).contains(&b.len()) {
        Ok(b)
    } else {
        Err(ArgError::Owner)
    }
}

fn ref_ttl(b: &[u8], max: u64) -> Result<u64, ArgError> {
    match ref_int(b) {
        Some(v) if v >= 1 && (v as u64) <= max => Ok(v as u64),
        _ => Err(ArgError::Ttl { max }),
    }
}

fn ref_token(b: &[u8]) -> Result<u64, ArgError> {
    match ref_int(b) {
        Some(v) if v >= 1 => Ok(v as u64),
        _ => Err(ArgError::Token),
    }
}

/// Every parser against the reference, for one argument vector.
pub fn check_args(argv: &[&[u8]], max_ttl: u64) {
    let show = || {
        argv.iter()
            .map(|a| String::from_utf8_lossy(a).into_owned())
            .collect::<Vec<_>>()
    };
    for a in argv {
        assert_eq!(args::parse_i64(a), ref_int(a), "parse_i64({:?})", a);
    }

    // FLOCK.ACQUIRE key owner ttl [BLOCK timeout]
    let want = if argv.len() < 4 {
        Err(ArgError::Arity)
    } else {
        ref_owner(argv[2]).and_then(|owner| {
            let ttl_ms = ref_ttl(argv[3], max_ttl)?;
            let block = match &argv[4..] {
                [] => None,
                [opt, t] if opt.eq_ignore_ascii_case(b"block") => match ref_int(t) {
                    Some(v) if v >= 0 => Some(v as u64),
                    _ => return Err(ArgError::Timeout),
                },
                _ => return Err(ArgError::Syntax),
            };
            Ok((owner, ttl_ms, block))
        })
    };
    let got = args::parse_acquire(argv, max_ttl).map(|a| (a.owner, a.ttl_ms, a.block));
    assert_eq!(got, want, "parse_acquire {:?} max {max_ttl}", show());
    if let Ok((owner, ttl, _)) = got {
        assert!((1..=MAX_OWNER_LEN).contains(&owner.len()));
        assert!(ttl >= 1 && ttl <= max_ttl);
    }

    // FLOCK.RELEASE key owner [token]
    let want = match argv.len() {
        3 => ref_owner(argv[2]).map(|o| (o, None)),
        4 => ref_owner(argv[2]).and_then(|o| Ok((o, Some(ref_token(argv[3])?)))),
        _ => Err(ArgError::Arity),
    };
    assert_eq!(
        args::parse_release(argv),
        want,
        "parse_release {:?}",
        show()
    );

    // FLOCK.RENEW key owner ttl [token]
    let want = match argv.len() {
        4 => ref_owner(argv[2]).and_then(|o| Ok((o, ref_ttl(argv[3], max_ttl)?, None))),
        5 => ref_owner(argv[2]).and_then(|o| {
            Ok((o, ref_ttl(argv[3], max_ttl)?, Some(ref_token(argv[4])?)))
        }),
        _ => Err(ArgError::Arity),
    };
    assert_eq!(
        args::parse_renew(argv, max_ttl),
        want,
        "parse_renew {:?}",
        show()
    );

    // FLOCK.CHECK key token
    let want = if argv.len() == 3 {
        ref_token(argv[2])
    } else {
        Err(ArgError::Arity)
    };
    assert_eq!(args::parse_check(argv), want, "parse_check {:?}", show());

    // FLOCK.INFO key
    let want = if argv.len() == 2 {
        Ok(())
    } else {
        Err(ArgError::Arity)
    };
    assert_eq!(args::parse_info(argv), want, "parse_info {:?}", show());

    // FLOCK.REVOKE key [owner]
    let want = match argv.len() {
        2 => Ok(None),
        3 => ref_owner(argv[2]).map(Some),
        _ => Err(ArgError::Arity),
    };
    assert_eq!(args::parse_revoke(argv), want, "parse_revoke {:?}", show());

    // FLOCK.APPLY: tokens must be usable (1 to 2^53-1), deadlines any i64.
    let effect_token = |b: &[u8]| match ref_token(b) {
        Ok(t) if t <= MAX_TOKEN => Ok(t),
        _ => Err(ArgError::Token),
    };
    let got = args::parse_apply(argv);
    match &got {
        Ok(Effect::Grant {
            owner,
            token,
            deadline_wall_ms,
        }) => {
            assert_eq!(argv.len(), 6, "GRANT with {} args", argv.len());
            assert!(argv[2].eq_ignore_ascii_case(b"grant"));
            assert_eq!(Ok(*owner), ref_owner(argv[3]));
            assert_eq!(Ok(*token), effect_token(argv[4]));
            assert_eq!(Some(*deadline_wall_ms), ref_int(argv[5]));
        }
        Ok(Effect::Delay {
            token,
            until_wall_ms,
        }) => {
            assert_eq!(argv.len(), 5, "DELAY with {} args", argv.len());
            assert!(argv[2].eq_ignore_ascii_case(b"delay"));
            assert_eq!(Ok(*token), effect_token(argv[3]));
            assert_eq!(Some(*until_wall_ms), ref_int(argv[4]));
        }
        Err(e) => {
            // A well-formed effect must never be refused.
            let grant_ok = argv.len() == 6
                && argv[2].eq_ignore_ascii_case(b"grant")
                && ref_owner(argv[3]).is_ok()
                && effect_token(argv[4]).is_ok()
                && ref_int(argv[5]).is_some();
            let delay_ok = argv.len() == 5
                && argv[2].eq_ignore_ascii_case(b"delay")
                && effect_token(argv[3]).is_ok()
                && ref_int(argv[4]).is_some();
            assert!(
                !grant_ok && !delay_ok,
                "parse_apply refused {:?}: {e:?}",
                show()
            );
        }
    }

    // Error texts: every one is a proper error reply.
    for e in [
        ArgError::Arity,
        ArgError::Syntax,
        ArgError::Owner,
        ArgError::Ttl { max: max_ttl },
        ArgError::Timeout,
        ArgError::Token,
    ] {
        let m = e.message();
        assert!(m.starts_with("ERR "), "{m}");
        assert!(!m.contains('\r') && !m.contains('\n') && !m.contains('\0'));
    }

    // FENCED refusals: every FLOCK command, every blocking or transaction command, in any
    // case; XREAD/XREADGROUP only with BLOCK.
    if let Some((cmd, rest)) = argv.split_first() {
        let lower = cmd.to_ascii_lowercase();
        let refused = args::fenced_refusal(cmd, rest).is_some();
        let must = lower.starts_with(b"flock.")
            || [
                &b"blpop"[..],
                b"brpop",
                b"brpoplpush",
                b"blmove",
                b"blmpop",
                b"bzpopmin",
                b"bzpopmax",
                b"bzmpop",
                b"multi",
                b"exec",
                b"watch",
                b"eval",
                b"evalsha",
                b"eval_ro",
                b"evalsha_ro",
                b"fcall",
                b"fcall_ro",
                b"subscribe",
                b"psubscribe",
                b"ssubscribe",
                b"monitor",
                b"wait",
                b"waitaof",
                b"shutdown",
            ]
            .contains(&lower.as_slice())
            || ((lower == b"xread" || lower == b"xreadgroup")
                && rest.iter().any(|a| a.eq_ignore_ascii_case(b"block")));
        if must {
            assert!(refused, "FENCED must refuse {:?}", show());
        }
        let may_run =
            [&b"set"[..], b"get", b"incr", b"del", b"hset", b"rpush"].contains(&lower.as_slice());
        if may_run {
            assert!(!refused, "FENCED must run {:?}", show());
        }
    }
}

/// libFuzzer target: one argument vector per input (the first byte picks `flock.max-ttl-ms`).
pub fn args_target(data: &[u8]) {
    let mut r = Bytes::new(data);
    let max_ttl = match r.u8() % 4 {
        0 => 86_400_000,
        1 => 1,
        2 => 315_360_000_000,
        _ => 1 + u64::from(r.u32()),
    };
    let argc = r.below(9);
    let owned: Vec<Vec<u8>> = (0..argc).map(|_| fuzz_arg(&mut r)).collect();
    let argv: Vec<&[u8]> = owned.iter().map(|a| a.as_slice()).collect();
    check_args(&argv, max_ttl);
}

// -------------------------------------------------------------------------------------------
// the lock state machine
// -------------------------------------------------------------------------------------------

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

/// The reference model of one key, written from the contract alone.
#[derive(Clone, Debug, Default)]
struct MKey {
    holder: Option<MGrant>,
    /// Lock-delay end: (monotonic us, wall ms).
    delay: Option<(u64, i64)>,
    last_token: u64,
    queue: VecDeque<MWaiter>,
}

struct Model {
    keys: Vec<MKey>,
    high_water: u64,
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
    /// key to the first waiter. Returns (expired token, (waiter id, token) handed to).
    fn settle(
        &mut self,
        k: usize,
        now: Now,
        lock_delay_ms: u64,
    ) -> (Option<u64>, Option<(u64, u64)>) {
        let mut expired = None;
        let key = &mut self.keys[k];
        if let Some(g) = key.holder.clone() {
            if now.mono_us >= g.mono_us {
                key.holder = None;
                expired = Some(g.token);
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
        let free = key.holder.is_none() && key.delay.is_none();
        if free && !key.queue.is_empty() {
            if let Some(token) = self.issue(now) {
                let key = &mut self.keys[k];
                let w = key.queue.pop_front().expect("non-empty queue");
                key.holder = Some(MGrant {
                    owner: w.owner,
                    token,
                    mono_us: now.mono_us + w.ttl_ms * 1000,
                    wall_ms: now.wall_ms + w.ttl_ms as i64,
                });
                key.last_token = token;
                return (expired, Some((w.id, token)));
            }
        }
        (expired, None)
    }
}

/// The implementation's side: what the module keeps per key.
struct Real {
    states: Vec<LockState>,
    queues: Vec<WaitQueue>,
    tokens: TokenIssuer,
}

fn grant_view(g: &Grant) -> MGrant {
    MGrant {
        owner: g.owner.to_vec(),
        token: g.token,
        mono_us: g.deadline.mono_us,
        wall_ms: g.deadline.wall_ms,
    }
}

/// A key's state (holder, delay, waiters) must be the model's.
fn assert_same(real: &Real, model: &Model, k: usize, now: Now, step: usize, what: &str) {
    let st = &real.states[k];
    let mk = &model.keys[k];
    assert_eq!(
        st.holder.as_ref().map(grant_view),
        mk.holder,
        "step {step} ({what}): holder of key {k}"
    );
    assert_eq!(
        st.delay.map(|d| (d.mono_us, d.wall_ms)),
        mk.delay,
        "step {step} ({what}): lock-delay of key {k}"
    );
    assert_eq!(
        real.queues[k].len(),
        mk.queue.len(),
        "step {step} ({what}): waiters of key {k}"
    );
    // G1: the live holder is one owner; CHECK agrees with it.
    let live = st.live_holder(now);
    assert_eq!(live.map(grant_view).as_ref(), model.live(k, now));
    if let Some(g) = live {
        let left = st.check(g.token, now);
        assert!(left >= 1, "step {step}: live grant checks as {left}");
        assert_eq!(left, (g.deadline.mono_us - now.mono_us).div_ceil(1000));
        assert_eq!(st.check(g.token + 1, now), 0);
    }
    // G6: after settling, a free key has nobody waiting.
    if st.is_free(now) {
        assert!(
            real.queues[k].is_empty() || what != "settled",
            "step {step}: key {k} is free with {} waiters after settle",
            real.queues[k].len()
        );
    }
}

/// Every token issued, in order, with its owner (G3).
#[derive(Default)]
struct Issued {
    tokens: Vec<(u64, Vec<u8>)>,
    /// Set by a restart that lost the high-water mark (an AOF without preamble): the mark
    /// before it. The contract keeps tokens growing across such a restart only while the
    /// clock is past that mark; when the next token shows that it is not, the old history no
    /// longer binds.
    clock_floor: Option<u64>,
}

impl Issued {
    /// A new token must exceed every token issued before it (G3), stay below 2^53, and be no
    /// lower than the wall clock in microseconds.
    fn note(&mut self, t: u64, owner: &[u8], now: Now, step: usize) {
        if let Some(floor) = self.clock_floor.take() {
            if t <= floor {
                self.tokens.clear();
            }
        }
        if let Some((last, _)) = self.tokens.last() {
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
        self.tokens.push((t, owner.to_vec()));
    }
}

/// libFuzzer target: a random sequence of operations on three keys.
pub fn state_machine_target(data: &[u8]) {
    let mut r = Bytes::new(data);
    let mut wall_us: u64 = WALL0_US + u64::from(r.u32());
    let mut mono_us: u64 = 1_000_000 + u64::from(r.u16());
    let mut lock_delay_ms: u64 = [0, 0, 0, 5, 50, 400][r.below(6)];
    let mut real = Real {
        states: vec![LockState::default(); KEYS],
        queues: vec![WaitQueue::default(); KEYS],
        tokens: TokenIssuer::new(),
    };
    let mut model = Model {
        keys: vec![MKey::default(); KEYS],
        high_water: 0,
    };
    // Every token ever issued, in order (G3), and the owner it went to.
    let mut issued = Issued::default();
    let mut next_waiter: u64 = 0;
    let mut steps = 0usize;

    while !r.done() && steps < 4000 {
        steps += 1;
        let now = Now::new(wall_us, mono_us);
        let op = r.u8() % 16;
        let k = r.below(KEYS);
        let o = r.below(OWNERS);
        let owner = owner_bytes(o);
        let ttl_ms: u64 = match r.u8() % 4 {
            0 => 1,
            1 => 1 + u64::from(r.u8()),
            2 => 1 + u64::from(r.u16()),
            _ => 1000,
        };

        // Settle the key the way every write command of the glue does first, and check the
        // hand-off against the model (FIFO, G6; token order, G3).
        let settle = |real: &mut Real,
                      model: &mut Model,
                      issued: &mut Issued,
                      lock_delay_ms: u64,
                      k: usize| {
            let before_live = real.states[k].live_holder(now).is_some();
            let s = real.states[k].settle(
                now,
                lock_delay_ms,
                Some(&mut real.queues[k]),
                &mut real.tokens,
            );
            let (m_expired, m_handed) = model.settle(k, now, lock_delay_ms);
            assert_eq!(s.expired, m_expired, "step {steps}: expiry of key {k}");
            assert_eq!(
                s.handed_to.as_ref().map(|(w, t)| (w.id, *t)),
                m_handed,
                "step {steps}: hand-off of key {k} (FIFO)"
            );
            if let Some((w, t)) = &s.handed_to {
                assert!(!before_live, "step {steps}: handed off a live lock (G1)");
                issued.note(*t, &w.owner, now, steps);
            }
            assert_same(real, model, k, now, steps, "settled");
        };

        match op {
            // FLOCK.ACQUIRE, with or without BLOCK
            0..=3 => {
                if real.tokens.high_water() >= MAX_TOKEN {
                    continue;
                }
                settle(&mut real, &mut model, &mut issued, lock_delay_ms, k);
                let before = real.states[k].live_holder(now).cloned();
                let waiting = real.queues[k].len();
                let got = real.states[k].acquire(&owner, ttl_ms, now, waiting, &mut real.tokens);
                // The model.
                let want = match model.live(k, now).cloned() {
                    Some(g) if g.owner == owner => {
                        let h = model.keys[k].holder.as_mut().expect("holder");
                        h.mono_us = now.mono_us + ttl_ms * 1000;
                        h.wall_ms = now.wall_ms + ttl_ms as i64;
                        Acquired::Refreshed(g.token)
                    }
                    Some(_) => Acquired::Busy,
                    None if model.delay_active(k, now) || !model.keys[k].queue.is_empty() => {
                        Acquired::Busy
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
                            Acquired::Granted(t)
                        }
                        None => Acquired::TokensExhausted,
                    },
                };
                assert_eq!(got, want, "step {steps}: ACQUIRE key {k} owner {o}");
                // G1 / G4, from the state before the call alone.
                match (&before, got) {
                    (Some(h), Acquired::Refreshed(t)) => {
                        assert_eq!(*h.owner, *owner, "step {steps}: refreshed another's grant");
                        assert_eq!(h.token, t, "step {steps}: G4 same token");
                    }
                    (Some(h), other) => assert!(
                        *h.owner != *owner && other == Acquired::Busy,
                        "step {steps}: {other:?} while {:?} holds (G1/G4)",
                        h.owner
                    ),
                    (None, Acquired::Refreshed(_)) => {
                        panic!("step {steps}: refreshed a grant that was not live")
                    }
                    (None, Acquired::Granted(t)) => {
                        issued.note(t, &owner, now, steps);
                    }
                    (None, _) => {}
                }
                if got == Acquired::Busy && op >= 2 {
                    // BLOCK: queue (flock.max-waiters is the glue's business).
                    next_waiter += 1;
                    let w = Waiter {
                        id: next_waiter,
                        owner: owner.clone().into(),
                        ttl_ms,
                    };
                    real.queues[k].push(w);
                    model.keys[k].queue.push_back(MWaiter {
                        id: next_waiter,
                        owner: owner.clone(),
                        ttl_ms,
                    });
                }
                assert_same(&real, &model, k, now, steps, "acquire");
                if real.states[k].is_vacant(now) && real.queues[k].is_empty() {
                    // The glue deletes a key nobody needs.
                    real.states[k] = LockState::default();
                    model.keys[k].holder = None;
                    model.keys[k].delay = None;
                    model.keys[k].last_token = 0;
                }
            }
            // FLOCK.RELEASE
            4 | 5 => {
                settle(&mut real, &mut model, &mut issued, lock_delay_ms, k);
                let before = real.states[k].live_holder(now).cloned();
                let got = real.states[k].release(&owner, now);
                let want = model.live(k, now).is_some_and(|g| g.owner == owner);
                assert_eq!(got, want, "step {steps}: RELEASE key {k} owner {o}");
                if want {
                    model.keys[k].holder = None;
                } else {
                    // G2: nothing changed.
                    assert_eq!(real.states[k].live_holder(now).cloned(), before);
                }
                settle(&mut real, &mut model, &mut issued, lock_delay_ms, k);
            }
            // FLOCK.RENEW
            6 => {
                settle(&mut real, &mut model, &mut issued, lock_delay_ms, k);
                let before = real.states[k].live_holder(now).cloned();
                let got = real.states[k].renew(&owner, ttl_ms, now);
                let want = match model.live(k, now).cloned() {
                    Some(g) if g.owner == owner => {
                        let h = model.keys[k].holder.as_mut().expect("holder");
                        h.mono_us = now.mono_us + ttl_ms * 1000;
                        h.wall_ms = now.wall_ms + ttl_ms as i64;
                        Some(g.token)
                    }
                    _ => None,
                };
                assert_eq!(got, want, "step {steps}: RENEW key {k} owner {o}");
                if want.is_none() {
                    assert_eq!(
                        real.states[k].live_holder(now).cloned(),
                        before,
                        "step {steps}: RENEW by a non-holder changed the grant (G2)"
                    );
                }
                assert_same(&real, &model, k, now, steps, "renew");
            }
            // FLOCK.REVOKE
            7 => {
                settle(&mut real, &mut model, &mut issued, lock_delay_ms, k);
                let got = real.states[k].revoke(now, lock_delay_ms);
                let want = model.live(k, now).map(|g| g.token);
                if want.is_some() {
                    let key = &mut model.keys[k];
                    key.holder = None;
                    if lock_delay_ms > 0 {
                        key.delay = Some((
                            now.mono_us + lock_delay_ms * 1000,
                            now.wall_ms + lock_delay_ms as i64,
                        ));
                    }
                }
                assert_eq!(got, want, "step {steps}: REVOKE key {k}");
                if let Some(t) = got {
                    assert_eq!(real.states[k].check(t, now), 0, "revoked token still live");
                }
                settle(&mut real, &mut model, &mut issued, lock_delay_ms, k);
            }
            // FLOCK.CHECK of a recent token (read-only: no settle)
            8 => {
                let t = match issued.tokens.len() {
                    0 => 1 + u64::from(r.u8()),
                    n => issued.tokens[n - 1 - r.below(n.min(4))].0,
                };
                let got = real.states[k].check(t, now);
                let want = model
                    .live(k, now)
                    .filter(|g| g.token == t)
                    .map_or(0, |g| (g.mono_us - now.mono_us).div_ceil(1000));
                assert_eq!(got, want, "step {steps}: CHECK key {k} token {t}");
            }
            // Time passes; now and then the wall clock steps (NTP, an operator, a VM resume).
            9 | 10 => {
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
            11 => settle(&mut real, &mut model, &mut issued, lock_delay_ms, k),
            // A waiter leaves: timeout, disconnect, CLIENT UNBLOCK.
            12 => {
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
                // The glue then looks at the key again.
                settle(&mut real, &mut model, &mut issued, lock_delay_ms, k);
            }
            // DEL / UNLINK / FLUSHALL / eviction of the key: the lock is gone, the waiters stay
            // and get the key right after (G3: tokens keep growing).
            13 => {
                real.states[k] = LockState::default();
                model.keys[k].holder = None;
                model.keys[k].delay = None;
                model.keys[k].last_token = 0;
                settle(&mut real, &mut model, &mut issued, lock_delay_ms, k);
            }
            // The key travels: RDB save/load, AOF, a replica's copy, DUMP/RESTORE. What
            // travels is owner, token and the absolute wall-clock deadline (G7); waiters stay
            // (DEBUG RELOAD keeps the clients).
            14 => {
                for kk in 0..KEYS {
                    travel(&mut real, &mut model, kk, now);
                }
            }
            // A restart or a failover: state travels, waiters are gone; the high-water mark
            // comes along (RDB aux data, replication) or not (an AOF without preamble).
            _ => {
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
                // Without the mark, G3 across the restart rests on the clock alone: the first
                // token issued after it must be above the old mark when the clock is.
                if !keep_mark {
                    model.high_water = real.tokens.high_water();
                    issued.clock_floor = Some(issued.clock_floor.unwrap_or(0).max(old_mark));
                }
                // A new lock-delay setting now and then (CONFIG SET).
                lock_delay_ms = [0, 0, 3, 100][r.below(4)];
            }
        }
        for kk in 0..KEYS {
            assert_same(&real, &model, kk, now, steps, "any");
        }
    }
}

/// A key leaves this server and comes back (RDB, AOF, replication): owner, token and the
/// absolute wall-clock deadline; the monotonic deadline is what is left of it by the local
/// wall clock now.
fn travel(real: &mut Real, model: &mut Model, k: usize, now: Now) {
    let st = &real.states[k];
    let loaded = if let Some(g) = &st.holder {
        LockState::with_grant(Grant::from_wall_deadline(
            &g.owner,
            g.token,
            g.deadline.wall_ms,
            now,
        ))
    } else if let Some(d) = st.delay {
        LockState::delayed(st.last_token, Deadline::from_wall(d.wall_ms, now))
    } else {
        // Nothing to save: the key does not exist.
        LockState::default()
    };
    real.tokens.observe(loaded.last_token);
    real.states[k] = loaded;

    let left = |wall_ms: i64| -> u64 {
        let ms = wall_ms.saturating_sub(now.wall_ms).max(0) as u64;
        now.mono_us + ms * 1000
    };
    let mk = &mut model.keys[k];
    if let Some(g) = mk.holder.as_mut() {
        g.mono_us = left(g.wall_ms);
        mk.last_token = g.token;
        mk.delay = None;
    } else if let Some((_, wall)) = mk.delay {
        mk.delay = Some((left(wall), wall));
    } else {
        mk.last_token = 0;
    }
    model.high_water = model.high_water.max(mk.last_token);
}
