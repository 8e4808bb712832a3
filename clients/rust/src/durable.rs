//! Durable round trips (rule 10): the command that writes a grant (ACQUIRE, RENEW) pipelined
//! with `WAIT n timeout` or `WAITAOF 1 n timeout` on one connection borrowed from the durable
//! pool, so that the wait measures that very write on the node that made it (on a cluster the
//! pipeline goes to the node of the key); what the wait answered, judged against what was
//! asked; and giving back a grant that fell short.

use std::time::Duration;

use redis::{Cmd, FromRedisValue, RedisError, RedisResult, Value};
use tokio::time::Instant;

use crate::connection::Shared;
use crate::error::{invalid, Error, Result};
use crate::options::Durable;
use crate::retry::{backoff, is_transient, RETRIES};

/// How much longer than its WAIT timeout a durable round trip may take before it counts as a
/// connection failure (a server that stopped answering); the shared connection's default
/// response timeout.
const SLACK: Duration = Duration::from_millis(500);

/// What the wait after the command answered.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Ack {
    /// Replicas that acknowledged (WAIT's reply, or WAITAOF's second number).
    pub(crate) replicas: u32,
    /// With fsync: whether the master's AOF has it on disk (WAITAOF's first number).
    pub(crate) fsynced: Option<bool>,
}

impl Ack {
    /// Enough for `d`, or `Error::NotDurable` saying what came.
    pub(crate) fn judge(&self, d: &Durable) -> Result<()> {
        if self.replicas >= d.replicas && self.fsynced != Some(false) {
            return Ok(());
        }
        Err(Error::NotDurable {
            acknowledged: self.replicas,
            asked: d.replicas,
            fsynced: self.fsynced,
        })
    }
}

/// A durable round trip's outcome: the command's reply, what the wait answered (its own
/// error when it failed, e.g. WAITAOF on a server with `appendonly no`), and the send instant
/// of the attempt that was answered.
pub(crate) struct Durably<T> {
    pub(crate) reply: T,
    pub(crate) ack: RedisResult<Ack>,
    pub(crate) sent: Instant,
}

fn whole_ms(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX).max(1)
}

fn wait_cmd(d: &Durable, wait: Duration) -> Cmd {
    let mut w;
    if d.fsync {
        w = redis::cmd("WAITAOF");
        w.arg(1).arg(d.replicas).arg(whole_ms(wait));
    } else {
        w = redis::cmd("WAIT");
        w.arg(d.replicas).arg(whole_ms(wait));
    }
    w
}

fn count(v: &Value) -> RedisResult<u32> {
    match v {
        Value::Int(n) => Ok(u32::try_from(*n).unwrap_or(if *n < 0 { 0 } else { u32::MAX })),
        other => Err(RedisError::from((
            redis::ErrorKind::UnexpectedReturnType,
            "unexpected reply to WAIT/WAITAOF",
            format!("{other:?}"),
        ))),
    }
}

fn ack_of(d: &Durable, v: Value) -> RedisResult<Ack> {
    let v = v.extract_error()?;
    if !d.fsync {
        return Ok(Ack {
            replicas: count(&v)?,
            fsynced: None,
        });
    }
    match &v {
        Value::Array(pair) if pair.len() == 2 => Ok(Ack {
            replicas: count(&pair[1])?,
            fsynced: Some(count(&pair[0])? >= 1),
        }),
        other => Err(RedisError::from((
            redis::ErrorKind::UnexpectedReturnType,
            "unexpected reply to WAITAOF",
            format!("{other:?}"),
        ))),
    }
}

fn deadline_passed() -> RedisError {
    RedisError::from((redis::ErrorKind::Io, "the local deadline passed"))
}

/// `cmd` and its wait for `d`, pipelined on a borrowed connection; the wait's timeout is
/// `wait` (at least 1 ms). With `retry`, connection failures are retried on a new connection
/// (for commands that are safe to repeat: ACQUIRE of the same owner, the token-qualified
/// RENEW, which also write again, so the wait after them measures a write of their own).
/// `until` bounds every attempt (a lease's local deadline).
pub(crate) async fn round_trip<T: FromRedisValue>(
    shared: &Shared,
    cmd: &Cmd,
    d: &Durable,
    wait: Duration,
    retry: bool,
    until: Option<Instant>,
) -> RedisResult<Durably<T>> {
    let r = round_trip_all(
        shared,
        std::slice::from_ref(cmd),
        d,
        wait,
        retry,
        until,
        None,
    )
    .await?;
    let Some(first) = r.reply.into_iter().next() else {
        return Err(RedisError::from((
            redis::ErrorKind::UnexpectedReturnType,
            "a durable round trip got no reply",
        )));
    };
    Ok(Durably {
        reply: redis::from_redis_value(first.extract_error()?)?,
        ack: r.ack,
        sent: r.sent,
    })
}

