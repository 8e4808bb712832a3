//! The server the tool talks to (`--url`, `REDIS_URL`, `--cluster`), the raw connections its
//! inspection commands and its own FLOCK.WATCH use, and which exit status an error means.

use flock_client::redis::aio::MultiplexedConnection;
use flock_client::redis::cluster::{ClusterClient, ClusterConfig};
use flock_client::redis::cluster_async::ClusterConnection;
use flock_client::redis::{
    self, AsyncConnectionConfig, Cmd, ErrorKind, FromRedisValue, RedisError, ServerErrorKind,
};
use flock_client::{Error, Target};

/// Exit status for bad arguments (sysexits.h EX_USAGE): the tool's own checks, the client's,
/// and a server's refusal of the request itself (an invalid ttl, a limit mismatch, WRONGTYPE).
pub const EX_USAGE: i32 = 64;
/// Exit status when the server cannot be used (EX_UNAVAILABLE): not reachable, no flock
/// module, refused authentication, loading, a durable grant too few replicas acknowledged.
pub const EX_UNAVAILABLE: i32 = 69;

/// What `--url`/`--cluster` name, opened but not yet connected.
pub fn target(url: &str, cluster: bool) -> Result<Target, RedisError> {
    if cluster {
        let seeds: Vec<&str> = url
            .split(',')
            .map(str::trim)
            .filter(|s| !s.is_empty())
            .collect();
        Ok(Target::Cluster(ClusterClient::new(seeds)?))
    } else {
        Ok(Target::Single(redis::Client::open(url)?))
    }
}

/// One connection of either kind.
pub enum Conn {
    Single(MultiplexedConnection),
    Cluster(ClusterConnection),
}

impl Conn {
    /// A connection of the tool's own without a response timeout: FLOCK.WATCH blocks on it
    /// for as long as nothing happens, and must hold up nothing else.
    pub async fn open(target: &Target) -> Result<Conn, RedisError> {
        match target {
            Target::Single(c) => {
                let cfg = AsyncConnectionConfig::new().set_response_timeout(None);
                Ok(Conn::Single(
                    c.get_multiplexed_async_connection_with_config(&cfg).await?,
                ))
            }
            Target::Cluster(c) => Ok(Conn::Cluster(
                c.get_async_connection_with_config(ClusterConfig::new())
                    .await?,
            )),
        }
    }

    pub async fn query<T: FromRedisValue>(&mut self, cmd: &Cmd) -> Result<T, RedisError> {
        match self {
            Conn::Single(c) => cmd.query_async(c).await,
            Conn::Cluster(c) => cmd.query_async(c).await,
        }
    }
}

/// True when the server does not know the command: no flock module (or one without it).
pub fn is_unknown_command(e: &RedisError) -> bool {
    e.kind() == ErrorKind::Server(ServerErrorKind::ResponseError)
        && e.detail().is_some_and(|d| d.starts_with("unknown command"))
}

/// The exit status a redis-rs error means: the request's own fault (64) or the server's
/// unavailability (69).
pub fn redis_status(e: &RedisError) -> i32 {
    if is_unknown_command(e) {
        return EX_UNAVAILABLE;
    }
    match e.kind() {
        // The client refused the request before sending it (its argument checks).
        ErrorKind::InvalidClientConfig => EX_USAGE,
        // ERR from the server: the request itself (invalid ttl, owner, limit mismatch ...).
        ErrorKind::Server(ServerErrorKind::ResponseError)
        | ErrorKind::Server(ServerErrorKind::CrossSlot) => EX_USAGE,
        ErrorKind::Extension if e.code() == Some("WRONGTYPE") => EX_USAGE,
        // Connections, authentication, LOADING, MASTERDOWN, CLUSTERDOWN, READONLY, ...
        _ => EX_UNAVAILABLE,
    }
}

/// The exit status a client error met while taking the lock means. `Busy` is answered by the
/// caller (the conflict status); any variant not named here is one of the client's own
/// argument checks.
pub fn client_status(e: &Error) -> i32 {
    match e {
        Error::Redis(r) => redis_status(r),
        Error::NotDurable { .. } => EX_UNAVAILABLE,
        _ => EX_USAGE,
    }
}
