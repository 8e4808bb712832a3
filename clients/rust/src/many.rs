//! Several keys at once (docs/CLIENTS.md "Several keys at once", scenario M.1): `lock_many` and
//! `acquire_many` over `FLOCK.MACQUIRE`, all or nothing, waiting in every key's queue at once;
//! one ordinary lease per key (watchdog, local clock, fencing, rule 9 watching, rule 11
//! registration), handed back together as [`Leases`] and released together.

use std::collections::HashSet;
use std::time::Duration;

use redis::Cmd;
use tokio::time::Instant;

use crate::connection::{Conn, Target};
use crate::error::{invalid, Error, Result};
use crate::flock::Flock;
use crate::held::Reentry;
use crate::lease::Lease;
use crate::options::{check_key, check_owner, ttl_ms, LockOptions, Mode, Wait};
use crate::retry::{backoff, is_transient, is_tryagain, RETRIES};
use crate::state::LeaseConn;
use crate::watch::slot_of;

/// The most keys one `lock_many` takes (the server's `numkeys` range is 1 to 64).
pub const MAX_KEYS: usize = 64;

/// The leases of one `lock_many`, one per key in the order given. Derefs to `[Lease]`.
/// [`release_all`](Self::release_all) releases them together; dropping the value drops every
/// lease, and each one not yet released is released in the background (as a dropped
/// [`Lease`] is).
#[derive(Debug)]
pub struct Leases {
    leases: Vec<Lease>,
}

impl std::ops::Deref for Leases {
    type Target = [Lease];
    fn deref(&self) -> &[Lease] {
        &self.leases
    }
}

impl Leases {
    /// The leases, to release or keep one by one.
    pub fn into_vec(self) -> Vec<Lease> {
        self.leases
    }

    /// Release every lease (all of them, even after one fails), concurrently. The first
    /// error, if any (e.g. `Error::Lost` for a lease lost meanwhile), is the result.
    pub async fn release_all(self) -> Result<()> {
        let tasks: Vec<_> = self
            .leases
            .into_iter()
            .map(|l| tokio::spawn(l.release()))
            .collect();
        let mut first = None;
        for t in tasks {
            let r = match t.await {
                Ok(r) => r,
                Err(e) => Err(invalid(format!("a release task failed: {e}"))),
            };
            if let (Err(e), None) = (r, &first) {
                first = Some(e);
            }
        }
        first.map_or(Ok(()), Err)
    }
}

impl Flock {
    /// Take every key of `keys` at once (exclusive leases, `FLOCK.MACQUIRE`), or fail with
    /// [`Error::Busy`] when they are not all granted within the wait; nothing is taken then.
    pub async fn lock_many<K: AsRef<str>>(
        &self,
        keys: &[K],
        opts: impl Into<LockOptions>,
    ) -> Result<Leases> {
        self.acquire_many(keys, opts).await?.ok_or(Error::Busy)
    }

