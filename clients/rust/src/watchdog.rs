//! The watchdog (rule 2): the one task per lease that renews it in the background and marks
//! it lost when its local deadline passes; a durable lease's renewal counts only once
//! acknowledged (rule 10).
//!
//! The task is started `DEFER` to `2 * DEFER` after the grant, by one starter task per
//! `Flock`, and only for a lease still held then: nothing of the watchdog is due that early
//! (its first renewal is at a third of the ttl, its deadline later still), and a lease
//! released within `DEFER` costs no task at all. A task spawned, aborted and awaited per lock
//! was most of what the client added to a short scoped lock (examples/bench.rs). The starter
//! wakes at most once per `DEFER`, whatever the rate of locks, and starts every task due by
//! then. A lease whose first renewal (or deadline) is within `4 * DEFER` gets its task at once.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use tokio::sync::Notify;
use tokio::task::JoinHandle;
use tokio::time::Instant;

use crate::error::LossReason;
use crate::retry::{backoff, is_transient};
use crate::state::{Renewal, State};
use crate::sync::lock;

/// How long after its grant a lease's watchdog task is started (see above).
const DEFER: Duration = Duration::from_millis(5);
/// The starter task ends after this long with nothing to start.
const IDLE: Duration = Duration::from_secs(2);

/// A lease's watchdog task.
pub(crate) enum Keeper {
    /// Not started yet: the starter starts it when its time comes.
    Pending,
    Running(JoinHandle<()>),
    /// Stopped for good (the last hold was released or dropped): it is never started again.
    Stopped,
}

impl Keeper {
    /// Stops the watchdog for good: its task, if it was started, to abort (and await).
    pub(crate) fn stop(slot: &Mutex<Keeper>) -> Option<JoinHandle<()>> {
        match std::mem::replace(&mut *lock(slot), Keeper::Stopped) {
            Keeper::Running(k) => {
                k.abort();
                Some(k)
            }
            Keeper::Pending | Keeper::Stopped => None,
        }
    }
}

/// Starts the task of a lease still pending, unless it ended meanwhile.
fn spawn_keeper(st: &Arc<State>, renew: bool) {
    let mut slot = lock(&st.keeper);
    if !matches!(*slot, Keeper::Pending) {
        return;
    }
    if lock(&st.timing).released || *st.lost.borrow() {
        *slot = Keeper::Stopped;
        return;
    }
    *slot = Keeper::Running(tokio::spawn(keeper(st.clone(), renew)));
}

#[derive(Default)]
struct Queue {
    /// Leases whose task is due at the given instant, oldest first (every lease waits the
    /// same `DEFER`, so the queue is in the order of those instants).
    pending: VecDeque<(Weak<State>, bool, Instant)>,
    running: bool,
    /// The starter waits with nothing pending: a new lease must wake it.
    idle: bool,
}

/// A `Flock`'s starter of watchdog tasks.
#[derive(Default)]
pub(crate) struct Starter {
    q: Mutex<Queue>,
    wake: Notify,
}

impl Starter {
    /// The watchdog of a new lease: its task now when its first renewal (or, without
    /// renewals, its deadline) is near, else `DEFER` to `2 * DEFER` from now by the starter.
    pub(crate) fn start(self: &Arc<Self>, st: &Arc<State>, renew: bool) {
        let now = Instant::now();
        let first = {
            let t = lock(&st.timing);
            if renew {
                (t.last_sent + t.ttl / 3).min(t.deadline)
            } else {
                t.deadline
            }
        };
        if first <= now + 4 * DEFER {
            spawn_keeper(st, renew);
            return;
        }
        let (start, wake) = {
            let mut q = lock(&self.q);
            q.pending
                .push_back((Arc::downgrade(st), renew, now + DEFER));
            let start = !q.running;
            q.running = true;
            let wake = q.idle;
            q.idle = false;
            (start, wake)
        };
        if start {
            tokio::spawn(starter(self.clone()));
        } else if wake {
            self.wake.notify_one();
        }
    }
}

/// Marks the starter stopped when its runtime drops it midway (a runtime shut down while a
/// `Flock` lives on, to be used from another): the next lease starts a new one.
struct Alive(Option<Arc<Starter>>);

impl Drop for Alive {
    fn drop(&mut self) {
        if let Some(s) = self.0.take() {
            let mut q = lock(&s.q);
            q.running = false;
            q.idle = false;
        }
    }
}

