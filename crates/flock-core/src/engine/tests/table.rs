//! The engine's table: each case runs operations on one key from a fresh state and checks
//! the reply and the effects of every step. One test per case, so that each runs alone by
//! name (`cargo test -p flock-core engine::tests::table::<name>`) and a failure hides no other.

use super::{run_case, Op::*};
use crate::state::Mode;

const X: Mode = Mode::Exclusive;
const S: Mode = Mode::Shared;
const P2: Mode = Mode::Permits(2);
const P3: Mode = Mode::Permits(3);

/// grant, release: the key leaves the keyspace
#[test]
fn grant_release_the_key_leaves_the_keyspace() {
    run_case(
        "grant, release: the key leaves the keyspace",
        0,
        &[
            (
                0,
                Acquire("a", 100),
                "Int(token)",
                &["repl grant a", "arm", "acquired"],
            ),
            (
                1,
                Release("a"),
                "Int(1)",
                &["released", "repl del", "delete"],
            ),
            (2, Release("a"), "missing", &[]),
        ],
    );
}

/// busy without BLOCK: nil, nothing replicated
#[test]
fn busy_without_block_nil_nothing_replicated() {
    run_case(
        "busy without BLOCK: nil, nothing replicated",
        0,
        &[
            (
                0,
                Acquire("a", 100),
                "Int(token)",
                &["repl grant a", "arm", "acquired"],
            ),
            (1, Acquire("b", 100), "Null", &["contended", "arm"]),
            (2, Acquire("a", 100), "Int(token)", &["repl grant a", "arm"]),
        ],
    );
}

/// release hands off to the first waiter (G6)
#[test]
fn release_hands_off_to_the_first_waiter_g6() {
    run_case(
        "release hands off to the first waiter (G6)",
        0,
        &[
            (
                0,
                Acquire("a", 100),
                "Int(token)",
                &["repl grant a", "arm", "acquired"],
            ),
            (1, AcquireBlock("b", 100), "Blocked", &["contended", "arm"]),
            (2, AcquireBlock("c", 100), "Blocked", &["contended", "arm"]),
            (3, Acquire("d", 100), "Null", &["contended", "arm"]),
            (
                4,
                Release("a"),
                "Int(1)",
                &["released", "acquired", "repl grant b", "arm"],
            ),
        ],
    );
}

/// expiry: notified, deleted, replicated as DEL
#[test]
fn expiry_notified_deleted_replicated_as_del() {
    run_case(
        "expiry: notified, deleted, replicated as DEL",
        0,
        &[
            (
                0,
                Acquire("a", 100),
                "Int(token)",
                &["repl grant a", "arm", "acquired"],
            ),
            (99, Expire, "-", &["arm"]),
            (100, Expire, "-", &["expired", "repl del", "delete"]),
        ],
    );
}

/// expiry with lock-delay: replicated as DELAY, then deleted
#[test]
fn expiry_with_lock_delay_replicated_as_delay_then_deleted() {
    run_case(
        "expiry with lock-delay: replicated as DELAY, then deleted",
        50,
        &[
            (
                0,
                Acquire("a", 100),
                "Int(token)",
                &["repl grant a", "arm", "acquired"],
            ),
            (100, Expire, "-", &["expired", "repl delay", "arm"]),
            (120, Acquire("b", 100), "Null", &["contended", "arm"]),
            (150, Expire, "-", &["repl del", "delete"]),
        ],
    );
}

/// a waiter that vanished: the grant goes to the next
#[test]
fn a_waiter_that_vanished_the_grant_goes_to_the_next() {
    run_case(
        "a waiter that vanished: the grant goes to the next",
        0,
        &[
            (
                0,
                Acquire("a", 100),
                "Int(token)",
                &["repl grant a", "arm", "acquired"],
            ),
            (1, AcquireBlock("b", 100), "Blocked", &["contended", "arm"]),
            (2, AcquireBlock("c", 100), "Blocked", &["contended", "arm"]),
            (3, Vanish(1), "-", &[]),
            (
                4,
                Release("a"),
                "Int(1)",
                &["vanished 1", "released", "acquired", "repl grant c", "arm"],
            ),
        ],
    );
}

