//! The reference model, written from the contract (SPEC.md), not from the engine: each key's
//! existence, kind, grants, delayed slots and waiters, and the tokens issued.

use super::check::Issued;
use flock_core::args::AcquireArgs;
use flock_core::engine::{Event, Info, Reply, ReplyError};
use flock_core::state::Mode;
use flock_core::{Now, MAX_TOKEN};
use std::collections::{BTreeMap, VecDeque};

#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) struct MGrant {
    pub(super) owner: Vec<u8>,
    pub(super) token: u64,
    /// Deadline on the monotonic clock (decides on a running server: G9) and as an absolute
    /// wall-clock time (what travels).
    pub(super) mono_us: u64,
    pub(super) wall_ms: i64,
    /// Made with BOUND (the mark that travels).
    pub(super) bound: bool,
    /// The connection it lives with on this master (G11), while that connection is open.
    pub(super) client: Option<u64>,
    /// A bound grant whose connection closed, or that arrived on this master without one: not
    /// live from that moment, ended by the next settle.
    pub(super) lost: bool,
}

impl MGrant {
    pub(super) fn live(&self, now: Now) -> bool {
        now.mono_us < self.mono_us && !self.lost
    }

    /// When the grant stops being live: its lease's end, or at once when it lost its
    /// connection.
    pub(super) fn due_us(&self) -> u64 {
        if self.lost {
            0
        } else {
            self.mono_us
        }
    }

    pub(super) fn remaining_ms(&self, now: Now) -> u64 {
        self.mono_us.saturating_sub(now.mono_us).div_ceil(1000)
    }
}

/// `ms` after `now` on both clocks (a lease's or a revoke's lock-delay end).
pub(super) fn after(now: Now, ms: u64) -> (u64, i64) {
    (now.mono_us + ms * 1000, now.wall_ms + ms as i64)
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) struct MWaiter {
    pub(super) id: u64,
    pub(super) owner: Vec<u8>,
    pub(super) ttl_ms: u64,
    pub(super) mode: Mode,
    /// BOUND: the connection the grant is to live with.
    pub(super) bind_to: Option<u64>,
}

/// One key of the model: whether it exists in the keyspace, and its lock.
#[derive(Clone, Debug, Default)]
pub(super) struct MKey {
    pub(super) exists: bool,
    /// The kind of the grants and delayed slots (all alike); meaningless when it has neither.
    pub(super) mode: Mode,
    /// In token order (a new grant has the largest token), run-out ones until a write clears
    /// them.
    pub(super) grants: Vec<MGrant>,
    /// Ends of the delayed slots: (monotonic us, wall ms).
    pub(super) delays: Vec<(u64, i64)>,
    pub(super) last_token: u64,
    /// Waiting requests, first come first served; vanished ones stay until they are reached.
    pub(super) queue: VecDeque<MWaiter>,
}