    /// Take every key of `keys` at once; `None` when they are not all granted within the wait
    /// (nothing is taken then). With a wait the request stands in every key's queue at once
    /// (`BLOCK`), so it never overtakes an earlier waiter and two such requests cannot
    /// deadlock whatever order their keys are named in.
    ///
    /// Rule 12, before anything is sent: 1 to 64 keys, none empty or given twice, in a
    /// cluster all in one slot (a `{hash tag}`); the grants are exclusive and not durable
    /// (`Mode::Exclusive`, no `replicas`/`fsync`), not `bound` and not `reentrant`. Rule 11:
    /// a key this `Flock` holds with the same owner is `Error::Busy`; a wait on a key that a
    /// lease of the calling task holds would wait on itself, so it is one try, then `Busy`.
    pub async fn acquire_many<K: AsRef<str>>(
        &self,
        keys: &[K],
        opts: impl Into<LockOptions>,
    ) -> Result<Option<Leases>> {
        let opts = opts.into();
        let keys: Vec<String> = keys.iter().map(|k| k.as_ref().to_string()).collect();
        check_many(
            &keys,
            &opts,
            matches!(self.shared.target, Target::Cluster(_)),
        )?;
        let ttl = ttl_ms(opts.ttl)?;
        let mut owner = opts.owner.clone();
        let mut own_wait = false;
        for key in &keys {
            match self.held.reenter(key, &opts)? {
                Reentry::Acquire {
                    owner: o,
                    own_wait: w,
                } => {
                    owner = owner.or(o);
                    own_wait |= w;
                }
                // Not reentrant (checked above): a held lease of the same owner is Busy.
                Reentry::Again(_) => return Err(Error::Busy),
            }
        }
        let owner = owner.unwrap_or_else(|| format!("{:032x}", rand::random::<u128>()));
        let wait = match opts.wait {
            Wait::For(d) if d.is_zero() => Wait::None,
            _ if own_wait => Wait::None,
            w => w,
        };
        let slot = Some(slot_of(&keys[0]));
        let mut cmd = redis::cmd("FLOCK.MACQUIRE");
        cmd.arg(keys.len());
        for k in &keys {
            cmd.arg(k);
        }
        cmd.arg(&owner).arg(ttl);

        // First a plain try on the shared connection (a retry of the same owner gets the
        // same tokens, G4); counted from the send of the attempt that was answered.
        let mut attempt = 0;
        let tried = loop {
            let sent = Instant::now();
            match self.shared.query_at::<Option<Vec<u64>>>(&cmd, slot).await {
                Ok(r) => break r.map(|t| (t, vec![sent; keys.len()])),
                Err(e) if is_transient(&e) && attempt < RETRIES => {
                    attempt += 1;
                    tokio::time::sleep(backoff(attempt)).await;
                }
                Err(e) => return Err(e.into()),
            }
        };
        let granted = match tried {
            Some(g) => Some(g),
            None if wait == Wait::None => None,
            None => self.wait_many(&keys, &owner, ttl, &cmd, slot, wait).await?,
        };
        let Some((tokens, sents)) = granted else {
            // Not granted by the one try, and waiting would wait on the caller's own lease.
            if own_wait && !matches!(opts.wait, Wait::None | Wait::For(Duration::ZERO)) {
                return Err(Error::Busy);
            }
            return Ok(None);
        };
        if tokens.len() != keys.len() {
            return Err(invalid(format!(
                "FLOCK.MACQUIRE answered {} tokens for {} keys",
                tokens.len(),
                keys.len()
            )));
        }
        let ttl_d = Duration::from_millis(ttl);
        let mut leases = Vec::with_capacity(keys.len());
        for ((key, token), sent) in keys.into_iter().zip(tokens).zip(sents) {
            let lease = Lease::start(
                self.shared.clone(),
                key,
                owner.clone(),
                token,
                ttl_d,
                sent,
                opts.clone(),
                None,
                LeaseConn::Shared,
            );
            self.held.add(&lease);
            self.watcher.add(lease.state());
            leases.push(lease);
        }
        Ok(Some(Leases { leases }))
    }

    /// Wait with `BLOCK` on a connection of its own (rule 8), across TRYAGAIN (rule 5); a grant
    /// is renewed at once, key by key, with token-qualified RENEWs, and each lease counted
    /// from its RENEW (rule 1). A grant one of whose keys ran out before its RENEW is released
    /// and waited for again while time is left.
    async fn wait_many(
        &self,
        keys: &[String],
        owner: &str,
        ttl: u64,
        base: &Cmd,
        slot: Option<u16>,
        wait: Wait,
    ) -> Result<Option<(Vec<u64>, Vec<Instant>)>> {
        let until = match wait {
            Wait::For(d) => Some(Instant::now() + d),
            _ => None,
        };
        let mut conn: Option<Conn> = None;
        let mut failures = 0u32;
        let mut moves = 0u32;
        loop {
            let block_ms = match until {
                None => 0u64,
                Some(u) => {
                    let left = u.saturating_duration_since(Instant::now());
                    if left.is_zero() {
                        return Ok(None);
                    }
                    u64::try_from(left.as_millis()).unwrap_or(u64::MAX).max(1)
                }
            };
            let mut cmd = base.clone();
            cmd.arg("BLOCK").arg(block_ms);
            let c = match conn.as_mut() {
                Some(c) => c,
                None => conn.insert(self.shared.dedicated().await?),
            };
            // The server times the wait out; the local bound only covers a server that stops
            // answering (the connection is then dropped, and the server releases a grant made
            // to a client that went away).
            let fut = c.query_at::<Option<Vec<u64>>>(&cmd, slot);
            let reply = match until {
                None => fut.await,
                Some(u) => match tokio::time::timeout_at(u + Duration::from_millis(250), fut).await
                {
                    Ok(r) => r,
                    Err(_) => return Ok(None),
                },
            };
            match reply {
                Ok(Some(tokens)) => {
                    drop(conn.take());
                    match self.renew_all(keys, owner, ttl, &tokens).await? {
                        Some(sents) => return Ok(Some((tokens, sents))),
                        None => continue,
                    }
                }
                Ok(None) => return Ok(None),
                Err(e) if is_tryagain(&e) => {
                    // The slot moved while we waited: ask again at its new owner.
                    moves += 1;
                    tokio::time::sleep(Duration::from_millis((20 * u64::from(moves)).min(500)))
                        .await;
                }
                Err(e) if e.is_timeout() && until.is_none_or(|u| Instant::now() < u) => {
                    conn = None;
                }
                Err(e) if is_transient(&e) && failures < RETRIES => {
                    failures += 1;
                    conn = None;
                    tokio::time::sleep(backoff(failures)).await;
                }
                Err(e) => return Err(e.into()),
            }
        }
    }

