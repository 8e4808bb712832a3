//! FLOCK.WATCH and FLOCK.WAITERS against real servers: every way a watched grant ends, token
//! 0 (held), gone, timeouts, several pairs, MULTI, replicas, max-watchers, ACL, WRONGTYPE,
//! watchers that leave, a cluster slot that moves, demotion; and who waits, in order.

use flock_testkit::*;
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

/// A client blocked in FLOCK.WATCH on its own connection: its reply and how long it took.
fn spawn_watch(srv: &Server, args: &[&str]) -> JoinHandle<(Reply, Duration)> {
    let mut con = srv.conn();
    let mut argv = vec!["FLOCK.WATCH".to_string()];
    argv.extend(args.iter().map(|a| a.to_string()));
    thread::spawn(move || {
        let start = Instant::now();
        let r = call(&mut con, &argv);
        (r, start.elapsed())
    })
}

fn join(w: JoinHandle<(Reply, Duration)>) -> Reply {
    w.join().expect("watcher thread").0
}

/// Wait until `n` clients watch.
fn wait_watching(c: &mut redis::Connection, n: i64) {
    wait_until(&format!("{n} watchers"), || flock_stat(c, "watchers") == n);
}

/// `[key, event, owner, token]` as the reply should be.
fn answer(key: &str, event: &str, owner: Option<&str>, token: i64) -> Reply {
    Reply::Array(vec![
        Reply::Bulk(key.as_bytes().to_vec()),
        Reply::Bulk(event.as_bytes().to_vec()),
        owner.map_or(Reply::Nil, |o| Reply::Bulk(o.as_bytes().to_vec())),
        Reply::Int(token),
    ])
}

/// ACQUIRE with options (SHARED, LIMIT n) that must be granted: the token.
#[track_caller]
fn grant_kind(c: &mut redis::Connection, key: &str, owner: &str, ttl: i64, opts: &[&str]) -> i64 {
    let ttl = ttl.to_string();
    let mut argv = vec!["FLOCK.ACQUIRE", key, owner, &ttl];
    argv.extend_from_slice(opts);
    let r = call(c, &argv);
    r.int()
        .unwrap_or_else(|| panic!("ACQUIRE {key} {owner} {opts:?}: {r:?}"))
}

fn watch(c: &mut redis::Connection, args: &[&str]) -> Reply {
    let mut argv = vec!["FLOCK.WATCH"];
    argv.extend_from_slice(args);
    call(c, &argv)
}

// ---- token 0 and gone ----

#[test]
fn token_0_answers_at_once_with_the_oldest_live_grant() {
    let srv = Server::start();
    let mut c = srv.conn();
    let t1 = grant_kind(&mut c, "rw", "r1", 30_000, &["SHARED"]);
    let _t2 = grant_kind(&mut c, "rw", "r2", 30_000, &["SHARED"]);
    assert_eq!(
        watch(&mut c, &["0", "rw", "0"]),
        answer("rw", "held", Some("r1"), t1)
    );
    assert_eq!(flock_stat(&mut c, "watchers"), 0);
}

#[test]
fn token_0_answers_when_the_key_is_taken_later() {
    let srv = Server::start();
    let mut c = srv.conn();
    let w = spawn_watch(&srv, &["0", "lk", "0"]);
    wait_watching(&mut c, 1);
    assert_eq!(flock_stat(&mut c, "blocked_clients"), 1);
    let t = grant(&mut c, "lk", "leader", 30_000);
    assert_eq!(join(w), answer("lk", "held", Some("leader"), t));
    wait_watching(&mut c, 0);
    assert_eq!(flock_stat(&mut c, "blocked_clients"), 0);
}

#[test]
fn token_0_answers_a_waiter_handed_the_key() {
    let srv = Server::start();
    let mut c = srv.conn();
    grant(&mut c, "lk", "a", 30_000);
    let mut wc = srv.conn();
    let waiter = thread::spawn(move || {
        call(
            &mut wc,
            &["FLOCK.ACQUIRE", "lk", "b", "30000", "BLOCK", "0"],
        )
    });
    wait_blocked(&mut c, 1);
    assert_eq!(release(&mut c, "lk", "a"), 1);
    let tb = waiter.join().expect("waiter").int().expect("b's token");
    assert_eq!(
        watch(&mut c, &["0", "lk", "0"]),
        answer("lk", "held", Some("b"), tb)
    );
}

