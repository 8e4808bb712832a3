//! The state of one lock key and its rules: grants of every kind (exclusive, shared, permits),
//! releases, renewals, revokes, expiry, lock-delay slots.
//!
//! Plain Rust, no Redis types. Time is injected as a [`Now`] value, so every rule here is
//! tested table-style with `cargo test`. The engine (`engine.rs`) calls these rules in the
//! order a command needs and turns their outcomes into replies and effects.

use crate::clock::{Deadline, Now};
pub use crate::grant::{Binding, Grant};
use crate::grants::Grants;
use crate::tokens::TokenIssuer;
use smallvec::SmallVec;

/// Owners are opaque, binary-safe strings of 1 to 256 bytes.
pub const MAX_OWNER_LEN: usize = 256;

/// The largest limit a key can have (the top of `flock.max-holders`' range).
pub const MAX_LIMIT: u32 = 1_000_000;

/// The kind of a grant, of a waiting request, and of a key's grants and delayed slots.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum Mode {
    /// The key's only live grant (the default).
    #[default]
    Exclusive,
    /// A read lock: any number live together (up to `flock.max-holders`), never with an
    /// exclusive grant.
    Shared,
    /// A permit of a counting semaphore that admits this many at once.
    Permits(u32),
}

impl Mode {
    pub fn is_exclusive(self) -> bool {
        self == Mode::Exclusive
    }

    /// INFO's `mode` field.
    pub fn name(self) -> &'static str {
        match self {
            Mode::Exclusive => "exclusive",
            Mode::Shared => "shared",
            Mode::Permits(_) => "permits",
        }
    }

    /// INFO's `limit` field: a permit key's limit, 0 for none.
    pub fn limit(self) -> u32 {
        match self {
            Mode::Permits(n) => n,
            _ => 0,
        }
    }

    /// "an exclusive", "a shared", "a permit": how errors name a grant of this mode.
    pub fn grant_noun(self) -> &'static str {
        match self {
            Mode::Exclusive => "an exclusive",
            Mode::Shared => "a shared",
            Mode::Permits(_) => "a permit",
        }
    }
}

/// What ACQUIRE did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Acquired {
    /// A new grant with a new token.
    Granted(u64),
    /// The caller already held a live grant in this mode: same token, lease reset (G4).
    Refreshed(u64),
    /// The key has no room for the request now, or others wait first.
    Busy,
    /// The caller holds a live grant of another mode (no upgrade or downgrade).
    OwnerHolds(Mode),
    /// The request names another limit than the key's (its live shared grants, delayed slots
    /// or waiting shared requests).
    LimitMismatch(Mode),
    /// No token left below 2^53.
    TokensExhausted,
}

/// The delayed slots of a key (lock-delay). Most keys have none (`flock.lock-delay-ms` is 0
/// by default), so they cost one word in the record and a box of their own when present.
// A boxed Vec on purpose: one word in every lock record instead of a Vec's three.
#[allow(clippy::box_collection)]
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Delays(Option<Box<Vec<Deadline>>>);

impl std::ops::Deref for Delays {
    type Target = [Deadline];
    fn deref(&self) -> &[Deadline] {
        self.0.as_deref().map_or(&[], Vec::as_slice)
    }
}

impl Delays {
    pub fn push(&mut self, until: Deadline) {
        self.0.get_or_insert_with(Box::default).push(until);
    }

    /// Keep the slots `keep` says to keep (the box goes with the last one).
    pub fn retain(&mut self, keep: impl FnMut(&Deadline) -> bool) {
        if let Some(v) = self.0.as_mut() {
            v.retain(keep);
            if v.is_empty() {
                self.0 = None;
            }
        }
    }

    pub fn swap_remove(&mut self, at: usize) -> Option<Deadline> {
        let v = self.0.as_mut()?;
        if at >= v.len() {
            return None;
        }
        let d = v.swap_remove(at);
        if v.is_empty() {
            self.0 = None;
        }
        Some(d)
    }

