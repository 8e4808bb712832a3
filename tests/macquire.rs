//! FLOCK.MACQUIRE against real servers: all or nothing, the owner's own keys, every error,
//! BLOCK (granted when first in line on every free key, no deadlock in opposite key orders,
//! nobody overtakes, timeout, disconnect, max-waiters, replaced by the owner's ACQUIRE BLOCK,
//! WAITERS in each queue), BOUND, replication, restart from RDB and AOF, cluster (CROSSSLOT,
//! key positions, a cluster client, a slot that moves under a waiter) and no residue (G10).

use flock_testkit::*;
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

fn macq(c: &mut redis::Connection, args: &[&str]) -> Reply {
    let mut argv = vec!["FLOCK.MACQUIRE"];
    argv.extend_from_slice(args);
    call(c, &argv)
}

/// The tokens of a granted MACQUIRE.
#[track_caller]
fn tokens(r: &Reply) -> Vec<i64> {
    r.array()
        .unwrap_or_else(|| panic!("not granted: {r:?}"))
        .iter()
        .map(|t| t.int().unwrap_or_else(|| panic!("a token: {t:?}")))
        .collect()
}

/// A MACQUIRE on its own connection (BLOCK, usually): its reply and how long it took.
fn spawn_macq(srv: &Server, args: &[&str]) -> JoinHandle<(Reply, Duration)> {
    let mut con = srv.conn();
    let mut argv = vec!["FLOCK.MACQUIRE".to_string()];
    argv.extend(args.iter().map(|a| a.to_string()));
    thread::spawn(move || {
        let start = Instant::now();
        let r = call(&mut con, &argv);
        (r, start.elapsed())
    })
}

fn join(h: JoinHandle<(Reply, Duration)>) -> Reply {
    h.join().expect("client thread").0
}

/// The owners waiting for `key`, first in line first.
fn waiters_of(c: &mut redis::Connection, key: &str) -> Vec<String> {
    call(c, &["FLOCK.WAITERS", key])
        .array()
        .unwrap_or_default()
        .iter()
        .filter_map(|l| l.array().and_then(|l| l.first()).and_then(Reply::string))
        .collect()
}

// ---- without BLOCK ----

#[test]
fn free_keys_are_granted_together_each_an_ordinary_grant_in_key_order() {
    let srv = Server::start();
    let mut c = srv.conn();
    let r = macq(&mut c, &["3", "a", "b", "c", "me", "30000"]);
    let t = tokens(&r);
    assert_eq!(t.len(), 3);
    assert!(
        t[0] < t[1] && t[1] < t[2],
        "tokens grow in key order: {t:?}"
    );
    for (key, tok) in ["a", "b", "c"].iter().zip(&t) {
        assert!(check(&mut c, key, *tok) > 29_000, "{key}");
        assert_eq!(held(&mut c, key).0, "me");
    }
    assert_eq!(flock_stat(&mut c, "multi_grants"), 1);
    assert_eq!(flock_stat(&mut c, "grants"), 3);
    // Each key alone from now on.
    assert_eq!(release(&mut c, "b", "me"), 1);
    assert!(check(&mut c, "a", t[0]) > 0 && check(&mut c, "c", t[2]) > 0);
    assert_eq!(exists(&mut c, "b"), 0);
}

#[test]
fn keys_the_owner_holds_keep_their_token_and_a_retry_gets_the_same_tokens() {
    let srv = Server::start();
    let mut c = srv.conn();
    let ta = grant(&mut c, "a", "me", 1_000);
    let t = tokens(&macq(&mut c, &["2", "a", "b", "me", "30000"]));
    assert_eq!(t[0], ta);
    assert!(t[1] > ta);
    assert!(check(&mut c, "a", ta) > 29_000, "the lease restarted");
    // Someone waits behind the owner's grant: a retry still gets its tokens (G4).
    let mut w = srv.conn();
    let waiter = thread::spawn(move || {
        call(
            &mut w,
            &["FLOCK.ACQUIRE", "a", "other", "1000", "BLOCK", "0"],
        )
    });
    wait_blocked(&mut c, 1);
    assert_eq!(tokens(&macq(&mut c, &["2", "a", "b", "me", "30000"])), t);
    assert_eq!(release(&mut c, "a", "me"), 1);
    assert!(waiter.join().expect("waiter").int().is_some());
}

