//! FLOCK.WATCH's and FLOCK.WAITERS' rules, one #[test] per case.

use super::*;
use crate::clock::Now;
use crate::state::{Grant, LockState, Mode};

const T0: Now = Now {
    wall_us: 1_700_000_000_000_000,
    wall_ms: 1_700_000_000_000,
    mono_us: 5_000_000,
};

/// `T0` plus `ms`.
fn later(ms: u64) -> Now {
    Now::new(T0.wall_us + ms * 1000, T0.mono_us + ms * 1000)
}

/// A key of `mode` with grants of (owner, token, ttl_ms) made at `T0`.
fn key(mode: Mode, grants: &[(&str, u64, u64)]) -> LockState {
    let mut s = LockState::default();
    s.mode = mode;
    for &(owner, token, ttl_ms) in grants {
        s.push_grant(Grant::new(owner.as_bytes(), token, ttl_ms, T0));
        s.last_token = s.last_token.max(token);
    }
    s
}

fn fired(event: WatchEvent, owner: Option<&str>, token: u64) -> Fired {
    Fired {
        event,
        owner: owner.map(|o| Box::from(o.as_bytes())),
        token,
    }
}

// ---- at the call ----

macro_rules! at_call_cases {
    ($($name:ident: $state:expr, $token:expr, $now:expr => $want:expr;)*) => {$(
        #[test]
        fn $name() {
            let state: Option<LockState> = $state;
            assert_eq!(at_call(state.as_ref(), $token, $now), $want);
        }
    )*};
}

at_call_cases! {
    token_0_of_a_held_key_fires_held_at_once:
        Some(key(Mode::Exclusive, &[("a", 7, 1000)])), 0, T0
        => AtCall::Fire(fired(WatchEvent::Held, Some("a"), 7));
    token_0_names_the_oldest_live_grant_of_a_shared_key:
        Some(key(Mode::Shared, &[("b", 9, 1000), ("a", 7, 1000), ("c", 8, 1000)])), 0, T0
        => AtCall::Fire(fired(WatchEvent::Held, Some("a"), 7));
    token_0_skips_a_grant_whose_lease_ran_out:
        Some(key(Mode::Shared, &[("a", 7, 10), ("b", 9, 1000)])), 0, later(20)
        => AtCall::Fire(fired(WatchEvent::Held, Some("b"), 9));
    token_0_of_a_missing_key_waits:
        None, 0, T0 => AtCall::Wait { owner: None };
    token_0_of_a_key_whose_only_lease_ran_out_waits:
        Some(key(Mode::Exclusive, &[("a", 7, 10)])), 0, later(10)
        => AtCall::Wait { owner: None };
    a_live_token_waits_with_its_owner:
        Some(key(Mode::Exclusive, &[("a", 7, 1000)])), 7, T0
        => AtCall::Wait { owner: Some(b"a") };
    a_live_permit_waits_with_its_owner:
        Some(key(Mode::Permits(3), &[("a", 7, 1000), ("b", 8, 1000)])), 8, T0
        => AtCall::Wait { owner: Some(b"b") };
    a_token_never_issued_is_gone:
        Some(key(Mode::Exclusive, &[("a", 7, 1000)])), 6, T0
        => AtCall::Fire(fired(WatchEvent::Gone, None, 6));
    a_token_of_a_missing_key_is_gone:
        None, 7, T0 => AtCall::Fire(fired(WatchEvent::Gone, None, 7));
    a_token_whose_lease_ran_out_is_gone:
        Some(key(Mode::Exclusive, &[("a", 7, 10)])), 7, later(10)
        => AtCall::Fire(fired(WatchEvent::Gone, None, 7));
}

// ---- after a change ----

macro_rules! after_change_cases {
    ($($name:ident: $state:expr, $token:expr, $ended:expr => $want:expr;)*) => {$(
        #[test]
        fn $name() {
            let state: Option<LockState> = $state;
            let ended: &[(u64, WatchEvent)] = &$ended;
            assert_eq!(after_change(state.as_ref(), $token, b"a", ended, T0, false), $want);
        }
    )*};
}

