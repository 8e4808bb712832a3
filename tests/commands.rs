//! The commands' contract (SPEC.md "Commands", "Details", G1-G4, G6): one server per test.
use flock_testkit::*;
use std::thread::sleep;
use std::time::{Duration, Instant};

#[test]
fn acquire_grants_free_key_and_refuses_other_owner() {
    let srv = Server::start();
    let mut c = srv.conn();
    let t = grant(&mut c, "lk", "alice", 10_000);
    assert!(t > 0 && t < TWO_POW_53);
    assert_eq!(exists(&mut c, "lk"), 1, "a held lock is a key");
    assert_eq!(
        acquire(&mut c, "lk", "bob", 10_000),
        None,
        "other owner must get nil"
    );
    // G1: still alice's grant, same token
    let (o, tok, ttl) = held(&mut c, "lk");
    assert_eq!((o.as_str(), tok), ("alice", t));
    assert!(ttl > 0 && ttl <= 10_000, "ttl {ttl}");
    assert!(check(&mut c, "lk", t) >= 1);
}

#[test]
fn same_owner_reacquire_returns_same_token_and_resets_lease() {
    let srv = Server::start();
    let mut c = srv.conn();
    // 5 s: still held after the 600 ms sleep however slow the machine (the sleep is at least
    // 600 ms, so the lease has run down by that much whatever the load).
    let t = grant(&mut c, "lk", "alice", 5000);
    sleep(Duration::from_millis(600));
    let (_, _, ttl1) = held(&mut c, "lk");
    assert!(ttl1 <= 4450, "lease should have run down, ttl {ttl1}");
    // G4: the retry gets the same token and the lease is reset to the new ttl
    assert_eq!(acquire(&mut c, "lk", "alice", 10_000), Some(t));
    let (o, tok, ttl2) = held(&mut c, "lk");
    assert_eq!((o.as_str(), tok), ("alice", t));
    assert!(
        ttl2 > 9000 && ttl2 <= 10_000,
        "lease not reset to 10000: ttl {ttl2}"
    );
    let ck = check(&mut c, "lk", t);
    assert!(ck > 9000 && ck <= 10_000, "CHECK {ck}");
    // "resets the lease to ttl": a shorter ttl shortens it
    assert_eq!(acquire(&mut c, "lk", "alice", 2000), Some(t));
    let (_, _, ttl3) = held(&mut c, "lk");
    assert!(
        ttl3 > 0 && ttl3 <= 2000,
        "lease not reset to 2000: ttl {ttl3}"
    );
}

#[test]
fn tokens_strictly_increase_across_cycles_and_keys() {
    let srv = Server::start();
    let mut c = srv.conn();
    let mut last = 0i64;
    for i in 0..40 {
        let t = grant(&mut c, "lk", "alice", 10_000);
        assert!(t > last, "cycle {i}: token {t} not > previous {last}");
        last = t;
        assert_eq!(release(&mut c, "lk", "alice"), 1);
    }
    for i in 0..60 {
        let key = format!("k{}", i % 3);
        let owner = format!("o{}", i % 5);
        let t = grant(&mut c, &key, &owner, 10_000);
        assert!(
            t > last,
            "step {i} ({key}): token {t} not > previous {last}"
        );
        last = t;
        if i % 2 == 0 {
            assert_eq!(release(&mut c, &key, &owner), 1);
        } else {
            assert_eq!(call(&mut c, &["DEL", &key]).int(), Some(1));
        }
    }
}

#[test]
fn tokens_increase_after_del_unlink_flush() {
    let srv = Server::start();
    let mut c = srv.conn();
    let mut last = grant(&mut c, "lk", "alice", 10_000);
    let removers: &[&[&str]] = &[
        &["DEL", "lk"],
        &["UNLINK", "lk"],
        &["FLUSHALL"],
        &["FLUSHDB"],
        &["FLUSHALL", "ASYNC"],
        &["FLUSHDB", "SYNC"],
    ];
    for rm in removers {
        let r = call(&mut c, rm);
        assert!(!r.is_err(), "{rm:?}: {r:?}");
        assert_eq!(exists(&mut c, "lk"), 0, "after {rm:?}");
        assert_eq!(info(&mut c, "lk"), None, "after {rm:?}");
        assert_eq!(check(&mut c, "lk", last), 0, "old token live after {rm:?}");
        // G3: the next grant (any owner, even the same one) has a bigger token
        let t = grant(&mut c, "lk", "alice", 10_000);
        assert!(t > last, "after {rm:?}: token {t} not > {last}");
        last = t;
    }
}

