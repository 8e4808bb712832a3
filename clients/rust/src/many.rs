//! Several keys at once (docs/CLIENTS.md "Several keys at once", scenario M.1): `lock_many` and
//! `acquire_many` over `FLOCK.MACQUIRE`, all or nothing, waiting in every key's queue at once;
//! one ordinary lease per key (watchdog, local clock, fencing, rule 9 watching, rule 11
//! registration), handed back together as [`Leases`] and released together.

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use redis::{Cmd, Value};
use tokio::time::Instant;

use crate::connection::{Conn, Target};
use crate::durable::{require_waitaof, round_trip_all, Ack};
use crate::error::{invalid, Error, Result};
use crate::flock::Flock;
use crate::held::Reentry;
use crate::lease::Lease;
use crate::options::{check_key, check_owner, ttl_ms, Durable, LockOptions, Mode, Wait};
use crate::queue::WaitRetry;
use crate::retry::{backoff, is_transient, RETRIES};
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

/// What the first try or the wait of a `lock_many` got: the tokens, and for each key the send
/// instant its lease counts from.
type Granted = Option<(Vec<u64>, Vec<Instant>)>;

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
    /// `bound(true)`: every grant is bound to one connection of their own (`MACQUIRE ...
    /// BOUND`), which the leases share and which closes with the last of them; its failure
    /// loses them all. `replicas(n)` / `fsync(true)` (rule 10): the WAIT/WAITAOF is pipelined
    /// after the MACQUIRE (after a wait: after the RENEWs that confirm the grants); too few
    /// acknowledgments, and every key is released and the result is `Error::NotDurable`.
    ///
    /// Rule 12, before anything is sent: 1 to 64 keys, none empty or given twice, in a
    /// cluster all in one slot (a `{hash tag}`); the grants are exclusive
    /// (`Mode::Exclusive`), `bound` not with `replicas`/`fsync`, and not `reentrant`. Rule 11:
    /// a key this `Flock` holds with the same owner is `Error::Busy` at once; a wait on a key
    /// that a lease of the calling task holds would wait on itself, so it is one try, then
    /// `Busy`.
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
        let ttl_d = Duration::from_millis(ttl);
        let durable = opts.durability(ttl_d)?;
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
        if durable.is_some_and(|d| d.fsync) {
            require_waitaof(&self.shared).await?;
        }
        let slot = Some(slot_of(&keys[0]));
        let mut cmd = redis::cmd("FLOCK.MACQUIRE");
        cmd.arg(keys.len());
        for k in &keys {
            cmd.arg(k);
        }
        cmd.arg(&owner).arg(ttl);
        if opts.bound {
            cmd.arg("BOUND");
        }
        let many = Many {
            keys: &keys,
            owner: &owner,
            ttl,
            slot,
            durable: durable.as_ref(),
        };
        // A bound set lives on a connection of its own, from the first try on.
        let mut bound_conn = match opts.bound {
            true => Some(self.shared.dedicated().await?),
            false => None,
        };
        let granted = match self.try_many(&many, &cmd, bound_conn.as_mut()).await? {
            Some(g) => Some(g),
            None if wait == Wait::None => None,
            None => {
                self.wait_many(&many, &cmd, wait, bound_conn.as_mut())
                    .await?
            }
        };
        let Some((tokens, sents)) = granted else {
            // Not granted by the one try, and waiting would wait on the caller's own lease.
            if own_wait && !matches!(opts.wait, Wait::None | Wait::For(Duration::ZERO)) {
                return Err(Error::Busy);
            }
            return Ok(None);
        };
        let mut leases = Vec::with_capacity(keys.len());
        for ((key, token), sent) in keys.iter().zip(tokens).zip(sents) {
            let conn = match &bound_conn {
                Some(c) => LeaseConn::Dedicated(c.clone()),
                None => LeaseConn::Shared,
            };
            let lease = Lease::start(
                self.shared.clone(),
                key.clone(),
                owner.clone(),
                token,
                ttl_d,
                sent,
                opts.clone(),
                durable,
                conn,
            );
            leases.push(lease);
        }
        if opts.bound {
            // One connection for the set: its loss is every lease's (`State::mark_lost`).
            let set: Vec<_> = leases.iter().map(|l| Arc::downgrade(l.state())).collect();
            for l in &leases {
                let _ = l.state().bound_set.set(set.clone());
            }
        }
        for l in &leases {
            self.held.add(l);
            self.watcher.add(l.state());
        }
        Ok(Some(Leases { leases }))
    }

    /// The first try, without BLOCK: on the bound connection, or pipelined with its WAIT on a
    /// connection of the durable pool, or on the shared connection (a retry of the same owner
    /// gets the same tokens, G4); counted from the send of the attempt that was answered.
    async fn try_many(
        &self,
        many: &Many<'_>,
        cmd: &Cmd,
        bound_conn: Option<&mut Conn>,
    ) -> Result<Granted> {
        let n = many.keys.len();
        if let Some(c) = bound_conn {
            let sent = Instant::now();
            let tokens = c.query_at::<Option<Vec<u64>>>(cmd, many.slot).await?;
            return tokens.map(|t| many.check(t, vec![sent; n])).transpose();
        }
        if let Some(d) = many.durable {
            let ttl = Duration::from_millis(many.ttl);
            let r = round_trip_all(
                &self.shared,
                std::slice::from_ref(cmd),
                d,
                d.timeout_for(ttl),
                true,
                None,
                many.slot,
            )
            .await?;
            let reply = r.reply.into_iter().next().unwrap_or(Value::Nil);
            let tokens: Option<Vec<u64>> =
                redis::from_redis_value(reply.extract_error()?).map_err(redis::RedisError::from)?;
            let Some(tokens) = tokens else {
                return Ok(None);
            };
            let granted = many.check(tokens, vec![r.sent; n])?;
            self.settle_many(many, d, r.ack, &granted.0).await?;
            return Ok(Some(granted));
        }
        let mut attempt = 0;
        loop {
            let sent = Instant::now();
            match self
                .shared
                .query_at::<Option<Vec<u64>>>(cmd, many.slot)
                .await
            {
                Ok(r) => return r.map(|t| many.check(t, vec![sent; n])).transpose(),
                Err(e) if is_transient(&e) && attempt < RETRIES => {
                    attempt += 1;
                    tokio::time::sleep(backoff(attempt)).await;
                }
                Err(e) => return Err(e.into()),
            }
        }
    }

    /// Rule 10: the grants are handed over only when the wait after them answered enough;
    /// otherwise every key is released again and the error is the caller's.
    async fn settle_many(
        &self,
        many: &Many<'_>,
        d: &Durable,
        ack: redis::RedisResult<Ack>,
        tokens: &[u64],
    ) -> Result<()> {
        let verdict = match ack {
            Ok(a) => a.judge(d),
            Err(e) => Err(Error::Redis(e)),
        };
        if verdict.is_err() {
            self.release_all(many, tokens, None).await;
        }
        verdict
    }

    /// Token-qualified RELEASEs of every key (on the bound connection when given); failures
    /// are left to the ttl.
    async fn release_all(&self, many: &Many<'_>, tokens: &[u64], conn: Option<&mut Conn>) {
        let mut conn = conn;
        for (key, token) in many.keys.iter().zip(tokens) {
            let mut rel = redis::cmd("FLOCK.RELEASE");
            rel.arg(key).arg(many.owner).arg(*token);
            let _ = match conn.as_deref_mut() {
                Some(c) => c.query::<i64>(&rel).await,
                None => self.shared.retrying::<i64>(&rel).await.map(|(n, _)| n),
            };
        }
    }

    /// Wait with `BLOCK` on a connection of its own (rule 8; a bound set's own connection),
    /// across TRYAGAIN (rule 5); a grant is confirmed at once with token-qualified RENEWs
    /// (`renew_all`) and each lease counted from its RENEW (rule 1). A grant one of whose
    /// keys ran out before its RENEW is released and waited for again while time is left.
    async fn wait_many(
        &self,
        many: &Many<'_>,
        base: &Cmd,
        wait: Wait,
        bound_conn: Option<&mut Conn>,
    ) -> Result<Granted> {
        let until = match wait {
            Wait::For(d) => Some(Instant::now() + d),
            _ => None,
        };
        let mut bound_conn = bound_conn;
        let mut own: Option<Conn> = None;
        let mut retry = WaitRetry::default();
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
            let c = match bound_conn.as_deref_mut() {
                Some(c) => c,
                None => match own.as_mut() {
                    Some(c) => c,
                    None => own.insert(self.shared.dedicated().await?),
                },
            };
            // The server times the wait out; the local bound only covers a server that stops
            // answering (the connection is then dropped, and the server releases a grant made
            // to a client that went away).
            let fut = c.query_at::<Option<Vec<u64>>>(&cmd, many.slot);
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
                    many.check(tokens.clone(), Vec::new())?;
                    if let (Some(c), Some(_)) = (own.take(), many.durable) {
                        self.shared.give_back(c); // the durable round trip may take it
                    }
                    let renewed = self
                        .renew_all(many, &tokens, bound_conn.as_deref_mut())
                        .await?;
                    match renewed {
                        Some(sents) => return Ok(Some((tokens, sents))),
                        None => continue,
                    }
                }
                Ok(None) => return Ok(None),
                Err(e) => {
                    retry
                        .after(e, &self.shared, &mut own, bound_conn.as_deref_mut(), until)
                        .await?
                }
            }
        }
    }

    /// Rule 1 after a wait: a token-qualified RENEW of every granted key (on the bound
    /// connection of a bound set; pipelined with the WAIT of a durable one, rule 10), each
    /// lease counted from its own RENEW's send. `None` when a key's grant ran out before its
    /// RENEW: every key is then released (all or nothing). On an error every key is released
    /// too.
    async fn renew_all(
        &self,
        many: &Many<'_>,
        tokens: &[u64],
        bound_conn: Option<&mut Conn>,
    ) -> Result<Option<Vec<Instant>>> {
        let renews: Vec<Cmd> = many
            .keys
            .iter()
            .zip(tokens)
            .map(|(key, token)| {
                let mut renew = redis::cmd("FLOCK.RENEW");
                renew.arg(key).arg(many.owner).arg(many.ttl).arg(*token);
                renew
            })
            .collect();
        let mut bound_conn = bound_conn;
        if let Some(d) = many.durable {
            let ttl = Duration::from_millis(many.ttl);
            let r = round_trip_all(
                &self.shared,
                &renews,
                d,
                d.timeout_for(ttl),
                true,
                None,
                many.slot,
            )
            .await;
            return match r {
                Ok(r) => {
                    let all = r
                        .reply
                        .into_iter()
                        .all(|v| matches!(v.extract_error(), Ok(v) if v != Value::Nil));
                    if !all {
                        self.release_all(many, tokens, None).await;
                        return Ok(None);
                    }
                    self.settle_many(many, d, r.ack, tokens).await?;
                    Ok(Some(vec![r.sent; tokens.len()]))
                }
                Err(e) => {
                    self.release_all(many, tokens, None).await;
                    Err(e.into())
                }
            };
        }
        let mut sents = Vec::with_capacity(tokens.len());
        let mut failed: Option<Error> = None;
        for renew in &renews {
            let r = match bound_conn.as_deref_mut() {
                Some(c) => {
                    let sent = Instant::now();
                    c.query::<Option<u64>>(renew).await.map(|t| (t, sent))
                }
                None => self.shared.retrying::<Option<u64>>(renew).await,
            };
            match r {
                Ok((Some(_), sent)) => sents.push(sent),
                Ok((None, _)) => break,
                Err(e) => {
                    failed = Some(e.into());
                    break;
                }
            }
        }
        if sents.len() == tokens.len() {
            return Ok(Some(sents));
        }
        self.release_all(many, tokens, bound_conn).await;
        failed.map_or(Ok(None), Err)
    }
}

/// One `lock_many`'s request, as its helpers need it.
struct Many<'a> {
    keys: &'a [String],
    owner: &'a str,
    ttl: u64,
    slot: Option<u16>,
    durable: Option<&'a Durable>,
}

impl Many<'_> {
    /// The tokens of a grant, one per key, with the instants the leases count from.
    fn check(&self, tokens: Vec<u64>, sents: Vec<Instant>) -> Result<(Vec<u64>, Vec<Instant>)> {
        if tokens.len() != self.keys.len() {
            return Err(invalid(format!(
                "FLOCK.MACQUIRE answered {} tokens for {} keys",
                tokens.len(),
                self.keys.len()
            )));
        }
        Ok((tokens, sents))
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
    if opts.reentrant {
        return Err(invalid(
            "lock_many does not take reentrant leases: a key this Flock holds with the same \
             owner is Error::Busy",
        ));
    }
    Ok(())
}
