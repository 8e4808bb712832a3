//! G10: shared grants and permits taken and ended give their memory back.

use flock_testkit::*;
use std::time::{Duration, Instant};

fn used_memory(c: &mut RawConn) -> i64 {
    info_i64(c, "memory", "used_memory")
}

/// Take `n` grants on keys of `holders` grants each (SHARED, or LIMIT `holders`), `batch`
/// keys at a time, and end them: most released, every tenth key revoked.
fn churn_kinds(c: &mut RawConn, round: &str, n: usize, holders: usize, limit: bool) {
    let keys = n / holders;
    let batch = 2_000;
    let lim = holders.to_string();
    let mut done = 0;
    while done < keys {
        let this = batch.min(keys - done);
        let mut take: Vec<Vec<String>> = Vec::with_capacity(this * holders);
        for k in done..done + this {
            for h in 0..holders {
                let mut cmd: Vec<String> = [
                    "FLOCK.ACQUIRE",
                    &format!("g10:{round}:{k}"),
                    &format!("owner-{h}"),
                    "60000",
                ]
                .iter()
                .map(|s| s.to_string())
                .collect();
                if limit {
                    cmd.extend(["LIMIT".to_string(), lim.clone()]);
                } else {
                    cmd.push("SHARED".into());
                }
                take.push(cmd);
            }
        }
        for r in c.pipeline(&take).expect("pipeline") {
            assert!(matches!(r, Reply::Int(t) if t > 0), "ACQUIRE: {r:?}");
        }
        let mut end: Vec<Vec<String>> = Vec::new();
        for k in done..done + this {
            let key = format!("g10:{round}:{k}");
            if k % 10 == 9 {
                end.push(vec!["FLOCK.REVOKE".into(), key]);
            } else {
                for h in 0..holders {
                    end.push(vec![
                        "FLOCK.RELEASE".into(),
                        key.clone(),
                        format!("owner-{h}"),
                    ]);
                }
            }
        }
        for r in c.pipeline(&end).expect("pipeline") {
            assert!(
                matches!(r, Reply::Int(1)) || r == Reply::Int(holders as i64),
                "RELEASE/REVOKE: {r:?}"
            );
        }
        done += this;
    }
}

/// `rounds` times: 10,000 (the default flock.max-holders) readers of one key, then all
/// released (the holders of one value grow and shrink as one key's index).
fn wide_key(c: &mut RawConn, rounds: usize) {
    for round in 0..rounds {
        let take: Vec<Vec<String>> = (0..10_000)
            .map(|h| {
                [
                    "FLOCK.ACQUIRE",
                    "g10:wide",
                    &format!("reader-{h}"),
                    "60000",
                    "SHARED",
                ]
                .iter()
                .map(|s| s.to_string())
                .collect()
            })
            .collect();
        for r in c.pipeline(&take).expect("pipeline") {
            assert!(
                matches!(r, Reply::Int(t) if t > 0),
                "round {round}: ACQUIRE: {r:?}"
            );
        }
        let end: Vec<Vec<String>> = (0..10_000)
            .map(|h| {
                vec![
                    "FLOCK.RELEASE".into(),
                    "g10:wide".into(),
                    format!("reader-{h}"),
                ]
            })
            .collect();
        for r in c.pipeline(&end).expect("pipeline") {
            assert_eq!(r, Reply::Int(1), "round {round}: RELEASE");
        }
    }
}

#[test]
fn shared_grants_and_permits_taken_and_ended_return_used_memory() {
    // FLOCK_G10_KINDS: shared grants (and as many permits) to take; a million each by default
    // (about 6 s on a 2-core box), plus 100,000 readers of one key, 10,000 at a time.
    let n: usize = std::env::var("FLOCK_G10_KINDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(1_000_000);
    let srv = Server::start();
    let mut c = RawConn::connect(srv.port()).expect("connect");
    // Warm up the allocator, the keyspace's tables and the module's state.
    churn_kinds(&mut c, "warm", 20_000, 4, false);
    churn_kinds(&mut c, "warm", 20_000, 4, true);
    wide_key(&mut c, 1);
    assert_eq!(c.call(&["DBSIZE"]).expect("DBSIZE"), Reply::Int(0));
    let base = used_memory(&mut c);
    let t0 = Instant::now();
    churn_kinds(&mut c, "main", n, 8, false);
    churn_kinds(&mut c, "main", n, 4, true);
    wide_key(&mut c, 10);
    let took = t0.elapsed();
    assert_eq!(
        c.call(&["DBSIZE"]).expect("DBSIZE"),
        Reply::Int(0),
        "no key left"
    );
    let slack = 256 * 1024;
    let mut after = used_memory(&mut c);
    poll_until(Duration::from_secs(20), || {
        after = used_memory(&mut c);
        after - base < slack
    });
    eprintln!(
        "G10 kinds: {n} shared grants, {n} permits and 100,000 readers of one key taken and ended in {:.1} s; used_memory \
         {base} before, {after} after ({:+} bytes)",
        took.as_secs_f64(),
        after - base
    );
    assert!(
        after - base < slack,
        "used_memory grew by {} bytes",
        after - base
    );
}
