//! `RedisModule_SetCommandInfo` from the command table (`flock_core::commands`): the key
//! spec and the COMMAND DOCS arrays in the layout the server reads.

use super::handle::Ctx;
use flock_core::commands::{
    self, ArgDoc, ArgKind, CommandSpec, KeyAccess, KeyRange, KeySearch, SINCE,
};
use redis_module::raw;
use std::ffi::CStr;
use std::os::raw::c_int;
use std::ptr;

/// How a command uses a key (the `REDISMODULE_CMD_KEY_*` flags of key specs and
/// getkeys-api).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct KeyFlags(pub(in crate::ffi) u32);

impl KeyFlags {
    /// Read only.
    pub const RO: KeyFlags = KeyFlags(raw::REDISMODULE_CMD_KEY_RO);
    /// Read and write.
    pub const RW: KeyFlags = KeyFlags(raw::REDISMODULE_CMD_KEY_RW);
    /// Overwritten (nothing read).
    pub const OW: KeyFlags = KeyFlags(raw::REDISMODULE_CMD_KEY_OW);
    /// The value is read or returned.
    pub const ACCESS: KeyFlags = KeyFlags(raw::REDISMODULE_CMD_KEY_ACCESS);
    /// The value is updated.
    pub const UPDATE: KeyFlags = KeyFlags(raw::REDISMODULE_CMD_KEY_UPDATE);
    /// The key may be deleted.
    pub const DELETE: KeyFlags = KeyFlags(raw::REDISMODULE_CMD_KEY_DELETE);

    /// Both sets of flags.
    pub const fn and(self, other: KeyFlags) -> KeyFlags {
        KeyFlags(self.0 | other.0)
    }
}

/// The key-spec flags of what a command does to its key.
fn key_flags(access: KeyAccess) -> KeyFlags {
    match access {
        KeyAccess::Read => KeyFlags::RO.and(KeyFlags::ACCESS),
        KeyAccess::Update => KeyFlags::RW.and(KeyFlags::ACCESS).and(KeyFlags::UPDATE),
        KeyAccess::Delete => KeyFlags::RW.and(KeyFlags::ACCESS).and(KeyFlags::DELETE),
        KeyAccess::Overwrite => KeyFlags::OW.and(KeyFlags::UPDATE),
    }
}

/// One key spec: the key at argv[1], and nothing else.
fn first_key(flags: u32) -> raw::RedisModuleCommandKeySpec {
    key_range(
        flags,
        KeyRange {
            first: 1,
            last: 1,
            step: 1,
        },
    )
}

/// One key spec over `range` (lastkey is relative to the first key, or negative from the
/// end of the arguments).
fn key_range(flags: u32, range: KeyRange) -> raw::RedisModuleCommandKeySpec {
    raw::RedisModuleCommandKeySpec {
        notes: ptr::null(),
        flags: u64::from(flags),
        begin_search_type: raw::RedisModuleKeySpecBeginSearchType_REDISMODULE_KSPEC_BS_INDEX,
        bs: raw::RedisModuleCommandKeySpec__bindgen_ty_1 {
            index: raw::RedisModuleCommandKeySpec__bindgen_ty_1__bindgen_ty_1 { pos: range.first },
        },
        find_keys_type: raw::RedisModuleKeySpecFindKeysType_REDISMODULE_KSPEC_FK_RANGE,
        fk: raw::RedisModuleCommandKeySpec__bindgen_ty_2 {
            range: raw::RedisModuleCommandKeySpec__bindgen_ty_2__bindgen_ty_1 {
                lastkey: if range.last < 0 {
                    range.last
                } else {
                    range.last - range.first
                },
                keystep: range.step,
                limit: 0,
            },
        },
    }
}

