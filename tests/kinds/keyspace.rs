//! Waiters served by what their key name holds after RENAME, SWAPDB, RESTORE and COPY.

use super::helpers::*;
use flock_testkit::*;

#[test]
fn waiters_are_served_by_what_their_key_name_holds_after_rename_and_swapdb() {
    let srv = Server::start();
    let mut c = srv.conn();
    // RENAME of a read-locked key: the waiting writer gets the free name; the readers move.
    let t1 = grant_kind(&mut c, "lk", "r1", 60_000, &["SHARED"]);
    let w = spawn_acq(&srv, "lk", "w", 60_000, &["BLOCK", "0"]);
    wait_blocked(&mut c, 1);
    assert_eq!(
        call(&mut c, &["RENAME", "lk", "moved"]),
        Reply::Status("OK".into())
    );
    let tw = tok(&join(w, "w"), "the writer after RENAME");
    assert!(tw > t1);
    assert_eq!(holder_tokens(&mut c, "moved"), hv(&[("r1", t1)]));
    assert_eq!(shape(&mut c, "moved"), sh("shared", 1, 0, 0, 0));
    // SWAPDB brings a read-locked key under the name a reader waits for (behind an
    // exclusive holder): the reader fits now and is granted.
    call(&mut c, &["SELECT", "1"]);
    grant_kind(&mut c, "lk", "s1", 60_000, &["SHARED"]);
    call(&mut c, &["SELECT", "0"]);
    let r = spawn_acq(&srv, "lk", "r2", 60_000, &["SHARED", "BLOCK", "0"]);
    wait_blocked(&mut c, 1);
    assert_eq!(
        call(&mut c, &["SWAPDB", "0", "1"]),
        Reply::Status("OK".into())
    );
    let ok = poll_until(DEADLINE, || owners(&mut c, "lk").len() == 2);
    assert!(
        ok,
        "after SWAPDB the waiting reader fits the read-locked key but was not granted within \
         {DEADLINE:?}: HOLDERS {:?}, INFO {:?}",
        owners(&mut c, "lk"),
        kinfo(&mut c, "lk")
    );
    tok(&join(r, "r2"), "the reader after SWAPDB");
    assert_eq!(owners(&mut c, "lk"), ["s1", "r2"]);
}

#[test]
fn waiters_are_served_by_a_read_locked_value_restored_or_copied_over_their_key() {
    let srv = Server::start();
    let mut c = srv.conn();
    grant_kind(&mut c, "src", "s1", 60_000, &["SHARED"]);
    let payload = call(&mut c, &["DUMP", "src"])
        .bytes()
        .expect("DUMP")
        .to_vec();
    for how in ["RESTORE", "COPY"] {
        grant_kind(&mut c, "lk", "w", 60_000, &[]);
        let r = spawn_acq(&srv, "lk", "r", 60_000, &["SHARED", "BLOCK", "0"]);
        wait_blocked(&mut c, 1);
        let reply = if how == "RESTORE" {
            call(
                &mut c,
                &[b"RESTORE".as_slice(), b"lk", b"0", &payload, b"REPLACE"],
            )
        } else {
            call(&mut c, &["COPY", "src", "lk", "REPLACE"])
        };
        assert!(!reply.is_err(), "{how}: {reply:?}");
        // The name now holds a read lock: the waiting reader fits and is granted.
        let ok = poll_until(DEADLINE, || owners(&mut c, "lk").len() == 2);
        assert!(
            ok,
            "{how} REPLACE put a read-locked value under the name a reader waits for; the \
             reader was not granted within {DEADLINE:?}: HOLDERS {:?}, INFO {:?}",
            owners(&mut c, "lk"),
            kinfo(&mut c, "lk")
        );
        tok(&join(r, "r"), how);
        assert_eq!(owners(&mut c, "lk"), ["s1", "r"], "{how}");
        assert_eq!(call(&mut c, &["DEL", "lk"]), Reply::Int(1));
    }
}
