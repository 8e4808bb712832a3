//! The persisted form of one lock key: what RDB, AOF rewrite, DUMP/RESTORE, DEBUG DIGEST,
//! replication and `FLOCK.APPLY` carry.
//!
//! Written from a [`LockState`] in one place ([`Snapshot::of`], a borrowed view), read back
//! into an owned [`LockImage`] checked in one place ([`LockImage::validate`]) and turned into a
//! state in one place ([`LockImage::restore`]), so that every copy of a lock (a replica, a
//! reloaded RDB, a replayed AOF) agrees with the master on its kind, who holds it, with which
//! tokens, until when, and which slots are delayed. Deadlines travel as absolute wall-clock
//! times (G7); waiters are connections and never travel.

use crate::clock::{Deadline, Now};
use crate::state::{Grant, LockState, Mode, MAX_LIMIT, MAX_OWNER_LEN};
use crate::tokens::MAX_TOKEN;

/// A lock key as it leaves this server, borrowed from its state.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Snapshot<'a> {
    /// An exclusive key held by one grant (the form v1 wrote; `FLOCK.APPLY key GRANT`).
    Held(&'a Grant),
    /// An exclusive key nobody holds, in lock-delay until `until_wall_ms` (Unix ms), after the
    /// grant with `last_token` (`FLOCK.APPLY key DELAY`).
    Delayed { last_token: u64, until_wall_ms: i64 },
    /// Any other key: shared or permit grants, several delayed slots, bound grants
    /// (`FLOCK.APPLY key STATE`).
    Full(&'a LockState),
}

/// A grant as it arrived from outside.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GrantImage {
    pub owner: Vec<u8>,
    pub token: u64,
    pub deadline_wall_ms: i64,
    pub bound: bool,
}

/// A lock key as it arrived from outside (RDB, RESTORE, AOF, replication), not yet checked.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct LockImage {
    pub mode: Mode,
    pub last_token: u64,
    /// In token order.
    pub grants: Vec<GrantImage>,
    /// The ends of the delayed slots (Unix ms).
    pub delays: Vec<i64>,
}

/// Why an image was refused: no master could have written it (a corrupt payload).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Invalid {
    /// An owner of 0 bytes or more than 256, or one owner with two grants.
    Owner,
    /// A token above 2^53 - 1 or 0, grants out of token order, a last token below a grant's.
    Token,
    /// Grants and slots the mode cannot have (two on an exclusive key, more than the limit).
    Shape,
}

impl<'a> Snapshot<'a> {
    /// The snapshot of `state`; `None` when there is nothing to carry (no grant and no delayed
    /// slot: such a key is deleted rather than saved on a master).
    pub fn of(state: &'a LockState) -> Option<Snapshot<'a>> {
        match (state.mode, state.grants().as_slice(), &state.delays[..]) {
            (_, [], []) => None,
            (Mode::Exclusive, [g], []) if !g.bound() => Some(Snapshot::Held(g)),
            (Mode::Exclusive, [], [d]) => Some(Snapshot::Delayed {
                last_token: state.last_token,
                until_wall_ms: d.wall_ms,
            }),
            _ => Some(Snapshot::Full(state)),
        }
    }
}

impl Snapshot<'_> {
    /// What a copy loads from this snapshot.
    pub fn image(self) -> LockImage {
        match self {
            Snapshot::Held(g) => LockImage {
                mode: Mode::Exclusive,
                last_token: g.token,
                grants: vec![GrantImage {
                    owner: g.owner.to_vec(),
                    token: g.token,
                    deadline_wall_ms: g.deadline.wall_ms,
                    bound: g.bound(),
                }],
                delays: Vec::new(),
            },
            Snapshot::Delayed {
                last_token,
                until_wall_ms,
            } => LockImage {
                last_token,
                delays: vec![until_wall_ms],
                ..LockImage::default()
            },
            Snapshot::Full(state) => LockImage::of(state),
        }
    }
}

impl LockImage {
    /// The image of `state` (what a copy of it loads from).
    pub fn of(state: &LockState) -> LockImage {
        LockImage {
            mode: state.mode,
            last_token: state.last_token,
            grants: state
                .grants()
                .by_token()
                .into_iter()
                .map(|g| GrantImage {
                    owner: g.owner.to_vec(),
                    token: g.token,
                    deadline_wall_ms: g.deadline.wall_ms,
                    bound: g.bound(),
                })
                .collect(),
            delays: state.delays.iter().map(|d| d.wall_ms).collect(),
        }
    }

    /// The largest token this image carries (it raises the token high-water mark when loaded).
    pub fn token(&self) -> u64 {
        self.grants
            .iter()
            .map(|g| g.token)
            .fold(self.last_token, u64::max)
    }