#[test]
fn release_only_by_owner() {
    let srv = Server::start();
    let mut c = srv.conn();
    assert_eq!(
        release(&mut c, "nokey", "alice"),
        0,
        "release of a free key"
    );
    assert_eq!(exists(&mut c, "nokey"), 0);
    let t = grant(&mut c, "lk", "alice", 10_000);
    assert_eq!(release(&mut c, "lk", "bob"), 0, "wrong owner");
    assert_eq!(release(&mut c, "lk", "alic"), 0, "prefix of owner");
    assert_eq!(release(&mut c, "lk", "ALICE"), 0, "owner is case sensitive");
    assert!(
        check(&mut c, "lk", t) >= 1,
        "G2: wrong-owner release must not end the grant"
    );
    assert_eq!(held(&mut c, "lk").0, "alice");
    assert_eq!(release(&mut c, "lk", "alice"), 1);
    assert_eq!(release(&mut c, "lk", "alice"), 0, "second release");
    assert_eq!(exists(&mut c, "lk"), 0, "no key after release");
    assert_eq!(dbsize(&mut c), 0);
    assert_eq!(info(&mut c, "lk"), None);
    assert_eq!(check(&mut c, "lk", t), 0);
    // free again: anyone can take it
    let t2 = grant(&mut c, "lk", "bob", 10_000);
    assert!(t2 > t);
}

#[test]
fn renew_extends_only_for_owner() {
    let srv = Server::start();
    let mut c = srv.conn();
    let t = grant(&mut c, "lk", "alice", 5000);
    let before = check(&mut c, "lk", t);
    assert!((1..=5000).contains(&before), "CHECK {before}");
    assert_eq!(
        renew(&mut c, "lk", "alice", 20_000),
        Some(t),
        "renew returns the grant's token"
    );
    let after = check(&mut c, "lk", t);
    assert!(
        after > 19_000 && after <= 20_000,
        "CHECK after renew {after}"
    );
    assert_eq!(renew(&mut c, "lk", "bob", 60_000), None, "wrong owner");
    let (o, tok, ttl) = held(&mut c, "lk");
    assert_eq!((o.as_str(), tok), ("alice", t));
    assert!(
        ttl <= 20_000,
        "wrong-owner renew changed the lease: ttl {ttl}"
    );
    // the lease now ends ttl ms from now: a shorter ttl shortens it (5 s: still live at the
    // CHECK on a loaded machine)
    assert_eq!(renew(&mut c, "lk", "alice", 5000), Some(t));
    let short = check(&mut c, "lk", t);
    assert!(
        (1..=5000).contains(&short),
        "CHECK after short renew {short}"
    );
    // renew of a key nobody holds: nil and no key created
    assert_eq!(renew(&mut c, "free", "alice", 1000), None);
    assert_eq!(exists(&mut c, "free"), 0);
}

#[test]
fn renew_never_revives_an_expired_grant() {
    let srv = Server::start();
    let mut c = srv.conn();
    let t = grant(&mut c, "lk", "alice", 50);
    sleep(Duration::from_millis(200));
    assert_eq!(
        renew(&mut c, "lk", "alice", 10_000),
        None,
        "RENEW revived an expired grant"
    );
    assert_eq!(check(&mut c, "lk", t), 0);
    assert_eq!(exists(&mut c, "lk"), 0);
    assert_eq!(info(&mut c, "lk"), None);
    // and the next grant is a new one
    let t2 = grant(&mut c, "lk", "alice", 10_000);
    assert!(t2 > t);
}

#[test]
fn check_reports_remaining_lease_of_live_token_only() {
    let srv = Server::start();
    let mut c = srv.conn();
    assert_eq!(check(&mut c, "nokey", 1), 0);
    assert_eq!(check(&mut c, "nokey", 123_456_789), 0);
    let t1 = grant(&mut c, "lk", "alice", 5000);
    let ms = check(&mut c, "lk", t1);
    assert!((1..=5000).contains(&ms), "CHECK {ms}");
    assert_eq!(check(&mut c, "lk", t1 + 1), 0, "a token never issued");
    assert_eq!(check(&mut c, "lk", t1 - 1), 0, "an older token");
    assert_eq!(check(&mut c, "other", t1), 0, "token of another key");
    assert_eq!(release(&mut c, "lk", "alice"), 1);
    assert_eq!(check(&mut c, "lk", t1), 0, "after release");
    let t2 = grant(&mut c, "lk", "bob", 5000);
    assert_eq!(
        check(&mut c, "lk", t1),
        0,
        "old token with a new grant live"
    );
    assert!(check(&mut c, "lk", t2) >= 1);
    // CHECK must not create a key
    assert_eq!(exists(&mut c, "nokey"), 0);
    assert_eq!(exists(&mut c, "other"), 0);
}

