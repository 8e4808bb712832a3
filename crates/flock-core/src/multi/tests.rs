//! FLOCK.MACQUIRE's rules, one #[test] per case: parsing, the decision at the call and for a
//! waiting request, the grant of each key (an ordinary ACQUIRE at one instant) and its effects,
//! and the engine's handling of a MACQUIRE request in a key's queue.

use super::*;
use crate::engine::{Effect, Event, KeyFate, Reply};
use crate::grant::Grant;
use crate::queue::WaitQueue;
use crate::snapshot::Snapshot;
use crate::tokens::TokenIssuer;

const T0: Now = Now {
    wall_us: 1_700_000_000_000_000,
    wall_ms: 1_700_000_000_000,
    mono_us: 5_000_000,
};

fn later(ms: u64) -> Now {
    Now::new(T0.wall_us + ms * 1000, T0.mono_us + ms * 1000)
}

// ---- parsing ----

fn parse(args: &str) -> Result<MacquireArgs<'static>, ArgError> {
    let mut argv: Vec<&[u8]> = vec![b"FLOCK.MACQUIRE"];
    let args: &'static str = Box::leak(args.to_string().into_boxed_str());
    argv.extend(args.split(' ').map(str::as_bytes));
    // Leaked: a test's few bytes, so that the parsed arguments can borrow them.
    parse_macquire(Box::leak(argv.into_boxed_slice()), 1_000, 10)
}

#[test]
fn parse_takes_the_keys_in_order_then_acquires_arguments() {
    let a = parse("3 a b c me 500 BOUND BLOCK 10").expect("parsed");
    assert_eq!(a.keys, &[&b"a"[..], b"b", b"c"][..]);
    assert_eq!(a.acquire.owner, b"me");
    assert_eq!(a.acquire.ttl_ms, 500);
    assert_eq!(a.acquire.mode, Mode::Exclusive);
    assert!(a.acquire.bound);
    assert_eq!(a.acquire.block, Some(10));
}

#[test]
fn parse_numkeys_zero_or_over_64_or_not_an_integer_is_refused() {
    for n in ["0", "65", "-1", "x", "01"] {
        assert_eq!(
            parse(&format!("{n} a me 500")).map(drop),
            Err(ArgError::NumKeys),
            "{n}"
        );
    }
    let keys: Vec<String> = (0..64).map(|i| format!("k{i}")).collect();
    let ok = format!("64 {} me 500", keys.join(" "));
    assert_eq!(parse(&ok).map(|a| a.keys.len()), Ok(64));
}

#[test]
fn parse_too_few_arguments_after_the_keys_is_an_arity_error() {
    assert_eq!(parse("3 a b c me").map(drop), Err(ArgError::Arity));
    assert_eq!(parse("1 a me").map(drop), Err(ArgError::Arity));
}

#[test]
fn parse_a_wrong_numkeys_shows_as_a_bad_ttl_or_an_unknown_option() {
    // numkeys 1 for two keys: "b" is the owner, "me" the ttl.
    assert_eq!(
        parse("1 a b me 500").map(drop),
        Err(ArgError::Ttl { max: 1_000 })
    );
    // numkeys 1 for one key and a stray argument: an unknown option.
    assert_eq!(parse("1 a me 500 600").map(drop), Err(ArgError::Syntax));
}

#[test]
fn parse_the_same_key_twice_is_a_syntax_error() {
    assert_eq!(parse("3 a b a me 500").map(drop), Err(ArgError::Syntax));
}

#[test]
fn parse_shared_and_limit_are_refused_every_grant_is_exclusive() {
    assert_eq!(
        parse("2 a b me 500 SHARED").map(drop),
        Err(ArgError::Syntax)
    );
    assert_eq!(
        parse("2 a b me 500 LIMIT 3").map(drop),
        Err(ArgError::Syntax)
    );
}

#[test]
fn parse_bad_owner_ttl_and_timeout_get_acquires_errors() {
    assert_eq!(
        parse("1 a me 0").map(drop),
        Err(ArgError::Ttl { max: 1_000 })
    );
    assert_eq!(parse("1 a me 5 BLOCK -1").map(drop), Err(ArgError::Timeout));
    let long = "o".repeat(257);
    assert_eq!(
        parse(&format!("1 a {long} 5")).map(drop),
        Err(ArgError::Owner)
    );
}