    /// The one validation of an image that arrived from outside.
    pub fn validate(self) -> Result<LockImage, Invalid> {
        if self.last_token > MAX_TOKEN {
            return Err(Invalid::Token);
        }
        let mut previous = 0;
        for (i, g) in self.grants.iter().enumerate() {
            if g.owner.is_empty() || g.owner.len() > MAX_OWNER_LEN {
                return Err(Invalid::Owner);
            }
            if g.token == 0 || g.token > MAX_TOKEN || g.token <= previous {
                return Err(Invalid::Token);
            }
            previous = g.token;
            if self.grants[..i].iter().any(|h| h.owner == g.owner) {
                return Err(Invalid::Owner);
            }
        }
        let slots = self.grants.len() + self.delays.len();
        let fits = match self.mode {
            Mode::Exclusive => slots <= 1,
            Mode::Shared => true,
            Mode::Permits(n) => (1..=MAX_LIMIT).contains(&n) && slots <= n as usize,
        };
        if !fits {
            return Err(Invalid::Shape);
        }
        Ok(self)
    }

    /// The state of a key loaded from this image at `now`: on this server a deadline is what
    /// is left of it by the local wall clock (then measured on the monotonic clock, G9).
    pub fn restore(self, now: Now) -> LockState {
        let mut state = LockState::default();
        state.mode = self.mode;
        state.last_token = self.token();
        for g in self.grants {
            let mut grant = Grant::from_wall_deadline(&g.owner, g.token, g.deadline_wall_ms, now);
            grant.set_bound_mark(g.bound);
            state.push_grant(grant);
        }
        for until in self.delays {
            state.delays.push(Deadline::from_wall(until, now));
        }
        state
    }

    /// The image the three fields of an RDB value of encoding version 1 describe: with an
    /// owner, an exclusive grant until the deadline; without, an exclusive key in lock-delay
    /// until the deadline (ended at time 0: nothing left), the token being the last one granted.
    pub fn from_rdb_v1(token: u64, deadline_ms: i64, owner: &[u8]) -> Result<LockImage, Invalid> {
        let mut image = LockImage {
            last_token: token,
            ..LockImage::default()
        };
        if owner.is_empty() {
            if token > MAX_TOKEN {
                return Err(Invalid::Token);
            }
            image.delays.push(deadline_ms);
        } else {
            image.grants.push(GrantImage {
                owner: owner.to_vec(),
                token,
                deadline_wall_ms: deadline_ms,
                bound: false,
            });
        }
        image.validate()
    }
}

/// The fields of `FLOCK.APPLY key STATE ...` after `STATE` for `state` (what
/// `args::parse_apply` reads back): mode, limit, last token, the grants as (owner, token,
/// deadline, bound) and the ends of the delayed slots, each list after its length.
pub fn state_fields(state: &LockState) -> Vec<Vec<u8>> {
    let num = |v: i128| v.to_string().into_bytes();
    let mut out = Vec::with_capacity(5 + 4 * state.grants().len() + state.delays.len());
    out.push(state.mode.name().as_bytes().to_vec());
    out.push(num(i128::from(state.mode.limit())));
    out.push(num(i128::from(state.last_token)));
    out.push(num(state.grants().len() as i128));
    for g in state.grants().by_token() {
        out.push(g.owner.to_vec());
        out.push(num(i128::from(g.token)));
        out.push(num(i128::from(g.deadline.wall_ms)));
        out.push(num(i128::from(g.bound())));
    }
    out.push(num(state.delays.len() as i128));
    for d in state.delays.iter() {
        out.push(num(i128::from(d.wall_ms)));
    }
    out
}

/// Mode codes of the persisted forms (RDB v2, `FLOCK.APPLY key STATE`).
pub fn mode_code(mode: Mode) -> (u64, u64) {
    match mode {
        Mode::Exclusive => (0, 0),
        Mode::Shared => (1, 0),
        Mode::Permits(n) => (2, u64::from(n)),
    }
}

