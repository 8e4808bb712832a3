//! Argument parsing for the FLOCK commands: pure functions over byte slices.
//!
//! Every malformed call maps to one [`ArgError`], whose text is the error reply (G8).

use crate::snapshot::Snapshot;
use crate::state::MAX_OWNER_LEN;

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ArgError {
    /// Wrong number of arguments: Redis's own arity error is sent.
    Arity,
    Syntax,
    Owner,
    Ttl {
        max: u64,
    },
    Timeout,
    Token,
}

impl ArgError {
    pub fn message(&self) -> String {
        match self {
            ArgError::Arity => "ERR wrong number of arguments".to_string(),
            ArgError::Syntax => "ERR syntax error".to_string(),
            ArgError::Owner => {
                format!("ERR invalid owner: must be 1 to {MAX_OWNER_LEN} bytes")
            }
            ArgError::Ttl { max } => {
                format!("ERR invalid ttl: must be an integer from 1 to {max} (flock.max-ttl-ms)")
            }
            ArgError::Timeout => {
                "ERR invalid timeout: must be an integer of milliseconds, 0 or more".to_string()
            }
            ArgError::Token => "ERR invalid token: must be a positive integer".to_string(),
        }
    }
}

/// A decimal integer by Redis's own rules (`string2ll`, which `SET ... PX` uses): optional '-',
/// digits, no '+', no spaces, no leading zeros ("0" alone is zero, "-0" is refused), fits in
/// i64. Every integer argument and load argument of flock goes through it.
#[inline]
pub fn parse_i64(b: &[u8]) -> Option<i64> {
    let (negative, digits) = match b.strip_prefix(b"-") {
        Some(rest) => (true, rest),
        None => (false, b),
    };
    if digits.is_empty() || digits.len() > 19 {
        return None;
    }
    if digits[0] == b'0' && (digits.len() > 1 || negative) {
        return None;
    }
    // Accumulate as a negative number: i64::MIN has no positive counterpart.
    let mut v: i64 = 0;
    for &c in digits {
        if !c.is_ascii_digit() {
            return None;
        }
        v = v.checked_mul(10)?.checked_sub(i64::from(c - b'0'))?;
    }
    if negative {
        Some(v)
    } else {
        v.checked_neg()
    }
}

#[inline]
pub fn parse_owner(b: &[u8]) -> Result<&[u8], ArgError> {
    if b.is_empty() || b.len() > MAX_OWNER_LEN {
        Err(ArgError::Owner)
    } else {
        Ok(b)
    }
}

#[inline]
pub fn parse_ttl(b: &[u8], max_ttl_ms: u64) -> Result<u64, ArgError> {
    match parse_i64(b) {
        Some(v) if v >= 1 && (v as u64) <= max_ttl_ms => Ok(v as u64),
        _ => Err(ArgError::Ttl { max: max_ttl_ms }),
    }
}

#[inline]
pub fn parse_token(b: &[u8]) -> Result<u64, ArgError> {
    match parse_i64(b) {
        Some(v) if v >= 1 => Ok(v as u64),
        _ => Err(ArgError::Token),
    }
}

#[inline]
pub fn parse_timeout(b: &[u8]) -> Result<u64, ArgError> {
    match parse_i64(b) {
        Some(v) if v >= 0 => Ok(v as u64),
        _ => Err(ArgError::Timeout),
    }
}

/// `FLOCK.ACQUIRE key owner ttl [BLOCK timeout]`, argv including the command name.
#[derive(Debug, PartialEq, Eq)]
pub struct AcquireArgs<'a> {
    pub owner: &'a [u8],
    pub ttl_ms: u64,
    /// `Some(timeout_ms)` with BLOCK (0 = no limit).
    pub block: Option<u64>,
}

#[inline]
pub fn parse_acquire<'a>(argv: &[&'a [u8]], max_ttl_ms: u64) -> Result<AcquireArgs<'a>, ArgError> {
    let [_, _key, owner, ttl, rest @ ..] = argv else {
        return Err(ArgError::Arity);
    };
    let owner = parse_owner(owner)?;
    let ttl_ms = parse_ttl(ttl, max_ttl_ms)?;
    let block = match rest {
        [] => None,
        [opt, timeout] if opt.eq_ignore_ascii_case(b"BLOCK") => Some(parse_timeout(timeout)?),
        _ => return Err(ArgError::Syntax),
    };
    Ok(AcquireArgs {
        owner,
        ttl_ms,
        block,
    })
}

/// `FLOCK.RELEASE key owner [token]`: the owner, and the token that qualifies the call.
#[inline]
pub fn parse_release<'a>(argv: &[&'a [u8]]) -> Result<(&'a [u8], Option<u64>), ArgError> {
    match argv {
        [_, _key, owner] => Ok((parse_owner(owner)?, None)),
        [_, _key, owner, token] => Ok((parse_owner(owner)?, Some(parse_token(token)?))),
        _ => Err(ArgError::Arity),
    }
}

