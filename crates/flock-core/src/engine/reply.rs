//! What an operation answers: the reply, and the errors the engine decides (their texts are
//! in the one error table, [`crate::errors`]).

use crate::errors::{ErrorReply, Fixed, Formatted};
use crate::state::Mode;
use std::ffi::CStr;

/// An error reply decided by the engine.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ReplyError {
    TokensExhausted,
    TooManyWaiters,
    CouldNotBlock,
    /// The caller holds a live grant of this mode (another than it asked for).
    OwnerHolds(Mode),
    /// The key admits shared grants of this mode only.
    LimitMismatch(Mode),
}

impl ReplyError {
    /// The error reply, from the one table ([`crate::errors`]); `key` is the lock key's name
    /// (some texts name it).
    pub fn reply(self, key: &[u8]) -> ErrorReply<'_> {
        match self {
            ReplyError::TokensExhausted => ErrorReply::Fixed(Fixed::TokensExhausted),
            ReplyError::TooManyWaiters => ErrorReply::Fixed(Fixed::TooManyWaiters),
            ReplyError::CouldNotBlock => ErrorReply::Fixed(Fixed::CouldNotBlock),
            ReplyError::OwnerHolds(mode) => {
                ErrorReply::Formatted(Formatted::OwnerHolds { mode, key })
            }
            ReplyError::LimitMismatch(mode) => {
                ErrorReply::Formatted(Formatted::LimitMismatch { mode, key })
            }
        }
    }

    /// The fixed text of this error, `None` for the texts that name the key (then
    /// [`ReplyError::message`])..
    pub fn static_text(self) -> Option<&'static CStr> {
        self.reply(b"").static_text()
    }

    /// The error text; `key` is the lock key's name (some texts name it).
    pub fn message(self, key: &[u8]) -> String {
        self.reply(key).message()
    }
}

/// The reply of an operation.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Reply<'a> {
    Int(i64),
    Null,
    Ok,
    Error(ReplyError),
    /// The caller waits: its reply comes when it is handed the key, times out or is told why
    /// not.
    Blocked,
    /// FLOCK.INFO of a key that is held, in lock-delay or waited for.
    Info(Info<'a>),
    /// FLOCK.HOLDERS: every live grant, oldest first, as (owner, token, ttl_ms).
    Holders(Vec<(&'a [u8], u64, u64)>),
}

/// The fields of FLOCK.INFO.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Info<'a> {
    /// The holder when the key is held exclusively.
    pub owner: Option<&'a [u8]>,
    /// The largest live token; the last one issued when none is live.
    pub token: u64,
    /// The longest remaining lease (0 when none is live).
    pub ttl_ms: u64,
    pub waiters: usize,
    /// The mode of the live grants (`None`: no live grant).
    pub mode: Option<Mode>,
    pub holders: usize,
    /// The key's limit (0: none).
    pub limit: u32,
    /// Delayed slots still running.
    pub delayed: usize,
}

impl Info<'_> {
    /// INFO's `mode` field.
    pub fn mode_name(&self) -> &'static str {
        self.mode.map_or("none", Mode::name)
    }
}