#[test]
fn one_key_held_by_another_owner_is_nil_and_nothing_changes() {
    let srv = Server::start();
    let mut c = srv.conn();
    let tb = grant(&mut c, "b", "them", 30_000);
    assert_eq!(
        macq(&mut c, &["3", "a", "b", "c", "me", "30000"]),
        Reply::Nil
    );
    assert_eq!(exists(&mut c, "a"), 0);
    assert_eq!(exists(&mut c, "c"), 0);
    assert!(check(&mut c, "b", tb) > 0);
    assert_eq!(flock_stat(&mut c, "contended_acquires"), 1);
    // A key held shared by others is not free either.
    let _ = call(&mut c, &["FLOCK.ACQUIRE", "s", "r1", "30000", "SHARED"]);
    assert_eq!(macq(&mut c, &["2", "a", "s", "me", "30000"]), Reply::Nil);
    assert_eq!(dbsize(&mut c), 2);
}

#[test]
fn a_free_key_with_waiters_is_not_free_nobody_overtakes() {
    let srv = Server::start();
    let mut c = srv.conn();
    grant(&mut c, "a", "holder", 30_000);
    let mut w = srv.conn();
    let _waiter =
        thread::spawn(move || call(&mut w, &["FLOCK.ACQUIRE", "a", "w", "1000", "BLOCK", "0"]));
    wait_blocked(&mut c, 1);
    assert_eq!(macq(&mut c, &["2", "a", "b", "me", "30000"]), Reply::Nil);
    assert_eq!(exists(&mut c, "b"), 0);
    let _ = release(&mut c, "a", "holder");
}

#[test]
fn lock_delay_keeps_a_key_from_a_macquire() {
    let srv = Server::builder()
        .module_args(&["lock-delay-ms", "400"])
        .start();
    let mut c = srv.conn();
    let _ = grant(&mut c, "a", "old", 50);
    std::thread::sleep(Duration::from_millis(100));
    assert_eq!(macq(&mut c, &["2", "a", "b", "me", "30000"]), Reply::Nil);
    std::thread::sleep(Duration::from_millis(400));
    assert_eq!(
        tokens(&macq(&mut c, &["2", "a", "b", "me", "30000"])).len(),
        2
    );
}

#[test]
fn every_bad_argument_gets_its_error_and_changes_nothing() {
    let srv = Server::start();
    let mut c = srv.conn();
    let _ = call(&mut c, &["FLOCK.ACQUIRE", "sh", "me", "30000", "SHARED"]);
    let _ = call(
        &mut c,
        &["FLOCK.ACQUIRE", "pm", "me", "30000", "LIMIT", "3"],
    );
    let _ = call(&mut c, &["SET", "str", "x"]);
    for (args, want) in [
        (vec!["0", "a", "me", "100"], "ERR numkeys must be 1 to 64"),
        (vec!["65", "a", "me", "100"], "ERR numkeys must be 1 to 64"),
        (vec!["x", "a", "me", "100"], "ERR numkeys must be 1 to 64"),
        (vec!["2", "a", "a", "me", "100"], "ERR syntax error"),
        (vec!["1", "a", "me", "100", "SHARED"], "ERR syntax error"),
        (
            vec!["1", "a", "me", "100", "LIMIT", "2"],
            "ERR syntax error",
        ),
        (vec!["1", "a", "me", "100", "NOPE"], "ERR syntax error"),
        (vec!["1", "a", "b", "me", "100"], "ERR invalid ttl"),
        (vec!["1", "a", "me", "0"], "ERR invalid ttl"),
        (
            vec!["1", "a", "me", "100", "BLOCK", "-1"],
            "ERR invalid timeout",
        ),
        (vec!["1", "a", "", "100"], "ERR invalid owner"),
        (
            vec!["3", "a", "b", "c", "me"],
            "ERR wrong number of arguments",
        ),
        (vec!["1", "a", "me"], "ERR wrong number of arguments"),
        (
            vec!["2", "a", "sh", "me", "100"],
            "ERR owner already holds a shared grant of sh",
        ),
        (
            vec!["2", "a", "pm", "me", "100"],
            "ERR owner already holds a permit grant of pm",
        ),
        (
            vec!["2", "a", "str", "me", "100"],
            "WRONGTYPE Operation against a key holding the wrong kind of value",
        ),
    ] {
        let r = macq(&mut c, &args);
        assert_err_prefix(&r, want, &format!("{args:?}"));
    }
    assert_eq!(exists(&mut c, "a"), 0, "nothing was granted");
    assert_eq!(dbsize(&mut c), 3);
    assert_eq!(flock_stat(&mut c, "grants"), 2);
}

