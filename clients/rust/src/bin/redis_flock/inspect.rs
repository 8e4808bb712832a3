//! The inspection subcommands: `info`, `holders`, `waiters`, `watch` and `stats`, each a raw
//! command printed as tab-separated lines (one record a line, `-` for nil), for scripts and
//! for reading.

use std::collections::BTreeMap;
use std::io::Write;

use flock_client::redis::{self, RedisError, Value};
use flock_client::Target;

use crate::conn::{redis_status, Conn};

/// An error of an inspection command: what to print and the status to exit with.
pub struct Failed(pub String, pub i32);

impl From<RedisError> for Failed {
    fn from(e: RedisError) -> Self {
        let status = redis_status(&e);
        Failed(e.to_string(), status)
    }
}

/// A closed stdout (`| head -1`) ends the command quietly, as for other Unix tools.
impl From<std::io::Error> for Failed {
    fn from(_: std::io::Error) -> Self {
        Failed(String::new(), 0)
    }
}

/// A reply value as one field of a line: text as it is, integers in decimal, nil as `-`,
/// an array as its items joined by `,`.
fn text(v: &Value) -> String {
    match v {
        Value::Nil => "-".to_string(),
        Value::Int(i) => i.to_string(),
        Value::BulkString(b) => String::from_utf8_lossy(b).into_owned(),
        Value::SimpleString(s) => s.clone(),
        Value::Okay => "OK".to_string(),
        Value::Double(d) => d.to_string(),
        Value::Boolean(b) => b.to_string(),
        Value::VerbatimString { text, .. } => text.clone(),
        Value::Array(items) | Value::Set(items) => {
            items.iter().map(text).collect::<Vec<_>>().join(",")
        }
        other => format!("{other:?}"),
    }
}

/// The pairs of a map reply: a RESP3 map, or RESP2's flat array of names and values.
fn pairs(v: &Value) -> Option<Vec<(String, &Value)>> {
    match v {
        Value::Map(m) => Some(m.iter().map(|(k, v)| (text(k), v)).collect()),
        Value::Array(items) if items.len() % 2 == 0 => {
            let mut out = Vec::with_capacity(items.len() / 2);
            for kv in items.chunks_exact(2) {
                match &kv[0] {
                    Value::BulkString(_) | Value::SimpleString(_) => {
                        out.push((text(&kv[0]), &kv[1]))
                    }
                    _ => return None,
                }
            }
            Some(out)
        }
        _ => None,
    }
}

async fn query(target: &Target, cmd: &redis::Cmd) -> Result<Value, Failed> {
    let mut c = Conn::open(target).await?;
    Ok(c.query::<Value>(cmd).await?)
}

/// `info KEY`: FLOCK.INFO as `field<TAB>value` lines; nothing when the server knows nothing
/// of the key.
pub async fn info(target: &Target, key: &str) -> Result<(), Failed> {
    let mut cmd = redis::cmd("FLOCK.INFO");
    cmd.arg(key);
    let v = query(target, &cmd).await?;
    let mut out = std::io::stdout().lock();
    if let Some(fields) = pairs(&v) {
        for (name, value) in fields {
            writeln!(out, "{name}\t{}", text(value))?;
        }
    }
    Ok(())
}

/// `holders KEY` and `waiters KEY`: one triple a line (`owner token ttl_ms`, `owner mode
/// waited_ms`), in the server's order.
pub async fn triples(target: &Target, command: &str, key: &str) -> Result<(), Failed> {
    let mut cmd = redis::cmd(command);
    cmd.arg(key);
    let v = query(target, &cmd).await?;
    let mut out = std::io::stdout().lock();
    if let Value::Array(rows) = v {
        for row in rows {
            match row {
                Value::Array(fields) => {
                    let line: Vec<String> = fields.iter().map(text).collect();
                    writeln!(out, "{}", line.join("\t"))?;
                }
                other => writeln!(out, "{}", text(&other))?,
            }
        }
    }
    Ok(())
}