after_change_cases! {
    a_released_grant_fires_released:
        None, 7, [(7, WatchEvent::Released)] => Some(fired(WatchEvent::Released, Some("a"), 7));
    an_expired_grant_fires_expired:
        Some(key(Mode::Exclusive, &[("b", 8, 1000)])), 7, [(7, WatchEvent::Expired)]
        => Some(fired(WatchEvent::Expired, Some("a"), 7));
    a_revoked_grant_fires_revoked:
        None, 7, [(7, WatchEvent::Revoked)] => Some(fired(WatchEvent::Revoked, Some("a"), 7));
    a_closed_grant_fires_closed:
        None, 7, [(7, WatchEvent::Closed)] => Some(fired(WatchEvent::Closed, Some("a"), 7));
    the_watched_grants_own_end_is_told_among_others:
        None, 7, [(6, WatchEvent::Expired), (7, WatchEvent::Revoked), (8, WatchEvent::Revoked)]
        => Some(fired(WatchEvent::Revoked, Some("a"), 7));
    another_grant_ending_does_not_fire:
        Some(key(Mode::Shared, &[("a", 7, 1000)])), 7, [(8, WatchEvent::Released)] => None;
    a_reader_joining_does_not_fire:
        Some(key(Mode::Shared, &[("a", 7, 1000), ("b", 8, 1000)])), 7, [] => None;
    a_deleted_key_loses_the_grant:
        None, 7, [] => Some(fired(WatchEvent::Lost, Some("a"), 7));
    a_replicated_state_without_the_grant_loses_it:
        Some(key(Mode::Exclusive, &[("b", 9, 1000)])), 7, []
        => Some(fired(WatchEvent::Lost, Some("a"), 7));
    a_grant_still_in_the_state_has_not_ended_even_past_its_lease:
        Some(key(Mode::Exclusive, &[("a", 7, 0)])), 7, [] => None;
    token_0_fires_when_a_grant_appears:
        Some(key(Mode::Exclusive, &[("b", 9, 1000)])), 0, []
        => Some(fired(WatchEvent::Held, Some("b"), 9));
    token_0_keeps_waiting_on_a_deleted_key:
        None, 0, [(7, WatchEvent::Released)] => None;
}

#[test]
fn a_bound_grant_watched_on_a_replica_and_closed_after_its_promotion_was_lost() {
    let ended = [(7, WatchEvent::Closed)];
    assert_eq!(
        after_change(None, 7, b"a", &ended, T0, true),
        Some(fired(WatchEvent::Lost, Some("a"), 7))
    );
    let ended = [(7, WatchEvent::Released)];
    assert_eq!(
        after_change(None, 7, b"a", &ended, T0, true),
        Some(fired(WatchEvent::Released, Some("a"), 7)),
        "every other end says how"
    );
}

#[test]
fn every_ending_event_names_its_grant() {
    let cases = [
        (
            Event::Released {
                held_ms: 3,
                token: 5,
            },
            Some((5, WatchEvent::Released)),
        ),
        (Event::Expired { token: 5 }, Some((5, WatchEvent::Expired))),
        (Event::Revoked { token: 5 }, Some((5, WatchEvent::Revoked))),
        (Event::Closed { token: 5 }, Some((5, WatchEvent::Closed))),
        (Event::Acquired { ttl_ms: 5 }, None),
    ];
    for (event, want) in cases {
        assert_eq!(ended_by(event), want, "{event:?}");
    }
}

#[test]
fn the_first_pair_in_argument_order_wins() {
    assert!(first_in_order(None, 3));
    assert!(first_in_order(Some(3), 1));
    assert!(!first_in_order(Some(1), 3));
    assert!(!first_in_order(Some(1), 1));
}

#[test]
fn max_watchers_admits_below_the_limit_only() {
    assert!(admits(0, 1));
    assert!(!admits(1, 1));
    assert!(!admits(0, 0));
}

#[test]
fn event_names_are_the_contracts() {
    let names: Vec<&str> = [
        WatchEvent::Held,
        WatchEvent::Released,
        WatchEvent::Expired,
        WatchEvent::Revoked,
        WatchEvent::Closed,
        WatchEvent::Lost,
        WatchEvent::Gone,
    ]
    .iter()
    .map(|e| e.name())
    .collect();
    assert_eq!(
        names,
        ["held", "released", "expired", "revoked", "closed", "lost", "gone"]
    );
}

