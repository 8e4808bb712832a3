//! Inspection without a lease (docs/CLIENTS.md, "The API every client offers"): the replies of
//! `FLOCK.INFO`, `FLOCK.HOLDERS`, `FLOCK.WAITERS` and `FLOCK.STATS GET` as Rust values, the
//! same whether the connection speaks RESP2 (flat arrays of pairs) or RESP3 (maps). No I/O.

use std::collections::BTreeMap;
use std::time::Duration;

use redis::Value;

use crate::error::{Error, Result};

/// `FLOCK.INFO key`: a key's state.
#[derive(Clone, Debug, PartialEq, Eq, Default)]
#[non_exhaustive]
pub struct Info {
    /// The oldest live grant's owner; `None` while nobody holds the key (a key with waiters or
    /// in lock-delay only), and for a shared key, whose holders `holders()` lists.
    pub owner: Option<String>,
    /// The oldest live grant's token (`None` while nobody holds the key).
    pub token: Option<u64>,
    /// Milliseconds left of the oldest live grant (`None` while nobody holds the key).
    pub ttl: Option<u64>,
    /// Requests waiting in the key's queue.
    pub waiters: u64,
    /// `exclusive`, `shared` or `limit`, as the server names the key's mode.
    pub mode: String,
    /// Live grants.
    pub holders: u64,
    /// The key's `LIMIT n` (0 when it has none).
    pub limit: u64,
    /// Milliseconds of lock-delay left (0 when none).
    pub delayed: u64,
}

/// One live grant of a key (`FLOCK.HOLDERS`), oldest first.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Holder {
    pub owner: String,
    pub token: u64,
    /// What is left of the grant on the server.
    pub ttl: Duration,
}

/// One waiting request (`FLOCK.WAITERS`), first in line first.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Waiter {
    pub owner: String,
    /// `exclusive`, `shared` or `permit`.
    pub mode: String,
    /// How long it has waited so far.
    pub waited: Duration,
}

/// `FLOCK.STATS GET [class ...]`: per class of keys, its figures, and how many classes did
/// not fit the server's table (`overflow`).
#[derive(Clone, Debug, PartialEq, Eq, Default)]
#[non_exhaustive]
pub struct Stats {
    /// Class name -> figure name -> value. Nested figures are flattened with a dot
    /// (`hold_ms.p50`); a figure with no value yet (a percentile of nothing) is `None`.
    pub classes: BTreeMap<String, BTreeMap<String, Option<i64>>>,
    pub overflow: i64,
}

fn bad(what: &str, v: &Value) -> Error {
    Error::Redis(redis::RedisError::from((
        redis::ErrorKind::UnexpectedReturnType,
        "unexpected reply",
        format!("{what}: {v:?}"),
    )))
}

fn text(v: &Value) -> Option<String> {
    match v {
        Value::BulkString(b) => Some(String::from_utf8_lossy(b).into_owned()),
        Value::SimpleString(s) => Some(s.clone()),
        Value::VerbatimString { text, .. } => Some(text.clone()),
        Value::Okay => Some("OK".to_string()),
        _ => None,
    }
}

fn int(v: &Value) -> Option<i64> {
    match v {
        Value::Int(n) => Some(*n),
        other => text(other).and_then(|t| t.parse().ok()),
    }
}

fn uint(v: &Value) -> Option<u64> {
    int(v).and_then(|n| u64::try_from(n).ok())
}

/// A map reply (RESP3) or a flat array of pairs (RESP2) as (name, value) pairs.
fn pairs(v: &Value) -> Option<Vec<(String, &Value)>> {
    match v {
        Value::Map(m) => m.iter().map(|(k, v)| Some((text(k)?, v))).collect(),
        Value::Array(a) if a.len() % 2 == 0 => a
            .chunks(2)
            .map(|p| match p {
                [k, v] => Some((text(k)?, v)),
                _ => None,
            })
            .collect(),
        _ => None,
    }
}

