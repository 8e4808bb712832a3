//! The lock state machine: grants, releases, renewals, expiry and token issuing.
//!
//! Plain Rust, no Redis types. Time is injected as a [`Now`] value, so every rule here is
//! tested table-style with `cargo test`. The glue in `commands.rs` reads the clocks, calls
//! these functions and turns the outcomes into replies, replication and keyspace changes.

/// Largest token ever issued: tokens must stay exact in a JavaScript number (below 2^53).
pub const MAX_TOKEN: u64 = (1 << 53) - 1;
/// Owners are opaque, binary-safe strings of 1 to 256 bytes.
pub const MAX_OWNER_LEN: usize = 256;

/// A reading of the two clocks, taken once per command.
///
/// `wall_ms` is the Unix wall clock (it travels: replication, RDB and AOF carry absolute
/// deadlines). `mono_us` is a monotonic clock local to this process (lease time on a running
/// server is measured on it, so a wall-clock step neither shortens nor stretches a lease: G9).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Now {
    pub wall_ms: i64,
    pub mono_us: u64,
}

impl Now {
    /// The wall clock in microseconds, the floor of every new token.
    fn wall_us(self) -> u64 {
        u64::try_from(self.wall_ms).unwrap_or(0).saturating_mul(1000)
    }
}

/// Issues fencing tokens from a server-wide high-water mark.
///
/// `token = max(high_water + 1, wall clock in microseconds)`: strictly increasing on this
/// server, and after a restart or a failover larger than every token issued before as long as
/// the persisted mark came along (RDB aux data, replication) or the clock moved forward by more
/// than the mark was ahead of it. Every token seen (loaded, restored, replicated) raises the mark.
#[derive(Debug, Default)]
pub struct TokenIssuer {
    high_water: u64,
}

impl TokenIssuer {
    pub const fn new() -> Self {
        TokenIssuer { high_water: 0 }
    }

    pub fn high_water(&self) -> u64 {
        self.high_water
    }

    /// Raise the mark to at least `token` (a token that came from elsewhere).
    pub fn observe(&mut self, token: u64) {
        if token > self.high_water {
            self.high_water = token;
        }
    }

    /// The next token, or `None` when the token space below 2^53 is used up.
    pub fn issue(&mut self, now: Now) -> Option<u64> {
        let token = self.high_water.saturating_add(1).max(now.wall_us());
        if token > MAX_TOKEN {
            return None;
        }
        self.high_water = token;
        Some(token)
    }
}

/// One continuous holding of a key by one owner.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Grant {
    pub owner: Box<[u8]>,
    pub token: u64,
    /// Absolute wall-clock deadline in Unix milliseconds: what replication, RDB and AOF carry.
    pub deadline_wall_ms: i64,
    /// The same deadline on this process's monotonic clock: what decides liveness here.
    pub deadline_mono_us: u64,
}

impl Grant {
    /// A grant whose lease runs `ttl_ms` from `now`.
    pub fn new(owner: &[u8], token: u64, ttl_ms: u64, now: Now) -> Grant {
        let mut grant = Grant {
            owner: owner.into(),
            token,
            deadline_wall_ms: 0,
            deadline_mono_us: 0,
        };
        grant.extend(ttl_ms, now);
        grant
    }

    /// A grant that arrived with an absolute wall-clock deadline (replication, RDB, AOF,
    /// RESTORE). Its monotonic deadline is what is left of it by this server's wall clock.
    pub fn from_wall_deadline(owner: &[u8], token: u64, deadline_wall_ms: i64, now: Now) -> Grant {
        let left_ms = u64::try_from(deadline_wall_ms.saturating_sub(now.wall_ms)).unwrap_or(0);
        Grant {
            owner: owner.into(),
            token,
            deadline_wall_ms,
            deadline_mono_us: now.mono_us.saturating_add(left_ms.saturating_mul(1000)),
        }
    }

    /// Reset the lease to end `ttl_ms` from `now`.
    pub fn extend(&mut self, ttl_ms: u64, now: Now) {
        let ttl = i64::try_from(ttl_ms).unwrap_or(i64::MAX);
        self.deadline_wall_ms = now.wall_ms.saturating_add(ttl);
        self.deadline_mono_us = now.mono_us.saturating_add(ttl_ms.saturating_mul(1000));
    }

    pub fn is_live(&self, now: Now) -> bool {
        self.deadline_mono_us > now.mono_us
    }

    /// Remaining lease in whole milliseconds, rounded up: at least 1 while live, else 0.
    pub fn remaining_ms(&self, now: Now) -> u64 {
        self.deadline_mono_us.saturating_sub(now.mono_us).div_ceil(1000)
    }

    /// Microseconds until the lease ends (0 when it has ended).
    pub fn remaining_us(&self, now: Now) -> u64 {
        self.deadline_mono_us.saturating_sub(now.mono_us)
    }
}

/// What ACQUIRE did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Acquired {
    /// A new grant with a new token.
    Granted(u64),
    /// The caller already held the live grant: same token, lease reset (G4).
    Refreshed(u64),
    /// Another owner holds a live grant.
    Busy,
    /// No token left below 2^53.
    TokensExhausted,
}

/// The state of one lock key.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct LockState {
    /// The current grant, live or run out (an expired grant is cleared lazily, by the next
    /// command that touches the key, or actively by the expiry timer on a master).
    pub holder: Option<Grant>,
}

impl LockState {
    pub fn with_grant(grant: Grant) -> LockState {
        LockState {
            holder: Some(grant),
        }
    }