// ---- parsing ----

fn argv(s: &str) -> Vec<&[u8]> {
    s.split(' ').map(str::as_bytes).collect()
}

macro_rules! parse_watch_cases {
    ($($name:ident: $args:expr => $want:expr;)*) => {$(
        #[test]
        fn $name() {
            let got = parse_watch(&argv($args)).map(|a| (a.timeout_ms, a.pairs.len()));
            assert_eq!(got, $want);
        }
    )*};
}

parse_watch_cases! {
    watch_one_pair: "W 100 k 7" => Ok((100, 1));
    watch_token_0_is_allowed: "W 0 k 0" => Ok((0, 1));
    watch_two_pairs: "W 5 a 1 b 0" => Ok((5, 2));
    watch_too_few_arguments: "W 5 k" => Err(WatchArgError::Arity);
    watch_odd_pairs: "W 5 a 1 b" => Err(WatchArgError::Pairs);
    watch_negative_token: "W 5 a -1" => Err(WatchArgError::Token);
    watch_token_not_an_integer: "W 5 a x" => Err(WatchArgError::Token);
    watch_token_with_a_plus: "W 5 a +1" => Err(WatchArgError::Token);
    watch_negative_timeout: "W -1 a 1" => Err(WatchArgError::Timeout);
    watch_timeout_not_an_integer: "W 1.5 a 1" => Err(WatchArgError::Timeout);
}

#[test]
fn watch_takes_64_pairs_and_no_more() {
    let mut s = String::from("W 0");
    for i in 0..64 {
        s.push_str(&format!(" k{i} {i}"));
    }
    assert_eq!(parse_watch(&argv(&s)).map(|a| a.pairs.len()), Ok(64));
    s.push_str(" k64 1");
    assert_eq!(
        parse_watch(&argv(&s)).map(|a| a.pairs.len()),
        Err(WatchArgError::TooManyKeys)
    );
}

#[test]
fn watch_pairs_keep_argument_order() {
    let args = argv("W 0 b 2 a 0");
    let parsed = parse_watch(&args).map(|a| a.pairs);
    assert_eq!(parsed, Ok(vec![(&b"b"[..], 2), (&b"a"[..], 0)]));
}

macro_rules! parse_waiters_cases {
    ($($name:ident: $args:expr => $want:expr;)*) => {$(
        #[test]
        fn $name() {
            assert_eq!(parse_waiters(&argv($args)), $want);
        }
    )*};
}

parse_waiters_cases! {
    waiters_all: "W k" => Ok(None);
    waiters_count: "W k COUNT 2" => Ok(Some(2));
    waiters_count_any_case: "W k count 2" => Ok(Some(2));
    waiters_count_0: "W k COUNT 0" => Err(WatchArgError::Count);
    waiters_count_not_an_integer: "W k COUNT x" => Err(WatchArgError::Count);
    waiters_unknown_option: "W k LIMIT 2" => Err(WatchArgError::Syntax);
    waiters_count_without_n: "W k COUNT" => Err(WatchArgError::Syntax);
    waiters_no_key: "W" => Err(WatchArgError::Arity);
}

// ---- WAITERS ----

#[test]
fn waiters_come_first_in_line_first_with_modes_and_wait_times() {
    let queue = [
        (&b"w"[..], Mode::Exclusive, 1_000_000),
        (&b"r"[..], Mode::Shared, 2_000_000),
        (&b"p"[..], Mode::Permits(2), 4_500_000),
    ];
    let lines = waiters_reply(queue.into_iter(), None, true, 5_000_000);
    let got: Vec<(&[u8], &str, u64)> = lines
        .iter()
        .map(|l| (l.owner, l.mode, l.waited_ms))
        .collect();
    assert_eq!(
        got,
        vec![
            (&b"w"[..], "exclusive", 4000),
            (&b"r"[..], "shared", 3000),
            (&b"p"[..], "permit", 500)
        ]
    );
}