#[test]
fn lease_expiry_removes_key_actively_and_frees_it() {
    let srv = Server::start();
    let mut c = srv.conn();
    let t = grant(&mut c, "lk", "alice", 100);
    let start = Instant::now();
    // DBSIZE does not touch the key, so only active expiry (timer / expire cycle) can do this
    let gone = poll_until(DEADLINE, || dbsize(&mut c) == 0);
    assert!(
        gone,
        "lock with ttl 100 ms still in the keyspace after {:?} (no active expiry)",
        start.elapsed()
    );
    assert_eq!(exists(&mut c, "lk"), 0);
    assert_eq!(info(&mut c, "lk"), None);
    assert_eq!(check(&mut c, "lk", t), 0);
    assert_eq!(release(&mut c, "lk", "alice"), 0, "release after expiry");
    let t2 = grant(&mut c, "lk", "bob", 10_000);
    assert!(t2 > t, "grant after expiry: {t2} not > {t}");
}

#[test]
fn expired_lease_never_blocks_the_next_acquire() {
    let srv = Server::start();
    let mut c = srv.conn();
    for i in 0..5 {
        let t = grant(&mut c, "lk", "alice", 30);
        sleep(Duration::from_millis(60));
        // right after the deadline, whether or not the key was reaped yet
        let t2 = acquire(&mut c, "lk", "bob", 10_000);
        assert!(
            matches!(t2, Some(x) if x > t),
            "round {i}: bob got {t2:?} after alice's lease (token {t}) ran out"
        );
        assert_eq!(release(&mut c, "lk", "bob"), 1);
    }
}

#[test]
fn info_fields() {
    let srv = Server::start();
    let mut c = srv.conn();
    assert_eq!(
        call(&mut c, &["FLOCK.INFO", "lk"]),
        Reply::Nil,
        "INFO of a free key"
    );
    let t = grant(&mut c, "lk", "alice", 10_000);
    let raw = call(&mut c, &["FLOCK.INFO", "lk"]);
    // RESP2: a flat array of field/value pairs
    let arr = raw
        .array()
        .unwrap_or_else(|| panic!("RESP2 FLOCK.INFO not an array: {raw:?}"));
    assert!(
        arr.len() >= 8 && arr.len().is_multiple_of(2),
        "RESP2 FLOCK.INFO: {raw:?}"
    );
    let i = parse_info(&raw, "FLOCK.INFO").expect("info");
    assert_eq!(i.owner.as_deref(), Some(b"alice".as_slice()));
    assert_eq!(i.token, t);
    assert!(i.ttl > 0 && i.ttl <= 10_000, "ttl {}", i.ttl);
    assert_eq!(i.waiters, 0);
    // INFO must not change anything
    assert_eq!(held(&mut c, "lk").1, t);
    assert_eq!(release(&mut c, "lk", "alice"), 1);
    assert_eq!(
        call(&mut c, &["FLOCK.INFO", "lk"]),
        Reply::Nil,
        "INFO after release"
    );
}

#[test]
fn info_is_a_map_in_resp3() {
    let srv = Server::start();
    let mut c3 = srv.conn_resp3();
    let t = grant(&mut c3, "lk", "alice", 10_000);
    let raw = call(&mut c3, &["FLOCK.INFO", "lk"]);
    assert!(
        matches!(raw, Reply::Map(_)),
        "RESP3 FLOCK.INFO should be a map, got {raw:?}"
    );
    let i = parse_info(&raw, "FLOCK.INFO").expect("info");
    assert_eq!(i.owner.as_deref(), Some(b"alice".as_slice()));
    assert_eq!((i.token, i.waiters), (t, 0));
    assert_eq!(call(&mut c3, &["FLOCK.INFO", "free"]), Reply::Nil);
}

#[test]
fn type_is_flocklock() {
    let srv = Server::start();
    let mut c = srv.conn();
    grant(&mut c, "lk", "alice", 10_000);
    assert_eq!(
        call(&mut c, &["TYPE", "lk"]).string().as_deref(),
        Some("flocklock")
    );
}

#[test]
fn command_getkeys_finds_the_key() {
    let srv = Server::start();
    let mut c = srv.conn();
    let cases: &[&[&str]] = &[
        &["FLOCK.ACQUIRE", "lk", "o", "1000"],
        &["FLOCK.RELEASE", "lk", "o"],
        &["FLOCK.RENEW", "lk", "o", "1000"],
        &["FLOCK.CHECK", "lk", "5"],
        &["FLOCK.INFO", "lk"],
    ];
    for args in cases {
        let mut full = vec!["COMMAND", "GETKEYS"];
        full.extend_from_slice(args);
        let r = call(&mut c, &full);
        assert_eq!(
            r,
            Reply::Array(vec![Reply::Bulk(b"lk".to_vec())]),
            "COMMAND GETKEYS {args:?}"
        );
    }
    assert_eq!(dbsize(&mut c), 0, "GETKEYS must not run the command");
}

