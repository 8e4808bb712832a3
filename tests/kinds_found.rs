//! Deviations from shared/SPEC.md ("Lock kinds") that the kinds work of the history checker
//! (tests/chaos/, issue #13) ran into, each as a minimal reproduction. They fail until the
//! module is fixed (or the contract changed); src/ is not this file's business.

use flock_testkit::*;
use std::thread::{self, JoinHandle};

/// FLOCK.ACQUIRE ... BLOCK 0 on its own connection, from a thread: its reply.
fn spawn_wait(srv: &Server, key: &str, owner: &str) -> JoinHandle<Reply> {
    let mut con = srv.conn();
    let (key, owner) = (key.to_string(), owner.to_string());
    thread::spawn(move || {
        call(
            &mut con,
            &["FLOCK.ACQUIRE", &key, &owner, "10000", "BLOCK", "0"],
        )
    })
}

fn blocked_clients(c: &mut redis::Connection) -> i64 {
    info_i64(c, "clients", "blocked_clients")
}

/// SPEC: "A BLOCK request from an owner that already waits for the key takes the earlier
/// request's place (the earlier one gets nil), so a retried wait is safe." The retry must keep
/// the earlier request's place in the queue: a waiter who came after the first request is not
/// served before the retried one. The module queues the retry at the end
/// (flock-core queue.rs `push`), so a client that retries its wait loses its turn to everyone
/// who arrived meanwhile.
#[test]
fn a_retried_wait_keeps_the_earlier_requests_place() {
    let srv = Server::start();
    let mut c = srv.conn();
    grant(&mut c, "lk", "holder", 30_000);
    let first = spawn_wait(&srv, "lk", "x");
    wait_until("x waits", || blocked_clients(&mut c) == 1);
    let behind = spawn_wait(&srv, "lk", "y");
    wait_until("y waits behind x", || blocked_clients(&mut c) == 2);
    // x retries its wait (say its client timed out locally and sent the request again).
    let retry = spawn_wait(&srv, "lk", "x");
    let r = first.join().expect("first request of x");
    assert_eq!(r, Reply::Nil, "the replaced request gets nil");
    wait_until("the retry waits, y still waits", || {
        blocked_clients(&mut c) == 2
    });
    assert_eq!(release(&mut c, "lk", "holder"), 1);
    // One grant at a time (exclusive): whoever is first in the queue gets the key now.
    wait_until("one waiter granted", || blocked_clients(&mut c) == 1);
    let holders = call(&mut c, &["FLOCK.HOLDERS", "lk"]);
    let first_owner = holders
        .array()
        .and_then(|a| a.first())
        .and_then(|g| g.array())
        .and_then(|g| g.first())
        .and_then(|o| o.string());
    assert_eq!(
        first_owner.as_deref(),
        Some("x"),
        "the retried wait of x lost its place to y, who queued after x's first request: \
         HOLDERS {holders:?}"
    );
    call(&mut c, &["FLOCK.REVOKE", "lk"]);
    let _ = (retry.join(), behind.join());
}
