//! Security: FLOCK.FENCED never escalates ACL rights, the replication effect command and
//! forged payloads, hostile bytes in owners, arguments at and past every limit, and
//! `flock.max-waiters` as the bound on what a client can pin. The threat model these tests
//! back is docs/THREAT-MODEL.md.

use flock_testkit::*;
use std::io::Write;
use std::net::TcpStream;
use std::thread::sleep;
use std::time::Duration;

fn fenced(c: &mut redis::Connection, key: &str, token: i64, inner: &[&str]) -> Reply {
    let mut args = vec!["FLOCK.FENCED".to_string(), key.into(), token.to_string()];
    args.extend(inner.iter().map(|s| s.to_string()));
    call(c, &args)
}

/// Whether MODULE LIST shows flock.
fn module_loaded(c: &mut redis::Connection) -> bool {
    fn any_flock(r: &Reply) -> bool {
        match r {
            Reply::Bulk(b) => b.as_slice() == b"flock",
            Reply::Array(a) => a.iter().any(any_flock),
            Reply::Map(m) => m.iter().any(|(k, v)| any_flock(k) || any_flock(v)),
            _ => false,
        }
    }
    any_flock(&call(c, &["MODULE", "LIST"]))
}

/// Everything an application user may not do must fail through FENCED too, and change nothing.
#[test]
fn fenced_never_escalates_commands_keys_or_channels() {
    let srv = Server::start();
    let mut admin = srv.conn();
    for (k, v) in [("secret", "s"), ("data:1", "v1")] {
        assert_ok(&call(&mut admin, &["SET", k, v]), "SET");
    }
    assert_ok(
        &call(&mut admin, &["RPUSH", "data:list", "b", "a"]),
        "RPUSH",
    );
    assert_ok(&call(&mut admin, &["SADD", "data:set", "x"]), "SADD");
    assert_ok(&call(&mut admin, &["ZADD", "data:z", "1", "m"]), "ZADD");
    assert_ok(&call(&mut admin, &["HSET", "data:h", "f", "v"]), "HSET");
    let app_rules = [
        "ACL",
        "SETUSER",
        "app",
        "on",
        ">pw",
        "~lk",
        "~data:*",
        "resetchannels",
        "&news:*",
        "+flock.fenced",
        "+flock.acquire",
        "+flock.release",
        "+set",
        "+get",
        "+mset",
        "+sort",
        "+copy",
        "+rename",
        "+lmove",
        "+bitop",
        "+zunionstore",
        "+smove",
        "+publish",
        "+config|get",
        "+eval",
        "+multi",
        "+exec",
        "+hset",
        "+object",
    ];
    assert_ok(&call(&mut admin, &app_rules), "ACL SETUSER app");
    assert_ok(
        &call(
            &mut admin,
            &[
                "ACL",
                "SETUSER",
                "ro",
                "on",
                ">pw",
                "~lk",
                "%R~data:*",
                "+flock.fenced",
                "+flock.acquire",
                "+get",
                "+set",
            ],
        ),
        "ACL SETUSER ro",
    );
    assert_ok(
        &call(
            &mut admin,
            &[
                "ACL",
                "SETUSER",
                "nolock",
                "on",
                ">pw",
                "~data:*",
                "+flock.fenced",
                "+set",
                "+get",
            ],
        ),
        "ACL SETUSER nolock",
    );
    let mut app = srv.conn_as("app", "pw");
    let t = grant(&mut app, "lk", "app-1", 60_000);

    // Positive controls: what the user may do directly works through FENCED.
    assert_eq!(
        fenced(&mut app, "lk", t, &["SET", "data:ok", "v"]),
        Reply::Status("OK".into())
    );
    assert_eq!(
        fenced(&mut app, "lk", t, &["PUBLISH", "news:1", "m"]),
        Reply::Int(0)
    );
    assert_eq!(
        fenced(&mut app, "lk", t, &["HSET", "data:h", "g", "w"]),
        Reply::Int(1)
    );

    // Keys outside the user's patterns, at every position a command can take one.
    let key_escapes: &[&[&str]] = &[
        &["SET", "secret", "x"],
        &["GET", "secret"],
        &["MSET", "data:2", "v", "secret", "x"],
        &["SORT", "data:list", "ALPHA", "STORE", "secret"],
        &["COPY", "data:1", "secret", "REPLACE"],
        &["RENAME", "data:1", "secret"],
        &["LMOVE", "data:list", "secret", "LEFT", "RIGHT"],
        &["BITOP", "AND", "secret", "data:1"],
        &["ZUNIONSTORE", "secret", "1", "data:z"],
        &["SMOVE", "data:set", "secret", "x"],
        &["OBJECT", "ENCODING", "secret"],
    ];
    for inner in key_escapes {
        let r = fenced(&mut app, "lk", t, inner);
        assert!(
            matches!(&r, Reply::Err(e) if e.starts_with("NOPERM")),
            "FENCED {inner:?} as app: {r:?}, expected NOPERM"
        );
    }
    // Channels, commands and subcommands the user does not have.
    let command_escapes: &[&[&str]] = &[
        &["PUBLISH", "private", "m"],
        &["CONFIG", "SET", "maxmemory", "1"],
        &["FLUSHALL"],
        &["FLUSHDB"],
        &["DEL", "data:1"],
        &["ACL", "SETUSER", "app", "+@all", "~*"],
        &["ACL", "DELUSER", "default"],
        &["MODULE", "UNLOAD", "flock"],
        &["REPLICAOF", "127.0.0.1", "1"],
        &["DEBUG", "SLEEP", "0"],
        &["SHUTDOWN", "NOSAVE"],
        &["SCRIPT", "FLUSH"],
        &["EVAL", "return redis.call('SET','secret','x')", "0"],
        &["FLOCK.REVOKE", "lk"],
        &[
            "flock.apply",
            "lk",
            "GRANT",
            "mallory",
            "9007199254740990",
            "99999999999999",
        ],
        &["FLOCK.FENCED", "lk", &t.to_string(), "SET", "secret", "x"],
        &["MULTI"],
        &["CLIENT", "KILL", "TYPE", "normal"],
    ];
    for inner in command_escapes {
        let r = fenced(&mut app, "lk", t, inner);
        assert!(r.is_err(), "FENCED {inner:?} as app went through: {r:?}");
    }
    // Read-only key patterns: reads pass (FENCED reports each inner key with the flags the
    // inner command declares), writes never do.
    let mut ro = srv.conn_as("ro", "pw");
    assert_eq!(
        call(&mut ro, &["GET", "data:1"]),
        Reply::Bulk(b"v1".to_vec())
    );
    assert_eq!(
        fenced(&mut ro, "lk", t, &["GET", "data:1"]),
        Reply::Bulk(b"v1".to_vec()),
        "a read of a %R~ key through FENCED"
    );
    let r = fenced(&mut ro, "lk", t, &["SET", "data:1", "x"]);
    assert_err_prefix(&r, "NOPERM", "a write to a read-only key through FENCED");
    // A user who may not touch the lock key may not fence with it.
    let mut nolock = srv.conn_as("nolock", "pw");
    let r = fenced(&mut nolock, "lk", t, &["SET", "data:3", "x"]);
    assert_err_prefix(
        &r,
        "NOPERM",
        "FENCED on a lock key outside the user's patterns",
    );
    // Inside MULTI and inside a script: the same rules.
    assert_eq!(call(&mut app, &["MULTI"]), Reply::Status("OK".into()));
    let q = fenced(&mut app, "lk", t, &["SET", "secret", "multi"]);
    let e = call(&mut app, &["EXEC"]);
    assert!(
        q.is_err() || e.is_err() || e.array().is_some_and(|a| a.iter().all(Reply::is_err)),
        "FENCED in MULTI: queued {q:?}, EXEC {e:?}"
    );
    let script = "return redis.call('FLOCK.FENCED', KEYS[1], ARGV[1], 'SET', KEYS[2], 'lua')";
    let r = call(
        &mut app,
        &["EVAL", script, "2", "lk", "secret", &t.to_string()],
    );
    assert!(r.is_err(), "FENCED in Lua as app: {r:?}");

    // Nothing changed.
    assert_eq!(
        call(&mut admin, &["GET", "secret"]),
        Reply::Bulk(b"s".to_vec())
    );
    assert_eq!(
        call(&mut admin, &["GET", "data:1"]),
        Reply::Bulk(b"v1".to_vec())
    );
    assert_eq!(call(&mut admin, &["LLEN", "data:list"]), Reply::Int(2));
    assert_eq!(call(&mut admin, &["SCARD", "data:set"]), Reply::Int(1));
    assert_eq!(
        call(&mut admin, &["DBSIZE"]),
        Reply::Int(8),
        "no key created or deleted"
    );
    assert!(call(&mut admin, &["ACL", "GETUSER", "app"])
        .array()
        .is_some());
    assert_eq!(held(&mut admin, "lk").1, t, "the grant is untouched");
    assert!(module_loaded(&mut admin), "module still loaded");
}

