//! The state of one lock key and its rules: grants, releases, renewals, revokes, expiry.
//!
//! Plain Rust, no Redis types. Time is injected as a [`Now`] value, so every rule here is
//! tested table-style with `cargo test`. The engine (`engine.rs`) calls these rules in the
//! order a command needs and turns their outcomes into replies and effects.

use crate::clock::{Deadline, Now};
use crate::queue::{WaitQueue, Waiter};
use crate::tokens::TokenIssuer;

/// Owners are opaque, binary-safe strings of 1 to 256 bytes.
pub const MAX_OWNER_LEN: usize = 256;

/// One continuous holding of a key by one owner.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Grant {
    pub owner: Box<[u8]>,
    pub token: u64,
    pub deadline: Deadline,
    /// When this process saw the grant start, on its monotonic clock: what FLOCK.STATS
    /// measures hold times from. Not persisted: a grant loaded or replicated starts counting
    /// when it arrives.
    pub since_mono_us: u64,
}

impl Grant {
    /// A grant whose lease runs `ttl_ms` from `now`.
    pub fn new(owner: &[u8], token: u64, ttl_ms: u64, now: Now) -> Grant {
        Grant {
            owner: owner.into(),
            token,
            deadline: Deadline::after(ttl_ms, now),
            since_mono_us: now.mono_us,
        }
    }

    /// A grant that arrived with an absolute wall-clock deadline (replication, RDB, AOF,
    /// RESTORE).
    pub fn from_wall_deadline(owner: &[u8], token: u64, deadline_wall_ms: i64, now: Now) -> Grant {
        Grant {
            owner: owner.into(),
            token,
            deadline: Deadline::from_wall(deadline_wall_ms, now),
            since_mono_us: now.mono_us,
        }
    }

    /// Whether this grant is `owner`'s and, when a token is given, has that token.
    pub fn is(&self, owner: &[u8], token: Option<u64>) -> bool {
        *self.owner == *owner && token.is_none_or(|t| t == self.token)
    }

    pub fn is_live(&self, now: Now) -> bool {
        !self.deadline.passed(now)
    }

    pub fn remaining_ms(&self, now: Now) -> u64 {
        self.deadline.remaining_ms(now)
    }
}

/// What ACQUIRE did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Acquired {
    /// A new grant with a new token.
    Granted(u64),
    /// The caller already held the live grant: same token, lease reset (G4).
    Refreshed(u64),
    /// Another owner holds a live grant, or the key is in lock-delay, or others wait first.
    Busy,
    /// No token left below 2^53.
    TokensExhausted,
}

/// What [`LockState::settle`] changed.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Settled {
    /// The token of a grant whose lease ran out.
    pub expired: Option<u64>,
    /// A waiter that now holds the key, with its token.
    pub handed_to: Option<(Waiter, u64)>,
}

/// The state of one lock key.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct LockState {
    /// The current grant, live or run out (an expired grant is cleared lazily, by the next
    /// command that touches the key, or actively by the expiry timer on a master).
    pub holder: Option<Grant>,
    /// The token of the latest grant of this key (shown by FLOCK.INFO when nobody holds it).
    pub last_token: u64,
    /// Lock-delay: no grant before this moment (after an expiry or a revoke).
    pub delay: Option<Deadline>,
}

impl LockState {
    pub fn with_grant(grant: Grant) -> LockState {
        LockState {
            last_token: grant.token,
            holder: Some(grant),
            delay: None,
        }
    }

    /// A key in lock-delay after the grant with `last_token` ended.
    pub fn delayed(last_token: u64, until: Deadline) -> LockState {
        LockState {
            holder: None,
            last_token,
            delay: Some(until),
        }
    }

    /// The holder, when its lease is still running.
    pub fn live_holder(&self, now: Now) -> Option<&Grant> {
        self.holder.as_ref().filter(|g| g.is_live(now))
    }

    pub fn delay_active(&self, now: Now) -> bool {
        self.delay.is_some_and(|d| !d.passed(now))
    }

    /// Nobody holds the key and no lock-delay keeps it: the next in line may have it.
    pub fn is_free(&self, now: Now) -> bool {
        self.live_holder(now).is_none() && !self.delay_active(now)
    }

    /// Nothing left worth keeping (given no waiters): the key should leave the keyspace.
    pub fn is_vacant(&self, now: Now) -> bool {
        self.holder.is_none() && !self.delay_active(now)
    }