#[test]
fn a_token_that_is_not_live_is_gone_at_once() {
    let srv = Server::start();
    let mut c = srv.conn();
    let t = grant(&mut c, "lk", "a", 30_000);
    assert_eq!(release(&mut c, "lk", "a"), 1);
    let tok = t.to_string();
    assert_eq!(
        watch(&mut c, &["0", "lk", &tok]),
        answer("lk", "gone", None, t)
    );
    assert_eq!(
        watch(&mut c, &["0", "never", "12345"]),
        answer("never", "gone", None, 12345)
    );
}

#[test]
fn a_watch_that_times_out_is_nil_and_leaves_nothing() {
    let srv = Server::start();
    let mut c = srv.conn();
    let t = grant(&mut c, "lk", "a", 30_000);
    let w = spawn_watch(&srv, &["200", "lk", &t.to_string()]);
    let (r, took) = w.join().expect("watcher");
    assert_eq!(r, Reply::Nil);
    assert!(took >= Duration::from_millis(150), "nil after {took:?}");
    wait_watching(&mut c, 0);
    assert!(check(&mut c, "lk", t) > 0, "the grant is untouched");
}

// ---- each way a grant ends ----

#[test]
fn a_released_grant_tells_its_watcher_released() {
    let srv = Server::start();
    let mut c = srv.conn();
    let t = grant(&mut c, "lk", "a", 30_000);
    let w = spawn_watch(&srv, &["0", "lk", &t.to_string()]);
    wait_watching(&mut c, 1);
    assert_eq!(release(&mut c, "lk", "a"), 1);
    assert_eq!(join(w), answer("lk", "released", Some("a"), t));
    wait_watching(&mut c, 0);
}

#[test]
fn an_expired_grant_tells_its_watcher_expired() {
    let srv = Server::start();
    let mut c = srv.conn();
    let t = grant(&mut c, "lk", "a", 300);
    let w = spawn_watch(&srv, &["10000", "lk", &t.to_string()]);
    let (r, took) = w.join().expect("watcher");
    assert_eq!(r, answer("lk", "expired", Some("a"), t));
    assert!(took < Duration::from_secs(5), "told after {took:?}");
}

#[test]
fn a_revoked_grant_tells_its_watcher_revoked() {
    let srv = Server::start();
    let mut c = srv.conn();
    let t = grant_kind(&mut c, "sem", "p1", 30_000, &["LIMIT", "3"]);
    let t2 = grant_kind(&mut c, "sem", "p2", 30_000, &["LIMIT", "3"]);
    let w = spawn_watch(&srv, &["0", "sem", &t.to_string()]);
    wait_watching(&mut c, 1);
    // Another permit joining or ending does not fire.
    grant_kind(&mut c, "sem", "p3", 30_000, &["LIMIT", "3"]);
    assert_eq!(release(&mut c, "sem", "p2"), 1);
    assert!(check(&mut c, "sem", t2) == 0);
    assert_eq!(flock_stat(&mut c, "watchers"), 1, "still watching");
    assert_eq!(call(&mut c, &["FLOCK.REVOKE", "sem", "p1"]).int(), Some(1));
    assert_eq!(join(w), answer("sem", "revoked", Some("p1"), t));
}

#[test]
fn a_bound_grant_whose_connection_closes_tells_its_watcher_closed() {
    let srv = Server::start();
    let mut c = srv.conn();
    let mut holder = srv.conn();
    let t = call(&mut holder, &["FLOCK.ACQUIRE", "lk", "a", "30000", "BOUND"])
        .int()
        .expect("token");
    let id = call(&mut holder, &["CLIENT", "ID"]).int().expect("id");
    let w = spawn_watch(&srv, &["0", "lk", &t.to_string()]);
    wait_watching(&mut c, 1);
    assert_eq!(
        call(&mut c, &["CLIENT", "KILL", "ID", &id.to_string()]).int(),
        Some(1)
    );
    assert_eq!(join(w), answer("lk", "closed", Some("a"), t));
}

