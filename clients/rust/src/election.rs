//! Leader election over one key (docs/CLIENTS.md "The API every client offers", after etcd's
//! `concurrency.Election` and Curator's `LeaderLatch`). A candidate waits in the key's queue
//! (`BLOCK`) for a BOUND grant, so a leader whose process dies steps down at once and the next
//! in line leads; its lease is renewed and watched like any other (rule 9 tells a leader it
//! was deposed). `observe()` follows the leadership with FLOCK.WATCH on a connection of its
//! own, never by polling.

use std::time::Duration;

use redis::Value;

use crate::connection::Conn;
use crate::error::{Error, Result};
use crate::flock::Flock;
use crate::inspect;
use crate::lease::{Lease, LeaseHandle};
use crate::options::{check_key, check_owner, ttl_ms, LockOptions, Wait};

impl Flock {
    /// Leader election over `key` (see [`Election`]): a candidate with this ttl and owner (a
    /// random one when `None`). (Defined here, not in `flock`, so that imports point one way.)
    pub fn election(
        &self,
        key: impl Into<String>,
        ttl: Duration,
        owner: Option<&str>,
    ) -> Result<Election> {
        Election::new(self.clone(), key.into(), ttl, owner.map(str::to_string))
    }
}

/// A leader: its owner and the token of its grant (a fencing token for what it writes).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Leader {
    pub owner: String,
    pub token: u64,
}

/// One candidate of an election (`Flock::election`).
pub struct Election {
    flock: Flock,
    key: String,
    ttl: Duration,
    owner: String,
    lease: Option<Lease>,
}

impl std::fmt::Debug for Election {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Election")
            .field("key", &self.key)
            .field("owner", &self.owner)
            .field("leading", &self.leading())
            .finish()
    }
}

impl Election {
    pub(crate) fn new(
        flock: Flock,
        key: String,
        ttl: Duration,
        owner: Option<String>,
    ) -> Result<Self> {
        check_key(&key)?;
        ttl_ms(ttl)?;
        if let Some(o) = &owner {
            check_owner(o)?;
        }
        Ok(Election {
            flock,
            key,
            ttl,
            owner: owner.unwrap_or_else(|| format!("{:032x}", rand::random::<u128>())),
            lease: None,
        })
    }

    /// The election's key.
    pub fn key(&self) -> &str {
        &self.key
    }

    /// This candidate's owner (given, or random per election).
    pub fn owner(&self) -> &str {
        &self.owner
    }

    /// The lease while this candidate leads; `None` before, after `resign()` or once lost.
    pub fn leading(&self) -> Option<LeaseHandle> {
        self.lease
            .as_ref()
            .filter(|l| !l.is_lost() && !l.is_released())
            .map(|l| l.handle())
    }

    /// Waits in line (`FLOCK.ACQUIRE ... BOUND BLOCK`) until this candidate leads, and
    /// returns its lease's handle: its `lost_signal()` says when the leadership ended.
    /// `Wait::Forever` is no limit; not leading within the wait is `Error::Busy`.
    /// Campaigning while leading returns the same lease.
    pub async fn campaign(&mut self, wait: Wait) -> Result<LeaseHandle> {
        if let Some(h) = self.leading() {
            return Ok(h);
        }
        let opts = LockOptions::new(self.ttl)
            .bound(true)
            .owner(self.owner.clone())
            .wait(wait);
        let lease = self.flock.lock(self.key.as_str(), opts).await?;
        let h = lease.handle();
        self.lease = Some(lease);
        Ok(h)
    }

    /// The current leader (`FLOCK.INFO`), or `None` while nobody leads.
    pub async fn leader(&self) -> Result<Option<Leader>> {
        Ok(self.flock.info(&self.key).await?.and_then(leader_of))
    }

    /// Gives up the leadership if held (the next in line is granted). True when it was held.
    pub async fn resign(&mut self) -> Result<bool> {
        match self.lease.take() {
            Some(l) if !l.is_lost() && !l.is_released() => {
                l.release().await?;
                Ok(true)
            }
            _ => Ok(false),
        }
    }

    /// The leadership's changes: first the current state, then each change, as
    /// `Some(Leader)` or `None` while the key is free. Driven by FLOCK.WATCH on a connection
    /// of its own (token 0 to learn the next leader, the leader's token to learn its end).
    pub async fn observe(&self) -> Result<Observer> {
        Ok(Observer {
            conn: Some(self.flock.dedicated_conn().await?),
            key: self.key.clone(),
            last: None,
        })
    }
}

fn leader_of(i: inspect::Info) -> Option<Leader> {
    if i.holders == 0 {
        return None;
    }
    Some(Leader {
        owner: i.owner?,
        token: i.token?,
    })
}

/// The leadership of one key as it changes (`Election::observe`).
pub struct Observer {
    conn: Option<Conn>,
    key: String,
    /// What was yielded last; `None` before the first.
    last: Option<Option<Leader>>,
}

impl Observer {
    async fn current(&mut self) -> Result<Option<Leader>> {
        let conn = self.conn.as_mut().ok_or(Error::Busy)?;
        let mut cmd = redis::cmd("FLOCK.INFO");
        cmd.arg(&self.key);
        let v: Value = conn.query(&cmd).await?;
        Ok(inspect::info(&v)?.and_then(leader_of))
    }

    /// The next state: at first the current one, then the next change. `Err(Error::Busy)`
    /// after `close()`.
    pub async fn next(&mut self) -> Result<Option<Leader>> {
        loop {
            let now = self.current().await?;
            let Some(last) = &self.last else {
                self.last = Some(now.clone());
                return Ok(now);
            };
            if &now != last {
                self.last = Some(now.clone());
                return Ok(now);
            }
            // Unchanged: wait for the change on the server (the leader's end, or a leader).
            let token = now.as_ref().map(|l| l.token).unwrap_or(0);
            let mut cmd = redis::cmd("FLOCK.WATCH");
            cmd.arg(0).arg(&self.key).arg(token);
            let conn = self.conn.as_mut().ok_or(Error::Busy)?;
            match conn.query::<Value>(&cmd).await {
                Ok(_) => {}
                // A demotion or a slot move: look again.
                Err(e) if matches!(e.code(), Some("UNBLOCKED" | "TRYAGAIN")) => {
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
                Err(e) => return Err(e.into()),
            }
        }
    }

    /// Stops observing: the connection is closed.
    pub fn close(&mut self) {
        self.conn = None;
    }
}
