//! What an operation causes besides its reply: the events subscribers see, the counters, and
//! the effects the executor carries out in order.

use crate::clock::Deadline;
use std::ffi::CStr;

/// A change that subscribers see as a keyspace notification (`flock.<name>`, class `d`) and
/// `INFO flock` counts: one per grant.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Event {
    /// A grant with this lease.
    Acquired {
        ttl_ms: u64,
    },
    /// A grant ended by RELEASE after it was held this long. Each ending event names the
    /// grant's token: FLOCK.WATCH tells the watchers of that grant how it ended.
    Released {
        held_ms: u64,
        token: u64,
    },
    Expired {
        token: u64,
    },
    Revoked {
        token: u64,
    },
    /// A BOUND grant ended because its connection closed (or it had none on this master).
    Closed {
        token: u64,
    },
}

impl Event {
    /// The keyspace notification's event name.
    pub fn name(self) -> &'static str {
        // Every name is ASCII.
        self.c_name().to_str().unwrap_or("flock")
    }

    /// The same name as a C string, for `RedisModule_NotifyKeyspaceEvent`.
    pub fn c_name(self) -> &'static CStr {
        match self {
            Event::Acquired { .. } => c"flock.acquired",
            Event::Released { .. } => c"flock.released",
            Event::Expired { .. } => c"flock.expired",
            Event::Revoked { .. } => c"flock.revoked",
            Event::Closed { .. } => c"flock.closed",
        }
    }
}

/// Something only `INFO flock` counts (no notification).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Count {
    /// A holder extended its lease (RENEW).
    Renewed,
    /// An ACQUIRE found no room for it (whether or not it then waited).
    Contended,
}

/// What the executor must carry out, in the order given (see [`Effects`](super::Effects)).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Effect {
    Notify(Event),
    Count(Count),
    /// Send the key's state, as the operation left it, to replicas and the AOF
    /// (`FLOCK.APPLY`; [`Snapshot::of`](crate::snapshot::Snapshot::of) that state is `Some`).
    Replicate,
    /// Send the key's state as it was at this point of the operation: the `n`-th state kept
    /// in the [`Effects`](super::Effects) ([`Effects::state_so_far`](super::Effects::state_so_far)).
    ReplicateSoFar(u8),
    /// Send the key's deletion to replicas and the AOF (`DEL`).
    ReplicateDelete,
    /// Pass the command being run on to replicas and the AOF as it is (a replica applying
    /// its master's effect).
    ReplicateVerbatim,
    /// Take the key out of the keyspace once the operation is over (nothing is left of it:
    /// no grant, no delayed slot, no waiter).
    DeleteKey,
    /// The key needs attention at this deadline (a lease's or a delayed slot's end); `None`:
    /// it needs none.
    Arm(Option<Deadline>),
    /// The grant `token` of this key is now bound to connection `client` (BOUND): when that
    /// connection closes, [`close`](super::close) must run on the key.
    Bind {
        client: u64,
        token: u64,
    },
    /// The grant `token` is no longer bound to `client` (it ended or was rebound).
    Unbind {
        client: u64,
        token: u64,
    },
    /// The FLOCK.MACQUIRE request `waiter` is first in this key's queue and the key is free:
    /// it may be granted now if the same holds for its other keys, which only the module can
    /// look at together ([`crate::multi::ready`]). Until then the key stays free and those
    /// behind the request wait (nobody overtakes it).
    TryMulti {
        waiter: u64,
    },
}
