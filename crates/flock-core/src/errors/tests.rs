//! The table against docs/SPEC.md's error section, and against the texts the module sent
//! before the table existed.

use super::*;
use crate::args::ArgError;
use crate::engine::{Event, ReplyError};

const SPEC: &str = include_str!("../../../../docs/SPEC.md");

/// The texts in backquotes in the error column of SPEC.md's "## Errors" table.
fn spec_error_texts() -> Vec<&'static str> {
    let section = SPEC
        .split("\n## Errors\n")
        .nth(1)
        .expect("an Errors section");
    let section = section.split("\n## ").next().unwrap_or(section);
    let mut out = Vec::new();
    for row in section.lines().filter(|l| l.starts_with('|')).skip(2) {
        let error = row.split('|').nth(2).expect("an error column");
        out.extend(error.split('`').skip(1).step_by(2));
    }
    out
}

/// `text` matches `pattern`, where `*` stands for one or more bytes.
fn glob(pattern: &[u8], text: &[u8]) -> bool {
    match pattern.split_first() {
        None => text.is_empty(),
        Some((b'*', rest)) => (1..=text.len()).any(|i| glob(rest, &text[i..])),
        Some((c, rest)) => text.first() == Some(c) && glob(rest, &text[1..]),
    }
}

/// SPEC's placeholders (`N`, `KEY`, `T`, `'cmd'`, `...`) as `*`.
fn pattern(spec: &str) -> String {
    spec.split(' ')
        .map(|w| match w {
            "N" | "KEY" | "T" | "..." => "*",
            "'cmd':" => "'*':",
            w => w,
        })
        .collect::<Vec<_>>()
        .join(" ")
}

/// Every text the table makes: the fixed ones, and the formatted ones with sample values.
fn table_texts() -> Vec<String> {
    let key = b"k";
    let formatted = [
        Formatted::Ttl {
            max: 315_360_000_000,
        },
        Formatted::Limit { max: 1000 },
        Formatted::OwnerHolds {
            mode: Mode::Exclusive,
            key,
        },
        Formatted::OwnerHolds {
            mode: Mode::Shared,
            key,
        },
        Formatted::OwnerHolds {
            mode: Mode::Permits(3),
            key,
        },
        Formatted::LimitMismatch {
            mode: Mode::Permits(3),
            key,
        },
        Formatted::LimitMismatch {
            mode: Mode::Shared,
            key,
        },
        Formatted::FencedStale { token: 5, key },
        Formatted::FencedRefuses {
            command: b"MULTI",
            what: "a transaction",
        },
        Formatted::WrongArity {
            command: b"FLOCK.ACQUIRE",
        },
        Formatted::OwnerWaits { key },
    ];
    Fixed::ALL
        .iter()
        .map(|f| f.as_str().to_string())
        .chain(formatted.iter().map(Formatted::message))
        .collect()
}

#[test]
fn every_spec_error_is_in_the_table() {
    let spec = spec_error_texts();
    assert!(spec.len() >= 25, "the Errors table was read: {spec:?}");
    let ours = table_texts();
    for text in spec {
        let found = if text.starts_with(|c: char| c.is_ascii_lowercase()) {
            // A fragment of another text ("a shared", "a permit").
            ours.iter().any(|o| o.contains(text))
        } else {
            let p = pattern(text);
            ours.iter().any(|o| glob(p.as_bytes(), o.as_bytes()))
        };
        assert!(
            found,
            "SPEC.md's `{text}` is not in errors::Fixed or errors::Formatted"
        );
    }
}

#[test]
fn every_table_error_is_in_the_spec() {
    // The other way round for the fixed texts: none the module can send is missing from
    // SPEC.md's table (a placeholder or a trailing `...` there stands for the rest of the
    // text). The formatted ones have mode variants SPEC names as fragments (`a shared`).
    let spec: Vec<String> = spec_error_texts()
        .into_iter()
        .filter(|t| t.starts_with(|c: char| c.is_ascii_uppercase()))
        .map(pattern)
        .collect();
    // `Fixed::Arity` is never sent: the module replies Redis's own arity error instead.
    let never_sent = Fixed::Arity.as_str();
    for text in Fixed::ALL
        .iter()
        .map(|f| f.as_str())
        .filter(|t| *t != never_sent)
    {
        assert!(
            spec.iter().any(|p| glob(p.as_bytes(), text.as_bytes())),
            "`{text}` is not in SPEC.md's Errors table"
        );
    }
}

#[test]
fn spec_fixed_texts_are_the_tables_exactly() {
    // The SPEC texts without a placeholder are fixed texts, to the byte.
    let fixed: Vec<&str> = Fixed::ALL.iter().map(|f| f.as_str()).collect();
    for text in spec_error_texts() {
        if pattern(text) == text && text.starts_with(|c: char| c.is_ascii_uppercase()) {
            let formatted_only = text.starts_with("ERR wrong number of arguments for");
            assert!(formatted_only || fixed.contains(&text), "`{text}`");
        }
    }
}

#[test]
fn fixed_texts_are_distinct_ascii_with_a_code() {
    for (i, f) in Fixed::ALL.iter().enumerate() {
        let t = f.as_str();
        assert!(
            t.is_ascii() && t.len() == f.text().to_bytes().len(),
            "{f:?}"
        );
        let code = t.split(' ').next().unwrap_or("");
        assert!(
            !code.is_empty() && code.bytes().all(|b| b.is_ascii_uppercase()),
            "{f:?}"
        );
        assert!(
            Fixed::ALL[..i].iter().all(|g| g.text() != f.text()),
            "{f:?} twice"
        );
    }
}

