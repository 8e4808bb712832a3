//! Server-wide state of the module: the token issuer, the role, the clocks, the replication
//! consumers; with the configs' live values (`config.rs`) and the counters (`stats.rs`).
//!
//! Redis runs module commands, callbacks and timers on its main thread; the only other thread
//! that can reach module code is a lazy-free thread calling the type's `free` (FLUSHALL ASYNC),
//! which touches none of this but [`on_main_thread`].

pub mod config;
pub mod migration;
pub mod stats;

use crate::ffi::{self, Ctx};
use flock_core::{Now, TokenIssuer};
use std::cell::Cell;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Mutex, MutexGuard};

static TOKENS: Mutex<TokenIssuer> = Mutex::new(TokenIssuer::new());
static IS_MASTER: AtomicBool = AtomicBool::new(true);

/// The server-wide token issuer (G3).
pub fn tokens() -> MutexGuard<'static, TokenIssuer> {
    TOKENS
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// Called once from the module's init, on the main thread.
pub fn init(ctx: Ctx<'_>) {
    ON_MAIN_THREAD.with(|m| m.set(true));
    ffi::init_module_ctx(ctx);
    refresh_role(ctx);
}

thread_local! {
    /// Set on the thread that loaded the module (Redis's main thread). A thread-local flag:
    /// `free` asks on every release, and `std::thread::current()` costs an `Arc` round trip.
    static ON_MAIN_THREAD: Cell<bool> = const { Cell::new(false) };
}

pub fn on_main_thread() -> bool {
    ON_MAIN_THREAD.with(Cell::get)
}

/// Whether this server is a master: only a master expires leases on its own.
pub fn is_master() -> bool {
    IS_MASTER.load(Ordering::Relaxed)
}

pub fn refresh_role(ctx: Ctx<'_>) {
    IS_MASTER.store(ctx.flags().is_master(), Ordering::Relaxed);
}

/// Both clocks, read once per command (the wall clock as Redis reads it, and Redis's
/// monotonic clock).
#[inline]
pub fn now() -> Now {
    ffi::now()
}

pub fn set_master(master: bool) {
    IS_MASTER.store(master, Ordering::Relaxed);
}

/// Whether anything consumes the replication stream: an AOF, replicas, a replication
/// backlog (which replicas partially resync from), or a slot export (Valkey 9). When nothing does, effects are not built
/// at all (building them costs as much as the rest of ACQUIRE). Starts true, is raised at once
/// by every event that can start a consumer (a fork for BGSAVE or replica sync, an AOF
/// rewrite, a replica change, a role or config change, loading), and lowered only by
/// [`recheck_replication`] when INFO shows none.
static REPLICATION_CONSUMED: AtomicBool = AtomicBool::new(true);

pub fn replication_consumed() -> bool {
    REPLICATION_CONSUMED.load(Ordering::Relaxed)
}

pub fn assume_replication_consumed() {
    REPLICATION_CONSUMED.store(true, Ordering::Relaxed);
}

/// Look at INFO: with no AOF, no replica and no replication backlog, stop building effects.
/// Never while a slot export streams effects to its target (Valkey feeds the export from what
/// is propagated: an effect not built would never reach the target).
pub fn recheck_replication(ctx: Ctx<'_>) {
    let quiet = !migration::exporting()
        && ffi::server_info_field(ctx, c"persistence", c"aof_enabled") == Some(0)
        && ffi::server_info_field(ctx, c"replication", c"repl_backlog_active") == Some(0)
        && ffi::server_info_field(ctx, c"replication", c"connected_slaves") == Some(0);
    REPLICATION_CONSUMED.store(!quiet, Ordering::Relaxed);
}

/// True while clients are paused (CLIENT PAUSE, or a cluster manual failover waiting for the
/// replica's offset to match): timers and deferred jobs then wait, since effects they would
/// replicate keep the offsets from ever matching. Commands still check leases lazily.
pub fn avoid_replica_traffic() -> bool {
    ffi::avoid_replica_traffic()
}