#[test]
fn a_key_the_owner_already_waits_for_refuses_the_call() {
    let srv = Server::start();
    let mut c = srv.conn();
    grant(&mut c, "b", "them", 30_000);
    let first = spawn_macq(&srv, &["2", "a", "b", "me", "30000", "BLOCK", "0"]);
    wait_blocked(&mut c, 1);
    let r = macq(&mut c, &["2", "a", "b", "me", "30000", "BLOCK", "0"]);
    assert_err_prefix(&r, "ERR owner already waits for a", "a retried MACQUIRE");
    assert_eq!(flock_stat(&mut c, "blocked_clients"), 1);
    assert_eq!(release(&mut c, "b", "them"), 1);
    assert_eq!(tokens(&join(first)).len(), 2);
}

#[test]
fn inside_multi_block_answers_at_once() {
    let srv = Server::start();
    let mut c = srv.conn();
    grant(&mut c, "b", "them", 30_000);
    let r: Vec<redis::Value> = redis::pipe()
        .atomic()
        .cmd("FLOCK.MACQUIRE")
        .arg(&["2", "a", "b", "me", "1000", "BLOCK", "0"])
        .query(&mut c)
        .expect("MULTI/EXEC");
    assert_eq!(r, vec![redis::Value::Nil]);
    assert_eq!(flock_stat(&mut c, "blocked_clients"), 0);
    assert_eq!(exists(&mut c, "a"), 0);
}

#[test]
fn acl_key_patterns_apply_to_every_key_and_a_reader_may_not_macquire() {
    let srv = Server::start();
    let mut admin = srv.conn();
    for (user, keys) in [("acct", "~acct:*"), ("reader", "%R~*")] {
        let r = call(
            &mut admin,
            &["ACL", "SETUSER", user, "on", ">pw", keys, "+flock.macquire"],
        );
        assert_ok(&r, "ACL SETUSER");
    }
    let mut acct = srv.conn_as("acct", "pw");
    assert_eq!(
        tokens(&macq(&mut acct, &["2", "acct:1", "acct:2", "me", "1000"])).len(),
        2
    );
    let r = macq(&mut acct, &["2", "acct:3", "other:1", "me", "1000"]);
    assert_err_prefix(&r, "NOPERM", "a key outside the user's pattern");
    let mut reader = srv.conn_as("reader", "pw");
    let r = macq(&mut reader, &["1", "acct:4", "me", "1000"]);
    assert_err_prefix(&r, "NOPERM", "a read-only user");
    assert_eq!(exists(&mut admin, "acct:3"), 0);
    assert_eq!(exists(&mut admin, "acct:4"), 0);
}

// ---- BLOCK ----

#[test]
fn block_waits_in_every_queue_and_is_granted_when_every_key_is_free() {
    let srv = Server::start();
    let mut c = srv.conn();
    grant(&mut c, "a", "h1", 30_000);
    grant(&mut c, "c", "h2", 30_000);
    let w = spawn_macq(&srv, &["3", "a", "b", "c", "me", "30000", "BLOCK", "0"]);
    wait_blocked(&mut c, 1);
    for key in ["a", "b", "c"] {
        assert_eq!(waiters_of(&mut c, key), vec!["me"], "{key}");
    }
    // b is free but waited for: it exists, with no grant; a newcomer does not get it.
    assert_eq!(exists(&mut c, "b"), 1);
    assert_eq!(acquire(&mut c, "b", "newcomer", 1000), None);
    assert_eq!(release(&mut c, "a", "h1"), 1);
    thread::sleep(Duration::from_millis(50));
    assert_eq!(flock_stat(&mut c, "blocked_clients"), 1, "c is still held");
    assert_eq!(acquire(&mut c, "a", "newcomer", 1000), None);
    assert_eq!(release(&mut c, "c", "h2"), 1);
    let t = tokens(&join(w));
    assert!(t[0] < t[1] && t[1] < t[2]);
    for (key, tok) in ["a", "b", "c"].iter().zip(&t) {
        assert!(check(&mut c, key, *tok) > 0, "{key}");
        assert!(waiters_of(&mut c, key).is_empty());
    }
    assert_eq!(flock_stat(&mut c, "blocked_acquires"), 1);
}

