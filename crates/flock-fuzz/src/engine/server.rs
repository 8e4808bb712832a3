//! The engine's side: a host that plays the server (keyspace, wait queues, a replica fed by
//! the replicated effects over the wire) and runs operations as the module's executor does.

use super::bound::Bindings;
use super::model::Settings;
use super::{KEYS, KEY_NAMES};
use flock_core::apply;
use flock_core::args::{self, AcquireArgs};
use flock_core::engine::{
    self, BlockRefused, Effect, Env, Event, KeyFate, LoneGrant, Outcome, Reply, Stored, Waiters,
};
use flock_core::state::Mode;
use flock_core::{LockState, Now, Snapshot, TokenIssuer, WaitQueue, Waiter};

/// A replica: the keys as the applied `FLOCK.APPLY` effects left them, and its own token mark.
pub(super) struct Replica {
    pub(super) keys: Vec<Option<LockState>>,
    pub(super) tokens: TokenIssuer,
}

pub(super) struct Server {
    /// The keyspace: `None` when the key does not exist.
    pub(super) states: Vec<Option<LockState>>,
    pub(super) queues: Vec<WaitQueue>,
    pub(super) tokens: TokenIssuer,
    pub(super) replica: Replica,
    pub(super) vanished: Vec<u64>,
    pub(super) next_waiter: u64,
    /// The module's bindings index (BOUND), fed by the engine's `Bind`/`Unbind` effects.
    pub(super) bindings: Bindings,
}

/// The host of one operation on key `k`.
pub(super) struct KeyHost<'s> {
    pub(super) queue: &'s mut WaitQueue,
    pub(super) vanished: &'s [u64],
    pub(super) next_waiter: &'s mut u64,
    pub(super) max_waiters: usize,
    /// (waiter id, token) handed over in this operation.
    pub(super) delivered: Vec<(u64, u64)>,
    pub(super) blocked: Option<u64>,
    /// Waiters whose wait ended with nil in this operation (their owner holds the key).
    pub(super) dismissed: Vec<u64>,
    /// Waiters refused in this operation: their limit is not the key's (given here).
    pub(super) refused: Vec<(u64, Mode)>,
}

impl Waiters for KeyHost<'_> {
    fn waiting(&mut self) -> usize {
        self.queue.len()
    }
    fn waiting_mode(&mut self) -> Option<Mode> {
        self.queue.shared_mode()
    }
    fn next_waiter_if(&mut self, fits: &mut dyn FnMut(&Waiter) -> bool) -> Option<Waiter> {
        self.queue.pop_if(fits)
    }
    fn deliver(&mut self, w: &Waiter, token: u64) -> bool {
        if self.vanished.contains(&w.id) {
            return false;
        }
        self.delivered.push((w.id, token));
        true
    }
    fn dismiss(&mut self, owner: &[u8]) -> bool {
        let Some(w) = self.queue.take_owner(owner) else {
            return false;
        };
        self.dismissed.push(w.id);
        true
    }
    fn refuse_other_limits(&mut self, limit: Mode) -> usize {
        let out = self.queue.take_other_limits(limit);
        self.refused.extend(out.iter().map(|w| (w.id, limit)));
        out.len()
    }
    fn block(
        &mut self,
        args: &AcquireArgs<'_>,
        _timeout_ms: u64,
        bind_to: Option<u64>,
    ) -> Result<(), BlockRefused> {
        // As the module does: the limit of waiters does not stop an owner's retried wait.
        if self.queue.len() >= self.max_waiters && !self.queue.has_owner(args.owner) {
            return Err(BlockRefused::TooMany);
        }
        *self.next_waiter += 1;
        let id = *self.next_waiter;
        let replaced = self.queue.push(Waiter {
            id,
            owner: args.owner.into(),
            ttl_ms: args.ttl_ms,
            mode: args.mode,
            bind_to,
            multi: false,
        });
        if let Some(r) = replaced {
            assert_eq!(
                *r.owner, *args.owner,
                "only the owner's own wait is replaced"
            );
        }
        self.blocked = Some(id);
        Ok(())
    }
}

/// What one operation did to the queue and the timer, besides its reply.
pub(super) struct Ran {
    pub(super) delivered: Vec<(u64, u64)>,
    /// Waiters answered nil because their owner holds the key.
    pub(super) dismissed: Vec<u64>,
    /// Waiters refused because their limit is not the key's (given here).
    pub(super) refused: Vec<(u64, Mode)>,
    pub(super) blocked: Option<u64>,
    pub(super) armed: Option<Option<u64>>,
    pub(super) events: Vec<Event>,
    /// The waiting MACQUIRE requests the engine named first in line on the free key, to be
    /// tried on all their keys right after (`multi_block.rs`).
    pub(super) try_multi: Vec<u64>,
}

