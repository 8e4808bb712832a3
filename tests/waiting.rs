//! Waiting without polling (FLOCK.ACQUIRE ... BLOCK), REVOKE, lock-delay, INFO and keyspace
//! events. Each waiter is a thread with its own connection; order and outcome are asserted
//! with generous time bounds (CI machines are loaded 2-core boxes).

use flock_testkit::*;
use std::io::Write;
use std::net::TcpStream;
use std::thread::{self, sleep, JoinHandle};
use std::time::{Duration, Instant};

/// A client blocked in FLOCK.ACQUIRE on its own connection: its reply and how long it waited.
fn spawn_acquire(
    srv: &Server,
    key: &str,
    owner: &str,
    ttl: i64,
    block_ms: i64,
) -> JoinHandle<(Reply, Duration)> {
    let mut con = srv.conn();
    let (key, owner) = (key.to_string(), owner.to_string());
    thread::spawn(move || {
        let start = Instant::now();
        let r = call(
            &mut con,
            &[
                "FLOCK.ACQUIRE",
                &key,
                &owner,
                &ttl.to_string(),
                "BLOCK",
                &block_ms.to_string(),
            ],
        );
        (r, start.elapsed())
    })
}

fn token_of(r: &Reply, what: &str) -> i64 {
    r.int()
        .unwrap_or_else(|| panic!("{what}: expected a token, got {r:?}"))
}

#[test]
fn release_hands_off_in_arrival_order() {
    let srv = Server::start();
    let mut c = srv.conn();
    let mut last = grant(&mut c, "lk", "holder", 30_000);
    let mut waiters = Vec::new();
    for i in 0..4 {
        waiters.push(spawn_acquire(&srv, "lk", &format!("w{i}"), 30_000, 0));
        wait_blocked(&mut c, i + 1);
    }
    assert_eq!(info(&mut c, "lk").map(|i| i.waiters), Some(4));
    assert_eq!(flock_stat(&mut c, "blocked_clients"), 4);
    let mut holder = "holder".to_string();
    for (i, w) in waiters.into_iter().enumerate() {
        assert_eq!(release(&mut c, "lk", &holder), 1);
        let (r, _) = w.join().expect("waiter thread");
        let t = token_of(&r, &format!("waiter w{i}"));
        assert!(t > last, "token {t} not above {last}");
        holder = format!("w{i}");
        let (o, tok, _) = held(&mut c, "lk");
        assert_eq!(
            (o.as_str(), tok),
            (holder.as_str(), t),
            "w{i} holds the key"
        );
        assert_eq!(info(&mut c, "lk").map(|i| i.waiters), Some(3 - i as i64));
        last = t;
    }
    assert_eq!(release(&mut c, "lk", &holder), 1);
    assert_eq!(exists(&mut c, "lk"), 0, "no holder, no waiter: no key");
}

#[test]
fn expiry_wakes_the_waiter_when_the_lease_ends() {
    let srv = Server::start();
    let mut c = srv.conn();
    let t1 = grant(&mut c, "lk", "a", 300);
    let w = spawn_acquire(&srv, "lk", "b", 5_000, 20_000);
    let (r, waited) = w.join().expect("waiter");
    let t2 = token_of(&r, "waiter b");
    assert!(t2 > t1);
    assert!(
        waited < Duration::from_secs(5),
        "woken after {waited:?}: at the lease's end, not the waiter's timeout"
    );
    assert_eq!(held(&mut c, "lk").0, "b");
    assert_eq!(check(&mut c, "lk", t1), 0);
}

#[test]
fn revoke_ends_the_grant_and_hands_off() {
    let srv = Server::start();
    let mut c = srv.conn();
    assert_eq!(
        call(&mut c, &["FLOCK.REVOKE", "lk"]).int(),
        Some(0),
        "nothing to revoke"
    );
    let t1 = grant(&mut c, "lk", "hung", 60_000);
    let w = spawn_acquire(&srv, "lk", "next", 10_000, 0);
    wait_blocked(&mut c, 1);
    assert_eq!(call(&mut c, &["FLOCK.REVOKE", "lk"]).int(), Some(1));
    let t2 = token_of(&w.join().expect("waiter").0, "waiter");
    assert!(t2 > t1);
    assert_eq!(check(&mut c, "lk", t1), 0, "revoked token is stale");
    assert_eq!(
        renew(&mut c, "lk", "hung", 1000),
        None,
        "revoked owner cannot renew"
    );
    assert_eq!(release(&mut c, "lk", "hung"), 0);
    assert_eq!(held(&mut c, "lk").0, "next");
    assert_eq!(flock_stat(&mut c, "revokes"), 1);
    // Revoke with nobody waiting: the key goes away.
    assert_eq!(call(&mut c, &["FLOCK.REVOKE", "lk"]).int(), Some(1));
    assert_eq!(exists(&mut c, "lk"), 0);
}