#[test]
fn waiters_count_takes_the_first_n() {
    let queue = [
        (&b"a"[..], Mode::Exclusive, 0),
        (&b"b"[..], Mode::Exclusive, 0),
        (&b"c"[..], Mode::Exclusive, 0),
    ];
    let lines = waiters_reply(queue.into_iter(), Some(2), true, 0);
    let owners: Vec<&[u8]> = lines.iter().map(|l| l.owner).collect();
    assert_eq!(owners, vec![&b"a"[..], &b"b"[..]]);
}

#[test]
fn a_replica_lists_no_waiters() {
    let queue = [(&b"a"[..], Mode::Exclusive, 0)];
    assert!(waiters_reply(queue.into_iter(), None, false, 0).is_empty());
}

// ---- the engine names the grants it ends ----

#[test]
fn the_engine_names_the_released_grant() {
    use crate::engine::{self, Effect};
    let mut state = key(Mode::Exclusive, &[("a", 7, 1000)]);
    let mut tokens = crate::TokenIssuer::default();
    let mut env = engine::Env {
        now: T0,
        lock_delay_ms: 0,
        max_holders: 10,
        master: true,
        tokens: &mut tokens,
    };
    let mut w = NoWaiters;
    let out = engine::release(
        engine::Stored::Full(&mut state),
        &mut env,
        &mut w,
        b"a",
        None,
    );
    let ended: Vec<(u64, WatchEvent)> = out
        .effects
        .as_slice()
        .iter()
        .filter_map(|e| match e {
            Effect::Notify(ev) => ended_by(*ev),
            _ => None,
        })
        .collect();
    assert_eq!(ended, vec![(7, WatchEvent::Released)]);
}

/// A key nobody waits for.
struct NoWaiters;

impl crate::engine::Waiters for NoWaiters {
    fn waiting(&mut self) -> usize {
        0
    }
    fn waiting_mode(&mut self) -> Option<Mode> {
        None
    }
    fn next_waiter_if(
        &mut self,
        _fits: &mut dyn FnMut(&crate::Waiter) -> bool,
    ) -> Option<crate::Waiter> {
        None
    }
    fn deliver(&mut self, _waiter: &crate::Waiter, _token: u64) -> bool {
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
        _args: &crate::args::AcquireArgs<'_>,
        _timeout_ms: u64,
        _bind_to: Option<u64>,
    ) -> Result<(), crate::engine::BlockRefused> {
        Err(crate::engine::BlockRefused::Failed)
    }
}

// ---- keys and the server changing under watchers ----

#[test]
fn a_deleted_key_still_served_here_is_compared() {
    assert_eq!(plan_look(true, || true), LookPlan::Compare);
}

#[test]
fn a_deleted_key_whose_slot_moved_fails_with_tryagain() {
    assert_eq!(
        plan_look(true, || false),
        LookPlan::Fail(Fixed::WaitedKeyMoved)
    );
}

#[test]
fn a_key_that_is_still_there_never_asks_the_cluster() {
    assert_eq!(
        plan_look(false, || panic!("no CLUSTER NODES for a key still here")),
        LookPlan::Compare
    );
}

macro_rules! server_cases {
    ($($name:ident: $change:expr => $step:expr;)*) => {$(
        #[test]
        fn $name() {
            assert_eq!(on_server_change($change), $step);
        }
    )*};
}

server_cases! {
    demotion_unblocks_every_watcher:
        ServerChange::RoleChanged { master: false } => ServerStep::FailAll(Fixed::UnblockedNowReplica);
    promotion_leaves_watchers_waiting:
        ServerChange::RoleChanged { master: true } => ServerStep::Nothing;
    a_replicas_full_sync_unblocks_every_watcher:
        ServerChange::LoadingStarted { master: false } => ServerStep::FailAll(Fixed::UnblockedResync);
    a_masters_reload_leaves_watchers_waiting:
        ServerChange::LoadingStarted { master: true } => ServerStep::Nothing;
    flushdb_looks_at_its_watched_keys:
        ServerChange::FlushStarting { db: Some(2) } => ServerStep::LookAll(Some(2));
    flushall_looks_at_every_watched_key:
        ServerChange::FlushStarting { db: None } => ServerStep::LookAll(None);
    swapdb_looks_at_every_watched_key:
        ServerChange::DbsSwapped => ServerStep::LookAll(None);
}