/// Send `snapshot` of key `key` to the replica over the wire, as the module does: written by
/// the encoder the module replicates with, read by its decoder, applied (G7).
fn replicate(
    key: &[u8],
    snapshot: Snapshot<'_>,
    replica: &mut Option<LockState>,
    tokens: &mut TokenIssuer,
    now: Now,
) {
    let argv = apply::apply_argv(key, snapshot);
    let refs: Vec<&[u8]> = argv.iter().map(|a| &a[..]).collect();
    let image = args::parse_apply(&refs)
        .unwrap_or_else(|e| panic!("a replicated effect parses: {e:?} {snapshot:?}"));
    assert_eq!(
        image,
        snapshot.image(),
        "FLOCK.APPLY carries the snapshot's image"
    );
    let mut env = Env {
        now,
        lock_delay_ms: 0,
        max_holders: 1,
        master: false,
        tokens,
    };
    let stored = match replica.as_mut() {
        Some(state) => Stored::Full(state),
        None => Stored::Free,
    };
    let out = engine::apply(stored, &mut env, image);
    assert_eq!(out.reply, Reply::Ok);
    assert_eq!(
        out.effects.as_slice(),
        [Effect::ReplicateVerbatim],
        "the effect goes on to the replica's AOF"
    );
    match out.fate {
        KeyFate::Store(state) => *replica = Some(state),
        KeyFate::Keep => {}
        KeyFate::StoreLone { .. } => panic!("APPLY stores a whole state"),
    }
}

impl Server {
    /// A server with no key, no waiter and a fresh token mark (and its replica's).
    pub(super) fn empty() -> Self {
        Server {
            states: vec![None; KEYS],
            queues: vec![WaitQueue::default(); KEYS],
            tokens: TokenIssuer::new(),
            replica: Replica {
                keys: vec![None; KEYS],
                tokens: TokenIssuer::new(),
            },
            vanished: Vec::new(),
            next_waiter: 0,
            bindings: Bindings::default(),
        }
    }

    /// Run `op` on key `k` the way the module's executor does: on the key as its store holds
    /// it (its one grant read in place when that is all it is and nobody waits: the compact
    /// form; else its whole state; `Free` when there is none, which only `create` runs on),
    /// then carry out the outcome in order and keep the key's fate, deleting the key when the
    /// engine says so. `None`: the key does not exist and nothing ran.
    pub(super) fn run(
        &mut self,
        k: usize,
        now: Now,
        set: Settings,
        create: bool,
        op: impl FnOnce(Stored<'_>, &mut Env<'_>, &mut KeyHost<'_>) -> Outcome,
    ) -> Option<(Reply<'static>, Ran)> {
        if self.states[k].is_none() && !create {
            return None;
        }
        let mut host = KeyHost {
            queue: &mut self.queues[k],
            vanished: &self.vanished,
            next_waiter: &mut self.next_waiter,
            max_waiters: set.max_waiters,
            delivered: Vec::new(),
            blocked: None,
            dismissed: Vec::new(),
            refused: Vec::new(),
        };
        let mut env = Env {
            now,
            lock_delay_ms: set.lock_delay_ms,
            max_holders: set.max_holders,
            master: true,
            tokens: &mut self.tokens,
        };
        let lone = self.states[k]
            .as_ref()
            .filter(|_| host.queue.is_empty())
            .and_then(LockState::lone_grant)
            .map(|(mode, g)| (mode, g.clone()));
        let out = match (&lone, self.states[k].as_mut()) {
            (Some((mode, g)), _) => op(Stored::Lone(LoneGrant::of(*mode, g)), &mut env, &mut host),
            (None, Some(state)) => op(Stored::Full(state), &mut env, &mut host),
            (None, None) => op(Stored::Free, &mut env, &mut host),
        };
        let mut outcome = Ran {
            delivered: host.delivered,
            dismissed: host.dismissed,
            refused: host.refused,
            blocked: host.blocked,
            armed: None,
            events: Vec::new(),
            try_multi: Vec::new(),
        };
        // The effects, in order.
        let mut deleted = false;
        let mut scratch = None;
        for &e in out.effects.as_slice() {
            assert!(!deleted, "an effect after DeleteKey: {:?}", out.effects);
            match e {
                Effect::Replicate | Effect::ReplicateSoFar(_) => {
                    let snapshot = match e {
                        Effect::ReplicateSoFar(n) => {
                            out.effects.state_so_far(n).and_then(Snapshot::of)
                        }
                        _ => out
                            .fate
                            .snapshot_with(self.states[k].as_ref(), &mut scratch),
                    };
                    let snapshot = snapshot.unwrap_or_else(|| {
                        panic!("a replication with nothing to send: {:?}", out.effects)
                    });
                    replicate(
                        KEY_NAMES[k],
                        snapshot,
                        &mut self.replica.keys[k],
                        &mut self.replica.tokens,
                        now,
                    );
                }
                Effect::ReplicateDelete => self.replica.keys[k] = None,
                Effect::DeleteKey => deleted = true,
                Effect::Arm(d) => outcome.armed = Some(d.map(|d| d.mono_us)),
                Effect::Notify(e) => outcome.events.push(e),
                // The module's bindings index, fed as the module feeds it.
                Effect::Bind { client, token } => self.bindings.bind(client, k, token),
                Effect::Unbind { client, token } => self.bindings.unbind(client, k, token),
                Effect::TryMulti { waiter } => outcome.try_multi.push(waiter),
                Effect::Count(_) | Effect::ReplicateVerbatim => {}
            }
        }
        let reply = out.reply;
        if let Some(state) = out.fate.into_state() {
            self.states[k] = Some(state);
        }
        if deleted {
            self.states[k] = None;
        }
        Some((reply, outcome))
    }
}
