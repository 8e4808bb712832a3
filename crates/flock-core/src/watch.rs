//! FLOCK.WATCH and FLOCK.WAITERS: what a watcher is told, and when; who waits, in order.
//!
//! A watcher names pairs of key and token. Token 0 asks "tell me when this key is held";
//! a live token asks "tell me when this grant ends, and how"; any other token is answered at
//! once (`gone`), so a loss that happened before the call is never missed. The rules here
//! decide every answer from the key's state and from the ending events of the operation that
//! changed it ([`crate::engine::Event`] names each ended grant's token); the module keeps the
//! blocked watchers and delivers what these rules say.

use crate::args::{parse_i64, parse_timeout};
use crate::clock::Now;
use crate::engine::Event;
use crate::errors::Fixed;
use crate::state::{Grant, LockState, Mode};

/// The most key and token pairs one WATCH names.
pub const MAX_PAIRS: usize = 64;

/// What a watcher is told about one of its pairs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WatchEvent {
    /// Token 0: the key has a live grant (its oldest).
    Held,
    /// The watched grant ended by RELEASE.
    Released,
    /// Its lease ran out.
    Expired,
    /// REVOKE ended it.
    Revoked,
    /// Its BOUND connection closed.
    Closed,
    /// It ended any other way: DEL, UNLINK, FLUSHALL, eviction, a promotion that orphaned a
    /// bound grant, or a replicated state that no longer holds it.
    Lost,
    /// It was not a live grant when the watch began (ended before, or never issued).
    Gone,
}

impl WatchEvent {
    /// The event's name in the reply.
    pub fn name(self) -> &'static str {
        match self {
            WatchEvent::Held => "held",
            WatchEvent::Released => "released",
            WatchEvent::Expired => "expired",
            WatchEvent::Revoked => "revoked",
            WatchEvent::Closed => "closed",
            WatchEvent::Lost => "lost",
            WatchEvent::Gone => "gone",
        }
    }
}

/// The answer of one pair: `[key, event, owner, token]` (the key is the pair's own).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Fired {
    pub event: WatchEvent,
    /// The grant's owner (`None`: `gone`, whose grant is unknown).
    pub owner: Option<Box<[u8]>>,
    pub token: u64,
}

impl Fired {
    fn of(event: WatchEvent, owner: Option<&[u8]>, token: u64) -> Fired {
        Fired {
            event,
            owner: owner.map(Box::from),
            token,
        }
    }
}

/// Why a WATCH or WAITERS call is malformed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WatchArgError {
    /// Fewer arguments than the arity: Redis's own arity error is sent.
    Arity,
    /// The timeout is not an integer of milliseconds, 0 or more.
    Timeout,
    /// The keys and tokens do not come in pairs.
    Pairs,
    /// More than [`MAX_PAIRS`] pairs.
    TooManyKeys,
    /// A token that is not an integer, 0 or more.
    Token,
    /// WAITERS: an unknown or repeated option.
    Syntax,
    /// WAITERS: COUNT is not a positive integer.
    Count,
}

impl WatchArgError {
    /// The error reply (every one a fixed text of [`crate::errors`]; `Arity` is sent as
    /// Redis's own arity error instead).
    pub fn text(self) -> Fixed {
        match self {
            WatchArgError::Arity => Fixed::Arity,
            WatchArgError::Timeout => Fixed::Timeout,
            WatchArgError::Pairs => Fixed::WatchPairs,
            WatchArgError::TooManyKeys => Fixed::WatchTooManyKeys,
            WatchArgError::Token => Fixed::WatchToken,
            WatchArgError::Syntax => Fixed::Syntax,
            WatchArgError::Count => Fixed::WaitersCount,
        }
    }
}

/// `FLOCK.WATCH timeout key token [key token ...]`, parsed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WatchArgs<'a> {
    /// BLOCK's timeout: milliseconds, 0 = no limit.
    pub timeout_ms: u64,
    /// The pairs in argument order: key, token (0: "tell me when it is held").
    pub pairs: Vec<(&'a [u8], u64)>,
}