#[test]
fn del_flushall_unlink_and_overwrite_tell_watchers_lost() {
    let srv = Server::start();
    let mut c = srv.conn();
    let t = grant(&mut c, "lk", "a", 30_000);
    let w = spawn_watch(&srv, &["0", "lk", &t.to_string()]);
    wait_watching(&mut c, 1);
    assert_eq!(call(&mut c, &["DEL", "lk"]).int(), Some(1));
    assert_eq!(join(w), answer("lk", "lost", Some("a"), t));

    let t = grant(&mut c, "lk", "b", 30_000);
    let w = spawn_watch(&srv, &["0", "lk", &t.to_string()]);
    wait_watching(&mut c, 1);
    assert_ok(&call(&mut c, &["FLUSHALL"]), "FLUSHALL");
    assert_eq!(join(w), answer("lk", "lost", Some("b"), t));

    let t = grant(&mut c, "lk", "c", 30_000);
    let w = spawn_watch(&srv, &["0", "lk", &t.to_string()]);
    wait_watching(&mut c, 1);
    assert_eq!(call(&mut c, &["UNLINK", "lk"]).int(), Some(1));
    assert_eq!(join(w), answer("lk", "lost", Some("c"), t));

    // Overwritten by a value of another type: no keyspace event flock follows says so.
    let t = grant(&mut c, "lk", "d", 30_000);
    let w = spawn_watch(&srv, &["0", "lk", &t.to_string()]);
    wait_watching(&mut c, 1);
    assert_ok(&call(&mut c, &["SET", "lk", "v"]), "SET over the lock");
    assert_eq!(join(w), answer("lk", "lost", Some("d"), t));
    wait_watching(&mut c, 0);
}

// ---- several pairs, MULTI ----

#[test]
fn the_first_firing_pair_in_argument_order_is_the_reply() {
    let srv = Server::start();
    let mut c = srv.conn();
    let ta = grant(&mut c, "a", "x", 30_000);
    let tb = grant(&mut c, "b", "y", 30_000);
    // At once: b's pair is gone and c is held, but b comes first.
    let tc = grant(&mut c, "c", "z", 30_000);
    assert_eq!(
        watch(&mut c, &["0", "a", &ta.to_string(), "b", "1", "c", "0"]),
        answer("b", "gone", None, 1)
    );
    let _ = tc;
    // Later: one transaction ends b then a; a comes first in the watch, so a is the reply.
    let w = spawn_watch(&srv, &["0", "a", &ta.to_string(), "b", &tb.to_string()]);
    wait_watching(&mut c, 1);
    let mut m = srv.raw();
    let replies = m
        .pipeline(&[
            vec!["MULTI"],
            vec!["FLOCK.RELEASE", "b", "y"],
            vec!["FLOCK.REVOKE", "a"],
            vec!["EXEC"],
        ])
        .expect("MULTI/EXEC");
    assert_eq!(
        replies.last(),
        Some(&Reply::Array(vec![Reply::Int(1), Reply::Int(1)]))
    );
    assert_eq!(join(w), answer("a", "revoked", Some("x"), ta));
    wait_watching(&mut c, 0);
}

#[test]
fn inside_multi_a_watch_answers_at_once() {
    let srv = Server::start();
    let mut c = srv.conn();
    let t = grant(&mut c, "lk", "a", 30_000);
    let mut m = srv.raw();
    let replies = m
        .pipeline(&[
            vec!["MULTI".to_string()],
            vec!["FLOCK.WATCH".into(), "0".into(), "lk".into(), t.to_string()],
            vec!["FLOCK.WATCH".into(), "0".into(), "lk".into(), "0".into()],
            vec!["EXEC".into()],
        ])
        .expect("MULTI/EXEC");
    assert_eq!(
        replies.last(),
        Some(&Reply::Array(vec![
            Reply::Nil,
            answer("lk", "held", Some("a"), t)
        ])),
        "nil where it would wait, the answer where it fires"
    );
    assert_eq!(flock_stat(&mut c, "watchers"), 0);
}

#[test]
fn inside_a_script_a_watch_answers_at_once() {
    let srv = Server::start();
    let mut c = srv.conn();
    let t = grant(&mut c, "lk", "a", 30_000);
    let r = call(
        &mut c,
        &[
            "EVAL",
            "return redis.call('FLOCK.WATCH', '0', KEYS[1], '0')",
            "1",
            "lk",
        ],
    );
    assert_eq!(r, answer("lk", "held", Some("a"), t));
    let r = call(
        &mut c,
        &[
            "EVAL",
            "return redis.call('FLOCK.WATCH', '0', KEYS[1], ARGV[1])",
            "1",
            "lk",
            &t.to_string(),
        ],
    );
    assert_eq!(r, Reply::Nil, "nil where it would wait");
    assert_eq!(flock_stat(&mut c, "watchers"), 0);
}