/// Even the default user (all rights) cannot use FENCED to run what would hurt the server
/// from inside a command: admin and connection commands are refused, and the server stays up
/// with the module loaded.
#[test]
fn fenced_refuses_server_altering_commands_even_for_admins() {
    let mut srv = Server::start();
    let mut c = srv.conn();
    let t = grant(&mut c, "lk", "admin", 60_000);
    for inner in [
        vec!["MODULE", "UNLOAD", "flock"],
        vec!["MODULE", "LOAD", "/nonexistent.so"],
        vec!["REPLICAOF", "127.0.0.1", "1"],
        vec!["SLAVEOF", "127.0.0.1", "1"],
        vec!["SHUTDOWN", "NOSAVE"],
        vec!["shutdown"],
        vec!["DEBUG", "SEGFAULT"],
        vec!["Debug", "RELOAD"],
        vec!["MONITOR"],
        vec!["SUBSCRIBE", "x"],
        vec!["SYNC"],
        vec!["PSYNC", "?", "-1"],
        vec!["CLIENT", "KILL", "TYPE", "normal"],
        vec!["SWAPDB", "0", "1"],
        vec!["SELECT", "1"],
        vec!["FLOCK.RELEASE", "lk", "admin"],
        vec!["FlOcK.ApPlY", "lk", "GRANT", "x", "5", "1"],
        vec!["WAIT", "1", "0"],
        vec!["BLPOP", "l", "0"],
        vec!["EXEC"],
        vec!["FUNCTION", "FLUSH"],
    ] {
        let r = fenced(&mut c, "lk", t, &inner);
        assert!(r.is_err(), "FENCED {inner:?}: {r:?}");
        assert!(srv.is_alive(), "the server died on FENCED {inner:?}");
    }
    assert_eq!(call(&mut c, &["PING"]), Reply::Status("PONG".into()));
    assert_eq!(held(&mut c, "lk").1, t);
    assert_eq!(
        info_field(&mut c, "replication", "role").as_deref(),
        Some("master")
    );
    assert!(module_loaded(&mut c), "module still loaded");
}

