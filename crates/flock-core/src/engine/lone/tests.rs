//! The fast paths against the general operations: for every case a fast path answers, the
//! general operation on the equivalent state gives the same reply, the same effects in the
//! same order and the same state after (and so the same replication: an effect's payload is
//! the state the operation left); the cases it leaves are exactly the ones it names.

use super::super::{acquire_state, release_state, BlockRefused, Effects, Env, Reply, Waiters};
use super::*;
use crate::clock::Now;
use crate::queue::Waiter;
use crate::tokens::TokenIssuer;

/// Says that `waiting` clients wait; nobody can be handed the key or made to wait.
#[derive(Default)]
struct Log {
    waiting: usize,
}

impl Waiters for Log {
    fn waiting(&mut self) -> usize {
        self.waiting
    }
    fn waiting_mode(&mut self) -> Option<Mode> {
        None
    }
    fn next_waiter_if(&mut self, _fits: &mut dyn FnMut(&Waiter) -> bool) -> Option<Waiter> {
        None
    }
    fn deliver(&mut self, _w: &Waiter, _token: u64) -> bool {
        false
    }
    fn dismiss(&mut self, _owner: &[u8]) -> bool {
        false
    }
    fn refuse_other_limits(&mut self, _limit: Mode) -> usize {
        0
    }
    fn block(
        &mut self,
        _args: &AcquireArgs<'_>,
        _timeout_ms: u64,
        _bind_to: Option<u64>,
    ) -> Result<(), BlockRefused> {
        Err(BlockRefused::Failed)
    }
}

impl Log {
    fn with_waiting(waiting: usize) -> Log {
        Log { waiting }
    }
}

/// The environment both sides of a comparison run in (no lock-delay: a lone key has none).
fn env_at(now: Now, master: bool, tokens: &mut TokenIssuer) -> Env<'_> {
    Env {
        now,
        lock_delay_ms: 0,
        max_holders: 64,
        master,
        tokens,
    }
}

/// A small deterministic generator (the cases must be the same on every run).
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

const OWNERS: [&[u8]; 3] = [b"a", b"owner-0000-1111-2222-3333-444455556666", b"b"];

fn now_at(ms: u64) -> Now {
    Now::new(1_700_000_000_000_000 + ms * 1000, 9_000_000 + ms * 1000)
}

#[test]
fn release_lone_is_release_on_the_one_grant_state() {
    let mut rng = Rng(0x9E37_79B9_7F4A_7C15);
    let (mut answered, mut left) = (0, 0);
    for _ in 0..20_000 {
        let now = now_at(rng.below(10_000));
        let since = now.mono_us.saturating_sub(rng.below(5_000_000));
        // Deadlines before, at and after now.
        let ahead = rng.below(3_000_000) as i64 - 1_000_000;
        let deadline = Deadline {
            wall_ms: now.wall_ms + ahead / 1000,
            mono_us: (now.mono_us as i64 + ahead) as u64,
        };
        let lone = LoneGrant {
            mode: if rng.below(2) == 0 {
                Mode::Exclusive
            } else {
                Mode::Shared
            },
            owner: OWNERS[rng.below(3) as usize],
            token: 1 + rng.below(4),
            deadline,
            since_mono_us: since,
            // unbound, bound to a client, bound and lost
            tie_word: [0, 0, 0, (1 << 63) | 7, u64::MAX >> 1 | 1 << 63][rng.below(5) as usize],
        };
        let owner = OWNERS[rng.below(3) as usize];
        let token = match rng.below(3) {
            0 => None,
            _ => Some(1 + rng.below(4)),
        };
        let master = rng.below(8) != 0;
        let waiting = if rng.below(8) == 0 { 1 } else { 0 };

        let mut fast = Log::with_waiting(waiting);
        let mut fast_out = Outcome::keep(Reply::Null);
        let got = release_lone(
            &lone,
            now.mono_us,
            master,
            &mut fast,
            &mut fast_out,
            owner,
            token,
        )
        .then_some(fast_out.reply);
        assert_eq!(fast_out.fate, KeyFate::Keep);
        let fast_fx = fast_out.effects;

        let mut state = lone.state();
        let before = state.clone();
        let mut tokens = TokenIssuer::new();
        let mut env = env_at(now, master, &mut tokens);
        let mut general = Log::with_waiting(waiting);
        let mut general_fx = Effects::default();
        let want = release_state(
            &mut state,
            &mut env,
            &mut general,
            &mut general_fx,
            owner,
            token,
        );

        match got {
            Some(reply) => {
                answered += 1;
                assert_eq!(reply, want, "{lone:?} released by {owner:?} {token:?}");
                assert_eq!(fast_fx, general_fx, "{lone:?} released by {owner:?}");
                if reply == Reply::Int(1) {
                    assert!(state.is_vacant(now), "a released lone grant leaves nothing");
                } else {
                    assert_eq!(state, before, "a refused release changes nothing");
                    assert!(fast_fx.is_empty());
                }
            }
            None => {
                left += 1;
                // Left to `release` only for the cases named.
                assert!(
                    !master || lone.tie_word != 0 || lone.deadline.passed(now) || waiting > 0,
                    "{lone:?} released by {owner:?} {token:?}: left to release"
                );
                assert!(fast_fx.is_empty(), "nothing done before leaving it");
            }
        }
    }
    // Both sides of the split were reached, many times.
    assert!(
        answered > 5_000 && left > 5_000,
        "{answered} answered, {left} left"
    );
}