fn command_flags(c: &mut redis::Connection, name: &str) -> (Vec<String>, Reply) {
    let r = call(c, &["COMMAND", "INFO", name]);
    let doc = r
        .array()
        .and_then(|a| a.first())
        .cloned()
        .unwrap_or(Reply::Nil);
    let flags = doc
        .array()
        .and_then(|d| d.get(2))
        .and_then(|f| f.array())
        .map(|f| f.iter().filter_map(|x| x.string()).collect())
        .unwrap_or_else(|| panic!("COMMAND INFO {name}: {r:?}"));
    (flags, doc)
}

#[test]
fn command_flags_readonly_and_write() {
    let srv = Server::start();
    let mut c = srv.conn();
    let (flags, doc) = command_flags(&mut c, "flock.check");
    assert!(
        flags.iter().any(|f| f == "readonly"),
        "flock.check flags {flags:?} lack readonly"
    );
    assert!(
        !flags.iter().any(|f| f == "write"),
        "flock.check flags {flags:?} have write"
    );
    let a = doc.array().expect("doc");
    assert_eq!(
        (a[3].int(), a[4].int(), a[5].int()),
        (Some(1), Some(1), Some(1)),
        "flock.check key positions"
    );
    for name in ["flock.acquire", "flock.release", "flock.renew"] {
        let (flags, doc) = command_flags(&mut c, name);
        assert!(
            flags.iter().any(|f| f == "write"),
            "{name} flags {flags:?} lack write"
        );
        let a = doc.array().expect("doc");
        assert_eq!(
            (a[3].int(), a[4].int(), a[5].int()),
            (Some(1), Some(1), Some(1)),
            "{name} key positions"
        );
    }
}

#[test]
fn binary_safe_owners() {
    let srv = Server::start();
    let mut c = srv.conn();
    let owner: &[u8] = b"a\0b\r\nc\xff\xfe\n$3\r\n";
    let r = call(
        &mut c,
        &[b"FLOCK.ACQUIRE".as_slice(), b"lk", owner, b"10000"],
    );
    let t = r
        .int()
        .unwrap_or_else(|| panic!("binary owner acquire: {r:?}"));
    let i = info(&mut c, "lk").expect("info");
    assert_eq!(
        i.owner.as_deref(),
        Some(owner),
        "owner bytes not kept exactly"
    );
    assert_eq!(i.token, t);
    // an owner that differs after the NUL byte is another owner
    let r = call(
        &mut c,
        &[b"FLOCK.ACQUIRE".as_slice(), b"lk", b"a\0x", b"10000"],
    );
    assert_eq!(r, Reply::Nil, "owner compared only up to NUL?");
    let r = call(&mut c, &[b"FLOCK.RELEASE".as_slice(), b"lk", b"a"]);
    assert_eq!(r, Reply::Int(0));
    let r = call(&mut c, &[b"FLOCK.RENEW".as_slice(), b"lk", owner, b"20000"]);
    assert_eq!(r, Reply::Int(t));
    let r = call(
        &mut c,
        &[b"FLOCK.ACQUIRE".as_slice(), b"lk", owner, b"10000"],
    );
    assert_eq!(r, Reply::Int(t), "same binary owner re-acquire");
    let r = call(&mut c, &[b"FLOCK.RELEASE".as_slice(), b"lk", owner]);
    assert_eq!(r, Reply::Int(1));
    // binary key too
    let key: &[u8] = b"k\0\r\n\xff";
    let r = call(&mut c, &[b"FLOCK.ACQUIRE".as_slice(), key, b"o", b"10000"]);
    assert!(r.int().is_some(), "binary key: {r:?}");
    let r = call(&mut c, &[b"EXISTS".as_slice(), key]);
    assert_eq!(r, Reply::Int(1));
}

#[test]
fn owner_length_limits() {
    let srv = Server::start();
    let mut c = srv.conn();
    let o256 = "x".repeat(256);
    let o257 = "x".repeat(257);
    let t = grant(&mut c, "lk", &o256, 10_000);
    let i = info(&mut c, "lk").expect("info");
    assert_eq!(i.owner.as_ref().map(|o| o.len()), Some(256));
    assert_eq!(i.token, t);
    let r = call(&mut c, &["FLOCK.ACQUIRE", "lk2", &o257, "10000"]);
    assert_err_prefix(&r, "ERR invalid owner", "owner of 257 bytes");
    assert_eq!(exists(&mut c, "lk2"), 0);
    let r = call(&mut c, &["FLOCK.ACQUIRE", "lk2", "", "10000"]);
    assert_err_prefix(&r, "ERR invalid owner", "empty owner");
    assert_eq!(exists(&mut c, "lk2"), 0);
    let r = call(&mut c, &["FLOCK.ACQUIRE", "lk3", "y", "10000"]);
    assert!(r.int().is_some(), "1-byte owner: {r:?}");
    assert_eq!(release(&mut c, "lk", &o256), 1);
}

