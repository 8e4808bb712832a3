//! States of every form a persisted or replicated lock takes, for the round-trip tests of
//! [`crate::apply`] and [`crate::rdb`].

use crate::clock::{Deadline, Now};
use crate::state::{Grant, LockState, Mode};

pub const T0: Now = Now {
    wall_us: 1_700_000_000_000_000,
    wall_ms: 1_700_000_000_000,
    mono_us: 5_000_000,
};

/// A grant of `owner` with `token`, for `ttl_ms` from [`T0`], bound to a connection or not.
fn grant(owner: &[u8], token: u64, ttl_ms: u64, bound: bool) -> Grant {
    let mut g = Grant::new(owner, token, ttl_ms, T0);
    if bound {
        g.bind(Some(9));
    }
    g
}

fn state(mode: Mode, last_token: u64, grants: Vec<Grant>, delays: &[u64]) -> LockState {
    let mut s = LockState::default();
    s.mode = mode;
    for g in grants {
        s.push_grant(g);
    }
    for &ms in delays {
        s.delays.push(Deadline::after(ms, T0));
    }
    s.last_token = last_token;
    s
}

/// (name, state): every form, from the short ones (`GRANT`, `GRANT ... BOUND`, `DELAY`) to
/// full states with shared grants, permits, delayed slots and bound grants.
pub fn every_form() -> Vec<(&'static str, LockState)> {
    let binary: Vec<u8> = (0u8..40).collect();
    let longest = vec![b'o'; crate::MAX_OWNER_LEN];
    vec![
        (
            "exclusive held",
            state(Mode::Exclusive, 5, vec![grant(b"a", 5, 1000, false)], &[]),
        ),
        (
            "exclusive bound",
            state(Mode::Exclusive, 6, vec![grant(b"a", 6, 1000, true)], &[]),
        ),
        (
            "exclusive binary owner",
            state(Mode::Exclusive, 7, vec![grant(&binary, 7, 10, false)], &[]),
        ),
        (
            "exclusive longest owner",
            state(Mode::Exclusive, 8, vec![grant(&longest, 8, 10, false)], &[]),
        ),
        (
            "exclusive largest token",
            state(
                Mode::Exclusive,
                crate::MAX_TOKEN,
                vec![grant(b"a", crate::MAX_TOKEN, 10, false)],
                &[],
            ),
        ),
        (
            "exclusive delayed",
            LockState::delayed(Mode::Exclusive, 7, Deadline::after(50, T0)),
        ),
        (
            "exclusive held, last token above its own",
            state(Mode::Exclusive, 9, vec![grant(b"a", 5, 1000, false)], &[]),
        ),
        (
            "shared, two readers",
            state(
                Mode::Shared,
                12,
                vec![grant(b"r1", 11, 1000, false), grant(b"r2", 12, 2000, false)],
                &[],
            ),
        ),
        (
            "shared, a reader, a bound reader and delays",
            state(
                Mode::Shared,
                14,
                vec![grant(b"r1", 13, 1000, false), grant(b"r2", 14, 1000, true)],
                &[30, 60],
            ),
        ),
        (
            "shared, delays only",
            state(Mode::Shared, 14, vec![], &[30]),
        ),
        (
            "permits of 3, two grants, one delay",
            state(
                Mode::Permits(3),
                22,
                vec![grant(b"j1", 21, 1000, false), grant(b"j2", 22, 500, true)],
                &[40],
            ),
        ),
        (
            "permits of 1, held",
            state(
                Mode::Permits(1),
                30,
                vec![grant(b"j", 30, 1000, false)],
                &[],
            ),
        ),
        (
            "permits of 4, delays only",
            state(Mode::Permits(4), 31, vec![], &[10, 20, 30]),
        ),
        (
            "grants pushed out of token order",
            state(
                Mode::Shared,
                45,
                vec![
                    grant(b"late", 45, 1000, false),
                    grant(b"early", 41, 1000, false),
                ],
                &[],
            ),
        ),
    ]
}
