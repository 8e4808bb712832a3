//! FLOCK.FENCED's rules (G5): whether a token lets the inner command run, and how.
//!
//! The glue asks Redis to run the inner command (`RedisModule_Call`) with the access decided
//! here; the texts it replies with are in [`crate::errors`].

use crate::clock::Now;
use crate::state::{LockState, Mode};

/// What FLOCK.FENCED may do under a token.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Access {
    /// The token is not a live grant of the key (no key, another token, a lease that ran
    /// out): nothing runs and the caller gets the FENCED error.
    Refused,
    /// An exclusive grant or a permit: the inner command may write.
    ReadWrite,
    /// A shared (reader) grant: only read-only commands run. A reader must not write under
    /// a read lock: Redis itself refuses every command flagged `write` when the call is made
    /// read-only, scripts and module commands included.
    ReadOnly,
}

/// What `token` allows on the key whose state is `state` (`None`: no lock key) at `now`.
pub fn access(state: Option<&LockState>, token: u64, now: Now) -> Access {
    let Some(state) = state else {
        return Access::Refused;
    };
    if state.live_grant(token, now).is_none() {
        return Access::Refused;
    }
    match state.mode {
        Mode::Shared => Access::ReadOnly,
        Mode::Exclusive | Mode::Permits(_) => Access::ReadWrite,
    }
}

/// Whether an error reply of the inner command is Redis refusing a write under read-only
/// access (Redis and Valkey word it "Write command '...' was called while write is not
/// allowed."): the caller is told its shared grant allows reads only.
pub fn is_write_refusal(error_text: &[u8]) -> bool {
    const NEEDLE: &[u8] = b"write is not allowed";
    error_text.windows(NEEDLE.len()).any(|w| w == NEEDLE)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::state::Grant;

    fn now() -> Now {
        Now::new(1_000_000_000, 1_000_000_000)
    }

    fn held(mode: Mode, token: u64, ttl_ms: u64) -> LockState {
        LockState::with_grant(mode, Grant::new(b"me", token, ttl_ms, now()))
    }

    macro_rules! access_cases {
        ($($name:ident: $state:expr, $token:expr => $want:expr;)*) => {$(
            #[test]
            fn $name() {
                let state: Option<LockState> = $state;
                assert_eq!(access(state.as_ref(), $token, now()), $want);
            }
        )*};
    }

    access_cases! {
        no_key_refuses: None, 7 => Access::Refused;
        another_token_refuses: Some(held(Mode::Exclusive, 7, 1000)), 8 => Access::Refused;
        exclusive_grant_writes: Some(held(Mode::Exclusive, 7, 1000)), 7 => Access::ReadWrite;
        permit_writes: Some(held(Mode::Permits(3), 7, 1000)), 7 => Access::ReadWrite;
        shared_grant_reads_only: Some(held(Mode::Shared, 7, 1000)), 7 => Access::ReadOnly;
    }

    #[test]
    fn a_lease_that_ran_out_refuses() {
        let state = held(Mode::Exclusive, 7, 10);
        let later = Now::new(now().wall_us + 10_000, now().mono_us + 10_000);
        assert_eq!(access(Some(&state), 7, later), Access::Refused);
    }

    #[test]
    fn write_refusals_are_recognised() {
        assert!(is_write_refusal(
            b"ERR Write command 'set' was called while write is not allowed."
        ));
        assert!(!is_write_refusal(b"ERR wrong number of arguments"));
        assert!(!is_write_refusal(b""));
    }
}
