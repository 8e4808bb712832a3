//! BOUND grants on the host's side: the bindings index as the module keeps it
//! (`flock_core::bindings`, kept by `src/store/bindings.rs`: client id -> the (key, token) of
//! its bound grants, fed by the engine's `Bind`/`Unbind` effects, taken whole when the
//! connection closes), and what is checked of it after every step (G11).
//!
//! Like the module's, the index is not told when a key goes away outside the engine (DEL,
//! FLUSHALL, DEBUG RELOAD): such entries are stale, harmless (closing their client settles
//! the key, and the engine ends only grants still bound to it). They are kept apart here so
//! that every other entry must be a live binding.

use super::model::{Model, Settings};
use super::server::Server;
use super::{KEYS, KEY_NAMES};
use flock_core::bindings::BindingIndex;
use flock_core::engine::{self, Event};
use flock_core::keyspace::{self, Arrival};
use flock_core::state::Binding;
use flock_core::Now;
use std::collections::{BTreeMap, BTreeSet};

#[derive(Default)]
pub(super) struct Bindings {
    /// The module's own index, fed the same calls: what closing a connection looks at must
    /// be what this reference says.
    index: BindingIndex,
    /// Client id -> its (key, token) entries, in the order they were bound.
    by_client: BTreeMap<u64, Vec<(usize, u64)>>,
    /// Entries (client, key, token) whose key went away outside the engine.
    stale: BTreeSet<(u64, usize, u64)>,
    /// Binds of a token the client has bound under another key already (a COPY's twin).
    pub(super) twin_binds: usize,
    /// RENAMEs of a bound grant whose twin the client has bound under a third key.
    pub(super) twin_moves: usize,
}

impl Bindings {
    /// `Effect::Bind`: a grant is bound once (when it is made or rebound to another
    /// connection). A grant is its key and token: COPY makes a second grant of a token under
    /// another key.
    pub(super) fn bind(&mut self, client: u64, k: usize, token: u64) {
        self.index.bind(client, token, (0, KEY_NAMES[k]));
        let entries = self.by_client.entry(client).or_default();
        // A stale entry of the same grant (COPY REPLACE brought the token back to the key):
        // the module's index lists it again, which comes to the same.
        if self.stale.remove(&(client, k, token)) {
            return;
        }
        assert!(
            !entries.contains(&(k, token)),
            "Bind of grant {token} of key {k} to {client} twice"
        );
        self.twin_binds += usize::from(entries.iter().any(|&(_, t)| t == token));
        entries.push((k, token));
    }

    /// `Effect::Unbind`: only of a grant bound to that client (and not one the index lost
    /// track of).
    pub(super) fn unbind(&mut self, client: u64, k: usize, token: u64) {
        self.index.unbind(client, token, (0, KEY_NAMES[k]));
        let entries = self.by_client.get_mut(&client);
        let at = entries
            .as_ref()
            .and_then(|e| e.iter().position(|&(kk, t)| (kk, t) == (k, token)));
        let (Some(entries), Some(at)) = (entries, at) else {
            panic!("Unbind of grant {token} of key {k} from {client}, which it is not bound to");
        };
        assert!(
            !self.stale.contains(&(client, k, token)),
            "Unbind of grant {token} of key {k}, gone outside the engine"
        );
        entries.remove(at);
        if entries.is_empty() {
            self.by_client.remove(&client);
        }
    }

    /// Connection `client` closed: the keys of its entries, each once, sorted (the index
    /// forgets the client).
    pub(super) fn take(&mut self, client: u64) -> Vec<usize> {
        let entries = self.by_client.remove(&client).unwrap_or_default();
        self.stale.retain(|&(c, _, _)| c != client);
        let mut keys: Vec<usize> = entries.into_iter().map(|(k, _)| k).collect();
        keys.sort_unstable();
        keys.dedup();
        let names: Vec<(i32, Vec<u8>)> = keys.iter().map(|&k| (0, KEY_NAMES[k].to_vec())).collect();
        assert_eq!(
            self.index.take(client),
            names,
            "the keys the module's index looks at when client {client} closes"
        );
        keys
    }

