//! `FLOCK.FENCED key token command [arg ...]`: run `command` only while `token` is the live
//! grant of `key` (G5). The check and the command are one atomic step (Redis runs both on its
//! main thread, one after the other, inside this command).
//!
//! The inner command runs through `RedisModule_Call` with the caller's ACL user (`C`), with
//! script restrictions (`S`: no MULTI/EXEC, no scripts, no commands that cannot run inside
//! another), refused under OOM when it is a deny-oom command (`M`), replies in the caller's
//! protocol (`0`) and errors passed through as they are (`E`), and replicated as the write it
//! made (`!`): FENCED itself, whose outcome depends on the clock, is never replicated.

use crate::ffi::{self, Ctx, Key, KeyKind, RStr};
use crate::lock_type::LockRecord;
use crate::{args, rm, server, stats};
use redis_module::raw;
use std::os::raw::{c_char, c_int};
use std::ptr;

/// Report key positions (getkeys-api) with what the command does to each key, so that ACL
/// asks for no more than it must: the lock key is only read (`%R~` suffices for it); the inner
/// command's keys carry the flags the inner command declares.
/// Only positions inside argv are reported: servers index argv with them (Valkey 9 crashes on
/// a position past the end).
fn report_keys(ctx: Ctx, argv: *mut RStr, argc: c_int) {
    if argc < 2 {
        return;
    }
    let read_only = (raw::REDISMODULE_CMD_KEY_RO | raw::REDISMODULE_CMD_KEY_ACCESS) as c_int;
    rm!(RedisModule_KeyAtPosWithFlags, (); ctx, 1, read_only);
    if argc < 4 {
        return;
    }
    let inner = unsafe { argv.add(3) };
    let mut n: c_int = 0;
    let mut flags: *mut c_int = ptr::null_mut();
    let positions = rm!(RedisModule_GetCommandKeysWithFlags, ptr::null_mut();
        ctx, inner, argc - 3, &mut n, &mut flags);
    if positions.is_null() {
        return;
    }
    for i in 0..n.max(0) as usize {
        let pos = unsafe { *positions.add(i) };
        let key_flags = if flags.is_null() {
            (raw::REDISMODULE_CMD_KEY_RW | raw::REDISMODULE_CMD_KEY_ACCESS) as c_int
        } else {
            unsafe { *flags.add(i) }
        };
        if pos >= 0 && pos + 3 < argc {
            rm!(RedisModule_KeyAtPosWithFlags, (); ctx, pos + 3, key_flags);
        }
    }
    rm!(RedisModule_Free, (); positions.cast());
    if !flags.is_null() {
        rm!(RedisModule_Free, (); flags.cast());
    }
}

/// Whether the inner command (argv from the command name on) names `lock_key` as a key: a
/// fenced write to the lock itself would overwrite or delete the lock it is fenced by.
fn touches_lock_key(ctx: Ctx, inner: &mut [RStr], lock_key: &[u8]) -> bool {
    let mut n: c_int = 0;
    let positions = rm!(RedisModule_GetCommandKeys, ptr::null_mut();
        ctx, inner.as_mut_ptr(), inner.len() as c_int, &mut n);
    if positions.is_null() {
        return false;
    }
    let mut touches = false;
    for i in 0..n.max(0) as usize {
        let pos = unsafe { *positions.add(i) };
        if let Some(arg) = usize::try_from(pos).ok().and_then(|p| inner.get(p)) {
            touches |= ffi::bytes(*arg) == lock_key;
        }
    }
    rm!(RedisModule_Free, (); positions.cast());
    touches
}

