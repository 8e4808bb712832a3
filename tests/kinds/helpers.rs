//! The helpers every kinds test uses: ACQUIRE and its expected answers, waiters in threads,
//! FLOCK.INFO and FLOCK.HOLDERS parsed, state snapshots compared.

use flock_testkit::*;
use std::thread::{self, JoinHandle};

/// `FLOCK.ACQUIRE key owner ttl opts...`, the raw reply.
pub(crate) fn acq(
    c: &mut redis::Connection,
    key: &str,
    owner: &str,
    ttl: i64,
    opts: &[&str],
) -> Reply {
    let ttl = ttl.to_string();
    let mut args = vec!["FLOCK.ACQUIRE", key, owner, ttl.as_str()];
    args.extend_from_slice(opts);
    call(c, &args)
}

/// A token in (0, 2^53), or a panic naming `what`.
#[track_caller]
pub(crate) fn tok(r: &Reply, what: &str) -> i64 {
    match r {
        Reply::Int(t) if *t > 0 && *t < TWO_POW_53 => *t,
        other => panic!("{what}: expected a token, got {other:?}"),
    }
}

/// ACQUIRE that must be granted.
#[track_caller]
pub(crate) fn grant_kind(
    c: &mut redis::Connection,
    key: &str,
    owner: &str,
    ttl: i64,
    opts: &[&str],
) -> i64 {
    let r = acq(c, key, owner, ttl, opts);
    tok(&r, &format!("ACQUIRE {key} {owner} {ttl} {opts:?}"))
}

/// ACQUIRE that must answer nil.
#[track_caller]
pub(crate) fn refused(c: &mut redis::Connection, key: &str, owner: &str, opts: &[&str], why: &str) {
    let r = acq(c, key, owner, 10_000, opts);
    assert!(
        r.is_nil(),
        "ACQUIRE {key} {owner} {opts:?}: expected nil ({why}), got {r:?}"
    );
}

/// ACQUIRE that must fail with exactly `text`.
#[track_caller]
pub(crate) fn refused_with(
    c: &mut redis::Connection,
    key: &str,
    owner: &str,
    opts: &[&str],
    text: &str,
) {
    let r = acq(c, key, owner, 10_000, opts);
    assert_eq!(
        r,
        Reply::Err(text.to_string()),
        "ACQUIRE {key} {owner} {opts:?}"
    );
}

/// An ACQUIRE on its own connection in a thread (opts should hold BLOCK); a closed
/// connection is `Reply::Other`.
pub(crate) fn spawn_acq(
    srv: &Server,
    key: &str,
    owner: &str,
    ttl: i64,
    opts: &[&str],
) -> JoinHandle<Reply> {
    let mut con = srv.conn();
    let (key, owner) = (key.to_string(), owner.to_string());
    let opts: Vec<String> = opts.iter().map(|s| s.to_string()).collect();
    thread::spawn(move || {
        let ttl = ttl.to_string();
        let mut args = vec!["FLOCK.ACQUIRE", key.as_str(), owner.as_str(), ttl.as_str()];
        args.extend(opts.iter().map(String::as_str));
        // A connection the test kills on purpose answers `Other`, not a panic.
        call_raw(&mut con, &args).unwrap_or_else(Reply::Other)
    })
}

#[track_caller]
pub(crate) fn join(h: JoinHandle<Reply>, what: &str) -> Reply {
    h.join()
        .unwrap_or_else(|_| panic!("{what}: waiter thread panicked"))
}

/// FLOCK.INFO with the kinds' fields.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct K {
    pub(crate) owner: Option<String>,
    pub(crate) token: i64,
    pub(crate) ttl: i64,
    pub(crate) waiters: i64,
    pub(crate) mode: String,
    pub(crate) holders: i64,
    pub(crate) limit: i64,
    pub(crate) delayed: i64,
}

#[track_caller]
pub(crate) fn parse_k(r: &Reply, what: &str) -> Option<K> {
    let i = parse_info(r, what)?;
    let field = |name: &str| -> Reply {
        i.fields
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.clone())
            .unwrap_or_else(|| panic!("{what}: FLOCK.INFO has no {name}: {r:?}"))
    };
    let int = |name: &str| -> i64 {
        field(name)
            .int()
            .unwrap_or_else(|| panic!("{what}: {name} is not an integer: {r:?}"))
    };
    Some(K {
        owner: i.owner.map(|o| String::from_utf8_lossy(&o).into_owned()),
        token: i.token,
        ttl: i.ttl,
        waiters: i.waiters,
        mode: field("mode")
            .string()
            .unwrap_or_else(|| panic!("{what}: mode is not a string: {r:?}")),
        holders: int("holders"),
        limit: int("limit"),
        delayed: int("delayed"),
    })
}

