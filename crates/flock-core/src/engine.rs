//! The lock engine: every operation on one lock key, in the order the contract needs.
//!
//! Each operation takes the key as the store holds it ([`Stored`]: no lock, its one grant
//! read in place, or its whole state), a [`Context`] (the role, the clocks, the settings, the
//! token issuer) and the key's [`Waiters`], and returns an [`Outcome`]: the reply, the
//! [`Effects`] to carry out in order (keyspace notifications, counters, replication, deleting
//! the key, arming its timer, bindings) and what becomes of the stored lock ([`KeyFate`]).
//! The Redis module's one executor carries the outcome out; it decides nothing. The fuzzer
//! and the table tests run the same operations and check their outcomes.
//!
//! The two operations most locks see are answered without building a [`LockState`](crate::state::LockState) when the
//! key is that simple (`lone.rs`: ACQUIRE of a free key, RELEASE of a one-grant key); every
//! other case goes the general way. Effects are values in a buffer with room for eight
//! inline, so the hot path allocates nothing.
//!
//! One file per concern: `effect.rs` (what an operation causes), `settle.rs` (the steps every
//! write is made of), one file per command (`acquire.rs`, `release.rs`, `renew.rs`,
//! `revoke.rs`, `read.rs` for the read-only ones), `upkeep.rs` (timers and closed
//! connections), `revisit.rs` (a waited key something happened to), `apply.rs` (a state from
//! outside), `outcome.rs` (what an operation returns).

use crate::args::AcquireArgs;
use crate::clock::Now;
use crate::queue::Waiter;
use crate::state::Mode;
use crate::tokens::TokenIssuer;

/// What an operation needs besides the key's state.
pub struct Env<'t> {
    /// The clocks, read once per command.
    pub now: Now,
    /// `flock.lock-delay-ms`: after an expiry or a revoke, a slot stays taken this long.
    pub lock_delay_ms: u64,
    /// `flock.max-holders`: most live shared grants on one key.
    pub max_holders: u32,
    /// Only a master ends leases, hands keys off, deletes keys and arms timers on its own; a
    /// replica follows its master's effects (G7).
    pub master: bool,
    /// The server-wide token issuer (G3).
    pub tokens: &'t mut TokenIssuer,
}

/// Why the caller could not wait for the key.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BlockRefused {
    /// `flock.max-waiters` clients already wait for it.
    TooMany,
    /// The server would not block the client.
    Failed,
}

/// The wait queue of the key an operation runs on, as the server keeps it: what the engine
/// asks of it and does to it while it decides (who waits, who is next, hand the key to a
/// waiter, make the caller wait). Everything else an operation causes is an [`Effect`] in
/// its [`Outcome`].
pub trait Waiters {
    /// How many requests wait for this key.
    fn waiting(&mut self) -> usize;
    /// The mode of the shared requests waiting for this key, if any wait (they all have the
    /// key's limit).
    fn waiting_mode(&mut self) -> Option<Mode>;
    /// The first waiter of this key, taken off its queue when `fits` says it can be granted
    /// now; `None` when nobody waits or the first one does not fit.
    fn next_waiter_if(&mut self, fits: &mut dyn FnMut(&Waiter) -> bool) -> Option<Waiter>;
    /// Hand the key to `waiter` with `token`; false when the waiter is gone (it left between
    /// its queueing and now), and the grant must be taken back.
    fn deliver(&mut self, waiter: &Waiter, token: u64) -> bool;
    /// `owner`'s request waiting for this key, if any, leaves the queue and is answered nil:
    /// the owner came to hold the key another way (a value holding its grant arrived under
    /// the key's name), and an owner never both holds and waits. Returns whether one left.
    fn dismiss(&mut self, owner: &[u8]) -> bool;
    /// Every shared request waiting for this key with another limit than `limit` leaves the
    /// queue, answered [`ReplyError::LimitMismatch`]`(limit)`: a value that arrived under the
    /// key's name gave the key that limit. Returns how many left.
    fn refuse_other_limits(&mut self, limit: Mode) -> usize;
    /// Make the caller wait for this key (BLOCK) with the request `args`; `timeout_ms` 0 waits
    /// without limit. An earlier request of the same owner leaves the queue (it gets nil).
    /// `bind_to`: with BOUND, the connection the grant is to live with.
    fn block(
        &mut self,
        args: &AcquireArgs<'_>,
        timeout_ms: u64,
        bind_to: Option<u64>,
    ) -> Result<(), BlockRefused>;
}

/// What an operation asks of the server it runs on: the role, the clocks and the token
/// issuer. [`Context::env`] is asked only when the operation needs it: RELEASE of a lone
/// grant needs only the role and the monotonic clock, which saves the server a wall-clock
/// read and the token issuer's lock on the hottest path there is. An [`Env`] is a context
/// too (tests, the fuzzer).
pub trait Context {
    /// Whether this server is a master (only a master ends leases, hands keys off, deletes
    /// keys and arms timers on its own; a replica follows its master's effects, G7).
    fn master(&self) -> bool;
    /// The monotonic clock now, in microseconds (as [`Now::mono_us`]).
    fn mono_us(&mut self) -> u64;
    /// Everything else: both clocks, the settings, the token issuer.
    fn env(&mut self) -> Env<'_>;
}

impl Context for Env<'_> {
    fn master(&self) -> bool {
        self.master
    }
    fn mono_us(&mut self) -> u64 {
        self.now.mono_us
    }
    fn env(&mut self) -> Env<'_> {
        Env {
            now: self.now,
            lock_delay_ms: self.lock_delay_ms,
            max_holders: self.max_holders,
            master: self.master,
            tokens: self.tokens,
        }
    }
}

mod acquire;
mod apply;
mod effect;
mod lone;
mod outcome;
mod read;
mod release;
mod renew;
mod reply;
mod revisit;
mod revoke;
mod settle;
#[cfg(test)]
mod tests;
mod upkeep;

pub use acquire::{acquire, acquire_into};
pub use apply::{apply, load};
pub use effect::{Count, Effect, Event};
pub use lone::LoneGrant;
pub use outcome::{Effects, KeyFate, Outcome, Stored};
pub use read::{check, holders, info};
pub use release::{release, release_into};
pub use renew::renew;
pub use reply::{Info, Reply, ReplyError};
pub use revisit::{plan_revisit, revisit, Found, RevisitPlan};
pub use revoke::revoke;
pub use upkeep::{close, expire, orphan_bound};

use outcome::with_state;
// The steps and the operations on a whole state, for the table tests and the fast paths'
// tests that compare against them.
#[allow(unused_imports)]
use {
    acquire::acquire_state,
    apply::apply_state,
    release::release_state,
    renew::renew_state,
    revisit::revisit_state,
    revoke::revoke_state,
    settle::*,
    upkeep::{close_state, expire_state},
};