pub unsafe extern "C" fn command(ctx: Ctx, argv: *mut RStr, argc: c_int) -> c_int {
    if rm!(RedisModule_IsKeysPositionRequest, 0; ctx) != 0 {
        report_keys(ctx, argv, argc);
        return raw::REDISMODULE_OK as c_int;
    }
    let args = unsafe { ffi::argv_slice(argv, argc) };
    let [_, key_name, token_arg, cmd, rest @ ..] = args else {
        return ffi::wrong_arity(ctx);
    };
    let token = match args::parse_token(ffi::bytes(*token_arg)) {
        Ok(t) => t,
        Err(e) => return ffi::reply_error_string(ctx, &e.message()),
    };
    let rest_bytes: Vec<&[u8]> = rest.iter().map(|a| ffi::bytes(*a)).collect();
    if let Some(what) = args::fenced_refusal(ffi::bytes(*cmd), &rest_bytes) {
        return ffi::reply_error_string(
            ctx,
            &format!(
                "ERR FLOCK.FENCED refuses '{}': {what} cannot run inside it",
                String::from_utf8_lossy(ffi::bytes(*cmd)).to_lowercase()
            ),
        );
    }
    let mut inner_argv: Vec<RStr> = std::iter::once(*cmd).chain(rest.iter().copied()).collect();
    if touches_lock_key(ctx, &mut inner_argv, ffi::bytes(*key_name)) {
        return ffi::reply_error_static(ctx, "ERR FLOCK.FENCED cannot touch its own lock key\0");
    }
    let live = {
        let key = Key::open(ctx, *key_name, false);
        match key.kind(server::lock_type()) {
            KeyKind::Other => {
                return ffi::reply_error_static(
                    ctx,
                    "WRONGTYPE Operation against a key holding the wrong kind of value\0",
                )
            }
            KeyKind::Empty => false,
            KeyKind::Ours => unsafe { key.value::<LockRecord>().as_ref() }
                .is_some_and(|rec| rec.state.check(token, server::now()) > 0),
        }
    };
    if !live {
        stats::FENCED_REJECTED.incr();
        return ffi::reply_error_string(
            ctx,
            &format!(
                "FENCED token {token} is not the live grant of {}",
                String::from_utf8_lossy(ffi::bytes(*key_name))
            ),
        );
    }
    // The command name as a C string for RM_Call.
    let mut name: Vec<u8> = ffi::bytes(*cmd)
        .iter()
        .copied()
        .filter(|&b| b != 0)
        .collect();
    name.push(0);
    let mut inner: Vec<RStr> = rest.to_vec();
    let reply = rm!(RedisModule_Call, ptr::null_mut();
        ctx,
        name.as_ptr().cast::<c_char>(),
        c"CSME0!v".as_ptr(),
        inner.as_mut_ptr(),
        inner.len()
    );
    if reply.is_null() {
        stats::FENCED_REJECTED.incr();
        let err = std::io::Error::last_os_error().raw_os_error().unwrap_or(0);
        let msg = match err {
            libc_errno::ENOENT => "ERR unknown command inside FLOCK.FENCED",
            libc_errno::EINVAL => {
                "ERR wrong number of arguments for the command inside FLOCK.FENCED"
            }
            libc_errno::EACCES => {
                "NOPERM this user has no permissions to run the command or touch its keys"
            }
            libc_errno::ENOSPC => "OOM command not allowed when used memory > 'maxmemory'",
            libc_errno::EROFS => "READONLY You can't write against a read only replica",
            libc_errno::ESPIPE => "CROSSSLOT Keys in request don't hash to the same slot",
            _ => "ERR the command inside FLOCK.FENCED could not run",
        };
        return ffi::reply_error_string(ctx, msg);
    }
    let is_error =
        rm!(RedisModule_CallReplyType, 0; reply) == raw::REDISMODULE_REPLY_ERROR as c_int;
    if is_error {
        stats::FENCED_INNER_ERRORS.incr();
    } else {
        stats::FENCED_ACCEPTED.incr();
    }
    rm!(RedisModule_ReplyWithCallReply, 0; ctx, reply);
    rm!(RedisModule_FreeCallReply, (); reply);
    raw::REDISMODULE_OK as c_int
}

/// The errno values RM_Call sets (Linux).
mod libc_errno {
    pub const ENOENT: i32 = 2;
    pub const EACCES: i32 = 13;
    pub const EINVAL: i32 = 22;
    pub const ENOSPC: i32 = 28;
    pub const ESPIPE: i32 = 29;
    pub const EROFS: i32 = 30;
}
