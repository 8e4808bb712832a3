//! The factory, [`Flock`]: taking a lock (one try on the shared connection, then the wait in
//! `queue`), the scoped `with_lock`, and the supervisor's and operator's calls that need no
//! lease (release by owner, revoke, check).

use std::fmt;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use crate::connection::{Shared, Target};
use crate::durable::{require_waitaof, round_trip, settle};
use crate::error::{invalid, Error, Result};
use crate::held::{Held, Reentry};
use crate::inspect::{self, Holder, Info, Stats, Waiter};
use crate::lease::{Lease, LeaseHandle};
use crate::options::{check_key, check_owner, check_token, ttl_ms, LockOptions, Mode, Wait};
use crate::queue::wait_for;
use crate::state::LeaseConn;
use crate::watch::Watcher;

/// The factory: takes a `redis::Client` or a `ClusterClient` and opens its own connections
/// (one multiplexed connection for commands and renewals, one more per BLOCK wait and per
/// bound lease). Cheap to clone.
#[derive(Clone)]
pub struct Flock {
    pub(crate) shared: Arc<Shared>,
    /// Rule 11: the leases this factory (and its clones) handed out.
    pub(crate) held: Arc<Held>,
    /// Rule 9: the FLOCK.WATCH lanes that hear those leases' grants end.
    pub(crate) watcher: Arc<Watcher>,
}

impl fmt::Debug for Flock {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let kind = match self.shared.target {
            Target::Single(_) => "single",
            Target::Cluster(_) => "cluster",
        };
        f.debug_struct("Flock").field("target", &kind).finish()
    }
}

/// A lock that `lock` handed out: the same type as [`Lease`].
pub type Guard = Lease;

impl Flock {
    /// A factory over a `redis::Client` or a `redis::cluster::ClusterClient`. Connects lazily.
    pub fn new(client: impl Into<Target>) -> Self {
        let shared = Arc::new(Shared::new(client.into()));
        Flock {
            watcher: Arc::new(Watcher::new(shared.clone())),
            shared,
            held: Arc::new(Held::default()),
        }
    }

    /// Take the lock or fail with [`Error::Busy`] when it is not granted within the wait.
    pub async fn lock(
        &self,
        key: impl Into<String>,
        opts: impl Into<LockOptions>,
    ) -> Result<Guard> {
        self.acquire(key, opts).await?.ok_or(Error::Busy)
    }

    /// Take the lock; `None` when it is not granted within the wait.
    ///
    /// Rule 11: when this `Flock` already holds a live lease of `key` with the same owner, the
    /// result is `Error::Busy` at once (the held lease is left as it was), or with
    /// `reentrant(true)` another hold of that same lease. A wait on a key that a lease of the
    /// calling tokio task holds would wait on itself: it is one try, then `Error::Busy`.
    pub async fn acquire(
        &self,
        key: impl Into<String>,
        opts: impl Into<LockOptions>,
    ) -> Result<Option<Lease>> {
        let key = key.into();
        let opts = opts.into();
        // Rule 12: every argument checked before anything is sent.
        check_key(&key)?;
        let ttl = ttl_ms(opts.ttl)?;
        if let Some(o) = &opts.owner {
            check_owner(o)?;
        }
        if let Mode::Permits(0) = opts.mode {
            return Err(invalid(
                "limit (Mode::Permits) must be a positive integer, not 0",
            ));
        }
        let ttl_d = Duration::from_millis(ttl);
        // Rule 10's checks too come before anything is sent.
        let durable = opts.durability(ttl_d)?;
        let (owner, own_wait) = match self.held.reenter(&key, &opts)? {
            Reentry::Again(lease) => return Ok(Some(lease)),
            Reentry::Acquire { owner, own_wait } => (owner, own_wait),
        };
        let owner = owner.unwrap_or_else(|| format!("{:032x}", rand::random::<u128>()));
        let wait = match opts.wait {
            Wait::For(d) if d.is_zero() => Wait::None,
            w => w,
        };
        let lease = self
            .acquire_as(
                key,
                owner,
                ttl,
                opts,
                durable,
                if own_wait { Wait::None } else { wait },
            )
            .await?;
        match lease {
            Some(lease) => {
                self.held.add(&lease);
                self.watcher.add(lease.state());
                Ok(Some(lease))
            }
            // Not granted by the one try, and waiting would wait on the caller's own lease.
            None if own_wait && wait != Wait::None => Err(Error::Busy),
            None => Ok(None),
        }
    }