/// [`round_trip`] of several commands (a MACQUIRE, or the RENEWs of its keys) followed by one
/// wait, on the master of `slot` in a cluster: their replies, an error reply in its place.
pub(crate) async fn round_trip_all(
    shared: &Shared,
    cmds: &[Cmd],
    d: &Durable,
    wait: Duration,
    retry: bool,
    until: Option<Instant>,
    slot: Option<u16>,
) -> RedisResult<Durably<Vec<Value>>> {
    let mut pipe = redis::pipe();
    // Errors come back per command: the commands' errors are the caller's, and a failed wait
    // after a grant is judged apart from them (the grant is then given back).
    pipe.ignore_errors();
    for cmd in cmds {
        pipe.add_command(cmd.clone());
    }
    pipe.add_command(wait_cmd(d, wait));
    let mut attempt = 0u32;
    loop {
        if until.is_some_and(|u| Instant::now() >= u) {
            return Err(deadline_passed());
        }
        let sent = Instant::now();
        let mut limit = sent + wait + SLACK;
        if let Some(u) = until {
            limit = limit.min(u);
        }
        let fut = async {
            let mut conn = shared.borrow().await?;
            let values = conn.pipe(&pipe, slot).await?;
            shared.give_back(conn);
            Ok::<_, RedisError>(values)
        };
        let r = match tokio::time::timeout_at(limit, fut).await {
            Ok(r) => r,
            Err(_) if until.is_some_and(|u| Instant::now() >= u) => Err(deadline_passed()),
            Err(_) => Err(RedisError::from((
                redis::ErrorKind::Io,
                "no reply to a durable round trip within its wait",
            ))),
        };
        match r {
            Ok(mut values) => {
                if values.len() != cmds.len() + 1 {
                    return Err(RedisError::from((
                        redis::ErrorKind::UnexpectedReturnType,
                        "a durable round trip got another number of replies than it sent",
                    )));
                }
                let ack = match values.pop() {
                    Some(v) => ack_of(d, v),
                    None => Err(RedisError::from((
                        redis::ErrorKind::UnexpectedReturnType,
                        "a durable round trip got no reply to its wait",
                    ))),
                };
                return Ok(Durably {
                    reply: values,
                    ack,
                    sent,
                });
            }
            Err(e) if retry && is_transient(&e) && attempt < RETRIES => {
                attempt += 1;
                let mut pause = backoff(attempt);
                if let Some(u) = until {
                    pause = pause.min(u.saturating_duration_since(Instant::now()));
                }
                tokio::time::sleep(pause).await;
            }
            Err(e) => return Err(e),
        }
    }
}

/// A grant of `token` is handed over only when its wait answered enough; otherwise it is
/// released again (`FLOCK.RELEASE key owner token`) and the error is the caller's:
/// `Error::NotDurable`, or the wait's own error.
pub(crate) async fn settle(
    shared: &Shared,
    key: &str,
    owner: &str,
    token: u64,
    d: &Durable,
    ack: RedisResult<Ack>,
) -> Result<()> {
    let verdict = match ack {
        Ok(a) => a.judge(d),
        Err(e) => Err(Error::Redis(e)),
    };
    if verdict.is_err() {
        let mut rel = redis::cmd("FLOCK.RELEASE");
        rel.arg(key).arg(owner).arg(token);
        // Safe to repeat; should it fail anyway, the grant ends at its ttl.
        let _ = shared.retrying::<i64>(&rel).await;
    }
    verdict
}

/// `fsync(true)` needs WAITAOF (Redis 7.2 or later, Valkey): asked once per factory with
/// `COMMAND INFO WAITAOF` (nil on a server without it); on a server without it, a clear error
/// before anything else is sent.
pub(crate) async fn require_waitaof(shared: &Shared) -> Result<()> {
    let missing = shared
        .no_waitaof
        .get_or_try_init(|| async {
            let mut ci = redis::cmd("COMMAND");
            ci.arg("INFO").arg("WAITAOF");
            let (info, _) = shared.retrying::<Vec<Value>>(&ci).await?;
            if !matches!(info.first(), None | Some(Value::Nil)) {
                return Ok::<_, RedisError>(None);
            }
            let mut inf = redis::cmd("INFO");
            inf.arg("server");
            let version = match shared.retrying::<String>(&inf).await {
                Ok((text, _)) => text
                    .lines()
                    .find_map(|l| l.strip_prefix("redis_version:"))
                    .map(|v| format!("redis_version {}", v.trim()))
                    .unwrap_or_else(|| "an unknown version".to_string()),
                Err(_) => "an unknown version".to_string(),
            };
            Ok(Some(version))
        })
        .await?;
    match missing {
        None => Ok(()),
        Some(version) => Err(invalid(format!(
            "fsync(true) needs WAITAOF, which this server does not have: the server is \
             {version}; WAITAOF came with Redis 7.2 (Valkey has it)"
        ))),
    }
}
