//! The persisted form of one lock key: what RDB, AOF rewrite, DUMP/RESTORE, DEBUG DIGEST,
//! replication and `FLOCK.APPLY` carry.
//!
//! One type, written from a [`LockState`] in one place ([`Snapshot::of`]), checked in one
//! place ([`Snapshot::validate`]) and turned back into a state in one place
//! ([`Snapshot::restore`]), so that every copy of a lock (a replica, a reloaded RDB, a
//! replayed AOF) agrees with the master on who holds it, with which token, and until when.
//! Deadlines travel as absolute wall-clock times (G7); waiters are connections and never
//! travel.

use crate::clock::{Deadline, Now};
use crate::state::{Grant, LockState, MAX_OWNER_LEN};
use crate::tokens::MAX_TOKEN;

/// A lock key as it leaves this server.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Snapshot<'a> {
    /// Held by `owner` with `token` until `deadline_wall_ms` (Unix milliseconds).
    Held {
        owner: &'a [u8],
        token: u64,
        deadline_wall_ms: i64,
    },
    /// Nobody holds the key; it is in lock-delay until `until_wall_ms` (Unix milliseconds).
    /// `last_token` is the token of the grant that ended.
    Delayed { last_token: u64, until_wall_ms: i64 },
}

/// Why a snapshot was refused: no master could have written it (a corrupt payload).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Invalid {
    /// An owner of 0 bytes (for a held key) or more than 256.
    Owner,
    /// A token above 2^53 - 1, or 0 for a held key.
    Token,
}

impl<'a> Snapshot<'a> {
    /// The snapshot of `state`; `None` when there is nothing to carry (nobody holds the key
    /// and no lock-delay keeps it: such a key is deleted rather than saved on a master).
    pub fn of(state: &'a LockState) -> Option<Snapshot<'a>> {
        match (&state.holder, state.delay) {
            (Some(g), _) => Some(Snapshot::Held {
                owner: &g.owner,
                token: g.token,
                deadline_wall_ms: g.deadline.wall_ms,
            }),
            (None, Some(d)) => Some(Snapshot::Delayed {
                last_token: state.last_token,
                until_wall_ms: d.wall_ms,
            }),
            (None, None) => None,
        }
    }

    /// The token this snapshot carries (it raises the token high-water mark when loaded).
    pub fn token(self) -> u64 {
        match self {
            Snapshot::Held { token, .. } => token,
            Snapshot::Delayed { last_token, .. } => last_token,
        }
    }

    /// The one validation of a snapshot that arrived from outside (RDB, RESTORE, AOF,
    /// replication).
    pub fn validate(self) -> Result<Snapshot<'a>, Invalid> {
        match self {
            Snapshot::Held { owner, .. } if owner.is_empty() || owner.len() > MAX_OWNER_LEN => {
                Err(Invalid::Owner)
            }
            Snapshot::Held { token: 0, .. } => Err(Invalid::Token),
            s if s.token() > MAX_TOKEN => Err(Invalid::Token),
            s => Ok(s),
        }
    }

    /// The state of a key loaded from this snapshot at `now`: on this server a deadline is
    /// what is left of it by the local wall clock (then measured on the monotonic clock, G9).
    pub fn restore(self, now: Now) -> LockState {
        match self {
            Snapshot::Held {
                owner,
                token,
                deadline_wall_ms,
            } => LockState::with_grant(Grant::from_wall_deadline(
                owner,
                token,
                deadline_wall_ms,
                now,
            )),
            Snapshot::Delayed {
                last_token,
                until_wall_ms,
            } => LockState::delayed(last_token, Deadline::from_wall(until_wall_ms, now)),
        }
    }

    // RDB layout, encoding version 1: unsigned token, signed deadline (Unix ms), string owner.
    // With an owner the key is held until the deadline. Without, nobody holds it and it is in
    // lock-delay until the deadline; the token is the last one granted.

