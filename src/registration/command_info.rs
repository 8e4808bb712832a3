//! What each command is, told to the server with `RedisModule_SetCommandInfo` (Redis 7.0+,
//! Valkey): arity, key specs, and the documentation `COMMAND DOCS` shows (summary, since,
//! complexity, arguments), which redis-cli turns into argument hints and `HELP FLOCK.ACQUIRE`.
//!
//! Key specs are what ACL checks a command's keys by. `RedisModule_CreateCommand`'s legacy
//! first/last/step range counts as read-write access, so without a spec a user with read-only
//! key access (`%R~orders:*`) could not even call FLOCK.CHECK. FLOCK.FENCED keeps the legacy
//! spec and reports its keys itself (getkeys-api) with per-key flags: `fenced::report_keys`.
//! The server's layout of all this is written by `ffi/command_info.rs`.

use crate::ffi::{self, ArgDoc as Arg, ArgKind as Kind, CommandDoc as Command, Ctx, KeyFlags};
use std::ffi::CStr;

const RO: KeyFlags = KeyFlags::RO.and(KeyFlags::ACCESS);
const RW_UPDATE: KeyFlags = KeyFlags::RW.and(KeyFlags::ACCESS).and(KeyFlags::UPDATE);
const RW_DELETE: KeyFlags = KeyFlags::RW.and(KeyFlags::ACCESS).and(KeyFlags::DELETE);
/// The effect command overwrites the key with the master's state, reading nothing.
const OW_UPDATE: KeyFlags = KeyFlags::OW.and(KeyFlags::UPDATE);

/// The module version the commands appeared in (COMMAND DOCS `since`).
const SINCE: &CStr = c"1.0.0";

const fn arg(name: &'static CStr, kind: Kind) -> Arg {
    Arg {
        name,
        kind,
        token: None,
        optional: false,
        multiple: false,
        sub: &[],
    }
}

const fn optional(a: Arg) -> Arg {
    Arg {
        optional: true,
        ..a
    }
}

const KEY: Arg = arg(c"key", Kind::Key);
const OWNER: Arg = arg(c"owner", Kind::Str);
const TTL: Arg = arg(c"ttl", Kind::Int);
const TOKEN: Arg = arg(c"token", Kind::Int);
const BLOCK_TIMEOUT: [Arg; 1] = [arg(c"timeout", Kind::Int)];
const fn keyword(name: &'static CStr, token: &'static CStr) -> Arg {
    Arg {
        token: Some(token),
        ..arg(name, Kind::PureToken)
    }
}
/// `SHARED | LIMIT n`.
const KIND_CHOICE: [Arg; 2] = [
    keyword(c"shared", c"SHARED"),
    Arg {
        token: Some(c"LIMIT"),
        ..arg(c"n", Kind::Int)
    },
];

const COMMANDS: [Command; 12] = [
    Command {
        name: c"flock.acquire",
        arity: -4,
        key: Some(RW_UPDATE),
        summary: Some(c"Takes a lock (exclusive, SHARED or one of LIMIT permits) with a lease and returns its fencing token, or waits for it with BLOCK."),
        complexity: c"O(1)",
        args: &[
            KEY,
            OWNER,
            TTL,
            Arg {
                name: c"kind",
                kind: Kind::OneOf,
                token: None,
                optional: true,
                multiple: false,
                sub: &KIND_CHOICE,
            },
            optional(keyword(c"bound", c"BOUND")),
            Arg {
                name: c"block",
                kind: Kind::Block,
                token: Some(c"BLOCK"),
                optional: true,
                multiple: false,
                sub: &BLOCK_TIMEOUT,
            },
        ],
    },
    Command {
        name: c"flock.release",
        arity: -3,
        key: Some(RW_DELETE),
        summary: Some(c"Releases the owner's live grant (only the grant with that token, if given) and hands the lock to the next waiter."),
        complexity: c"O(1)",
        args: &[KEY, OWNER, optional(TOKEN)],
    },
    Command {
        name: c"flock.renew",
        arity: -4,
        key: Some(RW_UPDATE),
        summary: Some(c"Restarts the lease of the owner's live grant (only the grant with that token, if given); never revives an expired one."),
        complexity: c"O(1)",
        args: &[KEY, OWNER, TTL, optional(TOKEN)],
    },
    Command {
        name: c"flock.check",
        arity: 3,
        key: Some(RO),
        summary: Some(c"Returns the remaining lease in ms while the token is the live grant of the lock, else 0."),
        complexity: c"O(1)",
        args: &[KEY, TOKEN],
    },
    Command {
        name: c"flock.info",
        arity: 2,
        key: Some(RO),
        summary: Some(c"Returns the lock's owner, token, remaining ttl, waiters, mode, holders, limit and delayed slots, or nil."),
        complexity: c"O(N) with N the number of grants",
        args: &[KEY],
    },
    Command {
        name: c"flock.holders",
        arity: 2,
        key: Some(RO),
        summary: Some(c"Returns every live grant of the lock, oldest first, as [owner, token, ttl] triples."),
        complexity: c"O(N) with N the number of grants",
        args: &[KEY],
    },
    Command {
        name: c"flock.revoke",
        arity: -2,
        key: Some(RW_DELETE),
        summary: Some(c"Ends the lock's live grants at once (only the owner's, if given) and returns how many; for operators."),
        complexity: c"O(1)",
        args: &[KEY, optional(OWNER)],
    },
    Command {
        name: c"flock.fenced",
        arity: -4,
        key: None,
        summary: Some(c"Runs a command only while the token is the live grant of the lock, in one atomic step."),
        complexity: c"O(1) plus the complexity of the command",
        args: &[
            KEY,
            TOKEN,
            arg(c"command", Kind::Str),
            Arg {
                multiple: true,
                ..optional(arg(c"arg", Kind::Str))
            },
        ],
    },
    Command {
        name: c"flock.stats",
        arity: -2,
        key: None,
        summary: Some(c"Per lock class: how long grants were held, how they ended, how long waiters waited, and a TTL advice."),
        complexity: c"Depends on the subcommand",
        args: &[],
    },
    Command {
        name: c"flock.stats|get",
        arity: -2,
        key: None,
        summary: Some(c"Returns the statistics of every lock class, or of the classes named."),
        complexity: c"O(N) with N the number of classes returned",
        args: &[Arg {
            multiple: true,
            ..optional(arg(c"class", Kind::Str))
        }],
    },
    Command {
        name: c"flock.stats|reset",
        arity: 2,
        key: None,
        summary: Some(c"Clears the statistics of every lock class."),
        complexity: c"O(N) with N the number of classes",
        args: &[],
    },
    // Internal: the replication effect. Arity and key spec only, no docs.
    Command {
        name: c"flock.apply",
        arity: -3,
        key: Some(OW_UPDATE),
        summary: None,
        complexity: c"O(1)",
        args: &[],
    },
];

/// Set the arity, key spec and docs of every command. Must run in OnLoad, after the commands
/// are created.
pub fn describe(ctx: Ctx<'_>) -> Result<(), String> {
    ffi::describe_commands(ctx, &COMMANDS, SINCE)
}
