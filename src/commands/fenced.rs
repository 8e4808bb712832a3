//! `FLOCK.FENCED key token command [arg ...]`: run `command` only while `token` is the live
//! grant of `key` (G5). The check and the command are one atomic step (Redis runs both on its
//! main thread, one after the other, inside this command).
//!
//! The inner command runs through `RedisModule_Call` with the caller's ACL user (`C`), with
//! script restrictions (`S`: no MULTI/EXEC, no scripts, no commands that cannot run inside
//! another), refused under OOM when it is a deny-oom command (`M`), replies in the caller's
//! protocol (`0`) and errors passed through as they are (`E`), and replicated as the write it
//! made (`!`): FENCED itself, whose outcome depends on the clock, is never replicated.

use crate::effects::WRONGTYPE;
use crate::ffi::{self, Ctx, Key, RStr};
use crate::record::{self, Found};
use crate::{api, server, stats};
use flock_core::state::Mode;
use flock_core::{args, engine};
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
    // SAFETY: the live context of a keys-position request; position 1 is inside argv.
    unsafe { api!(RedisModule_KeyAtPosWithFlags, (); ctx, 1, read_only) };
    if argc < 4 {
        return;
    }
    // SAFETY: argc >= 4, so argv + 3 is inside the argument vector.
    let inner = unsafe { argv.add(3) };
    let mut n: c_int = 0;
    let mut flags: *mut c_int = ptr::null_mut();
    // SAFETY: `inner` points to the `argc - 3` arguments of the inner command; Redis fills
    // `n`, and `flags` with an array it allocates (freed below).
    let positions = unsafe {
        api!(RedisModule_GetCommandKeysWithFlags, ptr::null_mut();
            ctx, inner, argc - 3, &mut n, &mut flags)
    };
    if positions.is_null() {
        return;
    }
    for i in 0..n.max(0) as usize {
        // SAFETY: Redis returned arrays of `n` positions and flags (freed below).
        let pos = unsafe { *positions.add(i) };
        let key_flags = if flags.is_null() {
            (raw::REDISMODULE_CMD_KEY_RW | raw::REDISMODULE_CMD_KEY_ACCESS) as c_int
        } else {
            // SAFETY: as above.
            unsafe { *flags.add(i) }
        };
        if pos >= 0 && pos + 3 < argc {
            // SAFETY: a position inside argv (checked just above).
            unsafe { api!(RedisModule_KeyAtPosWithFlags, (); ctx, pos + 3, key_flags) };
        }
    }
    // SAFETY: the arrays Redis allocated for us, each freed once.
    unsafe {
        api!(RedisModule_Free, (); positions.cast());
        if !flags.is_null() {
            api!(RedisModule_Free, (); flags.cast());
        }
    }
}

/// Whether the inner command (argv from the command name on) names `lock_key` as a key: a
/// fenced write to the lock itself would overwrite or delete the lock it is fenced by.
fn touches_lock_key(ctx: Ctx, inner: &mut [RStr], lock_key: &[u8]) -> bool {
    let mut n: c_int = 0;
    // SAFETY: a live command context; `inner` holds the inner command's argument handles.
    let positions = unsafe {
        api!(RedisModule_GetCommandKeys, ptr::null_mut();
            ctx, inner.as_mut_ptr(), inner.len() as c_int, &mut n)
    };
    if positions.is_null() {
        return false;
    }
    let mut touches = false;
    for i in 0..n.max(0) as usize {
        // SAFETY: Redis returned an array of `n` positions (freed below).
        let pos = unsafe { *positions.add(i) };
        if let Some(arg) = usize::try_from(pos).ok().and_then(|p| inner.get(p)) {
            touches |= ffi::bytes(arg) == lock_key;
        }
    }
    // SAFETY: the array Redis allocated for us, freed once.
    unsafe { api!(RedisModule_Free, (); positions.cast()) };
    touches
}

