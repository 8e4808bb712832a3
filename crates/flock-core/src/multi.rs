//! FLOCK.MACQUIRE: several exclusive grants at once, all or nothing.
//!
//! `FLOCK.MACQUIRE numkeys key [key ...] owner ttl [BOUND] [BLOCK timeout]`. A key counts as
//! free for the request when it has no live grant of another owner, no running lock-delay slot
//! and nobody waiting ahead; a key the owner already holds exclusively keeps its token (G4,
//! whoever waits behind that grant: a retry after a lost reply must get its tokens back). A key
//! the owner holds in another mode, or already waits for, refuses the whole call.
//!
//! A waiting request stands in the queue of every one of its keys at once (one step, so two
//! requests stand in the same order in every queue they share), is never granted one key alone
//! (the engine names it with [`crate::engine::Effect::TryMulti`] when it is first in line on a
//! free key) and is granted when [`ready`] says so for all its keys together. The grants
//! themselves are ordinary ACQUIREs ([`grant_key`]), run at one instant for every key, so each
//! is replicated, persisted, notified and counted as an ACQUIRE's is.

use crate::args::{parse_acquire, parse_i64, AcquireArgs, ArgError};
use crate::clock::{Deadline, Now};
use crate::engine::{self, BlockRefused, Context, Env, Outcome, Stored, Waiters};
use crate::queue::Waiter;
use crate::state::{Binding, LockState, Mode};

/// The most keys one MACQUIRE names.
pub const MAX_KEYS: usize = 64;

/// `FLOCK.MACQUIRE numkeys key [key ...] owner ttl [BOUND] [BLOCK timeout]`, parsed.
#[derive(Debug, PartialEq, Eq)]
pub struct MacquireArgs<'a> {
    /// The keys in the order given (the tokens come back in this order): a part of argv.
    pub keys: &'a [&'a [u8]],
    /// What follows the keys, as ACQUIRE's arguments (always exclusive).
    pub acquire: AcquireArgs<'a>,
}

/// Parse `argv` (the command name first). Checks in this order: arity, numkeys (1 to
/// [`MAX_KEYS`]), enough arguments after the keys, then what follows the keys as ACQUIRE's
/// arguments (owner, ttl, options: so a wrong numkeys shows as a bad ttl or an unknown
/// option), then the keys (the same key twice is a syntax error). SHARED and LIMIT are
/// unknown options here: every grant of MACQUIRE is exclusive.
pub fn parse_macquire<'a>(
    argv: &'a [&'a [u8]],
    max_ttl_ms: u64,
    max_holders: u32,
) -> Result<MacquireArgs<'a>, ArgError> {
    let [_, numkeys, rest @ ..] = argv else {
        return Err(ArgError::Arity);
    };
    if rest.len() < 3 {
        return Err(ArgError::Arity);
    }
    let n = match parse_i64(numkeys) {
        Some(n) if n >= 1 && n <= MAX_KEYS as i64 => n as usize,
        _ => return Err(ArgError::NumKeys),
    };
    // The keys, then at least owner and ttl.
    if rest.len() < n + 2 {
        return Err(ArgError::Arity);
    }
    let Some(keys) = rest.get(..n) else {
        return Err(ArgError::Arity);
    };
    // ACQUIRE's parser reads argv[2..] (owner, ttl, options) and skips argv[0] and argv[1]
    // (command and key): the slice that starts two before the owner is such an argv, with
    // nothing copied (n >= 1, so it starts at argv[1] or later).
    let Some(as_acquire) = argv.get(n..) else {
        return Err(ArgError::Arity);
    };
    let acquire = parse_acquire(as_acquire, max_ttl_ms, max_holders)?;
    if !acquire.mode.is_exclusive() {
        return Err(ArgError::Syntax);
    }
    for (i, k) in keys.iter().enumerate() {
        if keys[..i].contains(k) {
            return Err(ArgError::Syntax);
        }
    }
    Ok(MacquireArgs { keys, acquire })
}

/// What a MACQUIRE request sees of one of its keys.
#[derive(Clone, Copy, Debug)]
pub struct KeyLook<'s> {
    /// The lock (`None`: no lock key).
    pub state: Option<&'s LockState>,
    /// How many requests wait for the key (a waiting request's own included).
    pub waiting: usize,
    /// At the call: the owner already waits for the key (ACQUIRE ... BLOCK, or another
    /// MACQUIRE). A waiting request: the request itself is first in the key's queue.
    pub owner_in_queue: bool,
}

/// Why a MACQUIRE is refused whole (nothing changes).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Refusal {
    /// The owner holds the key in another mode (`ERR owner already holds ...`).
    Holds(Mode),
    /// The owner already waits for the key (`ERR owner already waits for KEY`).
    Waits,
}

/// What a MACQUIRE does with its keys as they are.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Decision {
    /// Every key is free for it (or already its own): grant them all now.
    Grant,
    /// Some key is not: nil, or wait with BLOCK.
    Busy,
    /// The key at this index refuses the whole call.
    Refused(usize, Refusal),
}

/// Where the owner stands on one key.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Standing {
    /// Its own live exclusive grant: kept, with its token.
    Own,
    Free,
    Busy,
}

/// No live grant and no running delayed slot at `now`, counting the slots that grants which
/// stopped being live leave when the key is settled (lock-delay from the lease's deadline, or
/// from now for a bound grant whose connection is gone, as [`LockState::expire`] leaves them):
/// the key as the settle every grant begins with leaves it.
fn clear(state: &LockState, now: Now, lock_delay_ms: u64) -> bool {
    if state.live_count(now) > 0 || state.active_delays(now) > 0 {
        return false;
    }
    lock_delay_ms == 0
        || state.grants().iter().all(|g| {
            let from = if g.binding() == Binding::Lost && !g.deadline.passed(now) {
                Deadline::after(0, now)
            } else {
                g.deadline
            };
            from.plus(lock_delay_ms).passed(now)
        })
}

