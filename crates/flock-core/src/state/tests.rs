use super::*;
use crate::tokens::MAX_TOKEN;

const T0: Now = Now {
    wall_us: 1_700_000_000_000_000,
    wall_ms: 1_700_000_000_000,
    mono_us: 5_000_000,
};

fn at(ms: u64) -> Now {
    Now::new(T0.wall_us + ms * 1000, T0.mono_us + ms * 1000)
}

/// The monotonic clock moved by `ms` while the wall clock stepped by `wall_step_ms`.
fn stepped(ms: u64, wall_step_ms: i64) -> Now {
    let wall_ms = T0.wall_ms + ms as i64 + wall_step_ms;
    Now::new(wall_ms as u64 * 1000, T0.mono_us + ms * 1000)
}

/// Exclusive ACQUIRE on a key brought up to date (run-out leases cleared), nobody waiting.
fn acq(
    state: &mut LockState,
    owner: &str,
    ttl: u64,
    now: Now,
    tokens: &mut TokenIssuer,
) -> Acquired {
    acq_mode(state, owner, Mode::Exclusive, ttl, now, tokens)
}

fn acq_mode(
    state: &mut LockState,
    owner: &str,
    mode: Mode,
    ttl: u64,
    now: Now,
    tokens: &mut TokenIssuer,
) -> Acquired {
    state.expire(now, 0, |_| {});
    state.end_delays(now);
    state.acquire(
        owner.as_bytes(),
        mode,
        ttl,
        now,
        0,
        || None,
        100,
        None,
        tokens,
    )
}

#[test]
fn token_and_owner_qualified_calls_touch_only_their_grant() {
    let mut tokens = TokenIssuer::new();
    let mut state = LockState::default();
    let Acquired::Granted(t1) = acq(&mut state, "a", 100, T0, &mut tokens) else {
        panic!("not granted");
    };
    assert!(state.release(b"a", Some(t1), at(1)).is_some());
    let Acquired::Granted(t2) = acq(&mut state, "a", 100, at(2), &mut tokens) else {
        panic!("not granted");
    };
    assert!(t2 > t1);
    // (call, expected reply, whether t2 is still live afterwards)
    let table: [(&str, Option<u64>, bool); 8] = [
        ("release a t1", Some(0), true),
        ("renew a t1", None, true),
        ("renew b t2", None, true),
        ("renew a t2", Some(t2), true),
        ("revoke b", Some(0), true),
        ("release b t2", Some(0), true),
        ("revoke a", Some(1), false),
        ("release a t2", Some(0), false),
    ];
    for (i, (call, want, live_after)) in table.into_iter().enumerate() {
        let now = at(10 + i as u64);
        let words: Vec<&str> = call.split(' ').collect();
        let tok = |w: &str| if w == "t1" { t1 } else { t2 };
        let got = match words[..] {
            ["release", o, t] => {
                Some(state.release(o.as_bytes(), Some(tok(t)), now).is_some() as u64)
            }
            ["renew", o, t] => state.renew(o.as_bytes(), 100, Some(tok(t)), now),
            ["revoke", o] => Some(state.revoke(Some(o.as_bytes()), now, 0, |_| {}) as u64),
            _ => unreachable!("{call}"),
        };
        assert_eq!(got, want, "{call}");
        assert_eq!(state.check(t2, now) > 0, live_after, "{call}: t2 live");
    }
}

#[test]
fn revoke_without_live_grant_is_none() {
    let mut tokens = TokenIssuer::new();
    let mut state = LockState::default();
    assert_eq!(state.revoke(None, T0, 0, |_| {}), 0);
    acq(&mut state, "a", 100, T0, &mut tokens);
    assert_eq!(
        state.revoke(None, at(100), 0, |_| {}),
        0,
        "expired grant is not live"
    );
}