#[test]
fn deleting_the_key_hands_it_to_the_first_waiter() {
    for how in [
        &["DEL", "lk"][..],
        &["UNLINK", "lk"],
        &["FLUSHALL"],
        &["FLUSHDB"],
        &["FLUSHALL", "ASYNC"],
    ] {
        let srv = Server::start();
        let mut c = srv.conn();
        let t1 = grant(&mut c, "lk", "a", 60_000);
        let w1 = spawn_acquire(&srv, "lk", "b", 10_000, 0);
        wait_blocked(&mut c, 1);
        let w2 = spawn_acquire(&srv, "lk", "c", 10_000, 0);
        wait_blocked(&mut c, 2);
        call(&mut c, how);
        let t2 = token_of(
            &w1.join().expect("w1").0,
            &format!("first waiter after {how:?}"),
        );
        assert!(t2 > t1, "{how:?}: token {t2} not above {t1}");
        let (o, tok, _) = held(&mut c, "lk");
        assert_eq!((o.as_str(), tok), ("b", t2), "{how:?}");
        assert_eq!(info(&mut c, "lk").map(|i| i.waiters), Some(1), "{how:?}");
        assert_eq!(release(&mut c, "lk", "b"), 1);
        let t3 = token_of(&w2.join().expect("w2").0, "second waiter");
        assert!(t3 > t2);
    }
}

#[test]
fn waiters_of_a_renamed_moved_or_overwritten_key_are_answered() {
    let srv = Server::start();
    let mut c = srv.conn();
    // RENAME: the name is free again, the waiter gets it; the moved lock keeps its holder.
    let t1 = grant(&mut c, "lk", "a", 60_000);
    let w = spawn_acquire(&srv, "lk", "b", 10_000, 0);
    wait_blocked(&mut c, 1);
    call(&mut c, &["RENAME", "lk", "other"]);
    let t2 = token_of(&w.join().expect("waiter").0, "after RENAME");
    assert!(t2 > t1);
    let (o, tok, _) = held(&mut c, "other");
    assert_eq!(
        (o.as_str(), tok),
        ("a", t1),
        "the renamed lock keeps its holder"
    );
    // MOVE to another database: same.
    let w = spawn_acquire(&srv, "lk", "c", 10_000, 0);
    wait_blocked(&mut c, 1);
    call(&mut c, &["MOVE", "lk", "1"]);
    let t3 = token_of(&w.join().expect("waiter").0, "after MOVE");
    assert!(t3 > t2);
    // SWAPDB: database 0 now holds what was in 1 (b's lock), still held: keep waiting;
    // swapping back brings c's lock, which c holds; the waiter gets it when c releases.
    let w = spawn_acquire(&srv, "lk", "d", 10_000, 0);
    wait_blocked(&mut c, 1);
    assert_eq!(
        call(&mut c, &["SWAPDB", "0", "1"]),
        Reply::Status("OK".into())
    );
    sleep(Duration::from_millis(100));
    assert_eq!(
        blocked_clients(&mut c),
        1,
        "the key in db 0 is still held: keep waiting"
    );
    assert_eq!(held(&mut c, "lk").0, "b");
    assert_eq!(release(&mut c, "lk", "b"), 1);
    let t4 = token_of(&w.join().expect("waiter").0, "after SWAPDB and release");
    assert!(t4 > t3);
    // Overwritten by another type: a clear error.
    let w = spawn_acquire(&srv, "lk", "e", 10_000, 0);
    wait_blocked(&mut c, 1);
    call(&mut c, &["SET", "lk", "a string"]);
    let (r, _) = w.join().expect("waiter");
    assert_err_prefix(&r, "ERR", "waiter of an overwritten key");
    assert_eq!(blocked_clients(&mut c), 0);
    // Overwritten by a command of another family (a set stored over it).
    call(&mut c, &["DEL", "lk"]);
    grant(&mut c, "lk", "a", 60_000);
    let w = spawn_acquire(&srv, "lk", "f", 10_000, 0);
    wait_blocked(&mut c, 1);
    call(&mut c, &["SADD", "src", "m"]);
    assert_eq!(call(&mut c, &["SUNIONSTORE", "lk", "src"]).int(), Some(1));
    let (r, _) = w.join().expect("waiter");
    assert_err_prefix(&r, "ERR", "waiter of a key overwritten by SUNIONSTORE");
    assert_eq!(blocked_clients(&mut c), 0);
}