pub(crate) fn info(v: &Value) -> Result<Option<Info>> {
    if matches!(v, Value::Nil) {
        return Ok(None);
    }
    let fields = pairs(v).ok_or_else(|| bad("FLOCK.INFO", v))?;
    let mut out = Info::default();
    for (name, val) in fields {
        match name.as_str() {
            "owner" => out.owner = text(val).filter(|s| !s.is_empty()),
            "token" => out.token = uint(val).filter(|t| *t > 0),
            "ttl" => out.ttl = uint(val),
            "waiters" => out.waiters = uint(val).unwrap_or(0),
            "mode" => out.mode = text(val).unwrap_or_default(),
            "holders" => out.holders = uint(val).unwrap_or(0),
            "limit" => out.limit = uint(val).unwrap_or(0),
            "delayed" => out.delayed = uint(val).unwrap_or(0),
            _ => {}
        }
    }
    if out.holders == 0 {
        out.token = None;
        out.ttl = None;
    }
    Ok(Some(out))
}

/// The records of HOLDERS and WAITERS: arrays of `[text, x, int]`.
fn triples<'a>(what: &str, v: &'a Value) -> Result<Vec<(String, &'a Value, i64)>> {
    let items = match v {
        Value::Nil => return Ok(Vec::new()),
        Value::Array(a) | Value::Set(a) => a,
        other => return Err(bad(what, other)),
    };
    items
        .iter()
        .map(|item| match item {
            Value::Array(t) => match t.as_slice() {
                [a, b, c] => Ok((text(a).ok_or_else(|| bad(what, item))?, b, {
                    int(c).ok_or_else(|| bad(what, item))?
                })),
                _ => Err(bad(what, item)),
            },
            other => Err(bad(what, other)),
        })
        .collect()
}

fn ms(n: i64) -> Duration {
    Duration::from_millis(u64::try_from(n).unwrap_or(0))
}

pub(crate) fn holders(v: &Value) -> Result<Vec<Holder>> {
    triples("FLOCK.HOLDERS", v)?
        .into_iter()
        .map(|(owner, token, ttl)| {
            Ok(Holder {
                owner,
                token: uint(token).ok_or_else(|| bad("FLOCK.HOLDERS", token))?,
                ttl: ms(ttl),
            })
        })
        .collect()
}

pub(crate) fn waiters(v: &Value) -> Result<Vec<Waiter>> {
    triples("FLOCK.WAITERS", v)?
        .into_iter()
        .map(|(owner, mode, waited)| {
            Ok(Waiter {
                owner,
                mode: text(mode).ok_or_else(|| bad("FLOCK.WAITERS", mode))?,
                waited: ms(waited),
            })
        })
        .collect()
}

fn flatten(prefix: &str, v: &Value, out: &mut BTreeMap<String, Option<i64>>) {
    match pairs(v) {
        Some(ps) if !matches!(v, Value::Nil) && !ps.is_empty() => {
            for (k, val) in ps {
                let name = if prefix.is_empty() {
                    k
                } else {
                    format!("{prefix}.{k}")
                };
                flatten(&name, val, out);
            }
        }
        _ => {
            out.insert(prefix.to_string(), int(v));
        }
    }
}

pub(crate) fn stats(v: &Value) -> Result<Stats> {
    let fields = pairs(v).ok_or_else(|| bad("FLOCK.STATS GET", v))?;
    let mut out = Stats::default();
    for (name, val) in fields {
        match name.as_str() {
            "classes" => {
                // An empty table is an empty array in RESP2 and an empty map in RESP3.
                for (class, figures) in pairs(val).unwrap_or_default() {
                    let mut f = BTreeMap::new();
                    flatten("", figures, &mut f);
                    out.classes.insert(class, f);
                }
            }
            "overflow" => out.overflow = int(val).unwrap_or(0),
            _ => {}
        }
    }
    Ok(out)
}
