//! A replica loading a full sync asynchronously (`repl-diskless-load swapdb`): the module
//! declares that it handles this (REDISMODULE_OPTIONS_HANDLE_REPL_ASYNC_LOAD), so the replica
//! goes on answering reads from the data it had while the new data loads into a temporary
//! database, then swaps. What the module keeps beside the keys is empty on a replica (no timer
//! is armed, nobody waits, no binding), and the token mark only grows (what the loading RDB
//! carries raises it, also when the load is abandoned), so the swap leaves nothing stale.

use flock_testkit::*;
use std::time::{Duration, Instant};

fn grants(c: &mut redis::Connection, prefix: &str, n: usize) {
    let mut p = redis::pipe();
    for i in 0..n {
        p.cmd("FLOCK.ACQUIRE")
            .arg(format!("{prefix}:{i}"))
            .arg("owner")
            .arg(600_000)
            .ignore();
    }
    let _: () = p.query(c).expect("pipelined grants");
}

#[test]
fn a_replica_loading_asynchronously_serves_its_old_locks_then_the_new_ones() {
    let m = Server::builder()
        .arg("repl-diskless-sync", "yes")
        .arg("repl-diskless-sync-delay", "0")
        .start();
    let mut mc = m.conn();
    let old = grant(&mut mc, "old", "alice", 600_000);
    let r = Server::builder()
        .arg("repl-diskless-load", "swapdb")
        .replica_of(&m)
        .start();
    r.wait_link_up();
    let mut rc = r.conn();
    wait_replica(&mut mc);
    assert!(
        check(&mut rc, "old", old) > 0,
        "the replica has the first grant"
    );

    // A second full sync of the same history (what async loading needs): the replica is cut
    // off while the master writes more than its backlog holds, so that it cannot resume.
    let _ = call(&mut rc, &["CONFIG", "SET", "key-load-delay", "100"]);
    // Serve clients often while loading (by default only every 2 MB loaded).
    let _ = call(
        &mut rc,
        &[
            "CONFIG",
            "SET",
            "loading-process-events-interval-bytes",
            "1024",
        ],
    );
    assert!(!call(&mut mc, &["CONFIG", "SET", "repl-backlog-size", "16384"]).is_err());
    r.signal("STOP");
    assert!(!call(&mut mc, &["CLIENT", "KILL", "TYPE", "replica"]).is_err());
    // New data, slow to load: 20,000 locks at 100 us each.
    grants(&mut mc, "new", 20_000);
    assert_eq!(release(&mut mc, "old", "alice"), 1);
    let fresh = grant(&mut mc, "fresh", "bob", 600_000);
    r.signal("CONT");

    // While it loads, the replica answers from what it had: `old` is still held there.
    let loading = poll_until(Duration::from_secs(10), || {
        info_field(&mut rc, "persistence", "async_loading").as_deref() == Some("1")
    });
    assert!(
        loading,
        "the replica did not load asynchronously\n{}",
        r.log_tail(30)
    );
    let mut served = 0;
    let t0 = Instant::now();
    while info_field(&mut rc, "persistence", "async_loading").as_deref() == Some("1") {
        let left = match call(&mut rc, &["FLOCK.CHECK", "old", &old.to_string()]) {
            Reply::Int(left) => left,
            other => panic!("FLOCK.CHECK while loading answered {other:?}"),
        };
        let i = call(&mut rc, &["FLOCK.INFO", "old"]);
        if left == 0 || parse_info(&i, "FLOCK.INFO").is_none() {
            // Only because the load ended and the new data (where `old` is released) took
            // over between the two reads.
            assert_eq!(
                info_field(&mut rc, "persistence", "async_loading").as_deref(),
                Some("0"),
                "the old grant was gone while loading (CHECK {left}, INFO {i:?})"
            );
            break;
        }
        served += 1;
        assert!(
            t0.elapsed() < Duration::from_secs(30),
            "loading never ended"
        );
    }
    assert!(served > 0, "no read was served while loading");
    eprintln!("reads served by the replica while it loaded: {served}");

    // Then the new data: the master's state exactly.
    r.wait_link_up();
    let _ = call(&mut rc, &["CONFIG", "SET", "key-load-delay", "0"]);
    wait_replica(&mut mc);
    assert_eq!(
        check(&mut rc, "old", old),
        0,
        "the released grant survived the swap"
    );
    assert_eq!(exists(&mut rc, "old"), 0);
    assert!(check(&mut rc, "fresh", fresh) > 0);
    assert_eq!(dbsize(&mut rc), dbsize(&mut mc));
    assert_eq!(
        call(&mut rc, &["DEBUG", "DIGEST"]),
        call(&mut mc, &["DEBUG", "DIGEST"]),
        "master and replica differ after the swap"
    );
    let mark = |c: &mut redis::Connection| info_i64(c, "flock", "flock_token_high_water");
    assert!(
        mark(&mut rc) >= fresh,
        "the replica's token mark is below the loaded tokens"
    );

    // And the replica, promoted, runs the locks it loaded: the new leases are live, new
    // tokens are above every loaded one, and a freed key is granted.
    drop(mc);
    drop(m);
    assert_eq!(
        call(&mut rc, &["REPLICAOF", "NO", "ONE"])
            .string()
            .as_deref(),
        Some("OK")
    );
    assert_eq!(acquire(&mut rc, "fresh", "mallory", 1000), None);
    let t = grant(&mut rc, "old", "carol", 1000);
    assert!(t > fresh);
    r.assert_log_clean();
}