#[test]
fn timeout_gives_nil_and_leaves_the_queue() {
    let srv = Server::start();
    let mut c = srv.conn();
    grant(&mut c, "lk", "a", 60_000);
    let (r, waited) = spawn_acquire(&srv, "lk", "b", 1000, 200)
        .join()
        .expect("waiter");
    assert!(r.is_nil(), "timeout reply {r:?}");
    assert!(
        waited >= Duration::from_millis(150),
        "timed out after only {waited:?}"
    );
    assert_eq!(info(&mut c, "lk").map(|i| i.waiters), Some(0));
    assert_eq!(blocked_clients(&mut c), 0);
    assert_eq!(flock_stat(&mut c, "timeouts"), 1);
    // Its leaving does not disturb the holder, and a release with nobody waiting frees the key.
    assert_eq!(release(&mut c, "lk", "a"), 1);
    assert_eq!(exists(&mut c, "lk"), 0);
}

#[test]
fn client_unblock_gives_nil() {
    let srv = Server::start();
    let mut c = srv.conn();
    grant(&mut c, "lk", "a", 60_000);
    let w = spawn_acquire(&srv, "lk", "b", 1000, 0);
    wait_blocked(&mut c, 1);
    let list = call(&mut c, &["CLIENT", "LIST"])
        .string()
        .unwrap_or_default();
    let id = list
        .lines()
        .find(|l| l.contains("cmd=flock.acquire"))
        .and_then(|l| l.split_whitespace().next())
        .and_then(|f| f.strip_prefix("id="))
        .expect("the blocked client in CLIENT LIST")
        .to_string();
    assert_eq!(call(&mut c, &["CLIENT", "UNBLOCK", &id]).int(), Some(1));
    let (r, _) = w.join().expect("waiter");
    assert!(r.is_nil(), "CLIENT UNBLOCK reply {r:?}");
    assert_eq!(info(&mut c, "lk").map(|i| i.waiters), Some(0));
}

/// A raw connection that sends one command and can be dropped without reading the reply.
fn raw_block(srv: &Server, key: &str, owner: &str) -> TcpStream {
    let mut s = TcpStream::connect(("127.0.0.1", srv.port())).expect("connect");
    let args = ["FLOCK.ACQUIRE", key, owner, "10000", "BLOCK", "0"];
    let mut cmd = format!("*{}\r\n", args.len());
    for a in args {
        cmd.push_str(&format!("${}\r\n{}\r\n", a.len(), a));
    }
    s.write_all(cmd.as_bytes()).expect("send");
    s
}

#[test]
fn a_waiter_that_disconnects_leaves_the_queue() {
    let srv = Server::start();
    let mut c = srv.conn();
    grant(&mut c, "lk", "a", 60_000);
    let gone = raw_block(&srv, "lk", "ghost");
    wait_blocked(&mut c, 1);
    let w = spawn_acquire(&srv, "lk", "b", 10_000, 0);
    wait_blocked(&mut c, 2);
    drop(gone);
    wait_until("the disconnected waiter leaves", || {
        info(&mut c, "lk").map(|i| i.waiters) == Some(1)
    });
    assert_eq!(release(&mut c, "lk", "a"), 1);
    token_of(&w.join().expect("waiter").0, "the waiter behind the ghost");
    assert_eq!(held(&mut c, "lk").0, "b");
}

