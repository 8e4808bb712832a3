//! Deferred work on a key: what must not run inside a keyspace notification, a free callback
//! or a client's disconnection (granting to the next waiter after a DEL, releasing a grant
//! whose client vanished before its reply, ending the bound grants of a closed connection) is
//! queued as a [`Job`] and run from a zero-delay timer, in a proper
//! context, right after the command. What a job does is the business of the code that set
//! the runner ([`set_runner`]): this mechanism only keeps and times the jobs.

use crate::ffi::block::KeyId;
use crate::ffi::{self, Ctx, RStr, RString};
use crate::server;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Mutex, OnceLock};

pub enum Job {
    /// Look at a waited key again (it was deleted, flushed, renamed or overwritten).
    Revisit(KeyId),
    /// Release the grant `token` of `key` (its client vanished before the reply).
    ReleaseGhost { key: KeyId, token: u64 },
    /// End the grants of `key` bound to connection `client`, which closed.
    Close { key: KeyId, client: u64 },
    /// Try to grant the waiting MACQUIRE request `waiter`, first in line on the free `key`
    /// (one of its keys: its database is theirs).
    TryMulti { key: KeyId, waiter: u64 },
}

/// What a job does to its key.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Task {
    /// Look at it again, releasing this ghost grant first, if any.
    Revisit(Option<u64>),
    /// End its grants bound to this connection.
    Close(u64),
    /// Try to grant this waiting MACQUIRE request (the key is one of its keys).
    TryMulti(u64),
}

/// Runs one job: the key's name in the database selected in `ctx`, and what to do.
pub type Runner = fn(Ctx<'_>, RStr<'_>, Task);

static RUNNER: OnceLock<Runner> = OnceLock::new();

pub fn set_runner(runner: Runner) {
    let _ = RUNNER.set(runner);
}

static JOBS: Mutex<Vec<Job>> = Mutex::new(Vec::new());
static JOB_TIMER: AtomicBool = AtomicBool::new(false);

/// Look at `key` again soon. From another thread (a lazy free) only queue it: the next cron
/// tick on the main thread runs it.
pub fn schedule_revisit(key: KeyId, main_thread: bool) {
    if main_thread {
        schedule(Job::Revisit(key));
    } else {
        JOBS.lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(Job::Revisit(key));
    }
}

/// From the cron event: run jobs queued by other threads.
pub fn run_queued(ctx: Ctx<'_>) {
    let pending = !JOBS.lock().unwrap_or_else(|p| p.into_inner()).is_empty();
    if pending && !JOB_TIMER.load(Ordering::Relaxed) {
        // The timer callback, run from the cron's live context like a timer would.
        run_jobs(ctx);
    }
}

pub fn schedule(job: Job) {
    JOBS.lock().unwrap_or_else(|p| p.into_inner()).push(job);
    if !JOB_TIMER.swap(true, Ordering::Relaxed) {
        let id = ffi::module_ctx().map_or(0, |ctx| ffi::create_timer::<JobTimer>(ctx, 0, 0));
        if id == 0 {
            JOB_TIMER.store(false, Ordering::Relaxed);
        }
    }
}

/// The zero-delay timer that runs the queued jobs.
struct JobTimer;

impl ffi::Timer for JobTimer {
    fn fire(ctx: Ctx<'_>, _data: u64) {
        run_jobs(ctx);
    }
}

fn run_jobs(ctx: Ctx<'_>) {
    if server::avoid_replica_traffic() {
        // Clients are paused: wait, the jobs' effects would be replicated.
        JOB_TIMER.store(true, Ordering::Relaxed);
        let id = ffi::module_ctx().map_or(0, |ctx| ffi::create_timer::<JobTimer>(ctx, 10, 0));
        if id == 0 {
            JOB_TIMER.store(false, Ordering::Relaxed);
        }
        return;
    }
    JOB_TIMER.store(false, Ordering::Relaxed);
    let jobs = std::mem::take(&mut *JOBS.lock().unwrap_or_else(|p| p.into_inner()));
    let Some(runner) = RUNNER.get() else {
        return;
    };
    for job in jobs {
        let (db, name, task) = match &job {
            Job::Revisit((db, name)) => (*db, name, Task::Revisit(None)),
            Job::ReleaseGhost {
                key: (db, name),
                token,
            } => (*db, name, Task::Revisit(Some(*token))),
            Job::Close {
                key: (db, name),
                client,
            } => (*db, name, Task::Close(*client)),
            Job::TryMulti {
                key: (db, name),
                waiter,
            } => (*db, name, Task::TryMulti(*waiter)),
        };
        if !ctx.select_db(db) {
            continue;
        }
        let Some(key) = RString::new(ctx, name) else {
            continue;
        };
        runner(ctx, key.get(), task);
    }
}
