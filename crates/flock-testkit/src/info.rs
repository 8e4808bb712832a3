//! `INFO` parsing, in one place: fields of a section, numbers, `commandstats`. Works over
//! either client through [`Call`].

use crate::raw::RawConn;
use crate::reply::{call_raw, Reply};
use std::collections::BTreeMap;

/// A connection that can run one command: redis-rs's or the raw one. Connection errors are
/// `Err` (INFO helpers treat them as "no such field").
pub trait Call {
    fn call_args(&mut self, args: &[&str]) -> Result<Reply, String>;
}

impl Call for redis::Connection {
    fn call_args(&mut self, args: &[&str]) -> Result<Reply, String> {
        call_raw(self, args)
    }
}

impl Call for RawConn {
    fn call_args(&mut self, args: &[&str]) -> Result<Reply, String> {
        self.call(args).map_err(|e| e.to_string())
    }
}

/// The value of `field` in the text of an INFO reply (`field:value` lines).
pub fn info_text_field(text: &str, field: &str) -> Option<String> {
    text.lines().find_map(|l| {
        let (k, v) = l.split_once(':')?;
        (k == field).then(|| v.trim().to_string())
    })
}

/// The text of `INFO <section>` (empty when the call failed).
pub fn info_text<C: Call + ?Sized>(c: &mut C, section: &str) -> String {
    c.call_args(&["INFO", section])
        .ok()
        .and_then(|r| r.string())
        .unwrap_or_default()
}

/// A field of `INFO <section>` (e.g. `info_field(c, "replication", "master_link_status")`).
pub fn info_field<C: Call + ?Sized>(c: &mut C, section: &str, field: &str) -> Option<String> {
    let r = c.call_args(&["INFO", section]).ok()?;
    info_text_field(&r.string()?, field)
}

/// An integer field of `INFO <section>` that must be there.
#[track_caller]
pub fn info_i64<C: Call + ?Sized>(c: &mut C, section: &str, field: &str) -> i64 {
    info_field(c, section, field)
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("INFO {section} has no integer {field}"))
}

/// A numeric field of `INFO <section>`, NaN when it is missing (a benchmark table shows the
/// gap instead of stopping).
pub fn info_f64<C: Call + ?Sized>(c: &mut C, section: &str, field: &str) -> f64 {
    info_field(c, section, field)
        .and_then(|v| v.parse().ok())
        .unwrap_or(f64::NAN)
}

/// Calls and microseconds of one command in `INFO commandstats`.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct CommandStat {
    pub calls: f64,
    pub usec: f64,
}

/// `INFO commandstats` text: command name (lower case, e.g. `flock.acquire`) -> its stat.
pub fn parse_commandstats(text: &str) -> BTreeMap<String, CommandStat> {
    let mut m = BTreeMap::new();
    for line in text.lines() {
        let Some(rest) = line.strip_prefix("cmdstat_") else {
            continue;
        };
        let Some((name, fields)) = rest.split_once(':') else {
            continue;
        };
        let mut st = CommandStat::default();
        for f in fields.split(',') {
            if let Some(v) = f.strip_prefix("calls=") {
                st.calls = v.parse().unwrap_or(0.0);
            } else if let Some(v) = f.strip_prefix("usec=") {
                st.usec = v.parse().unwrap_or(0.0);
            }
        }
        m.insert(name.to_string(), st);
    }
    m
}
