//! Timers on a master: every lock key is in a deadline index for its next deadline (the end
//! of its lease, or of its lock-delay), and one Redis timer is armed for the earliest.
//!
//! Redis module timers run on the monotonic clock (G9). The index (`deadlines.rs`) is a heap
//! of (deadline, record block) pairs, O(log n) per insert and removal, much less than a Redis
//! timer per lock; each block keeps its position in the heap and carries its key's database
//! and name (`ffi/block.rs`), so the index holds nothing else and an entry costs 16 bytes. An
//! entry is in the index exactly while its block is live: the block's free takes it out (on
//! the main thread: a per-key free is never lazy, see `ffi/lock_type.rs`'s `free_effort`), a flush
//! takes out its databases' entries before freeing their values (possibly on a lazy-free
//! thread), and a server that becomes a replica empties the index. A renewal keeps the
//! pending entry: when it comes due early it settles nothing and re-arms for the new deadline.
//!
//! Replicas arm nothing and never expire on their own: they learn expiry from the master's
//! effects. When a server becomes master (promotion, the end of loading) it scans its keyspace
//! and arms every lock.

use crate::ffi::block::{self, Found, RecordPtr};
use crate::ffi::{self, Ctx, Key, RStr, RString};
use crate::server;
use flock_core::deadlines::{DeadlineIndex, NOWHERE};
use flock_core::key_name::KeyName;
use flock_core::Deadline;
use std::ffi::c_int;
use std::sync::{Mutex, MutexGuard};

/// What an armed lock costs besides its block: its index entry.
pub const TIMER_BYTES: usize = DeadlineIndex::<RecordPtr>::ENTRY_BYTES;

/// An index entry that came due: its block (still the key's, unless something replaced it
/// since) and the key's database and name, read from the block while it was in the index.
pub struct DueKey {
    pub block: RecordPtr,
    pub db: c_int,
    pub name: KeyName,
}

struct Expiry {
    index: DeadlineIndex<RecordPtr>,
    /// The Redis timer armed for the earliest deadline (0: none), and when it fires.
    alarm: u64,
    alarm_at_us: u64,
}

static EXPIRY: Mutex<Expiry> = Mutex::new(Expiry {
    index: DeadlineIndex::new(),
    alarm: 0,
    alarm_at_us: 0,
});

fn expiry() -> MutexGuard<'static, Expiry> {
    EXPIRY.lock().unwrap_or_else(|p| p.into_inner())
}

/// Tells a block where its entry went (the index's `place`).
fn place(block: RecordPtr, pos: u32) {
    // The index holds live blocks only (see the module docs), and Redis runs module code on
    // one thread, so nothing else is touching this one.
    block.set_pos(pos)
}

/// Why [`arm`] did not arm.
#[derive(Debug, PartialEq, Eq)]
pub enum NotArmed {
    /// The block does not carry the key's name (loaded, restored, copied, renamed): the
    /// caller gives it a named block (`block::rename_in`) and arms that.
    Unnamed,
}

/// How a block is armed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Arming {
    /// The lock changed: an entry already due no later stays (it fires, settles nothing and
    /// arms the block again for its deadline then).
    Update,
    /// A block this command just made for its key: no entry yet, and its name is the key's,
    /// so there is nothing to compare or take out.
    Made,
    /// The key was renamed, moved, swapped, restored or copied: a pending entry is replaced,
    /// and the lock's FLOCK.STATS class is forgotten (its next event counts for the class of
    /// the name it has now).
    Moved,
}

/// Make `block`, the lock of `key` in the selected database of `ctx`, due at `next` (its
/// next deadline; `None`: never), master only: the one way a lock's block is armed (after a
/// scan, `arm_all`; with a new name first, `name_and_arm`).
#[inline(always)]
pub fn arm(
    ctx: Ctx<'_>,
    key: RStr<'_>,
    block: RecordPtr,
    next: Option<Deadline>,
    how: Arming,
) -> Result<(), NotArmed> {
    match how {
        Arming::Update => arm_with(ctx, key, block, next, false),
        Arming::Made => {
            arm_made(block, next);
            Ok(())
        }
        Arming::Moved => {
            block.set_class(Default::default());
            arm_with(ctx, key, block, next, true)
        }
    }
}

/// [`Arming::Made`]. A block without a name (a database number past what a block holds) is
/// not armed, as [`Arming::Update`] would refuse it: a due entry could not find its key.
/// Inlined: the hot ACQUIRE of a free key arms this way.
#[inline(always)]
fn arm_made(block: RecordPtr, next: Option<Deadline>) {
    let Some(next) = next.filter(|_| server::is_master()) else {
        return;
    };
    match block.name() {
        None => return,
        // A lock the source still owns (an atomic slot migration importing it): armed when
        // the import completes.
        Some((_, name)) if server::migration::importing(name) => return,
        Some(_) => {}
    }
    let mut e = expiry();
    if e.index.insert(next.mono_us, block, &mut place) {
        ensure_alarm(&mut e, next.mono_us);
    }
}