// ---- errors ----

#[test]
fn malformed_watches_get_clear_errors() {
    let srv = Server::start();
    let mut c = srv.conn();
    assert_ok(&call(&mut c, &["SET", "str", "v"]), "SET");
    let mut many: Vec<String> = vec!["FLOCK.WATCH".into(), "0".into()];
    for i in 0..65 {
        many.push(format!("{{t}}k{i}"));
        many.push("0".into());
    }
    let cases: Vec<(Vec<String>, &str)> = vec![
        (
            vec!["FLOCK.WATCH".into(), "0".into(), "lk".into()],
            "ERR wrong number of arguments for 'flock.watch' command",
        ),
        (
            ["FLOCK.WATCH", "0", "a", "1", "b"]
                .map(String::from)
                .to_vec(),
            "ERR FLOCK.WATCH takes key token pairs",
        ),
        (
            ["FLOCK.WATCH", "0", "a", "-1"].map(String::from).to_vec(),
            "ERR invalid token: must be an integer, 0 or more",
        ),
        (
            ["FLOCK.WATCH", "0", "a", "x"].map(String::from).to_vec(),
            "ERR invalid token: must be an integer, 0 or more",
        ),
        (
            ["FLOCK.WATCH", "-5", "a", "1"].map(String::from).to_vec(),
            "ERR invalid timeout: must be an integer of milliseconds, 0 or more",
        ),
        (many, "ERR FLOCK.WATCH takes at most 64 keys"),
        (
            ["FLOCK.WATCH", "0", "str", "0"].map(String::from).to_vec(),
            "WRONGTYPE Operation against a key holding the wrong kind of value",
        ),
    ];
    for (args, want) in cases {
        let r = call(&mut c, &args);
        assert_eq!(r.err(), Some(want), "{:?}", &args[..args.len().min(5)]);
    }
    assert_eq!(
        call(&mut c, &["FLOCK.WAITERS", "str"]).err(),
        Some("WRONGTYPE Operation against a key holding the wrong kind of value")
    );
    assert_eq!(
        call(&mut c, &["FLOCK.WAITERS", "lk", "COUNT", "0"]).err(),
        Some("ERR invalid count: must be a positive integer")
    );
    assert_eq!(
        call(&mut c, &["FLOCK.WAITERS", "lk", "LIMIT", "2"]).err(),
        Some("ERR syntax error")
    );
    assert_eq!(flock_stat(&mut c, "watchers"), 0);
}

#[test]
fn max_watchers_caps_the_watchers_of_one_key() {
    let srv = Server::start();
    let mut c = srv.conn();
    assert_ok(
        &call(&mut c, &["CONFIG", "SET", "flock.max-watchers", "1"]),
        "CONFIG SET",
    );
    let t = grant(&mut c, "lk", "a", 30_000);
    let tok = t.to_string();
    let w = spawn_watch(&srv, &["0", "lk", &tok]);
    wait_watching(&mut c, 1);
    let mut other = srv.conn();
    assert_eq!(
        call(&mut other, &["FLOCK.WATCH", "0", "lk", &tok]).err(),
        Some("ERR too many clients watch this key (flock.max-watchers)")
    );
    // Another key is not capped by this one's watchers.
    let w2 = spawn_watch(&srv, &["0", "other", "0"]);
    wait_watching(&mut c, 2);
    assert_eq!(release(&mut c, "lk", "a"), 1);
    assert_eq!(join(w), answer("lk", "released", Some("a"), t));
    let t2 = grant(&mut c, "other", "b", 30_000);
    assert_eq!(join(w2), answer("other", "held", Some("b"), t2));
}