#[test]
fn memory_usage_of_a_lock_key() {
    let srv = Server::start();
    let mut c = srv.conn();
    grant(&mut c, "lk", "alice", 10_000);
    let r = call(&mut c, &["MEMORY", "USAGE", "lk"]);
    let n = r.int().unwrap_or_else(|| panic!("MEMORY USAGE: {r:?}"));
    assert!(n > 0, "MEMORY USAGE {n}");
    assert_eq!(call(&mut c, &["MEMORY", "USAGE", "free"]), Reply::Nil);
}

#[test]
fn keyspace_lists_held_locks() {
    let srv = Server::start();
    let mut c = srv.conn();
    grant(&mut c, "a", "o", 10_000);
    grant(&mut c, "b", "o", 10_000);
    assert_eq!(dbsize(&mut c), 2);
    let mut keys: Vec<String> = call(&mut c, &["KEYS", "*"])
        .array()
        .expect("KEYS")
        .iter()
        .filter_map(|k| k.string())
        .collect();
    keys.sort();
    assert_eq!(keys, vec!["a", "b"]);
    // RENAME moves the lock with its grant
    assert!(!call(&mut c, &["RENAME", "a", "a2"]).is_err());
    assert_eq!(held(&mut c, "a2").0, "o");
    assert_eq!(exists(&mut c, "a"), 0);
}

#[test]
fn works_inside_multi_and_lua() {
    let srv = Server::start();
    let mut c = srv.conn();
    assert_eq!(call(&mut c, &["MULTI"]).string().as_deref(), Some("OK"));
    assert_eq!(
        call(&mut c, &["FLOCK.ACQUIRE", "lk", "alice", "10000"])
            .string()
            .as_deref(),
        Some("QUEUED")
    );
    assert_eq!(
        call(&mut c, &["FLOCK.ACQUIRE", "lk", "bob", "10000"])
            .string()
            .as_deref(),
        Some("QUEUED")
    );
    let r = call(&mut c, &["EXEC"]);
    let a = r.array().unwrap_or_else(|| panic!("EXEC: {r:?}"));
    let t = a[0].int().unwrap_or_else(|| panic!("EXEC[0]: {r:?}"));
    assert_eq!(a[1], Reply::Nil);
    let r = call(
        &mut c,
        &[
            "EVAL",
            "return redis.call('FLOCK.CHECK', KEYS[1], ARGV[1])",
            "1",
            "lk",
            &t.to_string(),
        ],
    );
    let ms = r.int().unwrap_or_else(|| panic!("EVAL CHECK: {r:?}"));
    assert!((1..=10_000).contains(&ms));
    let r = call(
        &mut c,
        &[
            "EVAL",
            "return redis.call('FLOCK.RELEASE', KEYS[1], ARGV[1])",
            "1",
            "lk",
            "alice",
        ],
    );
    assert_eq!(r, Reply::Int(1));
    assert_eq!(exists(&mut c, "lk"), 0);
}

#[test]
fn config_max_ttl_default_and_config_set() {
    let srv = Server::start();
    let mut c = srv.conn();
    let r = call(&mut c, &["CONFIG", "GET", "flock.max-ttl-ms"]);
    let pairs = r.pairs().unwrap_or_else(|| panic!("CONFIG GET: {r:?}"));
    assert_eq!(pairs.len(), 1, "CONFIG GET flock.max-ttl-ms: {r:?}");
    assert_eq!(
        pairs[0].1.string().as_deref(),
        Some("86400000"),
        "default max ttl"
    );
    assert!(
        acquire(&mut c, "a", "o", 86_400_000).is_some(),
        "ttl = max is valid"
    );
    let r = call(&mut c, &["FLOCK.ACQUIRE", "b", "o", "86400001"]);
    assert_err_prefix(&r, "ERR invalid ttl", "ttl = max + 1");
    assert_eq!(exists(&mut c, "b"), 0);

    let r = call(&mut c, &["CONFIG", "SET", "flock.max-ttl-ms", "5000"]);
    assert_eq!(r.string().as_deref(), Some("OK"), "CONFIG SET: {r:?}");
    let r = call(&mut c, &["CONFIG", "GET", "flock.max-ttl-ms"]);
    assert_eq!(
        r.pairs().expect("pairs")[0].1.string().as_deref(),
        Some("5000")
    );
    let r = call(&mut c, &["FLOCK.ACQUIRE", "b", "o", "6000"]);
    assert_err_prefix(&r, "ERR invalid ttl", "ttl 6000 with max 5000");
    assert_eq!(exists(&mut c, "b"), 0);
    assert!(
        acquire(&mut c, "b", "o", 5000).is_some(),
        "ttl 5000 with max 5000"
    );
    let r = call(&mut c, &["FLOCK.RENEW", "b", "o", "6000"]);
    assert_err_prefix(&r, "ERR invalid ttl", "renew ttl 6000 with max 5000");
    assert!(renew(&mut c, "b", "o", 5000).is_some());
    // a bad value is refused
    let r = call(&mut c, &["CONFIG", "SET", "flock.max-ttl-ms", "abc"]);
    assert!(r.is_err(), "CONFIG SET flock.max-ttl-ms abc: {r:?}");
    let r = call(&mut c, &["CONFIG", "GET", "flock.max-ttl-ms"]);
    assert_eq!(
        r.pairs().expect("pairs")[0].1.string().as_deref(),
        Some("5000")
    );
}

