//! What happens to lock keys outside their commands: keyspace and server events, a key's
//! deadline coming due (`expiry.rs` calls [`on_due`]) and deferred looks at waited keys
//! (`jobs.rs` calls [`revisit`]). Each runs the engine through the executor.

use crate::commands::{executor, macquire};
use crate::ffi::block::{self, Found, KeyId, RecordPtr};
use crate::ffi::{self, Ctx, Key, KeyKind, NotifyClasses, RStr, RString, ServerEvent};
use crate::peers::cluster;
use crate::peers::replication;
use crate::server::migration as moving;
use crate::server::{self, config};
use crate::store::bindings;
use crate::store::expiry::{self, Arming, DueKey};
use crate::waiting::jobs::{self, Job, Task};
use crate::waiting::{waiters, watchers};
use flock_core::engine::{self, RevisitPlan};
use flock_core::keyspace::{self, Arrival, ServerChange, Step};
use flock_core::migration::{self, MoveStep, SlotMove, SlotRanges};
use flock_core::watch::{self, ServerStep};
use std::sync::atomic::{AtomicI32, Ordering};

/// Generic keyspace events (rename, move, restore, copy, del), expiry and eviction: what can
/// move a lock or take it away. A lock value overwritten by another type is noticed in the
/// type's free callback instead, so that plain writes (SET, HSET, ...) of other keys pay
/// nothing for flock.
pub const SUBSCRIBED: NotifyClasses = NotifyClasses::GENERIC
    .and(NotifyClasses::EXPIRED)
    .and(NotifyClasses::EVICTED);

/// The keyspace and server events flock follows.
pub struct Events;

impl ffi::EventHandler for Events {
    fn keyspace(ctx: Ctx<'_>, event: &[u8], key: RStr<'_>) {
        on_keyspace_event(ctx, event, key);
    }

    fn server(ctx: Ctx<'_>, event: ServerEvent) {
        on_server_event(ctx, event);
    }

    fn slot_migration(ctx: Ctx<'_>, subevent: u64, ranges: &[(i64, i64)]) {
        on_slot_migration(ctx, subevent, ranges);
    }
}

/// The database MOVE moved a key from ("move_from" comes just before "move_to"), -1 when none.
static MOVE_SOURCE_DB: AtomicI32 = AtomicI32::new(-1);

thread_local! {
    /// The key RENAME renamed ("rename_from" comes just before "rename_to", on the main
    /// thread): the bindings of the grants that arrive are found under it.
    static RENAME_SOURCE: std::cell::RefCell<Option<KeyId>> = const { std::cell::RefCell::new(None) };
}

/// A lock put under a new name, database or value (RESTORE, COPY, RENAME, MOVE) gets its
/// timer there. A key with waiters that was deleted, flushed, renamed away or overwritten is
/// looked at again right after the command: its waiters get the lock or an error.
///
/// Valkey 8.1 runs this callback on the client whose command caused the event, with the
/// event's database selected, and leaves that client in it: after `MOVE key 1` the client
/// (or, on a replica, the link to its master, whose next writes would land in the wrong
/// database) would be left in database 1. So after "move_to" the source database is selected
/// again; on servers that give the callback a client of its own this changes nothing.
fn on_keyspace_event(ctx: Ctx<'_>, event: &[u8], key: RStr<'_>) {
    // Watchers, on masters and replicas alike (a replica's keys change by its master's DEL
    // and the like): the key is looked at right after the command.
    if watchers::any() {
        watchers::look_soon(ctx.selected_db(), ffi::bytes(&key));
    }
    // RENAME's old name, kept from its "rename_from" for the "rename_to" right after it;
    // any event takes it, so that it never serves a later command.
    let renamed_from = RENAME_SOURCE.with(|s| s.borrow_mut().take());
    let source = match event {
        b"rename_from" => {
            let old = (ctx.selected_db(), ffi::bytes(&key).to_vec());
            RENAME_SOURCE.with(|s| *s.borrow_mut() = Some(old));
            None
        }
        b"rename_to" => renamed_from,
        _ => None,
    };
    match event {
        b"move_from" => {
            MOVE_SOURCE_DB.store(ctx.selected_db(), Ordering::Relaxed);
        }
        b"move_to" => {
            if server::is_master() {
                let from = MOVE_SOURCE_DB.load(Ordering::Relaxed);
                let source = (from >= 0).then(|| (from, ffi::bytes(&key).to_vec()));
                look_at(ctx, event, key, source);
            }
            let source = MOVE_SOURCE_DB.swap(-1, Ordering::Relaxed);
            if source >= 0 {
                ctx.select_db(source);
            }
            return;
        }
        _ => {}
    }
    if server::is_master() {
        look_at(ctx, event, key, source);
    }
}