    /// The bytes outside the record: what MEMORY USAGE counts.
    pub fn heap_bytes(&self) -> usize {
        self.0.as_ref().map_or(0, |v| {
            std::mem::size_of::<Vec<Deadline>>() + v.capacity() * std::mem::size_of::<Deadline>()
        })
    }
}

/// The state of one lock key.
///
/// The grants live in [`Grants`] (unordered, indexed by owner past a few, with a due hint),
/// so that commands on a key with many readers cost about what they cost on a key with one.
/// An exclusive key has at most one grant or one delayed slot, kept inline: one allocation.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct LockState {
    /// The kind of the key's grants and delayed slots (all alike, G1); meaningless when it
    /// has neither.
    pub mode: Mode,
    /// The grants, live or run out (a run-out grant is cleared lazily, by the next command
    /// that touches the key, or actively by the expiry timer on a master).
    grants: Grants,
    /// Lock-delay: slots of grants that expired or were revoked, each taken until its end.
    pub delays: Delays,
    /// The token of the latest grant of this key (shown by FLOCK.INFO when nobody holds it).
    pub last_token: u64,
}

impl LockState {
    #[inline]
    pub fn with_grant(mode: Mode, grant: Grant) -> LockState {
        LockState {
            mode,
            last_token: grant.token,
            grants: Grants::one(grant),
            delays: Delays::default(),
        }
    }

    /// A key whose one delayed slot (of `mode`) runs until `until`, after the grant with
    /// `last_token` ended.
    pub fn delayed(mode: Mode, last_token: u64, until: Deadline) -> LockState {
        let mut state = LockState {
            mode,
            last_token,
            ..LockState::default()
        };
        state.delays.push(until);
        state
    }

    /// The key's one grant and its mode when that is all the key is: one exclusive or shared
    /// grant (not a permit: a limit is more than the grant), no delayed slot, its token the
    /// key's last. Such a state is `LockState::with_grant(mode, Grant::from_parts(..))` of
    /// that grant's fields, which is what lets a host keep it in a compact form of its own.
    pub fn lone_grant(&self) -> Option<(Mode, &Grant)> {
        if matches!(self.mode, Mode::Permits(_))
            || !self.delays.is_empty()
            || self.grants.len() != 1
        {
            return None;
        }
        self.grants
            .iter()
            .next()
            .filter(|g| g.token == self.last_token)
            .map(|g| (self.mode, g))
    }

    /// The grants, live or not, in no particular order ([`Grants::by_token`] sorts).
    pub fn grants(&self) -> &Grants {
        &self.grants
    }

    /// Add a grant that arrived from outside (a loaded image).
    pub fn push_grant(&mut self, grant: Grant) {
        self.grants.push(grant);
    }

    /// Keep only the grants `keep` says to keep (COPY leaves bound grants out).
    pub fn retain_grants(&mut self, keep: impl FnMut(&Grant) -> bool) {
        self.grants.retain(keep, |_| {});
    }