    /// When this key next needs attention: its lease's end, or its lock-delay's end.
    pub fn next_deadline(&self) -> Option<Deadline> {
        match &self.holder {
            Some(g) => Some(g.deadline),
            None => self.delay,
        }
    }

    /// Clear a grant whose lease ran out, starting a lock-delay of `lock_delay_ms` counted
    /// from its deadline. Returns the token of the grant that ended.
    pub fn expire(&mut self, now: Now, lock_delay_ms: u64) -> Option<u64> {
        let g = self.holder.as_ref().filter(|g| !g.is_live(now))?;
        let (token, deadline) = (g.token, g.deadline);
        self.holder = None;
        if lock_delay_ms > 0 {
            self.delay = Some(deadline.plus(lock_delay_ms));
        }
        Some(token)
    }

    /// Bring the key up to date at `now`: end a run-out lease, end a finished lock-delay, and
    /// when the key is free hand it to the first waiter of `queue` (`None`: nobody waits).
    pub fn settle(
        &mut self,
        now: Now,
        lock_delay_ms: u64,
        queue: Option<&mut WaitQueue>,
        tokens: &mut TokenIssuer,
    ) -> Settled {
        let expired = self.expire(now, lock_delay_ms);
        self.end_delay(now);
        let mut handed_to = None;
        if let Some(queue) = queue.filter(|q| !q.is_empty()) {
            if self.is_free(now) {
                if let Some(token) = tokens.issue(now) {
                    if let Some(w) = queue.pop() {
                        self.grant_to(&w, token, now);
                        handed_to = Some((w, token));
                    }
                }
            }
        }
        Settled { expired, handed_to }
    }

    /// End a lock-delay whose time is up; true when one ended.
    pub fn end_delay(&mut self, now: Now) -> bool {
        if self.delay.is_some_and(|d| d.passed(now)) {
            self.delay = None;
            return true;
        }
        false
    }

    /// Hand the (free) key to `waiter` with a freshly issued `token`.
    pub fn grant_to(&mut self, waiter: &Waiter, token: u64, now: Now) {
        self.holder = Some(Grant::new(&waiter.owner, token, waiter.ttl_ms, now));
        self.last_token = token;
        self.delay = None;
    }

    /// FLOCK.ACQUIRE without waiting, on a settled key. `waiting` is how many clients wait
    /// for the key: a newcomer never overtakes them.
    pub fn acquire(
        &mut self,
        owner: &[u8],
        ttl_ms: u64,
        now: Now,
        waiting: usize,
        tokens: &mut TokenIssuer,
    ) -> Acquired {
        if let Some(holder) = self.holder.as_mut().filter(|g| g.is_live(now)) {
            if *holder.owner == *owner {
                holder.deadline = Deadline::after(ttl_ms, now);
                return Acquired::Refreshed(holder.token);
            }
            return Acquired::Busy;
        }
        if self.delay_active(now) || waiting > 0 {
            return Acquired::Busy;
        }
        match tokens.issue(now) {
            Some(token) => {
                self.holder = Some(Grant::new(owner, token, ttl_ms, now));
                self.last_token = token;
                self.delay = None;
                Acquired::Granted(token)
            }
            None => Acquired::TokensExhausted,
        }
    }

    /// FLOCK.RELEASE: true when `owner` held the live grant, which is now over (no delay).
    pub fn release(&mut self, owner: &[u8], now: Now) -> bool {
        self.release_grant(owner, None, now)
    }

    /// FLOCK.RELEASE with an optional token: with `Some(token)` only the grant with that token
    /// ends, so a late retry of an earlier grant's release never ends a later grant.
    pub fn release_grant(&mut self, owner: &[u8], token: Option<u64>, now: Now) -> bool {
        match self.live_holder(now) {
            Some(holder) if holder.is(owner, token) => {
                self.holder = None;
                true
            }
            _ => false,
        }
    }

    /// FLOCK.REVOKE: end the live grant now, starting a lock-delay of `lock_delay_ms` from now.
    /// Returns the revoked token.
    pub fn revoke(&mut self, now: Now, lock_delay_ms: u64) -> Option<u64> {
        self.revoke_owner(None, now, lock_delay_ms)
    }

    /// FLOCK.REVOKE with an optional owner: with `Some(owner)` only that owner's grant ends.
    pub fn revoke_owner(
        &mut self,
        owner: Option<&[u8]>,
        now: Now,
        lock_delay_ms: u64,
    ) -> Option<u64> {
        let holder = self.live_holder(now)?;
        if owner.is_some_and(|o| *holder.owner != *o) {
            return None;
        }
        let token = holder.token;
        self.holder = None;
        if lock_delay_ms > 0 {
            self.delay = Some(Deadline::after(lock_delay_ms, now));
        }
        Some(token)
    }