#[derive(Debug)]
enum Op {
    Acquire(&'static str, u64),
    Release(&'static str),
    Renew(&'static str, u64),
    CheckToken(usize),
}

#[derive(Debug, PartialEq)]
enum Out {
    /// A token: `New(i)` is the i-th distinct token issued in this case.
    New(usize),
    Same(usize),
    Nil,
    Bool(bool),
    Ms(u64),
}

/// A case: its name and its steps of (time ms, operation, outcome).
type Case = (&'static str, Vec<(u64, Op, Out)>);

/// Runs each case from a fresh state and checks every outcome.
#[test]
fn state_machine_table() {
    use Op::*;
    use Out::*;
    let cases: Vec<Case> = vec![
        (
            "free key grants, other owner busy",
            vec![(0, Acquire("a", 100), New(0)), (10, Acquire("b", 100), Nil)],
        ),
        (
            "holder repeats acquire: same token, fresh lease (G4)",
            vec![
                (0, Acquire("a", 100), New(0)),
                (90, Acquire("a", 100), Same(0)),
                (150, CheckToken(0), Ms(40)),
                (150, Acquire("b", 100), Nil),
            ],
        ),
        (
            "expired lease frees the key, new token is larger",
            vec![
                (0, Acquire("a", 100), New(0)),
                (100, Acquire("b", 100), New(1)),
                (100, CheckToken(0), Ms(0)),
                (100, CheckToken(1), Ms(100)),
            ],
        ),
        (
            "holder re-acquiring after expiry gets a new token",
            vec![
                (0, Acquire("a", 100), New(0)),
                (100, Acquire("a", 100), New(1)),
            ],
        ),
        (
            "release by owner only (G2)",
            vec![
                (0, Acquire("a", 100), New(0)),
                (1, Release("b"), Bool(false)),
                (2, Release("a"), Bool(true)),
                (3, Release("a"), Bool(false)),
                (4, CheckToken(0), Ms(0)),
                (5, Acquire("b", 100), New(1)),
            ],
        ),
        (
            "release after expiry is 0",
            vec![
                (0, Acquire("a", 100), New(0)),
                (100, Release("a"), Bool(false)),
            ],
        ),
        (
            "renew by owner extends, others nil",
            vec![
                (0, Acquire("a", 100), New(0)),
                (50, Renew("b", 1000), Nil),
                (50, Renew("a", 1000), Same(0)),
                (1049, CheckToken(0), Ms(1)),
                (1050, CheckToken(0), Ms(0)),
            ],
        ),
        (
            "renew never revives an expired grant",
            vec![
                (0, Acquire("a", 100), New(0)),
                (100, Renew("a", 100), Nil),
                (101, Acquire("a", 100), New(1)),
            ],
        ),
        (
            "check rounds up and is at least 1 while live",
            vec![
                (0, Acquire("a", 5), New(0)),
                (4, CheckToken(0), Ms(1)),
                (5, CheckToken(0), Ms(0)),
            ],
        ),
    ];

    for (name, steps) in cases {
        let mut state = LockState::default();
        let mut tokens = TokenIssuer::new();
        let mut seen: Vec<u64> = Vec::new();
        for (i, (t, op, want)) in steps.into_iter().enumerate() {
            let now = at(t);
            let got = match op {
                Acquire(o, ttl) => match acq(&mut state, o, ttl, now, &mut tokens) {
                    Acquired::Granted(tok) => {
                        assert!(
                            seen.iter().all(|&s| tok > s),
                            "{name}: token {tok} not above {seen:?}"
                        );
                        seen.push(tok);
                        New(seen.len() - 1)
                    }
                    Acquired::Refreshed(tok) => Same(seen.iter().position(|&s| s == tok).unwrap()),
                    Acquired::Busy => Nil,
                    other => panic!("{name}: {other:?}"),
                },
                Release(o) => Bool(state.release(o.as_bytes(), None, now).is_some()),
                Renew(o, ttl) => match state.renew(o.as_bytes(), ttl, None, now) {
                    Some(tok) => Same(seen.iter().position(|&s| s == tok).unwrap()),
                    None => Nil,
                },
                CheckToken(k) => Ms(state.check(seen[k], now)),
            };
            assert_eq!(got, want, "case '{name}', step {i}");
        }
    }
}

#[test]
fn tokens_follow_clock_and_high_water() {
    let mut tokens = TokenIssuer::new();
    // Floored by the wall clock in microseconds.
    assert_eq!(tokens.issue(T0), Some(1_700_000_000_000_000));
    // Same microsecond: still strictly larger.
    assert_eq!(tokens.issue(T0), Some(1_700_000_000_000_001));
    // Clock set back a day: the mark wins.
    let back = Now::new(T0.wall_us - 86_400_000_000, T0.mono_us);
    assert_eq!(tokens.issue(back), Some(1_700_000_000_000_002));
    // A token seen elsewhere raises the mark.
    tokens.observe(1_800_000_000_000_000);
    assert_eq!(tokens.issue(T0), Some(1_800_000_000_000_001));
    // The floor is the wall clock to the microsecond.
    let mut fresh = TokenIssuer::new();
    assert_eq!(
        fresh.issue(Now::new(1_700_000_000_123_456, 0)),
        Some(1_700_000_000_123_456)
    );
    // A lower token seen changes nothing.
    tokens.observe(5);
    assert_eq!(tokens.high_water(), 1_800_000_000_000_001);
}

#[test]
fn tokens_stop_below_2_pow_53() {
    let mut tokens = TokenIssuer::new();
    tokens.observe(MAX_TOKEN - 1);
    assert_eq!(tokens.issue(T0), Some(MAX_TOKEN));
    assert_eq!(tokens.issue(T0), None);
    let mut state = LockState::default();
    assert_eq!(
        acq(&mut state, "a", 10, T0, &mut tokens),
        Acquired::TokensExhausted
    );
    assert!(state.grants().is_empty());
}

#[test]
fn wall_clock_steps_do_not_change_lease_length() {
    // G9: liveness is decided by the monotonic clock.
    let mut tokens = TokenIssuer::new();
    let mut state = LockState::default();
    let Acquired::Granted(tok) = acq(&mut state, "a", 1000, T0, &mut tokens) else {
        panic!("not granted");
    };
    // Wall clock jumps an hour forward: the lease is still live with 500 ms left.
    assert_eq!(state.check(tok, stepped(500, 3_600_000)), 500);
    // Wall clock jumps back a day: the lease still ends on time.
    assert_eq!(state.check(tok, stepped(999, -86_400_000)), 1);
    assert_eq!(state.check(tok, stepped(1000, -86_400_000)), 0);
}

#[test]
fn deadlines_that_travel_are_absolute() {
    let g = Grant::new(b"a", 7, 1000, T0);
    assert_eq!(g.deadline.wall_ms, T0.wall_ms + 1000);
    // Loaded 300 ms later on another server whose monotonic clock is elsewhere.
    let there = Now::new(T0.wall_us + 300_000, 42);
    let copy = Grant::from_wall_deadline(&g.owner, g.token, g.deadline.wall_ms, there);
    assert_eq!(copy.remaining_ms(there), 700);
    assert_eq!(copy.deadline.wall_ms, g.deadline.wall_ms);
    // Loaded after the deadline: not live.
    let late = Now::new(T0.wall_us + 2_000_000, 42);
    let dead = Grant::from_wall_deadline(&g.owner, g.token, g.deadline.wall_ms, late);
    assert!(!dead.is_live(late));
    assert_eq!(dead.remaining_ms(late), 0);
}

#[test]
fn expire_reports_the_ended_token_once() {
    let mut tokens = TokenIssuer::new();
    let mut state = LockState::default();
    let Acquired::Granted(tok) = acq(&mut state, "a", 100, T0, &mut tokens) else {
        panic!("not granted");
    };
    let mut ended = Vec::new();
    assert_eq!(state.expire(at(99), 0, |g| ended.push(g.token)), 0);
    assert!(!state.is_vacant(at(99)));
    assert_eq!(state.expire(at(100), 0, |g| ended.push(g.token)), 1);
    assert_eq!(state.expire(at(100), 0, |g| ended.push(g.token)), 0);
    assert_eq!(ended, vec![tok]);
    assert!(state.is_vacant(at(100)));
}

#[test]
fn lone_grant_is_exactly_the_states_a_grant_rebuilds() {
    let mut tokens = TokenIssuer::new();
    let mut state = LockState::default();
    assert!(state.lone_grant().is_none(), "empty");
    assert!(matches!(
        acq(&mut state, "a", 1000, at(0), &mut tokens),
        Acquired::Granted(_)
    ));
    let rebuild = |state: &LockState| {
        let (mode, g) = state.lone_grant().expect("one grant");
        LockState::with_grant(
            mode,
            Grant::from_parts(&g.owner, g.token, g.deadline, g.since_mono_us, g.tie_word()),
        )
    };
    assert_eq!(
        rebuild(&state),
        state,
        "the grant's fields are the whole state"
    );
    // Bound, and lost, and shared: rebuilt too.
    let mut bound = LockState::default();
    bound.grant(Mode::Exclusive, b"b", 1000, 7, at(0), Some(3));
    assert_eq!(rebuild(&bound), bound, "bound");
    bound.close(3);
    assert_eq!(rebuild(&bound), bound, "bound, connection gone");
    let mut shared = LockState::default();
    shared.grant(Mode::Shared, b"r", 1000, 8, at(0), None);
    assert_eq!(rebuild(&shared), shared, "shared");
    // Not lone: a delayed slot, a permit, two readers, an older grant's token.
    let mut delayed = state.clone();
    delayed.delays.push(Deadline::after(5, at(0)));
    assert!(delayed.lone_grant().is_none(), "a delayed slot");
    let mut permit = LockState::default();
    permit.grant(Mode::Permits(3), b"p", 1000, 9, at(0), None);
    assert!(permit.lone_grant().is_none(), "a permit");
    shared.grant(Mode::Shared, b"s", 1000, 10, at(0), None);
    assert!(shared.lone_grant().is_none(), "two readers");
    let mut older = state.clone();
    older.last_token += 1;
    assert!(older.lone_grant().is_none(), "last token differs");
}
