//! Argument parsing for the FLOCK commands: pure functions over byte slices.
//!
//! Every malformed call maps to one [`ArgError`], whose text is the error reply (G8).

use crate::errors::{ErrorReply, Fixed, Formatted};
use crate::snapshot::{mode_from_code, GrantImage, Invalid, LockImage};
use crate::state::{Mode, MAX_OWNER_LEN};
use std::ffi::CStr;

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
    /// LIMIT out of 1..=`flock.max-holders`.
    Limit {
        max: u32,
    },
    /// BOUND from something that is not a client connection.
    BoundNeedsClient,
    /// FLOCK.MACQUIRE's numkeys out of 1..=[`crate::multi::MAX_KEYS`].
    NumKeys,
}

impl ArgError {
    /// The error reply, from the one table ([`crate::errors`]).
    pub fn reply(&self) -> ErrorReply<'static> {
        match *self {
            ArgError::Arity => ErrorReply::Fixed(Fixed::Arity),
            ArgError::Syntax => ErrorReply::Fixed(Fixed::Syntax),
            ArgError::Owner => ErrorReply::Fixed(Fixed::Owner),
            ArgError::Ttl { max } => ErrorReply::Formatted(Formatted::Ttl { max }),
            ArgError::Timeout => ErrorReply::Fixed(Fixed::Timeout),
            ArgError::Token => ErrorReply::Fixed(Fixed::Token),
            ArgError::Limit { max } => ErrorReply::Formatted(Formatted::Limit { max }),
            ArgError::BoundNeedsClient => ErrorReply::Fixed(Fixed::BoundNeedsClient),
            ArgError::NumKeys => ErrorReply::Fixed(Fixed::NumKeys),
        }
    }

    /// The fixed text of this error, if it has one: the glue replies with it without
    /// allocating (`ffi::reply_error_static`), and with [`ArgError::message`] otherwise.
    /// `Arity` has one too, but the glue sends Redis's own arity error for it.
    pub fn static_text(&self) -> Option<&'static CStr> {
        self.reply().static_text()
    }

    /// The error text.
    pub fn message(&self) -> String {
        self.reply().message()
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

/// `FLOCK.ACQUIRE key owner ttl [SHARED | LIMIT n] [BOUND] [BLOCK timeout]`.
#[derive(Debug, PartialEq, Eq)]
pub struct AcquireArgs<'a> {
    pub owner: &'a [u8],
    pub ttl_ms: u64,
    /// The kind of grant asked for.
    pub mode: Mode,
    /// BOUND: the grant lives only while this connection does.
    pub bound: bool,
    /// `Some(timeout_ms)` with BLOCK (0 = no limit).
    pub block: Option<u64>,
}

/// ACQUIRE's arguments, argv including the command name. Options come in any order, each at
/// most once; SHARED with LIMIT, a repeated or unknown option is a syntax error. Checks come
/// in this order: arity, owner, ttl, syntax, then the values of LIMIT and BLOCK.
#[inline]
pub fn parse_acquire<'a>(
    argv: &[&'a [u8]],
    max_ttl_ms: u64,
    max_holders: u32,
) -> Result<AcquireArgs<'a>, ArgError> {
    let [_, _key, owner, ttl, options @ ..] = argv else {
        return Err(ArgError::Arity);
    };
    let mut rest: &[&'a [u8]] = options;
    let owner = parse_owner(owner)?;
    let ttl_ms = parse_ttl(ttl, max_ttl_ms)?;
    let (mut shared, mut bound) = (false, false);
    let (mut limit, mut block): (Option<&[u8]>, Option<&[u8]>) = (None, None);
    while let [opt, tail @ ..] = rest {
        rest = tail;
        let is_limit = opt.eq_ignore_ascii_case(b"LIMIT");
        if is_limit || opt.eq_ignore_ascii_case(b"BLOCK") {
            let [value, tail @ ..] = rest else {
                return Err(ArgError::Syntax);
            };
            rest = tail;
            let slot = if is_limit { &mut limit } else { &mut block };
            if slot.replace(*value).is_some() {
                return Err(ArgError::Syntax);
            }
        } else if opt.eq_ignore_ascii_case(b"SHARED") && !shared {
            shared = true;
        } else if opt.eq_ignore_ascii_case(b"BOUND") && !bound {
            bound = true;
        } else {
            return Err(ArgError::Syntax);
        }
    }
    if shared && limit.is_some() {
        return Err(ArgError::Syntax);
    }
    let mode = match limit {
        Some(n) => match parse_i64(n) {
            Some(n) if n >= 1 && n <= i64::from(max_holders) => Mode::Permits(n as u32),
            _ => return Err(ArgError::Limit { max: max_holders }),
        },
        None if shared => Mode::Shared,
        None => Mode::Exclusive,
    };
    let block = match block {
        Some(t) => Some(parse_timeout(t)?),
        None => None,
    };
    Ok(AcquireArgs {
        owner,
        ttl_ms,
        mode,
        bound,
        block,
    })
}