/// `look` for `owner` at `now` under `flock.lock-delay-ms` = `lock_delay_ms`;
/// `waiting_request`: the request already waits (then `owner_in_queue` says it is first in
/// line, and it never refuses).
fn standing(
    look: &KeyLook<'_>,
    owner: &[u8],
    now: Now,
    lock_delay_ms: u64,
    waiting_request: bool,
) -> Result<Standing, Refusal> {
    if let Some(state) = look.state {
        if state.owner_grant(owner, now).is_some() {
            if !state.mode.is_exclusive() {
                return if waiting_request {
                    Ok(Standing::Busy)
                } else {
                    Err(Refusal::Holds(state.mode))
                };
            }
            if !waiting_request && look.owner_in_queue {
                return Err(Refusal::Waits);
            }
            return Ok(Standing::Own);
        }
    }
    if !waiting_request && look.owner_in_queue {
        return Err(Refusal::Waits);
    }
    let clear = look.state.is_none_or(|s| clear(s, now, lock_delay_ms));
    let first = if waiting_request {
        look.owner_in_queue
    } else {
        look.waiting == 0
    };
    Ok(if clear && first {
        Standing::Free
    } else {
        Standing::Busy
    })
}

fn decide(
    keys: &[KeyLook<'_>],
    owner: &[u8],
    now: Now,
    lock_delay_ms: u64,
    waiting_request: bool,
) -> Decision {
    let mut busy = false;
    for (i, look) in keys.iter().enumerate() {
        match standing(look, owner, now, lock_delay_ms, waiting_request) {
            Err(why) => return Decision::Refused(i, why),
            Ok(Standing::Busy) => busy = true,
            Ok(Standing::Own | Standing::Free) => {}
        }
    }
    if busy {
        Decision::Busy
    } else {
        Decision::Grant
    }
}

/// MACQUIRE at the call, on its keys in the order given: a refusal on any key first (the
/// first such key in order), else grant when every key is free for `owner` or its own.
/// `lock_delay_ms`: `flock.lock-delay-ms` (a lease that ran out but was not yet ended leaves a
/// delayed slot when the key is settled).
pub fn at_call(keys: &[KeyLook<'_>], owner: &[u8], now: Now, lock_delay_ms: u64) -> Decision {
    decide(keys, owner, now, lock_delay_ms, false)
}

/// A waiting MACQUIRE request, when a key of it came free: granted when, on every key, it
/// holds the key already or is first in line on a key with no live grant and no running
/// lock-delay slot. Never refused (only [`Decision::Grant`] or [`Decision::Busy`]).
pub fn ready(keys: &[KeyLook<'_>], owner: &[u8], now: Now, lock_delay_ms: u64) -> Decision {
    decide(keys, owner, now, lock_delay_ms, true)
}

/// The server's context with the clocks read once for the whole MACQUIRE: every key is
/// decided and granted at the same instant (a lease that ran out between two keys must not
/// hand a key to someone else after [`at_call`] or [`ready`] counted it as the owner's).
struct AtInstant<'c, C> {
    cx: &'c mut C,
    now: Now,
}

impl<C: Context> Context for AtInstant<'_, C> {
    fn master(&self) -> bool {
        self.cx.master()
    }
    fn mono_us(&mut self) -> u64 {
        self.now.mono_us
    }
    fn env(&mut self) -> Env<'_> {
        let mut env = self.cx.env();
        env.now = self.now;
        env
    }
}

/// The key's queue as a request first in line sees it: nobody ahead (those behind it wait
/// on). Nothing is handed on and nobody blocks through it.
struct FirstInLine<'w, W>(&'w mut W);

impl<W: Waiters> Waiters for FirstInLine<'_, W> {
    fn waiting(&mut self) -> usize {
        0
    }
    fn waiting_mode(&mut self) -> Option<Mode> {
        None
    }
    fn next_waiter_if(&mut self, _fits: &mut dyn FnMut(&Waiter) -> bool) -> Option<Waiter> {
        None
    }
    fn deliver(&mut self, waiter: &Waiter, token: u64) -> bool {
        self.0.deliver(waiter, token)
    }
    fn dismiss(&mut self, _owner: &[u8]) -> bool {
        // Nobody is seen waiting ahead or behind, so nobody is dismissed through it.
        false
    }
    fn refuse_other_limits(&mut self, _limit: Mode) -> usize {
        // MACQUIRE grants exclusive locks only, and nobody is seen waiting through it.
        0
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

/// Grant one key of a MACQUIRE that [`at_call`] or [`ready`] found grantable at `now`: an
/// ordinary exclusive ACQUIRE at that instant, with nobody counted ahead of the request (it
/// is first in line, or the key's queue is empty, or the owner holds the key). Its reply is
/// the key's token (the owner's own kept, else a new one); its effects are an ACQUIRE's.
pub fn grant_key(
    stored: Stored<'_>,
    cx: &mut impl Context,
    w: &mut impl Waiters,
    args: &AcquireArgs<'_>,
    bind_to: Option<u64>,
    now: Now,
) -> Outcome {
    let mut cx = AtInstant { cx, now };
    engine::acquire(stored, &mut cx, &mut FirstInLine(w), args, false, bind_to)
}

#[cfg(test)]
mod tests;
