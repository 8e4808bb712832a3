//! Deterministic copies (G7): the effect command `FLOCK.APPLY` that the master replicates and
//! that AOF rewrite emits, carrying a [`Snapshot`] of the key: its kind, who holds it with
//! which tokens until when (absolute wall-clock deadlines), and its delayed slots. An
//! exclusive key keeps v1's short forms (`GRANT`, with `BOUND` for a bound grant, `DELAY`);
//! every other key is sent whole (`STATE`). Nothing clock-dependent is ever replicated
//! verbatim. The reverse, `FLOCK.APPLY` on a replica, parses back into the same `Snapshot`.
//! The argument lists themselves are written by `ffi/replicate.rs`.

use crate::ffi::{self, Aof, Ctx, RStr};
use crate::server;
use flock_core::Snapshot;
use std::sync::atomic::{AtomicBool, Ordering};

/// Replicate (to replicas and the AOF) that `key` is now as `snapshot` says.
pub fn state(ctx: Ctx<'_>, key: RStr<'_>, snapshot: Snapshot<'_>) {
    if server::replication_consumed() {
        ffi::replicate_state(ctx, key, snapshot);
    }
}

/// A token mark waits to be sent ([`mark_soon`]).
static MARK_PENDING: AtomicBool = AtomicBool::new(false);

/// Send the token mark to replicas and the AOF from the next cron tick ([`send_pending_mark`]):
/// replicas and the AOF then know it even when no key carries it.
///
/// Why not at once: the events that ask for it (a promotion, the end of loading, a fork) can
/// fire inside a command (REPLICAOF NO ONE, DEBUG RELOAD, BGREWRITEAOF, BGSAVE), and Redis then
/// propagates that command along with what the module replicates (tried on Redis 7.0: a
/// BGREWRITEAOF wrapped with the mark in MULTI/EXEC in the new AOF). From the cron the mark goes
/// alone. Until then the mark travels anyway with every grant made (its token is above it).
pub fn mark_soon() {
    MARK_PENDING.store(true, Ordering::Relaxed);
}

/// From the cron: send the mark [`mark_soon`] asked for, if any (`FLOCK.APPLY MARK`). Sent
/// whether or not anything consumes replication now: it is rare, and a replica that attaches
/// later gets the mark with its full sync (RDB aux data) anyway.
pub fn send_pending_mark(ctx: Ctx<'_>) {
    if MARK_PENDING.swap(false, Ordering::Relaxed) && server::is_master() {
        let mark = server::tokens().high_water();
        ffi::replicate_mark(ctx, mark);
    }
}

/// Replicate that `key` left the keyspace (release, expiry).
pub fn delete(ctx: Ctx<'_>, key: RStr<'_>) {
    if server::replication_consumed() {
        ffi::replicate_delete(ctx, key);
    }
}

/// Pass the command being run on as it is (a replica passing its master's effect on to its
/// own AOF and sub-replicas: the effect is deterministic).
pub fn verbatim(ctx: Ctx<'_>) {
    ffi::replicate_verbatim(ctx);
}

/// The same effect, written by AOF rewrite.
pub fn emit_aof(aof: Aof<'_>, key: RStr<'_>, snapshot: Snapshot<'_>) {
    ffi::emit_aof(aof, key, snapshot);
}

/// Only the replication stream and AOF loading may apply effects: a client that could call
/// `FLOCK.APPLY` could forge tokens.
pub fn caller_may_apply(ctx: Ctx<'_>) -> bool {
    let flags = ctx.flags();
    flags.is_replicated() || flags.is_loading()
}