impl MKey {
    pub(super) fn live(&self, now: Now) -> impl Iterator<Item = &MGrant> + '_ {
        self.grants.iter().filter(move |g| g.live(now))
    }

    pub(super) fn live_count(&self, now: Now) -> usize {
        self.live(now).count()
    }

    pub(super) fn active_delays(&self, now: Now) -> usize {
        self.delays.iter().filter(|(m, _)| now.mono_us < *m).count()
    }

    /// A live grant or a running delayed slot gives the key its mode.
    pub(super) fn taken(&self, now: Now) -> bool {
        self.live_count(now) > 0 || self.active_delays(now) > 0
    }

    /// The shared mode of the requests waiting, if any; the contract has them all alike.
    pub(super) fn waiting_shared(&self) -> Option<Mode> {
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
    pub(super) fn key_limit(&self, now: Now) -> Option<Mode> {
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
    pub(super) fn fits(&self, mode: Mode, now: Now, max_holders: u32) -> bool {
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

    pub(super) fn forget_lock(&mut self) {
        self.exists = false;
        self.mode = Mode::Exclusive;
        self.grants.clear();
        self.delays.clear();
        self.last_token = 0;
    }
}

/// The settings of the moment.
#[derive(Clone, Copy)]
pub(super) struct Settings {
    pub(super) lock_delay_ms: u64,
    pub(super) max_holders: u32,
    pub(super) max_waiters: usize,
}

pub(super) struct Model {
    pub(super) keys: Vec<MKey>,
    pub(super) high_water: u64,
    /// Waiters whose client went away without their queue hearing of it.
    pub(super) vanished: Vec<u64>,
    /// Every token granted, in order (G3).
    pub(super) issued: Issued,
    /// The (waiter id, token) hand-offs of the current step.
    pub(super) handed: Vec<(u64, u64)>,
    /// The waiters answered nil in the current step because their owner holds the key.
    pub(super) dismissed: Vec<u64>,
    /// The waiters refused in the current step: their limit is not the key's (given here).
    pub(super) refused: Vec<(u64, Mode)>,
    /// Recent hand-offs as (key, token): grants whose reply may yet fail to reach the client.
    pub(super) recent_handoffs: VecDeque<(usize, u64)>,
    pub(super) step: usize,
    /// The largest max-holders of the run: a shared key keeps what it was granted under it.
    pub(super) max_holders_seen: u32,
    /// The events of the current step (`flock.<name>` notifications), RELEASE's hold time
    /// left out.
    pub(super) events: Vec<Event>,
    /// The connection each waiting request came from (waiter id -> client id).
    pub(super) waiter_conn: BTreeMap<u64, u64>,
    /// How often the reference saw each BOUND path (reported by the smoke test).
    pub(super) seen: BoundSeen,
}

/// Counts of the BOUND paths a run went through.
#[derive(Clone, Copy, Debug, Default)]
pub struct BoundSeen {
    /// ACQUIRE with BOUND granted at once.
    pub bound_granted: usize,
    /// A bound waiter handed the key.
    pub bound_handed: usize,
    /// A BOUND request queued.
    pub bound_queued: usize,
    /// The holder repeating ACQUIRE moved the binding: to another connection, from none to
    /// one, from one to none.
    pub rebound: usize,
    pub bound_to_unbound: usize,
    pub unbound_to_bound: usize,
    /// The holder repeating ACQUIRE on the connection it is bound to.
    pub same_binding: usize,
    /// Connections closed, those that held bound grants, and the grants they ended.
    pub closes: usize,
    pub closes_with_grants: usize,
    pub closed_grants: usize,
    /// Of those, grants whose lease had run out before the close (they end by their lease:
    /// `flock.expired`).
    pub closed_after_lease: usize,
    /// Bound waiters that left their queue with their connection.
    pub bound_waiters_left: usize,
    /// Bound grants that arrived without their connection (travel), and those of them still
    /// live by their lease when they did.
    pub orphaned: usize,
    pub orphaned_live: usize,
    /// Bound grants released, revoked, run out by their lease.
    pub bound_released: usize,
    pub bound_revoked: usize,
    pub bound_expired: usize,
    /// COPY of a key with bound grants (left out of the copy).
    pub copies: usize,
    pub copies_without_bound: usize,
    /// Waits ended with nil because a COPY brought the waiting owner's grant onto the key.
    pub holders_dismissed: usize,
    /// Waits refused because a COPY gave the key another limit than theirs.
    pub limits_refused: usize,
    /// RENAME of a lock key, and of a bound grant whose twin stays bound under a third key.
    pub renames: usize,
    pub twin_moves: usize,
    /// A connection bound to two grants of one token (a COPY's twin, on two keys).
    pub twin_binds: usize,
}

impl BoundSeen {
    pub fn add(&mut self, o: &BoundSeen) {
        macro_rules! sum {
            ($($f:ident)*) => { $(self.$f += o.$f;)* };
        }
        sum!(bound_granted bound_handed bound_queued rebound bound_to_unbound unbound_to_bound
            same_binding closes closes_with_grants closed_grants closed_after_lease
            bound_waiters_left orphaned orphaned_live bound_released bound_revoked bound_expired
            copies copies_without_bound holders_dismissed limits_refused renames twin_moves twin_binds);
    }
}

impl Model {
    pub(super) fn issue(&mut self, now: Now) -> Option<u64> {
        let t = (self.high_water + 1).max(now.wall_us);
        if t > MAX_TOKEN {
            return None;
        }
        self.high_water = t;
        Some(t)
    }

    #[allow(clippy::too_many_arguments)]
    pub(super) fn grant(
        &mut self,
        k: usize,
        mode: Mode,
        owner: &[u8],
        ttl_ms: u64,
        token: u64,
        now: Now,
        bind_to: Option<u64>,
    ) {
        let key = &mut self.keys[k];
        let (mono_us, wall_ms) = after(now, ttl_ms);
        key.mode = mode;
        key.grants.push(MGrant {
            owner: owner.to_vec(),
            token,
            mono_us,
            wall_ms,
            bound: bind_to.is_some(),
            client: bind_to,
            lost: false,
        });
        key.last_token = token;
    }

    /// Bring key `k` up to date: every run-out lease ends, leaving a delayed slot of the
    /// lock-delay counted from its deadline (`flock.expired`); a bound grant that lost its
    /// connection while its lease ran ends as on expiry, its slot delayed from now
    /// (`flock.closed`: no time passes between the loss and this settle, the key being due at
    /// once); finished slots end; then waiters are granted from the head while the head fits
    /// (a vanished one costs a token and is skipped). Hand-offs go to `handed`.
    pub(super) fn settle_state(&mut self, k: usize, now: Now, set: Settings) {
        self.end_due(k, now, set);
        self.hand_off(k, now, set);
    }

    /// The first half of [`Model::settle_state`]: run-out leases and lost bound grants end,
    /// finished slots end. Again at the same `now`, nothing happens.
    pub(super) fn end_due(&mut self, k: usize, now: Now, set: Settings) {
        let d = set.lock_delay_ms;
        let key = &mut self.keys[k];
        let (kept, ended): (Vec<MGrant>, Vec<MGrant>) = std::mem::take(&mut key.grants)
            .into_iter()
            .partition(|g| g.live(now));
        key.grants = kept;
        for g in &ended {
            let closed = g.lost && now.mono_us < g.mono_us;
            if g.bound && !g.lost {
                self.seen.bound_expired += 1;
            }
            let event = if closed {
                Event::Closed { token: g.token }
            } else {
                Event::Expired { token: g.token }
            };
            self.events.push(event);
            if d > 0 {
                self.keys[k].delays.push(if closed {
                    after(now, d)
                } else {
                    (g.mono_us + d * 1000, g.wall_ms + d as i64)
                });
            }
        }
        self.keys[k].delays.retain(|(m, _)| now.mono_us < *m);
    }

    /// The second half of [`Model::settle_state`]: waiters are granted from the head while
    /// the head fits.
    fn hand_off(&mut self, k: usize, now: Now, set: Settings) {
        loop {
            let key = &self.keys[k];
            let Some(head) = key.queue.front() else {
                return;
            };
            // "An owner never both holds and waits": a head whose owner holds (a value that
            // arrived under the key's name) is answered nil, never granted twice.
            if key.live(now).any(|g| g.owner == head.owner) {
                let w = self.keys[k].queue.pop_front().expect("head");
                self.waiter_conn.remove(&w.id);
                self.dismissed.push(w.id);
                continue;
            }
            // "A key's limit is that of its live shared grants, its delayed slots and its
            // waiting shared requests": a shared head of another limit than the key's is
            // refused with the waiters like it (see `refuse_other_limits`).
            if let Some(limit) = key.taken(now).then_some(key.mode) {
                if limit != Mode::Exclusive && head.mode != Mode::Exclusive && head.mode != limit {
                    self.refuse_other_limits(k, now);
                    continue;
                }
            }
            if !key.fits(head.mode, now, set.max_holders) {
                return;
            }
            let Some(token) = self.issue(now) else {
                return;
            };
            let w = self.keys[k].queue.pop_front().expect("head");
            self.waiter_conn.remove(&w.id);
            self.grant(k, w.mode, &w.owner, w.ttl_ms, token, now, w.bind_to);
            if self.vanished.contains(&w.id) {
                self.keys[k].grants.pop();
                continue;
            }
            self.events.push(Event::Acquired { ttl_ms: w.ttl_ms });
            if w.bind_to.is_some() {
                self.seen.bound_handed += 1;
            }
            self.issued.note(token, now, self.step);
            self.handed.push((w.id, token));
            self.recent_handoffs.push_back((k, token));
            if self.recent_handoffs.len() > 8 {
                self.recent_handoffs.pop_front();
            }
        }
    }

    /// A value arrived under key `k`'s name and the key is looked at: every waiting request
    /// whose owner holds a live grant of it leaves the queue with nil (SPEC: "An owner holds
    /// at most one grant of a key and never both holds and waits"); its grant stands.
    pub(super) fn dismiss_holders(&mut self, k: usize, now: Now) {
        let key = &mut self.keys[k];
        let holders: Vec<Vec<u8>> = key.live(now).map(|g| g.owner.clone()).collect();
        let (gone, kept): (VecDeque<MWaiter>, VecDeque<MWaiter>) = std::mem::take(&mut key.queue)
            .into_iter()
            .partition(|w| holders.contains(&w.owner));
        key.queue = kept;
        for w in gone {
            self.waiter_conn.remove(&w.id);
            self.dismissed.push(w.id);
        }
    }

    /// A value arrived under key `k`'s name and the key is looked at: when its live grants or
    /// delayed slots give the key a shared limit, every waiting shared request of another
    /// limit leaves the queue with `ERR limit mismatch` for the key's (SPEC "Lock kinds":
    /// the key has one limit; a request naming another one is refused).
    pub(super) fn refuse_other_limits(&mut self, k: usize, now: Now) {
        let key = &mut self.keys[k];
        if !key.taken(now) || key.mode == Mode::Exclusive {
            return;
        }
        let limit = key.mode;
        let (gone, kept): (VecDeque<MWaiter>, VecDeque<MWaiter>) = std::mem::take(&mut key.queue)
            .into_iter()
            .partition(|w| w.mode != Mode::Exclusive && w.mode != limit);
        key.queue = kept;
        for w in gone {
            self.waiter_conn.remove(&w.id);
            self.refused.push((w.id, limit));
        }
    }

    /// The key leaves the keyspace when nothing is left of it. True when it did.
    pub(super) fn publish(&mut self, k: usize, now: Now) -> bool {
        let key = &mut self.keys[k];
        if key.grants.is_empty() && key.active_delays(now) == 0 && key.queue.is_empty() {
            key.forget_lock();
            return true;
        }
        false
    }

    /// What a write command on an existing key does first. True when the key went away.
    pub(super) fn settle(&mut self, k: usize, now: Now, set: Settings) -> bool {
        self.settle_state(k, now, set);
        self.publish(k, now)
    }

    /// FLOCK.ACQUIRE (parsed), from the contract: the owner's own grant (mode, then limit),
    /// then the key's limit, then room (nobody jumps the queue). `blocked`: the id of the
    /// request when the engine queued it. `bind_to`: with BOUND, the caller's connection
    /// (the repeating holder's binding is set anew: to it, or to none without BOUND).
    #[allow(clippy::too_many_arguments)]
    pub(super) fn acquire(
        &mut self,
        k: usize,
        a: &AcquireArgs<'_>,
        now: Now,
        set: Settings,
        blocked: Option<u64>,
        bind_to: Option<u64>,
        conn: u64,
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
            let seen = &mut self.seen;
            match (g.client, bind_to) {
                (Some(x), Some(y)) if x == y => seen.same_binding += 1,
                (Some(_), Some(_)) => seen.rebound += 1,
                (Some(_), None) => seen.bound_to_unbound += 1,
                (None, Some(_)) => seen.unbound_to_bound += 1,
                (None, None) => {}
            }
            g.bound = bind_to.is_some();
            g.client = bind_to;
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
            self.grant(k, a.mode, a.owner, a.ttl_ms, token, now, bind_to);
            self.issued.note(token, now, self.step);
            self.events.push(Event::Acquired { ttl_ms: a.ttl_ms });
            if bind_to.is_some() {
                self.seen.bound_granted += 1;
            }
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
            bind_to,
        };
        let id = waiter.id;
        match replaces.and_then(|i| key.queue.get_mut(i)) {
            Some(slot) => {
                let old = std::mem::replace(slot, waiter);
                self.waiter_conn.remove(&old.id);
            }
            None => key.queue.push_back(waiter),
        }
        self.waiter_conn.insert(id, conn);
        if bind_to.is_some() {
            self.seen.bound_queued += 1;
        }
        // The request that left may have been the head that held everyone behind it.
        self.settle_state(k, now, set);
        Reply::Blocked
    }

    /// The live grant of `owner` (with `token`, when given).
    pub(super) fn find(
        &self,
        k: usize,
        owner: &[u8],
        token: Option<u64>,
        now: Now,
    ) -> Option<usize> {
        self.keys[k]
            .grants
            .iter()
            .position(|g| g.live(now) && g.owner == owner && token.is_none_or(|t| t == g.token))
    }

    pub(super) fn release(
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
        let g = self.keys[k].grants.remove(i);
        self.events.push(Event::Released {
            held_ms: 0,
            token: g.token,
        });
        if g.client.is_some() {
            self.seen.bound_released += 1;
        }
        self.settle(k, now, set);
        Reply::Int(1)
    }

    pub(super) fn renew(
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

    pub(super) fn revoke(
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
        let revoked: Vec<u64> = key
            .grants
            .iter()
            .filter(|g| hit(g))
            .map(|g| g.token)
            .collect();
        let n = revoked.len();
        if n == 0 {
            return Reply::Int(0);
        }
        let bound = key
            .grants
            .iter()
            .filter(|g| hit(g) && g.client.is_some())
            .count();
        key.grants.retain(|g| !hit(g));
        self.seen.bound_revoked += bound;
        self.events
            .extend(revoked.into_iter().map(|token| Event::Revoked { token }));
        // Each revoked grant's slot stays taken for the lock-delay, from now.
        if set.lock_delay_ms > 0 {
            key.delays
                .extend((0..n).map(|_| after(now, set.lock_delay_ms)));
        }
        self.settle(k, now, set);
        Reply::Int(n as i64)
    }

    /// FLOCK.INFO from the contract.
    pub(super) fn info(&self, k: usize, now: Now) -> Reply<'_> {
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

impl Model {
    /// Whether `owner` waits for key `k` only through a vanished request (its client went
    /// away; the server has not noticed yet).
    pub(super) fn vanished_owner_waits(&self, k: usize, owner: &[u8]) -> bool {
        self.keys[k]
            .queue
            .iter()
            .filter(|w| w.owner == owner)
            .all(|w| self.vanished.contains(&w.id))
    }
}

impl Model {
    /// Connection `client` closed: its waiting requests left their queues already; its bound
    /// grants are not live from now on, and end (as on expiry, `flock.closed`) when the keys
    /// `settled` (those the module's bindings index lists for the client) are settled, each
    /// that exists. Every key where the client held a bound grant must be among them.
    pub(super) fn close(&mut self, client: u64, settled: &[usize], now: Now, set: Settings) {
        self.seen.closes += 1;
        let mut ended = 0;
        for (k, key) in self.keys.iter_mut().enumerate() {
            for g in key.grants.iter_mut().filter(|g| g.client == Some(client)) {
                assert!(
                    settled.contains(&k),
                    "step {}: key {k} holds a grant bound to {client} the index does not list",
                    self.step
                );
                g.client = None;
                g.lost = true;
                ended += 1;
                if now.mono_us >= g.mono_us {
                    self.seen.closed_after_lease += 1;
                }
            }
        }
        self.seen.closed_grants += ended;
        self.seen.closes_with_grants += usize::from(ended > 0);
        for &k in settled {
            if self.keys[k].exists {
                self.settle(k, now, set);
            }
        }
    }

    /// Key `k` arrived on a master from outside (RDB, promotion): its bound grants have no
    /// connection here, so none is live from now on (the key is due at once).
    pub(super) fn orphan_bound(&mut self, k: usize, now: Now) {
        for g in self.keys[k].grants.iter_mut().filter(|g| g.bound) {
            self.seen.orphaned += 1;
            if g.live(now) {
                self.seen.orphaned_live += 1;
            }
            g.client = None;
            g.lost = true;
        }
    }

    /// Whether key `k` holds a bound grant that lost its connection (and so is due at once).
    pub(super) fn has_lost(&self, k: usize) -> bool {
        self.keys[k].grants.iter().any(|g| g.lost)
    }

    /// The bindings the contract has now: (client, key, token) of every bound grant whose
    /// connection is open, sorted.
    pub(super) fn bindings(&self) -> Vec<(u64, usize, u64)> {
        let mut v: Vec<(u64, usize, u64)> = self
            .keys
            .iter()
            .enumerate()
            .flat_map(|(k, key)| {
                key.grants
                    .iter()
                    .filter_map(move |g| g.client.map(|c| (c, k, g.token)))
            })
            .collect();
        v.sort_unstable();
        v
    }
}