/// a grant whose client left before the reply is released again
#[test]
fn a_grant_whose_client_left_before_the_reply_is_released_again() {
    run_case(
        "a grant whose client left before the reply is released again",
        0,
        &[
            (
                0,
                Acquire("a", 100),
                "Int(token)",
                &["repl grant a", "arm", "acquired"],
            ),
            (1, AcquireBlock("b", 100), "Blocked", &["contended", "arm"]),
            (
                2,
                Release("a"),
                "Int(1)",
                &["released", "acquired", "repl grant b", "arm"],
            ),
            (3, Ghost(0), "-", &["released", "repl del", "delete"]),
        ],
    );
}

/// renew: counted and replicated; never revives
#[test]
fn renew_counted_and_replicated_never_revives() {
    run_case(
        "renew: counted and replicated; never revives",
        0,
        &[
            (
                0,
                Acquire("a", 100),
                "Int(token)",
                &["repl grant a", "arm", "acquired"],
            ),
            (50, Renew("b", 100), "Null", &[]),
            (
                50,
                Renew("a", 100),
                "Int(token)",
                &["renewed", "repl grant a", "arm"],
            ),
            (
                150,
                Renew("a", 100),
                "Null",
                &["expired", "repl del", "delete"],
            ),
        ],
    );
}

/// revoke starts a lock-delay, waiters get the key when it ends
#[test]
fn revoke_starts_a_lock_delay_waiters_get_the_key_when_it_ends() {
    run_case(
        "revoke starts a lock-delay, waiters get the key when it ends",
        30,
        &[
            (
                0,
                Acquire("a", 100),
                "Int(token)",
                &["repl grant a", "arm", "acquired"],
            ),
            (1, AcquireBlock("b", 100), "Blocked", &["contended", "arm"]),
            (2, Revoke, "Int(1)", &["revoked", "repl delay", "arm"]),
            (31, Expire, "-", &["arm"]),
            (32, Expire, "-", &["acquired", "repl grant b", "arm"]),
        ],
    );
}

/// readers share, a waiting writer is never starved by later readers
#[test]
fn readers_share_a_waiting_writer_is_never_starved_by_later_readers() {
    run_case(
        "readers share, a waiting writer is never starved by later readers",
        0,
        &[
            (
                0,
                Kind("r1", S, 100, false),
                "Int(token)",
                &["repl shared [r1] delays 0", "arm", "acquired"],
            ),
            (
                1,
                Kind("r2", S, 100, false),
                "Int(token)",
                &["repl shared [r1 r2] delays 0", "arm", "acquired"],
            ),
            (2, Kind("w", X, 100, true), "Blocked", &["contended", "arm"]),
            (3, Kind("r3", S, 100, false), "Null", &["contended", "arm"]),
            (
                4,
                Kind("r3", S, 100, true),
                "Blocked",
                &["contended", "arm"],
            ),
            (
                5,
                Release("r1"),
                "Int(1)",
                &["released", "repl shared [r2] delays 0", "arm"],
            ),
            (
                6,
                Release("r2"),
                "Int(1)",
                &["released", "acquired", "repl grant w", "arm"],
            ),
            (
                7,
                Release("w"),
                "Int(1)",
                &["released", "acquired", "repl shared [r3] delays 0", "arm"],
            ),
        ],
    );
}

/// a run of readers is handed the key together, up to a writer
#[test]
fn a_run_of_readers_is_handed_the_key_together_up_to_a_writer() {
    run_case(
        "a run of readers is handed the key together, up to a writer",
        0,
        &[
            (
                0,
                Acquire("w1", 100),
                "Int(token)",
                &["repl grant w1", "arm", "acquired"],
            ),
            (
                1,
                Kind("r1", S, 100, true),
                "Blocked",
                &["contended", "arm"],
            ),
            (
                2,
                Kind("r2", S, 100, true),
                "Blocked",
                &["contended", "arm"],
            ),
            (
                3,
                Kind("w2", X, 100, true),
                "Blocked",
                &["contended", "arm"],
            ),
            (
                4,
                Kind("r3", S, 100, true),
                "Blocked",
                &["contended", "arm"],
            ),
            (
                5,
                Release("w1"),
                "Int(1)",
                &[
                    "released",
                    "acquired",
                    "acquired",
                    "repl shared [r1 r2] delays 0",
                    "arm",
                ],
            ),
        ],
    );
}

