//! The command table: every FLOCK command as data, in one place. Name, the flags Redis
//! registers it with, arity as Redis counts it (negative: at least that many), what it does
//! to the key at argv[1] (ACL and cluster routing read that key spec), and the documentation
//! `COMMAND DOCS` shows (redis-cli's argument hints, `HELP FLOCK.ACQUIRE`).
//!
//! The module registers exactly these (pairing each with its handler) and the argument
//! parsers in [`crate::args`] are checked against the arities here, so a command is
//! described once.

use std::ffi::CStr;

/// What a command does to the key at argv[1] (its key spec's flags).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum KeyAccess {
    /// Reads the key: `%R~` ACL key access suffices (FLOCK.CHECK on a reader's lock).
    Read,
    /// Reads and changes the key in place.
    Update,
    /// Reads the key and may delete it.
    Delete,
    /// Overwrites the key with a whole new value, reading nothing (the replication effect).
    Overwrite,
}

/// What kind of argument COMMAND DOCS shows.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ArgKind {
    Key,
    Str,
    Int,
    /// A keyword followed by its sub-arguments (`BLOCK timeout`).
    Block,
    /// A keyword alone (`SHARED`, `BOUND`).
    PureToken,
    /// One of its sub-arguments (`SHARED | LIMIT n`).
    OneOf,
}

/// One argument as COMMAND DOCS describes it.
#[derive(Clone, Copy, Debug)]
pub struct ArgDoc {
    pub name: &'static CStr,
    pub kind: ArgKind,
    pub token: Option<&'static CStr>,
    pub optional: bool,
    pub multiple: bool,
    pub sub: &'static [ArgDoc],
}

/// One command.
#[derive(Clone, Copy, Debug)]
pub struct CommandSpec {
    /// As registered (lower case; a subcommand as `container|sub`).
    pub name: &'static CStr,
    /// Redis's command flags, as `RedisModule_CreateCommand` takes them.
    pub flags: &'static CStr,
    pub arity: i32,
    /// The key spec of argv[1]; `None`: none (no key, or the command reports its keys
    /// itself: FLOCK.FENCED's inner command has keys of its own, see `getkeys-api`).
    pub key: Option<KeyAccess>,
    /// `None`: undocumented (an internal command).
    pub summary: Option<&'static CStr>,
    pub complexity: &'static CStr,
    pub args: &'static [ArgDoc],
}

impl CommandSpec {
    /// The container part of a subcommand's name (`flock.stats` of `flock.stats|get`).
    pub fn container(&self) -> Option<&'static [u8]> {
        let name = self.name.to_bytes();
        name.iter().position(|&b| b == b'|').map(|i| &name[..i])
    }

    /// The subcommand part of a subcommand's name (`get` of `flock.stats|get`).
    pub fn subcommand(&self) -> Option<&'static [u8]> {
        let name = self.name.to_bytes();
        name.iter().position(|&b| b == b'|').map(|i| &name[i + 1..])
    }
}

/// The module version the commands appeared in (COMMAND DOCS `since`).
pub const SINCE: &CStr = c"0.1.0";

const fn arg(name: &'static CStr, kind: ArgKind) -> ArgDoc {
    ArgDoc {
        name,
        kind,
        token: None,
        optional: false,
        multiple: false,
        sub: &[],
    }
}

const fn optional(a: ArgDoc) -> ArgDoc {
    ArgDoc {
        optional: true,
        ..a
    }
}

const fn keyword(name: &'static CStr, token: &'static CStr) -> ArgDoc {
    ArgDoc {
        token: Some(token),
        ..arg(name, ArgKind::PureToken)
    }
}

const KEY: ArgDoc = arg(c"key", ArgKind::Key);
const OWNER: ArgDoc = arg(c"owner", ArgKind::Str);
const TTL: ArgDoc = arg(c"ttl", ArgKind::Int);
const TOKEN: ArgDoc = arg(c"token", ArgKind::Int);
const BLOCK_TIMEOUT: [ArgDoc; 1] = [arg(c"timeout", ArgKind::Int)];
/// `SHARED | LIMIT n`.
const KIND_CHOICE: [ArgDoc; 2] = [
    keyword(c"shared", c"SHARED"),
    ArgDoc {
        token: Some(c"LIMIT"),
        ..arg(c"n", ArgKind::Int)
    },
];