#[test]
fn config_max_ttl_module_argument() {
    let srv = Server::builder()
        .module_args(&["max-ttl-ms", "5000"])
        .start();
    let mut c = srv.conn();
    let r = call(&mut c, &["CONFIG", "GET", "flock.max-ttl-ms"]);
    assert_eq!(
        r.pairs()
            .expect("pairs")
            .first()
            .and_then(|p| p.1.string())
            .as_deref(),
        Some("5000"),
        "{r:?}"
    );
    let r = call(&mut c, &["FLOCK.ACQUIRE", "a", "o", "6000"]);
    assert_err_prefix(&r, "ERR invalid ttl", "ttl 6000 with module arg max 5000");
    assert_eq!(exists(&mut c, "a"), 0);
    assert!(acquire(&mut c, "a", "o", 5000).is_some());
}

#[test]
fn tokens_below_2_pow_53_and_increasing() {
    let srv = Server::start();
    let mut c = srv.conn();
    let mut last = 0;
    for i in 0..300 {
        let key = format!("k{}", i % 7);
        let t = grant(&mut c, &key, "o", 10_000);
        assert!(t > 0 && t < TWO_POW_53, "token {t}");
        assert!(t > last);
        last = t;
        assert_eq!(release(&mut c, &key, "o"), 1);
    }
}

#[test]
fn no_residue_after_many_locks() {
    // G10: locks that ended leave no key and no memory behind
    let srv = Server::start();
    let mut c = srv.conn();
    let mut raw = RawConn::connect(srv.port()).expect("raw");
    let used = |c: &mut redis::Connection| -> i64 {
        info_field(c, "memory", "used_memory")
            .and_then(|v| v.parse().ok())
            .expect("used_memory")
    };
    // warm up allocator and module state
    for round in 0..2 {
        let n = 20_000;
        let mut cmds = Vec::with_capacity(2 * n);
        for i in 0..n {
            let key = format!("lock:{round}:{i}");
            cmds.push(vec![
                "FLOCK.ACQUIRE".into(),
                key.clone(),
                "owner".into(),
                "60000".into(),
            ]);
            cmds.push(vec!["FLOCK.RELEASE".into(), key, "owner".into()]);
        }
        for chunk in cmds.chunks(2000) {
            for (k, r) in raw.pipeline(chunk).expect("pipeline").iter().enumerate() {
                if k % 2 == 0 {
                    assert!(r.int().is_some(), "acquire: {r:?}");
                } else {
                    assert_eq!(r, &Reply::Int(1), "release");
                }
            }
        }
        assert_eq!(dbsize(&mut c), 0);
    }
    let base = used(&mut c);
    // 20k released, 20k expired
    let n = 20_000;
    let mut cmds = Vec::with_capacity(2 * n);
    for i in 0..n {
        let key = format!("rel:{i}");
        cmds.push(vec![
            "FLOCK.ACQUIRE".into(),
            key.clone(),
            "owner".into(),
            "60000".into(),
        ]);
        cmds.push(vec!["FLOCK.RELEASE".into(), key, "owner".into()]);
    }
    for i in 0..n {
        cmds.push(vec![
            "FLOCK.ACQUIRE".into(),
            format!("exp:{i}"),
            "owner".into(),
            // 2 s: still held when used_memory is read after the pipelines, however slowly
            // they went
            "2000".into(),
        ]);
    }
    for chunk in cmds.chunks(2000) {
        for r in raw.pipeline(chunk).expect("pipeline") {
            assert!(!r.is_err(), "{r:?}");
        }
    }
    let held_mem = used(&mut c);
    assert!(
        held_mem > base,
        "20k held locks use no memory? {held_mem} vs {base}"
    );
    wait_until("20k leases of 2 s reaped", || dbsize(&mut c) == 0);
    // the keyspace's hash tables shrink in the server's cron: give it time
    let mut after = used(&mut c);
    poll_until(DEADLINE, || {
        after = used(&mut c);
        after - base < 256 * 1024
    });
    assert!(
        after - base < 256 * 1024,
        "used_memory grew by {} bytes after 40k locks ended (base {base}, with 20k held {held_mem}, after {after})",
        after - base
    );
}

