//! A lock's block carries its key's database and name, which is how a due deadline finds
//! the key again (src/ffi/block.rs, src/store/expiry.rs). Leases run out under names of every length,
//! binary names, and wherever a lock went after it was armed: RENAME, MOVE, COPY, RESTORE,
//! SWAPDB; and a flush that drops armed locks leaves the index sound.
use flock_testkit::*;

fn exists(c: &mut redis::Connection, key: &[u8]) -> i64 {
    match call_raw(c, &[b"EXISTS".as_slice(), key]) {
        Ok(Reply::Int(n)) => n,
        other => panic!("EXISTS: {other:?}"),
    }
}

#[test]
fn leases_run_out_under_names_of_every_length() {
    let srv = Server::start();
    let mut c = srv.conn();
    let mut names: Vec<Vec<u8>> = [1usize, 21, 22, 23, 40, 300]
        .iter()
        .map(|&n| (0..n).map(|i| b'a' + (i % 26) as u8).collect())
        .collect();
    names.push(b"bin\x00\xff\r\nname-with-more-than-22-bytes".to_vec());
    names.push(b"\x00".to_vec());
    for name in &names {
        let r = call_raw(&mut c, &[b"FLOCK.ACQUIRE".as_slice(), name, b"o", b"80"]);
        assert!(matches!(r, Ok(Reply::Int(_))), "{name:?}: {r:?}");
    }
    wait_until("every lease ran out", || {
        names.iter().all(|n| exists(&mut c, n) == 0)
    });
    assert_eq!(
        info_i64(&mut c, "flock", "flock_expirations"),
        names.len() as i64
    );
}

#[test]
fn a_lock_renamed_or_moved_after_arming_runs_out_under_its_new_name() {
    let srv = Server::start();
    let mut c = srv.conn();
    grant(&mut c, "short", "o", 150);
    let long = "a-name-longer-than-twenty-two-bytes:1";
    assert_eq!(
        call(&mut c, &["RENAME", "short", long]),
        Reply::Status("OK".into())
    );
    grant(&mut c, "moved-with-a-long-name-too:1", "o", 150);
    assert_eq!(
        call(&mut c, &["MOVE", "moved-with-a-long-name-too:1", "1"]),
        Reply::Int(1)
    );
    wait_until("the renamed lock ran out", || {
        exists(&mut c, long.as_bytes()) == 0
    });
    assert_eq!(call(&mut c, &["SELECT", "1"]), Reply::Status("OK".into()));
    wait_until("the moved lock ran out", || {
        exists(&mut c, b"moved-with-a-long-name-too:1") == 0
    });
    assert_eq!(info_i64(&mut c, "flock", "flock_expirations"), 2);
}

#[test]
fn copied_restored_and_swapped_locks_run_out_where_they_are_now() {
    let srv = Server::start();
    let mut c = srv.conn();
    grant(&mut c, "src", "o", 1500);
    assert_eq!(call(&mut c, &["COPY", "src", "copy"]), Reply::Int(1));
    let payload = match call(&mut c, &["DUMP", "src"]) {
        Reply::Bulk(b) => b,
        other => panic!("DUMP: {other:?}"),
    };
    let r = call_raw(
        &mut c,
        &[b"RESTORE".as_slice(), b"restored", b"0", &payload],
    );
    assert!(
        matches!(&r, Ok(Reply::Status(s)) if s == "OK"),
        "RESTORE: {r:?}"
    );
    // A lock taken in database 0, then swapped into database 2.
    grant(&mut c, "swapped", "o", 1500);
    assert_eq!(
        call(&mut c, &["SWAPDB", "0", "2"]),
        Reply::Status("OK".into())
    );
    // Database 0 now holds what database 2 held (nothing); database 2 the four locks.
    assert_eq!(call(&mut c, &["DBSIZE"]), Reply::Int(0));
    assert_eq!(call(&mut c, &["SELECT", "2"]), Reply::Status("OK".into()));
    for k in ["src", "copy", "restored", "swapped"] {
        assert_eq!(
            exists(&mut c, k.as_bytes()),
            1,
            "{k} held before its lease ends"
        );
    }
    wait_until("every lock ran out", || {
        ["src", "copy", "restored", "swapped"]
            .iter()
            .all(|k| exists(&mut c, k.as_bytes()) == 0)
    });
    assert_eq!(info_i64(&mut c, "flock", "flock_expirations"), 4);
}

#[test]
fn a_flush_of_armed_locks_leaves_the_index_sound() {
    let srv = Server::start();
    let mut c = srv.conn();
    for flush in [&["FLUSHALL", "ASYNC"][..], &["FLUSHDB", "SYNC"][..]] {
        let before = info_i64(&mut c, "flock", "flock_expirations");
        for i in 0..2000 {
            grant(&mut c, &format!("long:{i}"), "o", 60_000);
        }
        assert_eq!(call(&mut c, flush), Reply::Status("OK".into()), "{flush:?}");
        assert_eq!(call(&mut c, &["DBSIZE"]), Reply::Int(0));
        // New locks, some under the flushed names, run out on time and alone.
        for i in 0..50 {
            grant(&mut c, &format!("long:{i}"), "o", 100);
        }
        wait_until("the new locks ran out", || {
            call(&mut c, &["DBSIZE"]) == Reply::Int(0)
        });
        assert_eq!(
            info_i64(&mut c, "flock", "flock_expirations") - before,
            50,
            "{flush:?}: only the new locks expired"
        );
    }
}