/// CRC-64 (Jones polynomial, reflected) as Redis computes it for DUMP payloads.
fn crc64(data: &[u8]) -> u64 {
    let mut crc = 0u64;
    for &b in data {
        crc ^= u64::from(b);
        for _ in 0..8 {
            crc = if crc & 1 == 1 {
                (crc >> 1) ^ 0x95AC_9329_AC4B_C9B5
            } else {
                crc >> 1
            };
        }
    }
    crc
}

/// A DUMP payload of a lock whose token is replaced by `token` (valid checksum).
fn forge_payload(dump: &[u8], old: i64, token: u64) -> Vec<u8> {
    let mut p = dump.to_vec();
    let n = p.len();
    assert_eq!(
        crc64(&p[..n - 8]),
        u64::from_le_bytes(p[n - 8..].try_into().unwrap()),
        "our CRC-64 does not match Redis's"
    );
    // SaveUnsigned(token): opcode 2, then a 64-bit length: 0x81 and 8 big-endian bytes. The
    // token is there twice (the key's last token and its grant's): forge both.
    let mut needle = vec![0x02u8, 0x81];
    needle.extend_from_slice(&(old as u64).to_be_bytes());
    let at: Vec<usize> = (0..p.len().saturating_sub(needle.len()))
        .filter(|&i| p[i..i + needle.len()] == needle[..])
        .collect();
    assert!(!at.is_empty(), "the token in the DUMP payload");
    for i in at {
        p[i + 2..i + 10].copy_from_slice(&token.to_be_bytes());
    }
    let crc = crc64(&p[..n - 8]);
    p[n - 8..].copy_from_slice(&crc.to_le_bytes());
    p
}