/// `FLOCK.RENEW key owner ttl [token]`: the owner, the ttl and the token that qualifies it.
#[inline]
pub fn parse_renew<'a>(
    argv: &[&'a [u8]],
    max_ttl_ms: u64,
) -> Result<(&'a [u8], u64, Option<u64>), ArgError> {
    match argv {
        [_, _key, owner, ttl] => Ok((parse_owner(owner)?, parse_ttl(ttl, max_ttl_ms)?, None)),
        [_, _key, owner, ttl, token] => Ok((
            parse_owner(owner)?,
            parse_ttl(ttl, max_ttl_ms)?,
            Some(parse_token(token)?),
        )),
        _ => Err(ArgError::Arity),
    }
}

/// `FLOCK.REVOKE key [owner]`: the owner whose grant alone is to end, if given.
#[inline]
pub fn parse_revoke<'a>(argv: &[&'a [u8]]) -> Result<Option<&'a [u8]>, ArgError> {
    match argv {
        [_, _key] => Ok(None),
        [_, _key, owner] => Ok(Some(parse_owner(owner)?)),
        _ => Err(ArgError::Arity),
    }
}

/// `FLOCK.CHECK key token`.
#[inline]
pub fn parse_check(argv: &[&[u8]]) -> Result<u64, ArgError> {
    let [_, _key, token] = argv else {
        return Err(ArgError::Arity);
    };
    parse_token(token)
}

/// `FLOCK.INFO key`.
#[inline]
pub fn parse_info(argv: &[&[u8]]) -> Result<(), ArgError> {
    match argv {
        [_, _key] => Ok(()),
        _ => Err(ArgError::Arity),
    }
}

/// The replication effects, `FLOCK.APPLY key GRANT owner token deadline_ms` (the key is held)
/// and `FLOCK.APPLY key DELAY token until_ms` (nobody holds it; lock-delay until then): the
/// [`Snapshot`] the master sent, checked by [`Snapshot::validate`] like every snapshot loaded.
pub fn parse_apply<'a>(argv: &[&'a [u8]]) -> Result<Snapshot<'a>, ArgError> {
    let snapshot = match argv {
        [_, _key, kind, owner, token, deadline] if kind.eq_ignore_ascii_case(b"GRANT") => {
            Snapshot::Held {
                owner: parse_owner(owner)?,
                token: parse_token(token)?,
                deadline_wall_ms: parse_i64(deadline).ok_or(ArgError::Syntax)?,
            }
        }
        [_, _key, kind, token, until] if kind.eq_ignore_ascii_case(b"DELAY") => Snapshot::Delayed {
            last_token: parse_token(token)?,
            until_wall_ms: parse_i64(until).ok_or(ArgError::Syntax)?,
        },
        [_, _key, _, ..] if argv.len() >= 5 => return Err(ArgError::Syntax),
        _ => return Err(ArgError::Arity),
    };
    snapshot.validate().map_err(|e| match e {
        crate::snapshot::Invalid::Owner => ArgError::Owner,
        crate::snapshot::Invalid::Token => ArgError::Token,
    })
}

/// Commands refused inside FLOCK.FENCED beyond what script mode refuses: blocking commands,
/// transactions, scripts, connection-level commands, and FLOCK commands.
const FENCED_REFUSED: &[&[u8]] = &[
    b"blpop",
    b"brpop",
    b"brpoplpush",
    b"blmove",
    b"blmpop",
    b"bzpopmin",
    b"bzpopmax",
    b"bzmpop",
    b"wait",
    b"waitaof",
    b"multi",
    b"exec",
    b"discard",
    b"watch",
    b"unwatch",
    b"eval",
    b"evalsha",
    b"eval_ro",
    b"evalsha_ro",
    b"fcall",
    b"fcall_ro",
    b"function",
    b"script",
    b"subscribe",
    b"psubscribe",
    b"ssubscribe",
    b"unsubscribe",
    b"punsubscribe",
    b"sunsubscribe",
    b"monitor",
    b"sync",
    b"psync",
    b"shutdown",
    b"debug",
    b"client",
    b"select",
    b"swapdb",
];

/// Commands that act on the whole keyspace, the lock key included: FENCED refuses them.
const FENCED_WHOLE_KEYSPACE: &[&[u8]] = &[b"flushdb", b"flushall"];

