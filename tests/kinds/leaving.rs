//! The queue when waiters leave (timeout, disconnect, CLIENT UNBLOCK), the limit of waiting
//! requests, max-waiters, BOUND, MULTI and scripts, DEL and expiry hand-offs, a reader
//! granted as its connection closes.

use super::helpers::*;
use flock_testkit::*;
use std::thread;
use std::time::{Duration, Instant};

/// How a head waiter leaves the queue in `head_waiter_leaves`.
#[derive(Clone, Copy, Debug)]
enum Leave {
    Timeout,
    Disconnect,
    ClientUnblock,
}

/// `k` is held in a mode that the head waiter (`head_opts`) does not fit but the waiter
/// behind it (`next_opts`) does; the head leaves by `how`: the one behind must be granted at
/// once ("waiters are granted from the head while the head fits", G6), not at the next
/// release or expiry.
fn head_waiter_leaves(holder_opts: &[&str], head_opts: &[&str], next_opts: &[&str], how: Leave) {
    let srv = Server::start();
    let mut c = srv.conn();
    grant_kind(&mut c, "k", "holder", 60_000, holder_opts);
    let mut head = srv.conn();
    let id = call(&mut head, &["CLIENT", "ID"]).int().expect("CLIENT ID");
    // Long enough that the waiter behind it is queued before the head times out, also when
    // the test thread is slow to start it on a loaded machine.
    let block = if matches!(how, Leave::Timeout) {
        "3000"
    } else {
        "0"
    };
    let args: Vec<String> = ["FLOCK.ACQUIRE", "k", "head", "60000"]
        .iter()
        .chain(head_opts)
        .chain(&["BLOCK", block])
        .map(|s| s.to_string())
        .collect();
    let h = thread::spawn(move || call_raw(&mut head, &args));
    wait_blocked(&mut c, 1);
    let mut next_opts = next_opts.to_vec();
    next_opts.extend_from_slice(&["BLOCK", "0"]);
    let next = spawn_acq(&srv, "k", "next", 60_000, &next_opts);
    wait_blocked(&mut c, 2);
    match how {
        Leave::Timeout => {}
        Leave::Disconnect => {
            let r = call(&mut c, &["CLIENT", "KILL", "ID", &id.to_string()]);
            assert_eq!(r, Reply::Int(1), "CLIENT KILL");
        }
        Leave::ClientUnblock => {
            let r = call(&mut c, &["CLIENT", "UNBLOCK", &id.to_string()]);
            assert_eq!(r, Reply::Int(1), "CLIENT UNBLOCK");
        }
    }
    let r = h.join().expect("head thread");
    assert!(
        matches!(r, Ok(Reply::Nil)) || r.is_err(),
        "{how:?}: the head waiter's answer: {r:?}"
    );
    let granted = poll_until(DEADLINE, || owners(&mut c, "k").len() == 2);
    let head_kind = if head_opts.is_empty() {
        "exclusive".to_string()
    } else {
        format!("{head_opts:?}")
    };
    assert!(
        granted,
        "{how:?}: holder {holder_opts:?}; the head waiter ({head_kind}) left; \
         the waiter behind it {next_opts:?} fits but was not granted within {DEADLINE:?}: HOLDERS {:?}, \
         INFO {:?}",
        owners(&mut c, "k"),
        kinfo(&mut c, "k")
    );
    tok(&join(next, "next"), "the waiter behind the head that left");
    assert_eq!(owners(&mut c, "k"), ["holder", "next"]);
}

#[test]
fn when_a_head_writer_times_out_the_reader_behind_it_is_granted_at_once() {
    head_waiter_leaves(&["SHARED"], &[], &["SHARED"], Leave::Timeout);
}

#[test]
fn when_a_head_writer_disconnects_the_reader_behind_it_is_granted_at_once() {
    head_waiter_leaves(&["SHARED"], &[], &["SHARED"], Leave::Disconnect);
}

#[test]
fn when_a_head_writer_is_unblocked_the_permit_behind_it_is_granted_at_once() {
    head_waiter_leaves(&["LIMIT", "2"], &[], &["LIMIT", "2"], Leave::ClientUnblock);
}

