#![doc = include_str!("../README.md")]
#![forbid(unsafe_code)]

/// The redis-rs this crate is built on (for `Client`, `ClusterClient`, `cmd`).
pub use redis;

use std::fmt;
use std::future::Future;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use redis::aio::MultiplexedConnection;
use redis::cluster::ClusterClient;
use redis::cluster_async::ClusterConnection;
use redis::{AsyncConnectionConfig, Cmd, FromRedisValue, RedisError, RetryMethod};
use tokio::sync::{watch, Notify, OnceCell};
use tokio::task::JoinHandle;
use tokio::time::Instant;

/// The one error type of this crate.
#[derive(Debug)]
pub enum Error {
    /// The lock was not granted within the wait (`flock.lock`, `with_lock`).
    Busy,
    /// The lease is lost: its grant ended on the server (expiry, REVOKE, another RENEW's nil),
    /// or its local deadline passed, or it was already released.
    Lost,
    /// The lease is live but has less than the asked-for time left (`ensure`).
    TooShort {
        /// What the local lease clock had left when asked.
        remaining: Duration,
    },
    /// A fenced command was refused because the token is no longer the live grant; the lease
    /// is marked lost. The text is the server's.
    Fenced(String),
    /// Any other error from redis-rs or the server (connection, syntax, WRONGTYPE, ...).
    Redis(RedisError),
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::Busy => f.write_str("lock busy: not granted within the wait"),
            Error::Lost => f.write_str("lock lost: the lease is no longer held"),
            Error::TooShort { remaining } => {
                write!(f, "lease too short: {} ms left", remaining.as_millis())
            }
            Error::Fenced(msg) => write!(f, "fenced command refused: {msg}"),
            Error::Redis(e) => write!(f, "redis error: {e}"),
        }
    }
}

impl std::error::Error for Error {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            Error::Redis(e) => Some(e),
            _ => None,
        }
    }
}

impl From<RedisError> for Error {
    fn from(e: RedisError) -> Self {
        Error::Redis(e)
    }
}

impl Error {
    /// True for `Lost` and `TooShort` (a too-short lease is a kind of loss, as in the other
    /// clients where `LeaseTooShortError` subclasses `LockLostError`).
    pub fn is_lost(&self) -> bool {
        matches!(self, Error::Lost | Error::TooShort { .. })
    }
}

/// Result with this crate's [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

fn invalid(what: &'static str, detail: String) -> Error {
    Error::Redis(RedisError::from((
        redis::ErrorKind::InvalidClientConfig,
        what,
        detail,
    )))
}

/// How long to wait for a lock that someone else holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum Wait {
    /// One try (`For(Duration::ZERO)` is the same).
    #[default]
    None,
    /// Wait up to this long, in the server's FIFO queue (`BLOCK ms`).
    For(Duration),
    /// Wait without limit (`BLOCK 0`).
    Forever,
}

/// The kind of grant.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum Mode {
    /// The key's only live grant.
    #[default]
    Exclusive,
    /// A read lock: any number of shared grants together, never with an exclusive one
    /// (`SHARED`).
    Shared,
    /// A counting semaphore: at most `n` permits at once, each with its own token
    /// (`LIMIT n`).
    Permits(u32),
}

/// Options of `lock`, `acquire` and `with_lock`. `LockOptions::new(ttl)` or a bare
/// `Duration` (via `From`) gives the defaults: one try, exclusive, unbound, watchdog on, a
/// random 128-bit owner.
#[derive(Clone, Debug)]
pub struct LockOptions {
    ttl: Duration,
    wait: Wait,
    mode: Mode,
    bound: bool,
    renew: bool,
    owner: Option<String>,
}

