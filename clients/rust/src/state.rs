//! The state a lease's handles, its watchdog and its release share: the local lease clock
//! (rule 1), the lost flag (rule 3), the connection it talks on (rule 8), the sending of its
//! commands with the retries each allows, and one renewal, durable or not (rule 10). The
//! public face is in `lease`, the renewing in `watchdog`; both build on this.

use std::sync::{Arc, Mutex, OnceLock, Weak};
use std::time::Duration;

use redis::{Cmd, FromRedisValue, RedisError};
use tokio::sync::{watch, Notify};
use tokio::time::Instant;

use crate::connection::{Conn, Shared};
use crate::durable::round_trip;
use crate::error::{Error, LossReason, Result};
use crate::options::{Durable, Mode};
use crate::retry::{backoff, is_connection_error, is_transient, RETRIES};
use crate::sync::lock;
use crate::watchdog::Keeper;

/// The connection a lease sends its commands on.
pub(crate) enum LeaseConn {
    /// The factory's shared command connection.
    Shared,
    /// A bound lease's own connection.
    Dedicated(Conn),
}

/// The local lease clock (rule 1).
pub(crate) struct Timing {
    pub(crate) ttl: Duration,
    /// Send instant of the request that granted or last renewed the grant, plus its ttl.
    pub(crate) deadline: Instant,
    /// Send instant of the RENEW counted last: an older one answered later must not move the
    /// deadline back.
    pub(crate) last_sent: Instant,
    pub(crate) released: bool,
    /// Rule 11: the holds of a reentrant lease (1 for any other); the last release sends
    /// RELEASE.
    pub(crate) holds: u32,
    /// The lease's own RELEASE is on its way: the `released` event FLOCK.WATCH reports for it
    /// is not a loss (rule 9).
    pub(crate) releasing: bool,
}

/// Who acquires (rule 11): the tokio task, or outside any task (a `block_on`, such as
/// `#[tokio::main]`'s body) the thread.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Caller {
    Task(tokio::task::Id),
    Thread(std::thread::ThreadId),
}

impl Caller {
    pub(crate) fn current() -> Caller {
        match tokio::task::try_id() {
            Some(id) => Caller::Task(id),
            None => Caller::Thread(std::thread::current().id()),
        }
    }
}

/// One lease, shared by its handles, its watchdog and its release.
pub(crate) struct State {
    pub(crate) key: String,
    pub(crate) owner: String,
    pub(crate) token: u64,
    pub(crate) mode: Mode,
    pub(crate) bound: bool,
    /// Rule 10: what a renewal must have acknowledged before it counts; `None`: not durable.
    pub(crate) durable: Option<Durable>,
    /// The factory's connections (the shared one, and new ones for a bound lease's waits).
    pub(crate) shared: Arc<Shared>,
    /// An async mutex: a bound lease's connection is used across awaits.
    pub(crate) conn: tokio::sync::Mutex<LeaseConn>,
    pub(crate) timing: Mutex<Timing>,
    /// Rule 3: turns `true` once, never back.
    pub(crate) lost: watch::Sender<bool>,
    /// Rule 12: why it was lost; set once, with the first loss.
    pub(crate) reason: Mutex<Option<LossReason>>,
    /// Wakes the watchdog when its schedule changed (a manual renew, the release).
    pub(crate) wake: Notify,
    /// The watchdog task (started soon after the grant), aborted by the last hold's release
    /// or drop.
    pub(crate) keeper: Mutex<Keeper>,
    /// Rule 11: the tokio task that acquired the lease (a wait of that task on its own key
    /// would wait on itself), and whether it may be re-entered.
    pub(crate) task: Caller,
    pub(crate) reentrant: bool,
    /// `lock_many` with `bound(true)`: every lease of the set, on one connection. When it
    /// closes the server ends every grant on it, so one lease's `Closed` is every one's (a
    /// WATCH reply names one ended grant, and the WATCH after it would tell the rest `gone`).
    pub(crate) bound_set: OnceLock<Vec<Weak<State>>>,
}

/// What became of a command sent by [`State::send`].
pub(crate) enum Sent<T> {
    /// The reply, the send instant of the attempt that got it, and whether that attempt was a
    /// retry (a RELEASE answered 0 after a retry counts as released: the first may have run).
    Reply(T, Instant, bool),
    Failed(RedisError),
}

