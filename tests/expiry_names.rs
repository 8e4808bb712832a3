//! The deadline index keeps its own copy of each armed key's name: inline up to 22 bytes,
//! boxed beyond (src/expiry.rs). Leases run out under every length, also binary names and
//! names a lock got by RENAME or MOVE after it was armed.
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