/// The texts as `ArgError::message` and `ReplyError::message` wrote them before the table.
#[test]
fn messages_are_the_texts_sent_before() {
    let owner = format!(
        "ERR invalid owner: must be 1 to {} bytes",
        crate::MAX_OWNER_LEN
    );
    let args: [(ArgError, &str); 9] = [
        (ArgError::Arity, "ERR wrong number of arguments"),
        (ArgError::Syntax, "ERR syntax error"),
        (ArgError::Owner, &owner),
        (
            ArgError::Ttl { max: 7 },
            "ERR invalid ttl: must be an integer from 1 to 7 (flock.max-ttl-ms)",
        ),
        (
            ArgError::Timeout,
            "ERR invalid timeout: must be an integer of milliseconds, 0 or more",
        ),
        (
            ArgError::Token,
            "ERR invalid token: must be a positive integer",
        ),
        (
            ArgError::Limit { max: 9 },
            "ERR invalid limit: must be an integer from 1 to 9 (flock.max-holders)",
        ),
        (
            ArgError::BoundNeedsClient,
            "ERR BOUND needs a client connection",
        ),
        (ArgError::NumKeys, "ERR numkeys must be 1 to 64"),
    ];
    for (e, text) in args {
        assert_eq!(e.message(), text);
        let fixed = !matches!(e, ArgError::Ttl { .. } | ArgError::Limit { .. });
        assert_eq!(
            e.static_text().map(|t| t.to_bytes()),
            fixed.then_some(text.as_bytes())
        );
    }
    let replies: [(ReplyError, &str); 7] = [
        (ReplyError::TokensExhausted, "ERR token space exhausted"),
        (
            ReplyError::TooManyWaiters,
            "ERR too many clients wait for this key (flock.max-waiters)",
        ),
        (ReplyError::CouldNotBlock, "ERR could not block the client"),
        (
            ReplyError::OwnerHolds(Mode::Exclusive),
            "ERR owner already holds an exclusive grant of my:key",
        ),
        (
            ReplyError::OwnerHolds(Mode::Permits(2)),
            "ERR owner already holds a permit grant of my:key",
        ),
        (
            ReplyError::LimitMismatch(Mode::Permits(4)),
            "ERR limit mismatch: my:key admits 4 shared holders",
        ),
        (
            ReplyError::LimitMismatch(Mode::Shared),
            "ERR limit mismatch: my:key admits any number of shared holders",
        ),
    ];
    for (e, text) in replies {
        assert_eq!(e.message(b"my:key"), text);
        let keyed = matches!(e, ReplyError::OwnerHolds(_) | ReplyError::LimitMismatch(_));
        assert_eq!(e.static_text().is_none(), keyed, "{e:?}");
    }
    let waiters = [
        (
            Fixed::WaitedKeyOtherType,
            "ERR the lock key now holds a value of another type",
        ),
        (
            Fixed::WaitedKeyMoved,
            "TRYAGAIN the lock key moved to another node while you waited; retry",
        ),
        (
            Fixed::UnblockedNowReplica,
            "UNBLOCKED this server is now a replica",
        ),
    ];
    for (f, text) in waiters {
        assert_eq!(f.as_str(), text);
    }
    assert_eq!(
        Formatted::FencedStale {
            token: 12,
            key: b"k\xff"
        }
        .message(),
        "FENCED token 12 is not the live grant of k\u{fffd}"
    );
    assert_eq!(
        Formatted::FencedRefuses {
            command: b"BLPOP",
            what: "a blocking command"
        }
        .message(),
        "ERR FLOCK.FENCED refuses 'blpop': a blocking command cannot run inside it"
    );
}

#[test]
fn fenced_call_errors_by_errno() {
    let table = [
        (
            CallErrno::NoEntry,
            "ERR unknown command inside FLOCK.FENCED",
        ),
        (
            CallErrno::Invalid,
            "ERR wrong number of arguments for the command inside FLOCK.FENCED",
        ),
        (
            CallErrno::Access,
            "NOPERM this user has no permissions to run the command or touch its keys",
        ),
        (
            CallErrno::NoSpace,
            "OOM command not allowed when used memory > 'maxmemory'",
        ),
        (
            CallErrno::ReadOnly,
            "READONLY You can't write against a read only replica",
        ),
        (
            CallErrno::Seek,
            "CROSSSLOT Keys in request don't hash to the same slot",
        ),
        (
            CallErrno::Other,
            "ERR the command inside FLOCK.FENCED could not run",
        ),
    ];
    for (errno, text) in table {
        assert_eq!(Fixed::of_call_errno(errno).as_str(), text);
    }
}

#[test]
fn event_names_once() {
    let events = [
        Event::Acquired { ttl_ms: 1 },
        Event::Released {
            held_ms: 1,
            token: 2,
        },
        Event::Expired { token: 2 },
        Event::Revoked { token: 2 },
        Event::Closed { token: 2 },
    ];
    let names = [
        "flock.acquired",
        "flock.released",
        "flock.expired",
        "flock.revoked",
        "flock.closed",
    ];
    for (e, name) in events.into_iter().zip(names) {
        assert_eq!(e.name(), name);
        assert_eq!(e.c_name().to_bytes(), name.as_bytes());
    }
}