/// What became of a renewal sent by [`State::renew_once`].
pub(crate) enum Renewal {
    /// Renewed (and, when durable, acknowledged): counts from this send instant.
    Renewed(Instant),
    /// The grant is gone (RENEW answered nil).
    Nil,
    /// Renewed on the master but not acknowledged by enough replicas (or the AOF) within the
    /// durable timeout: `Error::NotDurable`. It does not count: the deadline stays.
    Short(Error),
    Failed(RedisError),
}

impl State {
    /// Marks the lease lost for `reason`; the first loss's reason stays.
    pub(crate) fn mark_lost(&self, reason: LossReason) {
        {
            let mut r = lock(&self.reason);
            if r.is_none() && !*self.lost.borrow() {
                *r = Some(reason);
            }
        }
        let first = self.lost.send_if_modified(|v| {
            if *v {
                false
            } else {
                *v = true;
                true
            }
        });
        if first && reason == LossReason::Closed {
            for other in self.bound_set.get().into_iter().flatten() {
                if let Some(o) = other.upgrade() {
                    if !o.is_released() {
                        o.mark_lost(LossReason::Closed);
                    }
                }
            }
        }
    }

    pub(crate) fn is_lost(&self) -> bool {
        if *self.lost.borrow() {
            return true;
        }
        let t = lock(&self.timing);
        if t.released {
            return false;
        }
        if Instant::now() >= t.deadline {
            drop(t);
            self.mark_lost(LossReason::DeadlinePassed);
            return true;
        }
        false
    }

    /// Rule 11: one more hold of a live lease; false when it was released or lost meanwhile.
    pub(crate) fn hold(&self) -> bool {
        if self.is_lost() {
            return false;
        }
        let mut t = lock(&self.timing);
        if t.released {
            return false;
        }
        t.holds += 1;
        true
    }

    /// Rule 11: one hold less; true when it was the last (the caller releases the grant).
    pub(crate) fn unhold(&self) -> bool {
        let mut t = lock(&self.timing);
        t.holds = t.holds.saturating_sub(1);
        t.holds == 0
    }

    /// Released by its holder (not a loss).
    pub(crate) fn is_released(&self) -> bool {
        lock(&self.timing).released
    }

    /// Why the lease was lost, `None` while live or once released cleanly.
    pub(crate) fn loss_reason(&self) -> Option<LossReason> {
        if self.is_lost() {
            return Some(lock(&self.reason).unwrap_or(LossReason::Lost));
        }
        None
    }

    /// The error of a call on a lease that is lost (its reason) or released (`released`).
    pub(crate) fn ended(&self) -> Option<Error> {
        if let Some(r) = self.loss_reason() {
            return Some(Error::Lost(r));
        }
        if self.is_released() {
            return Some(Error::Lost(LossReason::Released));
        }
        None
    }

    pub(crate) fn remaining(&self) -> Duration {
        if *self.lost.borrow() {
            return Duration::ZERO;
        }
        let t = lock(&self.timing);
        if t.released {
            return Duration::ZERO;
        }
        t.deadline.saturating_duration_since(Instant::now())
    }

    /// A RENEW sent at `sent` was answered with the token: the lease now ends at `sent + ttl`
    /// unless a later-sent RENEW was already counted.
    pub(crate) fn renewed(&self, sent: Instant, ttl: Duration) {
        let mut t = lock(&self.timing);
        if sent >= t.last_sent {
            t.last_sent = sent;
            t.deadline = sent + ttl;
            t.ttl = ttl;
        }
    }