    /// The holder, when its lease is still running.
    pub fn live_holder(&self, now: Now) -> Option<&Grant> {
        self.holder.as_ref().filter(|g| g.is_live(now))
    }

    /// True when nothing is left worth keeping: the key should leave the keyspace.
    pub fn is_vacant(&self, now: Now) -> bool {
        self.live_holder(now).is_none()
    }

    /// Clear a grant whose lease ran out. Returns the token of the grant that ended.
    pub fn expire(&mut self, now: Now) -> Option<u64> {
        match &self.holder {
            Some(g) if !g.is_live(now) => {
                let token = g.token;
                self.holder = None;
                Some(token)
            }
            _ => None,
        }
    }

    /// FLOCK.ACQUIRE without waiting.
    pub fn acquire(
        &mut self,
        owner: &[u8],
        ttl_ms: u64,
        now: Now,
        tokens: &mut TokenIssuer,
    ) -> Acquired {
        self.expire(now);
        if let Some(holder) = self.holder.as_mut() {
            if *holder.owner == *owner {
                holder.extend(ttl_ms, now);
                return Acquired::Refreshed(holder.token);
            }
            return Acquired::Busy;
        }
        match tokens.issue(now) {
            Some(token) => {
                self.holder = Some(Grant::new(owner, token, ttl_ms, now));
                Acquired::Granted(token)
            }
            None => Acquired::TokensExhausted,
        }
    }

    /// FLOCK.RELEASE: true when `owner` held the live grant, which is now over.
    pub fn release(&mut self, owner: &[u8], now: Now) -> bool {
        match self.live_holder(now) {
            Some(holder) if *holder.owner == *owner => {
                self.holder = None;
                true
            }
            _ => false,
        }
    }

    /// FLOCK.RENEW: the token when `owner` holds the live grant (lease now `ttl_ms` from
    /// `now`); `None` otherwise. Never revives an expired grant.
    pub fn renew(&mut self, owner: &[u8], ttl_ms: u64, now: Now) -> Option<u64> {
        let holder = self.holder.as_mut().filter(|g| g.is_live(now))?;
        if *holder.owner != *owner {
            return None;
        }
        holder.extend(ttl_ms, now);
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

    const T0: Now = Now {
        wall_ms: 1_700_000_000_000,
        mono_us: 5_000_000,
    };

    fn at(ms: u64) -> Now {
        Now {
            wall_ms: T0.wall_ms + ms as i64,
            mono_us: T0.mono_us + ms * 1000,
        }
    }

    /// The monotonic clock moved by `ms` while the wall clock stepped by `wall_step_ms`.
    fn stepped(ms: u64, wall_step_ms: i64) -> Now {
        Now {
            wall_ms: T0.wall_ms + ms as i64 + wall_step_ms,
            mono_us: T0.mono_us + ms * 1000,
        }
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
                vec![
                    (0, Acquire("a", 100), New(0)),
                    (10, Acquire("b", 100), Nil),
                ],
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
                    Acquire(o, ttl) => match state.acquire(o.as_bytes(), ttl, now, &mut tokens) {
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
                    },
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
        let back = Now {
            wall_ms: T0.wall_ms - 86_400_000,
            mono_us: T0.mono_us,
        };
        assert_eq!(tokens.issue(back), Some(1_700_000_000_000_002));
        // A token seen elsewhere raises the mark.
        tokens.observe(1_800_000_000_000_000);
        assert_eq!(tokens.issue(T0), Some(1_800_000_000_000_001));
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
            state.acquire(b"a", 10, T0, &mut tokens),
            Acquired::TokensExhausted
        );
        assert_eq!(state.holder, None);
    }

    #[test]
    fn wall_clock_steps_do_not_change_lease_length() {
        // G9: liveness is decided by the monotonic clock.
        let mut tokens = TokenIssuer::new();
        let mut state = LockState::default();
        let Acquired::Granted(tok) = state.acquire(b"a", 1000, T0, &mut tokens) else {
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
        assert_eq!(g.deadline_wall_ms, T0.wall_ms + 1000);
        // Loaded 300 ms later on another server whose monotonic clock is elsewhere.
        let there = Now {
            wall_ms: T0.wall_ms + 300,
            mono_us: 42,
        };
        let copy = Grant::from_wall_deadline(&g.owner, g.token, g.deadline_wall_ms, there);
        assert_eq!(copy.remaining_ms(there), 700);
        assert_eq!(copy.deadline_wall_ms, g.deadline_wall_ms);
        // Loaded after the deadline: not live.
        let late = Now {
            wall_ms: T0.wall_ms + 2000,
            mono_us: 42,
        };
        let dead = Grant::from_wall_deadline(&g.owner, g.token, g.deadline_wall_ms, late);
        assert!(!dead.is_live(late));
        assert_eq!(dead.remaining_ms(late), 0);
    }

    #[test]
    fn expire_reports_the_ended_token_once() {
        let mut tokens = TokenIssuer::new();
        let mut state = LockState::default();
        let Acquired::Granted(tok) = state.acquire(b"a", 100, T0, &mut tokens) else {
            panic!("not granted");
        };
        assert_eq!(state.expire(at(99)), None);
        assert!(!state.is_vacant(at(99)));
        assert_eq!(state.expire(at(100)), Some(tok));
        assert_eq!(state.expire(at(100)), None);
        assert!(state.is_vacant(at(100)));
    }
}