/// The mode a persisted (code, limit) pair names.
pub fn mode_from_code(code: u64, limit: u64) -> Result<Mode, Invalid> {
    match (code, limit) {
        (0, 0) => Ok(Mode::Exclusive),
        (1, 0) => Ok(Mode::Shared),
        (2, n) if (1..=u64::from(MAX_LIMIT)).contains(&n) => Ok(Mode::Permits(n as u32)),
        _ => Err(Invalid::Shape),
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

    fn shared_state(tokens: &mut TokenIssuer) -> LockState {
        let mut s = LockState::default();
        for o in ["a", "b"] {
            let t = tokens.issue(T0).expect("token");
            s.grant(Mode::Permits(3), o.as_bytes(), 1000, t, T0, None);
        }
        s.delays.push(Deadline::after(50, T0));
        s
    }

    #[test]
    fn every_state_survives_the_round_trip() {
        let mut tokens = TokenIssuer::new();
        let mut held = LockState::default();
        let t = tokens.issue(T0).expect("token");
        held.grant(Mode::Exclusive, b"a", 1000, t, T0, None);
        let delayed = LockState::delayed(Mode::Exclusive, 7, Deadline::after(50, T0));
        let mut bound = LockState::default();
        let mut g = Grant::new(b"a", 5, 1000, T0);
        g.bind(Some(9));
        bound.push_grant(g);
        bound.last_token = 5;
        let there = Now::new(T0.wall_us + 300_000, 42);
        for state in [held, delayed, shared_state(&mut tokens), bound] {
            let image = LockImage::of(&state);
            let back = image.clone().validate().expect("valid").restore(there);
            assert_eq!(
                LockImage::of(&back),
                image,
                "wall-clock deadlines travel as they are"
            );
            assert_eq!(back.last_token, state.last_token);
            assert_eq!(back.mode, state.mode);
        }
        // 300 ms later elsewhere: 700 ms of the lease are left there.
        let image = LockImage::from_rdb_v1(1, T0.wall_ms + 1000, b"a").expect("valid");
        let back = image.restore(there);
        assert_eq!(back.grants().as_slice()[0].remaining_ms(there), 700);
    }

    #[test]
    fn only_plain_exclusive_keys_use_the_v1_forms() {
        let mut tokens = TokenIssuer::new();
        let shared = shared_state(&mut tokens);
        assert!(matches!(Snapshot::of(&shared), Some(Snapshot::Full(_))));
        let mut held = LockState::default();
        held.grant(Mode::Exclusive, b"a", 1000, 5, T0, None);
        assert!(matches!(Snapshot::of(&held), Some(Snapshot::Held(_))));
        let mut bound = LockState::default();
        let mut g = Grant::new(b"a", 5, 1000, T0);
        g.bind(Some(9));
        bound.push_grant(g);
        assert!(matches!(Snapshot::of(&bound), Some(Snapshot::Full(_))));
        assert_eq!(Snapshot::of(&LockState::default()), None);
    }

    #[test]
    fn nothing_to_carry_loads_as_a_vacant_key() {
        let back = LockImage::from_rdb_v1(9, 0, b"")
            .expect("valid")
            .restore(T0);
        assert!(back.is_vacant(T0));
        assert_eq!(back.last_token, 9);
    }

    /// (token, owner) as a v1 RDB could carry them, and whether they load.
    #[test]
    fn v1_validation_table() {
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
                LockImage::from_rdb_v1(token, 1, owner).map(|_| ()),
                want,
                "token {token}, owner of {} bytes",
                owner.len()
            );
        }
    }

    #[test]
    fn shapes_no_master_writes_are_refused() {
        let g = |o: &str, t| GrantImage {
            owner: o.as_bytes().to_vec(),
            token: t,
            deadline_wall_ms: 1,
            bound: false,
        };
        let img = |mode, grants, delays| LockImage {
            mode,
            last_token: 0,
            grants,
            delays,
        };
        let table: Vec<(LockImage, Result<(), Invalid>)> = vec![
            (
                img(Mode::Shared, vec![g("a", 1), g("b", 2)], vec![1]),
                Ok(()),
            ),
            (
                img(Mode::Exclusive, vec![g("a", 1), g("b", 2)], vec![]),
                Err(Invalid::Shape),
            ),
            (
                img(Mode::Exclusive, vec![g("a", 1)], vec![1]),
                Err(Invalid::Shape),
            ),
            (
                img(Mode::Permits(2), vec![g("a", 1), g("b", 2)], vec![1]),
                Err(Invalid::Shape),
            ),
            (img(Mode::Permits(2), vec![g("a", 1)], vec![1]), Ok(())),
            (
                img(Mode::Shared, vec![g("a", 2), g("b", 1)], vec![]),
                Err(Invalid::Token),
            ),
            (
                img(Mode::Shared, vec![g("a", 1), g("a", 2)], vec![]),
                Err(Invalid::Owner),
            ),
        ];
        for (i, (image, want)) in table.into_iter().enumerate() {
            assert_eq!(image.validate().map(|_| ()), want, "case {i}");
        }
        assert_eq!(mode_from_code(2, 0), Err(Invalid::Shape));
        assert_eq!(mode_from_code(3, 0), Err(Invalid::Shape));
        for m in [Mode::Exclusive, Mode::Shared, Mode::Permits(7)] {
            let (c, l) = mode_code(m);
            assert_eq!(mode_from_code(c, l), Ok(m));
        }
    }
}
