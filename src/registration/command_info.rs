//! What each command is, told to the server with `RedisModule_SetCommandInfo` (Redis 7.0+,
//! Valkey): arity, key specs, and the documentation `COMMAND DOCS` shows (summary, since,
//! complexity, arguments), which redis-cli turns into argument hints and `HELP FLOCK.ACQUIRE`.
//!
//! Key specs are what ACL checks a command's keys by. `RedisModule_CreateCommand`'s legacy
//! first/last/step range counts as read-write access, so without a spec a user with read-only
//! key access (`%R~orders:*`) could not even call FLOCK.CHECK. FLOCK.FENCED keeps the legacy
//! spec and reports its keys itself (getkeys-api) with per-key flags: `fenced::report_keys`.

use crate::ffi::Ctx;
use redis_module::raw;
use std::ffi::CStr;
use std::os::raw::c_int;
use std::ptr;

const RO: u32 = raw::REDISMODULE_CMD_KEY_RO | raw::REDISMODULE_CMD_KEY_ACCESS;
const RW_UPDATE: u32 =
    raw::REDISMODULE_CMD_KEY_RW | raw::REDISMODULE_CMD_KEY_ACCESS | raw::REDISMODULE_CMD_KEY_UPDATE;
const RW_DELETE: u32 =
    raw::REDISMODULE_CMD_KEY_RW | raw::REDISMODULE_CMD_KEY_ACCESS | raw::REDISMODULE_CMD_KEY_DELETE;
/// The effect command overwrites the key with the master's state, reading nothing.
const OW_UPDATE: u32 = raw::REDISMODULE_CMD_KEY_OW | raw::REDISMODULE_CMD_KEY_UPDATE;

/// The module version the commands appeared in (COMMAND DOCS `since`).
const SINCE: &CStr = c"1.0.0";