/// FLOCK.APPLY is refused to clients (tests/bad_input.rs covers MULTI and Lua; here FENCED and
/// a forged RESTORE). A RESTORE payload is trusted like an RDB: a user allowed to RESTORE can
/// forge a grant and raise the token high-water mark, up to exhausting the token space. That
/// is why DUMP/RESTORE/MIGRATE belong to operators (docs/THREAT-MODEL.md); the server must
/// still answer with an error, never crash.
#[test]
fn forged_effects_and_payloads() {
    let srv = Server::start();
    let mut c = srv.conn();
    let r = call(
        &mut c,
        &[
            "FLOCK.APPLY",
            "lk",
            "GRANT",
            "mallory",
            "5",
            "99999999999999",
        ],
    );
    assert_err_contains(&r, "internal", "FLOCK.APPLY from a client");
    let t = grant(&mut c, "lk", "me", 60_000);
    let r = fenced(
        &mut c,
        "lk",
        t,
        &["FLOCK.APPLY", "x", "GRANT", "m", "5", "1"],
    );
    assert!(r.is_err(), "APPLY through FENCED: {r:?}");
    assert_eq!(exists(&mut c, "x"), 0);

    // A corrupt payload is refused.
    let dump = call(&mut c, &["DUMP", "lk"])
        .bytes()
        .expect("DUMP")
        .to_vec();
    let mut bad = dump.clone();
    let n = bad.len();
    bad[n / 2] ^= 0xff;
    let r = call(&mut c, &[b"RESTORE".as_slice(), b"bad", b"0", &bad]);
    assert!(r.is_err(), "corrupt payload restored: {r:?}");
    // A forged token above 2^53 is refused.
    let over = forge_payload(&dump, t, 1 << 53);
    let r = call(&mut c, &[b"RESTORE".as_slice(), b"over", b"0", &over]);
    assert!(r.is_err(), "a token of 2^53 restored: {r:?}");
    assert_eq!(exists(&mut c, "over"), 0);
    // The largest token is accepted (the contract: restored tokens raise the mark)...
    let max = forge_payload(&dump, t, (1 << 53) - 1);
    let r = call(&mut c, &[b"RESTORE".as_slice(), b"forged", b"0", &max]);
    assert_eq!(r, Reply::Status("OK".into()), "RESTORE of a forged payload");
    let (owner, token, _) = held(&mut c, "forged");
    assert_eq!((owner.as_str(), token), ("me", (1 << 53) - 1));
    // ...and exhausts the token space: ACQUIRE says so, and the server keeps going.
    let r = call(&mut c, &["FLOCK.ACQUIRE", "other", "o", "1000"]);
    assert_err_contains(&r, "exhausted", "ACQUIRE after the mark reached 2^53-1");
    eprintln!(
        "a forged RESTORE raised the token mark to 2^53-1; ACQUIRE now answers {r:?} \
         (RESTORE must stay an operator command)"
    );
    assert_eq!(call(&mut c, &["PING"]), Reply::Status("PONG".into()));
}