    /// The live grants, in no particular order.
    pub fn live(&self, now: Now) -> impl Iterator<Item = &Grant> + '_ {
        self.grants.iter().filter(move |g| g.is_live(now))
    }

    /// How many grants are live. O(1) when no grant can have stopped being live yet (the
    /// common case: a settled key), else a count.
    pub fn live_count(&self, now: Now) -> usize {
        if self.grants.maybe_due(now) {
            self.live(now).count()
        } else {
            self.grants.len()
        }
    }

    /// The only live grant when the key is exclusive (what INFO shows as `owner`).
    pub fn exclusive_holder(&self, now: Now) -> Option<&Grant> {
        if !self.mode.is_exclusive() {
            return None;
        }
        self.live(now).next()
    }

    /// `owner`'s live grant, if it holds one.
    pub fn owner_grant(&self, owner: &[u8], now: Now) -> Option<&Grant> {
        let at = self.grants.position_of(owner)?;
        self.grants.get(at).filter(|g| g.is_live(now))
    }

    /// Delayed slots still running at `now`.
    pub fn active_delays(&self, now: Now) -> usize {
        if self.delays.is_empty() {
            return 0;
        }
        self.delays.iter().filter(|d| !d.passed(now)).count()
    }

    /// The mode that the key's live grants and running delayed slots give it, if any.
    pub fn held_mode(&self, now: Now) -> Option<Mode> {
        let taken = self.live_count(now) > 0 || self.active_delays(now) > 0;
        taken.then_some(self.mode)
    }

    /// Whether a request of `mode` fits the key at `now` (nobody waiting first):
    /// - exclusive: no live grant and no running delayed slot;
    /// - shared: no exclusive grant or slot, fewer than `max_holders` live shared grants;
    /// - permits of `n`: no exclusive grant or slot, fewer than `n` live and delayed permits.
    ///
    /// A request whose limit differs from the key's never fits ([`LockState::acquire`] refuses
    /// it before asking).
    pub fn fits(&self, mode: Mode, now: Now, max_holders: u32) -> bool {
        let Some(held) = self.held_mode(now) else {
            return true;
        };
        if held != mode || mode.is_exclusive() {
            return false;
        }
        let live = self.live_count(now);
        match mode {
            Mode::Shared => live < max_holders as usize,
            Mode::Permits(n) => live + self.active_delays(now) < n as usize,
            Mode::Exclusive => false,
        }
    }

    /// Whether a request of some mode could be granted now: false while an exclusive grant or
    /// slot holds the key or its limit is reached. Lets a held key skip asking about its
    /// waiters (nobody can be handed it, and an exclusive newcomer gets nil either way).
    pub fn could_admit(&self, now: Now, max_holders: u32) -> bool {
        match self.held_mode(now) {
            None => true,
            Some(Mode::Exclusive) => false,
            Some(Mode::Shared) => self.live_count(now) < max_holders as usize,
            Some(Mode::Permits(n)) => self.live_count(now) + self.active_delays(now) < n as usize,
        }
    }

    /// Nothing left worth keeping (given no waiters): the key should leave the keyspace.
    pub fn is_vacant(&self, now: Now) -> bool {
        self.grants.is_empty() && self.active_delays(now) == 0
    }

    /// When this key next needs attention: the earliest end of a lease or delayed slot (at
    /// once for a grant that lost its connection). It may come early (see [`Grants`]), never
    /// late.
    pub fn next_deadline(&self) -> Option<Deadline> {
        self.grants
            .next_due()
            .into_iter()
            .chain(self.delays.iter().copied())
            .min_by_key(|d| d.mono_us)
    }

    /// Clear the grants that are no longer live, each leaving a delayed slot of
    /// `lock_delay_ms` counted from its deadline (a lease that ran out) or from `now` (a
    /// bound grant whose connection is gone). Calls `ended` with each.
    pub fn expire(&mut self, now: Now, lock_delay_ms: u64, mut ended: impl FnMut(&Grant)) -> usize {
        if !self.grants.maybe_due(now) {
            return 0;
        }
        let mut gone: SmallVec<[Grant; 1]> = SmallVec::new();
        self.grants.retain(|g| g.is_live(now), |g| gone.push(g));
        gone.sort_unstable_by_key(|g| g.token);
        for g in &gone {
            ended(g);
            if lock_delay_ms > 0 {
                let from = if g.binding() == Binding::Lost && !g.deadline.passed(now) {
                    Deadline::after(0, now)
                } else {
                    g.deadline
                };
                self.push_delay(from.plus(lock_delay_ms));
            }
        }
        gone.len()
    }

    /// Add a delayed slot. Exclusive and permit keys have at most one slot per grant they
    /// admit; on an unlimited shared key delayed slots only hold off exclusive requests, so
    /// past [`MAX_LIMIT`] of them the one that ends first gives way (the latest end is what
    /// matters), which bounds a key's memory whatever the lock-delay.
    fn push_delay(&mut self, until: Deadline) {
        if self.delays.len() >= MAX_LIMIT as usize {
            if let Some(i) = (0..self.delays.len()).min_by_key(|&i| self.delays[i].mono_us) {
                self.delays.swap_remove(i);
            }
        }
        self.delays.push(until);
    }

    /// End the delayed slots whose time is up; true when one ended.
    pub fn end_delays(&mut self, now: Now) -> bool {
        let before = self.delays.len();
        self.delays.retain(|d| !d.passed(now));
        self.delays.len() != before
    }

    /// Add a grant of `mode` to `owner` with a freshly issued `token` (the caller checked
    /// that it fits), bound to connection `bind_to` when given.
    pub fn grant(
        &mut self,
        mode: Mode,
        owner: &[u8],
        ttl_ms: u64,
        token: u64,
        now: Now,
        bind_to: Option<u64>,
    ) {
        self.mode = mode;
        let mut g = Grant::new(owner, token, ttl_ms, now);
        g.bind(bind_to);
        self.grants.push(g);
        self.last_token = token;
    }

    /// The connection `client` closed: its bound grants are no longer live (the next settle
    /// ends them). Returns how many.
    pub fn close(&mut self, client: u64) -> usize {
        self.grants
            .mark_lost(|g| g.binding() == Binding::Client(client))
    }

    /// On a master: bound grants that have no binding in this process (loaded, restored,
    /// promoted) lose their connection. Returns how many.
    pub fn orphan_bound(&mut self) -> usize {
        self.grants
            .mark_lost(|g| g.bound() && g.binding() == Binding::None)
    }

    /// Take back the newest grant (its waiter vanished before it could be told).
    pub fn ungrant_newest(&mut self) -> Option<Grant> {
        self.grants.pop()
    }

    /// FLOCK.ACQUIRE without waiting, on a settled key. `waiting` is how many requests wait
    /// for the key (a newcomer never overtakes them); `waiting_mode` the mode of the shared
    /// requests among them, if any (their limit is the key's too).
    ///
    /// Checks come in the contract's order: the owner's own grant (mode, then limit), then the
    /// key's limit, then whether the request fits.
    /// `bind_to`: the connection a BOUND request comes from.
    #[allow(clippy::too_many_arguments)]
    pub fn acquire(
        &mut self,
        owner: &[u8],
        mode: Mode,
        ttl_ms: u64,
        now: Now,
        waiting: usize,
        waiting_mode: impl FnOnce() -> Option<Mode>,
        max_holders: u32,
        bind_to: Option<u64>,
        tokens: &mut TokenIssuer,
    ) -> Acquired {
        if let Some(at) = self.live_position(owner, None, now) {
            if self.mode != mode {
                return Acquired::OwnerHolds(self.mode);
            }
            // The repeat sets the binding anew: to this connection with BOUND, else none.
            self.grants
                .refresh(at, Deadline::after(ttl_ms, now), Some(bind_to));
            return match self.grants.get(at) {
                Some(g) => Acquired::Refreshed(g.token),
                None => Acquired::Busy,
            };
        }
        // Only a shared request or a permit can name another limit than the key's (and only
        // then is the queue asked for the limit of its shared waiters).
        if !mode.is_exclusive() {
            if let Some(key_mode) = self.limit_of_key(now, waiting_mode) {
                if key_mode != mode {
                    return Acquired::LimitMismatch(key_mode);
                }
            }
        }
        if waiting > 0 || !self.fits(mode, now, max_holders) {
            return Acquired::Busy;
        }
        match tokens.issue(now) {
            Some(token) => {
                self.grant(mode, owner, ttl_ms, token, now, bind_to);
                Acquired::Granted(token)
            }
            None => Acquired::TokensExhausted,
        }
    }

    /// Where `owner`'s live grant is (with `token`, when given).
    fn live_position(&self, owner: &[u8], token: Option<u64>, now: Now) -> Option<usize> {
        let at = self.grants.position_of(owner)?;
        self.grants
            .get(at)
            .filter(|g| g.is_live(now) && g.is(owner, token))
            .map(|_| at)
    }

    /// The shared mode (and so the limit) the key has: that of its live shared grants and
    /// running delayed slots, else of its waiting shared requests (also behind an exclusive
    /// holder). `None`: none of those.
    pub fn limit_of_key(
        &self,
        now: Now,
        waiting_mode: impl FnOnce() -> Option<Mode>,
    ) -> Option<Mode> {
        match self.held_mode(now) {
            Some(m) if !m.is_exclusive() => Some(m),
            _ => waiting_mode().filter(|m| !m.is_exclusive()),
        }
    }

    /// FLOCK.RELEASE: ends `owner`'s live grant (only the one with `token`, when given: a
    /// late retry of an earlier grant's release never ends a later one). Returns the ended
    /// grant; a released slot frees at once (no lock-delay).
    pub fn release(&mut self, owner: &[u8], token: Option<u64>, now: Now) -> Option<Grant> {
        let at = self.live_position(owner, token, now)?;
        self.grants.take(at)
    }

    /// Take out the live grant with `token`, whoever holds it (a grant made to a client that
    /// went away before its reply).
    pub fn take_token(&mut self, token: u64, now: Now) -> Option<Grant> {
        let at = self.grants.position_of_token(token)?;
        if !self.grants.get(at).is_some_and(|g| g.is_live(now)) {
            return None;
        }
        self.grants.take(at)
    }

    /// FLOCK.REVOKE: end every live grant (only `owner`'s, when given) now, each leaving a
    /// delayed slot of `lock_delay_ms` from now. Calls `ended` with each; returns how many.
    pub fn revoke(
        &mut self,
        owner: Option<&[u8]>,
        now: Now,
        lock_delay_ms: u64,
        mut ended: impl FnMut(&Grant),
    ) -> usize {
        let mut gone: SmallVec<[Grant; 1]> = SmallVec::new();
        match owner {
            Some(o) => {
                if let Some(g) = self
                    .live_position(o, None, now)
                    .and_then(|at| self.grants.take(at))
                {
                    gone.push(g);
                }
            }
            None => self.grants.retain(|g| !g.is_live(now), |g| gone.push(g)),
        }
        gone.sort_unstable_by_key(|g| g.token);
        for g in &gone {
            ended(g);
            if lock_delay_ms > 0 {
                self.push_delay(Deadline::after(lock_delay_ms, now));
            }
        }
        gone.len()
    }

    /// FLOCK.RENEW: the token when `owner` holds a live grant (with `token`, when given),
    /// whose lease now ends `ttl_ms` from `now`; `None` otherwise. Never revives an expired
    /// grant.
    pub fn renew(
        &mut self,
        owner: &[u8],
        ttl_ms: u64,
        token: Option<u64>,
        now: Now,
    ) -> Option<u64> {
        let at = self.live_position(owner, token, now)?;
        self.grants.refresh(at, Deadline::after(ttl_ms, now), None);
        self.grants.get(at).map(|g| g.token)
    }

    /// The live grant with `token`.
    pub fn live_grant(&self, token: u64, now: Now) -> Option<&Grant> {
        self.live(now).find(|g| g.token == token)
    }

    /// FLOCK.CHECK: remaining lease in ms (at least 1) when `token` is a live grant, else 0.
    pub fn check(&self, token: u64, now: Now) -> u64 {
        self.live_grant(token, now)
            .map_or(0, |g| g.remaining_ms(now))
    }
}

#[cfg(test)]
mod tests;
