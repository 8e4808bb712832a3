//! One grant: who holds it, with which token, until when (on both clocks), and its binding
//! (BOUND). A leaf of the engine: the grants of a key (`grants.rs`) and the key's state
//! (`state.rs`) are built from it.

use crate::clock::{Deadline, Now};
use smallvec::SmallVec;

/// Which connection a BOUND grant lives with, on this server (never persisted or replicated:
/// RDB, AOF, effects and DUMP carry only the grant's `bound` mark).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Binding {
    /// Not bound here: an unbound grant, or a bound one on a replica (which follows its
    /// master), or one just loaded on a master and not yet looked at.
    #[default]
    None,
    /// Bound to the client connection with this id.
    Client(u64),
    /// A bound grant whose connection closed, or that arrived on a master with no binding
    /// (restart, RESTORE, promotion): not live from that moment; ended by the next settle.
    Lost,
}

/// A grant's owner: inline up to 40 bytes (a UUID, a host and pid), so that a grant, and a
/// lock record holding one, needs no allocation of its own for it.
pub type Owner = SmallVec<[u8; 40]>;

/// One continuous holding of a key by one owner.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Grant {
    pub owner: Owner,
    pub token: u64,
    pub deadline: Deadline,
    /// When this process saw the grant start, on its monotonic clock: what FLOCK.STATS
    /// measures hold times from. Not persisted: a grant loaded or replicated starts counting
    /// when it arrives.
    pub since_mono_us: u64,
    /// The BOUND mark (persisted and replicated) and the binding (this server's only), in
    /// one word: see [`Tie`].
    tie: Tie,
}

/// A grant's BOUND mark and binding packed in one word (a grant is in every lock record, so
/// its size is the lock's): bit 63 is the mark; the other bits are 0 (no binding), all ones
/// (lost) or a client id (Redis's ids count up from 1 and never reach 2^63 - 1).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
struct Tie(u64);

impl Tie {
    const MARK: u64 = 1 << 63;
    const LOST: u64 = Tie::MARK - 1;

    fn bound(self) -> bool {
        self.0 & Tie::MARK != 0
    }

    fn binding(self) -> Binding {
        match self.0 & !Tie::MARK {
            0 => Binding::None,
            Tie::LOST => Binding::Lost,
            id => Binding::Client(id),
        }
    }

    fn with(bound: bool, binding: Binding) -> Tie {
        let low = match binding {
            Binding::None => 0,
            Binding::Lost => Tie::LOST,
            // An id past the packed range cannot be told apart: treat it as lost (never
            // happens: ids would have to reach 2^63).
            Binding::Client(id) if id >= Tie::LOST => Tie::LOST,
            Binding::Client(id) => id,
        };
        Tie(if bound { low | Tie::MARK } else { low })
    }
}

impl Grant {
    /// A grant whose lease runs `ttl_ms` from `now`.
    pub fn new(owner: &[u8], token: u64, ttl_ms: u64, now: Now) -> Grant {
        Grant {
            owner: Owner::from_slice(owner),
            token,
            deadline: Deadline::after(ttl_ms, now),
            since_mono_us: now.mono_us,
            tie: Tie::default(),
        }
    }

    /// Bind the grant to connection `client` (BOUND), or unbind it (`None`).
    pub fn bind(&mut self, client: Option<u64>) {
        self.tie = Tie::with(
            client.is_some(),
            client.map_or(Binding::None, Binding::Client),
        );
    }

    /// Whether the grant was made with BOUND (the mark that travels).
    pub fn bound(&self) -> bool {
        self.tie.bound()
    }

    /// Set the BOUND mark of a grant that arrived from outside (it has no binding here).
    pub fn set_bound_mark(&mut self, bound: bool) {
        self.tie = Tie::with(bound, Binding::None);
    }

    /// The connection a bound grant lives with on this server.
    pub fn binding(&self) -> Binding {
        self.tie.binding()
    }

    /// The connection went away (or there is none on this master): not live from now on.
    pub fn lose_binding(&mut self) {
        self.tie = Tie::with(self.bound(), Binding::Lost);
    }

    /// The connection this grant is bound to here, if any.
    pub fn bound_client(&self) -> Option<u64> {
        match self.binding() {
            Binding::Client(c) => Some(c),
            _ => None,
        }
    }

    /// A grant that arrived with an absolute wall-clock deadline (replication, RDB, AOF,
    /// RESTORE).
    pub fn from_wall_deadline(owner: &[u8], token: u64, deadline_wall_ms: i64, now: Now) -> Grant {
        Grant {
            owner: Owner::from_slice(owner),
            token,
            deadline: Deadline::from_wall(deadline_wall_ms, now),
            since_mono_us: now.mono_us,
            tie: Tie::default(),
        }
    }

    /// A grant with every field given: a host's compact copy of a lock, read back (see
    /// [`LockState::lone_grant`]). `tie_word` is what [`Grant::tie_word`] gave.
    #[inline]
    pub fn from_parts(
        owner: &[u8],
        token: u64,
        deadline: Deadline,
        since_mono_us: u64,
        tie_word: u64,
    ) -> Grant {
        Grant {
            owner: Owner::from_slice(owner),
            token,
            deadline,
            since_mono_us,
            tie: Tie(tie_word),
        }
    }

    /// The BOUND mark and binding as one word, for a host's compact copy (0: neither).
    pub fn tie_word(&self) -> u64 {
        self.tie.0
    }

    /// Whether this grant is `owner`'s and, when a token is given, has that token.
    pub fn is(&self, owner: &[u8], token: Option<u64>) -> bool {
        *self.owner == *owner && token.is_none_or(|t| t == self.token)
    }

    /// Live: its lease runs and, when bound, its connection is still there (G11).
    pub fn is_live(&self, now: Now) -> bool {
        !self.deadline.passed(now) && self.binding() != Binding::Lost
    }

    pub fn remaining_ms(&self, now: Now) -> u64 {
        self.deadline.remaining_ms(now)
    }
}