pub const ACQUIRE: CommandSpec = CommandSpec {
    name: c"flock.acquire",
    flags: c"write deny-oom",
    arity: -4,
    key: Some(KeyAccess::Update),
    summary: Some(c"Takes a lock (exclusive, SHARED or one of LIMIT permits) with a lease and returns its fencing token, or waits for it with BLOCK."),
    complexity: c"O(1)",
    args: &[
        KEY,
        OWNER,
        TTL,
        ArgDoc {
            name: c"kind",
            kind: ArgKind::OneOf,
            token: None,
            optional: true,
            multiple: false,
            sub: &KIND_CHOICE,
        },
        optional(keyword(c"bound", c"BOUND")),
        ArgDoc {
            name: c"block",
            kind: ArgKind::Block,
            token: Some(c"BLOCK"),
            optional: true,
            multiple: false,
            sub: &BLOCK_TIMEOUT,
        },
    ],
};

pub const RELEASE: CommandSpec = CommandSpec {
    name: c"flock.release",
    flags: c"write fast",
    arity: -3,
    key: Some(KeyAccess::Delete),
    summary: Some(c"Releases the owner's live grant (only the grant with that token, if given) and hands the lock to the next waiter."),
    complexity: c"O(1)",
    args: &[KEY, OWNER, optional(TOKEN)],
};

pub const RENEW: CommandSpec = CommandSpec {
    name: c"flock.renew",
    flags: c"write fast",
    arity: -4,
    key: Some(KeyAccess::Update),
    summary: Some(c"Restarts the lease of the owner's live grant (only the grant with that token, if given); never revives an expired one."),
    complexity: c"O(1)",
    args: &[KEY, OWNER, TTL, optional(TOKEN)],
};

pub const CHECK: CommandSpec = CommandSpec {
    name: c"flock.check",
    flags: c"readonly fast",
    arity: 3,
    key: Some(KeyAccess::Read),
    summary: Some(
        c"Returns the remaining lease in ms while the token is the live grant of the lock, else 0.",
    ),
    complexity: c"O(1)",
    args: &[KEY, TOKEN],
};

pub const INFO: CommandSpec = CommandSpec {
    name: c"flock.info",
    flags: c"readonly fast",
    arity: 2,
    key: Some(KeyAccess::Read),
    summary: Some(c"Returns the lock's owner, token, remaining ttl, waiters, mode, holders, limit and delayed slots, or nil."),
    complexity: c"O(N) with N the number of grants",
    args: &[KEY],
};

pub const HOLDERS: CommandSpec = CommandSpec {
    name: c"flock.holders",
    flags: c"readonly",
    arity: 2,
    key: Some(KeyAccess::Read),
    summary: Some(
        c"Returns every live grant of the lock, oldest first, as [owner, token, ttl] triples.",
    ),
    complexity: c"O(N) with N the number of grants",
    args: &[KEY],
};

pub const REVOKE: CommandSpec = CommandSpec {
    name: c"flock.revoke",
    flags: c"write fast",
    arity: -2,
    key: Some(KeyAccess::Delete),
    summary: Some(c"Ends the lock's live grants at once (only the owner's, if given) and returns how many; for operators."),
    complexity: c"O(1)",
    args: &[KEY, optional(OWNER)],
};

pub const FENCED: CommandSpec = CommandSpec {
    name: c"flock.fenced",
    flags: c"write getkeys-api",
    arity: -4,
    key: None,
    summary: Some(
        c"Runs a command only while the token is the live grant of the lock, in one atomic step.",
    ),
    complexity: c"O(1) plus the complexity of the command",
    args: &[
        KEY,
        TOKEN,
        arg(c"command", ArgKind::Str),
        ArgDoc {
            multiple: true,
            ..optional(arg(c"arg", ArgKind::Str))
        },
    ],
};

/// A container (no handler of its own: Redis answers for a missing or unknown subcommand)
/// of GET and RESET, so that an ACL can allow GET alone.
pub const STATS: CommandSpec = CommandSpec {
    name: c"flock.stats",
    flags: c"",
    arity: -2,
    key: None,
    summary: Some(c"Per lock class: how long grants were held, how they ended, how long waiters waited, and a TTL advice."),
    complexity: c"Depends on the subcommand",
    args: &[],
};