/// `source`: where a renamed or moved value came from (RENAME's old name, MOVE's database).
fn look_at(ctx: Ctx<'_>, event: &[u8], key: RStr<'_>, source: Option<KeyId>) {
    let plan = keyspace::on_key_event(event, server::is_master());
    if let Some(how) = plan.arrival {
        arrived(ctx, key, how, source);
    }
    if plan.revisit_if_waited && waiters::blocked_now() > 0 {
        let db = ctx.selected_db();
        let name = ffi::bytes(&key);
        if waiters::is_waited(db, name) {
            jobs::schedule(Job::Revisit((db, name.to_vec())));
        }
    }
}

/// A lock value arrived under `key` (`how`): the engine adjusts it (`keyspace::arrive`), and
/// what it says is carried out: the bindings follow the value, the timer is armed anew under
/// the key's name, a vacant lock is looked at right after the command. `source`: where a
/// renamed or moved value came from, under which its bindings are found.
fn arrived(ctx: Ctx<'_>, key: RStr<'_>, how: Arrival, source: Option<KeyId>) {
    // Opened for reading (a write-mode close would signal the key as modified again); only
    // what Redis never sees changes: the timer slot, and the binding of grants that arrived
    // without one (RESTORE, MIGRATE), which the timer then ends and replicates.
    let mut k = Key::open(ctx, key, false);
    let mut look_again = false;
    let mut unnamed = false;
    if let Found::Lock(mut lock) = block::lock_mut(&mut k) {
        let state = lock.state();
        let arrival = keyspace::arrive(state, how);
        if let (true, Some((from_db, from))) = (arrival.rebind, &source) {
            let to = (ctx.selected_db(), ffi::bytes(&key));
            for g in state.grants().iter() {
                if let Some(client) = g.bound_client() {
                    bindings::moved(client, g.token, (*from_db, from), to);
                }
            }
        }
        look_again = arrival.look_again;
        let block = lock.block();
        drop(lock);
        unnamed = expiry::arm(ctx, key, block, arrival.next, Arming::Moved).is_err();
    }
    drop(k);
    if unnamed {
        // A block under a new name (RENAME, COPY, RESTORE) gets one that carries it.
        let mut k = Key::open(ctx, key, true);
        expiry::name_and_arm(ctx, key, &mut k, true);
    }
    if look_again {
        jobs::schedule(Job::Revisit((ctx.selected_db(), ffi::bytes(&key).to_vec())));
    }
}

/// Role changes, the end of loading, flushes and SWAPDB.
fn on_server_event(ctx: Ctx<'_>, event: ServerEvent) {
    if watchers::any() {
        for_watchers(event);
    }
    if matches!(
        event,
        ServerEvent::RoleChanged { .. }
            | ServerEvent::Loading { .. }
            | ServerEvent::Persistence
            | ServerEvent::ReplicaChange
            | ServerEvent::Config
    ) {
        server::assume_replication_consumed();
    }
    let change = match event {
        ServerEvent::Cron => {
            let tick = CRON_TICKS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            if tick.is_multiple_of(10) {
                server::recheck_replication(ctx);
            }
            replication::send_pending_mark(ctx);
            jobs::run_queued(ctx);
            expiry::on_cron(ctx);
            waiters::time_out_due();
            watchers::on_cron(ctx);
            cluster::broadcast_high_water(ctx);
            return;
        }
        ServerEvent::ForkBorn => ServerChange::ForkStarted,
        ServerEvent::RoleChanged { now_master } => ServerChange::RoleChanged { master: now_master },
        ServerEvent::Loading { ended: true } => ServerChange::LoadingEnded,
        ServerEvent::FlushStarting { db } => ServerChange::FlushStarting { db },
        ServerEvent::FlushEnded => ServerChange::FlushEnded,
        ServerEvent::SwapDb {
            dbs: Some((first, second)),
        } => ServerChange::DbsSwapped { first, second },
        // A SWAPDB whose databases the server did not say: the timers and the waiters all
        // the same (the bindings cannot follow).
        ServerEvent::SwapDb { dbs: None } => {
            expiry::arm_all(ctx);
            revisit_all();
            return;
        }
        ServerEvent::ClientDisconnected { id } => ServerChange::ClientClosed { client: id },
        ServerEvent::Loading { ended: false }
        | ServerEvent::Persistence
        | ServerEvent::ReplicaChange
        | ServerEvent::Config
        | ServerEvent::Other => return,
    };
    for step in keyspace::consequences(change) {
        match step {
            Step::SetMaster(master) => server::set_master(master),
            Step::RefreshRole => server::refresh_role(ctx),
            Step::RaiseTokenMark | Step::ReplicateTokenMark => token_mark(step),
            Step::ArmAll => expiry::arm_all(ctx),
            Step::ForgetTimers(db) => expiry::forget_db(db),
            Step::FailAllWaiters(why) => waiters::fail_everyone(why.as_str()),
            Step::RevisitWaited => revisit_all(),
            Step::RevisitSwapped(a, b) => revisit_swapped(a, b),
            Step::SwapBindings(a, b) => bindings::swap_dbs(a, b),
            // Its waits ended already (the blocked client's disconnect callback); its bound
            // grants end from the event loop, right after this disconnection.
            Step::CloseBoundGrants(client) => {
                for key in bindings::take(client) {
                    jobs::schedule(Job::Close { key, client });
                }
            }
        }
    }
}