/// Owners with CR, LF, NUL and every other byte value survive RESP, replication, the AOF and
/// RDB exactly.
#[test]
fn hostile_owner_bytes_survive_replication_aof_and_rdb() {
    let mut master = Server::builder()
        .arg("appendonly", "yes")
        .arg("appendfsync", "always")
        .start();
    let replica = Server::start_replica_of(&master);
    let mut c = master.conn();
    let all: Vec<u8> = (0..=255u8).collect(); // 256 bytes: the longest owner
    let crlf: Vec<u8> = b"\r\n*3\r\n$3\r\nSET\r\n$1\r\nx\r\n\0".to_vec();
    let t1 = call(
        &mut c,
        &[b"FLOCK.ACQUIRE".as_slice(), b"k1", &all, b"600000"],
    )
    .int()
    .expect("grant k1");
    let t2 = call(
        &mut c,
        &[b"FLOCK.ACQUIRE".as_slice(), b"k2\r\n\0", &crlf, b"600000"],
    )
    .int()
    .expect("grant k2");
    let check = |c: &mut redis::Connection, what: &str| {
        let i = parse_info(&call(c, &[b"FLOCK.INFO".as_slice(), b"k1"]), what).expect(what);
        assert_eq!(
            i.owner.as_deref(),
            Some(all.as_slice()),
            "{what}: owner of k1"
        );
        assert_eq!(i.token, t1, "{what}");
        let i = parse_info(&call(c, &[b"FLOCK.INFO".as_slice(), b"k2\r\n\0"]), what).expect(what);
        assert_eq!(
            i.owner.as_deref(),
            Some(crlf.as_slice()),
            "{what}: owner of k2"
        );
        assert_eq!(i.token, t2, "{what}");
        assert_eq!(
            call(c, &["EXISTS", "x"]),
            Reply::Int(0),
            "{what}: injected SET ran"
        );
    };
    check(&mut c, "master");
    wait_replica(&mut c);
    check(&mut replica.conn(), "replica");
    master.restart(); // SIGKILL, then the AOF
    let mut c = master.conn();
    check(&mut c, "after kill -9 and AOF load");
    rewrite_aof(&mut c);
    master.restart();
    let mut c = master.conn();
    check(&mut c, "after AOF rewrite and restart");
    call(&mut c, &["DEBUG", "RELOAD"]);
    check(&mut c, "after DEBUG RELOAD (RDB)");
    assert_eq!(
        call(&mut c, &[b"FLOCK.RELEASE".as_slice(), b"k1", &all]),
        Reply::Int(1)
    );
    // An owner that differs in its last byte is another owner.
    let mut other = crlf.clone();
    *other.last_mut().unwrap() = b'1';
    assert_eq!(
        call(&mut c, &[b"FLOCK.RELEASE".as_slice(), b"k2\r\n\0", &other]),
        Reply::Int(0)
    );
}