/// The starter's loop: starts the tasks as they come due, until it had nothing to do for IDLE.
async fn starter(s: Arc<Starter>) {
    let mut alive = Alive(Some(s.clone()));
    let mut idle_since = Instant::now();
    loop {
        let now = Instant::now();
        let (due, next) = {
            let mut q = lock(&s.q);
            let mut due = Vec::new();
            while q.pending.front().is_some_and(|(_, _, at)| *at <= now) {
                if let Some((w, renew, _)) = q.pending.pop_front() {
                    due.push((w, renew));
                }
            }
            let next = q.pending.front().map(|(_, _, at)| *at);
            if !due.is_empty() || next.is_some() {
                idle_since = now;
            }
            if next.is_none() {
                if due.is_empty() && now.duration_since(idle_since) >= IDLE {
                    q.running = false;
                    alive.0 = None;
                    return;
                }
                // Nothing left to wait for: the next lease must wake it.
                q.idle = true;
            }
            (due, next)
        };
        for (w, renew) in due {
            if let Some(st) = w.upgrade() {
                spawn_keeper(&st, renew);
            }
        }
        match next {
            // Not sooner than DEFER after this wake: under a stream of short locks one wake
            // per DEFER, not one per lock.
            Some(at) => tokio::time::sleep_until(at.max(now + DEFER)).await,
            None => {
                let _ = tokio::time::timeout_at(idle_since + IDLE, s.wake.notified()).await;
            }
        }
    }
}

/// The watchdog (rule 2) and the lease clock: renews at a third of the ttl with a
/// token-qualified RENEW, stops for good at the first nil, retries connection failures but
/// never sends a RENEW once the local deadline passed, and marks the lease lost when its
/// local deadline passes. With `renew` off it only watches the deadline. On a durable lease a
/// renewal that too few replicas acknowledged leaves the deadline and is sent again after a
/// pause (each one waits at most the durable timeout, cut at the deadline).
pub(crate) async fn keeper(st: Arc<State>, renew: bool) {
    loop {
        let (deadline, ttl, last_sent, released) = {
            let t = lock(&st.timing);
            (t.deadline, t.ttl, t.last_sent, t.released)
        };
        if released || *st.lost.borrow() {
            return;
        }
        let due = if renew {
            (last_sent + ttl / 3).min(deadline)
        } else {
            deadline
        };
        tokio::select! {
            _ = tokio::time::sleep_until(due) => {}
            _ = st.wake.notified() => continue,
        }
        if lock(&st.timing).released {
            return;
        }
        let deadline = lock(&st.timing).deadline;
        if Instant::now() >= deadline {
            st.mark_lost(LossReason::DeadlinePassed);
            return;
        }
        if !renew {
            continue;
        }
        let ttl = lock(&st.timing).ttl;
        // Retries until the local deadline; every attempt is cut off at it.
        let mut attempt = 0u32;
        loop {
            // A manual renew() may have moved the deadline meanwhile.
            let deadline = lock(&st.timing).deadline;
            if Instant::now() >= deadline {
                st.mark_lost(LossReason::DeadlinePassed);
                return;
            }
            match st.renew_once(ttl, deadline, !st.bound).await {
                Renewal::Renewed(sent) => {
                    st.renewed(sent, ttl);
                    break;
                }
                Renewal::Nil => {
                    st.mark_lost(LossReason::RenewRefused);
                    return;
                }
                Renewal::Short(_) => {
                    // Rule 10: renewed on the master but too few acknowledged: it does not
                    // count. Again after a pause, until the deadline runs out.
                    attempt += 1;
                }
                Renewal::Failed(e) => {
                    if st.bound || Instant::now() >= deadline || !is_transient(&e) {
                        st.mark_lost(if st.bound {
                            LossReason::Closed
                        } else if Instant::now() >= deadline {
                            LossReason::DeadlinePassed
                        } else {
                            // A refusal that no retry mends (WRONGTYPE: the key was
                            // written over): the grant ended some other way.
                            LossReason::Lost
                        });
                        return;
                    }
                    attempt += 1;
                }
            }
            let pause = backoff(attempt).min(deadline.saturating_duration_since(Instant::now()));
            tokio::time::sleep(pause).await;
        }
    }
}
