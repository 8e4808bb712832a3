//! Fencing tokens: the server-wide issuer and the limits of the token space.

use crate::clock::Now;

/// Largest token ever issued: tokens must stay exact in a JavaScript number (below 2^53).
pub const MAX_TOKEN: u64 = (1 << 53) - 1;

/// Issues fencing tokens from a server-wide high-water mark.
///
/// `token = max(high_water + 1, wall clock in microseconds)`: strictly increasing on this
/// server, and after a restart or a failover larger than every token issued before as long as
/// the persisted mark came along (RDB aux data, replication) or the clock moved forward by more
/// than the mark was ahead of it. Every token seen (loaded, restored, replicated) raises the mark.
#[derive(Debug, Default)]
pub struct TokenIssuer {
    high_water: u64,
}

impl TokenIssuer {
    pub const fn new() -> Self {
        TokenIssuer { high_water: 0 }
    }

    pub fn high_water(&self) -> u64 {
        self.high_water
    }

    /// Raise the mark to at least `token` (a token that came from elsewhere).
    pub fn observe(&mut self, token: u64) {
        if token > self.high_water {
            self.high_water = token;
        }
    }

    /// Whether [`TokenIssuer::issue`] would find no token left at `now`.
    pub fn exhausted(&self, now: Now) -> bool {
        self.high_water.saturating_add(1).max(now.wall_us) > MAX_TOKEN
    }

    /// The next token, or `None` when the token space below 2^53 is used up.
    pub fn issue(&mut self, now: Now) -> Option<u64> {
        let token = self.high_water.saturating_add(1).max(now.wall_us);
        if token > MAX_TOKEN {
            return None;
        }
        self.high_water = token;
        Some(token)
    }
}
