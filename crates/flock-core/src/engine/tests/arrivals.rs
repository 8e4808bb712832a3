//! The engine's table, continued: a lock value that arrives under a waited key's name (COPY,
//! RENAME, MOVE, RESTORE) and the key's waiters. One test per case, as in `table.rs`.

use super::{run_case, Op::*};
use crate::state::Mode;

const X: Mode = Mode::Exclusive;
const S: Mode = Mode::Shared;
const P2: Mode = Mode::Permits(2);
const P3: Mode = Mode::Permits(3);

/// A value holding a waiter's grant arrives (COPY, RENAME, MOVE, RESTORE onto the waited
/// name): an owner never both holds and waits, so the look right after the command ends its
/// wait with nil; its grant stands, and its next ACQUIRE returns that token (G4)
#[test]
fn a_waiter_whose_grant_arrives_is_answered_nil() {
    run_case(
        "a waiter whose grant arrives is answered nil",
        0,
        &[
            (
                0,
                Acquire("x", 100),
                "Int(token)",
                &["repl grant x", "arm", "acquired"],
            ),
            (1, AcquireBlock("a", 100), "Blocked", &["contended", "arm"]),
            (2, Arrive("a", X, 100, true), "-", &["dismissed 1", "arm"]),
            (3, Acquire("a", 100), "Int(token)", &["repl grant a", "arm"]),
            (4, Acquire("x", 100), "Null", &["contended", "arm"]),
        ],
    );
}

/// the holder's wait ends wherever it is in the queue; those ahead keep their turn
#[test]
fn a_holder_s_wait_ends_behind_the_head_too() {
    run_case(
        "a holder's wait ends behind the head too",
        0,
        &[
            (
                0,
                Acquire("x", 100),
                "Int(token)",
                &["repl grant x", "arm", "acquired"],
            ),
            (1, AcquireBlock("c", 100), "Blocked", &["contended", "arm"]),
            (2, AcquireBlock("a", 100), "Blocked", &["contended", "arm"]),
            (3, Arrive("a", X, 100, true), "-", &["dismissed 2", "arm"]),
            (
                4,
                Release("a"),
                "Int(1)",
                &["released", "acquired", "repl grant c", "arm"],
            ),
        ],
    );
}

/// a shared holder's wait ends, and the readers behind it are granted with it
#[test]
fn a_shared_holder_s_wait_ends_and_the_next_readers_come_in() {
    run_case(
        "a shared holder's wait ends and the next readers come in",
        0,
        &[
            (
                0,
                Acquire("x", 100),
                "Int(token)",
                &["repl grant x", "arm", "acquired"],
            ),
            (1, Kind("a", S, 100, true), "Blocked", &["contended", "arm"]),
            (2, Kind("b", S, 100, true), "Blocked", &["contended", "arm"]),
            (
                3,
                Arrive("a", S, 100, true),
                "-",
                &[
                    "dismissed 1",
                    "acquired",
                    "repl shared [a b] delays 0",
                    "arm",
                ],
            ),
        ],
    );
}

/// before the look comes (another command on the key first, as inside MULTI), a head whose
/// owner holds is not granted a second grant: its wait ends with nil at the hand-off
#[test]
fn a_holder_at_the_head_is_not_granted_twice() {
    run_case(
        "a holder at the head is not granted twice",
        0,
        &[
            (
                0,
                Acquire("x", 100),
                "Int(token)",
                &["repl grant x", "arm", "acquired"],
            ),
            (1, Kind("a", S, 100, true), "Blocked", &["contended", "arm"]),
            (2, Kind("b", S, 100, true), "Blocked", &["contended", "arm"]),
            (3, Arrive("a", S, 100, false), "-", &[]),
            (
                4,
                Kind("c", S, 100, false),
                "Int(token)",
                &[
                    "dismissed 1",
                    "acquired",
                    "repl shared [a b c] delays 0",
                    "arm",
                    "acquired",
                ],
            ),
        ],
    );
}