pub const STATS_GET: CommandSpec = CommandSpec {
    name: c"flock.stats|get",
    flags: c"readonly fast",
    arity: -2,
    key: None,
    summary: Some(c"Returns the statistics of every lock class, or of the classes named."),
    complexity: c"O(N) with N the number of classes returned",
    args: &[ArgDoc {
        multiple: true,
        ..optional(arg(c"class", ArgKind::Str))
    }],
};

pub const STATS_RESET: CommandSpec = CommandSpec {
    name: c"flock.stats|reset",
    flags: c"fast",
    arity: 2,
    key: None,
    summary: Some(c"Clears the statistics of every lock class."),
    complexity: c"O(N) with N the number of classes",
    args: &[],
};

/// Redis answers an unknown subcommand of a container with "Try FLOCK.STATS HELP", so HELP
/// exists and says what the container holds.
pub const STATS_HELP: CommandSpec = CommandSpec {
    name: c"flock.stats|help",
    flags: c"readonly fast",
    arity: 2,
    key: None,
    summary: Some(c"Shows what the FLOCK.STATS subcommands do."),
    complexity: c"O(1)",
    args: &[],
};

/// What `FLOCK.STATS HELP` replies, one status line each (as Redis's own `... HELP` do).
pub const STATS_HELP_LINES: [&CStr; 7] = [
    c"FLOCK.STATS <subcommand> [<arg> ...]. Subcommands are:",
    c"GET [<class> ...]",
    c"    Per lock class (the key with its ids folded to #): grants and how they ended, hold, ttl and wait times, a TTL advice.",
    c"RESET",
    c"    Clears the statistics of every lock class.",
    c"HELP",
    c"    Prints this help.",
];

/// The replication effect (G7): accepted only from the master's stream and AOF loading.
pub const APPLY: CommandSpec = CommandSpec {
    name: c"flock.apply",
    flags: c"write",
    arity: -3,
    key: Some(KeyAccess::Overwrite),
    summary: None,
    complexity: c"O(1)",
    args: &[],
};

/// `FLOCK.WATCH timeout key token [key token ...]`: its keys are every other argument from
/// argv[2] ([`key_range`]), each only read.
pub const WATCH: CommandSpec = CommandSpec {
    name: c"flock.watch",
    flags: c"readonly",
    arity: -4,
    key: Some(KeyAccess::Read),
    summary: Some(c"Waits until a lock is held (token 0) or until a grant ends, and says how: held, released, expired, revoked, closed, lost or gone."),
    complexity: c"O(N) with N the number of keys",
    args: &[
        arg(c"timeout", ArgKind::Int),
        ArgDoc {
            multiple: true,
            sub: &[KEY, TOKEN],
            ..arg(c"pair", ArgKind::Block)
        },
    ],
};

pub const WAITERS: CommandSpec = CommandSpec {
    name: c"flock.waiters",
    flags: c"readonly fast",
    arity: -2,
    key: Some(KeyAccess::Read),
    summary: Some(c"Returns the requests waiting for the lock, first in line first, as [owner, mode, waited_ms] triples."),
    complexity: c"O(N) with N the number of waiters returned",
    args: &[
        KEY,
        ArgDoc {
            token: Some(c"COUNT"),
            ..optional(arg(c"count", ArgKind::Int))
        },
    ],
};

/// `FLOCK.MACQUIRE numkeys key [key ...] owner ttl [BOUND] [BLOCK timeout]`: its keys are
/// the `numkeys` arguments after argv[1] ([`key_search`]), each read and written.
pub const MACQUIRE: CommandSpec = CommandSpec {
    name: c"flock.macquire",
    // getkeys-api too: Redis 7.0's cluster check reads a module command's keys from its
    // legacy range or that API, and counted keys have no range.
    flags: c"write deny-oom getkeys-api",
    arity: -5,
    key: Some(KeyAccess::Update),
    summary: Some(c"Takes several exclusive locks at once, all or nothing, and returns one fencing token per key, or waits for all of them with BLOCK."),
    complexity: c"O(N) with N the number of keys",
    args: &[
        arg(c"numkeys", ArgKind::Int),
        ArgDoc {
            multiple: true,
            ..KEY
        },
        OWNER,
        TTL,
        optional(keyword(c"bound", c"BOUND")),
        ArgDoc {
            name: c"block",
            kind: ArgKind::Block,
            token: Some(c"BLOCK"),
            optional: true,
            multiple: false,
            sub: &BLOCK_TIMEOUT,
        },
    ],
};