#[inline(never)]
fn arm_with(
    ctx: Ctx<'_>,
    key: RStr<'_>,
    block: RecordPtr,
    next: Option<Deadline>,
    replace: bool,
) -> Result<(), NotArmed> {
    if !server::is_master() {
        return Ok(());
    }
    let Some(next) = next.filter(|_| !server::migration::importing(ffi::bytes(&key))) else {
        // Never due, or still the source's (an import under way: armed when it completes).
        disarm(block);
        return Ok(());
    };
    let db = ctx.selected_db();
    match block.name() {
        Some((d, name)) if name == ffi::bytes(&key) => {
            // MOVE and SWAPDB keep the name: the database is set in place.
            if d != db && !block.set_db(db) {
                return Err(NotArmed::Unnamed);
            }
        }
        _ => return Err(NotArmed::Unnamed),
    }
    let mut e = expiry();
    let pos = block.pos();
    if pos != NOWHERE {
        if !replace
            && e.index
                .deadline_at(pos)
                .is_some_and(|at| at <= next.mono_us)
        {
            return Ok(()); // due no later than needed, and re-arms then
        }
        e.index.remove(pos, &mut place);
    }
    if e.index.insert(next.mono_us, block, &mut place) {
        ensure_alarm(&mut e, next.mono_us);
    }
    Ok(())
}

/// Take `block` out of the index, if it is in.
pub fn disarm(block: RecordPtr) {
    // A live block (of an open key, or being freed on the main thread).
    let pos = block.pos();
    if pos != NOWHERE {
        expiry().index.remove(pos, &mut place);
    }
}

/// `new` takes `old`'s place in the index (the lock moved to a new block).
pub fn transfer(old: RecordPtr, new: RecordPtr) {
    // Both live blocks of one open key.
    let pos = old.pos();
    if pos == NOWHERE {
        return;
    }
    let mut e = expiry();
    if let Some((at, _)) = e.index.remove(pos, &mut place) {
        if e.index.insert(at, new, &mut place) {
            ensure_alarm(&mut e, at);
        }
    }
}

/// Take out the entries of database `db` (all databases: `None`) while their blocks are still
/// live: before a flush frees them, possibly on another thread; or, for all, when this server
/// becomes a replica (which arms nothing).
pub fn forget_db(db: Option<c_int>) {
    let mut e = expiry();
    e.index.drain_where(
        // The index holds live blocks only.
        |block| db.is_none_or(|d| block.name().is_some_and(|(bd, _)| bd == d)),
        &mut place,
    );
}

/// Take out the entries of the keys `gone` accepts (their slots moved to another node: the
/// server deletes them next, and nothing here may act on them before).
pub fn forget_where(gone: impl Fn(&[u8]) -> bool) {
    let mut e = expiry();
    e.index.drain_where(
        // The index holds live blocks only.
        |block| block.name().is_some_and(|(_, name)| gone(name)),
        &mut place,
    );
}

fn ensure_alarm(e: &mut Expiry, at_us: u64) {
    if e.alarm != 0 && e.alarm_at_us <= at_us {
        return;
    }
    let Some(ctx) = ffi::module_ctx() else {
        return;
    };
    if e.alarm != 0 {
        ffi::stop_timer(ctx, e.alarm);
    }
    let now = server::now().mono_us;
    let period_ms = at_us
        .saturating_sub(now)
        .div_ceil(1000)
        .min(i64::MAX as u64) as i64;
    e.alarm = ffi::create_timer::<Alarm>(ctx, period_ms, 0);
    e.alarm_at_us = at_us;
}