#[test]
fn a_grant_to_a_client_that_just_went_away_is_passed_on() {
    // The grant and the waiter's disconnect land in the same event-loop iteration (the server
    // is asleep while both happen). Whichever Redis processes first, the lock must end with
    // the next waiter, never stuck on the ghost.
    for round in 0..4 {
        let srv = Server::start();
        let mut c = srv.conn();
        let mut sleeper = srv.conn();
        let mut holder = srv.conn();
        grant(&mut holder, "lk", "a", 60_000);
        let ghost = raw_block(&srv, "lk", "ghost");
        wait_blocked(&mut c, 1);
        let w = spawn_acquire(&srv, "lk", "b", 10_000, 0);
        wait_blocked(&mut c, 2);
        let pause = thread::spawn(move || call(&mut sleeper, &["DEBUG", "SLEEP", "0.3"]));
        sleep(Duration::from_millis(100));
        // While the server sleeps: the holder releases and the first waiter vanishes.
        let rel = thread::spawn(move || release(&mut holder, "lk", "a"));
        sleep(Duration::from_millis(20));
        let _ = ghost.shutdown(std::net::Shutdown::Both);
        drop(ghost);
        pause.join().expect("sleeper");
        assert_eq!(rel.join().expect("release"), 1);
        let (r, _) = w.join().expect("waiter");
        let t = token_of(&r, &format!("round {round}: the waiter behind the ghost"));
        let (o, tok, _) = held(&mut c, "lk");
        assert_eq!((o.as_str(), tok), ("b", t), "round {round}");
    }
}

#[test]
fn block_inside_multi_and_scripts_answers_at_once() {
    let srv = Server::start();
    let mut c = srv.conn();
    grant(&mut c, "lk", "a", 60_000);
    let start = Instant::now();
    let mut m = srv.conn();
    call(&mut m, &["MULTI"]);
    call(&mut m, &["FLOCK.ACQUIRE", "lk", "b", "1000", "BLOCK", "0"]);
    call(
        &mut m,
        &["FLOCK.ACQUIRE", "free", "b", "1000", "BLOCK", "0"],
    );
    let r = call(&mut m, &["EXEC"]);
    let items = r.array().expect("EXEC array").to_vec();
    assert!(items[0].is_nil(), "busy key in MULTI: {:?}", items[0]);
    assert!(
        items[1].int().is_some(),
        "free key in MULTI: {:?}",
        items[1]
    );
    let script = "return redis.call('FLOCK.ACQUIRE', KEYS[1], 'b', 1000, 'BLOCK', 0)";
    let r = call(&mut c, &["EVAL", script, "1", "lk"]);
    assert!(r.is_nil(), "busy key in a script: {r:?}");
    assert!(
        start.elapsed() < Duration::from_secs(5),
        "blocked inside MULTI/script"
    );
    assert_eq!(blocked_clients(&mut c), 0);
}

#[test]
fn max_waiters_bounds_the_queue() {
    let srv = Server::builder().module_args(&["max-waiters", "2"]).start();
    let mut c = srv.conn();
    assert_eq!(
        call(&mut c, &["CONFIG", "GET", "flock.max-waiters"])
            .array()
            .map(|a| a[1].clone()),
        Some(Reply::Bulk(b"2".to_vec()))
    );
    grant(&mut c, "lk", "a", 60_000);
    let w1 = spawn_acquire(&srv, "lk", "b", 1000, 0);
    wait_blocked(&mut c, 1);
    let w2 = spawn_acquire(&srv, "lk", "c", 1000, 0);
    wait_blocked(&mut c, 2);
    let r = call(&mut c, &["FLOCK.ACQUIRE", "lk", "d", "1000", "BLOCK", "0"]);
    assert_err_contains(&r, "max-waiters", "third waiter");
    assert_eq!(
        info(&mut c, "lk").map(|i| i.waiters),
        Some(2),
        "nothing queued"
    );
    // 0: nobody may wait.
    call(&mut c, &["CONFIG", "SET", "flock.max-waiters", "0"]);
    let r = call(&mut c, &["FLOCK.ACQUIRE", "other", "x", "1000"]);
    assert!(r.int().is_some());
    let r = call(
        &mut c,
        &["FLOCK.ACQUIRE", "other", "y", "1000", "BLOCK", "0"],
    );
    assert_err_contains(&r, "max-waiters", "max-waiters 0");
    assert_eq!(release(&mut c, "lk", "a"), 1);
    token_of(&w1.join().expect("w1").0, "w1");
    assert_eq!(release(&mut c, "lk", "b"), 1);
    token_of(&w2.join().expect("w2").0, "w2");
}

