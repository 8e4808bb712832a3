//! What the coordination clients record (issue 24): each FLOCK.WATCH a watcher sent and what it
//! was told, and each FLOCK.MACQUIRE and how it ended. `clients/watch.rs` and
//! `clients/multi.rs` record them, `checker/watch.rs` checks them against the history.

/// What one FLOCK.WATCH was told.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Told {
    /// `[key, event, owner, token]`: `event` is `held`, `gone` or how the grant ended.
    Fired {
        event: String,
        owner: Option<String>,
        token: i64,
    },
    /// nil: its timeout passed first.
    TimedOut,
    /// An error reply (TRYAGAIN, UNBLOCKED around a fault; anything else is a violation).
    Error(String),
    /// The connection failed (a fault) before the answer: nothing to check.
    Lost,
    /// No answer within its timeout plus 20 s: a hung watcher.
    Hung,
}

/// One FLOCK.WATCH of one key and token.
#[derive(Debug, Clone)]
pub(crate) struct WatchRec {
    pub(crate) watcher: usize,
    pub(crate) key: usize,
    /// The token watched (0: the key's oldest live grant).
    pub(crate) token: i64,
    pub(crate) timeout_ms: u64,
    pub(crate) send: u64,
    pub(crate) ack: u64,
    /// The failover epoch it ran in (u64::MAX: a failover came while it waited).
    pub(crate) epoch: u64,
    pub(crate) told: Told,
}

/// How one FLOCK.MACQUIRE ended.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum MultiEnd {
    /// The tokens, one per key in the order given.
    Granted(Vec<i64>),
    Nil,
    Error(String),
    /// The connection failed (a fault).
    Lost,
    /// No answer within its BLOCK timeout plus 10 s: a deadlock or a lost wake-up.
    Hung,
}

/// One FLOCK.MACQUIRE of 2 or 3 keys of one slot.
#[derive(Debug, Clone)]
pub(crate) struct MultiRec {
    pub(crate) client: usize,
    /// The key indices in the order named.
    pub(crate) keys: Vec<usize>,
    /// BLOCK's timeout in ms (None: no BLOCK).
    pub(crate) block: Option<u64>,
    pub(crate) send: u64,
    pub(crate) ack: u64,
    pub(crate) end: MultiEnd,
}