// ---- the decision ----

fn held(mode: Mode, grants: &[(&str, u64, u64)]) -> LockState {
    let mut s = LockState::default();
    s.mode = mode;
    for &(owner, token, ttl_ms) in grants {
        s.push_grant(Grant::new(owner.as_bytes(), token, ttl_ms, T0));
        s.last_token = s.last_token.max(token);
    }
    s
}

fn look(state: Option<&LockState>, waiting: usize, owner_in_queue: bool) -> KeyLook<'_> {
    KeyLook {
        state,
        waiting,
        owner_in_queue,
    }
}

#[test]
fn at_call_every_key_free_grants() {
    let keys = [look(None, 0, false), look(None, 0, false)];
    assert_eq!(at_call(&keys, b"me", T0, 0), Decision::Grant);
}

#[test]
fn at_call_keys_the_owner_holds_count_as_its_own_even_with_waiters_behind() {
    let mine = held(Mode::Exclusive, &[("me", 7, 1000)]);
    let keys = [look(Some(&mine), 2, false), look(None, 0, false)];
    assert_eq!(at_call(&keys, b"me", T0, 0), Decision::Grant);
}

#[test]
fn at_call_one_key_held_by_another_owner_is_busy() {
    let theirs = held(Mode::Exclusive, &[("them", 7, 1000)]);
    let keys = [look(None, 0, false), look(Some(&theirs), 0, false)];
    assert_eq!(at_call(&keys, b"me", T0, 0), Decision::Busy);
}

#[test]
fn at_call_a_key_held_shared_by_others_is_busy() {
    let readers = held(Mode::Shared, &[("r1", 7, 1000), ("r2", 8, 1000)]);
    let keys = [look(Some(&readers), 0, false)];
    assert_eq!(at_call(&keys, b"me", T0, 0), Decision::Busy);
}

#[test]
fn at_call_a_free_key_with_waiters_is_busy_nobody_overtakes() {
    let keys = [look(None, 0, false), look(None, 1, false)];
    assert_eq!(at_call(&keys, b"me", T0, 0), Decision::Busy);
}

#[test]
fn at_call_a_key_in_lock_delay_is_busy() {
    let mut delayed = LockState::default();
    delayed.delays.push(crate::clock::Deadline::after(100, T0));
    let keys = [look(Some(&delayed), 0, false)];
    assert_eq!(at_call(&keys, b"me", T0, 0), Decision::Busy);
    assert_eq!(at_call(&keys, b"me", later(100), 0), Decision::Grant);
}

#[test]
fn at_call_a_lease_that_ran_out_leaves_its_key_free() {
    let ran_out = held(Mode::Exclusive, &[("them", 7, 10)]);
    let keys = [look(Some(&ran_out), 0, false)];
    assert_eq!(at_call(&keys, b"me", later(10), 0), Decision::Grant);
}

#[test]
fn at_call_a_lease_that_ran_out_leaves_its_lock_delay_slot_so_its_key_is_busy() {
    // Not ended yet (nothing settled the key): its slot of lock-delay counts all the same.
    let ran_out = held(Mode::Exclusive, &[("them", 7, 10)]);
    let keys = [look(Some(&ran_out), 0, false)];
    assert_eq!(at_call(&keys, b"me", later(50), 100), Decision::Busy);
    assert_eq!(at_call(&keys, b"me", later(110), 100), Decision::Grant);
}

#[test]
fn at_call_a_bound_grant_whose_connection_closed_leaves_a_slot_from_now() {
    let mut g = Grant::new(b"them", 8, 1000, T0);
    let mut bound = LockState::default();
    g.bind(Some(5));
    bound.push_grant(g);
    bound.close(5);
    let keys = [look(Some(&bound), 0, false)];
    assert_eq!(at_call(&keys, b"me", later(10), 100), Decision::Busy);
    assert_eq!(at_call(&keys, b"me", later(10), 0), Decision::Grant);
}