pub unsafe extern "C" fn command(ctx: Ctx, argv: *mut RStr, argc: c_int) -> c_int {
    // SAFETY: the live context of this command.
    if unsafe { api!(RedisModule_IsKeysPositionRequest, 0; ctx) } != 0 {
        report_keys(ctx, argv, argc);
        return raw::REDISMODULE_OK as c_int;
    }
    // SAFETY: Redis passes `argc` argument strings that live while the command runs.
    let args = unsafe { ffi::argv_slice(argv, argc) };
    let [_, key_name, token_arg, cmd, rest @ ..] = args else {
        return ffi::wrong_arity(ctx);
    };
    let token = match args::parse_token(ffi::bytes(token_arg)) {
        Ok(t) => t,
        Err(e) => return ffi::reply_error_string(ctx, &e.message()),
    };
    let rest_bytes: Vec<&[u8]> = rest.iter().map(ffi::bytes).collect();
    if let Some(what) = args::fenced_refusal(ffi::bytes(cmd), &rest_bytes) {
        return ffi::reply_error_string(
            ctx,
            &format!(
                "ERR FLOCK.FENCED refuses '{}': {what} cannot run inside it",
                String::from_utf8_lossy(ffi::bytes(cmd)).to_lowercase()
            ),
        );
    }
    let mut inner_argv: Vec<RStr> = std::iter::once(*cmd).chain(rest.iter().copied()).collect();
    if touches_lock_key(ctx, &mut inner_argv, ffi::bytes(key_name)) {
        return ffi::reply_error_static(ctx, c"ERR FLOCK.FENCED cannot touch its own lock key");
    }
    let grant_mode = {
        let key = Key::open(ctx, *key_name, false);
        match record::lock_of(&key) {
            Found::OtherType => return ffi::reply_error_static(ctx, WRONGTYPE),
            Found::Nothing => None,
            Found::Lock(rec) => engine::fence(Some(&*rec), token, server::now()),
        }
    };
    let Some(grant_mode) = grant_mode else {
        stats::FENCED_REJECTED.incr();
        return ffi::reply_error_string(
            ctx,
            &format!(
                "FENCED token {token} is not the live grant of {}",
                String::from_utf8_lossy(ffi::bytes(key_name))
            ),
        );
    };
    // A reader must not write under a read lock (G5): Redis itself refuses every command
    // flagged `write` when RM_Call gets `W`, scripts and module commands included.
    let read_only = grant_mode == Mode::Shared;
    // The command name as a C string for RM_Call.
    let mut name: Vec<u8> = ffi::bytes(cmd)
        .iter()
        .copied()
        .filter(|&b| b != 0)
        .collect();
    name.push(0);
    let mut inner: Vec<RStr> = rest.to_vec();
    // SAFETY: a live command context; `name` is NUL-terminated; "v" takes the vector of
    // `inner.len()` string handles (the caller's arguments, alive during the call).
    let flags = if read_only { c"CSMEW0!v" } else { c"CSME0!v" };
    let reply = unsafe {
        api!(RedisModule_Call, ptr::null_mut();
            ctx,
            name.as_ptr().cast::<c_char>(),
            flags.as_ptr(),
            inner.as_mut_ptr(),
            inner.len()
        )
    };
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
    // SAFETY: the live reply made above (freed below).
    let is_error = unsafe { api!(RedisModule_CallReplyType, 0; reply) }
        == raw::REDISMODULE_REPLY_ERROR as c_int;
    if is_error && read_only && refused_as_write(reply) {
        stats::FENCED_REJECTED.incr();
        // SAFETY: the live reply made above, freed once.
        unsafe { api!(RedisModule_FreeCallReply, (); reply) };
        return ffi::reply_error_static(
            ctx,
            c"ERR FLOCK.FENCED with a shared grant runs read-only commands only",
        );
    }
    if is_error {
        stats::FENCED_INNER_ERRORS.incr();
    } else {
        stats::FENCED_ACCEPTED.incr();
    }
    // SAFETY: the live reply, passed on to the caller, then freed once.
    unsafe {
        api!(RedisModule_ReplyWithCallReply, 0; ctx, reply);
        api!(RedisModule_FreeCallReply, (); reply);
    }
    raw::REDISMODULE_OK as c_int
}

/// Whether an error reply of RM_Call is its refusal of a write command under `W` (Redis and
/// Valkey word it "Write command '...' was called while write is not allowed.").
fn refused_as_write(reply: *mut raw::RedisModuleCallReply) -> bool {
    let mut len = 0usize;
    // SAFETY: a live error reply; the pointer is valid while the reply lives (not kept).
    let p = unsafe { api!(RedisModule_CallReplyStringPtr, ptr::null(); reply, &mut len) };
    if p.is_null() {
        return false;
    }
    // SAFETY: `len` bytes at `p`, owned by the live reply.
    let text = unsafe { std::slice::from_raw_parts(p.cast::<u8>(), len) };
    text.windows(b"write is not allowed".len())
        .any(|w| w == b"write is not allowed")
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