    /// FLOCK.RENEW: the token when `owner` holds the live grant (lease now `ttl_ms` from
    /// `now`); `None` otherwise. Never revives an expired grant.
    pub fn renew(&mut self, owner: &[u8], ttl_ms: u64, now: Now) -> Option<u64> {
        self.renew_grant(owner, ttl_ms, None, now)
    }

    /// FLOCK.RENEW with an optional token: with `Some(token)` only the grant with that token.
    pub fn renew_grant(
        &mut self,
        owner: &[u8],
        ttl_ms: u64,
        token: Option<u64>,
        now: Now,
    ) -> Option<u64> {
        let holder = self.holder.as_mut().filter(|g| g.is_live(now))?;
        if !holder.is(owner, token) {
            return None;
        }
        holder.deadline = Deadline::after(ttl_ms, now);
        Some(holder.token)
    }

    /// FLOCK.CHECK: remaining lease in ms (at least 1) when `token` is the live grant, else 0.
    pub fn check(&self, token: u64, now: Now) -> u64 {
        match self.live_holder(now) {
            Some(holder) if holder.token == token => holder.remaining_ms(now),
            _ => 0,
        }
    }
}

#[cfg(test)]
mod tests {
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

    fn acquire_settled(
        state: &mut LockState,
        owner: &str,
        ttl: u64,
        now: Now,
        tokens: &mut TokenIssuer,
    ) -> Acquired {
        let mut queue = WaitQueue::default();
        state.settle(now, 0, Some(&mut queue), tokens);
        state.acquire(owner.as_bytes(), ttl, now, queue.len(), tokens)
    }

    fn waiter(id: u64, owner: &str, ttl_ms: u64) -> Waiter {
        Waiter {
            id,
            owner: owner.as_bytes().into(),
            ttl_ms,
        }
    }

    #[test]
    fn release_hands_off_to_the_first_waiter() {
        let mut tokens = TokenIssuer::new();
        let mut q = WaitQueue::default();
        let mut state = LockState::default();
        let Acquired::Granted(t1) = state.acquire(b"a", 100, T0, 0, &mut tokens) else {
            panic!("not granted");
        };
        q.push(waiter(7, "b", 500));
        q.push(waiter(8, "c", 500));
        // Nothing to hand off while the holder is live; a newcomer does not overtake.
        assert_eq!(
            state.settle(at(10), 0, Some(&mut q), &mut tokens),
            Settled::default()
        );
        assert_eq!(
            state.acquire(b"d", 100, at(10), q.len(), &mut tokens),
            Acquired::Busy
        );
        assert!(state.release(b"a", at(20)));
        let s = state.settle(at(20), 0, Some(&mut q), &mut tokens);
        let (w, t2) = s.handed_to.expect("handed off");
        assert_eq!((w.id, &*w.owner), (7, &b"b"[..]));
        assert!(t2 > t1);
        assert_eq!(state.check(t2, at(20)), 500);
        assert_eq!(q.len(), 1);
    }

    #[test]
    fn expiry_hands_off_when_the_lease_ends() {
        let mut tokens = TokenIssuer::new();
        let mut q = WaitQueue::default();
        let mut state = LockState::default();
        state.acquire(b"a", 100, T0, 0, &mut tokens);
        q.push(waiter(1, "b", 100));
        assert_eq!(
            state.settle(at(99), 0, Some(&mut q), &mut tokens).handed_to,
            None
        );
        let s = state.settle(at(100), 0, Some(&mut q), &mut tokens);
        assert!(s.expired.is_some());
        assert_eq!(s.handed_to.map(|(w, _)| w.id), Some(1));
    }