/// `stats [CLASS ...]`: FLOCK.STATS GET as `class<TAB>figure<TAB>value` lines (nested
/// figures as `hold_ms.p50`), then `(overflow)<TAB>grants<TAB>n`.
pub async fn stats(target: &Target, classes: &[String]) -> Result<(), Failed> {
    let mut cmd = redis::cmd("FLOCK.STATS");
    cmd.arg("GET");
    for c in classes {
        cmd.arg(c);
    }
    let v = query(target, &cmd).await?;
    let top = pairs(&v).unwrap_or_default();
    let mut out = std::io::stdout().lock();
    let mut overflow = None;
    for (name, value) in top {
        match name.as_str() {
            "classes" => {
                for (class, figures) in pairs(value).unwrap_or_default() {
                    for (figure, fv) in pairs(figures).unwrap_or_default() {
                        match pairs(fv) {
                            Some(nested) if !matches!(fv, Value::Nil) => {
                                for (sub, sv) in nested {
                                    writeln!(out, "{class}\t{figure}.{sub}\t{}", text(sv))?;
                                }
                            }
                            _ => writeln!(out, "{class}\t{figure}\t{}", text(fv))?,
                        }
                    }
                }
            }
            "overflow" => overflow = Some(text(value)),
            _ => {}
        }
    }
    if let Some(n) = overflow {
        writeln!(out, "(overflow)\tgrants\t{n}")?;
    }
    Ok(())
}

/// One watched grant: its owner, as HOLDERS or a `held` event named it.
type Known = BTreeMap<u64, String>;

/// `watch KEY`: one line per change, `event<TAB>owner<TAB>token`, until interrupted: `held`
/// for each holder seen (those at the start first), then how each grant ended (`released`,
/// `expired`, `revoked`, `closed`, `lost`; `gone` when it ended between two watches). Driven
/// by FLOCK.WATCH: nothing is polled. A holder that joins a shared or counted key while
/// another is watched is reported when the next watched grant ends.
pub async fn watch(target: &Target, key: &str) -> Result<(), Failed> {
    let mut conn = Conn::open(target).await?;
    let mut known = Known::new();
    let mut out = std::io::stdout().lock();
    holders_into(&mut conn, key, &mut known, &mut out).await?;
    loop {
        let mut cmd = redis::cmd("FLOCK.WATCH");
        cmd.arg(0);
        if known.is_empty() {
            cmd.arg(key).arg(0);
        } else {
            // FLOCK.WATCH takes at most 64 pairs: the oldest 64 grants.
            for token in known.keys().take(64) {
                cmd.arg(key).arg(*token);
            }
        }
        let reply = conn.query::<Value>(&cmd).await?;
        let Value::Array(items) = reply else {
            continue; // unblocked without an event: watch again
        };
        let field = |i: usize| items.get(i).map(text).unwrap_or_else(|| "-".to_string());
        let event = field(1);
        let token: u64 = field(3).parse().unwrap_or(0);
        let mut owner = field(2);
        if event == "held" {
            if known.insert(token, owner.clone()).is_none() {
                writeln!(out, "held\t{owner}\t{token}")?;
            }
        } else {
            if let Some(o) = known.remove(&token) {
                if owner == "-" {
                    owner = o;
                }
            }
            writeln!(out, "{event}\t{owner}\t{token}")?;
        }
        out.flush()?;
        // Who holds it now (a waiter granted at the release, another reader that joined).
        holders_into(&mut conn, key, &mut known, &mut out).await?;
    }
}

/// Adds the key's current holders to `known`, printing `held` for each new one.
async fn holders_into(
    conn: &mut Conn,
    key: &str,
    known: &mut Known,
    out: &mut impl Write,
) -> Result<(), Failed> {
    let mut cmd = redis::cmd("FLOCK.HOLDERS");
    cmd.arg(key);
    if let Value::Array(rows) = conn.query::<Value>(&cmd).await? {
        for row in rows {
            if let Value::Array(f) = row {
                let owner = f.first().map(text).unwrap_or_else(|| "-".to_string());
                let token: u64 = f.get(1).map(text).and_then(|t| t.parse().ok()).unwrap_or(0);
                if token != 0 && !known.contains_key(&token) {
                    writeln!(out, "held\t{owner}\t{token}")?;
                    known.insert(token, owner);
                }
            }
        }
    }
    out.flush()?;
    Ok(())
}