/// Arguments at and past every limit: the ones at the limit work, the ones past it get an
/// error and change nothing, and the server keeps answering.
#[test]
fn arguments_at_and_past_every_limit() {
    let srv = Server::start();
    let mut c = srv.conn();
    let o256 = "o".repeat(256);
    let o257 = "o".repeat(257);
    // owner, on every command that takes one
    for (cmd, extra) in [("FLOCK.RELEASE", None), ("FLOCK.RENEW", Some("1000"))] {
        let mut a = vec![cmd, "lk", o257.as_str()];
        a.extend(extra);
        assert_err_prefix(&call(&mut c, &a), "ERR invalid owner", cmd);
    }
    let t = grant(&mut c, "lk", &o256, 1000);
    assert_eq!(renew(&mut c, "lk", &o256, 1000), Some(t));
    assert_eq!(release(&mut c, "lk", &o256), 1);
    // ttl: the default maximum, and the largest maximum (ten years)
    assert!(acquire(&mut c, "t1", "o", 86_400_000).is_some());
    assert_err_prefix(
        &call(&mut c, &["FLOCK.ACQUIRE", "t2", "o", "86400001"]),
        "ERR invalid ttl",
        "ttl past max",
    );
    assert_ok(
        &call(
            &mut c,
            &["CONFIG", "SET", "flock.max-ttl-ms", "315360000000"],
        ),
        "max-ttl at its limit",
    );
    assert!(call(
        &mut c,
        &["CONFIG", "SET", "flock.max-ttl-ms", "315360000001"]
    )
    .is_err());
    let t10 = grant(&mut c, "t10y", "o", 315_360_000_000);
    let left = check(&mut c, "t10y", t10);
    assert!(left > 315_359_000_000, "ten-year lease has {left} ms left");
    assert_eq!(release(&mut c, "t10y", "o"), 1);
    // lock-delay and max-waiters limits
    assert_ok(
        &call(
            &mut c,
            &["CONFIG", "SET", "flock.lock-delay-ms", "86400000"],
        ),
        "delay",
    );
    assert!(call(
        &mut c,
        &["CONFIG", "SET", "flock.lock-delay-ms", "86400001"]
    )
    .is_err());
    assert!(call(&mut c, &["CONFIG", "SET", "flock.lock-delay-ms", "-1"]).is_err());
    assert_ok(
        &call(&mut c, &["CONFIG", "SET", "flock.lock-delay-ms", "0"]),
        "delay",
    );
    assert!(call(&mut c, &["CONFIG", "SET", "flock.max-waiters", "-1"]).is_err());
    // tokens: the largest a token can be, the largest integer, past it
    let t = grant(&mut c, "tok", "o", 60_000);
    for (arg, want_err) in [
        ("9007199254740991", false),
        ("9007199254740992", false),
        ("9223372036854775807", false),
        ("9223372036854775808", true),
        ("18446744073709551616", true),
        ("0", true),
        ("-1", true),
    ] {
        let r = call(&mut c, &["FLOCK.CHECK", "tok", arg]);
        assert_eq!(r.is_err(), want_err, "CHECK {arg}: {r:?}");
        if !want_err {
            assert_eq!(r, Reply::Int(0), "CHECK {arg}");
        }
        let r = call(&mut c, &["FLOCK.FENCED", "tok", arg, "SET", "x", "1"]);
        assert!(r.is_err(), "FENCED with token {arg}: {r:?}");
    }
    assert_eq!(exists(&mut c, "x"), 0);
    assert!(check(&mut c, "tok", t) > 0);
    // a 1 MB key name; an inner command with 20,000 arguments
    let big_key = "k".repeat(1 << 20);
    let tb = grant(&mut c, &big_key, "o", 60_000);
    assert!(check(&mut c, &big_key, tb) > 0);
    let mut inner = vec!["MSET".to_string()];
    for i in 0..10_000 {
        inner.push(format!("m:{i}"));
        inner.push("v".into());
    }
    let inner_refs: Vec<&str> = inner.iter().map(String::as_str).collect();
    assert_eq!(
        fenced(&mut c, &big_key, tb, &inner_refs),
        Reply::Status("OK".into())
    );
    assert_eq!(release(&mut c, &big_key, "o"), 1);
    assert_eq!(exists(&mut c, &big_key), 0);
    assert_eq!(call(&mut c, &["PING"]), Reply::Status("PONG".into()));
}

/// Whether a waiter with BLOCK `timeout` on a held key is still waiting after 300 ms.
fn still_waits_after_300ms(
    srv: &Server,
    c: &mut redis::Connection,
    timeout: &str,
) -> Option<String> {
    let mut w = RawConn::connect(srv.port()).expect("connect");
    w.send(&["FLOCK.ACQUIRE", "lk", "w", "1000", "BLOCK", timeout])
        .expect("send");
    w.set_read_timeout(Duration::from_millis(300)).expect("t");
    let bad = match w.read_reply() {
        Err(_) => None, // still waiting: right
        Ok(r) => Some(format!("BLOCK {timeout} answered {r:?} at once")),
    };
    drop(w);
    wait_until("the waiter left", || {
        info(c, "lk").map(|i| i.waiters) == Some(0)
    });
    bad
}

/// A waiter with a huge BLOCK timeout waits (as with BLOCK 0) instead of timing out at once.
#[test]
fn huge_block_timeouts_wait() {
    let srv = Server::start();
    let mut c = srv.conn();
    grant(&mut c, "lk", "holder", 60_000);
    let bad: Vec<String> = [
        "1000000000000",    // 31 years
        "9223372036854775", // the largest whose microseconds fit in 64 bits
        "9223372036854776", // the smallest whose microseconds do not
    ]
    .iter()
    .filter_map(|t| still_waits_after_300ms(&srv, &mut c, t))
    .collect();
    assert!(bad.is_empty(), "{}", bad.join("\n"));
}