    /// Send `cmd` on the lease's connection: the shared one with reconnection and retries
    /// when `retry`, a bound lease's own connection without (its failure is the lease's
    /// loss). `until` bounds every attempt (the local deadline, for the watchdog).
    pub(crate) async fn send<T: FromRedisValue>(
        &self,
        cmd: &Cmd,
        retry: bool,
        until: Option<Instant>,
    ) -> Sent<T> {
        let mut attempt = 0u32;
        loop {
            if until.is_some_and(|u| Instant::now() >= u) {
                return Sent::Failed(RedisError::from((
                    redis::ErrorKind::Io,
                    "the local deadline passed",
                )));
            }
            let sent = Instant::now();
            let fut = async {
                let mut guard = self.conn.lock().await;
                match &mut *guard {
                    LeaseConn::Shared => {
                        drop(guard);
                        self.shared.query::<T>(cmd).await
                    }
                    LeaseConn::Dedicated(c) => c.query::<T>(cmd).await,
                }
            };
            let r = match until {
                Some(u) => match tokio::time::timeout_at(u, fut).await {
                    Ok(r) => r,
                    Err(_) => Err(RedisError::from((
                        redis::ErrorKind::Io,
                        "the local deadline passed",
                    ))),
                },
                None => fut.await,
            };
            match r {
                Ok(v) => return Sent::Reply(v, sent, attempt > 0),
                Err(e) if self.bound && is_connection_error(&e) => {
                    // Rule 8: a bound grant lives with its connection, and the server ends it
                    // when that connection closes. Whatever call found the failure, the lease
                    // is lost.
                    self.mark_lost(LossReason::Closed);
                    return Sent::Failed(e);
                }
                Err(e) if retry && !self.bound && is_transient(&e) && attempt < RETRIES => {
                    attempt += 1;
                    let mut pause = backoff(attempt);
                    if let Some(u) = until {
                        pause = pause.min(u.saturating_duration_since(Instant::now()));
                    }
                    tokio::time::sleep(pause).await;
                }
                Err(e) => return Sent::Failed(e),
            }
        }
    }

    /// One renewal for `ttl`, cut off at `deadline` (the local one): a token-qualified RENEW,
    /// and for a durable lease RENEW pipelined with its WAIT/WAITAOF, whose timeout never
    /// reaches past the deadline. It changes nothing: the caller moves the deadline on
    /// `Renewed`.
    pub(crate) async fn renew_once(
        &self,
        ttl: Duration,
        deadline: Instant,
        retry: bool,
    ) -> Renewal {
        let cmd = self.renew_cmd(ttl);
        let Some(d) = self.durable else {
            return match self.send::<Option<u64>>(&cmd, retry, Some(deadline)).await {
                Sent::Reply(Some(_), sent, _) => Renewal::Renewed(sent),
                Sent::Reply(None, _, _) => Renewal::Nil,
                Sent::Failed(e) => Renewal::Failed(e),
            };
        };
        let wait = d
            .timeout_for(ttl)
            .min(deadline.saturating_duration_since(Instant::now()));
        match round_trip::<Option<u64>>(&self.shared, &cmd, &d, wait, retry, Some(deadline)).await {
            Ok(r) => match (r.reply, r.ack) {
                (None, _) => Renewal::Nil,
                (Some(_), Ok(ack)) => match ack.judge(&d) {
                    Ok(()) => Renewal::Renewed(r.sent),
                    Err(e) => Renewal::Short(e),
                },
                (Some(_), Err(e)) => Renewal::Failed(e),
            },
            Err(e) => Renewal::Failed(e),
        }
    }

    pub(crate) fn renew_cmd(&self, ttl: Duration) -> Cmd {
        let mut cmd = redis::cmd("FLOCK.RENEW");
        cmd.arg(&self.key)
            .arg(&self.owner)
            .arg(u64::try_from(ttl.as_millis()).unwrap_or(u64::MAX))
            .arg(self.token);
        cmd
    }

    /// Rule 4: RELEASE key owner token, the token kept until the reply; retried after a
    /// connection failure, where 0 counts as released.
    pub(crate) async fn release_exact(&self) -> Result<()> {
        let was_lost = self.is_lost();
        lock(&self.timing).releasing = true;
        let mut cmd = redis::cmd("FLOCK.RELEASE");
        cmd.arg(&self.key).arg(&self.owner).arg(self.token);
        let r = match self.send::<i64>(&cmd, true, None).await {
            Sent::Reply(1, _, _) => Ok(()),
            Sent::Reply(_, _, true) => Ok(()),
            Sent::Reply(_, _, false) => {
                self.mark_lost(LossReason::Gone);
                Err(Error::Lost(self.loss_reason().unwrap_or(LossReason::Gone)))
            }
            // A bound lease's connection failed: the server ended the grant when it closed,
            // so there is nothing left to release, and the lease was lost (rule 3).
            Sent::Failed(e) if self.bound && is_connection_error(&e) => {
                self.mark_lost(LossReason::Closed);
                Err(Error::Lost(
                    self.loss_reason().unwrap_or(LossReason::Closed),
                ))
            }
            Sent::Failed(e) => Err(e.into()),
        };
        let reason = self.loss_reason();
        lock(&self.timing).released = true;
        self.wake.notify_one();
        match (r, reason) {
            (Ok(()), Some(reason)) if was_lost => Err(Error::Lost(reason)),
            (r, _) => r,
        }
    }
}
