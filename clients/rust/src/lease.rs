//! What a caller holds: [`Lease`] (the grant and the duty to release it) and [`LeaseHandle`]
//! (a clonable view of it for other tasks): the lease clock's answers, the token, CHECK,
//! RENEW and fenced commands, and the release.

use std::fmt;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use redis::{Cmd, FromRedisValue};
use tokio::sync::{watch, Notify};
use tokio::time::Instant;

use crate::connection::Shared;
use crate::error::{Error, LossReason, Result};
use crate::options::{ttl_ms, Durable, LockOptions, Mode};
use crate::state::{Caller, LeaseConn, Renewal, Sent, State, Timing};
use crate::sync::lock;
use crate::watchdog::Keeper;

/// A shareable view of a lease (what `with_lock` hands its closure): everything but
/// `release`. Cheap to clone.
#[derive(Clone)]
pub struct LeaseHandle {
    pub(crate) st: Arc<State>,
}

impl fmt::Debug for LeaseHandle {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Lease")
            .field("key", &self.st.key)
            .field("owner", &self.st.owner)
            .field("token", &self.st.token)
            .field("mode", &self.st.mode)
            .field("bound", &self.st.bound)
            .field("lost", &self.is_lost())
            .field("remaining", &self.remaining())
            .finish()
    }
}