    /// RENAME moved key `from`'s grant `token`, bound to `client`, to key `to` (the index
    /// is told, by key and token). An entry of that token `to`'s overwritten value left (a
    /// COPY twin's) goes: `to` has one grant of a token.
    pub(super) fn moved(&mut self, client: u64, token: u64, from: usize, to: usize) {
        self.index
            .moved(client, token, (0, KEY_NAMES[from]), (0, KEY_NAMES[to]));
        let entries = self.by_client.entry(client).or_default();
        self.twin_moves += usize::from(
            entries
                .iter()
                .any(|&(k, t)| t == token && k != from && k != to),
        );
        entries.retain(|&e| e != (to, token));
        self.stale.remove(&(client, to, token));
        let at = entries
            .iter()
            .rposition(|&e| e == (from, token))
            .unwrap_or_else(|| {
                panic!("RENAME of grant {token} of key {from}, not bound to {client}")
            });
        assert!(
            !self.stale.contains(&(client, from, token)),
            "RENAME of a grant the index lost track of"
        );
        entries[at] = (to, token);
    }

    /// Key `k` went away (or lost its bindings) outside the engine: its entries are stale.
    pub(super) fn key_gone(&mut self, k: usize) {
        for (&c, entries) in &self.by_client {
            for &(kk, t) in entries {
                if kk == k {
                    self.stale.insert((c, kk, t));
                }
            }
        }
    }

    /// A new process (restart, promotion): no binding at all.
    pub(super) fn clear(&mut self) {
        self.index = BindingIndex::default();
        self.by_client.clear();
        self.stale.clear();
    }

    /// The entries that are not stale, as (client, key, token), sorted.
    fn live(&self) -> Vec<(u64, usize, u64)> {
        let mut v: Vec<(u64, usize, u64)> = self
            .by_client
            .iter()
            .flat_map(|(&c, e)| e.iter().map(move |&(k, t)| (c, k, t)))
            .filter(|e| !self.stale.contains(e))
            .collect();
        v.sort_unstable();
        v
    }
}

/// G11 and the index, after a step: every grant bound to a connection on the master is in
/// the index exactly once under that connection and key; every entry but the stale ones is
/// such a grant (no binding survives its grant); the bindings are the model's; a grant bound
/// here carries the BOUND mark and a bound grant on a master has its connection or has lost
/// it (none is left unlooked-at after an arrival); a replica binds nothing.
pub(super) fn check_bindings(real: &Server, model: &Model, step: usize) {
    let live = real.bindings.live();
    let mut from_states = Vec::new();
    for (k, st) in real.states.iter().enumerate() {
        let Some(st) = st else { continue };
        for g in st.grants().iter() {
            match g.binding() {
                Binding::Client(c) => {
                    assert!(g.bound(), "step {step}: key {k}: bound without the mark");
                    from_states.push((c, k, g.token));
                }
                Binding::Lost => assert!(g.bound(), "step {step}: key {k}: lost, no mark"),
                Binding::None => assert!(
                    !g.bound(),
                    "step {step}: key {k}: grant {} has the BOUND mark and no binding",
                    g.token
                ),
            }
        }
    }
    from_states.sort_unstable();
    for w in live.windows(2) {
        assert!(w[0] != w[1], "step {step}: {:?} bound twice", w[0]);
    }
    assert_eq!(
        live, from_states,
        "step {step}: the bindings index (left) against the bound grants (G11)"
    );
    assert_eq!(
        from_states,
        model.bindings(),
        "step {step}: the bindings (left) against the model's"
    );
    for (k, st) in real.replica.keys.iter().enumerate() {
        if let Some(st) = st {
            assert!(
                st.grants().iter().all(|g| g.binding() == Binding::None),
                "step {step}: key {k}: a replica binds"
            );
        }
    }
}

/// What a step did that the checks after it look at: the hand-offs, the events, and the key
/// it wrote to, if any.
pub(super) type Done = (Vec<(u64, u64)>, Vec<Event>, Option<usize>);