/// What a server event does to watchers (flock-core's `watch::on_server_change`).
fn for_watchers(event: ServerEvent) {
    let change = match event {
        ServerEvent::RoleChanged { now_master } => {
            watch::ServerChange::RoleChanged { master: now_master }
        }
        ServerEvent::Loading { ended: false } => watch::ServerChange::LoadingStarted {
            master: server::is_master(),
        },
        ServerEvent::FlushStarting { db } => watch::ServerChange::FlushStarting { db },
        ServerEvent::SwapDb { .. } => watch::ServerChange::DbsSwapped,
        _ => return,
    };
    match watch::on_server_change(change) {
        ServerStep::Nothing => {}
        ServerStep::FailAll(why) => watchers::fail_everyone(why),
        ServerStep::LookAll(db) => watchers::look_all_soon(db),
    }
}

/// A lock key leaves this node: the one path, whatever took it (DEL, UNLINK, the delete of a
/// RELEASE or an expiry, MIGRATE's delete on its source, a slot trimmed after an atomic slot
/// migration, eviction, an overwrite, a synchronous flush), called as Redis frees its block
/// on the main thread. Nothing of it stays (G10): its deadline index entry, the bindings of
/// bound grants still in it (their connection no longer holds them here). Its watchers are
/// looked at right after the command (`watchers::run_looks`: TRYAGAIN where its slot is
/// served elsewhere now, else what ended it), as its waiters are (the type's `freed`
/// schedules their revisit: TRYAGAIN likewise).
pub fn key_left(block: RecordPtr, bound: impl FnOnce() -> Vec<(u64, u64)>) {
    expiry::disarm(block);
    // The usual case (no bound grant anywhere, nobody watching): two loads, and the block's
    // name is not even read.
    let (bound_any, watched_any) = (bindings::any(), watchers::any());
    if !bound_any && !watched_any {
        return;
    }
    // A block that never carried its name (loaded, never armed) has no binding either.
    let Some((db, name)) = block.name() else {
        return;
    };
    if bound_any {
        for (client, token) in bound() {
            bindings::unbind(client, token, db, name);
        }
    }
    if watched_any {
        watchers::look_soon(db, name);
    }
}

/// Valkey 9's atomic slot migration event (flock-core's `migration::on_slot_move`).
fn on_slot_migration(ctx: Ctx<'_>, subevent: u64, pairs: &[(i64, i64)]) {
    let Some(m) = SlotMove::from_subevent(subevent) else {
        return;
    };
    let ranges = migration::ranges_of(pairs.iter().copied());
    for step in migration::on_slot_move(m, server::is_master()) {
        match step {
            MoveStep::HoldImports => moving::set_importing(&ranges, true),
            MoveStep::EndImports => moving::set_importing(&ranges, false),
            MoveStep::ArmArrived => {
                expiry::arm_where(ctx, in_ranges(&ranges));
                replication::mark_soon();
            }
            MoveStep::StreamEffects => {
                moving::set_exporting(true);
                server::assume_replication_consumed();
            }
            MoveStep::EndStreamEffects => moving::set_exporting(false),
            // The slots belong to another node now and the server deletes their keys next
            // (each then leaves by `key_left`); until then nothing here acts on them.
            MoveStep::ForgetDeadlines => expiry::forget_where(in_ranges(&ranges)),
            MoveStep::FailWaiters(why) => {
                let moved = in_ranges(&ranges);
                for key in waiters::waited_keys(None) {
                    if moved(&key.1) {
                        waiters::fail_all(&key, why.as_str());
                    }
                }
            }
            MoveStep::FailWatchers(why) => watchers::fail_where(in_ranges(&ranges), why),
        }
    }
}