    /// The three RDB fields of `state`. A state with nothing to carry (see [`Snapshot::of`])
    /// is written as a lock-delay that ended at time 0, as v1 always wrote it.
    pub fn rdb_fields(state: &'a LockState) -> (u64, i64, &'a [u8]) {
        match Snapshot::of(state) {
            Some(Snapshot::Held {
                owner,
                token,
                deadline_wall_ms,
            }) => (token, deadline_wall_ms, owner),
            Some(Snapshot::Delayed {
                last_token,
                until_wall_ms,
            }) => (last_token, until_wall_ms, &[]),
            None => (state.last_token, 0, &[]),
        }
    }

    /// The snapshot the three RDB fields describe, validated.
    pub fn from_rdb(
        token: u64,
        deadline_ms: i64,
        owner: &'a [u8],
    ) -> Result<Snapshot<'a>, Invalid> {
        let s = if owner.is_empty() {
            Snapshot::Delayed {
                last_token: token,
                until_wall_ms: deadline_ms,
            }
        } else {
            Snapshot::Held {
                owner,
                token,
                deadline_wall_ms: deadline_ms,
            }
        };
        s.validate()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tokens::TokenIssuer;

    const T0: Now = Now {
        wall_us: 1_700_000_000_000_000,
        wall_ms: 1_700_000_000_000,
        mono_us: 5_000_000,
    };

    #[test]
    fn every_state_survives_the_round_trip() {
        let mut tokens = TokenIssuer::new();
        let mut held = LockState::default();
        held.acquire(b"a", 1000, T0, 0, &mut tokens);
        let delayed = LockState::delayed(7, Deadline::after(50, T0));
        let there = Now::new(T0.wall_us + 300_000, 42);
        for state in [held, delayed] {
            let s = Snapshot::of(&state).expect("something to carry");
            let (t, d, o) = Snapshot::rdb_fields(&state);
            assert_eq!(Snapshot::from_rdb(t, d, o), Ok(s));
            let back = s.restore(there);
            assert_eq!(
                Snapshot::of(&back),
                Some(s),
                "wall-clock deadlines travel as they are"
            );
            assert_eq!(back.last_token, state.last_token);
        }
        // 300 ms later elsewhere: 700 ms of the lease are left there.
        let s = Snapshot::Held {
            owner: b"a",
            token: 1,
            deadline_wall_ms: T0.wall_ms + 1000,
        };
        assert_eq!(
            s.restore(there).holder.map(|g| g.remaining_ms(there)),
            Some(700)
        );
    }

    #[test]
    fn nothing_to_carry_is_saved_as_an_ended_delay() {
        let empty = LockState {
            last_token: 9,
            ..LockState::default()
        };
        assert_eq!(Snapshot::of(&empty), None);
        assert_eq!(Snapshot::rdb_fields(&empty), (9, 0, &b""[..]));
        let back = Snapshot::from_rdb(9, 0, b"").expect("valid").restore(T0);
        assert!(back.is_vacant(T0) && back.is_free(T0));
    }

    /// (token, deadline, owner) as RDB could carry them, and whether they load.
    #[test]
    fn validation_table() {
        let long = [b'x'; MAX_OWNER_LEN + 1];
        let table: [(u64, &[u8], Result<(), Invalid>); 8] = [
            (1, b"o", Ok(())),
            (MAX_TOKEN, b"o", Ok(())),
            (MAX_TOKEN + 1, b"o", Err(Invalid::Token)),
            (0, b"o", Err(Invalid::Token)),
            (0, b"", Ok(())),
            (MAX_TOKEN + 1, b"", Err(Invalid::Token)),
            (5, &long[..MAX_OWNER_LEN], Ok(())),
            (5, &long, Err(Invalid::Owner)),
        ];
        for (token, owner, want) in table {
            assert_eq!(
                Snapshot::from_rdb(token, 1, owner).map(|_| ()),
                want,
                "token {token}, owner of {} bytes",
                owner.len()
            );
        }
    }
}