/// a grant that arrived run out holds nothing: its owner's wait stands, and is granted
#[test]
fn a_waiter_whose_arrived_grant_ran_out_is_granted() {
    run_case(
        "a waiter whose arrived grant ran out is granted",
        0,
        &[
            (
                0,
                Acquire("x", 100),
                "Int(token)",
                &["repl grant x", "arm", "acquired"],
            ),
            (1, AcquireBlock("a", 100), "Blocked", &["contended", "arm"]),
            (2, Arrive("a", X, 5, false), "-", &[]),
            (
                10,
                Look,
                "-",
                &["expired", "acquired", "repl grant a", "arm"],
            ),
        ],
    );
}

/// A value that arrives under a waited name gives the key its limit: the shared waiters of
/// another limit are refused as they would be if they asked now (limit mismatch, naming the
/// key's new limit); exclusive waiters keep their places
#[test]
fn an_arrived_limit_refuses_the_waiters_of_another() {
    run_case(
        "an arrived limit refuses the waiters of another",
        0,
        &[
            (
                0,
                Acquire("x", 100),
                "Int(token)",
                &["repl grant x", "arm", "acquired"],
            ),
            (
                1,
                Kind("a", P3, 100, true),
                "Blocked",
                &["contended", "arm"],
            ),
            (2, AcquireBlock("b", 100), "Blocked", &["contended", "arm"]),
            (
                3,
                Kind("c", P3, 100, true),
                "Blocked",
                &["contended", "arm"],
            ),
            (
                4,
                Arrive("z", P2, 100, true),
                "-",
                &[
                    "refused 1: ERR limit mismatch: k admits 2 shared holders",
                    "refused 3: ERR limit mismatch: k admits 2 shared holders",
                    "arm",
                ],
            ),
            // The key's limit is the arrived one's: a request of it is queued behind b.
            (
                5,
                Kind("d", P2, 100, true),
                "Blocked",
                &["contended", "arm"],
            ),
        ],
    );
}

/// waiters of the arrived value's own limit keep their places and are granted if they fit
#[test]
fn an_arrived_limit_keeps_the_waiters_of_the_same() {
    run_case(
        "an arrived limit keeps the waiters of the same",
        0,
        &[
            (
                0,
                Acquire("x", 100),
                "Int(token)",
                &["repl grant x", "arm", "acquired"],
            ),
            (
                1,
                Kind("a", P3, 100, true),
                "Blocked",
                &["contended", "arm"],
            ),
            (
                2,
                Arrive("z", P3, 100, true),
                "-",
                &["acquired", "repl permits [z a] delays 0", "arm"],
            ),
        ],
    );
}

/// an exclusive arrival gives the key no limit: shared waiters keep theirs
#[test]
fn an_exclusive_arrival_refuses_no_shared_waiter() {
    run_case(
        "an exclusive arrival refuses no shared waiter",
        0,
        &[
            (
                0,
                Acquire("x", 100),
                "Int(token)",
                &["repl grant x", "arm", "acquired"],
            ),
            (
                1,
                Kind("a", P3, 100, true),
                "Blocked",
                &["contended", "arm"],
            ),
            (2, Arrive("z", X, 100, true), "-", &["arm"]),
            (
                3,
                Release("z"),
                "Int(1)",
                &["released", "acquired", "repl permits [a] delays 0", "arm"],
            ),
        ],
    );
}

/// before the look comes, a hand-off that meets a shared head of another limit refuses it
/// and its like rather than let it hold the queue
#[test]
fn a_head_of_another_limit_is_refused_at_a_hand_off() {
    run_case(
        "a head of another limit is refused at a hand-off",
        0,
        &[
            (
                0,
                Acquire("x", 100),
                "Int(token)",
                &["repl grant x", "arm", "acquired"],
            ),
            (
                1,
                Kind("a", P3, 100, true),
                "Blocked",
                &["contended", "arm"],
            ),
            (
                2,
                Kind("c", P3, 100, true),
                "Blocked",
                &["contended", "arm"],
            ),
            (3, Arrive("z", P2, 100, false), "-", &[]),
            (
                4,
                Kind("n", P2, 100, false),
                "Int(token)",
                &[
                    "refused 1: ERR limit mismatch: k admits 2 shared holders",
                    "refused 2: ERR limit mismatch: k admits 2 shared holders",
                    "repl permits [z n] delays 0",
                    "arm",
                    "acquired",
                ],
            ),
        ],
    );
}