/// Whether a key's name hashes into `ranges` (the slots an event names).
fn in_ranges(ranges: &SlotRanges) -> impl Fn(&[u8]) -> bool + '_ {
    move |name| migration::key_in(ranges, name)
}

/// The module was loaded: the steps of a start (before any data is loaded).
pub fn on_start() {
    for step in keyspace::consequences(ServerChange::Started) {
        token_mark(step);
    }
}

/// [`Step::RaiseTokenMark`] and [`Step::ReplicateTokenMark`], on a master.
fn token_mark(step: Step) {
    if !server::is_master() {
        return;
    }
    match step {
        Step::RaiseTokenMark => {
            let margin_us = config::promotion_margin_ms().saturating_mul(1000);
            let now = server::now();
            server::tokens().promote(now, margin_us);
        }
        Step::ReplicateTokenMark => replication::mark_soon(),
        _ => {}
    }
}

static CRON_TICKS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

fn revisit_all() {
    for key in waiters::waited_keys(None) {
        jobs::schedule(Job::Revisit(key));
    }
}

/// [`Step::RevisitSwapped`]: every waited key, and its name in the other swapped database.
fn revisit_swapped(a: i32, b: i32) {
    for (db, name) in waiters::waited_keys(None) {
        let other = match db {
            _ if db == a => Some(b),
            _ if db == b => Some(a),
            _ => None,
        };
        if let Some(other) = other.filter(|o| *o != db) {
            jobs::schedule(Job::Revisit((other, name.clone())));
        }
        jobs::schedule(Job::Revisit((db, name)));
    }
}

/// A key's deadline came (`expiry.rs`): settle it, if the entry's record is still there.
pub fn on_due(ctx: Ctx<'_>, due: &DueKey) {
    if !ctx.select_db(due.db) {
        return;
    }
    let Some(name) = RString::new(ctx, due.name.bytes()) else {
        return;
    };
    settle_due(ctx, name.get(), due.block);
}

fn settle_due(ctx: Ctx<'_>, name: RStr<'_>, block: RecordPtr) {
    let mut key = Key::open(ctx, name, true);
    // Only the block this entry was armed for (not one that replaced it: a block's entry
    // leaves the index before the block is freed, so a due block is still live).
    if !key.holds(block) {
        return;
    }
    let _ = executor::run(ctx, name, &mut key, false, |stored, cx, w| {
        engine::expire(stored, cx, w)
    });
}

/// A deferred job on a key (`jobs.rs`).
pub fn run_job(ctx: Ctx<'_>, key_name: RStr<'_>, task: Task) {
    match task {
        Task::Revisit(ghost) => revisit(ctx, key_name, ghost),
        Task::Close(client) => close(ctx, key_name, client),
        Task::TryMulti(waiter) => macquire::try_waiting(ctx, waiter),
    }
}

/// Connection `client` closed: end its bound grants of `key_name` (if the lock is still
/// there; a grant it no longer holds is left alone by the engine).
fn close(ctx: Ctx<'_>, key_name: RStr<'_>, client: u64) {
    let mut key = Key::open(ctx, key_name, true);
    let _ = executor::run(ctx, key_name, &mut key, false, |stored, cx, w| {
        engine::close(stored, cx, w, client)
    });
}

/// A deferred look at a waited key: hand it to its first waiter when it is free, fail its
/// waiters when it now holds another type or moved away, and release `ghost` (a grant whose
/// client vanished before its reply) first.
fn revisit(ctx: Ctx<'_>, key_name: RStr<'_>, ghost: Option<u64>) {
    let mut key = Key::open(ctx, key_name, true);
    let found = match key.kind() {
        KeyKind::Ours => engine::Found::Lock,
        KeyKind::Empty => engine::Found::Nothing,
        KeyKind::Other => engine::Found::OtherType,
    };
    let waiting = waiters::count(ctx, key_name);
    let plan = engine::plan_revisit(server::is_master(), found, ghost, waiting, || {
        cluster::serves_stably(ctx, ffi::bytes(&key_name))
    });
    match plan {
        RevisitPlan::Skip => {}
        RevisitPlan::FailWaiters(msg) => waiters::fail_all(&waiters::key_id(ctx, key_name), msg),
        RevisitPlan::Revisit => {
            let _ = executor::run(ctx, key_name, &mut key, true, |stored, cx, w| {
                w.watch_if_waited();
                engine::revisit(stored, cx, w, ghost)
            });
        }
    }
}