/// `RELEASE key owner token` and `RENEW key owner ttl token` act only on the grant with that
/// token: a late retry of an earlier grant's release never ends a later grant of the same
/// owner (etcd-io/etcd#22082). `REVOKE key owner` ends only that owner's grant.
#[test]
fn token_qualified_release_renew_and_revoke_by_owner() {
    let srv = Server::start();
    let mut c = srv.conn();
    let t1 = grant(&mut c, "tq", "me", 60_000);
    assert_eq!(
        call(&mut c, &["FLOCK.RELEASE", "tq", "me", &t1.to_string()]),
        Reply::Int(1)
    );
    let t2 = grant(&mut c, "tq", "me", 60_000);
    assert!(t2 > t1);
    // The retried release of the first grant, and a renew with its token: nothing changes.
    assert_eq!(
        call(&mut c, &["FLOCK.RELEASE", "tq", "me", &t1.to_string()]),
        Reply::Int(0)
    );
    assert_eq!(
        call(
            &mut c,
            &["FLOCK.RENEW", "tq", "me", "5000", &t1.to_string()]
        ),
        Reply::Nil
    );
    let (owner, token, ttl) = held(&mut c, "tq");
    assert_eq!((owner.as_str(), token), ("me", t2));
    assert!(
        ttl > 50_000,
        "the stale RENEW must not shorten the lease: {ttl}"
    );
    // The right token renews; another owner with the right token does not.
    assert_eq!(
        call(
            &mut c,
            &["FLOCK.RENEW", "tq", "other", "5000", &t2.to_string()]
        ),
        Reply::Nil
    );
    assert_eq!(
        call(
            &mut c,
            &["FLOCK.RENEW", "tq", "me", "5000", &t2.to_string()]
        ),
        Reply::Int(t2)
    );
    assert!(held(&mut c, "tq").2 <= 5000);
    // REVOKE by owner: another owner's name ends nothing, the holder's ends the grant.
    assert_eq!(
        call(&mut c, &["FLOCK.REVOKE", "tq", "other"]),
        Reply::Int(0)
    );
    assert!(check(&mut c, "tq", t2) > 0);
    assert_eq!(call(&mut c, &["FLOCK.REVOKE", "tq", "me"]), Reply::Int(1));
    assert_eq!(check(&mut c, "tq", t2), 0);
    assert_eq!(exists(&mut c, "tq"), 0, "nothing left after the revoke");
    assert_eq!(
        call(&mut c, &["FLOCK.RELEASE", "tq", "me", &t2.to_string()]),
        Reply::Int(0)
    );
    // The plain forms still act on the owner's live grant.
    let t3 = grant(&mut c, "tq", "me", 60_000);
    assert_eq!(
        call(&mut c, &["FLOCK.RENEW", "tq", "me", "9000"]),
        Reply::Int(t3)
    );
    assert_eq!(call(&mut c, &["FLOCK.RELEASE", "tq", "me"]), Reply::Int(1));
}