/// Parse `argv` (the command name first). Checks in this order: arity, pairing, the number
/// of pairs, the timeout, each token.
pub fn parse_watch<'a>(argv: &[&'a [u8]]) -> Result<WatchArgs<'a>, WatchArgError> {
    let [_, timeout, rest @ ..] = argv else {
        return Err(WatchArgError::Arity);
    };
    if rest.len() < 2 {
        return Err(WatchArgError::Arity);
    }
    if rest.len() % 2 != 0 {
        return Err(WatchArgError::Pairs);
    }
    if rest.len() / 2 > MAX_PAIRS {
        return Err(WatchArgError::TooManyKeys);
    }
    let timeout_ms = parse_timeout(timeout).map_err(|_| WatchArgError::Timeout)?;
    let mut pairs = Vec::with_capacity(rest.len() / 2);
    for pair in rest.chunks_exact(2) {
        let [key, token] = pair else {
            return Err(WatchArgError::Pairs);
        };
        let token = match parse_i64(token) {
            Some(t) if t >= 0 => t as u64,
            _ => return Err(WatchArgError::Token),
        };
        pairs.push((*key, token));
    }
    Ok(WatchArgs { timeout_ms, pairs })
}

/// `FLOCK.WAITERS key [COUNT n]`: the most waiters to list (`None`: all).
pub fn parse_waiters(argv: &[&[u8]]) -> Result<Option<usize>, WatchArgError> {
    match argv {
        [_, _] => Ok(None),
        [_, _, opt, n] if opt.eq_ignore_ascii_case(b"COUNT") => match parse_i64(n) {
            Some(n) if n > 0 => Ok(Some(usize::try_from(n).unwrap_or(usize::MAX))),
            _ => Err(WatchArgError::Count),
        },
        [_] | [] => Err(WatchArgError::Arity),
        _ => Err(WatchArgError::Syntax),
    }
}

/// The key's oldest live grant (the smallest live token).
pub fn oldest_live(state: &LockState, now: Now) -> Option<&Grant> {
    state.live(now).min_by_key(|g| g.token)
}

/// What one pair does when WATCH is called.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum AtCall<'s> {
    /// It answers at once.
    Fire(Fired),
    /// It waits: for a live grant to appear (token 0, `owner` None) or for the grant of
    /// `owner` to end.
    Wait { owner: Option<&'s [u8]> },
}

/// A pair at the call, on the key's state (`None`: no lock key).
pub fn at_call(state: Option<&LockState>, token: u64, now: Now) -> AtCall<'_> {
    if token == 0 {
        return match state.and_then(|s| oldest_live(s, now)) {
            Some(g) => AtCall::Fire(Fired::of(WatchEvent::Held, Some(&*g.owner), g.token)),
            None => AtCall::Wait { owner: None },
        };
    }
    match state.and_then(|s| s.live_grant(token, now)) {
        Some(g) => AtCall::Wait {
            owner: Some(&*g.owner),
        },
        None => AtCall::Fire(Fired::of(WatchEvent::Gone, None, token)),
    }
}

/// The grant an ending event names, and how it ended (`None`: a grant, not an end).
pub fn ended_by(event: Event) -> Option<(u64, WatchEvent)> {
    match event {
        Event::Acquired { .. } => None,
        Event::Released { token, .. } => Some((token, WatchEvent::Released)),
        Event::Expired { token } => Some((token, WatchEvent::Expired)),
        Event::Revoked { token } => Some((token, WatchEvent::Revoked)),
        Event::Closed { token } => Some((token, WatchEvent::Closed)),
    }
}

/// A waiting pair after its key changed: `state` is the key's state now (`None`: no lock
/// key), `ended` the grants the change ended and how ([`ended_by`]). `owner` is the watched
/// grant's owner, as it was at the call. A grant still in the state has not ended (on a
/// replica a lease that looks run out is the master's to end); one that left it without an
/// ending event was `lost`. `watched_on_replica`: the watch began while this server was a
/// replica, where no grant is bound to a connection of this process; a bound grant that ends
/// as `closed` here after a promotion was orphaned by it, not closed by its holder: `lost`.
pub fn after_change(
    state: Option<&LockState>,
    token: u64,
    owner: &[u8],
    ended: &[(u64, WatchEvent)],
    now: Now,
    watched_on_replica: bool,
) -> Option<Fired> {
    if token == 0 {
        let g = state.and_then(|s| oldest_live(s, now))?;
        return Some(Fired::of(WatchEvent::Held, Some(&*g.owner), g.token));
    }
    if let Some(&(_, how)) = ended.iter().find(|(t, _)| *t == token) {
        let how = match how {
            WatchEvent::Closed if watched_on_replica => WatchEvent::Lost,
            how => how,
        };
        return Some(Fired::of(how, Some(owner), token));
    }
    let present = state.is_some_and(|s| s.grants().position_of_token(token).is_some());
    if present {
        return None;
    }
    Some(Fired::of(WatchEvent::Lost, Some(owner), token))
}