impl LeaseHandle {
    /// The lock key.
    pub fn key(&self) -> &str {
        &self.st.key
    }
    /// The owner string sent to the server.
    pub fn owner(&self) -> &str {
        &self.st.owner
    }
    /// The fencing token of this grant: hand it to outside resources.
    pub fn token(&self) -> u64 {
        self.st.token
    }
    /// The kind of grant.
    pub fn mode(&self) -> Mode {
        self.st.mode
    }
    /// Rule 1: the time left by the local lease clock, counted from the send of the request
    /// that granted or last renewed the grant; never more than the server's CHECK; zero once
    /// lost or released.
    pub fn remaining(&self) -> Duration {
        self.st.remaining()
    }
    /// Lost: the grant ended on the server, a RENEW answered nil, or the local deadline
    /// passed. Checked against the local clock, so it needs no round trip.
    pub fn is_lost(&self) -> bool {
        self.st.is_lost()
    }
    /// Why the lease was lost (rule 12), `None` while it is live and once it was released
    /// cleanly (a released lease is not lost).
    pub fn lost_reason(&self) -> Option<LossReason> {
        self.st.loss_reason()
    }
    /// Released by its holder (`release()`, or the background release of a dropped lease).
    pub fn is_released(&self) -> bool {
        self.st.is_released()
    }
    /// A watch channel that turns `true` when the lease is lost (and stays so).
    pub fn lost_signal(&self) -> watch::Receiver<bool> {
        self.st.lost.subscribe()
    }
    /// Wait up to `timeout` for the lease to be lost; true when it is.
    pub async fn wait_lost(&self, timeout: Duration) -> bool {
        if self.is_lost() {
            return true;
        }
        // The lease's own task marks the loss when the local deadline passes, so the channel
        // covers expiry too.
        let mut rx = self.lost_signal();
        matches!(
            tokio::time::timeout(timeout, rx.wait_for(|v| *v)).await,
            Ok(Ok(_))
        ) || self.is_lost()
    }
    /// "Is there enough lease left for the critical step?": `Error::Lost(reason)` when lost
    /// (`Released` when released), `Error::TooShort` when live with less than `min` left. From
    /// the local clock only; it changes nothing.
    pub fn ensure(&self, min: Duration) -> Result<()> {
        if let Some(e) = self.st.ended() {
            return Err(e);
        }
        let remaining = self.st.remaining();
        if remaining.is_zero() {
            return Err(self
                .st
                .ended()
                .unwrap_or(Error::Lost(LossReason::DeadlinePassed)));
        }
        if remaining < min {
            return Err(Error::TooShort { remaining });
        }
        Ok(())
    }
    /// FLOCK.CHECK on the server: the remaining lease there; zero (and the lease marked
    /// lost, reason `gone`) when the grant is no longer live. On a bound lease whose
    /// connection failed it is the connection's error, and the lease is lost (`closed`).
    pub async fn check(&self) -> Result<Duration> {
        let mut cmd = redis::cmd("FLOCK.CHECK");
        cmd.arg(&self.st.key).arg(self.st.token);
        match self.st.send::<u64>(&cmd, true, None).await {
            Sent::Reply(0, _, _) => {
                if !self.st.is_released() {
                    self.st.mark_lost(LossReason::Gone);
                }
                Ok(Duration::ZERO)
            }
            Sent::Reply(ms, _, _) => Ok(Duration::from_millis(ms)),
            Sent::Failed(e) => Err(e.into()),
        }
    }
    /// `FLOCK.HOLDERS` of this lease's key: every live grant of it, oldest first.
    pub async fn holders(&self) -> Result<Vec<crate::inspect::Holder>> {
        let mut cmd = redis::cmd("FLOCK.HOLDERS");
        cmd.arg(&self.st.key);
        match self.st.send::<redis::Value>(&cmd, true, None).await {
            Sent::Reply(v, _, _) => crate::inspect::holders(&v),
            Sent::Failed(e) => Err(e.into()),
        }
    }
    /// Renew now with a token-qualified RENEW, for `ttl` (default: the current ttl, which a
    /// given `ttl` replaces for the watchdog too). `Error::Lost` when the grant is gone. On a
    /// durable lease (rule 10) `Error::NotDurable` when too few replicas acknowledged the
    /// renewal in time: the lease stays live and its local deadline stays where the last
    /// acknowledged grant or renewal put it.
    pub async fn renew(&self, ttl: Option<Duration>) -> Result<()> {
        if let Some(e) = self.st.ended() {
            return Err(e);
        }
        let ttl = match ttl {
            Some(t) => Duration::from_millis(ttl_ms(t)?),
            None => lock(&self.st.timing).ttl,
        };
        let deadline = lock(&self.st.timing).deadline;
        match self.st.renew_once(ttl, deadline, !self.st.bound).await {
            Renewal::Renewed(sent) => {
                self.st.renewed(sent, ttl);
                self.st.wake.notify_one();
                Ok(())
            }
            Renewal::Nil => {
                self.st.mark_lost(LossReason::RenewRefused);
                Err(self.lost_now())
            }
            // Rule 10: renewed on the master, too few acknowledged: the deadline stays.
            Renewal::Short(e) => Err(e),
            Renewal::Failed(e) => {
                if Instant::now() >= deadline || self.st.bound {
                    self.st.mark_lost(if self.st.bound {
                        LossReason::Closed
                    } else {
                        LossReason::DeadlinePassed
                    });
                    return Err(self.lost_now());
                }
                Err(e.into())
            }
        }
    }
    /// The error of a lease just marked lost: its first loss's reason.
    fn lost_now(&self) -> Error {
        Error::Lost(self.st.loss_reason().unwrap_or(LossReason::Lost))
    }
    /// Run `cmd` through FLOCK.FENCED with this lease's token: the server runs it only while
    /// the token is the live grant. A refusal as stale is `Error::Fenced` and marks the lease
    /// lost (`fenced-refused`). The server decides, even when the local clock already says
    /// lost; after a clean release there is nothing to ask: `Error::Lost(Released)` at once,
    /// nothing sent (rule 12).
    ///
    /// The reply's type: the command runs whatever `T` is, so a reply that `T` cannot hold
    /// must not turn a write that ran into an error. `T` is checked against the reply only
    /// after it is known the write ran, and a mismatch is [`Error::Reply`] carrying the
    /// reply as it came (the write ran; nothing is lost). Use `redis::Value` to take any reply.
    pub async fn fenced<T: FromRedisValue>(&self, cmd: &Cmd) -> Result<T> {
        if self.st.is_released() {
            return Err(Error::Lost(LossReason::Released));
        }
        let mut f = redis::cmd("FLOCK.FENCED");
        f.arg(&self.st.key).arg(self.st.token);
        for a in cmd.args_iter() {
            if let redis::Arg::Simple(bytes) = a {
                f.arg(bytes);
            }
        }
        // Not retried: a write whose reply was lost may have run.
        match self.st.send::<redis::Value>(&f, false, None).await {
            Sent::Reply(v, _, _) => match T::from_redis_value(v.clone()) {
                Ok(t) => Ok(t),
                Err(e) => Err(Error::Reply {
                    reply: v,
                    detail: e.to_string(),
                }),
            },
            Sent::Failed(e) if e.code() == Some("FENCED") => {
                self.st.mark_lost(LossReason::FencedRefused);
                let text = match e.detail() {
                    Some(d) => format!("FENCED {d}"),
                    None => e.to_string(),
                };
                Err(Error::Fenced(text))
            }
            Sent::Failed(e) => Err(e.into()),
        }
    }
}

