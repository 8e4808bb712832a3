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
use flock_core::args;
use flock_core::errors::{CallErrno, Fixed, Formatted};
use flock_core::fence::{self, Access};
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
        let refusal = Formatted::FencedRefuses {
            command: ffi::bytes(cmd),
            what,
        };
        return ffi::reply_error_string(ctx, &refusal.message());
    }
    let inner_argv: Vec<RStr<'_>> = std::iter::once(*cmd).chain(rest.iter().copied()).collect();
    if touches_lock_key(ctx, &inner_argv, ffi::bytes(key_name)) {
        return ffi::reply_error_static(ctx, Fixed::FencedOwnKey.text());
    }
    let access = {
        let key = Key::open(ctx, *key_name, false);
        match block::lock_of(&key) {
            Found::OtherType => return ffi::reply_error_static(ctx, Fixed::WrongType.text()),
            Found::Nothing => fence::access(None, token, server::now()),
            Found::Lock(rec) => fence::access(Some(&*rec), token, server::now()),
        }
    };
    let read_only = match access {
        Access::Refused => {
            stats::FENCED_REJECTED.incr();
            let stale = Formatted::FencedStale {
                token,
                key: ffi::bytes(key_name),
            };
            return ffi::reply_error_string(ctx, &stale.message());
        }
        Access::ReadWrite => false,
        // Redis itself refuses every command flagged `write` when RM_Call gets `W`, scripts
        // and module commands included.
        Access::ReadOnly => true,
    };
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
        let errno = std::io::Error::last_os_error().raw_os_error().unwrap_or(0);
        let refused = Fixed::of_call_errno(call_errno(errno));
        return ffi::reply_error_static(ctx, refused.text());
    };
    let is_error = reply.is_error();
    if is_error && read_only && refused_as_write(&reply) {
        stats::FENCED_REJECTED.incr();
        drop(reply);
        return ffi::reply_error_static(ctx, Fixed::FencedSharedWrite.text());
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

/// Whether an error reply of RM_Call is its refusal of a write command under `W`.
fn refused_as_write(reply: &CallReply) -> bool {
    reply.text().is_some_and(fence::is_write_refusal)
}

/// The platform's errno of a failed RM_Call, as the error table names it (Linux values).
fn call_errno(errno: i32) -> CallErrno {
    match errno {
        2 => CallErrno::NoEntry,
        13 => CallErrno::Access,
        22 => CallErrno::Invalid,
        28 => CallErrno::NoSpace,
        29 => CallErrno::Seek,
        30 => CallErrno::ReadOnly,
        _ => CallErrno::Other,
    }
}