/// The pair whose answer is the reply when several fire before it is sent (in one command,
/// one MULTI/EXEC, one script): the first in argument order. `current` is the pair index
/// chosen so far.
pub fn first_in_order(current: Option<usize>, candidate: usize) -> bool {
    current.is_none_or(|c| candidate < c)
}

/// What to do for a watched key that Redis changed (DEL, RENAME away, eviction, MIGRATE, a
/// flush), looked at right after the command.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LookPlan {
    /// Tell its watchers what [`after_change`] says (with no ending events: a grant that
    /// left the key was `lost`).
    Compare,
    /// Unblock its watchers with this error: the key's slot moved to another node, so
    /// whatever happens to it next happens there (never `lost`: the grant lives on there).
    Fail(Fixed),
}

/// The plan for a watched key Redis changed: `gone` when no lock is there now;
/// `serves_stably` (asked only then: it costs a `CLUSTER NODES`) whether this node still
/// serves the key's slot.
pub fn plan_look(gone: bool, serves_stably: impl FnOnce() -> bool) -> LookPlan {
    if gone && !serves_stably() {
        LookPlan::Fail(Fixed::WaitedKeyMoved)
    } else {
        LookPlan::Compare
    }
}

/// A change of the server that matters to watchers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ServerChange {
    /// This server became a replica (`master` false) or a master.
    RoleChanged { master: bool },
    /// Loading began (a restart, DEBUG RELOAD, or on a replica a full sync from its master).
    LoadingStarted { master: bool },
    /// FLUSHDB of `Some(db)` or FLUSHALL is about to free the values.
    FlushStarting { db: Option<i32> },
    /// SWAPDB swapped these databases: every watched key holds another value now.
    DbsSwapped,
}

/// What watchers get on a server change.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ServerStep {
    Nothing,
    /// Unblock every watcher with this error: what they watched is no longer this server's
    /// to tell (not a loss: watch again).
    FailAll(Fixed),
    /// Look at every watched key of `Some(db)` (all: `None`) right after the command.
    LookAll(Option<i32>),
}

/// The step of `change` for watchers.
pub fn on_server_change(change: ServerChange) -> ServerStep {
    match change {
        ServerChange::RoleChanged { master: false } => {
            ServerStep::FailAll(Fixed::UnblockedNowReplica)
        }
        ServerChange::RoleChanged { master: true } => ServerStep::Nothing,
        ServerChange::LoadingStarted { master: false } => {
            ServerStep::FailAll(Fixed::UnblockedResync)
        }
        // A master loads at its start (nobody watches yet) or on DEBUG RELOAD, which keeps
        // the keys as they were.
        ServerChange::LoadingStarted { master: true } => ServerStep::Nothing,
        ServerChange::FlushStarting { db } => ServerStep::LookAll(db),
        ServerChange::DbsSwapped => ServerStep::LookAll(None),
    }
}

/// Whether one more watcher fits on a key that `watching` clients already watch.
pub fn admits(watching: usize, max_watchers: usize) -> bool {
    watching < max_watchers
}

/// A waiting request's `mode` in WAITERS.
pub fn waiter_mode_name(mode: Mode) -> &'static str {
    match mode {
        Mode::Exclusive => "exclusive",
        Mode::Shared => "shared",
        Mode::Permits(_) => "permit",
    }
}

/// One line of WAITERS: `[owner, mode, waited_ms]`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WaiterLine<'a> {
    pub owner: &'a [u8],
    pub mode: &'static str,
    pub waited_ms: u64,
}

/// WAITERS' reply from the queue in order (each request with when it began to wait, on the
/// monotonic clock): at most `count`, first in line first. A replica has no waiters.
pub fn waiters_reply<'a>(
    queue: impl Iterator<Item = (&'a [u8], Mode, u64)>,
    count: Option<usize>,
    master: bool,
    now_mono_us: u64,
) -> Vec<WaiterLine<'a>> {
    if !master {
        return Vec::new();
    }
    queue
        .take(count.unwrap_or(usize::MAX))
        .map(|(owner, mode, since_us)| WaiterLine {
            owner,
            mode: waiter_mode_name(mode),
            waited_ms: now_mono_us.saturating_sub(since_us) / 1000,
        })
        .collect()
}

#[cfg(test)]
mod tests;