/// `FLOCK.HOLDERS key`.
#[inline]
pub fn parse_holders(argv: &[&[u8]]) -> Result<(), ArgError> {
    parse_info(argv)
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

/// The replication effects (what the master replicates and AOF rewrite writes):
/// - `FLOCK.APPLY key GRANT owner token deadline_ms [BOUND]`: an exclusive key held until
///   then (BOUND: by a bound grant);
/// - `FLOCK.APPLY key DELAY token until_ms`: an exclusive key nobody holds, in lock-delay;
/// - `FLOCK.APPLY key STATE mode limit last_token n {owner token deadline_ms bound}*n m
///   {until_ms}*m`: any key (`mode` is `exclusive`, `shared` or `permits`; `bound` 0 or 1).
///
/// The [`LockImage`] the master sent, checked by [`LockImage::validate`] like every image
/// loaded.
pub fn parse_apply(argv: &[&[u8]]) -> Result<LockImage, ArgError> {
    let image = match argv {
        [_, _key, kind, owner, token, deadline, mark @ ..]
            if kind.eq_ignore_ascii_case(b"GRANT") && mark.len() <= 1 =>
        {
            let bound = match mark {
                [] => false,
                [m] if m.eq_ignore_ascii_case(b"BOUND") => true,
                _ => return Err(ArgError::Syntax),
            };
            let token = parse_token(token)?;
            LockImage {
                last_token: token,
                grants: vec![GrantImage {
                    owner: parse_owner(owner)?.to_vec(),
                    token,
                    deadline_wall_ms: parse_i64(deadline).ok_or(ArgError::Syntax)?,
                    bound,
                }],
                ..LockImage::default()
            }
        }
        [_, _key, kind, token, until] if kind.eq_ignore_ascii_case(b"DELAY") => LockImage {
            last_token: parse_token(token)?,
            delays: vec![parse_i64(until).ok_or(ArgError::Syntax)?],
            ..LockImage::default()
        },
        [_, _key, kind, rest @ ..] if kind.eq_ignore_ascii_case(b"STATE") => parse_state(rest)?,
        [_, _key, _, ..] if argv.len() >= 5 => return Err(ArgError::Syntax),
        _ => return Err(ArgError::Arity),
    };
    image.validate().map_err(|e| match e {
        Invalid::Owner => ArgError::Owner,
        Invalid::Token => ArgError::Token,
        Invalid::Shape => ArgError::Syntax,
    })
}

/// `FLOCK.APPLY MARK token`: the token mark a master sent (see [`crate::apply::MARK`]).
/// `None`: not this form (a key's form, for [`parse_apply`]).
pub fn parse_apply_mark(argv: &[&[u8]]) -> Option<Result<u64, ArgError>> {
    match argv {
        [_, word, token] if word.eq_ignore_ascii_case(b"MARK") => Some(
            parse_token(token).and_then(|t| match t <= crate::tokens::MAX_TOKEN {
                true => Ok(t),
                false => Err(ArgError::Token),
            }),
        ),
        _ => None,
    }
}

/// The fields of `FLOCK.APPLY key STATE ...` after `STATE`.
fn parse_state(fields: &[&[u8]]) -> Result<LockImage, ArgError> {
    let count = |b: &[u8]| -> Result<usize, ArgError> {
        parse_i64(b)
            .and_then(|v| usize::try_from(v).ok())
            .ok_or(ArgError::Syntax)
    };
    let [mode, limit, last_token, n, rest @ ..] = fields else {
        return Err(ArgError::Syntax);
    };
    let code = match &mode.to_ascii_lowercase()[..] {
        b"exclusive" => 0,
        b"shared" => 1,
        b"permits" => 2,
        _ => return Err(ArgError::Syntax),
    };
    let limit = parse_i64(limit)
        .and_then(|v| u64::try_from(v).ok())
        .ok_or(ArgError::Syntax)?;
    let mode = mode_from_code(code, limit).map_err(|_| ArgError::Syntax)?;
    let last_token = match parse_i64(last_token) {
        Some(v) if v >= 0 => v as u64,
        _ => return Err(ArgError::Token),
    };
    let n = count(n)?;
    if rest.len() < n.saturating_mul(4) {
        return Err(ArgError::Syntax);
    }
    let (grant_fields, rest) = rest.split_at(n * 4);
    let mut grants = Vec::with_capacity(n);
    for g in grant_fields.chunks_exact(4) {
        let [owner, token, deadline, bound] = g else {
            return Err(ArgError::Syntax);
        };
        grants.push(GrantImage {
            owner: parse_owner(owner)?.to_vec(),
            token: parse_token(token)?,
            deadline_wall_ms: parse_i64(deadline).ok_or(ArgError::Syntax)?,
            bound: match &bound[..] {
                b"0" => false,
                b"1" => true,
                _ => return Err(ArgError::Syntax),
            },
        });
    }
    let [m, delays @ ..] = rest else {
        return Err(ArgError::Syntax);
    };
    if count(m)? != delays.len() {
        return Err(ArgError::Syntax);
    }
    let delays = delays
        .iter()
        .map(|d| parse_i64(d).ok_or(ArgError::Syntax))
        .collect::<Result<Vec<i64>, ArgError>>()?;
    Ok(LockImage {
        mode,
        last_token,
        grants,
        delays,
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
                mode: Mode::Exclusive,
                bound: false,
                block,
            })
        };
        let with = |mode, bound, block| {
            Ok(AcquireArgs {
                owner: b"o",
                ttl_ms: 100,
                mode,
                bound,
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
            // Kinds and BOUND, options in any order, each at most once.
            (
                vec!["A", "k", "o", "100", "shared"],
                with(Mode::Shared, false, None),
            ),
            (
                vec!["A", "k", "o", "100", "LIMIT", "5", "BOUND", "BLOCK", "7"],
                with(Mode::Permits(5), true, Some(7)),
            ),
            (
                vec!["A", "k", "o", "100", "BLOCK", "7", "limit", "1", "bound"],
                with(Mode::Permits(1), true, Some(7)),
            ),
            (
                vec!["A", "k", "o", "100", "SHARED", "LIMIT", "2"],
                Err(ArgError::Syntax),
            ),
            (
                vec!["A", "k", "o", "100", "SHARED", "SHARED"],
                Err(ArgError::Syntax),
            ),
            (
                vec!["A", "k", "o", "100", "BOUND", "BOUND"],
                Err(ArgError::Syntax),
            ),
            (
                vec!["A", "k", "o", "100", "LIMIT", "2", "LIMIT", "2"],
                Err(ArgError::Syntax),
            ),
            (
                vec!["A", "k", "o", "100", "BLOCK", "1", "BLOCK", "1"],
                Err(ArgError::Syntax),
            ),
            (vec!["A", "k", "o", "100", "LIMIT"], Err(ArgError::Syntax)),
            // Syntax before the values: a bad LIMIT with an unknown option is a syntax error.
            (
                vec!["A", "k", "o", "100", "LIMIT", "0", "FOO"],
                Err(ArgError::Syntax),
            ),
            (
                vec!["A", "k", "o", "100", "LIMIT", "0"],
                Err(ArgError::Limit { max: 50 }),
            ),
            (
                vec!["A", "k", "o", "100", "LIMIT", "51"],
                Err(ArgError::Limit { max: 50 }),
            ),
            (
                vec!["A", "k", "o", "100", "LIMIT", "x"],
                Err(ArgError::Limit { max: 50 }),
            ),
            (
                vec!["A", "k", "o", "100", "LIMIT", "50"],
                with(Mode::Permits(50), false, None),
            ),
        ];
        for (argv, want) in table {
            assert_eq!(parse_acquire(&v(&argv), max, 50), want, "argv {argv:?}");
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
        let grant = |owner: &str, token, deadline_wall_ms, bound| GrantImage {
            owner: owner.as_bytes().to_vec(),
            token,
            deadline_wall_ms,
            bound,
        };
        assert_eq!(
            parse_apply(&v(&["P", "k", "GRANT", "o", "9", "1700000000000"])),
            Ok(LockImage {
                last_token: 9,
                grants: vec![grant("o", 9, 1_700_000_000_000, false)],
                ..LockImage::default()
            })
        );
        assert_eq!(
            parse_apply(&v(&["P", "k", "GRANT", "o", "9", "1700000000000", "BOUND"])),
            Ok(LockImage {
                last_token: 9,
                grants: vec![grant("o", 9, 1_700_000_000_000, true)],
                ..LockImage::default()
            })
        );
        assert_eq!(
            parse_apply(&v(&["P", "k", "GRANT", "o", "9", "1", "BOUNDX"])),
            Err(ArgError::Syntax)
        );
        assert_eq!(
            parse_apply(&v(&["P", "k", "DELAY", "9", "1700000000000"])),
            Ok(LockImage {
                last_token: 9,
                delays: vec![1_700_000_000_000],
                ..LockImage::default()
            })
        );
        let state = [
            "P", "k", "STATE", "permits", "3", "12", "2", "a", "10", "5", "0", "b", "12", "6", "1",
            "1", "7",
        ];
        assert_eq!(
            parse_apply(&v(&state)),
            Ok(LockImage {
                mode: Mode::Permits(3),
                last_token: 12,
                grants: vec![grant("a", 10, 5, false), grant("b", 12, 6, true)],
                delays: vec![7],
            })
        );
        // Every malformed STATE form: a count that lies, an unknown mode, a bad bound mark,
        // a limit the mode cannot have, more slots than the limit.
        for bad in [
            &[
                "P", "k", "STATE", "permits", "3", "12", "3", "a", "10", "5", "0", "0",
            ][..],
            &["P", "k", "STATE", "permits", "3", "12", "0", "2", "7"],
            &["P", "k", "STATE", "readers", "0", "12", "0", "0"],
            &[
                "P", "k", "STATE", "shared", "0", "12", "1", "a", "10", "5", "2", "0",
            ],
            &["P", "k", "STATE", "shared", "2", "12", "0", "0"],
            &[
                "P", "k", "STATE", "permits", "1", "12", "1", "a", "10", "5", "0", "1", "7",
            ],
            &["P", "k", "STATE", "exclusive", "0", "12", "0"],
        ] {
            assert!(parse_apply(&v(bad)).is_err(), "{bad:?}");
        }
        assert_eq!(
            parse_apply(&v(&[
                "P", "k", "STATE", "shared", "0", "12", "1", "", "10", "5", "0", "0"
            ])),
            Err(ArgError::Owner)
        );
        // What the master writes is what the replica reads.
        let image = parse_apply(&v(&state)).expect("valid");
        let now = crate::clock::Now::new(1_000_000, 0);
        let fields = crate::snapshot::state_fields(&image.clone().restore(now));
        let mut argv: Vec<&[u8]> = vec![b"P", b"k", b"STATE"];
        argv.extend(fields.iter().map(|f| &f[..]));
        assert_eq!(parse_apply(&argv), Ok(image));
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