    #[test]
    fn lock_delay_after_expiry_and_revoke_but_not_release() {
        let mut tokens = TokenIssuer::new();
        let mut q = WaitQueue::default();
        let mut state = LockState::default();
        let delay = 50;
        // Expiry: delay counted from the lease's deadline.
        state.acquire(b"a", 100, T0, 0, &mut tokens);
        q.push(waiter(1, "b", 100));
        let s = state.settle(at(120), delay, Some(&mut q), &mut tokens);
        assert!(s.expired.is_some());
        assert_eq!(s.handed_to, None, "granted during lock-delay");
        assert!(!state.is_vacant(at(120)));
        // The old owner gets nil too.
        assert_eq!(
            state.acquire(b"a", 100, at(120), 0, &mut tokens),
            Acquired::Busy
        );
        assert_eq!(
            state.next_deadline().map(|d| d.mono_us),
            Some(at(150).mono_us)
        );
        let s = state.settle(at(150), delay, Some(&mut q), &mut tokens);
        let (w, tok) = s.handed_to.expect("granted when the delay ends");
        assert_eq!(w.id, 1);
        // Revoke: delay counted from the revoke.
        assert_eq!(state.revoke(at(160), delay), Some(tok));
        assert_eq!(state.check(tok, at(160)), 0);
        assert_eq!(
            state.acquire(b"c", 100, at(209), 0, &mut tokens),
            Acquired::Busy
        );
        state.settle(at(210), delay, Some(&mut q), &mut tokens);
        assert!(matches!(
            state.acquire(b"c", 100, at(210), 0, &mut tokens),
            Acquired::Granted(_)
        ));
        // Release: never delayed.
        assert!(state.release(b"c", at(220)));
        assert!(state.is_vacant(at(220)));
        assert!(matches!(
            state.acquire(b"d", 100, at(220), 0, &mut tokens),
            Acquired::Granted(_)
        ));
    }

    /// Token-qualified RELEASE/RENEW and REVOKE by owner act on that grant alone: a late
    /// retry of an earlier grant's release (etcd-io/etcd#22082) never ends a later grant.
    #[test]
    fn token_and_owner_qualified_calls_touch_only_their_grant() {
        let mut tokens = TokenIssuer::new();
        let mut state = LockState::default();
        let Acquired::Granted(t1) = state.acquire(b"a", 100, T0, 0, &mut tokens) else {
            panic!("not granted");
        };
        assert!(state.release_grant(b"a", Some(t1), at(1)));
        let Acquired::Granted(t2) = state.acquire(b"a", 100, at(2), 0, &mut tokens) else {
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
                    Some(state.release_grant(o.as_bytes(), Some(tok(t)), now) as u64)
                }
                ["renew", o, t] => state.renew_grant(o.as_bytes(), 100, Some(tok(t)), now),
                ["revoke", o] => {
                    Some(state.revoke_owner(Some(o.as_bytes()), now, 0).is_some() as u64)
                }
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
        assert_eq!(state.revoke(T0, 0), None);
        state.acquire(b"a", 100, T0, 0, &mut tokens);
        assert_eq!(state.revoke(at(100), 0), None, "expired grant is not live");
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

    /// Runs each case from a fresh state and checks every outcome.
    #[test]
    fn state_machine_table() {
        use Op::*;
        use Out::*;
        let cases: Vec<(&str, Vec<(u64, Op, Out)>)> = vec![
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
                    Acquire(o, ttl) => {
                        match acquire_settled(&mut state, o, ttl, now, &mut tokens) {
                            Acquired::Granted(tok) => {
                                assert!(
                                    seen.iter().all(|&s| tok > s),
                                    "{name}: token {tok} not above {seen:?}"
                                );
                                seen.push(tok);
                                New(seen.len() - 1)
                            }
                            Acquired::Refreshed(tok) => {
                                Same(seen.iter().position(|&s| s == tok).unwrap())
                            }
                            Acquired::Busy => Nil,
                            Acquired::TokensExhausted => panic!("{name}: exhausted"),
                        }
                    }
                    Release(o) => Bool(state.release(o.as_bytes(), now)),
                    Renew(o, ttl) => match state.renew(o.as_bytes(), ttl, now) {
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
            state.acquire(b"a", 10, T0, 0, &mut tokens),
            Acquired::TokensExhausted
        );
        assert_eq!(state.holder, None);
    }

    #[test]
    fn wall_clock_steps_do_not_change_lease_length() {
        // G9: liveness is decided by the monotonic clock.
        let mut tokens = TokenIssuer::new();
        let mut state = LockState::default();
        let Acquired::Granted(tok) = state.acquire(b"a", 1000, T0, 0, &mut tokens) else {
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
        let Acquired::Granted(tok) = state.acquire(b"a", 100, T0, 0, &mut tokens) else {
            panic!("not granted");
        };
        assert_eq!(state.expire(at(99), 0), None);
        assert!(!state.is_vacant(at(99)));
        assert_eq!(state.expire(at(100), 0), Some(tok));
        assert_eq!(state.expire(at(100), 0), None);
        assert!(state.is_vacant(at(100)));
    }
}