    async fn acquire_as(
        &self,
        key: String,
        owner: String,
        ttl: u64,
        opts: LockOptions,
        durable: Option<crate::options::Durable>,
        wait: Wait,
    ) -> Result<Option<Lease>> {
        let mut cmd = redis::cmd("FLOCK.ACQUIRE");
        cmd.arg(&key).arg(&owner).arg(ttl);
        match opts.mode {
            Mode::Exclusive => {}
            Mode::Shared => {
                cmd.arg("SHARED");
            }
            Mode::Permits(n) => {
                cmd.arg("LIMIT").arg(n);
            }
        }
        if opts.bound {
            cmd.arg("BOUND");
        }
        let ttl_d = Duration::from_millis(ttl);
        // Rule 10: WAITAOF for fsync, asked of the server before the ACQUIRE.
        if durable.is_some_and(|d| d.fsync) {
            require_waitaof(&self.shared).await?;
        }

        if opts.bound {
            // A bound lease lives on a connection of its own, which it keeps.
            let mut conn = self.shared.dedicated().await?;
            let sent = Instant::now();
            let token: Option<u64> = conn.query(&cmd).await?;
            let (token, sent) = match token {
                Some(t) => (t, sent),
                None if wait == Wait::None => return Ok(None),
                None => {
                    match wait_for(
                        &self.shared,
                        &key,
                        &owner,
                        ttl,
                        &cmd,
                        wait,
                        Some(&mut conn),
                        None,
                    )
                    .await?
                    {
                        Some(x) => x,
                        None => return Ok(None),
                    }
                }
            };
            return Ok(Some(Lease::start(
                self.shared.clone(),
                key,
                owner,
                token,
                ttl_d,
                sent,
                opts,
                None,
                LeaseConn::Dedicated(conn),
            )));
        }

        // First a plain try on the shared connection (no wait: nobody jumps the queue, a
        // waiter-free free key is granted at once). ACQUIRE of the same owner is idempotent
        // (G4), so a connection failure is retried; the lease is counted from the send of the
        // attempt that was answered.
        // A durable try carries its WAIT/WAITAOF in the same pipeline, on a connection of the
        // durable pool (a WAIT blocks its connection); only a grant counts, and one that too
        // few acknowledged is released again.
        let (token, sent) = match &durable {
            None => self.shared.retrying::<Option<u64>>(&cmd).await?,
            Some(d) => {
                let r = round_trip::<Option<u64>>(
                    &self.shared,
                    &cmd,
                    d,
                    d.timeout_for(ttl_d),
                    true,
                    None,
                )
                .await?;
                if let Some(t) = r.reply {
                    settle(&self.shared, &key, &owner, t, d, r.ack).await?;
                }
                (r.reply, r.sent)
            }
        };
        let (token, sent) = match token {
            Some(t) => (t, sent),
            None if wait == Wait::None => return Ok(None),
            None => match wait_for(
                &self.shared,
                &key,
                &owner,
                ttl,
                &cmd,
                wait,
                None,
                durable.as_ref(),
            )
            .await?
            {
                Some(x) => x,
                None => return Ok(None),
            },
        };
        Ok(Some(Lease::start(
            self.shared.clone(),
            key,
            owner,
            token,
            ttl_d,
            sent,
            opts,
            durable,
            LeaseConn::Shared,
        )))
    }

    /// Scoped lock: take the lock (or fail with `Busy`), run `f` with a handle of the lease,
    /// release, and return `f`'s result. When `f` fails its error goes on unchanged (the
    /// handle's `is_lost()` shows a loss); when `f` succeeds but the lease was lost meanwhile,
    /// the result is `Error::Lost(reason)` (converted with `From`).
    pub async fn with_lock<F, Fut, T, E>(
        &self,
        key: impl Into<String>,
        opts: impl Into<LockOptions>,
        f: F,
    ) -> std::result::Result<T, E>
    where
        F: FnOnce(LeaseHandle) -> Fut,
        Fut: Future<Output = std::result::Result<T, E>>,
        E: From<Error>,
    {
        let lease = self.lock(key, opts).await?;
        let out = f(lease.handle()).await;
        let released = lease.release().await;
        match (out, released) {
            (Err(e), _) => Err(e),
            (Ok(v), Ok(())) => Ok(v),
            (Ok(_), Err(e)) => Err(e.into()),
        }
    }