#[test]
fn a_waiter_that_holds_some_of_its_keys_keeps_their_tokens_when_granted() {
    let srv = Server::start();
    let mut c = srv.conn();
    let ta = grant(&mut c, "a", "me", 30_000);
    grant(&mut c, "b", "them", 30_000);
    let w = spawn_macq(&srv, &["2", "a", "b", "me", "30000", "BLOCK", "0"]);
    wait_blocked(&mut c, 1);
    // It stands in every queue, a's too (behind its own grant there).
    assert_eq!(waiters_of(&mut c, "a"), vec!["me"]);
    assert_eq!(waiters_of(&mut c, "b"), vec!["me"]);
    assert!(check(&mut c, "a", ta) > 0);
    assert_eq!(release(&mut c, "b", "them"), 1);
    let t = tokens(&join(w));
    assert_eq!(t[0], ta, "a keeps its token");
    assert!(t[1] > ta);
    assert!(waiters_of(&mut c, "a").is_empty());
}

/// A value holding the waiting owner's grant arrives under one of its keys (COPY): the
/// MACQUIRE keeps its place in every queue (a single-key wait would end with nil), that key
/// counts as free for it, and it is granted with the arrived token once the others are free.
#[test]
fn a_waiter_whose_grant_arrives_under_one_of_its_keys_waits_on_and_keeps_that_token() {
    let srv = Server::start();
    let mut c = srv.conn();
    grant(&mut c, "a", "them", 30_000);
    grant(&mut c, "b", "them", 30_000);
    let w = spawn_macq(&srv, &["2", "a", "b", "me", "30000", "BLOCK", "0"]);
    wait_blocked(&mut c, 1);
    let ts = grant(&mut c, "src", "me", 30_000);
    let r = call(&mut c, &["COPY", "src", "a", "REPLACE"]);
    assert_eq!(r.int(), Some(1), "COPY: {r:?}");
    thread::sleep(Duration::from_millis(50));
    assert_eq!(
        flock_stat(&mut c, "blocked_clients"),
        1,
        "still waiting for b"
    );
    assert_eq!(waiters_of(&mut c, "a"), vec!["me"]);
    assert_eq!(waiters_of(&mut c, "b"), vec!["me"]);
    assert_eq!(release(&mut c, "b", "them"), 1);
    let t = tokens(&join(w));
    assert_eq!(t[0], ts, "a keeps the arrived token");
    assert!(t[1] > ts);
    for key in ["a", "b"] {
        assert!(waiters_of(&mut c, key).is_empty(), "{key}");
    }
}

#[test]
fn two_waiters_in_opposite_key_orders_do_not_deadlock() {
    let srv = Server::start();
    let mut c = srv.conn();
    for round in 0..20 {
        grant(&mut c, "x", "h", 30_000);
        grant(&mut c, "y", "h", 30_000);
        let w1 = spawn_macq(&srv, &["2", "x", "y", "w1", "30000", "BLOCK", "5000"]);
        let w2 = spawn_macq(&srv, &["2", "y", "x", "w2", "30000", "BLOCK", "5000"]);
        wait_blocked(&mut c, 2);
        // They stand in the same order in both queues, whichever order they named the keys in.
        let order = waiters_of(&mut c, "x");
        assert_eq!(order.len(), 2);
        assert_eq!(waiters_of(&mut c, "y"), order, "round {round}");
        // Release in either order: the first in line gets both, then the other.
        let (first, second) = if round % 2 == 0 {
            ("x", "y")
        } else {
            ("y", "x")
        };
        assert_eq!(release(&mut c, first, "h"), 1);
        assert_eq!(release(&mut c, second, "h"), 1);
        for owner in &order {
            wait_until(&format!("{owner} holds x and y (round {round})"), || {
                holders(&mut c, "x").first().map(|h| h.0.clone()) == Some(owner.clone())
                    && holders(&mut c, "y").first().map(|h| h.0.clone()) == Some(owner.clone())
            });
            for key in ["x", "y"] {
                assert_eq!(release(&mut c, key, owner), 1, "{owner} held {key}");
            }
        }
        for (w, owner) in [(w1, "w1"), (w2, "w2")] {
            assert_eq!(tokens(&join(w)).len(), 2, "{owner} round {round}");
        }
        assert_eq!(dbsize(&mut c), 0, "round {round}");
    }
}