#[test]
fn a_read_only_user_may_watch_and_list_waiters() {
    let srv = Server::start();
    let mut admin = srv.conn();
    let r = call(
        &mut admin,
        &[
            "ACL",
            "SETUSER",
            "reader",
            "on",
            ">pw",
            "%R~orders:*",
            "+flock.watch",
            "+flock.waiters",
            "+flock.acquire",
        ],
    );
    assert_ok(&r, "ACL SETUSER");
    let t = grant(&mut admin, "orders:lock", "w1", 60_000);
    let mut reader = srv.conn_as("reader", "pw");
    assert_eq!(
        call(&mut reader, &["FLOCK.WATCH", "0", "orders:lock", "0"]),
        answer("orders:lock", "held", Some("w1"), t)
    );
    assert_eq!(
        call(&mut reader, &["FLOCK.WAITERS", "orders:lock"]),
        Reply::Array(vec![])
    );
    let denied = call(&mut reader, &["FLOCK.ACQUIRE", "orders:lock", "r", "1000"]);
    assert!(
        denied.err().is_some_and(|e| e.starts_with("NOPERM")),
        "{denied:?}"
    );
    let other = call(&mut reader, &["FLOCK.WATCH", "0", "other:lock", "0"]);
    assert!(
        other.err().is_some_and(|e| e.starts_with("NOPERM")),
        "{other:?}"
    );
}

// ---- leaving ----

#[test]
fn a_watcher_whose_connection_closes_or_is_unblocked_leaves() {
    let srv = Server::start();
    let mut c = srv.conn();
    let t = grant(&mut c, "lk", "a", 60_000);
    let mut raw = srv.raw();
    for round in 0..3 {
        let mut w = srv.raw();
        w.send(&["FLOCK.WATCH", "0", "lk", &t.to_string(), "lk2", "0"])
            .expect("send");
        wait_watching(&mut c, 1);
        assert_eq!(flock_stat(&mut c, "blocked_clients"), 1, "round {round}");
        drop(w);
        wait_watching(&mut c, 0);
        assert_eq!(flock_stat(&mut c, "blocked_clients"), 0, "round {round}");
    }
    // Unblocked by CLIENT UNBLOCK: nil, and gone.
    let mut w = srv.raw();
    let id = w.call(&["CLIENT", "ID"]).expect("id").int().expect("id");
    w.send(&["FLOCK.WATCH", "0", "lk", &t.to_string()])
        .expect("send");
    wait_watching(&mut c, 1);
    assert_eq!(
        raw.call(&["CLIENT", "UNBLOCK", &id.to_string()])
            .expect("unblock")
            .int(),
        Some(1)
    );
    assert_eq!(w.read_reply().expect("reply"), Reply::Nil);
    wait_watching(&mut c, 0);
    assert_eq!(flock_stat(&mut c, "blocked_clients"), 0);
    assert!(check(&mut c, "lk", t) > 0, "the grant is untouched");
}

/// `n` watchers of `key`'s grant `t` on their own connections, each told, timed out or
/// closed as `i % 3` says; every connection closed afterwards.
fn watch_round(srv: &Server, c: &mut RawConn, key: &str, n: usize) {
    let t = match c.call(&["FLOCK.ACQUIRE", key, "holder", "60000"]) {
        Ok(Reply::Int(t)) => t.to_string(),
        other => panic!("ACQUIRE: {other:?}"),
    };
    let mut conns = Vec::new();
    for i in 0..n {
        let mut w = srv.raw();
        let timeout = if i % 3 == 1 { "30" } else { "0" };
        w.send(&["FLOCK.WATCH", timeout, key, &t, &format!("{key}:{i}"), "0"])
            .expect("send");
        conns.push(w);
    }
    // The closed third leaves at once; the timed-out third answers nil.
    for (i, w) in conns.iter_mut().enumerate() {
        if i % 3 == 1 {
            assert_eq!(w.read_reply().expect("nil"), Reply::Nil);
        }
    }
    conns = conns
        .into_iter()
        .enumerate()
        .filter(|(i, _)| i % 3 != 2)
        .map(|(_, w)| w)
        .collect();
    assert_eq!(
        c.call(&["FLOCK.RELEASE", key, "holder"]).expect("RELEASE"),
        Reply::Int(1)
    );
    for (i, w) in conns.iter_mut().enumerate() {
        if i % 2 == 0 {
            let r = w.read_reply().expect("answer");
            assert_eq!(
                r.array()
                    .and_then(|a| a.get(1))
                    .and_then(Reply::string)
                    .as_deref(),
                Some("released")
            );
        }
    }
    drop(conns);
    let ok = poll_until(Duration::from_secs(30), || flock_stat(c, "watchers") == 0);
    assert!(ok, "every watcher gone");
}