impl LockOptions {
    /// Options with this lease length (whole milliseconds, at least 1 ms).
    pub fn new(ttl: Duration) -> Self {
        LockOptions {
            ttl,
            wait: Wait::None,
            mode: Mode::Exclusive,
            bound: false,
            renew: true,
            owner: None,
        }
    }
    /// The lease length.
    pub fn ttl(mut self, ttl: Duration) -> Self {
        self.ttl = ttl;
        self
    }
    /// How long to wait when the key is held.
    pub fn wait(mut self, wait: Wait) -> Self {
        self.wait = wait;
        self
    }
    /// Exclusive, shared or a permit.
    pub fn mode(mut self, mode: Mode) -> Self {
        self.mode = mode;
        self
    }
    /// A grant bound to its connection (`BOUND`): it ends when that connection closes. The
    /// lease then keeps a connection of its own, renews on it, and is lost when it fails: the
    /// first call that finds it failed (the watchdog's next renewal at the latest) marks the
    /// lease lost, and `release()` is then `Error::Lost`.
    pub fn bound(mut self, bound: bool) -> Self {
        self.bound = bound;
        self
    }
    /// The watchdog (on by default): renew at a third of the ttl.
    pub fn renew(mut self, renew: bool) -> Self {
        self.renew = renew;
        self
    }
    /// A caller-given owner (default: 128 random bits in hex). With a known owner a
    /// supervisor can `Flock::release` or `Flock::revoke` from any process.
    pub fn owner(mut self, owner: impl Into<String>) -> Self {
        self.owner = Some(owner.into());
        self
    }
}

impl From<Duration> for LockOptions {
    fn from(ttl: Duration) -> Self {
        LockOptions::new(ttl)
    }
}

/// What `Flock` connects to: a single server or a cluster.
#[allow(clippy::large_enum_variant)]
#[derive(Clone)]
pub enum Target {
    /// A single Redis server (or a proxy).
    Single(redis::Client),
    /// A Redis Cluster.
    Cluster(ClusterClient),
}

impl From<redis::Client> for Target {
    fn from(c: redis::Client) -> Self {
        Target::Single(c)
    }
}

impl From<ClusterClient> for Target {
    fn from(c: ClusterClient) -> Self {
        Target::Cluster(c)
    }
}

/// One connection: a multiplexed one to a server or a cluster connection.
#[derive(Clone)]
enum Conn {
    Single(MultiplexedConnection),
    Cluster(ClusterConnection),
}

impl Conn {
    async fn query<T: FromRedisValue>(&mut self, cmd: &Cmd) -> redis::RedisResult<T> {
        match self {
            Conn::Single(c) => cmd.query_async(c).await,
            Conn::Cluster(c) => cmd.query_async(c).await,
        }
    }
}

/// A failure of the connection rather than an answer of the server: worth a retry on a new
/// connection (for commands that are safe to repeat).
fn is_connection_error(e: &RedisError) -> bool {
    e.is_io_error()
        || e.is_connection_dropped()
        || e.is_connection_refusal()
        || e.is_timeout()
        || e.is_unrecoverable_error()
}

/// Worth a retry at all: a connection failure or a transient cluster state (TRYAGAIN,
/// CLUSTERDOWN, MASTERDOWN, LOADING).
fn is_transient(e: &RedisError) -> bool {
    is_connection_error(e) || !matches!(e.retry_method(), RetryMethod::NoRetry)
}

