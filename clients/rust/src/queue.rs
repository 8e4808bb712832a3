//! Waiting for a held lock in the server's FIFO queue (`BLOCK`, rule 5), never by polling: on
//! a connection of its own (rule 8), asked again after a cluster slot move (`TRYAGAIN`) or a
//! response timeout of the caller's cluster client, and a grant counted from the RENEW that
//! follows it (rule 1), which for a durable grant carries the WAIT (rule 10).

use std::time::Duration;

use redis::Cmd;
use tokio::time::Instant;

use crate::connection::{Conn, Shared};
use crate::durable::{round_trip, settle};
use crate::error::Result;
use crate::options::{Durable, Wait};
use crate::retry::{backoff, is_connection_error, is_transient, is_tryagain, RETRIES};
use redis::RedisError;

/// Wait in the server's queue with BLOCK on a dedicated connection (rule 8), across
/// TRYAGAIN (rule 5); a grant is renewed at once with a token-qualified RENEW and counted
/// from that RENEW (rule 1). A durable grant's RENEW is pipelined with its WAIT/WAITAOF
/// (rule 10), on the connection the wait ran on (handed to the durable pool and borrowed
/// back): the replicas acknowledge the RENEW and, with it, the grant that came before it in
/// the replication stream; too few, and the grant is released and the error is
/// `Error::NotDurable`. Returns the token and the send instant of that RENEW.
#[allow(clippy::too_many_arguments)]
pub(crate) async fn wait_for(
    shared: &Shared,
    key: &str,
    owner: &str,
    ttl: u64,
    base: &Cmd,
    wait: Wait,
    bound_conn: Option<&mut Conn>,
    durable: Option<&Durable>,
) -> Result<Option<(u64, Instant)>> {
    let until = match wait {
        Wait::For(d) => Some(Instant::now() + d),
        _ => None,
    };
    let mut own: Option<Conn> = None;
    let mut bound_conn = bound_conn;
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
        let conn: &mut Conn = match bound_conn.as_deref_mut() {
            Some(c) => c,
            None => {
                if own.is_none() {
                    own = Some(shared.dedicated().await?);
                }
                match own.as_mut() {
                    Some(c) => c,
                    None => continue,
                }
            }
        };
        // The server times the wait out; the local bound only covers a server that stops
        // answering (the connection is then dropped, and a grant made to a client that
        // went away is released by the server).
        let fut = conn.query::<Option<u64>>(&cmd);
        let reply = match until {
            None => fut.await,
            Some(u) => match tokio::time::timeout_at(u + Duration::from_millis(250), fut).await {
                Ok(r) => r,
                Err(_) => return Ok(None),
            },
        };
        match reply {
            Ok(Some(token)) => {
                // Rule 1: the wait may have been longer than the ttl: renew now, count
                // from this RENEW.
                let mut renew = redis::cmd("FLOCK.RENEW");
                renew.arg(key).arg(owner).arg(ttl).arg(token);
                if let Some(d) = durable {
                    // The wait's connection goes to the durable pool, where the round trip
                    // takes it (or a new one, on a retry).
                    if let Some(c) = own.take() {
                        shared.give_back(c);
                    }
                    let ttl_d = Duration::from_millis(ttl);
                    match round_trip::<Option<u64>>(
                        shared,
                        &renew,
                        d,
                        d.timeout_for(ttl_d),
                        true,
                        None,
                    )
                    .await
                    {
                        Ok(r) => match r.reply {
                            Some(_) => {
                                settle(shared, key, owner, token, d, r.ack).await?;
                                return Ok(Some((token, r.sent)));
                            }
                            None => continue,
                        },
                        Err(e) => {
                            let mut rel = redis::cmd("FLOCK.RELEASE");
                            rel.arg(key).arg(owner).arg(token);
                            let _ = shared.query::<i64>(&rel).await;
                            return Err(e.into());
                        }
                    }
                }
                let renewed = match bound_conn.as_deref_mut() {
                    Some(c) => {
                        let sent = Instant::now();
                        c.query::<Option<u64>>(&renew).await.map(|t| (t, sent))
                    }
                    None => {
                        drop(own.take());
                        shared.retrying(&renew).await
                    }
                };
                match renewed {
                    Ok((Some(_), sent)) => return Ok(Some((token, sent))),
                    // Expired between the grant and the RENEW: wait again if time is left.
                    Ok((None, _)) => continue,
                    Err(e) => {
                        let mut rel = redis::cmd("FLOCK.RELEASE");
                        rel.arg(key).arg(owner).arg(token);
                        let _ = shared.query::<i64>(&rel).await;
                        return Err(e.into());
                    }
                }
            }
            Ok(None) => return Ok(None),
            Err(e) => {
                retry
                    .after(e, shared, &mut own, bound_conn.as_deref_mut(), until)
                    .await?
            }
        }
    }
}

/// What a BLOCK wait (one key's, or several keys' at once) does when its call failed: the
/// one policy of both. `Ok(())`: wait again (after the pause this takes); `Err`: give up.
#[derive(Default)]
pub(crate) struct WaitRetry {
    failures: u32,
    moves: u32,
}

impl WaitRetry {
    /// `own`: the wait's own connection (dropped when a new one is needed); `bound_conn`: a
    /// bound wait's connection (replaced after a connection error); `until`: the wait's end.
    pub(crate) async fn after(
        &mut self,
        e: RedisError,
        shared: &Shared,
        own: &mut Option<Conn>,
        bound_conn: Option<&mut Conn>,
        until: Option<Instant>,
    ) -> Result<()> {
        let bound = bound_conn.is_some();
        if is_tryagain(&e) {
            // The key moved to another node while we waited: ask again; the cluster
            // connection follows the ASK/MOVED to the new owner of the slot.
            self.moves += 1;
            let pause = (20 * u64::from(self.moves)).min(500);
            tokio::time::sleep(Duration::from_millis(pause)).await;
        } else if !bound && e.is_timeout() && until.is_none_or(|u| Instant::now() < u) {
            // A response timeout of the caller's cluster client cut the wait short: a new
            // connection (the server drops the old waiter with the old one) and the rest of
            // the wait.
            *own = None;
        } else if !bound && is_transient(&e) && self.failures < RETRIES {
            self.failures += 1;
            *own = None;
            tokio::time::sleep(backoff(self.failures)).await;
        } else if is_connection_error(&e) && self.failures < RETRIES {
            // A bound wait's connection failed: the server dropped that waiter (and would end
            // a grant made to it). Wait again on a new connection, which the grant will then
            // be bound to.
            self.failures += 1;
            tokio::time::sleep(backoff(self.failures)).await;
            if let Some(c) = bound_conn {
                *c = shared.dedicated().await?;
            }
        } else {
            return Err(e.into());
        }
        Ok(())
    }
}