#[test]
fn watchers_that_fire_time_out_or_leave_return_used_memory() {
    let srv = Server::start();
    let mut c = srv.raw();
    // Warm up the allocator, the client tables and the module's registry.
    watch_round(&srv, &mut c, "warm", 150);
    let ok = poll_until(Duration::from_secs(30), || {
        info_i64(&mut c, "clients", "connected_clients") == 1
    });
    assert!(ok, "the warm-up's connections closed");
    let base = info_i64(&mut c, "memory", "used_memory");
    for round in 0..4 {
        watch_round(&srv, &mut c, &format!("lk{round}"), 150);
    }
    let slack = 64 * 1024;
    let mut after = 0;
    poll_until(Duration::from_secs(30), || {
        after = info_i64(&mut c, "memory", "used_memory");
        info_i64(&mut c, "clients", "connected_clients") == 1 && after - base < slack
    });
    eprintln!(
        "G10 watchers: 600 watchers told, timed out or closed; used_memory {base} before, \
         {after} after ({:+} bytes)",
        after - base
    );
    assert!(
        after - base < slack,
        "used_memory grew by {} bytes",
        after - base
    );
    assert_eq!(flock_stat(&mut c, "blocked_clients"), 0);
}

// ---- replicas ----

#[test]
fn a_replica_watcher_is_told_from_the_replicated_effects() {
    let master = Server::start();
    let replica = Server::start_replica_of(&master);
    let mut m = master.conn();
    let mut r = replica.conn();
    let t = grant_kind(&mut m, "rw", "r1", 60_000, &["SHARED"]);
    wait_replica(&mut m);
    wait_until("the grant reached the replica", || {
        check(&mut r, "rw", t) > 0
    });
    let w = spawn_watch(&replica, &["0", "rw", &t.to_string()]);
    let w0 = spawn_watch(&replica, &["0", "lk", "0"]);
    wait_watching(&mut r, 2);
    // The effect replaces the state and does not say how r1's grant ended: lost.
    grant_kind(&mut m, "rw", "r2", 60_000, &["SHARED"]);
    assert_eq!(release(&mut m, "rw", "r1"), 1);
    assert_eq!(join(w), answer("rw", "lost", Some("r1"), t));
    let tl = grant(&mut m, "lk", "leader", 60_000);
    assert_eq!(join(w0), answer("lk", "held", Some("leader"), tl));
    // A DEL from the master: lost.
    let t2 = grant(&mut m, "ex", "a", 60_000);
    wait_until("ex reached the replica", || check(&mut r, "ex", t2) > 0);
    let w = spawn_watch(&replica, &["0", "ex", &t2.to_string()]);
    wait_watching(&mut r, 1);
    assert_eq!(release(&mut m, "ex", "a"), 1);
    assert_eq!(join(w), answer("ex", "lost", Some("a"), t2));
    // A replica lists no waiters.
    let mut wc = master.conn();
    let waiter =
        thread::spawn(move || call(&mut wc, &["FLOCK.ACQUIRE", "rw", "w", "1000", "BLOCK", "0"]));
    wait_blocked(&mut m, 1);
    assert_eq!(
        call(&mut m, &["FLOCK.WAITERS", "rw"])
            .array()
            .map(|a| a.len()),
        Some(1)
    );
    assert_eq!(call(&mut r, &["FLOCK.WAITERS", "rw"]), Reply::Array(vec![]));
    call(&mut m, &["FLOCK.REVOKE", "rw"]);
    assert!(waiter.join().expect("waiter").int().is_some());
}

#[test]
fn a_bound_grant_watched_on_a_replica_and_orphaned_by_its_promotion_is_lost() {
    let master = Server::start();
    let replica = Server::start_replica_of(&master);
    let mut h = master.conn();
    let t = call(&mut h, &["FLOCK.ACQUIRE", "lk", "h", "60000", "BOUND"])
        .int()
        .expect("token");
    wait_replica(&mut h);
    let mut r = replica.conn();
    wait_until("the grant reached the replica", || {
        check(&mut r, "lk", t) > 0
    });
    let w = spawn_watch(&replica, &["0", "lk", &t.to_string()]);
    wait_watching(&mut r, 1);
    assert_ok(
        &call(&mut r, &["REPLICAOF", "NO", "ONE"]),
        "REPLICAOF NO ONE",
    );
    assert_eq!(join(w), answer("lk", "lost", Some("h"), t));
    drop(h);
}

