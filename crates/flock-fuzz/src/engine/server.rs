//! The engine's side: a host that plays the server (keyspace, wait queues, a replica fed by
//! the replicated effects over the wire) and runs operations as the module's executor does.

use super::bound::Bindings;
use super::model::Settings;
use super::KEY_NAMES;
use flock_core::apply;
use flock_core::args::{self, AcquireArgs};
use flock_core::engine::{self, BlockRefused, Effect, Env, Event, Host, Reply};
use flock_core::state::Mode;
use flock_core::{LockState, Now, TokenIssuer, WaitQueue, Waiter};

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

/// The host of a replica applying its master's effect: it only passes the effect on.
pub(super) struct ReplicaHost {
    pub(super) verbatim: usize,
}

impl Host for ReplicaHost {
    fn effect(&mut self, e: Effect<'_>) {
        assert_eq!(e, Effect::ReplicateVerbatim, "a replica applying an effect");
        self.verbatim += 1;
    }
    fn waiting(&mut self) -> usize {
        0
    }
    fn waiting_mode(&mut self) -> Option<Mode> {
        None
    }
    fn next_waiter_if(&mut self, _: &mut dyn FnMut(&Waiter) -> bool) -> Option<Waiter> {
        None
    }
    fn deliver(&mut self, _: &Waiter, _: u64) -> bool {
        panic!("a replica hands nothing off")
    }
    fn block(&mut self, _: &AcquireArgs<'_>, _: u64, _: Option<u64>) -> Result<(), BlockRefused> {
        panic!("a replica blocks nobody")
    }
}

/// The host of one operation on key `k`.
pub(super) struct KeyHost<'s> {
    pub(super) key: &'static [u8],
    pub(super) queue: &'s mut WaitQueue,
    pub(super) replica: &'s mut Option<LockState>,
    pub(super) replica_tokens: &'s mut TokenIssuer,
    pub(super) vanished: &'s [u64],
    pub(super) next_waiter: &'s mut u64,
    pub(super) now: Now,
    pub(super) max_waiters: usize,
    /// (waiter id, token) handed over in this operation.
    pub(super) delivered: Vec<(u64, u64)>,
    pub(super) blocked: Option<u64>,
    /// The last timer the operation armed (its monotonic time; `None` inside: disarmed).
    pub(super) armed: Option<Option<u64>>,
    pub(super) deleted: bool,
    pub(super) deleted_then_touched: bool,
    /// The keyspace notifications of the operation.
    pub(super) events: Vec<Event>,
    /// The `Bind` (true) and `Unbind` effects, as (client, token, bind).
    pub(super) binds: Vec<(u64, u64, bool)>,
}

impl Host for KeyHost<'_> {
    fn effect(&mut self, e: Effect<'_>) {
        if self.deleted {
            self.deleted_then_touched = true;
        }
        match e {
            // The replica gets the effect over the wire: argv, parsed, applied (G7).
            Effect::Replicate(s) => {
                // Written by the encoder the module replicates with, read by its decoder.
                let argv = apply::apply_argv(self.key, s);
                let refs: Vec<&[u8]> = argv.iter().map(|a| &a[..]).collect();
                let image = args::parse_apply(&refs)
                    .unwrap_or_else(|e| panic!("a replicated effect parses: {e:?} {s:?}"));
                assert_eq!(image, s.image(), "FLOCK.APPLY carries the snapshot's image");
                let state = self.replica.get_or_insert_with(LockState::default);
                let mut env = Env {
                    now: self.now,
                    lock_delay_ms: 0,
                    max_holders: 1,
                    master: false,
                    tokens: self.replica_tokens,
                };
                let mut host = ReplicaHost { verbatim: 0 };
                assert_eq!(engine::apply(state, &mut env, &mut host, image), Reply::Ok);
                assert_eq!(host.verbatim, 1, "the effect goes on to the replica's AOF");
            }
            Effect::ReplicateDelete => *self.replica = None,
            Effect::DeleteKey => self.deleted = true,
            Effect::Arm(d) => self.armed = Some(d.map(|d| d.mono_us)),
            Effect::Notify(e) => self.events.push(e),
            Effect::Bind { client, token } => self.binds.push((client, token, true)),
            Effect::Unbind { client, token } => self.binds.push((client, token, false)),
            Effect::Count(_) | Effect::ReplicateVerbatim => {}
        }
    }
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

/// What one operation did, besides its reply.
pub(super) struct Outcome {
    pub(super) delivered: Vec<(u64, u64)>,
    pub(super) blocked: Option<u64>,
    pub(super) armed: Option<Option<u64>>,
    pub(super) events: Vec<Event>,
}

impl Server {
    /// Run `op` on key `k` the way the module's executor does: on the stored state (or a
    /// fresh one when `create`), deleting the key when the engine says so. `None`: the key
    /// does not exist and nothing ran.
    pub(super) fn run(
        &mut self,
        k: usize,
        now: Now,
        set: Settings,
        create: bool,
        op: impl FnOnce(&mut LockState, &mut Env<'_>, &mut KeyHost<'_>) -> Reply<'static>,
    ) -> Option<(Reply<'static>, Outcome)> {
        if self.states[k].is_none() && !create {
            return None;
        }
        let state = self.states[k].get_or_insert_with(LockState::default);
        let mut host = KeyHost {
            key: KEY_NAMES[k],
            queue: &mut self.queues[k],
            replica: &mut self.replica.keys[k],
            replica_tokens: &mut self.replica.tokens,
            vanished: &self.vanished,
            next_waiter: &mut self.next_waiter,
            now,
            max_waiters: set.max_waiters,
            delivered: Vec::new(),
            blocked: None,
            armed: None,
            deleted: false,
            deleted_then_touched: false,
            events: Vec::new(),
            binds: Vec::new(),
        };
        let mut env = Env {
            now,
            lock_delay_ms: set.lock_delay_ms,
            max_holders: set.max_holders,
            master: true,
            tokens: &mut self.tokens,
        };
        let reply = op(state, &mut env, &mut host);
        assert!(!host.deleted_then_touched, "an effect after DeleteKey");
        for &(client, token, bind) in &host.binds {
            match bind {
                true => self.bindings.bind(client, k, token),
                false => self.bindings.unbind(client, k, token),
            }
        }
        let (deleted, outcome) = (
            host.deleted,
            Outcome {
                delivered: host.delivered,
                blocked: host.blocked,
                armed: host.armed,
                events: host.events,
            },
        );
        if deleted {
            self.states[k] = None;
        }
        Some((reply, outcome))
    }
}