#[derive(Clone, Copy)]
enum Kind {
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
struct Arg {
    name: &'static CStr,
    kind: Kind,
    token: Option<&'static CStr>,
    optional: bool,
    multiple: bool,
    sub: &'static [Arg],
}

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

/// One command: name, arity as Redis counts it, flags of the key at argv[1] (None: keep the
/// legacy spec, see the module doc), summary, complexity, arguments (None: no docs).
struct Command {
    name: &'static CStr,
    arity: c_int,
    key: Option<u32>,
    summary: Option<&'static CStr>,
    complexity: &'static CStr,
    args: &'static [Arg],
}

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

/// One key spec: the key at argv[1], and nothing else.
fn first_key(flags: u32) -> raw::RedisModuleCommandKeySpec {
    raw::RedisModuleCommandKeySpec {
        notes: ptr::null(),
        flags: u64::from(flags),
        begin_search_type: raw::RedisModuleKeySpecBeginSearchType_REDISMODULE_KSPEC_BS_INDEX,
        bs: raw::RedisModuleCommandKeySpec__bindgen_ty_1 {
            index: raw::RedisModuleCommandKeySpec__bindgen_ty_1__bindgen_ty_1 { pos: 1 },
        },
        find_keys_type: raw::RedisModuleKeySpecFindKeysType_REDISMODULE_KSPEC_FK_RANGE,
        fk: raw::RedisModuleCommandKeySpec__bindgen_ty_2 {
            range: raw::RedisModuleCommandKeySpec__bindgen_ty_2__bindgen_ty_1 {
                lastkey: 0,
                keystep: 1,
                limit: 0,
            },
        },
    }
}

/// The end of a key-spec array (begin_search_type 0 = invalid).
fn end_of_specs() -> raw::RedisModuleCommandKeySpec {
    raw::RedisModuleCommandKeySpec {
        begin_search_type: raw::RedisModuleKeySpecBeginSearchType_REDISMODULE_KSPEC_BS_INVALID,
        find_keys_type: raw::RedisModuleKeySpecFindKeysType_REDISMODULE_KSPEC_FK_OMITTED,
        ..first_key(0)
    }
}

/// The end of an argument array (name NULL).
fn end_of_args() -> raw::RedisModuleCommandArg {
    raw::RedisModuleCommandArg {
        name: ptr::null(),
        type_: 0,
        key_spec_index: -1,
        token: ptr::null(),
        summary: ptr::null(),
        since: ptr::null(),
        flags: 0,
        deprecated_since: ptr::null(),
        subargs: ptr::null_mut(),
        display_text: ptr::null(),
    }
}

/// `args` as the server reads them, NULL-terminated; `keep` holds the sub-argument arrays
/// the entries point into, which must live until the SetCommandInfo call returns.
fn raw_args(
    args: &[Arg],
    keep: &mut Vec<Vec<raw::RedisModuleCommandArg>>,
) -> Vec<raw::RedisModuleCommandArg> {
    let mut out = Vec::with_capacity(args.len() + 1);
    for a in args {
        let subargs = if a.sub.is_empty() {
            ptr::null_mut()
        } else {
            let mut sub = raw_args(a.sub, keep);
            let p = sub.as_mut_ptr();
            // Moving the Vec into `keep` does not move its heap buffer, so `p` stays valid.
            keep.push(sub);
            p
        };
        let mut flags = 0;
        if a.optional {
            flags |= raw::REDISMODULE_CMD_ARG_OPTIONAL;
        }
        if a.multiple {
            flags |= raw::REDISMODULE_CMD_ARG_MULTIPLE;
        }
        let type_ = match a.kind {
            Kind::Key => raw::RedisModuleCommandArgType_REDISMODULE_ARG_TYPE_KEY,
            Kind::Str => raw::RedisModuleCommandArgType_REDISMODULE_ARG_TYPE_STRING,
            Kind::Int => raw::RedisModuleCommandArgType_REDISMODULE_ARG_TYPE_INTEGER,
            Kind::Block => raw::RedisModuleCommandArgType_REDISMODULE_ARG_TYPE_BLOCK,
            Kind::PureToken => raw::RedisModuleCommandArgType_REDISMODULE_ARG_TYPE_PURE_TOKEN,
            Kind::OneOf => raw::RedisModuleCommandArgType_REDISMODULE_ARG_TYPE_ONEOF,
        };
        out.push(raw::RedisModuleCommandArg {
            name: a.name.as_ptr(),
            type_,
            key_spec_index: if matches!(a.kind, Kind::Key) { 0 } else { -1 },
            token: a.token.map_or(ptr::null(), CStr::as_ptr),
            flags: flags as c_int,
            subargs,
            ..end_of_args()
        });
    }
    out.push(end_of_args());
    out
}

/// Set the arity, key spec and docs of every command. Must run in OnLoad, after the commands
/// are created.
pub fn describe(ctx: Ctx) -> Result<(), String> {
    // The version struct that redismodule.h defines as a static in the header, by hand: its
    // sizes tell the server how to read the arrays.
    let version = raw::RedisModuleCommandInfoVersion {
        version: 1,
        sizeof_historyentry: std::mem::size_of::<raw::RedisModuleCommandHistoryEntry>(),
        sizeof_keyspec: std::mem::size_of::<raw::RedisModuleCommandKeySpec>(),
        sizeof_arg: std::mem::size_of::<raw::RedisModuleCommandArg>(),
    };
    // SAFETY: reading function pointers the server filled in at load; both exist since 7.0,
    // flock's minimum (ffi::missing_api refuses older servers).
    let (Some(get_command), Some(set_info)) = (unsafe { raw::RedisModule_GetCommand }, unsafe {
        raw::RedisModule_SetCommandInfo
    }) else {
        return Err("this server lacks RedisModule_SetCommandInfo".to_string());
    };
    for c in &COMMANDS {
        // SAFETY: ctx is the OnLoad context and name a NUL-terminated command name.
        let cmd = unsafe { get_command(ctx, c.name.as_ptr()) };
        if cmd.is_null() {
            return Err(format!("{} is not registered", c.name.to_string_lossy()));
        }
        let mut specs = c.key.map(|flags| [first_key(flags), end_of_specs()]);
        let mut keep = Vec::new();
        let mut args = c.summary.map(|_| raw_args(c.args, &mut keep));
        let info = raw::RedisModuleCommandInfo {
            version: &version,
            summary: c.summary.map_or(ptr::null(), CStr::as_ptr),
            complexity: c.summary.map_or(ptr::null(), |_| c.complexity.as_ptr()),
            since: c.summary.map_or(ptr::null(), |_| SINCE.as_ptr()),
            history: ptr::null_mut(),
            tips: ptr::null(),
            arity: c.arity,
            key_specs: specs.as_mut().map_or(ptr::null_mut(), |s| s.as_mut_ptr()),
            args: args.as_mut().map_or(ptr::null_mut(), |a| a.as_mut_ptr()),
        };
        // SAFETY: info and every array it points to (specs, args, keep) live until the call
        // returns; the server copies what it keeps.
        if unsafe { set_info(cmd, &info) } != raw::REDISMODULE_OK as c_int {
            return Err(format!(
                "the server refused the command info of {}",
                c.name.to_string_lossy()
            ));
        }
    }
    Ok(())
}