#[track_caller]
pub(crate) fn kinfo(c: &mut redis::Connection, key: &str) -> K {
    let r = call(c, &["FLOCK.INFO", key]);
    parse_k(&r, &format!("FLOCK.INFO {key}"))
        .unwrap_or_else(|| panic!("FLOCK.INFO {key}: nil, expected a lock"))
}

/// (mode, holders, limit, delayed, waiters) of a key that must exist.
#[track_caller]
pub(crate) fn shape(c: &mut redis::Connection, key: &str) -> (String, i64, i64, i64, i64) {
    let k = kinfo(c, key);
    (k.mode, k.holders, k.limit, k.delayed, k.waiters)
}

pub(crate) fn sh(
    mode: &str,
    holders: i64,
    limit: i64,
    delayed: i64,
    waiters: i64,
) -> (String, i64, i64, i64, i64) {
    (mode.to_string(), holders, limit, delayed, waiters)
}

/// FLOCK.HOLDERS as (owner, token, ttl) triples; panics on any other shape.
#[track_caller]
pub(crate) fn parse_holders(r: &Reply, what: &str) -> Vec<(String, i64, i64)> {
    let a = r
        .array()
        .unwrap_or_else(|| panic!("{what}: HOLDERS is not an array: {r:?}"));
    a.iter()
        .map(|t| match t.array() {
            Some([o, Reply::Int(tk), Reply::Int(ttl)]) => {
                let o = o
                    .string()
                    .unwrap_or_else(|| panic!("{what}: owner not a string: {r:?}"));
                (o, *tk, *ttl)
            }
            _ => panic!("{what}: HOLDERS entry is not [owner, token, ttl]: {t:?}"),
        })
        .collect()
}

#[track_caller]
pub(crate) fn holders(c: &mut redis::Connection, key: &str) -> Vec<(String, i64, i64)> {
    let r = call(c, &["FLOCK.HOLDERS", key]);
    parse_holders(&r, &format!("FLOCK.HOLDERS {key}"))
}

/// HOLDERS as (owner, token) pairs.
#[track_caller]
pub(crate) fn holder_tokens(c: &mut redis::Connection, key: &str) -> Vec<(String, i64)> {
    holders(c, key)
        .into_iter()
        .map(|(o, t, _)| (o, t))
        .collect()
}

/// Expected (owner, token) pairs.
pub(crate) fn hv(v: &[(&str, i64)]) -> Vec<(String, i64)> {
    v.iter().map(|(o, t)| (o.to_string(), *t)).collect()
}

#[track_caller]
pub(crate) fn owners(c: &mut redis::Connection, key: &str) -> Vec<String> {
    holders(c, key).into_iter().map(|(o, _, _)| o).collect()
}

#[track_caller]
pub(crate) fn rel(c: &mut redis::Connection, key: &str, owner: &str) {
    assert_eq!(release(c, key, owner), 1, "RELEASE {key} {owner}");
}

#[track_caller]
pub(crate) fn revoke(c: &mut redis::Connection, args: &[&str]) -> i64 {
    let mut a = vec!["FLOCK.REVOKE"];
    a.extend_from_slice(args);
    call(c, &a)
        .int()
        .unwrap_or_else(|| panic!("FLOCK.REVOKE {args:?}: not an integer"))
}

/// A key's state that copies must reproduce: INFO without `ttl` and `waiters` (waiters are
/// connections of one server) and HOLDERS' owners and tokens; plus the leases, compared with
/// a tolerance by `assert_same_state`.
#[derive(Debug, PartialEq)]
pub(crate) struct Snap {
    pub(crate) info: Option<(Option<String>, i64, String, i64, i64, i64)>,
    pub(crate) grants: Vec<(String, i64)>,
}

pub(crate) fn snap(c: &mut redis::Connection, key: &str) -> (Snap, Vec<i64>) {
    let r = call(c, &["FLOCK.INFO", key]);
    let k = parse_k(&r, key);
    let h = holders(c, key);
    (
        Snap {
            info: k.map(|k| (k.owner, k.token, k.mode, k.holders, k.limit, k.delayed)),
            grants: h.iter().map(|(o, t, _)| (o.clone(), *t)).collect(),
        },
        h.iter().map(|(_, _, ttl)| *ttl).collect(),
    )
}

/// Same INFO (but leases and waiters), same holders and tokens, leases within 1 s.
#[track_caller]
pub(crate) fn assert_same_state(a: &(Snap, Vec<i64>), b: &(Snap, Vec<i64>), what: &str) {
    assert_eq!(a.0, b.0, "{what}: state differs");
    for (x, y) in a.1.iter().zip(&b.1) {
        assert!(
            (x - y).abs() < 1000,
            "{what}: leases {:?} vs {:?}",
            a.1,
            b.1
        );
    }
}

pub(crate) fn set_config(c: &mut redis::Connection, name: &str, value: &str) {
    let r = call(c, &["CONFIG", "SET", name, value]);
    assert_eq!(r, Reply::Status("OK".into()), "CONFIG SET {name} {value}");
}