#[test]
fn nobody_overtakes_an_earlier_macquire_and_it_overtakes_nobody() {
    let srv = Server::start();
    let mut c = srv.conn();
    grant(&mut c, "a", "ha", 30_000);
    grant(&mut c, "b", "hb", 30_000);
    // single1 waits for a before the MACQUIRE; single2 after it.
    let mut s1 = srv.conn();
    let single1 = thread::spawn(move || {
        call(
            &mut s1,
            &["FLOCK.ACQUIRE", "a", "s1", "30000", "BLOCK", "0"],
        )
    });
    wait_blocked(&mut c, 1);
    let m = spawn_macq(&srv, &["2", "a", "b", "m", "30000", "BLOCK", "0"]);
    wait_blocked(&mut c, 2);
    let mut s2 = srv.conn();
    let single2 = thread::spawn(move || {
        call(
            &mut s2,
            &["FLOCK.ACQUIRE", "b", "s2", "30000", "BLOCK", "0"],
        )
    });
    wait_blocked(&mut c, 3);
    assert_eq!(waiters_of(&mut c, "a"), vec!["s1", "m"]);
    assert_eq!(waiters_of(&mut c, "b"), vec!["m", "s2"]);
    // b frees: m heads it but a is not its yet, so b stays free for m; s2 waits behind m.
    assert_eq!(release(&mut c, "b", "hb"), 1);
    thread::sleep(Duration::from_millis(50));
    assert_eq!(flock_stat(&mut c, "blocked_clients"), 3);
    assert_eq!(info(&mut c, "b").map(|i| i.waiters), Some(2));
    // a frees: s1 was first.
    assert_eq!(release(&mut c, "a", "ha"), 1);
    let t1 = single1.join().expect("s1").int().expect("s1 granted");
    assert_eq!(flock_stat(&mut c, "blocked_clients"), 2);
    // s1 done: m gets a and b together, then s2 waits for m.
    assert_eq!(release(&mut c, "a", "s1"), 1);
    let t = tokens(&join(m));
    assert!(t[0] > t1);
    assert_eq!(waiters_of(&mut c, "b"), vec!["s2"]);
    assert_eq!(release(&mut c, "b", "m"), 1);
    assert!(single2.join().expect("s2").int().is_some());
}

#[test]
fn a_timeout_is_nil_and_leaves_every_queue_and_no_key_behind() {
    let srv = Server::start();
    let mut c = srv.conn();
    grant(&mut c, "b", "them", 30_000);
    let (r, took) = spawn_macq(&srv, &["3", "a", "b", "c", "me", "1000", "BLOCK", "200"])
        .join()
        .expect("client");
    assert_eq!(r, Reply::Nil);
    assert!(took >= Duration::from_millis(150), "{took:?}");
    wait_blocked(&mut c, 0);
    for key in ["a", "b", "c"] {
        assert!(waiters_of(&mut c, key).is_empty(), "{key}");
    }
    wait_until("the free keys it headed are gone", || {
        exists(&mut c, "a") == 0 && exists(&mut c, "c") == 0
    });
    assert_eq!(dbsize(&mut c), 1);
    assert!(flock_stat(&mut c, "timeouts") >= 1);
}

#[test]
fn a_waiter_that_disconnects_leaves_every_queue_and_those_behind_move_up() {
    let srv = Server::start();
    let mut c = srv.conn();
    grant(&mut c, "b", "them", 30_000);
    let mut raw = srv.raw();
    raw.send(&["FLOCK.MACQUIRE", "2", "a", "b", "me", "1000", "BLOCK", "0"])
        .expect("send");
    wait_blocked(&mut c, 1);
    // Behind it on the free key a.
    let mut s = srv.conn();
    let single =
        thread::spawn(move || call(&mut s, &["FLOCK.ACQUIRE", "a", "s", "30000", "BLOCK", "0"]));
    wait_blocked(&mut c, 2);
    drop(raw);
    // a is free and s is now first: granted at once.
    assert!(single.join().expect("s").int().is_some());
    wait_blocked(&mut c, 0);
    assert!(waiters_of(&mut c, "b").is_empty());
}

#[test]
fn max_waiters_reached_on_one_key_is_an_error_and_nothing_is_queued() {
    let srv = Server::builder().module_args(&["max-waiters", "1"]).start();
    let mut c = srv.conn();
    grant(&mut c, "b", "them", 30_000);
    let mut w = srv.conn();
    let _other =
        thread::spawn(move || call(&mut w, &["FLOCK.ACQUIRE", "b", "w", "1000", "BLOCK", "0"]));
    wait_blocked(&mut c, 1);
    let r = macq(&mut c, &["2", "a", "b", "me", "1000", "BLOCK", "0"]);
    assert_err_prefix(
        &r,
        "ERR too many clients wait for this key (flock.max-waiters)",
        "b is full",
    );
    assert!(waiters_of(&mut c, "a").is_empty());
    assert_eq!(exists(&mut c, "a"), 0);
    assert_eq!(flock_stat(&mut c, "blocked_clients"), 1);
    let _ = release(&mut c, "b", "them");
}