/// Connection `client` closes, as the module sees it: its waiting requests leave their
/// queues (the disconnect callback), then its bound grants end on every key the bindings index
/// lists for it (`engine::close`, from the event loop), then the keys it waited for are looked
/// at again (`engine::revisit`: a head that left may have held the others). `timers`: each
/// key's armed timer, kept up to date.
pub(super) fn close_conn(
    real: &mut Server,
    model: &mut Model,
    client: u64,
    now: Now,
    set: Settings,
    timers: &mut [Option<Option<u64>>],
) -> Done {
    let (mut delivered, mut events) = (Vec::new(), Vec::new());
    let mut left = Vec::new();
    for k in 0..KEYS {
        let gone: Vec<(u64, bool)> = model.keys[k]
            .queue
            .iter()
            .filter(|w| model.waiter_conn.get(&w.id) == Some(&client))
            .map(|w| (w.id, w.bind_to.is_some()))
            .collect();
        for &(id, bound) in &gone {
            model.keys[k].queue.retain(|w| w.id != id);
            model.waiter_conn.remove(&id);
            model.seen.bound_waiters_left += usize::from(bound);
            assert!(real.queues[k].cancel(id), "a closed client's waiter leaves");
        }
        if !gone.is_empty() {
            left.push(k);
        }
    }
    let armed = |timers: &mut [Option<Option<u64>>], k: usize, a: Option<Option<u64>>| {
        if a.is_some() {
            timers[k] = a;
        }
    };
    let keys = real.bindings.take(client);
    for &k in &keys {
        let ran = real.run(k, now, set, false, |s, env, host| {
            engine::close(s, env, host, client)
        });
        if let Some((_, out)) = ran {
            delivered.extend(out.delivered);
            events.extend(out.events);
            armed(timers, k, out.armed);
        }
    }
    model.close(client, &keys, now, set);
    for &k in &left {
        let found = match real.states[k] {
            Some(_) => engine::Found::Lock,
            None => engine::Found::Nothing,
        };
        let plan = engine::plan_revisit(true, found, None, real.queues[k].len(), || true);
        if plan == engine::RevisitPlan::Revisit {
            let (_, out) = real
                .run(k, now, set, true, |s, env, host| {
                    engine::revisit(s, env, host, None)
                })
                .expect("revisit runs");
            delivered.extend(out.delivered);
            events.extend(out.events);
            armed(timers, k, out.armed);
            model.keys[k].exists = true;
            model.settle(k, now, set);
        }
    }
    for (k, t) in timers.iter_mut().enumerate() {
        if real.states[k].is_none() {
            *t = None;
        }
    }
    let touched = keys
        .iter()
        .chain(&left)
        .copied()
        .find(|&k| real.states[k].is_some());
    (delivered, events, touched)
}

/// Waits ended in one operation, in id order: which end matters, not in which order (the
/// engine goes by grant, the model by queue).
fn sorted(mut ids: Vec<u64>) -> Vec<u64> {
    ids.sort_unstable();
    ids
}

/// `COPY src dst [REPLACE]` of a lock key, as Redis and the module do it: the copy is the same
/// lock but its bound grants (`keyspace::copy_of`: a binding lives with one connection and one
/// value, G11), replicated as the command (the replica copies its own value); it arrives
/// (`keyspace::arrive`, `Copied`: armed for its next deadline) and is looked at again right
/// after when it holds nothing (a copy of bound grants only) or is waited for. REPLACE drops
/// the value it overwrites, which the bindings index is not told of. Nothing happens when
/// `src` holds no lock or `dst` exists without REPLACE.
#[allow(clippy::too_many_arguments)]
pub(super) fn copy_key(
    real: &mut Server,
    model: &mut Model,
    src: usize,
    dst: usize,
    replace: bool,
    now: Now,
    set: Settings,
    timers: &mut [Option<Option<u64>>],
) -> Option<Done> {
    let source = real.states[src].as_ref()?;
    if real.states[dst].is_some() && !replace {
        return None;
    }
    let mut copy = keyspace::copy_of(source);
    let had_bound = source.grants().iter().any(|g| g.bound());
    real.replica.keys[dst] = real.replica.keys[src].as_ref().map(keyspace::copy_of);
    if real.states[dst].is_some() {
        real.bindings.key_gone(dst);
    }
    let arrived = keyspace::arrive(&mut copy, Arrival::Copied);
    assert!(!arrived.rebind, "a copy rebinds nothing");
    assert!(
        copy.grants().iter().all(|g| !g.bound()),
        "a copy binds nothing"
    );
    real.states[dst] = Some(copy);
    timers[dst] = Some(arrived.next.map(|d| d.mono_us));

    model.seen.copies += 1;
    model.seen.copies_without_bound += usize::from(had_bound);
    let from = &model.keys[src];
    let (mode, delays, last_token) = (from.mode, from.delays.clone(), from.last_token);
    let grants = from.grants.iter().filter(|g| !g.bound).cloned().collect();
    let to = &mut model.keys[dst];
    (to.exists, to.mode, to.grants, to.delays, to.last_token) =
        (true, mode, grants, delays, last_token);

    let (mut delivered, mut events) = (Vec::new(), Vec::new());
    if arrived.look_again || !real.queues[dst].is_empty() {
        let plan = engine::plan_revisit(
            true,
            engine::Found::Lock,
            None,
            real.queues[dst].len(),
            || true,
        );
        assert_eq!(plan, engine::RevisitPlan::Revisit);
        let (_, out) = real
            .run(dst, now, set, false, |s, env, host| {
                engine::revisit(s, env, host, None)
            })
            .expect("the copy exists");
        delivered = out.delivered;
        events = out.events;
        if out.armed.is_some() {
            timers[dst] = out.armed;
        }
        // Onto a name clients wait for: what ran out ends first; the copy's holders may be
        // among the waiters (an owner never both holds and waits: their waits end with nil),
        // and the copy may give the key another limit than its shared waiters' (they are
        // refused); then the key is handed on.
        model.end_due(dst, now, set);
        model.dismiss_holders(dst, now);
        model.refuse_other_limits(dst, now);
        model.settle(dst, now, set);
        assert_eq!(
            sorted(out.dismissed),
            sorted(model.dismissed.clone()),
            "waits ended because their owner holds the copy (engine, model)"
        );
        assert_eq!(
            out.refused, model.refused,
            "waits refused for another limit than the copy's (engine, model)"
        );
        model.seen.holders_dismissed += model.dismissed.len();
        model.seen.limits_refused += model.refused.len();
    }
    if real.states[dst].is_none() {
        timers[dst] = None;
    }
    Some((delivered, events, Some(dst)))
}