#[test]
fn lock_delay_holds_the_key_after_expiry_and_revoke_but_not_release() {
    // 2 s of delay: the checks that the key is still delayed get 2 s on a loaded machine.
    let srv = Server::builder()
        .module_args(&["lock-delay-ms", "2000"])
        .start();
    let mut c = srv.conn();
    // Release is never delayed.
    grant(&mut c, "lk", "a", 10_000);
    assert_eq!(release(&mut c, "lk", "a"), 1);
    assert!(
        acquire(&mut c, "lk", "b", 10_000).is_some(),
        "release must not delay"
    );
    assert_eq!(release(&mut c, "lk", "b"), 1);
    // Expiry: nobody, not even the old owner, gets the key during the delay.
    // Sent no later than granted: the lease ends no earlier than sent + 100 ms, the delay
    // no earlier than sent + 2100 ms.
    let sent = Instant::now();
    let t1 = grant(&mut c, "lk", "a", 100);
    wait_until("lease ran out", || check(&mut c, "lk", t1) == 0);
    assert_eq!(
        acquire(&mut c, "lk", "b", 10_000),
        None,
        "granted during lock-delay"
    );
    assert_eq!(
        acquire(&mut c, "lk", "a", 10_000),
        None,
        "old owner granted during lock-delay"
    );
    let i = info(&mut c, "lk").expect("key in lock-delay exists");
    assert_eq!((i.owner, i.token, i.ttl), (None, t1, 0));
    // A waiter waits through the delay and is granted when it ends.
    let (r, _) = spawn_acquire(&srv, "lk", "w", 10_000, 0)
        .join()
        .expect("waiter");
    let t2 = token_of(&r, "waiter through the lock-delay");
    assert!(t2 > t1);
    // (10 ms for the servers' ms clocks)
    assert!(
        sent.elapsed() >= Duration::from_millis(100 + 2000 - 10),
        "granted {:?} after the 100 ms grant was sent, lock-delay is 2000 ms from the deadline",
        sent.elapsed()
    );
    // Revoke: delay counted from the revoke.
    assert_eq!(call(&mut c, &["FLOCK.REVOKE", "lk"]).int(), Some(1));
    assert_eq!(
        acquire(&mut c, "lk", "x", 10_000),
        None,
        "granted right after revoke"
    );
    wait_until("delay after revoke ends", || {
        acquire(&mut c, "lk", "x", 10_000).is_some()
    });
    // With nobody waiting the delayed key disappears when the delay ends.
    let t3 = info(&mut c, "lk").expect("held").token;
    assert_eq!(call(&mut c, &["FLOCK.REVOKE", "lk"]).int(), Some(1));
    assert_eq!(exists(&mut c, "lk"), 1, "in lock-delay the key exists");
    assert_eq!(check(&mut c, "lk", t3), 0);
    wait_until("the delayed key leaves the keyspace", || {
        exists(&mut c, "lk") == 0
    });
}

#[test]
fn the_holder_asking_with_block_gets_its_token_at_once() {
    let srv = Server::start();
    let mut c = srv.conn();
    let t = grant(&mut c, "lk", "a", 10_000);
    let r = call(&mut c, &["FLOCK.ACQUIRE", "lk", "a", "10000", "BLOCK", "0"]);
    assert_eq!(r.int(), Some(t));
    // The same owner waiting twice on one key waits once: the second request takes the
    // first one's place in the queue (the first gets nil), so a retried wait is safe.
    let w1 = spawn_acquire(&srv, "lk", "dup", 10_000, 0);
    wait_blocked(&mut c, 1);
    let other = spawn_acquire(&srv, "lk", "other", 10_000, 0);
    wait_blocked(&mut c, 2);
    let w2 = spawn_acquire(&srv, "lk", "dup", 10_000, 0);
    let (r1, _) = w1.join().expect("w1");
    assert!(r1.is_nil(), "the replaced request gets nil, got {r1:?}");
    wait_blocked(&mut c, 2);
    assert_eq!(info(&mut c, "lk").map(|i| i.waiters), Some(2));
    // The retried request kept the first one's turn, ahead of "other".
    assert_eq!(release(&mut c, "lk", "a"), 1);
    let t2 = token_of(&w2.join().expect("w2").0, "retried dup");
    assert_eq!(release(&mut c, "lk", "dup"), 1);
    let t_other = token_of(&other.join().expect("other").0, "other");
    assert!(t_other > t2 && t2 > t);
}

