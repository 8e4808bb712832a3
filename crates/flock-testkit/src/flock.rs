//! The flock commands as test helpers that check the reply's shape (a token in (0, 2^53), 0 or
//! 1, a FLOCK.INFO map) so that each test asserts only what it is about; and the server chores
//! tests need around them (wait for a replica, rewrite the AOF).

use crate::info::{info_field, info_i64, Call};
use crate::reply::{call, call_raw, Reply};
use crate::wait::wait_until;

/// 2^53: every token must stay below this (JavaScript safe integers).
pub const TWO_POW_53: i64 = 1 << 53;

#[derive(Clone, Debug, PartialEq)]
pub struct LockInfo {
    pub owner: Option<Vec<u8>>,
    pub token: i64,
    pub ttl: i64,
    pub waiters: i64,
    pub fields: Vec<(String, Reply)>,
}

#[track_caller]
pub fn acquire(con: &mut redis::Connection, key: &str, owner: &str, ttl: i64) -> Option<i64> {
    let r = call(con, &["FLOCK.ACQUIRE", key, owner, &ttl.to_string()]);
    match r {
        Reply::Nil => None,
        Reply::Int(t) => {
            assert!(t > 0 && t < TWO_POW_53, "token {t} out of range (0, 2^53)");
            Some(t)
        }
        other => panic!("FLOCK.ACQUIRE {key} {owner} {ttl}: unexpected reply {other:?}"),
    }
}

/// ACQUIRE that must be granted.
#[track_caller]
pub fn grant(con: &mut redis::Connection, key: &str, owner: &str, ttl: i64) -> i64 {
    acquire(con, key, owner, ttl)
        .unwrap_or_else(|| panic!("FLOCK.ACQUIRE {key} {owner} {ttl}: nil, expected a grant"))
}

#[track_caller]
pub fn release(con: &mut redis::Connection, key: &str, owner: &str) -> i64 {
    match call(con, &["FLOCK.RELEASE", key, owner]) {
        Reply::Int(i) if i == 0 || i == 1 => i,
        other => panic!("FLOCK.RELEASE {key} {owner}: unexpected reply {other:?}"),
    }
}

#[track_caller]
pub fn renew(con: &mut redis::Connection, key: &str, owner: &str, ttl: i64) -> Option<i64> {
    match call(con, &["FLOCK.RENEW", key, owner, &ttl.to_string()]) {
        Reply::Nil => None,
        Reply::Int(t) => Some(t),
        other => panic!("FLOCK.RENEW {key} {owner} {ttl}: unexpected reply {other:?}"),
    }
}

#[track_caller]
pub fn check(con: &mut redis::Connection, key: &str, token: i64) -> i64 {
    match call(con, &["FLOCK.CHECK", key, &token.to_string()]) {
        Reply::Int(i) if i >= 0 => i,
        other => panic!("FLOCK.CHECK {key} {token}: unexpected reply {other:?}"),
    }
}

/// Parse a FLOCK.INFO reply (RESP2 flat array or RESP3 map).
#[track_caller]
pub fn parse_info(r: &Reply, what: &str) -> Option<LockInfo> {
    if r.is_nil() {
        return None;
    }
    let pairs = r
        .pairs()
        .unwrap_or_else(|| panic!("{what}: FLOCK.INFO reply is not a map: {r:?}"));
    let mut fields = Vec::new();
    for (k, v) in pairs {
        let k = k
            .string()
            .unwrap_or_else(|| panic!("{what}: FLOCK.INFO field name not a string: {k:?}"));
        fields.push((k, v));
    }
    let get = |name: &str| -> Reply {
        fields
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.clone())
            .unwrap_or_else(|| panic!("{what}: FLOCK.INFO has no field {name:?}: {r:?}"))
    };
    let owner = match get("owner") {
        Reply::Nil => None,
        o => Some(
            o.bytes()
                .unwrap_or_else(|| panic!("{what}: owner not a string: {o:?}"))
                .to_vec(),
        ),
    };
    let int = |name: &str| -> i64 {
        let v = get(name);
        match v {
            Reply::Int(i) => i,
            // tolerate a numeric string
            ref b => b
                .string()
                .and_then(|s| s.parse().ok())
                .unwrap_or_else(|| panic!("{what}: field {name} not an integer: {v:?}")),
        }
    };
    Some(LockInfo {
        owner,
        token: int("token"),
        ttl: int("ttl"),
        waiters: int("waiters"),
        fields,
    })
}

#[track_caller]
pub fn info(con: &mut redis::Connection, key: &str) -> Option<LockInfo> {
    let r = call(con, &["FLOCK.INFO", key]);
    parse_info(&r, &format!("FLOCK.INFO {key}"))
}

/// `INFO key` that must show a holder; returns (owner as string, token, ttl).
#[track_caller]
pub fn held(con: &mut redis::Connection, key: &str) -> (String, i64, i64) {
    let i = info(con, key).unwrap_or_else(|| panic!("FLOCK.INFO {key}: nil, expected a holder"));
    let o = i
        .owner
        .clone()
        .unwrap_or_else(|| panic!("FLOCK.INFO {key}: no owner: {i:?}"));
    (String::from_utf8_lossy(&o).into_owned(), i.token, i.ttl)
}

#[track_caller]
pub fn exists(con: &mut redis::Connection, key: &str) -> i64 {
    call(con, &["EXISTS", key]).int().expect("EXISTS reply")
}

#[track_caller]
pub fn dbsize(con: &mut redis::Connection) -> i64 {
    call(con, &["DBSIZE"]).int().expect("DBSIZE reply")
}

/// `WAIT 1 5000` must report the replica.
#[track_caller]
pub fn wait_replica(con: &mut redis::Connection) {
    // A read blocked in WAIT can fail with EINTR when the test process is stopped and
    // continued (signal(7): sockets with a receive timeout are not restarted). WAIT can be sent
    // again: redis-rs skips the late reply of the interrupted one.
    let mut r = call_raw(con, &["WAIT", "1", "5000"]);
    for _ in 0..3 {
        match &r {
            Err(e) if e.contains("Interrupted") => r = call_raw(con, &["WAIT", "1", "5000"]),
            _ => break,
        }
    }
    let r = r.unwrap_or_else(|e| panic!("WAIT 1 5000: {e}"));
    assert!(r.int().unwrap_or(0) >= 1, "WAIT 1 5000: {r:?}");
}

/// BGREWRITEAOF and wait until it finished.
#[track_caller]
pub fn rewrite_aof(con: &mut redis::Connection) {
    // may answer "Background append only file rewriting started" or "scheduled"
    let r = call(con, &["BGREWRITEAOF"]);
    assert!(!r.is_err(), "BGREWRITEAOF: {r:?}");
    wait_until("AOF rewrite to finish", || {
        info_field(con, "persistence", "aof_rewrite_in_progress").as_deref() == Some("0")
            && info_field(con, "persistence", "aof_rewrite_scheduled").as_deref() == Some("0")
    });
    let st = info_field(con, "persistence", "aof_last_bgrewrite_status");
    assert_eq!(st.as_deref(), Some("ok"), "aof_last_bgrewrite_status");
}

/// A counter of `INFO flock` by its name without the prefix (`flock_stat(c, "timeouts")`).
#[track_caller]
pub fn flock_stat<C: Call + ?Sized>(c: &mut C, name: &str) -> i64 {
    info_i64(c, "flock", &format!("flock_{name}"))
}