/// permits: at most the limit, then FIFO; limits and modes must match
#[test]
fn permits_at_most_the_limit_then_fifo_limits_and_modes_must_match() {
    run_case(
        "permits: at most the limit, then FIFO; limits and modes must match",
        0,
        &[
            (
                0,
                Kind("p1", P2, 100, false),
                "Int(token)",
                &["repl permits [p1] delays 0", "arm", "acquired"],
            ),
            (
                1,
                Kind("p2", P2, 100, false),
                "Int(token)",
                &["repl permits [p1 p2] delays 0", "arm", "acquired"],
            ),
            (2, Kind("p3", P2, 100, false), "Null", &["contended", "arm"]),
            (
                3,
                Kind("p3", P3, 100, false),
                "Error(LimitMismatch(Permits(2)))",
                &["arm"],
            ),
            (
                3,
                Kind("p3", S, 100, false),
                "Error(LimitMismatch(Permits(2)))",
                &["arm"],
            ),
            (
                3,
                Kind("p1", X, 100, false),
                "Error(OwnerHolds(Permits(2)))",
                &["arm"],
            ),
            (
                3,
                Kind("p1", P3, 100, false),
                "Error(OwnerHolds(Permits(2)))",
                &["arm"],
            ),
            (
                4,
                Kind("p1", P2, 100, false),
                "Int(token)",
                &["repl permits [p1 p2] delays 0", "arm"],
            ),
            (
                5,
                Kind("p3", P2, 100, true),
                "Blocked",
                &["contended", "arm"],
            ),
            (
                6,
                Release("p2"),
                "Int(1)",
                &[
                    "released",
                    "acquired",
                    "repl permits [p1 p3] delays 0",
                    "arm",
                ],
            ),
            (
                7,
                Revoke,
                "Int(2)",
                &["revoked", "revoked", "repl del", "delete"],
            ),
        ],
    );
}

/// waiting shared requests give the key its limit
#[test]
fn waiting_shared_requests_give_the_key_its_limit() {
    run_case(
        "waiting shared requests give the key its limit",
        0,
        &[
            (
                0,
                Acquire("w", 100),
                "Int(token)",
                &["repl grant w", "arm", "acquired"],
            ),
            (
                1,
                Kind("p1", P2, 100, true),
                "Blocked",
                &["contended", "arm"],
            ),
            (
                2,
                Kind("p2", P3, 100, true),
                "Error(LimitMismatch(Permits(2)))",
                &["arm"],
            ),
            (
                3,
                Kind("p1", P2, 100, true),
                "Blocked",
                &["replaced 1", "contended", "arm"],
            ),
        ],
    );
}

/// a retried BLOCK that takes the head's place out lets the new head in (G6)
#[test]
fn a_retried_block_that_takes_the_head_s_place_out_lets_the_new() {
    run_case(
        "a retried BLOCK that takes the head's place out lets the new head in (G6)",
        0,
        &[
            (
                0,
                Kind("p1", P3, 100, false),
                "Int(token)",
                &["repl permits [p1] delays 0", "arm", "acquired"],
            ),
            (1, Kind("w", X, 100, true), "Blocked", &["contended", "arm"]),
            (
                2,
                Kind("r", P3, 100, true),
                "Blocked",
                &["contended", "arm"],
            ),
            // "w" waits again, for a permit: its exclusive request (the head, which
            // did not fit) leaves, and both permits now fit.
            (
                3,
                Kind("w", P3, 100, true),
                "Blocked",
                &[
                    "replaced 1",
                    "contended",
                    "acquired",
                    "acquired",
                    "repl permits [p1 w r] delays 0",
                    "arm",
                ],
            ),
        ],
    );
}

/// a head waiter that leaves uncovers readers that fit: the revisit grants them
#[test]
fn a_head_waiter_that_leaves_uncovers_readers_that_fit_the_revisit() {
    run_case(
        "a head waiter that leaves uncovers readers that fit: the revisit grants them",
        0,
        &[
            (
                0,
                Kind("r1", S, 100, false),
                "Int(token)",
                &["repl shared [r1] delays 0", "arm", "acquired"],
            ),
            (1, Kind("w", X, 100, true), "Blocked", &["contended", "arm"]),
            (
                2,
                Kind("r2", S, 100, true),
                "Blocked",
                &["contended", "arm"],
            ),
            (
                3,
                Leave(1),
                "-",
                &["acquired", "repl shared [r1 r2] delays 0", "arm"],
            ),
        ],
    );
}