/// `RENAME src dst` of a lock key, as Redis and the module do it: the value takes `dst`'s
/// name with its bound grants (their bindings follow: the index moves each entry by key and
/// token), replicated as the command; `dst`'s own value, if any, is dropped (the index is not
/// told of it). The value arrives (`keyspace::arrive`, `Renamed`: armed for its next deadline)
/// and is looked at right after when it holds nothing or is waited for; `src`'s waiters, if
/// any, are handed the free name then, as after DEL. Nothing happens when `src` holds no lock.
pub(super) fn rename_key(
    real: &mut Server,
    model: &mut Model,
    src: usize,
    dst: usize,
    now: Now,
    set: Settings,
    timers: &mut [Option<Option<u64>>],
) -> Option<Done> {
    let mut state = real.states[src].take()?;
    real.replica.keys[dst] = real.replica.keys[src].take();
    if real.states[dst].is_some() {
        real.bindings.key_gone(dst);
    }
    let arrived = keyspace::arrive(&mut state, Arrival::Renamed);
    assert!(arrived.rebind, "a renamed lock's bindings follow it");
    for g in state.grants().iter() {
        if let Some(client) = g.bound_client() {
            real.bindings.moved(client, g.token, src, dst);
        }
    }
    real.states[dst] = Some(state);
    timers[dst] = Some(arrived.next.map(|d| d.mono_us));
    timers[src] = None;

    // The model: the lock moves, each name keeps its waiters.
    let waiting_src = std::mem::take(&mut model.keys[src].queue);
    let waiting_dst = std::mem::take(&mut model.keys[dst].queue);
    model.keys[dst] = std::mem::take(&mut model.keys[src]);
    model.keys[src].queue = waiting_src;
    model.keys[dst].queue = waiting_dst;
    model.seen.renames += 1;

    let (mut delivered, mut events) = (Vec::new(), Vec::new());
    if arrived.look_again || !real.queues[dst].is_empty() {
        let (_, out) = real
            .run(dst, now, set, false, |s, env, host| {
                engine::revisit(s, env, host, None)
            })
            .expect("the renamed lock exists");
        delivered.extend(out.delivered);
        events.extend(out.events);
        if out.armed.is_some() {
            timers[dst] = out.armed;
        }
        model.end_due(dst, now, set);
        model.dismiss_holders(dst, now);
        model.refuse_other_limits(dst, now);
        model.settle(dst, now, set);
        assert_eq!(
            sorted(out.dismissed),
            sorted(model.dismissed.clone()),
            "RENAME: waits ended (engine, model)"
        );
        assert_eq!(
            out.refused, model.refused,
            "RENAME: waits refused (engine, model)"
        );
        model.seen.holders_dismissed += model.dismissed.len();
        model.seen.limits_refused += model.refused.len();
    }
    if !real.queues[src].is_empty() {
        let (_, out) = real
            .run(src, now, set, true, |s, env, host| {
                engine::revisit(s, env, host, None)
            })
            .expect("a revisit of a waited free name creates it");
        delivered.extend(out.delivered);
        events.extend(out.events);
        if out.armed.is_some() {
            timers[src] = out.armed;
        }
        model.keys[src].exists = true;
        model.settle(src, now, set);
    }
    for k in [src, dst] {
        if real.states[k].is_none() {
            timers[k] = None;
        }
    }
    Some((delivered, events, Some(dst)))
}