fn is_tryagain(e: &RedisError) -> bool {
    e.kind() == redis::ErrorKind::Server(redis::ServerErrorKind::TryAgain)
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// The shared command connection: one multiplexed connection (replaced when it fails) or one
/// cluster connection (which reconnects by itself).
struct Shared {
    target: Target,
    single: Mutex<Option<(u64, MultiplexedConnection)>>,
    single_gate: tokio::sync::Mutex<u64>,
    cluster: OnceCell<ClusterConnection>,
}

impl Shared {
    async fn conn(&self) -> redis::RedisResult<(u64, Conn)> {
        match &self.target {
            Target::Single(client) => {
                if let Some((g, c)) = lock(&self.single).clone() {
                    return Ok((g, Conn::Single(c)));
                }
                let mut gen = self.single_gate.lock().await;
                if let Some((g, c)) = lock(&self.single).clone() {
                    return Ok((g, Conn::Single(c)));
                }
                let c = client.get_multiplexed_async_connection().await?;
                *gen += 1;
                *lock(&self.single) = Some((*gen, c.clone()));
                Ok((*gen, Conn::Single(c)))
            }
            Target::Cluster(client) => {
                let c = self
                    .cluster
                    .get_or_try_init(|| client.get_async_connection())
                    .await?;
                Ok((0, Conn::Cluster(c.clone())))
            }
        }
    }

    fn failed(&self, gen: u64) {
        let mut cur = lock(&self.single);
        if cur.as_ref().is_some_and(|(g, _)| *g == gen) {
            *cur = None;
        }
    }

    /// One try on the shared connection; a connection failure drops it (the next call opens a
    /// new one).
    async fn query<T: FromRedisValue>(&self, cmd: &Cmd) -> redis::RedisResult<T> {
        let (gen, mut c) = self.conn().await?;
        let r = c.query(cmd).await;
        if let Err(e) = &r {
            if is_connection_error(e) && matches!(c, Conn::Single(_)) {
                self.failed(gen);
            }
        }
        r
    }

    /// A connection of its own, without a response timeout (for BLOCK waits and bound leases).
    async fn dedicated(&self) -> redis::RedisResult<Conn> {
        match &self.target {
            Target::Single(client) => {
                let cfg = AsyncConnectionConfig::new().set_response_timeout(None);
                Ok(Conn::Single(
                    client
                        .get_multiplexed_async_connection_with_config(&cfg)
                        .await?,
                ))
            }
            Target::Cluster(client) => Ok(Conn::Cluster(
                client
                    .get_async_connection_with_config(redis::cluster::ClusterConfig::new())
                    .await?,
            )),
        }
    }
}

/// How many times a command that is safe to repeat is sent again after a connection failure.
const RETRIES: u32 = 3;

fn backoff(attempt: u32) -> Duration {
    if attempt == 0 {
        Duration::ZERO
    } else {
        Duration::from_millis((10u64 << attempt.min(5)).min(200))
    }
}

fn ttl_ms(ttl: Duration) -> Result<u64> {
    let ms = u64::try_from(ttl.as_millis()).unwrap_or(u64::MAX);
    if ms == 0 {
        return Err(invalid("ttl must be at least 1 ms", format!("{ttl:?}")));
    }
    Ok(ms)
}

/// The factory: takes a `redis::Client` or a `ClusterClient` and opens its own connections
/// (one multiplexed connection for commands and renewals, one more per BLOCK wait and per
/// bound lease). Cheap to clone.
#[derive(Clone)]
pub struct Flock {
    shared: Arc<Shared>,
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
        Flock {
            shared: Arc::new(Shared {
                target: client.into(),
                single: Mutex::new(None),
                single_gate: tokio::sync::Mutex::new(0),
                cluster: OnceCell::new(),
            }),
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
    pub async fn acquire(
        &self,
        key: impl Into<String>,
        opts: impl Into<LockOptions>,
    ) -> Result<Option<Lease>> {
        let key = key.into();
        let opts = opts.into();
        let ttl = ttl_ms(opts.ttl)?;
        let owner = match &opts.owner {
            Some(o) => o.clone(),
            None => format!("{:032x}", rand::random::<u128>()),
        };
        if let Mode::Permits(0) = opts.mode {
            return Err(invalid("LIMIT must be at least 1", String::new()));
        }
        let wait = match opts.wait {
            Wait::For(d) if d.is_zero() => Wait::None,
            w => w,
        };
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

        if opts.bound {
            // A bound lease lives on a connection of its own, which it keeps.
            let mut conn = self.shared.dedicated().await?;
            let sent = Instant::now();
            let token: Option<u64> = conn.query(&cmd).await?;
            let (token, sent) = match token {
                Some(t) => (t, sent),
                None if wait == Wait::None => return Ok(None),
                None => {
                    match self
                        .wait_for(&key, &owner, ttl, &cmd, wait, Some(&mut conn))
                        .await?
                    {
                        Some(x) => x,
                        None => return Ok(None),
                    }
                }
            };
            return Ok(Some(self.start(
                key,
                owner,
                token,
                ttl_d,
                sent,
                opts,
                LeaseConn::Dedicated(conn),
            )));
        }

        // First a plain try on the shared connection (no wait: nobody jumps the queue, a
        // waiter-free free key is granted at once). ACQUIRE of the same owner is idempotent
        // (G4), so a connection failure is retried; the lease is counted from the send of the
        // attempt that was answered.
        let mut attempt = 0;
        let (token, sent) = loop {
            let sent = Instant::now();
            match self.shared.query::<Option<u64>>(&cmd).await {
                Ok(t) => break (t, sent),
                Err(e) if is_transient(&e) && attempt < RETRIES => {
                    attempt += 1;
                    tokio::time::sleep(backoff(attempt)).await;
                }
                Err(e) => return Err(e.into()),
            }
        };
        let (token, sent) = match token {
            Some(t) => (t, sent),
            None if wait == Wait::None => return Ok(None),
            None => match self.wait_for(&key, &owner, ttl, &cmd, wait, None).await? {
                Some(x) => x,
                None => return Ok(None),
            },
        };
        Ok(Some(self.start(
            key,
            owner,
            token,
            ttl_d,
            sent,
            opts,
            LeaseConn::Shared,
        )))
    }

    /// Wait in the server's queue with BLOCK on a dedicated connection (rule 8), across
    /// TRYAGAIN (rule 5); a grant is renewed at once with a token-qualified RENEW and counted
    /// from that RENEW (rule 1). Returns the token and the send instant of that RENEW.
    async fn wait_for(
        &self,
        key: &str,
        owner: &str,
        ttl: u64,
        base: &Cmd,
        wait: Wait,
        bound_conn: Option<&mut Conn>,
    ) -> Result<Option<(u64, Instant)>> {
        let until = match wait {
            Wait::For(d) => Some(Instant::now() + d),
            _ => None,
        };
        let mut own: Option<Conn> = None;
        let mut bound_conn = bound_conn;
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
            let conn: &mut Conn = match bound_conn.as_deref_mut() {
                Some(c) => c,
                None => {
                    if own.is_none() {
                        own = Some(self.shared.dedicated().await?);
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
                Some(u) => match tokio::time::timeout_at(u + Duration::from_millis(250), fut).await
                {
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
                    let renewed = match bound_conn.as_deref_mut() {
                        Some(c) => {
                            let sent = Instant::now();
                            c.query::<Option<u64>>(&renew).await.map(|t| (t, sent))
                        }
                        None => {
                            drop(own.take());
                            self.retrying(&renew).await
                        }
                    };
                    match renewed {
                        Ok((Some(_), sent)) => return Ok(Some((token, sent))),
                        // Expired between the grant and the RENEW: wait again if time is left.
                        Ok((None, _)) => continue,
                        Err(e) => {
                            let mut rel = redis::cmd("FLOCK.RELEASE");
                            rel.arg(key).arg(owner).arg(token);
                            let _ = self.shared.query::<i64>(&rel).await;
                            return Err(e.into());
                        }
                    }
                }
                Ok(None) => return Ok(None),
                Err(e) if is_tryagain(&e) => {
                    // The key moved to another node while we waited: ask again; the cluster
                    // connection follows the ASK/MOVED to the new owner of the slot.
                    moves += 1;
                    tokio::time::sleep(Duration::from_millis((20 * u64::from(moves)).min(500)))
                        .await;
                }
                Err(e)
                    if bound_conn.is_none()
                        && e.is_timeout()
                        && until.is_none_or(|u| Instant::now() < u) =>
                {
                    // A response timeout of the caller's cluster client cut the wait short:
                    // a new connection (the server drops the old waiter with the old one)
                    // and the rest of the wait.
                    own = None;
                }
                Err(e) if bound_conn.is_none() && is_transient(&e) && failures < RETRIES => {
                    failures += 1;
                    own = None;
                    tokio::time::sleep(backoff(failures)).await;
                }
                Err(e) if is_connection_error(&e) && failures < RETRIES => {
                    // A bound wait's connection failed: the server dropped that waiter (and
                    // would end a grant made to it). Wait again on a new connection, which the
                    // grant will then be bound to.
                    failures += 1;
                    tokio::time::sleep(backoff(failures)).await;
                    if let Some(c) = bound_conn.as_deref_mut() {
                        *c = self.shared.dedicated().await?;
                    }
                }
                Err(e) => return Err(e.into()),
            }
        }
    }

    /// A command that is safe to repeat, on the shared connection, with retries after
    /// connection failures; also gives the send instant of the attempt that was answered.
    async fn retrying<T: FromRedisValue>(&self, cmd: &Cmd) -> redis::RedisResult<(T, Instant)> {
        let mut attempt = 0;
        loop {
            let sent = Instant::now();
            match self.shared.query::<T>(cmd).await {
                Ok(v) => return Ok((v, sent)),
                Err(e) if is_transient(&e) && attempt < RETRIES => {
                    attempt += 1;
                    tokio::time::sleep(backoff(attempt)).await;
                }
                Err(e) => return Err(e),
            }
        }
    }

    #[allow(clippy::too_many_arguments)]
    fn start(
        &self,
        key: String,
        owner: String,
        token: u64,
        ttl: Duration,
        sent: Instant,
        opts: LockOptions,
        conn: LeaseConn,
    ) -> Lease {
        let (lost_tx, _) = watch::channel(false);
        let state = Arc::new(State {
            key,
            owner,
            token,
            mode: opts.mode,
            bound: opts.bound,
            flock: self.clone(),
            conn: tokio::sync::Mutex::new(conn),
            timing: Mutex::new(Timing {
                ttl,
                deadline: sent + ttl,
                last_sent: sent,
                released: false,
            }),
            lost: lost_tx,
            wake: Notify::new(),
        });
        let keeper = tokio::spawn(keeper(state.clone(), opts.renew));
        Lease {
            handle: LeaseHandle { st: state },
            keeper: Some(keeper),
        }
    }

    /// Scoped lock: take the lock (or fail with `Busy`), run `f` with a handle of the lease,
    /// release, and return `f`'s result. When `f` fails its error goes on unchanged (the
    /// handle's `is_lost()` shows a loss); when `f` succeeds but the lease was lost meanwhile,
    /// the result is `Error::Lost` (converted with `From`).
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
        let mut cmd = redis::cmd("FLOCK.REVOKE");
        cmd.arg(key);
        if let Some(o) = owner {
            cmd.arg(o);
        }
        Ok(self.shared.query::<u64>(&cmd).await?)
    }

    /// FLOCK.CHECK: the remaining lease of `token` on the server, zero when it is not live.
    pub async fn check(&self, key: &str, token: u64) -> Result<Duration> {
        let mut cmd = redis::cmd("FLOCK.CHECK");
        cmd.arg(key).arg(token);
        Ok(Duration::from_millis(self.shared.query::<u64>(&cmd).await?))
    }
}

enum LeaseConn {
    /// The factory's shared command connection.
    Shared,
    /// A bound lease's own connection.
    Dedicated(Conn),
}

struct Timing {
    ttl: Duration,
    /// Send instant of the request that granted or last renewed the grant, plus its ttl.
    deadline: Instant,
    last_sent: Instant,
    released: bool,
}

struct State {
    key: String,
    owner: String,
    token: u64,
    mode: Mode,
    bound: bool,
    flock: Flock,
    conn: tokio::sync::Mutex<LeaseConn>,
    timing: Mutex<Timing>,
    lost: watch::Sender<bool>,
    wake: Notify,
}

enum Sent<T> {
    /// The reply, and the send instant of the attempt that got it.
    Reply(T, Instant, bool),
    Failed(RedisError),
}

impl State {
    fn mark_lost(&self) {
        self.lost.send_if_modified(|v| {
            if *v {
                false
            } else {
                *v = true;
                true
            }
        });
    }

    fn is_lost(&self) -> bool {
        if *self.lost.borrow() {
            return true;
        }
        let t = lock(&self.timing);
        if t.released {
            return false;
        }
        if Instant::now() >= t.deadline {
            drop(t);
            self.mark_lost();
            return true;
        }
        false
    }

    fn remaining(&self) -> Duration {
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
    fn renewed(&self, sent: Instant, ttl: Duration) {
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
    async fn send<T: FromRedisValue>(
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
                        self.flock.shared.query::<T>(cmd).await
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
                    self.mark_lost();
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

    fn renew_cmd(&self, ttl: Duration) -> Cmd {
        let mut cmd = redis::cmd("FLOCK.RENEW");
        cmd.arg(&self.key)
            .arg(&self.owner)
            .arg(u64::try_from(ttl.as_millis()).unwrap_or(u64::MAX))
            .arg(self.token);
        cmd
    }

    /// Rule 4: RELEASE key owner token, the token kept until the reply; retried after a
    /// connection failure, where 0 counts as released.
    async fn release_exact(&self) -> Result<()> {
        let was_lost = self.is_lost();
        let mut cmd = redis::cmd("FLOCK.RELEASE");
        cmd.arg(&self.key).arg(&self.owner).arg(self.token);
        let r = match self.send::<i64>(&cmd, true, None).await {
            Sent::Reply(1, _, _) => Ok(()),
            Sent::Reply(_, _, true) => Ok(()),
            Sent::Reply(_, _, false) => {
                self.mark_lost();
                Err(Error::Lost)
            }
            // A bound lease's connection failed: the server ended the grant when it closed,
            // so there is nothing left to release, and the lease was lost (rule 3).
            Sent::Failed(e) if self.bound && is_connection_error(&e) => Err(Error::Lost),
            Sent::Failed(e) => Err(e.into()),
        };
        lock(&self.timing).released = true;
        self.wake.notify_one();
        match r {
            Ok(()) if was_lost => Err(Error::Lost),
            r => r,
        }
    }
}

/// The watchdog (rule 2) and the lease clock: renews at a third of the ttl with a
/// token-qualified RENEW, stops for good at the first nil, retries connection failures but
/// never sends a RENEW once the local deadline passed, and marks the lease lost when its
/// local deadline passes. With `renew` off it only watches the deadline.
async fn keeper(st: Arc<State>, renew: bool) {
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
            st.mark_lost();
            return;
        }
        if !renew {
            continue;
        }
        let ttl = lock(&st.timing).ttl;
        let cmd = st.renew_cmd(ttl);
        // Retries until the local deadline; every attempt is cut off at it.
        let mut attempt = 0u32;
        loop {
            // A manual renew() may have moved the deadline meanwhile.
            let deadline = lock(&st.timing).deadline;
            if Instant::now() >= deadline {
                st.mark_lost();
                return;
            }
            match st
                .send::<Option<u64>>(&cmd, !st.bound, Some(deadline))
                .await
            {
                Sent::Reply(Some(_), sent, _) => {
                    st.renewed(sent, ttl);
                    break;
                }
                Sent::Reply(None, _, _) => {
                    st.mark_lost();
                    return;
                }
                Sent::Failed(e) => {
                    if st.bound || Instant::now() >= deadline || !is_transient(&e) {
                        st.mark_lost();
                        return;
                    }
                    attempt += 1;
                    let pause =
                        backoff(attempt).min(deadline.saturating_duration_since(Instant::now()));
                    tokio::time::sleep(pause).await;
                }
            }
        }
    }
}

/// A shareable view of a lease (what `with_lock` hands its closure): everything but
/// `release`. Cheap to clone.
#[derive(Clone)]
pub struct LeaseHandle {
    st: Arc<State>,
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
    /// "Is there enough lease left for the critical step?": `Error::Lost` when lost,
    /// `Error::TooShort` when live with less than `min` left. From the local clock only; it
    /// changes nothing.
    pub fn ensure(&self, min: Duration) -> Result<()> {
        if self.st.is_lost() || lock(&self.st.timing).released {
            return Err(Error::Lost);
        }
        let remaining = self.st.remaining();
        if remaining.is_zero() {
            return Err(Error::Lost);
        }
        if remaining < min {
            return Err(Error::TooShort { remaining });
        }
        Ok(())
    }
    /// FLOCK.CHECK on the server: the remaining lease there; zero (and the lease marked
    /// lost) when the grant is no longer live. On a bound lease whose connection failed it is
    /// the connection's error, and the lease is lost.
    pub async fn check(&self) -> Result<Duration> {
        let mut cmd = redis::cmd("FLOCK.CHECK");
        cmd.arg(&self.st.key).arg(self.st.token);
        match self.st.send::<u64>(&cmd, true, None).await {
            Sent::Reply(0, _, _) => {
                self.st.mark_lost();
                Ok(Duration::ZERO)
            }
            Sent::Reply(ms, _, _) => Ok(Duration::from_millis(ms)),
            Sent::Failed(e) => Err(e.into()),
        }
    }
    /// Renew now with a token-qualified RENEW, for `ttl` (default: the current ttl, which a
    /// given `ttl` replaces for the watchdog too). `Error::Lost` when the grant is gone.
    pub async fn renew(&self, ttl: Option<Duration>) -> Result<()> {
        if self.st.is_lost() || lock(&self.st.timing).released {
            return Err(Error::Lost);
        }
        let ttl = match ttl {
            Some(t) => Duration::from_millis(ttl_ms(t)?),
            None => lock(&self.st.timing).ttl,
        };
        let cmd = self.st.renew_cmd(ttl);
        let deadline = lock(&self.st.timing).deadline;
        match self
            .st
            .send::<Option<u64>>(&cmd, !self.st.bound, Some(deadline))
            .await
        {
            Sent::Reply(Some(_), sent, _) => {
                self.st.renewed(sent, ttl);
                self.st.wake.notify_one();
                Ok(())
            }
            Sent::Reply(None, _, _) => {
                self.st.mark_lost();
                Err(Error::Lost)
            }
            Sent::Failed(e) => {
                if Instant::now() >= deadline || self.st.bound {
                    self.st.mark_lost();
                    return Err(Error::Lost);
                }
                Err(e.into())
            }
        }
    }
    /// Run `cmd` through FLOCK.FENCED with this lease's token: the server runs it only while
    /// the token is the live grant. A refusal as stale is `Error::Fenced` and marks the lease
    /// lost. The server decides, even when the local clock already says lost.
    pub async fn fenced<T: FromRedisValue>(&self, cmd: &Cmd) -> Result<T> {
        let mut f = redis::cmd("FLOCK.FENCED");
        f.arg(&self.st.key).arg(self.st.token);
        for a in cmd.args_iter() {
            if let redis::Arg::Simple(bytes) = a {
                f.arg(bytes);
            }
        }
        // Not retried: a write whose reply was lost may have run.
        match self.st.send::<T>(&f, false, None).await {
            Sent::Reply(v, _, _) => Ok(v),
            Sent::Failed(e) if e.code() == Some("FENCED") => {
                self.st.mark_lost();
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
pub struct Lease {
    handle: LeaseHandle,
    keeper: Option<JoinHandle<()>>,
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
    /// A shareable handle (for other tasks; it cannot release).
    pub fn handle(&self) -> LeaseHandle {
        self.handle.clone()
    }

    /// Stop the watchdog (waiting until it has stopped), then `FLOCK.RELEASE key owner
    /// token`. `Error::Lost` when the lease had been lost (the RELEASE is sent anyway).
    pub async fn release(mut self) -> Result<()> {
        if let Some(k) = self.keeper.take() {
            k.abort();
            let _ = k.await;
        }
        self.handle.st.release_exact().await
    }
}

impl Drop for Lease {
    fn drop(&mut self) {
        let Some(k) = self.keeper.take() else {
            return;
        };
        k.abort();
        let st = self.handle.st.clone();
        if let Ok(rt) = tokio::runtime::Handle::try_current() {
            rt.spawn(async move {
                let _ = k.await;
                let _ = st.release_exact().await;
            });
        } else {
            lock(&st.timing).released = true;
        }
    }
}
