//! FLOCK.STATS counts a lock's events for the class of the name it has when they happen, also
//! when the module keeps the class beside the lock (found once per grant): a lock renamed or
//! copied to a name of another class counts there from then on, and one held across a RESET
//! counts for a class of the new table.
use flock_testkit::*;

/// (grants, released, renewals) of `class`, None when the class was never seen.
fn counts(c: &mut redis::Connection, class: &str) -> Option<(i64, i64, i64)> {
    let top = map_of(&call(c, &["FLOCK.STATS", "GET", class]));
    let classes = top.get("classes").map(map_of).expect("classes");
    let m = map_of(classes.get(class)?);
    let int = |k: &str| m.get(k).and_then(Reply::int).expect(k);
    Some((int("grants"), int("released"), int("renewals")))
}

#[test]
fn a_renamed_lock_counts_for_its_new_class() {
    let srv = Server::start();
    let mut c = srv.conn();
    grant(&mut c, "a:1", "o", 60_000);
    assert!(renew(&mut c, "a:1", "o", 60_000).is_some());
    assert_eq!(
        call(&mut c, &["RENAME", "a:1", "b:1"]),
        Reply::Status("OK".into())
    );
    assert!(renew(&mut c, "b:1", "o", 60_000).is_some());
    assert_eq!(release(&mut c, "b:1", "o"), 1);
    assert_eq!(counts(&mut c, "a:#"), Some((1, 0, 1)));
    assert_eq!(counts(&mut c, "b:#"), Some((0, 1, 1)));
}

#[test]
fn a_copied_lock_counts_for_the_class_of_the_copy() {
    let srv = Server::start();
    let mut c = srv.conn();
    grant(&mut c, "src:1", "o", 60_000);
    assert_eq!(call(&mut c, &["COPY", "src:1", "dst:1"]), Reply::Int(1));
    assert_eq!(release(&mut c, "dst:1", "o"), 1);
    assert_eq!(release(&mut c, "src:1", "o"), 1);
    assert_eq!(counts(&mut c, "src:#"), Some((1, 1, 0)));
    assert_eq!(counts(&mut c, "dst:#"), Some((0, 1, 0)));
}

#[test]
fn a_lock_held_across_a_reset_counts_in_the_new_table() {
    let srv = Server::start();
    let mut c = srv.conn();
    grant(&mut c, "r:1", "o", 60_000);
    grant(&mut c, "other:1", "o", 60_000);
    assert_eq!(
        call(&mut c, &["FLOCK.STATS", "RESET"]),
        Reply::Status("OK".into())
    );
    // A class made after the RESET takes the first place of the new table: the release of
    // r:1 must not land there.
    grant(&mut c, "first:1", "o", 60_000);
    assert_eq!(release(&mut c, "r:1", "o"), 1);
    assert_eq!(counts(&mut c, "first:#"), Some((1, 0, 0)));
    assert_eq!(counts(&mut c, "r:#"), Some((0, 1, 0)));
    assert_eq!(counts(&mut c, "other:#"), None);
}