#[test]
fn an_acquire_block_of_the_same_owner_takes_its_place_and_the_macquire_gets_nil() {
    let srv = Server::start();
    let mut c = srv.conn();
    grant(&mut c, "b", "them", 30_000);
    let m = spawn_macq(&srv, &["2", "a", "b", "me", "1000", "BLOCK", "0"]);
    wait_blocked(&mut c, 1);
    let mut w = srv.conn();
    let single =
        thread::spawn(move || call(&mut w, &["FLOCK.ACQUIRE", "b", "me", "1000", "BLOCK", "0"]));
    assert_eq!(join(m), Reply::Nil);
    wait_blocked(&mut c, 1);
    assert!(waiters_of(&mut c, "a").is_empty(), "left a's queue too");
    assert_eq!(waiters_of(&mut c, "b"), vec!["me"]);
    assert_eq!(release(&mut c, "b", "them"), 1);
    assert!(single.join().expect("single").int().is_some());
}

#[test]
fn bound_grants_end_together_when_the_connection_closes() {
    let srv = Server::start();
    let mut c = srv.conn();
    let mut b = srv.conn();
    let t = tokens(&macq(&mut b, &["2", "a", "b", "me", "60000", "BOUND"]));
    assert_eq!(flock_stat(&mut c, "bound_grants"), 2);
    // A waiting BOUND request binds too.
    grant(&mut c, "x", "h", 30_000);
    let w = spawn_macq(&srv, &["2", "x", "y", "w", "60000", "BOUND", "BLOCK", "0"]);
    wait_blocked(&mut c, 1);
    assert_eq!(release(&mut c, "x", "h"), 1);
    assert_eq!(tokens(&join(w)).len(), 2);
    // The waiter's connection closed with its thread: its two grants end too.
    wait_until(
        "the waiter's bound grants ended with its connection",
        || exists(&mut c, "x") == 0 && exists(&mut c, "y") == 0,
    );
    assert!(check(&mut c, "a", t[0]) > 0 && check(&mut c, "b", t[1]) > 0);
    drop(b);
    wait_until("both bound grants ended", || {
        check(&mut c, "a", t[0]) == 0 && check(&mut c, "b", t[1]) == 0
    });
    assert_eq!(flock_stat(&mut c, "bound_closed"), 4);
    wait_until("nothing left", || dbsize(&mut c) == 0);
}

// ---- replication and persistence ----

/// `[owner, token, ttl]` of each live grant of `key`.
fn holders(c: &mut redis::Connection, key: &str) -> Vec<(String, i64, i64)> {
    call(c, &["FLOCK.HOLDERS", key])
        .array()
        .unwrap_or_default()
        .iter()
        .filter_map(|h| {
            let h = h.array()?;
            Some((h.first()?.string()?, h.get(1)?.int()?, h.get(2)?.int()?))
        })
        .collect()
}

#[test]
fn a_replica_gets_each_grant_with_the_same_token_and_deadline() {
    let master = Server::start();
    let replica = Server::start_replica_of(&master);
    let mut m = master.conn();
    let mut r = replica.conn();
    let t = tokens(&macq(&mut m, &["2", "a", "b", "me", "60000"]));
    // And one granted after waiting.
    grant(&mut m, "x", "h", 60_000);
    let w = spawn_macq(&master, &["2", "x", "y", "w", "50000", "BLOCK", "0"]);
    wait_blocked(&mut m, 1);
    // The free key y that w heads is not on the replica (it sees no waiters).
    wait_replica(&mut m);
    assert_eq!(exists(&mut r, "y"), 0);
    assert_eq!(release(&mut m, "x", "h"), 1);
    let tw = tokens(&join(w));
    wait_replica(&mut m);
    for (key, tok, owner) in [
        ("a", t[0], "me"),
        ("b", t[1], "me"),
        ("x", tw[0], "w"),
        ("y", tw[1], "w"),
    ] {
        let on_master = holders(&mut m, key);
        let on_replica = holders(&mut r, key);
        assert_eq!(on_master.len(), 1, "{key}");
        assert_eq!(on_replica.len(), 1, "{key}");
        assert_eq!((on_master[0].0.as_str(), on_master[0].1), (owner, tok));
        assert_eq!(on_replica[0].0, on_master[0].0);
        assert_eq!(on_replica[0].1, on_master[0].1);
        // The same absolute deadline, read a moment apart.
        assert!(
            (on_replica[0].2 - on_master[0].2).abs() < 1_000,
            "{key}: {on_master:?} {on_replica:?}"
        );
    }
}