#[test]
fn at_call_a_key_the_owner_holds_shared_refuses_the_whole_call() {
    let theirs = held(Mode::Exclusive, &[("them", 7, 1000)]);
    let shared = held(Mode::Shared, &[("me", 8, 1000)]);
    let keys = [look(Some(&theirs), 0, false), look(Some(&shared), 0, false)];
    assert_eq!(
        at_call(&keys, b"me", T0, 0),
        Decision::Refused(1, Refusal::Holds(Mode::Shared))
    );
}

#[test]
fn at_call_a_key_the_owner_holds_as_a_permit_refuses_the_whole_call() {
    let permits = held(Mode::Permits(3), &[("me", 8, 1000)]);
    let keys = [look(None, 0, false), look(Some(&permits), 0, false)];
    assert_eq!(
        at_call(&keys, b"me", T0, 0),
        Decision::Refused(1, Refusal::Holds(Mode::Permits(3)))
    );
}

#[test]
fn at_call_a_key_the_owner_waits_for_refuses_the_whole_call() {
    let keys = [look(None, 0, false), look(None, 1, true)];
    assert_eq!(
        at_call(&keys, b"me", T0, 0),
        Decision::Refused(1, Refusal::Waits)
    );
    // Also when it holds the key and a MACQUIRE of it still waits for others.
    let mine = held(Mode::Exclusive, &[("me", 7, 1000)]);
    let keys = [look(Some(&mine), 1, true)];
    assert_eq!(
        at_call(&keys, b"me", T0, 0),
        Decision::Refused(0, Refusal::Waits)
    );
}

#[test]
fn ready_first_in_line_on_every_free_key_grants() {
    let keys = [look(None, 3, true), look(None, 1, true)];
    assert_eq!(ready(&keys, b"me", T0, 0), Decision::Grant);
}

#[test]
fn ready_not_first_in_line_on_one_key_waits() {
    let keys = [look(None, 3, true), look(None, 2, false)];
    assert_eq!(ready(&keys, b"me", T0, 0), Decision::Busy);
}

#[test]
fn ready_first_in_line_on_a_held_key_waits() {
    let theirs = held(Mode::Exclusive, &[("them", 7, 1000)]);
    let keys = [look(None, 1, true), look(Some(&theirs), 1, true)];
    assert_eq!(ready(&keys, b"me", T0, 0), Decision::Busy);
    assert_eq!(ready(&keys, b"me", later(1000), 0), Decision::Grant);
}

#[test]
fn ready_a_key_the_owner_still_holds_needs_no_turn() {
    let mine = held(Mode::Exclusive, &[("me", 7, 1000)]);
    let keys = [look(Some(&mine), 2, false), look(None, 1, true)];
    assert_eq!(ready(&keys, b"me", T0, 0), Decision::Grant);
    // Its lease ran out while it waited: now it needs its turn there too.
    assert_eq!(ready(&keys, b"me", later(1000), 0), Decision::Busy);
}

// ---- the grants ----

/// A key's queue as the module keeps it, recording deliveries.
#[derive(Default)]
struct Queue {
    queue: WaitQueue,
}

impl Waiters for Queue {
    fn waiting(&mut self) -> usize {
        self.queue.len()
    }
    fn waiting_mode(&mut self) -> Option<Mode> {
        self.queue.shared_mode()
    }
    fn next_waiter_if(&mut self, fits: &mut dyn FnMut(&Waiter) -> bool) -> Option<Waiter> {
        self.queue.pop_if(fits)
    }
    fn deliver(&mut self, _w: &Waiter, _token: u64) -> bool {
        true
    }
    fn dismiss(&mut self, owner: &[u8]) -> bool {
        self.queue.take_owner(owner).is_some()
    }
    fn refuse_other_limits(&mut self, limit: Mode) -> usize {
        self.queue.take_other_limits(limit).len()
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

fn waiter(id: u64, owner: &str, multi: bool) -> Waiter {
    Waiter {
        id,
        owner: owner.as_bytes().into(),
        ttl_ms: 100,
        mode: Mode::Exclusive,
        bind_to: None,
        multi,
    }
}

fn args(owner: &str, ttl_ms: u64, bound: bool) -> AcquireArgs<'_> {
    AcquireArgs {
        owner: owner.as_bytes(),
        ttl_ms,
        mode: Mode::Exclusive,
        bound,
        block: None,
    }
}

fn env(tokens: &mut TokenIssuer, now: Now) -> Env<'_> {
    Env {
        now,
        lock_delay_ms: 0,
        max_holders: 10,
        master: true,
        tokens,
    }
}