#[test]
fn the_limit_of_waiting_requests_leaves_with_them() {
    let srv = Server::start();
    let mut c = srv.conn();
    grant_kind(&mut c, "k", "x", 60_000, &[]);
    let p = spawn_acq(&srv, "k", "p", 60_000, &["LIMIT", "2", "BLOCK", "0"]);
    wait_blocked(&mut c, 1);
    // The waiting owner retrying with another limit: an error, and its wait stays.
    refused_with(
        &mut c,
        "k",
        "p",
        &["LIMIT", "3", "BLOCK", "0"],
        "ERR limit mismatch: k admits 2 shared holders",
    );
    assert_eq!(
        shape(&mut c, "k"),
        sh("exclusive", 1, 2, 0, 1),
        "the earlier wait is untouched"
    );
    assert_eq!(blocked_clients(&mut c), 1);
    // Once the only limited request left the queue the key has no limit any more.
    let r = call(
        &mut c,
        &["CLIENT", "KILL", "TYPE", "normal", "SKIPME", "yes"],
    );
    assert_eq!(r, Reply::Int(1), "CLIENT KILL of the waiter");
    assert!(matches!(join(p, "p"), Reply::Other(_)), "the killed waiter");
    wait_until("the waiter left", || kinfo(&mut c, "k").waiters == 0);
    assert_eq!(shape(&mut c, "k"), sh("exclusive", 1, 0, 0, 0));
    let r = acq(&mut c, "k", "q", 60_000, &["LIMIT", "3", "BLOCK", "100"]);
    assert!(
        r.is_nil(),
        "a LIMIT 3 wait (timing out) after the LIMIT 2 waiter left: {r:?}"
    );
    let r = acq(&mut c, "k", "q", 60_000, &["SHARED", "BLOCK", "100"]);
    assert!(
        r.is_nil(),
        "a SHARED wait after the LIMIT 3 waiter timed out: {r:?}"
    );
    // And when the last permit of a key is released, the next one may name any limit.
    rel(&mut c, "k", "x");
    grant_kind(&mut c, "k", "a", 60_000, &["LIMIT", "2"]);
    rel(&mut c, "k", "a");
    grant_kind(&mut c, "k", "a", 60_000, &["LIMIT", "5"]);
    assert_eq!(shape(&mut c, "k"), sh("permits", 1, 5, 0, 0));
}

#[test]
fn max_waiters_counts_a_retried_wait_once() {
    let srv = Server::start();
    let mut c = srv.conn();
    set_config(&mut c, "flock.max-waiters", "1");
    grant_kind(&mut c, "rw", "w", 60_000, &[]);
    let r1 = spawn_acq(&srv, "rw", "r", 60_000, &["SHARED", "BLOCK", "0"]);
    wait_blocked(&mut c, 1);
    let r = acq(&mut c, "rw", "other", 60_000, &["SHARED", "BLOCK", "0"]);
    assert_err_contains(&r, "max-waiters", "a second waiter past max-waiters 1");
    // The waiting owner's retry replaces its wait: no second place taken, so it is allowed.
    let r2 = spawn_acq(&srv, "rw", "r", 60_000, &["SHARED", "BLOCK", "0"]);
    assert!(join(r1, "r1").is_nil(), "the replaced wait");
    wait_blocked(&mut c, 1);
    rel(&mut c, "rw", "w");
    tok(&join(r2, "r2"), "the retried wait");
}