#[test]
fn info_flock_counts_what_happened() {
    let srv = Server::start();
    let mut c = srv.conn();
    grant(&mut c, "lk", "a", 60_000);
    assert_eq!(acquire(&mut c, "lk", "b", 1000), None);
    renew(&mut c, "lk", "a", 60_000).expect("renewed");
    let w = spawn_acquire(&srv, "lk", "w", 100, 0);
    wait_blocked(&mut c, 1);
    assert_eq!(flock_stat(&mut c, "blocked_clients"), 1);
    assert_eq!(release(&mut c, "lk", "a"), 1);
    w.join().expect("waiter");
    wait_until("the waiter's short lease expires", || {
        exists(&mut c, "lk") == 0
    });
    grant(&mut c, "lk", "r", 60_000);
    call(&mut c, &["FLOCK.REVOKE", "lk"]);
    spawn_acquire(&srv, "x", "y", 100, 0)
        .join()
        .expect("free key");
    grant(&mut c, "busy", "a", 60_000);
    spawn_acquire(&srv, "busy", "t", 100, 50)
        .join()
        .expect("timeout");
    for (name, at_least) in [
        ("grants", 4),
        ("releases", 1),
        ("expirations", 1),
        ("revokes", 1),
        ("renewals", 1),
        ("contended_acquires", 3),
        ("blocked_acquires", 2),
        ("timeouts", 1),
    ] {
        let v = flock_stat(&mut c, name);
        assert!(
            v >= at_least,
            "flock_{name} = {v}, expected at least {at_least}"
        );
    }
    assert_eq!(flock_stat(&mut c, "blocked_clients"), 0);
}

#[test]
fn keyspace_events_for_acquire_release_expire_revoke() {
    let srv = Server::start();
    let mut c = srv.conn();
    let mut sub = KeyspaceEvents::subscribe(&srv);
    grant(&mut c, "lk", "a", 60_000);
    sub.read_until(b"flock.acquired");
    release(&mut c, "lk", "a");
    sub.read_until(b"flock.released");
    grant(&mut c, "lk", "a", 50);
    sub.read_until(b"flock.expired");
    grant(&mut c, "lk", "a", 60_000);
    call(&mut c, &["FLOCK.REVOKE", "lk"]);
    sub.read_until(b"flock.revoked");
}

#[test]
fn a_demoted_master_answers_its_waiters() {
    let other = Server::start();
    let srv = Server::start();
    let mut c = srv.conn();
    grant(&mut c, "lk", "a", 60_000);
    let w = spawn_acquire(&srv, "lk", "b", 10_000, 0);
    wait_blocked(&mut c, 1);
    call(
        &mut c,
        &["REPLICAOF", "127.0.0.1", &other.port().to_string()],
    );
    let (r, waited) = w.join().expect("waiter");
    assert!(
        r.is_err(),
        "a demoted master's waiter must get an error, got {r:?}"
    );
    assert!(waited < Duration::from_secs(10));
}

#[test]
fn a_grant_to_a_waiter_is_replicated_like_a_direct_grant() {
    let master = Server::start();
    let replica = Server::start_replica_of(&master);
    let mut m = master.conn();
    let mut r = replica.conn();
    grant(&mut m, "lk", "a", 60_000);
    let w = spawn_acquire(&master, "lk", "b", 30_000, 0);
    wait_blocked(&mut m, 1);
    assert_eq!(release(&mut m, "lk", "a"), 1);
    let t = token_of(&w.join().expect("waiter").0, "waiter");
    wait_replica(&mut m);
    let (o, tok, ttl) = held(&mut r, "lk");
    assert_eq!((o.as_str(), tok), ("b", t));
    assert!(ttl > 20_000 && ttl <= 30_000, "replica ttl {ttl}");
    assert_eq!(
        call(&mut m, &["DEBUG", "DIGEST"]),
        call(&mut r, &["DEBUG", "DIGEST"]),
        "master and replica datasets differ"
    );
}
