//! What is checked after every step: the engine's key against the model's, the replica against
//! the master (G7), G1, G6 and G9 on the engine's state, and G3 on the tokens issued; and how
//! a state shows in the trace.

use super::model::{MGrant, MWaiter, Model, Settings};
use super::server::Server;
use crate::bytes::Bytes;
use flock_core::engine::Event;
use flock_core::state::Binding;
use flock_core::state::Mode;
use flock_core::{Grant, LockState, Now, Snapshot, Waiter, MAX_TOKEN};

pub(super) fn grant_view(g: &Grant) -> MGrant {
    MGrant {
        owner: g.owner.to_vec(),
        token: g.token,
        mono_us: g.deadline.mono_us,
        wall_ms: g.deadline.wall_ms,
        bound: g.bound(),
        client: g.bound_client(),
        lost: g.binding() == Binding::Lost,
    }
}

/// A step's events, in an order of their own (the contract orders none within a step), and
/// RELEASE's hold time left out (the model keeps no start times). An ending event keeps its
/// grant's token: FLOCK.WATCH tells a grant's watchers how it ended from it.
pub(super) fn events_view(events: &[Event]) -> Vec<(u8, u64)> {
    let mut v: Vec<(u8, u64)> = events
        .iter()
        .map(|e| match *e {
            Event::Acquired { ttl_ms } => (0, ttl_ms),
            Event::Released { token, .. } => (1, token),
            Event::Expired { token } => (2, token),
            Event::Revoked { token } => (3, token),
            Event::Closed { token } => (4, token),
        })
        .collect();
    v.sort_unstable();
    v
}

pub(super) fn waiter_view(w: &Waiter) -> MWaiter {
    MWaiter {
        id: w.id,
        owner: w.owner.to_vec(),
        ttl_ms: w.ttl_ms,
        mode: w.mode,
        bind_to: w.bind_to,
    }
}

/// An owner as the trace shows it (the long one abbreviated).
pub(super) fn short(owner: &[u8]) -> String {
    match owner.len() {
        n if n > 8 => format!("o*{n}"),
        _ => String::from_utf8_lossy(owner).into_owned(),
    }
}

/// A state as the trace shows it.
pub(super) fn show(st: &LockState) -> String {
    let grants: Vec<String> = st
        .grants()
        .by_token()
        .into_iter()
        .map(|g| {
            let tie = match g.binding() {
                Binding::Client(c) => format!("@{c}"),
                Binding::Lost => "@lost".into(),
                Binding::None if g.bound() => "@-".into(),
                Binding::None => String::new(),
            };
            format!(
                "{}:{}:{}{tie}",
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

pub(super) fn sorted(mut v: Vec<(u64, i64)>) -> Vec<(u64, i64)> {
    v.sort_unstable();
    v
}

/// Key `k` must be the model's (existence, kind, grants, delayed slots, waiters), a replica
/// must agree with it (G7), and the guarantees must hold on the engine's state alone (G1, G6).
/// `write`: a write command on this key just ran. `full`: compare every waiter, not only
/// their number.
#[allow(clippy::too_many_arguments)]
pub(super) fn assert_same(
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
    // The module keeps a lone grant in a compact form of its own (`ffi/block.rs`): the grant's
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

/// Every token issued, in order (G3).
#[derive(Default)]
pub(super) struct Issued {
    pub(super) tokens: Vec<u64>,
    /// Set by a restart that lost the high-water mark (an AOF without preamble): the mark
    /// before it. The contract keeps tokens growing across such a restart only while the
    /// clock is past that mark; when the next token shows that it is not, the old history no
    /// longer binds.
    pub(super) clock_floor: Option<u64>,
}

impl Issued {
    /// A new token must exceed every token issued before it (G3), stay below 2^53, and be no
    /// lower than the wall clock in microseconds.
    pub(super) fn note(&mut self, t: u64, now: Now, step: usize) {
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
    pub(super) fn recent(&self, r: &mut Bytes<'_>) -> u64 {
        match self.tokens.len() {
            0 => 1 + u64::from(r.u8()),
            n => self.tokens[n - 1 - r.below(n.min(6))],
        }
    }
}