/// How a command's keys are found (its key spec).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum KeySearch {
    /// The keys of a [`KeyRange`].
    Range(KeyRange),
    /// argv[`index`] is the number of keys, which follow it (MACQUIRE's `numkeys`).
    Keynum { index: i32 },
}

/// How the keys of `spec` are found: by their number for MACQUIRE, else by its range.
pub fn key_search(spec: &CommandSpec) -> KeySearch {
    if spec.name == MACQUIRE.name {
        KeySearch::Keynum { index: 1 }
    } else {
        KeySearch::Range(key_range(spec))
    }
}

/// Where a command's keys are: argv[`first`], then every `step`-th argument up to `last`
/// (negative: counted from the end, -1 the last argument). Both the legacy key range of
/// `RedisModule_CreateCommand` and the key spec's range are made from it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct KeyRange {
    pub first: i32,
    pub last: i32,
    pub step: i32,
}

/// The key range of `spec`: one key at argv[1] for every command but those that name
/// several.
pub fn key_range(spec: &CommandSpec) -> KeyRange {
    if spec.name == MACQUIRE.name {
        // No range: the legacy triple of a command whose keys are counted is none (Redis
        // marks it movablekeys from its key spec).
        KeyRange {
            first: 0,
            last: 0,
            step: 0,
        }
    } else if spec.name == WATCH.name {
        KeyRange {
            first: 2,
            last: -1,
            step: 2,
        }
    } else {
        KeyRange {
            first: 1,
            last: 1,
            step: 1,
        }
    }
}

/// Every command, containers before their subcommands.
pub const ALL: [&CommandSpec; 16] = [
    &ACQUIRE,
    &RELEASE,
    &RENEW,
    &CHECK,
    &INFO,
    &HOLDERS,
    &REVOKE,
    &FENCED,
    &STATS,
    &STATS_GET,
    &STATS_RESET,
    &STATS_HELP,
    &APPLY,
    &WATCH,
    &WAITERS,
    &MACQUIRE,
];

#[cfg(test)]
mod tests {
    use super::*;
    use crate::args::{self, ArgError};

