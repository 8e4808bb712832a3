//! What an operation is given and what it gives back: the key as the store holds it, and the
//! reply with the effects and the key's fate that the module's one executor carries out.

use super::{Effect, LoneGrant, Reply};
use crate::snapshot::Snapshot;
use crate::state::{Grant, LockState, Mode};
use smallvec::SmallVec;

/// The lock under a key as the store holds it, for one operation.
#[derive(Debug)]
pub enum Stored<'s> {
    /// No lock: the key does not exist.
    Free,
    /// The key's whole state is one grant, read in place (the store's compact form).
    Lone(LoneGrant<'s>),
    /// Any state, changed in place.
    Full(&'s mut LockState),
}

/// What becomes of the stored lock (unless the effects delete the key).
#[derive(Debug, PartialEq, Eq)]
pub enum KeyFate {
    /// It stays as the operation left it: a full state changed in place, or a lone grant
    /// nothing changed.
    Keep,
    /// The key's lock is this state now (made for the operation: decoded from a lone grant,
    /// or new); the store keeps it in the form that fits.
    Store(LockState),
    /// A free key is held by this grant alone now (stored in the compact form at once).
    StoreLone { grant: Grant, mode: Mode },
}

/// The effects of one operation, in order. Four fit inline (a grant of a free key has three
/// or four, a release three: the hot paths move as little as they can); an operation that
/// ends leases or hands the key on spills to the heap.
/// Beside them, the states an [`Effect::ReplicateSoFar`] sends (rare: only an operation that
/// found leases to end or waiters to grant before its own step keeps one).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Effects {
    list: SmallVec<[Effect; 4]>,
    so_far: Vec<LockState>,
}

impl Effects {
    #[inline]
    pub fn push(&mut self, effect: Effect) {
        self.list.push(effect);
    }

    /// The effects are the first `len` of `list` (at most four), written in place: what the
    /// fast paths name, in one write instead of pushes (`SmallVec::push`, which the compiler
    /// keeps out of line, costs a call and a capacity check each). The slots past `len` are
    /// never read. Only the list is replaced (its drop is a check; the whole `Effects`' drop
    /// was a call): for an `Effects` with no state so far, as the fast paths' are.
    #[inline(always)]
    pub(super) fn set_inline(&mut self, list: [Effect; 4], len: usize) {
        self.list = SmallVec::from_buf_and_len(list, len.min(4));
    }

    /// Push [`Effect::ReplicateSoFar`] of `state` as it is now (a state past the 256th of
    /// one operation, which no operation reaches, is sent as the final one).
    pub fn push_state_so_far(&mut self, state: &LockState) {
        match u8::try_from(self.so_far.len()) {
            Ok(n) => {
                self.so_far.push(state.clone());
                self.list.push(Effect::ReplicateSoFar(n));
            }
            Err(_) => self.list.push(Effect::Replicate),
        }
    }

    /// The state an [`Effect::ReplicateSoFar`] of `n` sends.
    pub fn state_so_far(&self, n: u8) -> Option<&LockState> {
        self.so_far.get(usize::from(n))
    }

    #[inline]
    pub fn as_slice(&self) -> &[Effect] {
        &self.list
    }

    pub fn len(&self) -> usize {
        self.list.len()
    }

    pub fn is_empty(&self) -> bool {
        self.list.is_empty()
    }

    /// Whether the key is to be deleted once the operation is over.
    pub fn deletes_key(&self) -> bool {
        self.list.contains(&Effect::DeleteKey)
    }
}

/// An operation's result.
#[derive(Debug, PartialEq, Eq)]
pub struct Outcome {
    pub reply: Reply<'static>,
    pub effects: Effects,
    pub fate: KeyFate,
}

impl Outcome {
    /// `reply`, no effect, the key kept as it is.
    #[inline(always)]
    pub fn keep(reply: Reply<'static>) -> Outcome {
        Outcome {
            reply,
            effects: Effects::default(),
            fate: KeyFate::Keep,
        }
    }
}

impl KeyFate {
    /// The key's state when the fate is a new one (`None`: [`KeyFate::Keep`]).
    pub fn into_state(self) -> Option<LockState> {
        match self {
            KeyFate::Keep => None,
            KeyFate::Store(state) => Some(state),
            KeyFate::StoreLone { grant, mode } => Some(LockState::with_grant(mode, grant)),
        }
    }

    /// What [`Effect::Replicate`] sends, given the stored state the operation left when the
    /// fate is [`KeyFate::Keep`] (`kept`). A lone grant of a shared key is sent whole, as a
    /// state of one grant (`STATE`). `None`: nothing to send (a state of no grant and no
    /// delayed slot is never replicated: the key's deletion is).
    pub fn snapshot_with<'a>(
        &'a self,
        kept: Option<&'a LockState>,
        scratch: &'a mut Option<LockState>,
    ) -> Option<Snapshot<'a>> {
        match self {
            KeyFate::Keep => kept.and_then(Snapshot::of),
            KeyFate::Store(state) => Snapshot::of(state),
            KeyFate::StoreLone { grant, mode } if mode.is_exclusive() => {
                Some(Snapshot::Held(grant))
            }
            KeyFate::StoreLone { grant, mode } => {
                let state = scratch.insert(LockState::with_grant(*mode, grant.clone()));
                Snapshot::of(state)
            }
        }
    }
}

/// Run `op` on the whole state of the key: the full form's own (changed in place), or one
/// made for the operation (decoded from the one grant, or empty for a free key), which
/// becomes the key's state afterwards.
#[inline]
pub(super) fn with_state<R>(
    stored: Stored<'_>,
    op: impl FnOnce(&mut LockState) -> R,
) -> (R, KeyFate) {
    match stored {
        Stored::Full(state) => (op(state), KeyFate::Keep),
        Stored::Lone(lone) => {
            let mut state = lone.state();
            let r = op(&mut state);
            (r, KeyFate::Store(state))
        }
        Stored::Free => {
            let mut state = LockState::default();
            let r = op(&mut state);
            (r, KeyFate::Store(state))
        }
    }
}