#[test]
fn bound_shared_grants_and_permits_end_with_their_connection() {
    let srv = Server::start();
    let mut c = srv.conn();
    set_config(&mut c, "notify-keyspace-events", "Kd");
    let mut sub = KeyspaceEvents::subscribe(&srv);
    let mut a = srv.conn();
    let ta = grant_kind(&mut a, "rw", "ra", 60_000, &["BOUND", "SHARED"]);
    let tb = grant_kind(&mut c, "rw", "rb", 60_000, &["SHARED"]);
    let tp = grant_kind(&mut a, "sem", "pa", 60_000, &["LIMIT", "1", "BOUND"]);
    let w = spawn_acq(&srv, "rw", "w", 60_000, &["BLOCK", "0"]);
    wait_blocked(&mut c, 1);
    let p = spawn_acq(&srv, "sem", "pb", 60_000, &["BLOCK", "0", "LIMIT", "1"]);
    wait_blocked(&mut c, 2);
    assert_eq!(flock_stat(&mut c, "bound_grants"), 2);
    // The holder's connection closes: its permit goes to the waiting permit; its read grant
    // ends, and the writer still waits for rb.
    drop(a);
    tok(
        &join(p, "pb"),
        "the permit after the bound holder's connection closed",
    );
    wait_until("ra's grant ends", || check(&mut c, "rw", ta) == 0);
    assert_eq!(check(&mut c, "sem", tp), 0);
    assert_eq!(
        holder_tokens(&mut c, "rw"),
        hv(&[("rb", tb)]),
        "rb's unbound grant lives on"
    );
    assert_eq!(kinfo(&mut c, "rw").waiters, 1, "the writer waits for rb");
    rel(&mut c, "rw", "rb");
    tok(&join(w, "w"), "the writer");
    sub.read_until(b"flock.closed");
    grant_kind(&mut c, "sentinel", "s", 60_000, &[]);
    sub.read_until(b"__keyspace@0__:sentinel");
    assert_eq!(
        (
            sub.count("rw", "flock.closed"),
            sub.count("sem", "flock.closed")
        ),
        (1, 1)
    );
    assert_eq!(flock_stat(&mut c, "bound_closed"), 2);
    assert_eq!(flock_stat(&mut c, "bound_grants"), 0);
    // pb is not bound: its thread's connection is gone, its permit stays.
    assert_eq!(owners(&mut c, "sem"), ["pb"]);
}

#[test]
fn inside_multi_and_scripts_block_answers_at_once_for_every_kind() {
    let srv = Server::start();
    let mut c = srv.conn();
    grant_kind(&mut c, "rw", "w", 60_000, &[]);
    grant_kind(&mut c, "sem", "p1", 60_000, &["LIMIT", "1"]);
    assert_eq!(call(&mut c, &["MULTI"]), Reply::Status("OK".into()));
    call(
        &mut c,
        &["FLOCK.ACQUIRE", "rw", "r", "1000", "SHARED", "BLOCK", "0"],
    );
    call(
        &mut c,
        &[
            "FLOCK.ACQUIRE",
            "sem",
            "p2",
            "1000",
            "LIMIT",
            "1",
            "BLOCK",
            "0",
        ],
    );
    call(
        &mut c,
        &["FLOCK.ACQUIRE", "free", "r", "1000", "SHARED", "BLOCK", "0"],
    );
    call(&mut c, &["FLOCK.HOLDERS", "rw"]);
    let t0 = Instant::now();
    let r = call(&mut c, &["EXEC"]);
    assert!(t0.elapsed() < Duration::from_secs(2), "EXEC blocked");
    let a = r.array().unwrap_or_else(|| panic!("EXEC: {r:?}"));
    assert_eq!(
        (a[0].clone(), a[1].clone()),
        (Reply::Nil, Reply::Nil),
        "EXEC: {r:?}"
    );
    tok(&a[2], "a free key inside MULTI");
    assert_eq!(parse_holders(&a[3], "HOLDERS in MULTI").len(), 1);
    let r = call(
        &mut c,
        &[
            "EVAL",
            "return redis.call('FLOCK.ACQUIRE', KEYS[1], 'r', '1000', 'SHARED', 'BLOCK', '0')",
            "1",
            "rw",
        ],
    );
    assert_eq!(r, Reply::Nil, "BLOCK inside a script answers at once");
    assert_eq!(
        kinfo(&mut c, "rw").waiters,
        0,
        "nobody waits after MULTI and EVAL"
    );
    assert_eq!(kinfo(&mut c, "sem").waiters, 0);
}

#[test]
fn deleting_a_write_locked_key_hands_it_to_the_run_of_waiting_readers() {
    let srv = Server::start();
    let mut c = srv.conn();
    let tw = grant_kind(&mut c, "rw", "w", 60_000, &[]);
    let r1 = spawn_acq(&srv, "rw", "r1", 60_000, &["SHARED", "BLOCK", "0"]);
    wait_blocked(&mut c, 1);
    let r2 = spawn_acq(&srv, "rw", "r2", 60_000, &["SHARED", "BLOCK", "0"]);
    wait_blocked(&mut c, 2);
    let w2 = spawn_acq(&srv, "rw", "w2", 60_000, &["BLOCK", "0"]);
    wait_blocked(&mut c, 3);
    assert_eq!(call(&mut c, &["DEL", "rw"]), Reply::Int(1));
    let t1 = tok(&join(r1, "r1"), "r1 after DEL");
    let t2 = tok(&join(r2, "r2"), "r2 after DEL");
    assert!(
        t1 > tw && t2 > t1,
        "tokens above the deleted grant's: {tw} {t1} {t2}"
    );
    wait_until("the readers hold the key", || {
        owners(&mut c, "rw") == ["r1", "r2"]
    });
    assert_eq!(
        kinfo(&mut c, "rw").waiters,
        1,
        "w2 still waits behind the readers"
    );
    rel(&mut c, "rw", "r1");
    rel(&mut c, "rw", "r2");
    tok(&join(w2, "w2"), "w2");
}