/// Why `cmd` (followed by `rest`) may not run inside FLOCK.FENCED, if it may not.
pub fn fenced_refusal(cmd: &[u8], rest: &[&[u8]]) -> Option<&'static str> {
    let lower = cmd.to_ascii_lowercase();
    if lower.starts_with(b"flock.") {
        return Some("FLOCK commands");
    }
    if FENCED_WHOLE_KEYSPACE.contains(&lower.as_slice()) {
        return Some("commands on the whole keyspace (the lock key included)");
    }
    if FENCED_REFUSED.contains(&lower.as_slice()) {
        return Some("blocking commands, transactions, scripts and connection commands");
    }
    // XREAD and XREADGROUP block only with BLOCK.
    if (lower == b"xread" || lower == b"xreadgroup")
        && rest.iter().any(|a| a.eq_ignore_ascii_case(b"BLOCK"))
    {
        return Some("blocking commands");
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    fn v(s: &[&'static str]) -> Vec<&'static [u8]> {
        s.iter().map(|a| a.as_bytes()).collect()
    }

    #[test]
    fn integers() {
        let table: &[(&str, Option<i64>)] = &[
            ("0", Some(0)),
            ("1000", Some(1000)),
            ("-5", Some(-5)),
            ("9223372036854775807", Some(i64::MAX)),
            ("9223372036854775808", None),
            ("-9223372036854775808", Some(i64::MIN)),
            ("99999999999999999999", None),
            ("", None),
            ("-", None),
            ("+5", None),
            ("05", None),
            ("01000", None),
            ("00", None),
            ("-0", None),
            ("-05", None),
            (" 5", None),
            ("5 ", None),
            ("1.5", None),
            ("1e3", None),
            ("abc", None),
        ];
        for (input, want) in table {
            assert_eq!(parse_i64(input.as_bytes()), *want, "input {input:?}");
        }
    }

    #[test]
    fn acquire_table() {
        let max = 1000;
        let ok = |owner: &'static str, ttl, block| {
            Ok(AcquireArgs {
                owner: owner.as_bytes(),
                ttl_ms: ttl,
                block,
            })
        };
        let long_owner: &'static str = Box::leak("x".repeat(257).into_boxed_str());
        let max_owner: &'static str = Box::leak("x".repeat(256).into_boxed_str());
        let table: Vec<(Vec<&'static str>, Result<AcquireArgs, ArgError>)> = vec![
            (vec!["A", "k", "o", "100"], ok("o", 100, None)),
            (vec!["A", "k", "o", "1000"], ok("o", 1000, None)),
            (vec!["A", "k", "o", "1"], ok("o", 1, None)),
            (
                vec!["A", "k", "o", "100", "BLOCK", "0"],
                ok("o", 100, Some(0)),
            ),
            (
                vec!["A", "k", "o", "100", "block", "50"],
                ok("o", 100, Some(50)),
            ),
            (vec!["A", "k", max_owner, "1"], ok(max_owner, 1, None)),
            (vec!["A", "k", "o"], Err(ArgError::Arity)),
            (vec!["A"], Err(ArgError::Arity)),
            (vec![], Err(ArgError::Arity)),
            (vec!["A", "k", "o", "0"], Err(ArgError::Ttl { max })),
            (vec!["A", "k", "o", "1001"], Err(ArgError::Ttl { max })),
            (vec!["A", "k", "o", "-1"], Err(ArgError::Ttl { max })),
            (vec!["A", "k", "o", "ten"], Err(ArgError::Ttl { max })),
            (vec!["A", "k", "", "100"], Err(ArgError::Owner)),
            (vec!["A", "k", long_owner, "100"], Err(ArgError::Owner)),
            (vec!["A", "k", "o", "100", "FOO"], Err(ArgError::Syntax)),
            (vec!["A", "k", "o", "100", "BLOCK"], Err(ArgError::Syntax)),
            (
                vec!["A", "k", "o", "100", "BLOCK", "1", "x"],
                Err(ArgError::Syntax),
            ),
            (
                vec!["A", "k", "o", "100", "BLOCK", "-1"],
                Err(ArgError::Timeout),
            ),
            (
                vec!["A", "k", "o", "100", "BLOCK", "x"],
                Err(ArgError::Timeout),
            ),
        ];
        for (argv, want) in table {
            assert_eq!(parse_acquire(&v(&argv), max), want, "argv {argv:?}");
        }
    }

    #[test]
    fn other_commands_table() {
        assert_eq!(parse_release(&v(&["R", "k", "o"])), Ok((&b"o"[..], None)));
        assert_eq!(
            parse_release(&v(&["R", "k", "o", "7"])),
            Ok((&b"o"[..], Some(7)))
        );
        assert_eq!(
            parse_release(&v(&["R", "k", "o", "0"])),
            Err(ArgError::Token)
        );
        assert_eq!(
            parse_release(&v(&["R", "k", "o", "x"])),
            Err(ArgError::Token)
        );
        assert_eq!(
            parse_release(&v(&["R", "k", "o", "7", "8"])),
            Err(ArgError::Arity)
        );
        assert_eq!(parse_release(&v(&["R", "k"])), Err(ArgError::Arity));
        assert_eq!(parse_release(&v(&["R", "k", ""])), Err(ArgError::Owner));
        assert_eq!(parse_revoke(&v(&["V", "k"])), Ok(None));
        assert_eq!(parse_revoke(&v(&["V", "k", "o"])), Ok(Some(&b"o"[..])));
        assert_eq!(parse_revoke(&v(&["V", "k", ""])), Err(ArgError::Owner));
        assert_eq!(
            parse_revoke(&v(&["V", "k", "o", "p"])),
            Err(ArgError::Arity)
        );
        assert_eq!(
            parse_renew(&v(&["N", "k", "o", "5", "9"]), 10),
            Ok((&b"o"[..], 5, Some(9)))
        );
        assert_eq!(
            parse_renew(&v(&["N", "k", "o", "5", "-1"]), 10),
            Err(ArgError::Token)
        );
        assert_eq!(
            parse_renew(&v(&["N", "k", "o", "5"]), 10),
            Ok((&b"o"[..], 5, None))
        );
        assert_eq!(
            parse_renew(&v(&["N", "k", "o", "11"]), 10),
            Err(ArgError::Ttl { max: 10 })
        );
        assert_eq!(parse_renew(&v(&["N", "k", "o"]), 10), Err(ArgError::Arity));
        assert_eq!(parse_check(&v(&["C", "k", "7"])), Ok(7));
        for bad in ["0", "-1", "abc", "1.5", ""] {
            assert_eq!(
                parse_check(&v(&["C", "k", bad])),
                Err(ArgError::Token),
                "{bad}"
            );
        }
        assert_eq!(parse_check(&v(&["C", "k"])), Err(ArgError::Arity));
        assert_eq!(parse_info(&v(&["I", "k"])), Ok(()));
        assert_eq!(parse_info(&v(&["I", "k", "x"])), Err(ArgError::Arity));
    }

    #[test]
    fn fenced_refusals() {
        let refused: &[(&str, &[&str])] = &[
            ("BLPOP", &["l", "0"]),
            ("multi", &[]),
            ("EVAL", &["return 1", "0"]),
            ("FCALL", &["f", "0"]),
            ("flock.acquire", &["k", "o", "1"]),
            ("FLOCK.FENCED", &["k", "1", "SET", "a", "b"]),
            ("XREAD", &["BLOCK", "0", "STREAMS", "s", "$"]),
            (
                "xreadgroup",
                &["GROUP", "g", "c", "block", "0", "STREAMS", "s", ">"],
            ),
            ("subscribe", &["ch"]),
            ("WATCH", &["k"]),
        ];
        for (cmd, rest) in refused {
            let rest: Vec<&[u8]> = rest.iter().map(|a| a.as_bytes()).collect();
            assert!(
                fenced_refusal(cmd.as_bytes(), &rest).is_some(),
                "{cmd} must be refused"
            );
        }
        let allowed: &[(&str, &[&str])] = &[
            ("SET", &["k", "v"]),
            ("hset", &["h", "f", "v"]),
            ("XREAD", &["STREAMS", "s", "0"]),
            ("INCR", &["n"]),
            ("DEL", &["k"]),
        ];
        for (cmd, rest) in allowed {
            let rest: Vec<&[u8]> = rest.iter().map(|a| a.as_bytes()).collect();
            assert_eq!(
                fenced_refusal(cmd.as_bytes(), &rest),
                None,
                "{cmd} must run"
            );
        }
    }

    #[test]
    fn apply_table() {
        assert_eq!(
            parse_apply(&v(&["P", "k", "GRANT", "o", "9", "1700000000000"])),
            Ok(Snapshot::Held {
                owner: b"o",
                token: 9,
                deadline_wall_ms: 1_700_000_000_000
            })
        );
        assert_eq!(
            parse_apply(&v(&["P", "k", "DELAY", "9", "1700000000000"])),
            Ok(Snapshot::Delayed {
                last_token: 9,
                until_wall_ms: 1_700_000_000_000
            })
        );
        assert_eq!(
            parse_apply(&v(&["P", "k", "X", "o", "9", "1"])),
            Err(ArgError::Syntax)
        );
        assert_eq!(
            parse_apply(&v(&["P", "k", "GRANT", "o", "0", "1"])),
            Err(ArgError::Token)
        );
        assert_eq!(
            parse_apply(&v(&["P", "k", "GRANT", "o", "9007199254740992", "1"])),
            Err(ArgError::Token)
        );
        assert_eq!(
            parse_apply(&v(&["P", "k", "GRANT", "o", "9"])),
            Err(ArgError::Syntax)
        );
        assert_eq!(parse_apply(&v(&["P", "k", "GRANT"])), Err(ArgError::Arity));
    }
}