/// What to do with an entry that came due: settle its key (set once by the module's
/// registration; the mechanism never calls up into the code that runs the engine).
pub type DueHandler = fn(Ctx<'_>, &DueKey);

static ON_DUE: std::sync::OnceLock<DueHandler> = std::sync::OnceLock::new();

pub fn set_due_handler(handler: DueHandler) {
    let _ = ON_DUE.set(handler);
}

/// While clients are paused, due entries wait this long and are looked at again.
const PAUSED_RETRY_US: u64 = 10_000;

/// The next entry due at `now`, out of the index, with its key's name read from its block.
fn pop_due(now: u64) -> Option<DueKey> {
    let mut e = expiry();
    loop {
        let block = e.index.pop_due(now, &mut place)?;
        // It was in the index, so it is live.
        if let Some((db, name)) = block.name() {
            return Some(DueKey {
                block,
                db,
                name: KeyName::new(name),
            });
        }
    }
}

/// The Redis timer of the earliest deadline.
struct Alarm;

impl ffi::Timer for Alarm {
    fn fire(ctx: Ctx<'_>, _data: u64) {
        on_alarm(ctx);
    }
}

fn on_alarm(ctx: Ctx<'_>) {
    let now = server::now();
    if server::avoid_replica_traffic() {
        let mut e = expiry();
        e.alarm = 0;
        ensure_alarm(&mut e, now.mono_us + PAUSED_RETRY_US);
        return;
    }
    expiry().alarm = 0;
    // One at a time: settling a key may free other blocks (a keyspace notification's
    // listener deleting keys), which then leave the index themselves.
    while let Some(due) = pop_due(now.mono_us) {
        if let Some(handler) = ON_DUE.get() {
            handler(ctx, &due);
        }
    }
    let mut e = expiry();
    if let Some(next) = e.index.next(&mut place) {
        ensure_alarm(&mut e, next);
    }
}

/// From the cron event (every 100 ms at hz 10): a backstop for the alarm. Redis 7.0 and
/// Valkey key module timers by the wall clock, so after the wall clock steps back the alarm
/// fires late; the index is on the monotonic clock, and this catches what is due.
pub fn on_cron(ctx: Ctx<'_>) {
    let now = server::now().mono_us;
    let due = {
        let mut e = expiry();
        let due = e.index.next(&mut place).is_some_and(|next| next <= now);
        if due && e.alarm != 0 {
            // The alarm is late: replace it (on_alarm arms a new one for what is left).
            if let Some(module_ctx) = ffi::module_ctx() {
                ffi::stop_timer(module_ctx, e.alarm);
            }
            e.alarm = 0;
        }
        due
    };
    if due {
        // The alarm callback, run from the cron's live context like a timer would.
        on_alarm(ctx);
    }
}

/// Arm the lock of `key` (open for writing) for its next deadline, giving it a block named
/// after the key first when its block does not carry that name. `replace`: as
/// [`Arming::Moved`].
pub fn name_and_arm(ctx: Ctx<'_>, key_name: RStr<'_>, key: &mut Key, replace: bool) {
    let Found::Lock(mut lock) = block::lock_mut(key) else {
        return;
    };
    let block = lock.block();
    let next = lock.state().next_deadline();
    drop(lock);
    let armed = if replace {
        arm(ctx, key_name, block, next, Arming::Moved)
    } else {
        arm(ctx, key_name, block, next, Arming::Update)
    };
    if armed == Err(NotArmed::Unnamed) {
        let db = ctx.selected_db();
        // The key is open for writing; the index entry moves to the new block before the old
        // one is freed.
        if let Some(named) = block::rename_in(key, block, db, ffi::bytes(&key_name), transfer) {
            if let Err(e) = arm(ctx, key_name, named, next, Arming::Moved) {
                // Not reached but for a database number past 65,535.
                redis_module::logging::log_warning(format!(
                    "flock: cannot arm the lock {:?} in database {db}: {e:?}",
                    String::from_utf8_lossy(ffi::bytes(&key_name))
                ));
            }
        }
    }
}

/// Arm a timer for every lock in every database (after promotion, loading or SWAPDB).
pub fn arm_all(ctx: Ctx<'_>) {
    arm_where(ctx, |_| true);
}

/// Arm every lock whose key name `wanted` accepts (the slots an import brought), as
/// [`arm_all`] does: bound grants with no connection here come due at once.
pub fn arm_where(ctx: Ctx<'_>, wanted: impl Fn(&[u8]) -> bool) {
    if !server::is_master() {
        return;
    }
    // The context may be the client that ran SWAPDB (Valkey 8.1 fires the event on it):
    // leave it in the database it had selected.
    let selected = ctx.selected_db();
    let mut db: c_int = 0;
    while ctx.select_db(db) {
        let mut unnamed: Vec<Vec<u8>> = Vec::new();
        if !ffi::scan_db(ctx, |ctx, keyname, key| {
            if wanted(ffi::bytes(&keyname)) {
                arm_scanned(ctx, keyname, key, &mut unnamed);
            }
        }) {
            return;
        }
        // Scanned keys are open for reading only: the blocks that need a name get it now.
        for name in unnamed {
            let Some(name) = RString::new(ctx, &name) else {
                continue;
            };
            let mut key = Key::open(ctx, name.get(), true);
            name_and_arm(ctx, name.get(), &mut key, true);
            drop(key);
        }
        db += 1;
    }
    ctx.select_db(selected);
}

fn arm_scanned(ctx: Ctx<'_>, keyname: RStr<'_>, key: &mut Key, unnamed: &mut Vec<Vec<u8>>) {
    if let Found::Lock(mut lock) = block::lock_mut(key) {
        // A master that loaded, restored or was promoted holds no binding for bound grants:
        // they are not live from now on and come due at once (the engine decides).
        flock_core::engine::orphan_bound(lock.state(), true);
        let next = lock.state().next_deadline();
        let block = lock.block();
        drop(lock);
        if arm(ctx, keyname, block, next, Arming::Moved) == Err(NotArmed::Unnamed) {
            unnamed.push(ffi::bytes(&keyname).to_vec());
        }
    };
}