/// Found by tests/net_fuzz.rs (a G7 digest mismatch on Valkey 8.1): SWAPDB while a MACQUIRE
/// waits moved the empty value kept for the free key it heads into the other database, where
/// nobody waits for it; the master kept that key for good and the replica never had it.
#[test]
fn swapdb_under_a_waiting_macquire_leaves_no_key_only_the_master_has() {
    let master = Server::builder().arg("databases", "4").start();
    let replica = Server::builder()
        .arg("databases", "4")
        .replica_of(&master)
        .start();
    let mut m = master.conn();
    let mut r = replica.conn();
    grant(&mut m, "x", "h", 60_000);
    let w = spawn_macq(&master, &["2", "x", "y", "w", "60000", "BLOCK", "0"]);
    wait_blocked(&mut m, 1);
    // y is kept, empty, on the master only while w heads its queue.
    assert_eq!(exists(&mut m, "y"), 1);
    assert_ok(&call(&mut m, &["SWAPDB", "0", "1"]), "SWAPDB");
    // Database 0 is empty now: w, waiting there, is granted both keys.
    assert_eq!(tokens(&join(w)).len(), 2);
    let mut m1 = master.conn();
    assert_ok(&call(&mut m1, &["SELECT", "1"]), "SELECT");
    // Database 1 holds what database 0 held: x, still h's; y, kept for w, is gone.
    wait_until("the moved empty y deleted", || exists(&mut m1, "y") == 0);
    assert_eq!(holders(&mut m1, "x").len(), 1);
    wait_replica(&mut m);
    let same = poll_until(Duration::from_secs(10), || {
        call(&mut m, &["DEBUG", "DIGEST"]) == call(&mut r, &["DEBUG", "DIGEST"])
    });
    assert!(same, "master and replica differ after SWAPDB (G7)");
}

#[test]
fn grants_survive_a_restart_from_rdb_and_from_aof() {
    for aof in [false, true] {
        let mut srv = if aof {
            Server::builder()
                .arg("appendonly", "yes")
                .arg("appendfsync", "always")
                .start()
        } else {
            Server::start()
        };
        let mut c = srv.conn();
        let t = tokens(&macq(&mut c, &["3", "a", "b", "c", "me", "60000"]));
        if !aof {
            assert_ok(&call(&mut c, &["SAVE"]), "SAVE");
        }
        srv.restart();
        let mut c = srv.conn();
        for (key, tok) in ["a", "b", "c"].iter().zip(&t) {
            let left = check(&mut c, key, *tok);
            assert!(left > 50_000 && left <= 60_000, "aof={aof} {key}: {left}");
        }
        // Tokens after the restart are above them all (G3).
        let t2 = tokens(&macq(&mut c, &["2", "d", "e", "me", "1000"]));
        assert!(t2[0] > t[2], "aof={aof}: {t2:?} after {t:?}");
    }
}

#[test]
fn a_free_key_a_waiting_macquire_kept_is_gone_after_a_restart() {
    let mut srv = Server::start();
    let mut c = srv.conn();
    grant(&mut c, "b", "them", 60_000);
    let mut raw = srv.raw();
    raw.send(&["FLOCK.MACQUIRE", "2", "a", "b", "me", "1000", "BLOCK", "0"])
        .expect("send");
    wait_blocked(&mut c, 1);
    assert_eq!(exists(&mut c, "a"), 1, "kept while waited for");
    assert_ok(&call(&mut c, &["SAVE"]), "SAVE");
    drop(raw);
    srv.restart();
    let mut c = srv.conn();
    // Waiters are not saved: the empty key that was saved goes at once (G10).
    wait_until("the empty key is deleted", || exists(&mut c, "a") == 0);
    assert_eq!(dbsize(&mut c), 1);
}

// ---- cluster ----