    /// Release `owner`'s grant of `key` from anywhere (a supervisor that knows the owner);
    /// with a token only that grant. True when a live grant was released.
    pub async fn release(&self, key: &str, owner: &str, token: Option<u64>) -> Result<bool> {
        check_key(key)?;
        check_owner(owner)?;
        if let Some(t) = token {
            check_token(t)?;
        }
        let mut cmd = redis::cmd("FLOCK.RELEASE");
        cmd.arg(key).arg(owner);
        if let Some(t) = token {
            cmd.arg(t);
        }
        Ok(self.shared.query::<i64>(&cmd).await? == 1)
    }

    /// End the key's live grants at once (an operator's tool), or only `owner`'s. Returns the
    /// number of grants ended.
    pub async fn revoke(&self, key: &str, owner: Option<&str>) -> Result<u64> {
        check_key(key)?;
        if let Some(o) = owner {
            check_owner(o)?;
        }
        let mut cmd = redis::cmd("FLOCK.REVOKE");
        cmd.arg(key);
        if let Some(o) = owner {
            cmd.arg(o);
        }
        Ok(self.shared.query::<u64>(&cmd).await?)
    }

    /// FLOCK.CHECK: the remaining lease of `token` on the server, zero when it is not live.
    pub async fn check(&self, key: &str, token: u64) -> Result<Duration> {
        check_key(key)?;
        check_token(token)?;
        let mut cmd = redis::cmd("FLOCK.CHECK");
        cmd.arg(key).arg(token);
        Ok(Duration::from_millis(self.shared.query::<u64>(&cmd).await?))
    }

    /// Rule 9: why this factory stopped watching its leases with FLOCK.WATCH (a server
    /// without it, an ACL that refuses it), or `None` while it watches. When it does not,
    /// losses are found at the next renewal.
    pub fn watch_disabled(&self) -> Option<String> {
        self.watcher.disabled()
    }

    /// Rule 9: how many watching connections (one per node, per slot with leases in a
    /// cluster, per further 64 leases) are open or opening now.
    pub fn watch_connections(&self) -> usize {
        self.watcher.lanes_running()
    }

    /// A connection of its own (an election's observer).
    pub(crate) async fn dedicated_conn(&self) -> Result<crate::connection::Conn> {
        Ok(self.shared.dedicated().await?)
    }

    /// `FLOCK.INFO key`: the key's state, or `None` when the server does not know the key.
    pub async fn info(&self, key: &str) -> Result<Option<Info>> {
        check_key(key)?;
        let mut cmd = redis::cmd("FLOCK.INFO");
        cmd.arg(key);
        inspect::info(&self.shared.query::<redis::Value>(&cmd).await?)
    }

    /// `FLOCK.HOLDERS key`: every live grant of the key, oldest first.
    pub async fn holders(&self, key: &str) -> Result<Vec<Holder>> {
        check_key(key)?;
        let mut cmd = redis::cmd("FLOCK.HOLDERS");
        cmd.arg(key);
        inspect::holders(&self.shared.query::<redis::Value>(&cmd).await?)
    }

    /// `FLOCK.WAITERS key`: the requests waiting for the key, first in line first; empty
    /// when nobody waits.
    pub async fn waiters(&self, key: &str) -> Result<Vec<Waiter>> {
        check_key(key)?;
        let mut cmd = redis::cmd("FLOCK.WAITERS");
        cmd.arg(key);
        inspect::waiters(&self.shared.query::<redis::Value>(&cmd).await?)
    }

    /// Whether a live grant holds the key (a key with only waiters, or only in lock-delay,
    /// is not locked).
    pub async fn locked(&self, key: &str) -> Result<bool> {
        Ok(self.info(key).await?.is_some_and(|i| i.holders > 0))
    }

    /// `FLOCK.STATS GET [class ...]`: the figures of the given classes of keys (all when
    /// `classes` is empty). On a cluster, those of the one node the command reaches.
    pub async fn stats(&self, classes: &[&str]) -> Result<Stats> {
        let mut cmd = redis::cmd("FLOCK.STATS");
        cmd.arg("GET");
        for c in classes {
            if c.is_empty() {
                return Err(invalid("a class must be a non-empty string"));
            }
            cmd.arg(*c);
        }
        inspect::stats(&self.shared.query::<redis::Value>(&cmd).await?)
    }
}
