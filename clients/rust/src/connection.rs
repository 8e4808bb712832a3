//! Connections: what `Flock` is given ([`Target`]), one connection of either kind (`Conn`),
//! and the factory's shared command connection with its reconnection (`Shared`), which also
//! opens the dedicated connections that BLOCK waits and bound leases run on (rule 8), and
//! keeps the pool of connections that durable round trips borrow (rule 10).

use std::sync::Mutex;

use redis::aio::MultiplexedConnection;
use redis::cluster::ClusterClient;
use redis::cluster_async::ClusterConnection;
use redis::{AsyncConnectionConfig, Cmd, FromRedisValue, Pipeline, Value};
use tokio::sync::OnceCell;
use tokio::time::Instant;

use crate::retry::{backoff, is_connection_error, is_transient, RETRIES};
use crate::sync::lock;
use crate::watchdog::Starter;

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
pub(crate) enum Conn {
    Single(MultiplexedConnection),
    Cluster(ClusterConnection),
}

impl Conn {
    pub(crate) async fn query<T: FromRedisValue>(&mut self, cmd: &Cmd) -> redis::RedisResult<T> {
        match self {
            Conn::Single(c) => cmd.query_async(c).await,
            Conn::Cluster(c) => cmd.query_async(c).await,
        }
    }

    /// `cmd` on the master of `slot` (a cluster), or on the one server: for commands that name
    /// no key but must reach a key's node (CLIENT ID, CLIENT UNBLOCK of a watching connection).
    pub(crate) async fn query_at<T: FromRedisValue>(
        &mut self,
        cmd: &Cmd,
        slot: Option<u16>,
    ) -> redis::RedisResult<T> {
        match (self, slot) {
            (Conn::Cluster(c), Some(slot)) => {
                use redis::cluster_routing::{Route, RoutingInfo, SingleNodeRoutingInfo, SlotAddr};
                let route = RoutingInfo::SingleNode(SingleNodeRoutingInfo::SpecificNode(
                    Route::new(slot, SlotAddr::Master),
                ));
                let v = c.route_command(cmd.clone(), route).await?;
                Ok(redis::from_redis_value(v)?)
            }
            (c, _) => c.query(cmd).await,
        }
    }

    /// A pipeline sent as one write; on a cluster it goes to the master of `slot` when given
    /// (a FLOCK.MACQUIRE, whose first argument is no key), else to the node of its first key.
    /// Error replies come back in their places.
    pub(crate) async fn pipe(
        &mut self,
        pipe: &Pipeline,
        slot: Option<u16>,
    ) -> redis::RedisResult<Vec<Value>> {
        match (self, slot) {
            (Conn::Single(c), _) => pipe.query_async(c).await,
            (Conn::Cluster(c), None) => pipe.query_async(c).await,
            (Conn::Cluster(c), Some(slot)) => {
                use redis::cluster_routing::{Route, SingleNodeRoutingInfo, SlotAddr};
                let route = SingleNodeRoutingInfo::SpecificNode(Route::new(slot, SlotAddr::Master));
                c.route_pipeline(pipe.clone(), 0, pipe.len(), route).await
            }
        }
    }
}

/// How many idle connections the durable pool keeps; more are opened when more durable round
/// trips run at once, and closed after.
const DURABLE_IDLE: usize = 8;

/// The shared command connection: one multiplexed connection (replaced when it fails) or one
/// cluster connection (which reconnects by itself).
pub(crate) struct Shared {
    pub(crate) target: Target,
    /// The current multiplexed connection and its generation: a failure reported for an older
    /// generation does not drop the newer connection that replaced it.
    single: Mutex<Option<(u64, MultiplexedConnection)>>,
    /// Held while a new connection is opened, so that concurrent callers open one, not many;
    /// it counts the generations.
    single_gate: tokio::sync::Mutex<u64>,
    cluster: OnceCell<ClusterConnection>,
    /// Idle connections for durable round trips (rule 10). A WAIT blocks the connection it
    /// runs on until enough replicas acknowledged or its timeout passed, so it never runs on
    /// the shared connection (it would hold up every other lease's renewals): each round trip
    /// borrows one of these, or a new one, and gives it back after a reply.
    durable: Mutex<Vec<Conn>>,
    /// Whether the server has WAITAOF: asked once per factory; `Some(version)` when it has
    /// not (the server's version, for the error).
    pub(crate) no_waitaof: OnceCell<Option<String>>,
    /// Starts the watchdog tasks of the leases (rule 2) soon after their grants.
    pub(crate) keepers: std::sync::Arc<Starter>,
}

impl Shared {
    /// Connects lazily: the first command opens the connection.
    pub(crate) fn new(target: Target) -> Self {
        Shared {
            target,
            single: Mutex::new(None),
            single_gate: tokio::sync::Mutex::new(0),
            cluster: OnceCell::new(),
            durable: Mutex::new(Vec::new()),
            no_waitaof: OnceCell::new(),
            keepers: std::sync::Arc::new(Starter::default()),
        }
    }

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
    pub(crate) async fn query<T: FromRedisValue>(&self, cmd: &Cmd) -> redis::RedisResult<T> {
        let (gen, mut c) = self.conn().await?;
        let r = c.query(cmd).await;
        if let Err(e) = &r {
            if is_connection_error(e) && matches!(c, Conn::Single(_)) {
                self.failed(gen);
            }
        }
        r
    }

    /// [`Conn::query_at`] on the shared connection.
    pub(crate) async fn query_at<T: FromRedisValue>(
        &self,
        cmd: &Cmd,
        slot: Option<u16>,
    ) -> redis::RedisResult<T> {
        let (gen, mut c) = self.conn().await?;
        let r = c.query_at(cmd, slot).await;
        if let Err(e) = &r {
            if is_connection_error(e) && matches!(c, Conn::Single(_)) {
                self.failed(gen);
            }
        }
        r
    }

    /// A connection of its own, without a response timeout (for BLOCK waits and bound leases).
    pub(crate) async fn dedicated(&self) -> redis::RedisResult<Conn> {
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

    /// A connection for one durable round trip: an idle one of the pool, else a new one
    /// without a response timeout (the caller bounds the round trip).
    pub(crate) async fn borrow(&self) -> redis::RedisResult<Conn> {
        let idle = lock(&self.durable).pop();
        match idle {
            Some(c) => Ok(c),
            None => self.dedicated().await,
        }
    }

    /// A connection back to the durable pool, after a round trip that was answered (one that
    /// failed or was cut off is dropped instead: a reply may still be on its way).
    pub(crate) fn give_back(&self, conn: Conn) {
        let mut idle = lock(&self.durable);
        if idle.len() < DURABLE_IDLE {
            idle.push(conn);
        }
    }

    /// A command that is safe to repeat, on the shared connection, with retries after
    /// connection failures; also gives the send instant of the attempt that was answered.
    pub(crate) async fn retrying<T: FromRedisValue>(
        &self,
        cmd: &Cmd,
    ) -> redis::RedisResult<(T, Instant)> {
        let mut attempt = 0;
        loop {
            let sent = Instant::now();
            match self.query::<T>(cmd).await {
                Ok(v) => return Ok((v, sent)),
                Err(e) if is_transient(&e) && attempt < RETRIES => {
                    attempt += 1;
                    tokio::time::sleep(backoff(attempt)).await;
                }
                Err(e) => return Err(e),
            }
        }
    }
}