/// The largest timeout: the server computes a module timer's deadline as
/// `ustime() + period * 1000`, which wraps into the past for periods near i64::MAX; the waiter
/// used to time out at once (docs/RELIABILITY.md, known issue 2).
#[test]
fn block_with_the_largest_timeout_waits() {
    let srv = Server::start();
    let mut c = srv.conn();
    grant(&mut c, "lk", "holder", 60_000);
    let bad = still_waits_after_300ms(&srv, &mut c, "9223372036854775807");
    assert!(bad.is_none(), "{}", bad.unwrap_or_default());
}

/// `flock.max-waiters` bounds what clients can pin on one key; across keys the bound is
/// `maxclients` (one blocked client per connection), which the figures printed here show.
#[test]
fn max_waiters_bounds_memory_an_attacker_can_pin() {
    let srv = Server::builder()
        .module_args(&["max-waiters", "100"])
        .start();
    let mut c = srv.conn();
    grant(&mut c, "hot", "holder", 600_000);
    let used = |c: &mut redis::Connection| -> i64 {
        info_field(c, "memory", "used_memory")
            .and_then(|v| v.parse().ok())
            .expect("used_memory")
    };
    let base = used(&mut c);
    let mut socks = Vec::new();
    let mut refused = 0;
    for i in 0..300 {
        // Distinct owners of the longest length (an owner waits once: the same owner again
        // would take its own earlier place, not a new one).
        let owner = format!("{i:A>256}");
        let mut s = RawConn::connect(srv.port()).expect("connect");
        s.send(&["FLOCK.ACQUIRE", "hot", &owner, "1000", "BLOCK", "0"])
            .expect("send");
        if i >= 100 {
            // past the bound: an error at once
            s.set_read_timeout(Duration::from_secs(10)).expect("t");
            let r = s.read_reply().expect("reply past max-waiters");
            assert!(
                matches!(&r, Reply::Err(e) if e.contains("max-waiters")),
                "waiter {i}: {r:?}"
            );
            refused += 1;
        }
        socks.push(s);
    }
    let i = info(&mut c, "hot").expect("info");
    assert_eq!(i.waiters, 100, "queue bounded by flock.max-waiters");
    assert_eq!(refused, 200);
    let pinned = used(&mut c) - base;
    eprintln!(
        "300 clients with 256-byte owners on one key, max-waiters 100: 100 wait, 200 refused; \
         used_memory {pinned:+} bytes (with the 300 connections)"
    );
    // Across keys, each key has its own bound: 300 more clients on 300 keys all wait.
    for k in 0..300 {
        grant(&mut c, &format!("cold:{k}"), "holder", 600_000);
    }
    let base2 = used(&mut c);
    let owner = "A".repeat(256);
    let mut socks2 = Vec::new();
    for k in 0..300 {
        let mut s = TcpStream::connect(("127.0.0.1", srv.port())).expect("connect");
        let key = format!("cold:{k}");
        let args = [
            "FLOCK.ACQUIRE",
            key.as_str(),
            owner.as_str(),
            "1000",
            "BLOCK",
            "0",
        ];
        let mut buf = format!("*{}\r\n", args.len());
        for a in args {
            buf.push_str(&format!("${}\r\n{a}\r\n", a.len()));
        }
        s.write_all(buf.as_bytes()).expect("send");
        socks2.push(s);
    }
    wait_until("300 waiters on 300 keys", || {
        info_field(&mut c, "flock", "flock_blocked_clients").as_deref() == Some("400")
    });
    let per = (used(&mut c) - base2) / 300;
    eprintln!(
        "300 clients waiting on 300 keys: about {per} bytes each (client and waiter); the bound \
         across keys is maxclients"
    );
    drop(socks);
    drop(socks2);
    wait_until("all waiters gone", || {
        info_field(&mut c, "flock", "flock_blocked_clients").as_deref() == Some("0")
    });
    sleep(Duration::from_millis(100));
    assert_eq!(call(&mut c, &["PING"]), Reply::Status("PONG".into()));
}
