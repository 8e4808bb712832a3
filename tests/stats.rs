//! FLOCK.STATS: per lock class, how grants ended, how long they were held, the ttls asked for
//! and how long waiters waited, with a TTL advice; and INFO flock's hold-time figures.
use flock_testkit::*;
use std::collections::HashMap;
use std::thread;
use std::time::{Duration, Instant};

fn stats(c: &mut redis::Connection, classes: &[&str]) -> (HashMap<String, Reply>, i64) {
    let mut cmd = vec!["FLOCK.STATS", "GET"];
    cmd.extend(classes);
    let top = map_of(&call(c, &cmd));
    let overflow = top.get("overflow").and_then(Reply::int).expect("overflow");
    let classes = top.get("classes").map(map_of).expect("classes");
    (classes, overflow)
}

fn int(m: &HashMap<String, Reply>, k: &str) -> i64 {
    m.get(k)
        .and_then(Reply::int)
        .unwrap_or_else(|| panic!("{k}: {m:?}"))
}

#[test]
fn classes_fold_identifiers_out_of_key_names() {
    let srv = Server::start();
    let mut c = srv.conn();
    let keys = [
        ("lock:orders:42", "lock:orders:#"),
        ("lock:orders:7", "lock:orders:#"),
        ("{order:42}:lock", "{order:#}:lock"),
        ("job:550e8400-e29b-41d4-a716-446655440000", "job:#"),
        ("job:6ba7b810-9dad-11d1-80b4-00c04fd430c8", "job:#"),
        ("shard-1:lock", "shard-#:lock"),
        ("item_123", "item_#"),
        ("v2:lock", "v2:lock"),
    ];
    for (k, _) in keys {
        grant(&mut c, k, "o", 60_000);
        assert_eq!(release(&mut c, k, "o"), 1);
    }
    let (classes, overflow) = stats(&mut c, &[]);
    let mut names: Vec<&str> = classes.keys().map(String::as_str).collect();
    names.sort();
    let mut want: Vec<&str> = keys.iter().map(|(_, class)| *class).collect();
    want.sort();
    want.dedup();
    assert_eq!(names, want);
    assert_eq!(overflow, 0);
    assert_eq!(int(&map_of(&classes["lock:orders:#"]), "grants"), 2);
    assert_eq!(int(&map_of(&classes["job:#"]), "released"), 2);
    // GET with names: only those (a name never seen is left out).
    let (some, _) = stats(&mut c, &["job:#", "nope:#"]);
    assert_eq!(some.keys().collect::<Vec<_>>(), vec!["job:#"]);
}

#[test]
fn counters_after_a_scripted_history() {
    let srv = Server::start();
    let mut c = srv.conn();
    // 3 released, 2 expired, 1 revoked, 2 renewals, 1 granted waiter.
    for i in 0..3 {
        let k = format!("h:{i}");
        grant(&mut c, &k, "o", 60_000);
        if i == 0 {
            assert!(renew(&mut c, &k, "o", 60_000).is_some());
            assert!(renew(&mut c, &k, "o", 60_000).is_some());
        }
        assert_eq!(release(&mut c, &k, "o"), 1);
    }
    grant(&mut c, "h:10", "o", 50);
    grant(&mut c, "h:11", "o", 50);
    grant(&mut c, "h:12", "o", 60_000);
    assert_eq!(call(&mut c, &["FLOCK.REVOKE", "h:12"]), Reply::Int(1));
    // A waiter granted after 200 ms.
    grant(&mut c, "h:20", "a", 60_000);
    let port = srv.port();
    // The wait starts after `spawned` and ends before the release's reply: the server's
    // figure lies within that, and above the 200 ms sleep.
    let spawned = Instant::now();
    let w = thread::spawn(move || {
        let mut wc = RawConn::connect(port).expect("connect");
        wc.call(&["FLOCK.ACQUIRE", "h:20", "b", "60000", "BLOCK", "5000"])
            .expect("waiter")
    });
    wait_until("the waiter blocks", || {
        info_field(&mut c, "flock", "flock_blocked_clients").as_deref() == Some("1")
    });
    thread::sleep(Duration::from_millis(200));
    assert_eq!(release(&mut c, "h:20", "a"), 1);
    let waited_at_most = spawned.elapsed().as_millis() as i64;
    assert!(w.join().expect("waiter").int().is_some());
    assert_eq!(release(&mut c, "h:20", "b"), 1);
    thread::sleep(Duration::from_millis(150)); // the 50 ms leases are over
    wait_until("the expiries are counted", || {
        let (cl, _) = stats(&mut c, &["h:#"]);
        cl.get("h:#")
            .map(map_of)
            .is_some_and(|m| int(&m, "expired") == 2)
    });
    let (cl, _) = stats(&mut c, &["h:#"]);
    let h = map_of(&cl["h:#"]);
    assert_eq!(
        ["grants", "released", "expired", "revoked", "closed", "renewals"].map(|k| int(&h, k)),
        [8, 5, 2, 1, 0, 2],
        "{h:?}"
    );
    let wait = map_of(&h["wait_ms"]);
    let w50 = int(&wait, "p50");
    // within 3% (the histogram) plus a few ms of the bounds
    let w_max = waited_at_most * 103 / 100 + 5;
    assert!(
        (190..=w_max).contains(&w50),
        "wait p50 {w50} (the wait took between 200 and {waited_at_most} ms)"
    );
    let ttl50 = int(&map_of(&h["ttl_ms"]), "p50");
    assert!(
        (ttl50 - 60_000).abs() <= 1_800,
        "ttl p50 {ttl50} (within 3% of 60000)"
    );
    // Fewer than 100 releases: no advice yet.
    assert_eq!(h["ttl_advice_ms"], Reply::Nil);
}