/// A held lock: a [`LeaseHandle`] (via `Deref`) plus the duty to release. `release().await`
/// ends it; dropping an unreleased lease stops its watchdog and releases in the background.
/// A reentrant lease (`reentrant(true)`, rule 11) is one grant held several times: each
/// `Lease` value is one hold, and only the last hold's release or drop ends the grant.
pub struct Lease {
    handle: LeaseHandle,
    /// This value still holds its hold (not yet released or dropped).
    holding: bool,
}

impl fmt::Debug for Lease {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.handle.fmt(f)
    }
}

impl std::ops::Deref for Lease {
    type Target = LeaseHandle;
    fn deref(&self) -> &LeaseHandle {
        &self.handle
    }
}

impl Lease {
    /// A lease for a grant the server just made, counted from `sent` (rule 1), with its
    /// watchdog started (rule 2); `durable` is what its renewals must have acknowledged
    /// (rule 10, checked from `opts` by the caller).
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn start(
        shared: Arc<Shared>,
        key: String,
        owner: String,
        token: u64,
        ttl: Duration,
        sent: Instant,
        opts: LockOptions,
        durable: Option<Durable>,
        conn: LeaseConn,
    ) -> Lease {
        let (lost_tx, _) = watch::channel(false);
        let state = Arc::new(State {
            key,
            owner,
            token,
            mode: opts.mode,
            bound: opts.bound,
            durable,
            shared,
            conn: tokio::sync::Mutex::new(conn),
            timing: Mutex::new(Timing {
                ttl,
                deadline: sent + ttl,
                last_sent: sent,
                released: false,
                holds: 1,
                releasing: false,
            }),
            lost: lost_tx,
            reason: Mutex::new(None),
            wake: Notify::new(),
            keeper: Mutex::new(Keeper::Pending),
            task: Caller::current(),
            reentrant: opts.reentrant,
            bound_set: OnceLock::new(),
        });
        state.shared.keepers.start(&state, opts.renew);
        Lease {
            handle: LeaseHandle { st: state },
            holding: true,
        }
    }

    /// One more hold of a live reentrant lease (rule 11): the same grant, released when its
    /// last hold is. `None` when the lease ended meanwhile.
    pub(crate) fn again(st: &Arc<State>) -> Option<Lease> {
        if !st.hold() {
            return None;
        }
        Some(Lease {
            handle: LeaseHandle { st: st.clone() },
            holding: true,
        })
    }

    /// The state (for the factory's registry of held leases).
    pub(crate) fn state(&self) -> &Arc<State> {
        &self.handle.st
    }

    /// The holds of this lease's grant (1 unless reentrant and re-entered).
    pub fn holds(&self) -> u32 {
        lock(&self.handle.st.timing).holds
    }

    /// A shareable handle (for other tasks; it cannot release).
    pub fn handle(&self) -> LeaseHandle {
        self.handle.clone()
    }

    /// Stop the watchdog (waiting until it has stopped), then `FLOCK.RELEASE key owner
    /// token`. `Error::Lost(reason)` when the lease had been lost (the RELEASE is sent
    /// anyway).
    ///
    /// On a reentrant lease held more than once, it drops this hold only: the grant stays
    /// (`Ok`, nothing sent) until the last hold is released.
    pub async fn release(mut self) -> Result<()> {
        self.holding = false;
        if !self.handle.st.unhold() {
            return match self.handle.st.ended() {
                Some(Error::Lost(LossReason::Released)) | None => Ok(()),
                Some(e) => Err(e),
            };
        }
        if let Some(k) = Keeper::stop(&self.handle.st.keeper) {
            let _ = k.await;
        }
        self.handle.st.release_exact().await
    }
}

impl Drop for Lease {
    fn drop(&mut self) {
        if !self.holding {
            return;
        }
        self.holding = false;
        if !self.handle.st.unhold() {
            return;
        }
        // The last hold, forgotten: stop renewing and release in the background (rule 11).
        let keeper = Keeper::stop(&self.handle.st.keeper);
        let st = self.handle.st.clone();
        if let Ok(rt) = tokio::runtime::Handle::try_current() {
            rt.spawn(async move {
                if let Some(k) = keeper {
                    let _ = k.await;
                }
                let _ = st.release_exact().await;
            });
        } else {
            lock(&st.timing).released = true;
        }
    }
}
