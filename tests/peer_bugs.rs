//! The worst bugs of the locks people use instead of flock, each as a regression test named
//! after its report, against a real server. What each report says went wrong there is the
//! test's first comment; the assertions say what flock does instead. (The client-side ones,
//! a renewal sent after release and a watchdog that dies after one connection error, are in
//! each client's own suite.)

use flock_testkit::*;
use std::thread;
use std::time::{Duration, Instant};

/// etcd#11456: a waiter whose session lease ran out while it waited was still granted the
/// lock, so it held a lock with no lease behind it. In flock a waiter's ttl counts from the
/// grant: however long it waited (here longer than its own ttl), it gets its whole lease, and
/// the lease still ends on time.
#[test]
fn etcd_11456_a_waiter_granted_after_waiting_longer_than_its_ttl_gets_its_whole_lease() {
    let srv = Server::start();
    let mut holder = srv.conn();
    let t1 = grant(&mut holder, "job", "first", 1500);
    let waiter = {
        let mut c = srv.conn();
        thread::spawn(move || {
            let asked = Instant::now();
            let r = call(
                &mut c,
                &["FLOCK.ACQUIRE", "job", "second", "600", "BLOCK", "5000"],
            );
            (r, asked.elapsed())
        })
    };
    let (reply, waited) = waiter.join().expect("waiter thread");
    let Reply::Int(t2) = reply else {
        panic!("the waiter was not granted: {reply:?}");
    };
    assert!(t2 > t1, "token {t2} not above the first holder's {t1}");
    assert!(
        waited >= Duration::from_millis(1200),
        "granted after {waited:?}: before the first lease ended"
    );
    // Waited more than its own 600 ms ttl, and still holds a fresh lease of about 600 ms.
    let left = check(&mut holder, "job", t2);
    assert!(
        (400..=600).contains(&left),
        "after waiting {waited:?} the new lease has {left} ms left, expected nearly 600"
    );
    // And it ends on time: not a lease that had run out while waiting, nor one that lasts.
    let ended = poll_until(Duration::from_secs(3), || {
        check(&mut holder, "job", t2) == 0
    });
    assert!(ended, "the waiter's 600 ms lease did not end");
    let t3 = grant(&mut holder, "job", "third", 1000);
    assert!(t3 > t2);
}

/// etcd#22082: an unlock retried after an ambiguous failure (the reply was lost) ended a
/// newer lock of the same owner, taken in between. flock's RELEASE can name the token: the
/// retried release of the old grant answers 0 and the newer grant stands.
#[test]
fn etcd_22082_a_retried_release_of_an_old_grant_never_ends_a_newer_one_of_the_same_owner() {
    let srv = Server::start();
    let mut c = srv.conn();
    let old = grant(&mut c, "res", "worker-1", 30_000);
    let first = call(
        &mut c,
        &["FLOCK.RELEASE", "res", "worker-1", &old.to_string()],
    );
    assert_eq!(first, Reply::Int(1));
    // The same owner takes the lock again before its first release's retry arrives.
    let new = grant(&mut c, "res", "worker-1", 30_000);
    assert!(new > old);
    let retried = call(
        &mut c,
        &["FLOCK.RELEASE", "res", "worker-1", &old.to_string()],
    );
    assert_eq!(
        retried,
        Reply::Int(0),
        "the retried release ended something"
    );
    assert!(
        check(&mut c, "res", new) > 29_000,
        "the newer grant {new} did not survive the retried release of {old}"
    );
    // Renewal and FENCED with the old token are refused the same way.
    let renew = call(
        &mut c,
        &["FLOCK.RENEW", "res", "worker-1", "30000", &old.to_string()],
    );
    assert_eq!(renew, Reply::Nil);
    let fenced = call(
        &mut c,
        &["FLOCK.FENCED", "res", &old.to_string(), "SET", "out", "x"],
    );
    assert!(fenced.is_err(), "FENCED with the old token ran: {fenced:?}");
    assert_eq!(exists(&mut c, "out"), 0);
}

/// redis-semaphore#175: a refresh of an expired lock silently took it again (a SET that did
/// not check it was still held), so two holders could each believe they held it. In flock a
/// RENEW of a grant that ran out answers nil and takes nothing, whether or not someone else
/// holds the key by then.
#[test]
fn redis_semaphore_175_a_renewal_after_expiry_never_takes_the_lock_again() {
    let srv = Server::start();
    let mut c = srv.conn();
    let t = grant(&mut c, "sem", "slow", 200);
    let gone = poll_until(Duration::from_secs(3), || check(&mut c, "sem", t) == 0);
    assert!(gone, "the 200 ms lease did not end");
    // Nobody holds it: the late renewal still takes nothing.
    let r = call(&mut c, &["FLOCK.RENEW", "sem", "slow", "30000"]);
    assert_eq!(r, Reply::Nil, "a renewal after expiry answered {r:?}");
    assert_eq!(
        exists(&mut c, "sem"),
        0,
        "the late renewal left a lock behind"
    );
    // Someone else holds it: the late renewal (with or without the token) changes nothing.
    let other = grant(&mut c, "sem", "fast", 30_000);
    assert_eq!(
        call(&mut c, &["FLOCK.RENEW", "sem", "slow", "30000"]),
        Reply::Nil
    );
    let with_token = call(
        &mut c,
        &["FLOCK.RENEW", "sem", "slow", "30000", &t.to_string()],
    );
    assert_eq!(with_token, Reply::Nil);
    let (owner, token, _) = held(&mut c, "sem");
    assert_eq!((owner.as_str(), token), ("fast", other));
    // The same for a shared and a counted key.
    let s = grant_kind_token(&mut c, "ro", "reader", 200, &["SHARED"]);
    let p = grant_kind_token(&mut c, "slots", "user", 200, &["LIMIT", "3"]);
    let both_gone = poll_until(Duration::from_secs(3), || {
        check(&mut c, "ro", s) == 0 && check(&mut c, "slots", p) == 0
    });
    assert!(both_gone);
    assert_eq!(
        call(&mut c, &["FLOCK.RENEW", "ro", "reader", "30000"]),
        Reply::Nil
    );
    assert_eq!(
        call(&mut c, &["FLOCK.RENEW", "slots", "user", "30000"]),
        Reply::Nil
    );
    assert_eq!(dbsize(&mut c), 1, "only `sem` should be left");
}

/// FLOCK.ACQUIRE of another kind (`SHARED`, `LIMIT n`), which must grant.
fn grant_kind_token(
    c: &mut redis::Connection,
    key: &str,
    owner: &str,
    ttl: i64,
    kind: &[&str],
) -> i64 {
    let ttl = ttl.to_string();
    let mut args = vec!["FLOCK.ACQUIRE", key, owner, ttl.as_str()];
    args.extend_from_slice(kind);
    match call(c, &args) {
        Reply::Int(t) => t,
        other => panic!("FLOCK.ACQUIRE {key} {kind:?}: {other:?}"),
    }
}