/// Grant `owner` the key `state` (`None`: free) at `now` through [`grant_key`], as the module
/// does; the key's state afterwards, the token, and the effects.
fn grant(
    state: Option<LockState>,
    q: &mut Queue,
    tokens: &mut TokenIssuer,
    a: &AcquireArgs<'_>,
    bind_to: Option<u64>,
    now: Now,
) -> (LockState, u64, Vec<Effect>) {
    // The clock the context would read is later: the grant must use `now`.
    let mut cx = env(tokens, later(1_000_000));
    let mut slot = state;
    let out = match slot.as_mut() {
        Some(s) => grant_key(Stored::Full(s), &mut cx, q, a, bind_to, now),
        None => grant_key(Stored::Free, &mut cx, q, a, bind_to, now),
    };
    let token = match out.reply {
        Reply::Int(t) => t as u64,
        other => panic!("not granted: {other:?}"),
    };
    let effects = out.effects.as_slice().to_vec();
    let state = match out.fate {
        KeyFate::Keep => slot.unwrap_or_default(),
        fate => fate.into_state().unwrap_or_default(),
    };
    (state, token, effects)
}

#[test]
fn grant_of_a_free_key_is_an_ordinary_grant_replicated_with_owner_token_and_deadline() {
    let mut tokens = TokenIssuer::new();
    let (state, token, fx) = grant(
        None,
        &mut Queue::default(),
        &mut tokens,
        &args("me", 500, false),
        None,
        T0,
    );
    assert!(fx.contains(&Effect::Replicate), "{fx:?}");
    assert!(fx.contains(&Effect::Notify(Event::Acquired { ttl_ms: 500 })));
    match Snapshot::of(&state) {
        Some(Snapshot::Held(g)) => {
            assert_eq!(&*g.owner, b"me");
            assert_eq!(g.token, token);
            // The absolute deadline the replicas and the AOF get (G7).
            assert_eq!(g.deadline.wall_ms, T0.wall_ms + 500);
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn grant_of_a_key_the_owner_holds_keeps_its_token_and_resets_the_lease() {
    let mut tokens = TokenIssuer::new();
    let mine = held(Mode::Exclusive, &[("me", 7, 100)]);
    let (state, token, fx) = grant(
        Some(mine),
        &mut Queue::default(),
        &mut tokens,
        &args("me", 500, false),
        None,
        later(50),
    );
    assert_eq!(token, 7);
    assert!(fx.contains(&Effect::Replicate), "{fx:?}");
    assert!(
        !fx.iter().any(|e| matches!(e, Effect::Notify(_))),
        "no new grant: {fx:?}"
    );
    assert_eq!(state.check(7, later(549)), 1);
}

#[test]
fn grant_first_in_line_is_granted_with_others_waiting_behind() {
    let mut tokens = TokenIssuer::new();
    let mut q = Queue::default();
    q.queue.push(waiter(1, "me", true));
    q.queue.push(waiter(2, "them", false));
    let (state, token, _) = grant(
        Some(LockState::default()),
        &mut q,
        &mut tokens,
        &args("me", 500, false),
        None,
        T0,
    );
    assert_eq!(state.exclusive_holder(T0).map(|g| g.token), Some(token));
    assert_eq!(
        q.queue.len(),
        2,
        "the module takes the request out, not the grant"
    );
}

#[test]
fn grant_tokens_grow_in_the_order_the_keys_are_given() {
    let mut tokens = TokenIssuer::new();
    let mut last = 0;
    for _ in 0..3 {
        let (_, token, _) = grant(
            None,
            &mut Queue::default(),
            &mut tokens,
            &args("me", 500, false),
            None,
            T0,
        );
        assert!(token > last, "{token} after {last}");
        last = token;
    }
}

#[test]
fn grant_bound_binds_each_grant_to_the_connection() {
    let mut tokens = TokenIssuer::new();
    let (_, token, fx) = grant(
        None,
        &mut Queue::default(),
        &mut tokens,
        &args("me", 500, true),
        Some(42),
        T0,
    );
    assert!(fx.contains(&Effect::Bind { client: 42, token }), "{fx:?}");
}

#[test]
fn grant_uses_the_instant_of_the_decision_not_a_later_clock() {
    // The lease of "me" runs until 100 ms; decided at 50 ms it is kept, even though the
    // context's own clock (much later) would find it run out.
    let mut tokens = TokenIssuer::new();
    let mine = held(Mode::Exclusive, &[("me", 7, 100)]);
    let (_, token, _) = grant(
        Some(mine),
        &mut Queue::default(),
        &mut tokens,
        &args("me", 500, false),
        None,
        later(50),
    );
    assert_eq!(token, 7);
}

// ---- a MACQUIRE request in a key's queue ----

#[test]
fn a_request_first_in_line_on_a_free_key_is_named_not_granted_and_holds_the_queue() {
    let mut tokens = TokenIssuer::new();
    let mut q = Queue::default();
    q.queue.push(waiter(1, "multi", true));
    q.queue.push(waiter(2, "single", false));
    let mut state = held(Mode::Exclusive, &[("holder", 7, 1000)]);
    let mut e = env(&mut tokens, T0);
    let out = engine::release(Stored::Full(&mut state), &mut e, &mut q, b"holder", None);
    assert_eq!(out.reply, Reply::Int(1));
    let fx = out.effects.as_slice();
    assert!(fx.contains(&Effect::TryMulti { waiter: 1 }), "{fx:?}");
    assert_eq!(q.queue.len(), 2, "nobody was granted");
    assert!(state.grants().is_empty());
    // The key stays (it is waited on); replicas, which see no waiters, drop it.
    assert!(fx.contains(&Effect::ReplicateDelete), "{fx:?}");
    assert!(!fx.contains(&Effect::DeleteKey), "{fx:?}");
}

#[test]
fn a_request_first_in_line_on_a_held_key_is_not_named() {
    let mut tokens = TokenIssuer::new();
    let mut q = Queue::default();
    q.queue.push(waiter(1, "multi", true));
    let mut state = held(Mode::Exclusive, &[("holder", 7, 1000)]);
    let mut e = env(&mut tokens, T0);
    let out = engine::renew(
        Stored::Full(&mut state),
        &mut e,
        &mut q,
        b"holder",
        500,
        None,
    );
    assert!(
        !out.effects
            .as_slice()
            .iter()
            .any(|e| matches!(e, Effect::TryMulti { .. })),
        "{:?}",
        out.effects
    );
}

#[test]
fn a_single_waiter_ahead_of_a_request_is_granted_as_usual() {
    let mut tokens = TokenIssuer::new();
    let mut q = Queue::default();
    q.queue.push(waiter(1, "single", false));
    q.queue.push(waiter(2, "multi", true));
    let mut state = held(Mode::Exclusive, &[("holder", 7, 1000)]);
    let mut e = env(&mut tokens, T0);
    let out = engine::release(Stored::Full(&mut state), &mut e, &mut q, b"holder", None);
    assert_eq!(
        state.exclusive_holder(T0).map(|g| &*g.owner),
        Some(&b"single"[..])
    );
    assert!(!out
        .effects
        .as_slice()
        .iter()
        .any(|e| matches!(e, Effect::TryMulti { .. })));
    assert_eq!(q.queue.len(), 1);
}

#[test]
fn a_key_saved_with_nothing_in_it_loads_due_at_once_to_be_deleted() {
    // The free key a waiting MACQUIRE kept, saved in an RDB (its waiter is not saved).
    let mut tokens = TokenIssuer::new();
    let image = crate::snapshot::LockImage::of(&LockState::default());
    let state = engine::load(image, T0, &mut tokens);
    assert!(state.is_vacant(T0));
    assert_eq!(state.active_delays(T0), 0, "not in lock-delay");
    assert_eq!(state.next_deadline().map(|d| d.mono_us), Some(T0.mono_us));
    // Its timer then deletes it.
    let mut state = state;
    let mut e = env(&mut tokens, T0);
    let out = engine::expire(Stored::Full(&mut state), &mut e, &mut Queue::default());
    assert!(out.effects.deletes_key(), "{:?}", out.effects);
}