#[test]
fn demotion_unblocks_watchers_with_unblocked() {
    let a = Server::start();
    let b = Server::start();
    let mut c = a.conn();
    let t = grant(&mut c, "lk", "x", 60_000);
    let w = spawn_watch(&a, &["0", "lk", &t.to_string()]);
    wait_watching(&mut c, 1);
    assert_ok(
        &call(&mut c, &["REPLICAOF", "127.0.0.1", &b.port().to_string()]),
        "REPLICAOF",
    );
    let r = join(w);
    assert_err_prefix(&r, "UNBLOCKED", "a watcher of a demoted master");
    let mut c = a.conn();
    wait_watching(&mut c, 0);
}

#[test]
fn a_replicas_full_sync_unblocks_its_watchers_with_unblocked() {
    let a = Server::start();
    let b = Server::start();
    let replica = Server::start_replica_of(&a);
    let mut ac = a.conn();
    let t = grant(&mut ac, "lk", "x", 60_000);
    wait_replica(&mut ac);
    let mut r = replica.conn();
    wait_until("the grant reached the replica", || {
        check(&mut r, "lk", t) > 0
    });
    let w = spawn_watch(&replica, &["0", "lk", &t.to_string()]);
    wait_watching(&mut r, 1);
    // Another master: the replica loads a full copy of its data.
    assert_ok(
        &call(&mut r, &["REPLICAOF", "127.0.0.1", &b.port().to_string()]),
        "REPLICAOF",
    );
    let reply = join(w);
    assert_err_prefix(&reply, "UNBLOCKED", "a watcher of a replica that resyncs");
    let mut r = replica.conn();
    wait_watching(&mut r, 0);
}

// ---- cluster ----

#[test]
fn a_watched_key_whose_slot_moves_answers_tryagain() {
    let cluster = Cluster::start();
    let mut any = cluster.nodes[0].srv.conn();
    let lock = "{wmig}:lock";
    let s = key_slot(&mut any, lock);
    let from = cluster.master_of(s);
    let to = cluster.other_master(from);
    let mut src = from.srv.conn();
    let t = grant(&mut src, lock, "holder", 30_000);
    let w = spawn_watch(&from.srv, &["0", lock, &t.to_string()]);
    let w0 = spawn_watch(&from.srv, &["0", "{wmig}:other", "0"]);
    wait_watching(&mut src, 2);
    cluster.migrate_slot(s, from, to);
    assert_err_prefix(&join(w), "TRYAGAIN", "a watcher of a key that moved");
    wait_watching(&mut src, 1);
    // The grant lives on at the target: watching it there waits, as it should.
    let mut dst = to.srv.conn();
    assert!(check(&mut dst, lock, t) > 0);
    drop(w0);
}

#[test]
fn a_cluster_replica_watcher_of_a_deleted_key_is_told_lost_not_tryagain() {
    let cluster = Cluster::start();
    cluster.wait_replicas_synced();
    let mut any = cluster.nodes[0].srv.conn();
    let lock = "{wrep}:lock";
    let s = key_slot(&mut any, lock);
    let master = cluster.master_of(s);
    let replica = cluster.replica_of(master);
    let mut m = master.srv.conn();
    let t = grant(&mut m, lock, "holder", 60_000);
    wait_replica(&mut m);
    let mut r = replica.srv.conn();
    assert_ok(&call(&mut r, &["READONLY"]), "READONLY");
    wait_until("the grant reached the replica", || {
        check(&mut r, lock, t) > 0
    });
    let mut wc = replica.srv.conn();
    assert_ok(&call(&mut wc, &["READONLY"]), "READONLY");
    let tok = t.to_string();
    let w = thread::spawn(move || call(&mut wc, &["FLOCK.WATCH", "0", lock, &tok]));
    wait_watching(&mut r, 1);
    assert_eq!(call(&mut m, &["DEL", lock]).int(), Some(1));
    let reply = w.join().expect("watcher");
    assert_eq!(reply, answer(lock, "lost", Some("holder"), t));
}

// ---- WAITERS ----

