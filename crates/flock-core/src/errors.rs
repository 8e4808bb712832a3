//! Every error reply the module sends, in one table: the fixed texts as C strings (the glue
//! passes them to `RedisModule_ReplyWithError` as they are, nothing allocated), and one
//! formatter for the texts that carry a value (a key's name, a limit, a token). docs/SPEC.md's
//! error section lists the same texts (a test checks each one against this table).

use crate::state::Mode;
use std::ffi::CStr;

macro_rules! fixed_errors {
    ($( $(#[$doc:meta])* $name:ident => $text:literal, )*) => {
        /// An error reply whose text never changes.
        #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
        pub enum Fixed {
            $( $(#[$doc])* $name, )*
        }

        impl Fixed {
            /// Every fixed error, in table order.
            pub const ALL: &'static [Fixed] = &[$(Fixed::$name),*];

            /// The reply's text, for `RedisModule_ReplyWithError`.
            pub const fn text(self) -> &'static CStr {
                match self {
                    $( Fixed::$name => $text, )*
                }
            }
        }
    };
}

fixed_errors! {
    /// The key holds another type (Redis's own text).
    WrongType => c"WRONGTYPE Operation against a key holding the wrong kind of value",
    /// An unknown or repeated option, SHARED with LIMIT (`args::ArgError::Syntax`).
    Syntax => c"ERR syntax error",
    /// `args::ArgError::Owner` (1 to `MAX_OWNER_LEN` = 256 bytes).
    Owner => c"ERR invalid owner: must be 1 to 256 bytes",
    /// `args::ArgError::Timeout`.
    Timeout => c"ERR invalid timeout: must be an integer of milliseconds, 0 or more",
    /// `args::ArgError::Token`.
    Token => c"ERR invalid token: must be a positive integer",
    /// `args::ArgError::BoundNeedsClient`.
    BoundNeedsClient => c"ERR BOUND needs a client connection",
    /// `args::ArgError::Arity` as text (the module sends Redis's own arity error instead:
    /// [`Formatted::WrongArity`]).
    Arity => c"ERR wrong number of arguments",
    /// `engine::ReplyError::TokensExhausted`.
    TokensExhausted => c"ERR token space exhausted",
    /// `engine::ReplyError::TooManyWaiters`.
    TooManyWaiters => c"ERR too many clients wait for this key (flock.max-waiters)",
    /// `engine::ReplyError::CouldNotBlock`.
    CouldNotBlock => c"ERR could not block the client",
    /// Redis would not store a new lock (`commands/reply.rs`, `commands/macquire.rs`).
    NotStored => c"ERR could not store the lock",
    /// A client called FLOCK.APPLY (`commands/handlers.rs`).
    ApplyInternal => c"ERR FLOCK.APPLY is internal: only replication and AOF loading may call it",
    /// FENCED's inner command names its own lock key (`commands/fenced.rs`).
    FencedOwnKey => c"ERR FLOCK.FENCED cannot touch its own lock key",
    /// A write under a shared token in FENCED.
    FencedSharedWrite => c"ERR FLOCK.FENCED with a shared grant runs read-only commands only",
    /// FENCED's inner command could not start: `RedisModule_Call` set ENOENT.
    FencedUnknownCommand => c"ERR unknown command inside FLOCK.FENCED",
    /// ... EINVAL.
    FencedArity => c"ERR wrong number of arguments for the command inside FLOCK.FENCED",
    /// ... EACCES.
    FencedNoPerm => c"NOPERM this user has no permissions to run the command or touch its keys",
    /// ... ENOSPC.
    FencedOom => c"OOM command not allowed when used memory > 'maxmemory'",
    /// ... EROFS.
    FencedReadOnly => c"READONLY You can't write against a read only replica",
    /// ... ESPIPE.
    FencedCrossSlot => c"CROSSSLOT Keys in request don't hash to the same slot",
    /// ... any other errno.
    FencedCouldNotRun => c"ERR the command inside FLOCK.FENCED could not run",
    /// A waiter's key now holds another type (`engine::plan_revisit`).
    WaitedKeyOtherType => c"ERR the lock key now holds a value of another type",
    /// A waiter's key moved to another cluster node (`engine::plan_revisit`, and the slots an
    /// atomic slot migration gave away: `migration::on_slot_move`).
    WaitedKeyMoved => c"TRYAGAIN the lock key moved to another node while you waited; retry",
    /// Every waiter when this master becomes a replica (`keyspace::consequences`).
    UnblockedNowReplica => c"UNBLOCKED this server is now a replica",
    /// FLOCK.WATCH's keys and tokens are not in pairs (`watch::WatchArgError::Pairs`).
    WatchPairs => c"ERR FLOCK.WATCH takes key token pairs",
    /// More than `watch::MAX_PAIRS` pairs.
    WatchTooManyKeys => c"ERR FLOCK.WATCH takes at most 64 keys",
    /// A watched token that is not an integer, 0 or more.
    WatchToken => c"ERR invalid token: must be an integer, 0 or more",
    /// `flock.max-watchers` clients already watch the key.
    TooManyWatchers => c"ERR too many clients watch this key (flock.max-watchers)",
    /// WAITERS' COUNT is not a positive integer.
    WaitersCount => c"ERR invalid count: must be a positive integer",
    /// Every watcher of a replica whose master sends it a full copy of its data.
    UnblockedResync => c"UNBLOCKED this replica is loading its master's data",
    /// FLOCK.MACQUIRE's numkeys out of 1..=`multi::MAX_KEYS` (`args::ArgError::NumKeys`).
    NumKeys => c"ERR numkeys must be 1 to 64",
}

impl Fixed {
    /// The text as a `&str` (every text of the table is ASCII).
    pub fn as_str(self) -> &'static str {
        self.text().to_str().unwrap_or("ERR")
    }

    /// The error FENCED sends when `RedisModule_Call` could not start its inner command and
    /// left `errno` at the code named here.
    pub fn of_call_errno(errno: CallErrno) -> Fixed {
        match errno {
            CallErrno::NoEntry => Fixed::FencedUnknownCommand,
            CallErrno::Invalid => Fixed::FencedArity,
            CallErrno::Access => Fixed::FencedNoPerm,
            CallErrno::NoSpace => Fixed::FencedOom,
            CallErrno::ReadOnly => Fixed::FencedReadOnly,
            CallErrno::Seek => Fixed::FencedCrossSlot,
            CallErrno::Other => Fixed::FencedCouldNotRun,
        }
    }
}

/// Why `RedisModule_Call` returned no reply, by the `errno` it set (the glue maps
/// `libc::ENOENT` to `NoEntry` and so on: errno values are the platform's).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CallErrno {
    /// ENOENT: no such command.
    NoEntry,
    /// EINVAL: wrong arity.
    Invalid,
    /// EACCES: ACL refused.
    Access,
    /// ENOSPC: OOM.
    NoSpace,
    /// EROFS: a write on a read-only replica.
    ReadOnly,
    /// ESPIPE: cross-slot keys.
    Seek,
    Other,
}

/// An error reply whose text carries a value: built when it is sent (these are not on a hot
/// path).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Formatted<'a> {
    /// A TTL out of 1..=`flock.max-ttl-ms` (`args::ArgError::Ttl`).
    Ttl { max: u64 },
    /// A LIMIT out of 1..=`flock.max-holders` (`args::ArgError::Limit`).
    Limit { max: u32 },
    /// The owner holds a grant of `mode` on `key` (`engine::ReplyError::OwnerHolds`).
    OwnerHolds { mode: Mode, key: &'a [u8] },
    /// `key` admits grants of `mode` only (`engine::ReplyError::LimitMismatch`).
    LimitMismatch { mode: Mode, key: &'a [u8] },
    /// FENCED with a token that is not a live grant of `key` (`commands/fenced.rs`).
    FencedStale { token: u64, key: &'a [u8] },
    /// FENCED refuses `command`: `what` is [`crate::args::fenced_refusal`]'s answer.
    FencedRefuses { command: &'a [u8], what: &'a str },
    /// Redis's own arity error for `command` (sent by `RedisModule_WrongArity`; here for the
    /// table's completeness and for hosts other than Redis).
    WrongArity { command: &'a [u8] },
    /// FLOCK.MACQUIRE by an owner that already waits for `key` (`multi::Refusal::Waits`).
    OwnerWaits { key: &'a [u8] },
}

impl Formatted<'_> {
    /// The reply's text (a key or command name that is not UTF-8 shows lossily).
    pub fn message(&self) -> String {
        let lossy = |b: &[u8]| String::from_utf8_lossy(b).into_owned();
        match *self {
            Formatted::Ttl { max } => {
                format!("ERR invalid ttl: must be an integer from 1 to {max} (flock.max-ttl-ms)")
            }
            Formatted::Limit { max } => {
                format!("ERR invalid limit: must be an integer from 1 to {max} (flock.max-holders)")
            }
            Formatted::OwnerHolds { mode, key } => format!(
                "ERR owner already holds {} grant of {}",
                mode.grant_noun(),
                lossy(key)
            ),
            Formatted::LimitMismatch {
                mode: Mode::Permits(n),
                key,
            } => format!(
                "ERR limit mismatch: {} admits {n} shared holders",
                lossy(key)
            ),
            Formatted::LimitMismatch { key, .. } => format!(
                "ERR limit mismatch: {} admits any number of shared holders",
                lossy(key)
            ),
            Formatted::FencedStale { token, key } => {
                format!(
                    "FENCED token {token} is not the live grant of {}",
                    lossy(key)
                )
            }
            Formatted::FencedRefuses { command, what } => format!(
                "ERR FLOCK.FENCED refuses '{}': {what} cannot run inside it",
                lossy(command).to_lowercase()
            ),
            Formatted::OwnerWaits { key } => {
                format!("ERR owner already waits for {}", lossy(key))
            }
            Formatted::WrongArity { command } => format!(
                "ERR wrong number of arguments for '{}' command",
                lossy(command).to_lowercase()
            ),
        }
    }
}

/// An error reply: fixed or formatted.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ErrorReply<'a> {
    Fixed(Fixed),
    Formatted(Formatted<'a>),
}

impl ErrorReply<'_> {
    /// The fixed text, if it is one (the glue sends it without allocating).
    pub fn static_text(&self) -> Option<&'static CStr> {
        match self {
            ErrorReply::Fixed(f) => Some(f.text()),
            ErrorReply::Formatted(_) => None,
        }
    }

    /// The text.
    pub fn message(&self) -> String {
        match self {
            ErrorReply::Fixed(f) => f.as_str().to_string(),
            ErrorReply::Formatted(f) => f.message(),
        }
    }
}

#[cfg(test)]
mod tests;
