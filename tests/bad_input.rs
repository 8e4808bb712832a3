//! SPEC "Errors" and G8: every malformed call gets an error and changes nothing; WRONGTYPE;
//! FLOCK.APPLY is refused to clients; a seeded fuzz run must leave the server alive.

use flock_testkit::*;
use std::time::Duration;

/// What a malformed call must answer.
#[derive(Clone, Copy, Debug)]
enum Expect {
    Prefix(&'static str),
    Exact(&'static str),
    Contains(&'static str),
    /// any of these prefixes / substrings (where SPEC leaves the wording open)
    AnyOf(&'static [&'static str]),
}

fn matches(e: &str, x: Expect) -> bool {
    match x {
        Expect::Prefix(p) => e.starts_with(p),
        Expect::Exact(s) => e == s,
        Expect::Contains(s) => e.contains(s),
        Expect::AnyOf(list) => list.iter().any(|s| e.starts_with(s) || e.contains(s)),
    }
}

const ARITY: Expect = Expect::Contains("wrong number of arguments");
/// too many arguments for a fixed-arity command: an arity error or a syntax error
const EXTRA: Expect = Expect::AnyOf(&["wrong number of arguments", "ERR syntax error"]);
const TTL: Expect = Expect::Prefix("ERR invalid ttl");
const OWNER: Expect = Expect::Prefix("ERR invalid owner");
const TOKEN: Expect = Expect::Prefix("ERR invalid token");
const SYNTAX: Expect = Expect::Exact("ERR syntax error");
const ANY_ERR: Expect = Expect::Prefix("ERR");
const WRONGTYPE: Expect = Expect::Prefix("WRONGTYPE");

const HELD_TTL: i64 = 30_000;

struct Fixture {
    _srv: Server,
    c: redis::Connection,
    token: i64,
}

/// A server with `held` (owner alice, ttl 30 s) and a string key `str`; `free` does not exist.
fn fixture() -> Fixture {
    let srv = Server::start();
    let mut c = srv.conn();
    let token = grant(&mut c, "held", "alice", HELD_TTL);
    assert_eq!(
        call(&mut c, &["SET", "str", "v"]).string().as_deref(),
        Some("OK")
    );
    Fixture {
        _srv: srv,
        c,
        token,
    }
}

impl Fixture {
    /// Nothing changed: `held` still alice's with the same token and a lease that was not
    /// extended, `free` absent, `str` untouched.
    #[track_caller]
    fn assert_unchanged(&mut self, what: &str) {
        let c = &mut self.c;
        let i = info(c, "held").unwrap_or_else(|| panic!("{what}: `held` vanished"));
        assert_eq!(
            i.owner.as_deref(),
            Some(b"alice".as_slice()),
            "{what}: owner changed"
        );
        assert_eq!(i.token, self.token, "{what}: token changed");
        assert!(
            i.ttl >= 1 && i.ttl <= HELD_TTL,
            "{what}: lease changed: ttl {}",
            i.ttl
        );
        assert!(
            check(c, "held", self.token) >= 1,
            "{what}: grant no longer live"
        );
        assert_eq!(exists(c, "free"), 0, "{what}: `free` was created");
        assert_eq!(
            call(c, &["GET", "str"]).string().as_deref(),
            Some("v"),
            "{what}: `str` changed"
        );
        assert_eq!(dbsize(c), 2, "{what}: DBSIZE changed");
    }

    #[track_caller]
    fn expect(&mut self, args: &[&[u8]], x: Expect) {
        let what: Vec<String> = args.iter().map(|a| show(a)).collect();
        let what = format!("{what:?}");
        let r = call(&mut self.c, args);
        match &r {
            Reply::Err(e) if matches(e, x) => {}
            other => panic!("{what}: expected error {x:?}, got {other:?}"),
        }
        self.assert_unchanged(&what);
    }
}

fn v(args: &[&str]) -> Vec<Vec<u8>> {
    args.iter().map(|s| s.as_bytes().to_vec()).collect()
}

fn run_cases(f: &mut Fixture, cases: &[(Vec<Vec<u8>>, Expect)]) {
    for (args, x) in cases {
        let refs: Vec<&[u8]> = args.iter().map(|a| a.as_slice()).collect();
        f.expect(&refs, *x);
    }
}

#[test]
fn wrong_arity() {
    let mut f = fixture();
    let t = f.token.to_string();
    let cases = vec![
        (v(&["FLOCK.ACQUIRE"]), ARITY),
        (v(&["FLOCK.ACQUIRE", "free"]), ARITY),
        (v(&["FLOCK.ACQUIRE", "free", "o"]), ARITY),
        (v(&["FLOCK.ACQUIRE", "held", "alice"]), ARITY),
        (v(&["FLOCK.RELEASE"]), ARITY),
        (v(&["FLOCK.RELEASE", "held"]), ARITY),
        (v(&["FLOCK.RENEW"]), ARITY),
        (v(&["FLOCK.RENEW", "held"]), ARITY),
        (v(&["FLOCK.RENEW", "held", "alice"]), ARITY),
        (v(&["FLOCK.CHECK"]), ARITY),
        (v(&["FLOCK.CHECK", "held"]), ARITY),
        (v(&["FLOCK.INFO"]), ARITY),
        // the optional token of RELEASE/RENEW must be a token; the owner of REVOKE an owner
        (v(&["FLOCK.RELEASE", "held", "alice", "x"]), TOKEN),
        (v(&["FLOCK.RELEASE", "held", "alice", "alice"]), TOKEN),
        (v(&["FLOCK.RELEASE", "held", "alice", "0"]), TOKEN),
        (v(&["FLOCK.RELEASE", "held", "alice", "-1"]), TOKEN),
        (v(&["FLOCK.RENEW", "held", "alice", "20000", "x"]), TOKEN),
        (v(&["FLOCK.RENEW", "held", "alice", "20000", "0"]), TOKEN),
        (v(&["FLOCK.REVOKE", "held", ""]), OWNER),
        // too many arguments: must not act
        (v(&["FLOCK.RELEASE", "held", "alice", &t, "x"]), EXTRA),
        (
            v(&["FLOCK.RENEW", "held", "alice", "20000", &t, "x"]),
            EXTRA,
        ),
        (v(&["FLOCK.REVOKE", "held", "alice", "x"]), EXTRA),
        (v(&["FLOCK.CHECK", "held", &t, "x"]), EXTRA),
        (v(&["FLOCK.INFO", "held", "x"]), EXTRA),
        (v(&["FLOCK.INFO", "free", "x"]), EXTRA),
    ];
    run_cases(&mut f, &cases);
}

const BAD_TTLS: &[&str] = &[
    "0",
    "-1",
    "-1000",
    "abc",
    "1.5",
    "1000.0",
    "",
    "86400001",
    "9223372036854775807",
    "9223372036854775808",
    "-9223372036854775808",
    "-9223372036854775809",
    "99999999999999999999999",
    "1e3",
    "0x10",
    " 100",
    "100 ",
    "10\u{0}0",
];

#[test]
fn invalid_ttl() {
    let mut f = fixture();
    let mut cases = Vec::new();
    for ttl in BAD_TTLS {
        cases.push((v(&["FLOCK.ACQUIRE", "free", "o", ttl]), TTL));
        // the holder's retry with a bad ttl must not reset the lease
        cases.push((v(&["FLOCK.ACQUIRE", "held", "alice", ttl]), TTL));
        cases.push((v(&["FLOCK.RENEW", "held", "alice", ttl]), TTL));
    }
    run_cases(&mut f, &cases);
}

#[test]
fn invalid_owner() {
    let mut f = fixture();
    let long = "o".repeat(257);
    let huge = "o".repeat(100_000);
    let mut cases = Vec::new();
    for o in ["", long.as_str(), huge.as_str()] {
        cases.push((v(&["FLOCK.ACQUIRE", "free", o, "1000"]), OWNER));
        cases.push((v(&["FLOCK.ACQUIRE", "held", o, "1000"]), OWNER));
        cases.push((v(&["FLOCK.RENEW", "held", o, "1000"]), OWNER));
        cases.push((v(&["FLOCK.RELEASE", "held", o]), OWNER));
    }
    run_cases(&mut f, &cases);
}

#[test]
fn unknown_option_is_syntax_error() {
    let mut f = fixture();
    let cases = vec![
        (v(&["FLOCK.ACQUIRE", "free", "o", "1000", "FOO"]), SYNTAX),
        (
            v(&["FLOCK.ACQUIRE", "free", "o", "1000", "foo", "bar"]),
            SYNTAX,
        ),
        (v(&["FLOCK.ACQUIRE", "free", "o", "1000", "NX"]), SYNTAX),
        (v(&["FLOCK.ACQUIRE", "free", "o", "1000", ""]), SYNTAX),
        (
            v(&["FLOCK.ACQUIRE", "held", "alice", "50000", "FOO"]),
            SYNTAX,
        ),
        // BLOCK with a missing or bad timeout (whether or not BLOCK is implemented)
        (v(&["FLOCK.ACQUIRE", "free", "o", "1000", "BLOCK"]), ANY_ERR),
        (
            v(&["FLOCK.ACQUIRE", "free", "o", "1000", "BLOCK", "abc"]),
            ANY_ERR,
        ),
        (
            v(&["FLOCK.ACQUIRE", "free", "o", "1000", "BLOCK", "-1"]),
            ANY_ERR,
        ),
        (
            v(&["FLOCK.ACQUIRE", "free", "o", "1000", "BLOCK", "1.5"]),
            ANY_ERR,
        ),
        (
            v(&[
                "FLOCK.ACQUIRE",
                "free",
                "o",
                "1000",
                "BLOCK",
                "9223372036854775808",
            ]),
            ANY_ERR,
        ),
        (
            v(&["FLOCK.ACQUIRE", "free", "o", "1000", "BLOCK", "100", "FOO"]),
            ANY_ERR,
        ),
        (
            v(&["FLOCK.ACQUIRE", "held", "alice", "50000", "BLOCK", "x"]),
            ANY_ERR,
        ),
    ];
    run_cases(&mut f, &cases);
}

#[test]
fn invalid_token() {
    let mut f = fixture();
    let mut cases = Vec::new();
    for tok in [
        "0",
        "-1",
        "-9223372036854775808",
        "abc",
        "1.5",
        "",
        "9223372036854775808",
        "99999999999999999999",
        " 5",
        "5 ",
        "0x5",
        "1e5",
    ] {
        cases.push((v(&["FLOCK.CHECK", "held", tok]), TOKEN));
        cases.push((v(&["FLOCK.CHECK", "free", tok]), TOKEN));
    }
    run_cases(&mut f, &cases);
}

#[test]
fn wrongtype_for_every_command() {
    let mut f = fixture();
    let cases = vec![
        (v(&["FLOCK.ACQUIRE", "str", "o", "1000"]), WRONGTYPE),
        (v(&["FLOCK.RELEASE", "str", "o"]), WRONGTYPE),
        (v(&["FLOCK.RENEW", "str", "o", "1000"]), WRONGTYPE),
        (v(&["FLOCK.CHECK", "str", "5"]), WRONGTYPE),
        (v(&["FLOCK.INFO", "str"]), WRONGTYPE),
    ];
    run_cases(&mut f, &cases);
    // other types too
    let c = &mut f.c;
    call(c, &["HSET", "h", "f", "v"]);
    call(c, &["RPUSH", "l", "x"]);
    for key in ["h", "l"] {
        let r = call(c, &["FLOCK.ACQUIRE", key, "o", "1000"]);
        assert_err_prefix(&r, "WRONGTYPE", key);
        let r = call(c, &["FLOCK.INFO", key]);
        assert_err_prefix(&r, "WRONGTYPE", key);
    }
    assert_eq!(call(c, &["TYPE", "h"]).string().as_deref(), Some("hash"));
    assert_eq!(call(c, &["TYPE", "l"]).string().as_deref(), Some("list"));
    // and a lock key is the wrong type for other commands
    let r = call(c, &["GET", "held"]);
    assert_err_prefix(&r, "WRONGTYPE", "GET on a lock");
    let r = call(c, &["LPUSH", "held", "x"]);
    assert_err_prefix(&r, "WRONGTYPE", "LPUSH on a lock");
    call(c, &["DEL", "h", "l"]);
    f.assert_unchanged("after other types");
}

/// Argument vectors for FLOCK.APPLY, the internal effect command, that a client might forge.
fn forged_apply_vectors(token: i64) -> Vec<Vec<String>> {
    let far = (now_ms() + 3_600_000).to_string();
    let big = (token + 1_000_000).to_string();
    let mut out = vec![vec![]];
    let pool = ["held", "mallory", &big, &far, "0", "1"];
    // every prefix of a plausible shape, for several key/owner choices
    for key in ["held", "free"] {
        for n in 1..=7 {
            let mut a = vec![key.to_string()];
            for i in 1..n {
                a.push(pool[i % pool.len()].to_string());
            }
            a[0] = key.to_string();
            if n >= 2 {
                a[1] = "mallory".to_string();
            }
            if n >= 3 {
                a[2] = big.clone();
            }
            if n >= 4 {
                a[3] = far.clone();
            }
            out.push(a);
        }
    }
    out.push(vec!["held".into(), "DEL".into()]);
    out.push(vec!["held".into(), "del".into()]);
    out.push(vec![
        "free".into(),
        "SET".into(),
        "mallory".into(),
        big.clone(),
        far.clone(),
    ]);
    out.push(vec![
        "held".into(),
        "GRANT".into(),
        "mallory".into(),
        big.clone(),
        far.clone(),
    ]);
    out.push(vec![
        "free".into(),
        "GRANT".into(),
        "mallory".into(),
        big.clone(),
        far.clone(),
    ]);
    out.push(vec![
        "held".into(),
        "grant".into(),
        "alice".into(),
        big.clone(),
        "1".into(),
    ]);
    out.push(vec!["hw".into(), big.clone()]);
    out.push(vec!["HW".into(), big]);
    out
}

#[test]
fn apply_is_refused_to_clients() {
    let mut f = fixture();
    let mut saw_internal = false;
    for args in forged_apply_vectors(f.token) {
        let mut full: Vec<&str> = vec!["FLOCK.APPLY"];
        full.extend(args.iter().map(|s| s.as_str()));
        let r = call(&mut f.c, &full);
        let e = r.err().unwrap_or_else(|| {
            panic!("{full:?}: FLOCK.APPLY from a client must be refused, got {r:?}")
        });
        assert!(
            e.starts_with("ERR"),
            "{full:?}: error should start with ERR: {e:?}"
        );
        assert!(
            e.contains("internal") || e.contains("wrong number of arguments"),
            "{full:?}: error should say the command is internal: {e:?}"
        );
        saw_internal |= e.contains("internal");
        f.assert_unchanged(&format!("{full:?}"));
    }
    assert!(saw_internal, "no FLOCK.APPLY call was refused as internal");
    // a forged high token must not have raised the token counter either way: the next grant is
    // just greater than the last real one (cannot be checked exactly; at least it is < 2^53)
    let t = grant(&mut f.c, "other", "o", 1000);
    assert!(t > f.token && t < TWO_POW_53);
}

#[test]
fn apply_is_refused_in_multi_and_lua() {
    let mut f = fixture();
    let big = (f.token + 1_000_000).to_string();
    let far = (now_ms() + 3_600_000).to_string();
    // in a script
    let r = call(
        &mut f.c,
        &[
            "EVAL",
            "return redis.call('FLOCK.APPLY', KEYS[1], ARGV[1], ARGV[2], ARGV[3])",
            "1",
            "held",
            "mallory",
            &big,
            &far,
        ],
    );
    assert!(
        r.is_err(),
        "FLOCK.APPLY from Lua must be refused, got {r:?}"
    );
    f.assert_unchanged("APPLY in Lua");
    let r = call(
        &mut f.c,
        &[
            "EVAL",
            "return redis.pcall('FLOCK.APPLY', KEYS[1], ARGV[1], ARGV[2], ARGV[3])",
            "1",
            "free",
            "mallory",
            &big,
            &far,
        ],
    );
    assert!(
        r.is_err(),
        "FLOCK.APPLY from Lua (pcall) must be refused, got {r:?}"
    );
    f.assert_unchanged("APPLY in Lua pcall");
    // in a transaction
    assert!(!call(&mut f.c, &["MULTI"]).is_err());
    let q = call(&mut f.c, &["FLOCK.APPLY", "held", "mallory", &big, &far]);
    let r = call(&mut f.c, &["EXEC"]);
    let refused = q.is_err()
        || r.is_err()
        || r.array()
            .map(|a| a.iter().all(|x| x.is_err()))
            .unwrap_or(false);
    assert!(
        refused,
        "FLOCK.APPLY in MULTI must be refused: queue {q:?}, exec {r:?}"
    );
    f.assert_unchanged("APPLY in MULTI");
}

// ---------------------------------------------------------------------------------------------
// fuzz
// ---------------------------------------------------------------------------------------------

const FUZZ_COMMANDS: &[&str] = &[
    "FLOCK.ACQUIRE",
    "FLOCK.RELEASE",
    "FLOCK.RENEW",
    "FLOCK.CHECK",
    "FLOCK.INFO",
    "FLOCK.APPLY",
    "FLOCK.FENCED",
    "FLOCK.REVOKE",
    "flock.acquire",
    "Flock.Check",
];
const KEYS: &[&str] = &["k0", "k1", "k2", "k3", "str", "{k0}x", "\u{0}"];
const OWNERS: &[&str] = &["o0", "o1", "o2", "alice"];
const NUMBERS: &[&str] = &[
    "0",
    "1",
    "-1",
    "2",
    "10",
    "50",
    "100",
    "1000",
    "30000",
    "86400000",
    "86400001",
    "2147483647",
    "2147483648",
    "4294967296",
    "9007199254740991",
    "9007199254740992",
    "9223372036854775807",
    "9223372036854775808",
    "-9223372036854775808",
    "-9223372036854775809",
    "18446744073709551615",
    "18446744073709551616",
    "999999999999999999999999999999",
    "1.5",
    "-0",
    "+5",
    "1e3",
    "0x1f",
    " 7",
    "7 ",
    "NaN",
    "inf",
];
const WORDS: &[&str] = &[
    "BLOCK",
    "block",
    "FOO",
    "NX",
    "PX",
    "SET",
    "GET",
    "INCR",
    "PING",
    "FLOCK.ACQUIRE",
    "FLOCK.CHECK",
];

fn fuzz_arg(rng: &mut Rng, tokens: &[i64]) -> Vec<u8> {
    match rng.below(100) {
        0..=19 => rng.pick_ref(KEYS).as_bytes().to_vec(),
        20..=34 => rng.pick_ref(OWNERS).as_bytes().to_vec(),
        35..=54 => rng.pick_ref(NUMBERS).as_bytes().to_vec(),
        55..=59 => (rng.next_u64() as i64).to_string().into_bytes(),
        60..=64 => rng.next_u64().to_string().into_bytes(),
        65..=71 => {
            if tokens.is_empty() {
                b"1".to_vec()
            } else {
                let t = *rng.pick_ref(tokens) + rng.below(3) as i64 - 1;
                t.to_string().into_bytes()
            }
        }
        72..=76 => Vec::new(),
        77..=79 => {
            // long strings, up to 100 KB
            let n = match rng.below(4) {
                0 => 255 + rng.below(4) as usize,
                1 => rng.below(4096) as usize,
                _ => rng.below(100 * 1024) as usize,
            };
            vec![b'a' + rng.below(26) as u8; n]
        }
        80..=89 => {
            let n = rng.below(64) as usize;
            (0..n).map(|_| rng.next_u64() as u8).collect()
        }
        _ => rng.pick_ref(WORDS).as_bytes().to_vec(),
    }
}

fn shaped_vector(rng: &mut Rng, tokens: &[i64]) -> Vec<Vec<u8>> {
    let key = rng.pick_ref(KEYS).to_string();
    let owner = rng.pick_ref(OWNERS).to_string();
    let ttl = rng
        .pick(&["10", "50", "100", "1000", "5000", "30000"])
        .to_string();
    let tok = if tokens.is_empty() {
        "1".to_string()
    } else {
        (*rng.pick_ref(tokens)).to_string()
    };
    let mut v: Vec<String> = match rng.below(7) {
        0 | 1 => vec!["FLOCK.ACQUIRE".into(), key, owner, ttl],
        2 => vec!["FLOCK.RELEASE".into(), key, owner],
        3 => vec!["FLOCK.RENEW".into(), key, owner, ttl],
        4 => vec!["FLOCK.CHECK".into(), key, tok],
        5 => vec!["FLOCK.INFO".into(), key],
        _ => vec![
            "FLOCK.APPLY".into(),
            key,
            "GRANT".into(),
            owner,
            tok,
            (now_ms() + 10_000).to_string(),
        ],
    };
    if v[0] == "FLOCK.ACQUIRE" && rng.chance(10) {
        v.push("BLOCK".into());
        v.push(rng.pick_ref(&["0", "1", "10", "50", "100000"]).to_string());
    }
    let mut v: Vec<Vec<u8>> = v.into_iter().map(String::into_bytes).collect();
    // mutate one argument now and then
    if rng.chance(30) {
        let i = 1 + rng.below(v.len() as u64 - 1) as usize;
        v[i] = fuzz_arg(rng, tokens);
    }
    v
}

fn fuzz_vector(rng: &mut Rng, tokens: &[i64]) -> Vec<Vec<u8>> {
    if rng.chance(50) {
        return shaped_vector(rng, tokens);
    }
    let mut v = vec![rng.pick_ref(FUZZ_COMMANDS).as_bytes().to_vec()];
    let argc = rng.below(9) as usize;
    for i in 0..argc {
        // mostly well-shaped: key first, owner second, number third
        let a = match i {
            0 if rng.chance(75) => rng.pick_ref(KEYS).as_bytes().to_vec(),
            1 if rng.chance(50) => rng.pick_ref(OWNERS).as_bytes().to_vec(),
            2 if rng.chance(50) => rng
                .pick(&["10", "100", "1000", "5000", "0", "-5"])
                .as_bytes()
                .to_vec(),
            _ => fuzz_arg(rng, tokens),
        };
        v.push(a);
    }
    v
}

#[test]
fn fuzz_random_arguments_never_crash() {
    let seed: u64 = std::env::var("FLOCK_FUZZ_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(0x9E37_79B9_7F4A_7C15);
    let iterations: usize = std::env::var("FLOCK_FUZZ_ITERS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(5000);
    eprintln!("fuzz seed {seed} (set FLOCK_FUZZ_SEED to replay), {iterations} vectors");
    let mut rng = Rng::new(seed);
    let mut srv = Server::start();
    let mut c = RawConn::connect(srv.port()).expect("connect");
    c.call(&["SET", "str", "v"]).expect("SET");
    let mut tokens: Vec<i64> = Vec::new();
    let mut recent: Vec<String> = Vec::new();
    let (mut errors, mut oks, mut reconnects) = (0usize, 0usize, 0usize);
    for i in 0..iterations {
        let vec = fuzz_vector(&mut rng, &tokens);
        let has_block = vec.iter().any(|a| a.eq_ignore_ascii_case(b"BLOCK"));
        // a BLOCK that really waits is cut short by the read timeout and a reconnect (the
        // server must cope with a waiter that disconnects)
        let timeout = if has_block {
            Duration::from_millis(300)
        } else {
            Duration::from_secs(20)
        };
        c.set_read_timeout(timeout).expect("timeout");
        recent.push(show_args(&vec));
        if recent.len() > 8 {
            recent.remove(0);
        }
        match c.call(&vec) {
            Ok(Reply::Err(_)) => errors += 1,
            Ok(Reply::Int(t)) => {
                oks += 1;
                if t > 1_000_000 && tokens.len() < 64 {
                    tokens.push(t);
                }
            }
            Ok(_) => oks += 1,
            Err(e) => {
                if !srv.is_alive() {
                    panic!(
                        "server died at vector {i}: {e}\nlast vectors:\n{}\n{}",
                        recent.join("\n"),
                        srv.log_tail(60)
                    );
                }
                if !has_block {
                    panic!(
                        "connection error at vector {i} (server alive): {e}\nlast vectors:\n{}",
                        recent.join("\n")
                    );
                }
                reconnects += 1;
                c = RawConn::connect(srv.port()).expect("reconnect");
            }
        }
        if i % 250 == 249 {
            c.set_read_timeout(Duration::from_secs(20))
                .expect("timeout");
            let r = c.call(&["PING"]);
            assert!(
                matches!(r, Ok(Reply::Status(ref s)) if s == "PONG"),
                "PING after vector {i}: {r:?}\nlast vectors:\n{}\n{}",
                recent.join("\n"),
                srv.log_tail(60)
            );
        }
    }
    eprintln!("fuzz: {oks} replies, {errors} errors, {reconnects} reconnects after BLOCK");
    let mut c = srv.conn();
    assert_eq!(call(&mut c, &["PING"]), Reply::Status("PONG".into()));
    assert!(srv.is_alive(), "server process died");
    // still functional
    let t = grant(&mut c, "after-fuzz", "o", 1000);
    assert!(t > 0 && t < TWO_POW_53);
    assert!(
        oks > 0 && errors > 0,
        "fuzz exercised nothing: {oks} ok, {errors} errors"
    );
    let log = std::fs::read_to_string(srv.log_path()).unwrap_or_default();
    assert!(
        !log.contains("BUG REPORT") && !log.contains("panicked"),
        "server log shows a crash/panic:\n{}",
        srv.log_tail(60)
    );
}