/// One key spec whose keys are counted: argv[`index`] is their number, they follow it
/// (firstkey 1 after it, step 1).
fn key_count(flags: u32, index: i32) -> raw::RedisModuleCommandKeySpec {
    raw::RedisModuleCommandKeySpec {
        find_keys_type: raw::RedisModuleKeySpecFindKeysType_REDISMODULE_KSPEC_FK_KEYNUM,
        fk: raw::RedisModuleCommandKeySpec__bindgen_ty_2 {
            keynum: raw::RedisModuleCommandKeySpec__bindgen_ty_2__bindgen_ty_2 {
                keynumidx: 0,
                firstkey: 1,
                keystep: 1,
            },
        },
        ..key_range(
            flags,
            KeyRange {
                first: index,
                last: index,
                step: 1,
            },
        )
    }
}

/// The key spec of a command: its range, or its counted keys.
fn key_spec(flags: u32, search: KeySearch) -> raw::RedisModuleCommandKeySpec {
    match search {
        KeySearch::Range(range) => key_range(flags, range),
        KeySearch::Keynum { index } => key_count(flags, index),
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
    args: &[ArgDoc],
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
            ArgKind::Key => raw::RedisModuleCommandArgType_REDISMODULE_ARG_TYPE_KEY,
            ArgKind::Str => raw::RedisModuleCommandArgType_REDISMODULE_ARG_TYPE_STRING,
            ArgKind::Int => raw::RedisModuleCommandArgType_REDISMODULE_ARG_TYPE_INTEGER,
            ArgKind::Block => raw::RedisModuleCommandArgType_REDISMODULE_ARG_TYPE_BLOCK,
            ArgKind::PureToken => raw::RedisModuleCommandArgType_REDISMODULE_ARG_TYPE_PURE_TOKEN,
            ArgKind::OneOf => raw::RedisModuleCommandArgType_REDISMODULE_ARG_TYPE_ONEOF,
        };
        out.push(raw::RedisModuleCommandArg {
            name: a.name.as_ptr(),
            type_,
            key_spec_index: if matches!(a.kind, ArgKind::Key) {
                0
            } else {
                -1
            },
            token: a.token.map_or(ptr::null(), CStr::as_ptr),
            flags: flags as c_int,
            subargs,
            ..end_of_args()
        });
    }
    out.push(end_of_args());
    out
}

/// Set the arity, key spec and docs of every command of `commands`. Must run in OnLoad,
/// after the commands are created.
pub fn describe_commands(ctx: Ctx<'_>, commands: &[&CommandSpec]) -> Result<(), String> {
    let since = SINCE;
    // The version struct that redismodule.h defines as a static in the header, by hand: its
    // sizes tell the server how to read the arrays.
    let version = raw::RedisModuleCommandInfoVersion {
        version: 1,
        sizeof_historyentry: std::mem::size_of::<raw::RedisModuleCommandHistoryEntry>(),
        sizeof_keyspec: std::mem::size_of::<raw::RedisModuleCommandKeySpec>(),
        sizeof_arg: std::mem::size_of::<raw::RedisModuleCommandArg>(),
    };
    // SAFETY: reading function pointers the server filled in at load; both exist since 7.0,
    // flock's minimum (missing_api refuses older servers).
    let (Some(get_command), Some(set_info)) = (unsafe { raw::RedisModule_GetCommand }, unsafe {
        raw::RedisModule_SetCommandInfo
    }) else {
        return Err("this server lacks RedisModule_SetCommandInfo".to_string());
    };
    for c in commands {
        // SAFETY: ctx is the OnLoad context and name a NUL-terminated command name.
        let cmd = unsafe { get_command(ctx.ptr(), c.name.as_ptr()) };
        if cmd.is_null() {
            return Err(format!("{} is not registered", c.name.to_string_lossy()));
        }
        let mut specs = c.key.map(|access| {
            [
                key_spec(key_flags(access).0, commands::key_search(c)),
                end_of_specs(),
            ]
        });
        let mut keep = Vec::new();
        let mut args = c.summary.map(|_| raw_args(c.args, &mut keep));
        let info = raw::RedisModuleCommandInfo {
            version: &version,
            summary: c.summary.map_or(ptr::null(), CStr::as_ptr),
            complexity: c.summary.map_or(ptr::null(), |_| c.complexity.as_ptr()),
            since: c.summary.map_or(ptr::null(), |_| since.as_ptr()),
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
