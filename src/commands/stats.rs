//! `FLOCK.STATS GET [class ...]`, `FLOCK.STATS RESET` and `FLOCK.STATS HELP`: the per-class
//! lock statistics for sizing TTLs (flock-core's `lock_stats`; `server::stats::record` fills
//! them in).
//! Subcommands, so an ACL can allow `flock.stats|get` alone.

use crate::ffi::{self, Ctx, RStr, Status};
use crate::server::stats;
use flock_core::commands;
use flock_core::lock_stats::Out;

/// `FLOCK.STATS GET [class ...]`: argv is `FLOCK.STATS GET class...`.
pub fn get(ctx: Ctx<'_>, args: &[RStr<'_>]) -> Status {
    let names: Vec<&[u8]> = args.iter().skip(2).map(ffi::bytes).collect();
    let report = stats::with_classes(|t| t.report((!names.is_empty()).then_some(names.as_slice())));
    send(ctx, &report)
}

/// `FLOCK.STATS RESET`.
pub fn reset(ctx: Ctx<'_>, args: &[RStr<'_>]) -> Status {
    if args.len() != 2 {
        return ffi::wrong_arity(ctx);
    }
    stats::with_classes(|t| t.reset());
    ffi::reply_simple(ctx, c"OK")
}

/// `FLOCK.STATS HELP`: the subcommands, one status line each (Redis's own error for an unknown
/// subcommand of a container sends users here).
pub fn help(ctx: Ctx<'_>, args: &[RStr<'_>]) -> Status {
    if args.len() != 2 {
        return ffi::wrong_arity(ctx);
    }
    ffi::reply_array(ctx, commands::STATS_HELP_LINES.len());
    for line in commands::STATS_HELP_LINES {
        ffi::reply_simple(ctx, line);
    }
    Status::OK
}

/// A reply tree as RESP: maps are maps in RESP3 and flat arrays in RESP2 (RM_ReplyWithMap).
fn send(ctx: Ctx<'_>, out: &Out) -> Status {
    match out {
        Out::Int(v) => ffi::reply_int(ctx, i64::try_from(*v).unwrap_or(i64::MAX)),
        Out::Nil => ffi::reply_null(ctx),
        Out::Arr(items) => {
            ffi::reply_array(ctx, items.len());
            for i in items {
                send(ctx, i);
            }
            Status::OK
        }
        Out::Map(fields) => {
            ffi::reply_map(ctx, fields.len());
            for (k, v) in fields {
                ffi::reply_bulk(ctx, k);
                send(ctx, v);
            }
            Status::OK
        }
    }
}