/// COMMAND DOCS describes every command but the internal FLOCK.APPLY (summary, since,
/// arguments with types and optional flags), COMMAND INFO has the real arity, and redis-cli
/// turns the docs into its `HELP` text and argument hints.
#[test]
fn command_docs_and_arity() {
    let srv = Server::start();
    let mut c = srv.conn();
    // (command, arity, argument names in order, the optional ones)
    let table: &[(&str, i64, &[&str], &[&str])] = &[
        (
            "flock.acquire",
            -4,
            &["key", "owner", "ttl", "kind", "bound", "block"],
            &["kind", "bound", "block"],
        ),
        ("flock.release", -3, &["key", "owner", "token"], &["token"]),
        (
            "flock.renew",
            -4,
            &["key", "owner", "ttl", "token"],
            &["token"],
        ),
        ("flock.check", 3, &["key", "token"], &[]),
        ("flock.info", 2, &["key"], &[]),
        ("flock.holders", 2, &["key"], &[]),
        ("flock.revoke", -2, &["key", "owner"], &["owner"]),
        (
            "flock.fenced",
            -4,
            &["key", "token", "command", "arg"],
            &["arg"],
        ),
        (
            "flock.macquire",
            -5,
            &["numkeys", "key", "owner", "ttl", "bound", "block"],
            &["bound", "block"],
        ),
    ];
    for (cmd, arity, names, optional) in table {
        let r = call(&mut c, &["COMMAND", "DOCS", cmd]);
        let outer = r
            .pairs()
            .unwrap_or_else(|| panic!("COMMAND DOCS {cmd}: {r:?}"));
        let doc = outer[0]
            .1
            .pairs()
            .unwrap_or_else(|| panic!("COMMAND DOCS {cmd}: {r:?}"));
        let summary = field(&doc, "summary")
            .and_then(|s| s.string())
            .unwrap_or_default();
        assert!(summary.len() > 20, "{cmd}: summary {summary:?}");
        assert_eq!(
            field(&doc, "since").and_then(|s| s.string()).as_deref(),
            Some(env!("CARGO_PKG_VERSION"))
        );
        let args = field(&doc, "arguments")
            .and_then(|a| a.array())
            .unwrap_or_default();
        let mut got_names = Vec::new();
        let mut got_optional = Vec::new();
        for a in args {
            let p = a.pairs().unwrap_or_default();
            let name = field(&p, "name")
                .and_then(|n| n.string())
                .unwrap_or_default();
            let flags = format!("{:?}", field(&p, "flags"));
            if flags.contains("optional") {
                got_optional.push(name.clone());
            }
            got_names.push(name);
        }
        assert_eq!(got_names, *names, "{cmd} arguments");
        assert_eq!(got_optional, *optional, "{cmd} optional arguments");
        let info = call(&mut c, &["COMMAND", "INFO", cmd]);
        let row = info
            .array()
            .and_then(|a| a.first())
            .and_then(|r| r.array())
            .unwrap_or_default();
        assert_eq!(
            row.get(1).and_then(|a| a.int()),
            Some(*arity),
            "{cmd} arity: {info:?}"
        );
    }
    // FLOCK.STATS: a container whose docs list its three subcommands.
    fn text(r: &Reply) -> String {
        match r {
            Reply::Array(items) => items.iter().map(text).collect::<Vec<_>>().join(" "),
            Reply::Map(pairs) => pairs
                .iter()
                .map(|(k, v)| format!("{} {}", text(k), text(v)))
                .collect::<Vec<_>>()
                .join(" "),
            other => other.string().unwrap_or_default(),
        }
    }
    let r = call(&mut c, &["COMMAND", "DOCS", "flock.stats"]);
    let text = text(&r);
    for want in [
        "flock.stats|get",
        "flock.stats|reset",
        "flock.stats|help",
        "TTL advice",
    ] {
        assert!(
            text.contains(want),
            "COMMAND DOCS flock.stats lacks {want}: {text}"
        );
    }
    // The internal effect command has an arity and a key spec but no docs.
    let r = call(&mut c, &["COMMAND", "DOCS", "flock.apply"]);
    assert!(
        !format!("{r:?}").contains("summary"),
        "FLOCK.APPLY is documented: {r:?}"
    );
    // redis-cli's HELP comes from these docs.
    let cli = std::process::Command::new(redis_cli())
        .args(["-p", &srv.port().to_string()])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .and_then(|mut child| {
            use std::io::Write;
            child
                .stdin
                .take()
                .expect("stdin")
                .write_all(b"HELP FLOCK.ACQUIRE\n")?;
            child.wait_with_output()
        })
        .expect("redis-cli");
    let help = String::from_utf8_lossy(&cli.stdout);
    assert!(
        help.contains("key owner ttl [SHARED|LIMIT n] [BOUND] [BLOCK timeout]"),
        "HELP FLOCK.ACQUIRE: {help}"
    );
    assert!(help.contains("fencing token"), "HELP FLOCK.ACQUIRE: {help}");
}

/// MODULE LIST's `ver` is the crate's version (major * 10000 + minor * 100 + patch), the same
/// version COMMAND DOCS gives as `since` and CHANGELOG.md names.
#[test]
fn module_version_is_the_crate_version() {
    let srv = Server::start();
    let mut c = srv.conn();
    let part = |v: &str| v.parse::<i64>().unwrap_or(-1);
    let want = part(env!("CARGO_PKG_VERSION_MAJOR")) * 10000
        + part(env!("CARGO_PKG_VERSION_MINOR")) * 100
        + part(env!("CARGO_PKG_VERSION_PATCH"));
    let r = call(&mut c, &["MODULE", "LIST"]);
    let modules = r.array().unwrap_or_default();
    let flock = modules
        .iter()
        .filter_map(|m| m.pairs())
        .find(|m| field(m, "name").and_then(|n| n.string()).as_deref() == Some("flock"))
        .unwrap_or_else(|| panic!("flock not in MODULE LIST: {r:?}"));
    assert_eq!(field(&flock, "ver").and_then(|v| v.int()), Some(want));
}

/// The value of `name` in a map reply read as pairs.
fn field<'a>(pairs: &'a [(Reply, Reply)], name: &str) -> Option<&'a Reply> {
    pairs
        .iter()
        .find(|(k, _)| k.string().as_deref() == Some(name))
        .map(|(_, v)| v)
}