#[test]
fn cluster_keys_route_and_keys_of_two_slots_are_crossslot() {
    let cluster = Cluster::start();
    let mut any = cluster.nodes[0].srv.conn();
    let keys: Vec<String> = call(
        &mut any,
        &[
            "COMMAND",
            "GETKEYS",
            "FLOCK.MACQUIRE",
            "2",
            "{t}:a",
            "{t}:b",
            "me",
            "1000",
        ],
    )
    .array()
    .unwrap_or_default()
    .iter()
    .filter_map(Reply::string)
    .collect();
    assert_eq!(keys, vec!["{t}:a", "{t}:b"]);
    let master = cluster.master_of(key_slot(&mut any, "{t}:a"));
    let mut m = master.srv.conn();
    let r = macq(&mut m, &["2", "{t}:a", "other", "me", "1000"]);
    assert_err_prefix(&r, "CROSSSLOT", "keys of two slots");
    assert_eq!(exists(&mut m, "{t}:a"), 0);
    // A cluster client nobody here wrote gets it to the right node (following MOVED).
    let mut cc = redis::cluster::ClusterClient::new(cluster.urls())
        .expect("cluster client")
        .get_connection()
        .expect("cluster connection");
    let t: Vec<i64> = redis::cmd("FLOCK.MACQUIRE")
        .arg(&["3", "{acct}:1", "{acct}:2", "{acct}:3", "me", "30000"])
        .query(&mut cc)
        .expect("MACQUIRE through the cluster client");
    assert_eq!(t.len(), 3);
    let owner = cluster.master_of(key_slot(&mut any, "{acct}:1"));
    let mut o = owner.srv.conn();
    assert!(check(&mut o, "{acct}:2", t[1]) > 0);
}

#[test]
fn a_waiting_macquire_whose_slot_moves_gets_tryagain() {
    let cluster = Cluster::start();
    let mut any = cluster.nodes[0].srv.conn();
    let s = key_slot(&mut any, "{mv}:a");
    let from = cluster.master_of(s);
    let to = cluster.other_master(from);
    let mut src = from.srv.conn();
    grant(&mut src, "{mv}:b", "them", 30_000);
    let w = spawn_macq(
        &from.srv,
        &["2", "{mv}:a", "{mv}:b", "me", "1000", "BLOCK", "0"],
    );
    wait_blocked(&mut src, 1);
    cluster.migrate_slot(s, from, to);
    assert_err_prefix(&join(w), "TRYAGAIN", "a MACQUIRE waiter of a moved slot");
    wait_blocked(&mut src, 0);
    assert_eq!(dbsize(&mut src), 0, "the source keeps nothing");
}

// ---- G10 ----

/// `n` MACQUIREs of three keys each, granted at once; on each, one waits and times out and
/// one waits and is granted; everything released.
fn macquire_round(srv: &Server, c: &mut redis::Connection, round: usize, n: usize) {
    for i in 0..n {
        let (k1, k2, k3) = (
            format!("r{round}:{i}a"),
            format!("r{round}:{i}b"),
            format!("r{round}:{i}c"),
        );
        let t = tokens(&macq(c, &["3", &k1, &k2, &k3, "me", "30000"]));
        assert_eq!(t.len(), 3);
        let late = spawn_macq(srv, &["2", &k1, "free", "late", "1000", "BLOCK", "20"]);
        assert_eq!(join(late), Reply::Nil);
        let next = spawn_macq(srv, &["2", &k2, &k3, "next", "1000", "BLOCK", "0"]);
        wait_blocked(c, 1);
        for k in [&k1, &k2, &k3] {
            assert_eq!(release(c, k, "me"), 1);
        }
        assert_eq!(tokens(&join(next)).len(), 2);
        for k in [&k2, &k3] {
            assert_eq!(release(c, k, "next"), 1);
        }
    }
    wait_until("every key is gone", || dbsize(c) == 0);
    assert_eq!(flock_stat(c, "blocked_clients"), 0);
}

/// `used_memory` once it stops falling (closed clients are freed over a few seconds).
fn quiet_memory(c: &mut redis::Connection) -> i64 {
    let mut last = info_i64(c, "memory", "used_memory");
    for _ in 0..30 {
        thread::sleep(Duration::from_millis(500));
        let now = info_i64(c, "memory", "used_memory");
        if now >= last {
            return now.min(last);
        }
        last = now;
    }
    last
}

#[test]
fn many_macquires_granted_timed_out_and_released_leave_nothing_behind() {
    let srv = Server::start();
    let mut c = srv.conn();
    // A first round grows the tables (the module's and Redis's) to their working size.
    macquire_round(&srv, &mut c, 0, 100);
    let base = quiet_memory(&mut c);
    for round in 1..=3 {
        macquire_round(&srv, &mut c, round, 100);
    }
    let mut after = quiet_memory(&mut c);
    poll_until(Duration::from_secs(20), || {
        after = info_i64(&mut c, "memory", "used_memory");
        after - base < 256 * 1024
    });
    assert!(
        after - base < 256 * 1024,
        "used_memory grew by {} bytes after 300 more rounds",
        after - base
    );
}