    fn argv(n: usize) -> Vec<&'static [u8]> {
        // Arguments every parser accepts where it takes them (key, owner, ttl, token: "1").
        vec![&b"1"[..]; n]
    }

    /// Each parser refuses fewer arguments than its command's arity and takes exactly the
    /// arity's count: the table and the parsers agree.
    fn agrees(spec: &CommandSpec, parse: impl Fn(&[&[u8]]) -> Result<(), ArgError>) {
        let min = spec.arity.unsigned_abs() as usize;
        for n in 0..min {
            assert_eq!(
                parse(&argv(n)),
                Err(ArgError::Arity),
                "{:?} with {n} arguments",
                spec.name
            );
        }
        assert_eq!(parse(&argv(min)), Ok(()), "{:?} with {min}", spec.name);
        if spec.arity > 0 {
            assert_eq!(
                parse(&argv(min + 1)),
                Err(ArgError::Arity),
                "{:?} takes exactly {min}",
                spec.name
            );
        }
    }

    #[test]
    fn acquire_arity_agrees() {
        agrees(&ACQUIRE, |a| args::parse_acquire(a, 1_000, 10).map(drop));
    }

    #[test]
    fn release_arity_agrees() {
        agrees(&RELEASE, |a| args::parse_release(a).map(drop));
    }

    #[test]
    fn renew_arity_agrees() {
        agrees(&RENEW, |a| args::parse_renew(a, 1_000).map(drop));
    }

    #[test]
    fn check_arity_agrees() {
        agrees(&CHECK, |a| args::parse_check(a).map(drop));
    }

    #[test]
    fn info_arity_agrees() {
        agrees(&INFO, args::parse_info);
    }

    #[test]
    fn holders_arity_agrees() {
        agrees(&HOLDERS, args::parse_holders);
    }

    #[test]
    fn revoke_arity_agrees() {
        agrees(&REVOKE, |a| args::parse_revoke(a).map(drop));
    }

    #[test]
    fn watch_arity_agrees() {
        agrees(&WATCH, |a| match crate::watch::parse_watch(a) {
            Ok(_) => Ok(()),
            Err(crate::watch::WatchArgError::Arity) => Err(ArgError::Arity),
            Err(_) => Err(ArgError::Syntax),
        });
    }

    #[test]
    fn waiters_arity_agrees() {
        agrees(&WAITERS, |a| match crate::watch::parse_waiters(a) {
            Ok(_) => Ok(()),
            Err(crate::watch::WatchArgError::Arity) => Err(ArgError::Arity),
            Err(_) => Err(ArgError::Syntax),
        });
    }

    #[test]
    fn macquire_arity_agrees() {
        agrees(&MACQUIRE, |a| {
            crate::multi::parse_macquire(a, 1_000, 10)
                .map(drop)
                .map_err(|e| match e {
                    ArgError::Arity => ArgError::Arity,
                    _ => ArgError::Syntax,
                })
        });
    }

    #[test]
    fn macquire_keys_are_counted_by_numkeys_with_no_legacy_range() {
        assert_eq!(key_search(&MACQUIRE), KeySearch::Keynum { index: 1 });
        assert_eq!(key_range(&MACQUIRE).first, 0);
        assert_eq!(
            key_search(&ACQUIRE),
            KeySearch::Range(KeyRange {
                first: 1,
                last: 1,
                step: 1
            })
        );
        assert_eq!(MACQUIRE.args.get(1).map(|a| a.kind), Some(ArgKind::Key));
    }

    #[test]
    fn watch_keys_are_every_other_argument_from_the_second() {
        assert_eq!(
            key_range(&WATCH),
            KeyRange {
                first: 2,
                last: -1,
                step: 2
            }
        );
        assert_eq!(key_range(&CHECK).first, 1);
        assert_eq!(WATCH.args.get(1).map(|a| a.sub[0].kind), Some(ArgKind::Key));
    }

    #[test]
    fn names_are_unique_and_subcommands_follow_their_container() {
        let names: Vec<&[u8]> = ALL.iter().map(|c| c.name.to_bytes()).collect();
        for (i, n) in names.iter().enumerate() {
            assert!(!names[..i].contains(n), "{n:?} twice");
            assert!(n.starts_with(b"flock."), "{n:?}");
        }
        for (i, c) in ALL.iter().enumerate() {
            if let Some(container) = c.container() {
                assert!(
                    names[..i].contains(&container),
                    "{:?} before its container",
                    c.name
                );
                assert!(c.subcommand().is_some_and(|s| !s.is_empty()));
            }
        }
    }

    #[test]
    fn every_command_in_the_spec_is_in_the_table() {
        let spec = include_str!("../../../docs/SPEC.md");
        let names: Vec<String> = ALL
            .iter()
            .map(|c| c.name.to_string_lossy().to_uppercase())
            .collect();
        let mut found = 0;
        for (i, _) in spec.match_indices("FLOCK.") {
            let word: String = spec[i..]
                .chars()
                .take_while(|c| c.is_ascii_alphanumeric() || *c == '.' || *c == '_')
                .collect();
            let word = word.trim_end_matches('.');
            if word.len() > "FLOCK.".len() && word.chars().all(|c| !c.is_ascii_lowercase()) {
                found += 1;
                assert!(
                    names.iter().any(|n| n == word),
                    "{word} is in docs/SPEC.md but not in the table"
                );
            }
        }
        assert!(
            found >= 9,
            "found only {found} command names in docs/SPEC.md"
        );
        for c in ALL {
            if c.container().is_none() {
                let upper = c.name.to_string_lossy().to_uppercase();
                assert!(spec.contains(&upper), "{upper} is not in docs/SPEC.md");
            }
        }
    }

    #[test]
    fn documented_commands_document_their_key() {
        for c in ALL {
            if c.summary.is_some() && c.key.is_some() && key_range(c).first == 1 {
                assert!(
                    c.args.first().is_some_and(|a| a.kind == ArgKind::Key),
                    "{:?}",
                    c.name
                );
            }
        }
    }
}
