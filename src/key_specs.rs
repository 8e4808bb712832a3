//! What each command does to its key, told to the server with `RedisModule_SetCommandInfo`
//! (Redis 7.0+, Valkey): key specs and arity.
//!
//! ACL checks a command's keys by these flags. `RedisModule_CreateCommand`'s legacy
//! first/last/step key range counts as read-write access, so without a spec a user with
//! read-only key access (`%R~orders:*`) could not even call FLOCK.CHECK. FLOCK.FENCED reports
//! its keys itself (getkeys-api) with per-key flags: see `fenced::report_keys`.

use crate::ffi::Ctx;
use redis_module::raw;
use std::os::raw::c_int;

const RO: u32 = raw::REDISMODULE_CMD_KEY_RO | raw::REDISMODULE_CMD_KEY_ACCESS;
const RW_UPDATE: u32 =
    raw::REDISMODULE_CMD_KEY_RW | raw::REDISMODULE_CMD_KEY_ACCESS | raw::REDISMODULE_CMD_KEY_UPDATE;
const RW_DELETE: u32 =
    raw::REDISMODULE_CMD_KEY_RW | raw::REDISMODULE_CMD_KEY_ACCESS | raw::REDISMODULE_CMD_KEY_DELETE;
/// The effect command overwrites the key with the master's state, reading nothing.
const OW_UPDATE: u32 = raw::REDISMODULE_CMD_KEY_OW | raw::REDISMODULE_CMD_KEY_UPDATE;

/// (command, arity as Redis counts it, flags of the key at argv[1]).
const COMMANDS: [(&std::ffi::CStr, c_int, u32); 7] = [
    (c"flock.acquire", -4, RW_UPDATE),
    (c"flock.release", -3, RW_DELETE),
    (c"flock.renew", -4, RW_UPDATE),
    (c"flock.check", 3, RO),
    (c"flock.info", 2, RO),
    (c"flock.revoke", -2, RW_DELETE),
    (c"flock.apply", -3, OW_UPDATE),
];

/// One key spec: the key at argv[1], and nothing else.
fn first_key(flags: u32) -> raw::RedisModuleCommandKeySpec {
    raw::RedisModuleCommandKeySpec {
        notes: std::ptr::null(),
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

/// Set the arity and key spec of every command but FLOCK.FENCED. Must run in OnLoad, after
/// the commands are created.
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
    let (Some(get_command), Some(set_info)) =
        (unsafe { raw::RedisModule_GetCommand }, unsafe { raw::RedisModule_SetCommandInfo })
    else {
        return Err("this server lacks RedisModule_SetCommandInfo".to_string());
    };
    for (name, arity, flags) in COMMANDS {
        // SAFETY: ctx is the OnLoad context and name a NUL-terminated command name.
        let cmd = unsafe { get_command(ctx, name.as_ptr()) };
        if cmd.is_null() {
            return Err(format!("{} is not registered", name.to_string_lossy()));
        }
        let mut specs = [first_key(flags), end_of_specs()];
        let info = raw::RedisModuleCommandInfo {
            version: &version,
            summary: std::ptr::null(),
            complexity: std::ptr::null(),
            since: std::ptr::null(),
            history: std::ptr::null_mut(),
            tips: std::ptr::null(),
            arity,
            key_specs: specs.as_mut_ptr(),
            args: std::ptr::null_mut(),
        };
        // SAFETY: info and the arrays it points to live until the call returns; the server
        // copies what it keeps.
        if unsafe { set_info(cmd, &info) } != raw::REDISMODULE_OK as c_int {
            return Err(format!(
                "the server refused the key spec of {}",
                name.to_string_lossy()
            ));
        }
    }
    Ok(())
}