#[test]
fn grants_that_expire_together_each_count_and_each_hand_off() {
    let srv = Server::start();
    let mut c = srv.conn();
    set_config(&mut c, "notify-keyspace-events", "Kd");
    let mut sub = KeyspaceEvents::subscribe(&srv);
    let e0 = flock_stat(&mut c, "expirations");
    for i in 0..3 {
        grant_kind(&mut c, "sem", &format!("p{i}"), 60_000, &["LIMIT", "3"]);
    }
    let mut ws = Vec::new();
    for i in 0..3 {
        ws.push(spawn_acq(
            &srv,
            "sem",
            &format!("w{i}"),
            60_000,
            &["LIMIT", "3", "BLOCK", "0"],
        ));
        wait_blocked(&mut c, i + 1);
    }
    // The three leases end together (shortened once the waiters queued: a short lease from
    // the start could end before they are in the queue).
    for i in 0..3 {
        assert!(renew(&mut c, "sem", &format!("p{i}"), 100).is_some());
    }
    let mut last = 0;
    for (i, w) in ws.into_iter().enumerate() {
        let t = tok(&join(w, "w"), &format!("w{i} after the permits expired"));
        assert!(t > last);
        last = t;
    }
    assert_eq!(owners(&mut c, "sem"), ["w0", "w1", "w2"]);
    grant_kind(&mut c, "sentinel", "s", 60_000, &[]);
    sub.read_until(b"__keyspace@0__:sentinel");
    assert_eq!(sub.count("sem", "flock.expired"), 3);
    assert_eq!(sub.count("sem", "flock.acquired"), 6);
    assert_eq!(flock_stat(&mut c, "expirations") - e0, 3);
}

#[test]
fn a_reader_granted_as_its_connection_closes_is_released_again_and_the_queue_goes_on() {
    let srv = Server::start();
    let mut c = srv.conn();
    grant_kind(&mut c, "rw", "w", 60_000, &[]);
    let mut gone = srv.conn();
    let id = call(&mut gone, &["CLIENT", "ID"]).int().expect("CLIENT ID");
    let h = thread::spawn(move || {
        call_raw(
            &mut gone,
            &["FLOCK.ACQUIRE", "rw", "r1", "60000", "SHARED", "BLOCK", "0"],
        )
    });
    wait_blocked(&mut c, 1);
    let r2 = spawn_acq(&srv, "rw", "r2", 60_000, &["SHARED", "BLOCK", "0"]);
    wait_blocked(&mut c, 2);
    let w2 = spawn_acq(&srv, "rw", "w2", 60_000, &["BLOCK", "0"]);
    wait_blocked(&mut c, 3);
    // In one transaction: the release hands the key to r1 and r2, and r1's connection is
    // killed before its reply can be written: the grant to a client that has just gone away
    // is released again, r2 keeps its own.
    assert_eq!(call(&mut c, &["MULTI"]), Reply::Status("OK".into()));
    call(&mut c, &["FLOCK.RELEASE", "rw", "w"]);
    call(&mut c, &["CLIENT", "KILL", "ID", &id.to_string()]);
    let r = call(&mut c, &["EXEC"]);
    assert_eq!(r, Reply::Array(vec![Reply::Int(1), Reply::Int(1)]), "EXEC");
    assert!(
        h.join().expect("thread").is_err(),
        "r1's connection is closed"
    );
    tok(&join(r2, "r2"), "r2 in the run");
    wait_until("r1's orphaned grant is released", || {
        owners(&mut c, "rw") == ["r2"]
    });
    rel(&mut c, "rw", "r2");
    tok(&join(w2, "w2"), "w2 after r2 (r1's grant gone)");
}