#[test]
fn waiters_lists_requests_first_in_line_first() {
    let srv = Server::start();
    let mut c = srv.conn();
    assert_eq!(call(&mut c, &["FLOCK.WAITERS", "rw"]), Reply::Array(vec![]));
    grant(&mut c, "rw", "writer", 60_000);
    let mut handles = Vec::new();
    let reqs: [(&str, &[&str]); 3] = [("w2", &[]), ("r1", &["SHARED"]), ("r2", &["SHARED"])];
    for (i, (owner, opts)) in reqs.iter().enumerate() {
        let mut wc = srv.conn();
        let mut argv: Vec<String> = ["FLOCK.ACQUIRE", "rw", owner, "60000"]
            .map(String::from)
            .to_vec();
        argv.extend(opts.iter().map(|o| o.to_string()));
        argv.extend(["BLOCK".to_string(), "0".to_string()]);
        handles.push(thread::spawn(move || call(&mut wc, &argv)));
        wait_blocked(&mut c, i as i64 + 1);
        thread::sleep(Duration::from_millis(20));
    }
    let r = call(&mut c, &["FLOCK.WAITERS", "rw"]);
    let lines = r.array().expect("an array");
    let shown: Vec<(String, String)> = lines
        .iter()
        .map(|l| {
            let l = l.array().expect("a triple");
            (l[0].string().expect("owner"), l[1].string().expect("mode"))
        })
        .collect();
    assert_eq!(
        shown,
        [("w2", "exclusive"), ("r1", "shared"), ("r2", "shared")]
            .map(|(a, b)| (a.to_string(), b.to_string()))
            .to_vec()
    );
    let waited: Vec<i64> = lines
        .iter()
        .map(|l| l.array().expect("triple")[2].int().expect("waited_ms"))
        .collect();
    assert!(
        waited[0] >= waited[1] && waited[1] >= waited[2] && waited[2] >= 0,
        "{waited:?}"
    );
    let two = call(&mut c, &["FLOCK.WAITERS", "rw", "COUNT", "2"]);
    assert_eq!(two.array().map(|a| a.len()), Some(2));
    // Permits are listed as permits.
    grant_kind(&mut c, "sem", "p1", 60_000, &["LIMIT", "1"]);
    let mut wc = srv.conn();
    let p = thread::spawn(move || {
        call(
            &mut wc,
            &[
                "FLOCK.ACQUIRE",
                "sem",
                "p2",
                "60000",
                "LIMIT",
                "1",
                "BLOCK",
                "0",
            ],
        )
    });
    wait_blocked(&mut c, 4);
    let r = call(&mut c, &["FLOCK.WAITERS", "sem"]);
    let line = r
        .array()
        .and_then(|a| a.first())
        .and_then(Reply::array)
        .expect("one line");
    assert_eq!(line[1].string().as_deref(), Some("permit"));
    call(&mut c, &["FLOCK.REVOKE", "sem"]);
    assert!(p.join().expect("p2").int().is_some());
    call(&mut c, &["FLOCK.REVOKE", "rw"]);
    assert!(handles.remove(0).join().expect("w2").int().is_some());
    call(&mut c, &["FLOCK.REVOKE", "rw"]);
    for h in handles {
        assert!(h.join().expect("reader").int().is_some());
    }
}

#[test]
fn resp3_replies_are_arrays_and_nulls() {
    let srv = Server::start();
    let mut c = srv.conn_resp3();
    let t = grant(&mut c, "lk", "a", 30_000);
    assert_eq!(
        call(&mut c, &["FLOCK.WATCH", "0", "lk", "0"]),
        answer("lk", "held", Some("a"), t)
    );
    assert_eq!(
        call(&mut c, &["FLOCK.WATCH", "0", "lk", "7"]),
        answer("lk", "gone", None, 7)
    );
    assert_eq!(
        call(&mut c, &["FLOCK.WATCH", "50", "lk", &t.to_string()]),
        Reply::Nil
    );
    assert_eq!(call(&mut c, &["FLOCK.WAITERS", "lk"]), Reply::Array(vec![]));
}

#[test]
fn command_docs_and_key_specs_describe_watch_and_waiters() {
    let srv = Server::start();
    let mut c = srv.conn();
    let keys = call(
        &mut c,
        &["COMMAND", "GETKEYS", "FLOCK.WATCH", "0", "a", "1", "b", "0"],
    );
    assert_eq!(
        keys,
        Reply::Array(vec![Reply::Bulk(b"a".to_vec()), Reply::Bulk(b"b".to_vec())])
    );
    let docs = call(&mut c, &["COMMAND", "DOCS", "FLOCK.WATCH", "FLOCK.WAITERS"]);
    let n = docs.array().map_or(0, |a| a.len());
    assert!(n >= 4, "COMMAND DOCS: {docs:?}");
}