    /// Rule 1 after a wait: a token-qualified RENEW of every granted key, each lease counted
    /// from its own RENEW's send. `None` when a key's grant ran out before its RENEW: every
    /// key is then released (all or nothing). On an error every key is released too.
    async fn renew_all(
        &self,
        keys: &[String],
        owner: &str,
        ttl: u64,
        tokens: &[u64],
    ) -> Result<Option<Vec<Instant>>> {
        let mut sents = Vec::with_capacity(keys.len());
        let mut failed: Option<Error> = None;
        for (key, token) in keys.iter().zip(tokens) {
            let mut renew = redis::cmd("FLOCK.RENEW");
            renew.arg(key).arg(owner).arg(ttl).arg(*token);
            match self.shared.retrying::<Option<u64>>(&renew).await {
                Ok((Some(_), sent)) => sents.push(sent),
                Ok((None, _)) => break,
                Err(e) => {
                    failed = Some(e.into());
                    break;
                }
            }
        }
        if sents.len() == keys.len() {
            return Ok(Some(sents));
        }
        for (key, token) in keys.iter().zip(tokens) {
            let mut rel = redis::cmd("FLOCK.RELEASE");
            rel.arg(key).arg(owner).arg(*token);
            let _ = self.shared.query::<i64>(&rel).await;
        }
        failed.map_or(Ok(None), Err)
    }
}

/// Rule 12 for `lock_many`: what the client refuses before anything is sent.
fn check_many(keys: &[String], opts: &LockOptions, cluster: bool) -> Result<()> {
    if keys.is_empty() || keys.len() > MAX_KEYS {
        return Err(invalid(format!(
            "lock_many takes 1 to {MAX_KEYS} keys, not {}",
            keys.len()
        )));
    }
    let mut seen = HashSet::with_capacity(keys.len());
    for k in keys {
        check_key(k)?;
        if !seen.insert(k.as_str()) {
            return Err(invalid(format!("lock_many: the key {k:?} is given twice")));
        }
    }
    if cluster {
        let slot = slot_of(&keys[0]);
        if let Some(k) = keys.iter().find(|k| slot_of(k) != slot) {
            return Err(invalid(format!(
                "lock_many in a cluster: every key must hash to one slot ({:?} and {k:?} do \
                 not; use a {{hash tag}})",
                keys[0]
            )));
        }
    }
    if let Some(o) = &opts.owner {
        check_owner(o)?;
    }
    if opts.mode != Mode::Exclusive {
        return Err(invalid(
            "lock_many takes exclusive locks only (Mode::Exclusive)",
        ));
    }
    if opts.bound {
        return Err(invalid("lock_many does not take bound leases"));
    }
    if opts.replicas != 0 || opts.fsync {
        return Err(invalid(
            "lock_many does not take durable leases (replicas, fsync)",
        ));
    }
    if opts.reentrant {
        return Err(invalid("lock_many does not take reentrant leases"));
    }
    Ok(())
}
