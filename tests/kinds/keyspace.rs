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

/// The wait of `owner` on `key` ends within the deadline (the server counts nobody blocked),
/// and its reply is nil.
#[track_caller]
fn wait_ends_nil(c: &mut redis::Connection, h: std::thread::JoinHandle<Reply>, what: &str) {
    let ended = poll_until(DEADLINE, || blocked_clients(c) == 0);
    assert!(
        ended,
        "{what}: the owner holds the key now, but its wait did not end within {DEADLINE:?}"
    );
    let r = join(h, what);
    assert!(
        r.is_nil(),
        "{what}: the holder's wait answered {r:?}, not nil"
    );
}

#[test]
fn a_waiter_whose_grant_arrives_under_its_key_is_answered_nil() {
    // SPEC "ACQUIRE": a value arriving under a waited name (COPY, RENAME, MOVE, RESTORE) that
    // holds a grant of a waiting owner ends that wait with nil; the grant stands, and the
    // owner's next ACQUIRE returns its token (G4).
    let srv = Server::start();
    let mut c = srv.conn();
    for how in ["COPY", "RENAME", "RESTORE", "MOVE"] {
        grant_kind(&mut c, "lk", "x", 60_000, &[]);
        let src = if how == "MOVE" { "lk" } else { "src" };
        if how == "MOVE" {
            call(&mut c, &["SELECT", "1"]);
        }
        let tw = grant_kind(&mut c, src, "w", 60_000, &[]);
        call(&mut c, &["SELECT", "0"]);
        let h = spawn_acq(&srv, "lk", "w", 60_000, &["BLOCK", "60000"]);
        wait_blocked(&mut c, 1);
        let ok = |r: Reply| assert!(!r.is_err(), "{how}: {r:?}");
        match how {
            "COPY" => ok(call(&mut c, &["COPY", "src", "lk", "REPLACE"])),
            "RENAME" => ok(call(&mut c, &["RENAME", "src", "lk"])),
            "RESTORE" => {
                let payload = call(&mut c, &["DUMP", "src"])
                    .bytes()
                    .expect("DUMP")
                    .to_vec();
                ok(call(
                    &mut c,
                    &[b"RESTORE".as_slice(), b"lk", b"0", &payload, b"REPLACE"],
                ));
            }
            _ => {
                // MOVE needs a free name: the holder's key goes in the same transaction.
                for cmd in [
                    &["MULTI"][..],
                    &["DEL", "lk"],
                    &["SELECT", "1"],
                    &["MOVE", "lk", "0"],
                    &["SELECT", "0"],
                ] {
                    ok(call(&mut c, cmd));
                }
                let r = call(&mut c, &["EXEC"]);
                assert_eq!(
                    r.array().map(|a| a.len()),
                    Some(4),
                    "MULTI DEL, MOVE: {r:?}"
                );
            }
        }
        wait_ends_nil(&mut c, h, how);
        assert_eq!(holder_tokens(&mut c, "lk"), hv(&[("w", tw)]), "{how}");
        assert_eq!(kinfo(&mut c, "lk").waiters, 0, "{how}");
        assert_eq!(
            grant_kind(&mut c, "lk", "w", 60_000, &[]),
            tw,
            "{how}: the owner's ACQUIRE returns the arrived grant's token (G4)"
        );
        for key in ["lk", "src"] {
            call(&mut c, &["DEL", key]);
        }
    }

    // Shared: the holder's wait ends and is never handed a second grant; the reader behind
    // it fits the read-locked value and is granted.
    grant_kind(&mut c, "lk", "x", 60_000, &[]);
    let tw = grant_kind(&mut c, "src", "w", 60_000, &["SHARED"]);
    let h = spawn_acq(&srv, "lk", "w", 60_000, &["SHARED", "BLOCK", "60000"]);
    wait_blocked(&mut c, 1);
    let r = spawn_acq(&srv, "lk", "r", 60_000, &["SHARED", "BLOCK", "60000"]);
    wait_blocked(&mut c, 2);
    assert!(!call(&mut c, &["COPY", "src", "lk", "REPLACE"]).is_err());
    let tr = tok(&join(r, "the reader behind"), "the reader behind");
    wait_ends_nil(&mut c, h, "COPY of a shared grant");
    assert_eq!(holder_tokens(&mut c, "lk"), hv(&[("w", tw), ("r", tr)]));
}

#[test]
fn an_arrived_limit_refuses_the_shared_waiters_of_another() {
    // SPEC "Lock kinds": a key has one limit. A value arriving under a waited name whose
    // shared grants have another limit than the waiting shared requests' ends those waits
    // with the limit mismatch error naming the arrived limit; an exclusive waiter stays.
    let srv = Server::start();
    let mut c = srv.conn();
    grant_kind(&mut c, "src", "z", 60_000, &["LIMIT", "2"]);
    grant_kind(&mut c, "lk", "x", 60_000, &[]);
    let a = spawn_acq(&srv, "lk", "a", 60_000, &["LIMIT", "3", "BLOCK", "60000"]);
    wait_blocked(&mut c, 1);
    let b = spawn_acq(&srv, "lk", "b", 60_000, &["BLOCK", "60000"]);
    wait_blocked(&mut c, 2);
    assert_eq!(
        call(&mut c, &["COPY", "src", "lk", "REPLACE"]),
        Reply::Int(1)
    );
    assert_eq!(
        join(a, "the waiter of LIMIT 3"),
        Reply::Err("ERR limit mismatch: lk admits 2 shared holders".into())
    );
    assert_eq!(blocked_clients(&mut c), 1, "the exclusive waiter stays");
    let k = kinfo(&mut c, "lk");
    assert_eq!((k.limit, k.holders, k.waiters), (2, 1, 1));
    // The key's limit is the arrived one's now: LIMIT 3 is refused, LIMIT 2 queues.
    refused_with(
        &mut c,
        "lk",
        "n",
        &["LIMIT", "3"],
        "ERR limit mismatch: lk admits 2 shared holders",
    );
    refused(
        &mut c,
        "lk",
        "n",
        &["LIMIT", "2"],
        "the exclusive waiter is first",
    );
    rel(&mut c, "lk", "z");
    tok(
        &join(b, "the exclusive waiter"),
        "the exclusive waiter after z's release",
    );
}