#[test]
fn hold_percentiles_match_known_hold_times_and_give_the_advice() {
    let srv = Server::start();
    // 200 grants, held 10..=209 ms, all at once on their own connections. Each holder
    // brackets the server's hold: at least from the ACQUIRE's reply to the RELEASE's send
    // (`inner`), at most from the ACQUIRE's send to the RELEASE's reply (`outer`). On a
    // loaded machine the two differ by however long the round trips took.
    let mut handles = Vec::new();
    for i in 0..200u64 {
        let port = srv.port();
        handles.push(thread::spawn(move || {
            let mut c = RawConn::connect(port).expect("connect");
            let key = format!("hold:{i}");
            let sent = Instant::now();
            let r = c
                .call(&["FLOCK.ACQUIRE", &key, "o", "60000"])
                .expect("acquire");
            let t0 = Instant::now();
            assert!(r.int().is_some(), "{r:?}");
            thread::sleep(Duration::from_millis(10 + i));
            let inner = t0.elapsed();
            assert_eq!(
                c.call(&["FLOCK.RELEASE", &key, "o"]).expect("release"),
                Reply::Int(1)
            );
            (inner, sent.elapsed())
        }));
    }
    let (mut held, mut outer): (Vec<u128>, Vec<u128>) = handles
        .into_iter()
        .map(|h| {
            let (i, o) = h.join().expect("holder");
            (i.as_millis(), o.as_millis())
        })
        .unzip();
    // Every server hold lies in its [inner, outer]: so does every order statistic.
    held.sort();
    outer.sort();
    let mut c = srv.conn();
    let (cl, _) = stats(&mut c, &["hold:#"]);
    let h = map_of(&cl["hold:#"]);
    let hold = map_of(&h["hold_ms"]);
    let (p50, p99, max) = (int(&hold, "p50"), int(&hold, "p99"), int(&hold, "max"));
    let (t50, t99, tmax) = (held[99] as i64, held[197] as i64, held[199] as i64);
    let (o50, o99, omax) = (outer[99] as i64, outer[197] as i64, outer[199] as i64);
    eprintln!(
        "server p50 {p50} p99 {p99} max {max}; true between {t50}..{o50} {t99}..{o99} {tmax}..{omax}"
    );
    // Within 3% (the histogram) plus a few ms (ms clocks) of the bounds.
    for (got, lo, hi) in [(p50, t50, o50), (p99, t99, o99), (max, tmax, omax)] {
        assert!(
            got >= lo - (lo * 3 / 100 + 5) && got <= hi + hi * 3 / 100 + 5,
            "server {got} vs true {lo}..{hi} (p50 {p50}/{t50}..{o50}, p99 {p99}/{t99}..{o99}, \
             max {max}/{tmax}..{omax})"
        );
    }
    let advice = h["ttl_advice_ms"]
        .array()
        .expect("advice after 200 releases")
        .to_vec();
    assert_eq!(advice, vec![Reply::Int(5 * p99), Reply::Int(10 * p99)]);
    // INFO flock: the same definition over all classes.
    let i99: i64 = info_field(&mut c, "flock", "flock_hold_ms_p99")
        .and_then(|v| v.parse().ok())
        .expect("flock_hold_ms_p99");
    assert_eq!(i99, p99);
    assert!(info_field(&mut c, "flock", "flock_hold_ms_p50").is_some());
    assert!(info_field(&mut c, "flock", "flock_hold_ms_max").is_some());
}