/// lock-delay per slot: an expired permit keeps its slot, the others go on
#[test]
fn lock_delay_per_slot_an_expired_permit_keeps_its_slot_the_others() {
    run_case(
        "lock-delay per slot: an expired permit keeps its slot, the others go on",
        50,
        &[
            (
                0,
                Kind("p1", P2, 100, false),
                "Int(token)",
                &["repl permits [p1] delays 0", "arm", "acquired"],
            ),
            (
                10,
                Kind("p2", P2, 200, false),
                "Int(token)",
                &["repl permits [p1 p2] delays 0", "arm", "acquired"],
            ),
            (
                100,
                Expire,
                "-",
                &["expired", "repl permits [p2] delays 1", "arm"],
            ),
            (
                120,
                Kind("p3", P2, 100, false),
                "Null",
                &["contended", "arm"],
            ),
            (
                150,
                Kind("p3", P2, 100, false),
                "Int(token)",
                &["repl permits [p2 p3] delays 0", "arm", "acquired"],
            ),
            (
                160,
                RevokeOwner("p2"),
                "Int(1)",
                &["revoked", "repl permits [p3] delays 1", "arm"],
            ),
            (160, RevokeOwner("zz"), "Int(0)", &[]),
        ],
    );
}

/// a delayed shared slot holds off only exclusive requests
#[test]
fn a_delayed_shared_slot_holds_off_only_exclusive_requests() {
    run_case(
        "a delayed shared slot holds off only exclusive requests",
        50,
        &[
            (
                0,
                Kind("r1", S, 100, false),
                "Int(token)",
                &["repl shared [r1] delays 0", "arm", "acquired"],
            ),
            (
                1,
                Revoke,
                "Int(1)",
                &["revoked", "repl shared [] delays 1", "arm"],
            ),
            (2, Acquire("w", 100), "Null", &["contended", "arm"]),
            (
                3,
                Kind("r2", S, 100, false),
                "Int(token)",
                &["repl shared [r2] delays 1", "arm", "acquired"],
            ),
            (
                4,
                Kind("p", P2, 100, false),
                "Error(LimitMismatch(Shared))",
                &["arm"],
            ),
        ],
    );
}

/// a bound grant ends when its connection closes, as on expiry (G11)
#[test]
fn a_bound_grant_ends_when_its_connection_closes_as_on_expiry_g11() {
    run_case(
        "a bound grant ends when its connection closes, as on expiry (G11)",
        20,
        &[
            (
                0,
                Bound("a", 7, 100, false),
                "Int(token)",
                &["repl bound grant a", "arm", "acquired", "bind 7"],
            ),
            (
                1,
                Bound("b", 8, 100, true),
                "Blocked",
                &["contended", "arm"],
            ),
            (2, Close(9), "-", &["arm"]),
            (3, Close(7), "-", &["closed", "repl delay", "arm"]),
            (
                23,
                Expire,
                "-",
                &["acquired", "bind 8", "repl bound grant b", "arm"],
            ),
            (
                24,
                Release("b"),
                "Int(1)",
                &["released", "unbind 8", "repl del", "delete"],
            ),
        ],
    );
}

/// the holder's repeat without BOUND unbinds, with BOUND rebinds
#[test]
fn the_holder_s_repeat_without_bound_unbinds_with_bound_rebinds() {
    run_case(
        "the holder's repeat without BOUND unbinds, with BOUND rebinds",
        0,
        &[
            (
                0,
                Bound("a", 7, 100, false),
                "Int(token)",
                &["repl bound grant a", "arm", "acquired", "bind 7"],
            ),
            (
                1,
                Bound("a", 8, 100, false),
                "Int(token)",
                &["repl bound grant a", "arm", "unbind 7", "bind 8"],
            ),
            (2, Close(7), "-", &["arm"]),
            (
                3,
                Acquire("a", 100),
                "Int(token)",
                &["repl grant a", "arm", "unbind 8"],
            ),
            (4, Close(8), "-", &["arm"]),
            (
                5,
                Release("a"),
                "Int(1)",
                &["released", "repl del", "delete"],
            ),
        ],
    );
}

/// a bound grant with no binding on a master is not live, then ends
#[test]
fn a_bound_grant_with_no_binding_on_a_master_is_not_live_then_ends() {
    run_case(
        "a bound grant with no binding on a master is not live, then ends",
        0,
        &[
            (
                0,
                Bound("a", 7, 100, false),
                "Int(token)",
                &["repl bound grant a", "arm", "acquired", "bind 7"],
            ),
            (1, Orphan, "true live 0", &[]),
            (2, Expire, "-", &["closed", "repl del", "delete"]),
        ],
    );
}
