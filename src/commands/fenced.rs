//! `FLOCK.FENCED key token command [arg ...]`: run `command` only while `token` is the live
//! grant of `key` (G5). The check and the command are one atomic step (Redis runs both on its
//! main thread, one after the other, inside this command).
//!
//! The inner command runs through `RedisModule_Call` with the caller's ACL user (`C`), with
//! script restrictions (`S`: no MULTI/EXEC, no scripts, no commands that cannot run inside
//! another), refused under OOM when it is a deny-oom command (`M`), replies in the caller's
//! protocol (`0`) and errors passed through as they are (`E`), and replicated as the write it
//! made (`!`): FENCED itself, whose outcome depends on the clock, is never replicated.

use crate::ffi::block::{self, Found};
use crate::ffi::{self, CallReply, Ctx, Key, KeyFlags, KeysRequest, RStr, Status};
use crate::server::{self, stats};
use flock_core::errors::Fixed;
use flock_core::state::Mode;
use flock_core::{args, engine};
use std::ffi::c_int;
use std::ffi::CStr;

/// FLOCK.FENCED, a getkeys-api command.
pub struct Fenced;

impl ffi::Command for Fenced {
    const GETKEYS: bool = true;

    fn run(ctx: Ctx<'_>, args: &[RStr<'_>]) -> Status {
        command(ctx, args)
    }

    fn keys(req: KeysRequest<'_>, args: &[RStr<'_>]) {
        report_keys(req, args);
    }
}

/// Report key positions (getkeys-api) with what the command does to each key, so that ACL
/// asks for no more than it must: the lock key is only read (`%R~` suffices for it); the inner
/// command's keys carry the flags the inner command declares.
/// Only positions inside argv are reported: servers index argv with them (Valkey 9 crashes on
/// a position past the end).
fn report_keys(req: KeysRequest<'_>, args: &[RStr<'_>]) {
    let argc = args.len() as c_int;
    if argc < 2 {
        return;
    }
    // Position 1 is inside argv.
    req.key_at(1, KeyFlags::RO.and(KeyFlags::ACCESS));
    // The inner command's arguments (argc >= 4: argv + 3 is inside the argument vector).
    let Some(inner) = args.get(3..).filter(|_| argc >= 4) else {
        return;
    };
    let Some(keys) = ffi::command_keys_with_flags(req.ctx(), inner) else {
        return;
    };
    for (pos, flags) in keys.iter() {
        let key_flags = flags.unwrap_or(KeyFlags::RW.and(KeyFlags::ACCESS));
        if pos >= 0 && pos + 3 < argc {
            // A position inside argv (checked just above).
            req.key_at(pos + 3, key_flags);
        }
    }
}

/// Whether the inner command (argv from the command name on) names `lock_key` as a key: a
/// fenced write to the lock itself would overwrite or delete the lock it is fenced by.
fn touches_lock_key(ctx: Ctx<'_>, inner: &[RStr<'_>], lock_key: &[u8]) -> bool {
    let Some(keys) = ffi::command_keys(ctx, inner) else {
        return false;
    };
    let mut touches = false;
    for (pos, _) in keys.iter() {
        if let Some(arg) = usize::try_from(pos).ok().and_then(|p| inner.get(p)) {
            touches |= ffi::bytes(arg) == lock_key;
        }
    }
    touches
}

fn command(ctx: Ctx<'_>, args: &[RStr<'_>]) -> Status {
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
    let inner_argv: Vec<RStr<'_>> = std::iter::once(*cmd).chain(rest.iter().copied()).collect();
    if touches_lock_key(ctx, &inner_argv, ffi::bytes(key_name)) {
        return ffi::reply_error_static(ctx, c"ERR FLOCK.FENCED cannot touch its own lock key");
    }
    let grant_mode = {
        let key = Key::open(ctx, *key_name, false);
        match block::lock_of(&key) {
            Found::OtherType => return ffi::reply_error_static(ctx, Fixed::WrongType.text()),
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
    // "v": the vector of the caller's argument handles (alive during the call).
    let flags = if read_only { c"CSMEW0!v" } else { c"CSME0!v" };
    let reply = CStr::from_bytes_with_nul(&name)
        .ok()
        .and_then(|name| ffi::call_argv(ctx, name, flags, rest));
    let Some(reply) = reply else {
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
    };
    let is_error = reply.is_error();
    if is_error && read_only && refused_as_write(&reply) {
        stats::FENCED_REJECTED.incr();
        drop(reply);
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
    // Passed on to the caller, then freed.
    let _ = reply.reply_to(ctx);
    Status::OK
}

/// Whether an error reply of RM_Call is its refusal of a write command under `W` (Redis and
/// Valkey word it "Write command '...' was called while write is not allowed.").
fn refused_as_write(reply: &CallReply) -> bool {
    let Some(text) = reply.text() else {
        return false;
    };
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