#[test]
fn expiries_over_one_percent_withhold_the_advice() {
    let srv = Server::start();
    let mut c = srv.conn();
    for i in 0..120 {
        let k = format!("adv:{i}");
        grant(&mut c, &k, "o", 60_000);
        assert_eq!(release(&mut c, &k, "o"), 1);
    }
    let advice = |c: &mut redis::Connection| {
        map_of(&stats(c, &["adv:#"]).0["adv:#"])["ttl_advice_ms"].clone()
    };
    assert!(
        advice(&mut c).array().is_some(),
        "advice after 120 releases"
    );
    grant(&mut c, "adv:1000", "o", 20);
    grant(&mut c, "adv:1001", "o", 20);
    wait_until("two expiries", || {
        int(&map_of(&stats(&mut c, &["adv:#"]).0["adv:#"]), "expired") == 2
    });
    // 2 of 122 ended grants expired (1.6%): the releases alone would hide them.
    assert_eq!(advice(&mut c), Reply::Nil);
}

#[test]
fn reset_bound_and_both_protocols() {
    let srv = Server::builder()
        .module_args(&["stats-max-classes", "3"])
        .start();
    let mut c = srv.conn();
    for k in ["a:1", "b:1", "c:1", "d:1", "e:1", "a:2"] {
        grant(&mut c, k, "o", 60_000);
        assert_eq!(release(&mut c, k, "o"), 1);
    }
    let (cl, overflow) = stats(&mut c, &[]);
    assert_eq!(cl.len(), 3, "{cl:?}");
    assert_eq!(overflow, 2, "d:1 and e:1 are beyond the bound");
    assert_eq!(int(&map_of(&cl["a:#"]), "grants"), 2);
    // RESP3: real maps, the same fields.
    let mut c3 = srv.conn_resp3();
    let r = call(&mut c3, &["FLOCK.STATS", "GET", "a:#"]);
    assert!(matches!(r, Reply::Map(_)), "RESP3 reply is a map: {r:?}");
    let (cl3, _) = stats(&mut c3, &["a:#"]);
    assert_eq!(int(&map_of(&cl3["a:#"]), "grants"), 2);
    // RESP2: a flat array.
    assert!(matches!(
        call(&mut c, &["FLOCK.STATS", "GET"]),
        Reply::Array(_)
    ));
    // RESET clears everything.
    assert_eq!(
        call(&mut c, &["FLOCK.STATS", "RESET"]),
        Reply::Status("OK".into())
    );
    let (cl, overflow) = stats(&mut c, &[]);
    assert!(cl.is_empty());
    assert_eq!(overflow, 0);
    // Bad calls.
    assert_err_contains(
        &call(&mut c, &["FLOCK.STATS"]),
        "wrong number of arguments",
        "no subcommand",
    );
    // Redis's error for an unknown subcommand points to HELP, which answers.
    assert_err_contains(
        &call(&mut c, &["FLOCK.STATS", "NOPE"]),
        "FLOCK.STATS HELP",
        "unknown subcommand",
    );
    match call(&mut c, &["FLOCK.STATS", "HELP"]) {
        Reply::Array(lines) => {
            let text: Vec<String> = lines.iter().filter_map(|l| l.string()).collect();
            assert_eq!(text.len(), 7, "FLOCK.STATS HELP: {text:?}");
            for sub in ["GET", "RESET", "HELP"] {
                assert!(
                    text.iter().any(|l| l.starts_with(sub)),
                    "HELP lacks {sub}: {text:?}"
                );
            }
        }
        other => panic!("FLOCK.STATS HELP: {other:?}"),
    }
    assert!(call(&mut c, &["FLOCK.STATS", "HELP", "x"]).is_err());
    assert!(call(&mut c, &["FLOCK.STATS", "RESET", "x"]).is_err());
    // An ACL can allow GET alone.
    assert!(!call(
        &mut c,
        &["ACL", "SETUSER", "mon", "on", ">pw", "+flock.stats|get"]
    )
    .is_err());
    let mut mon = srv.conn_as("mon", "pw");
    assert!(!call(&mut mon, &["FLOCK.STATS", "GET"]).is_err());
    assert_err_prefix(
        &call(&mut mon, &["FLOCK.STATS", "RESET"]),
        "NOPERM",
        "RESET as mon",
    );
}