#[test]
fn acquire_free_is_acquire_on_an_empty_state() {
    let mut rng = Rng(0xD1B5_4A32_D192_ED03);
    let (mut answered, mut left) = (0, 0);
    for _ in 0..20_000 {
        let now = now_at(rng.below(10_000));
        let mode = match rng.below(4) {
            0 => Mode::Shared,
            1 => Mode::Permits(3),
            _ => Mode::Exclusive,
        };
        let args = AcquireArgs {
            owner: OWNERS[rng.below(3) as usize],
            ttl_ms: 1 + rng.below(100_000),
            mode,
            bound: false,
            block: if rng.below(2) == 0 {
                None
            } else {
                Some(rng.below(1000))
            },
        };
        let bind_to = if rng.below(6) == 0 { Some(5) } else { None };
        let master = rng.below(8) != 0;
        let waiting = if rng.below(8) == 0 { 1 } else { 0 };
        // A mark at, near or past the end of the token space.
        let mark = match rng.below(6) {
            0 => crate::tokens::MAX_TOKEN,
            1 => crate::tokens::MAX_TOKEN - 1,
            _ => rng.below(1 << 40),
        };

        let mut fast_tokens = TokenIssuer::new();
        fast_tokens.observe(mark);
        let mut fast_env = env_at(now, master, &mut fast_tokens);
        let mut fast = Log::with_waiting(waiting);
        let mut fast_out = Outcome::keep(Reply::Null);
        let got = match acquire_free(&args, &mut fast_env, &mut fast, &mut fast_out, bind_to) {
            true => match fast_out.fate {
                KeyFate::StoreLone { grant, mode } => Some((fast_out.reply, grant, mode)),
                other => panic!("{args:?}: a free key's grant is a lone grant, not {other:?}"),
            },
            false => {
                assert_eq!(fast_out.fate, KeyFate::Keep);
                assert_eq!(fast_out.reply, Reply::Null);
                None
            }
        };
        let fast_fx = fast_out.effects;

        let mut state = LockState::default();
        let mut tokens = TokenIssuer::new();
        tokens.observe(mark);
        let mut env = env_at(now, master, &mut tokens);
        let mut general = Log::with_waiting(waiting);
        let mut general_fx = Effects::default();
        let want = acquire_state(
            &mut state,
            &mut env,
            &mut general,
            &mut general_fx,
            &args,
            false,
            bind_to,
        );

        match got {
            Some((reply, grant, got_mode)) => {
                answered += 1;
                assert_eq!(got_mode, mode);
                assert_eq!(reply, want, "{args:?}");
                assert_eq!(fast_fx, general_fx, "{args:?}");
                assert_eq!(LockState::with_grant(mode, grant), state, "{args:?}");
                assert_eq!(fast_tokens.high_water(), tokens.high_water());
            }
            None => {
                left += 1;
                assert!(
                    !master
                        || matches!(mode, Mode::Permits(_))
                        || waiting > 0
                        || matches!(want, Reply::Error(_)),
                    "{args:?}: left to acquire"
                );
                assert!(fast_fx.is_empty(), "nothing done before leaving it");
                assert_eq!(
                    fast_tokens.high_water(),
                    mark,
                    "no token issued before leaving it"
                );
            }
        }
    }
    assert!(
        answered > 5_000 && left > 5_000,
        "{answered} answered, {left} left"
    );
}
