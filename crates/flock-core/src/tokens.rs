//! Fencing tokens: the server-wide issuer and the limits of the token space.

use crate::clock::Now;

/// Largest token ever issued: tokens must stay exact in a JavaScript number (below 2^53).
pub const MAX_TOKEN: u64 = (1 << 53) - 1;

/// How many grants a promotion allows for that the promoted server never heard of (lost in
/// the failover: still in the old master's replication buffer). Each grant takes one token
/// above the mark at least, so the old master's tokens reach at most `max(mark it knew, its
/// clock) + grants`; 2^24 (16.8 million) is more than any replication backlog holds, and at a
/// microsecond per token it is absorbed by the clock in 17 seconds.
pub const LOST_GRANTS_ALLOWANCE: u64 = 1 << 24;

/// Issues fencing tokens from a server-wide high-water mark.
///
/// `token = max(high_water + 1, wall clock in microseconds)`: strictly increasing on this
/// server, and after a restart larger than every token issued before as long as the persisted
/// mark came along (RDB aux data, the AOF's effects and marks, replication). Every token seen
/// (loaded, restored, replicated, marked) raises the mark. A server that starts serving as a
/// master after a promotion or a restart first raises the mark past every token the old master
/// can have issued without it hearing ([`TokenIssuer::promote`]).
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

    /// Raise the mark when this server starts serving as a master (a promotion, or a restart
    /// from whatever it persisted) to `max(high_water, wall clock + margin_us) +`
    /// [`LOST_GRANTS_ALLOWANCE`], and return it (the mark to replicate).
    ///
    /// Why: the old master's last grants may never have reached this server (asynchronous
    /// replication; a persisted file's lost tail). Each of them has a token of at most
    /// `max(the mark this server knows, the old master's clock) + the number of them`. With
    /// the two clocks less than `margin_us` apart (either way) and fewer lost grants than the
    /// allowance, every token issued from here on is above all of them, whatever the clocks
    /// read. The margin is added to the clock, not to the mark: a mark still above the clock
    /// from an earlier promotion is not pushed up by a margin again (only by the allowance),
    /// so failovers in quick succession use up the token space no faster than the allowance
    /// each, and the clock absorbs the margin within `margin_us`. Past [`MAX_TOKEN`] the mark
    /// stops there: no token is issued rather than one that might be too small.
    pub fn promote(&mut self, now: Now, margin_us: u64) -> u64 {
        let floor = self
            .high_water
            .max(now.wall_us.saturating_add(margin_us))
            .saturating_add(LOST_GRANTS_ALLOWANCE);
        self.high_water = floor.min(MAX_TOKEN);
        self.high_water
    }

    /// Tokens left below 2^53 at `now`: what the clock or the mark, whichever is ahead, has
    /// not used up yet (INFO's `flock_token_headroom`).
    pub fn headroom(&self, now: Now) -> u64 {
        MAX_TOKEN.saturating_sub(self.high_water.max(now.wall_us))
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

#[cfg(test)]
mod tests {
    use super::*;

    const DAY_US: u64 = 86_400_000_000;
    /// About today's clock in microseconds (2026).
    const T: u64 = 1_796_000_000_000_000;

    fn at(wall_us: u64) -> Now {
        Now::new(wall_us, 1_000_000)
    }

    fn issuer(mark: u64) -> TokenIssuer {
        let mut t = TokenIssuer::new();
        t.observe(mark);
        t
    }

    /// The old master issued `lost` tokens this server never heard of, its clock `skew_us`
    /// ahead of ours (negative: behind); every token we issue after the promotion is above
    /// all of them.
    fn promoted_above_lost(known_mark: u64, our_clock: u64, skew_us: i64, lost: u64) {
        let theirs = our_clock.checked_add_signed(skew_us).unwrap();
        let mut old = issuer(known_mark);
        let mut last_lost = 0;
        for _ in 0..lost {
            last_lost = old.issue(at(theirs)).unwrap();
        }
        let mut new = issuer(known_mark);
        new.promote(at(our_clock), DAY_US);
        let first = new.issue(at(our_clock)).unwrap();
        assert!(
            first > last_lost,
            "mark {known_mark}, skew {skew_us}, {lost} lost: {first} not above {last_lost}"
        );
    }

    #[test]
    fn a_promoted_replica_a_day_behind_issues_above_the_lost_grants() {
        promoted_above_lost(T, T - DAY_US + 1, DAY_US as i64 - 1, 1);
    }

    #[test]
    fn a_promoted_replica_a_day_ahead_issues_above_the_lost_grants() {
        promoted_above_lost(T, T + DAY_US, -(DAY_US as i64), 1);
    }

    #[test]
    fn a_promoted_replica_issues_above_many_lost_grants_made_from_the_mark() {
        // The old master's mark ran ahead of both clocks (an earlier promotion's margin):
        // its lost tokens count up from the mark, one per grant.
        promoted_above_lost(T + 2 * DAY_US, T, 0, 100_000);
    }

    #[test]
    fn a_mark_still_above_the_clock_gets_only_the_allowance_again() {
        let mut t = issuer(T + DAY_US + 5);
        assert_eq!(
            t.promote(at(T), DAY_US),
            T + DAY_US + 5 + LOST_GRANTS_ALLOWANCE
        );
    }

    #[test]
    fn a_mark_below_the_clock_starts_a_margin_above_the_clock() {
        let mut t = issuer(T - 10);
        assert_eq!(t.promote(at(T), DAY_US), T + DAY_US + LOST_GRANTS_ALLOWANCE);
    }

    #[test]
    fn failovers_every_minute_do_not_pile_up_margins() {
        // A minute is longer than the allowance takes the clock to absorb: the mark stays a
        // margin and an allowance above the clock, however many failovers there are.
        let minute = 60_000_000;
        let mut t = issuer(T);
        let mut now = T;
        for _ in 0..100_000 {
            now += minute;
            t.promote(at(now), DAY_US);
        }
        assert_eq!(t.high_water(), now + DAY_US + LOST_GRANTS_ALLOWANCE);
        // A century of clock on top of today's still fits below 2^53.
        let century = 100 * 365 * DAY_US + 25 * DAY_US;
        assert!(T + century + DAY_US + LOST_GRANTS_ALLOWANCE < MAX_TOKEN);
    }

    #[test]
    fn failovers_every_second_use_the_allowance_only() {
        let mut t = issuer(T);
        let mut now = T;
        for _ in 0..1000 {
            now += 1_000_000;
            t.promote(at(now), DAY_US);
        }
        // One margin in all, then an allowance per failover (less the clock's progress).
        assert_eq!(
            t.high_water(),
            T + 1_000_000 + DAY_US + 1000 * LOST_GRANTS_ALLOWANCE
        );
    }

    #[test]
    fn a_promotion_past_the_token_space_issues_nothing() {
        let mut t = issuer(MAX_TOKEN - 5);
        assert_eq!(t.promote(at(T), DAY_US), MAX_TOKEN);
        assert_eq!(t.issue(at(T)), None);
        assert_eq!(t.headroom(at(T)), 0);
    }

    #[test]
    fn v2_tokens_stay_below_every_token_after_a_promotion() {
        // A v1/v2 token is a clock reading of its time; a promoted mark is past the clock.
        let v2_token = T - 30 * DAY_US;
        let mut t = issuer(v2_token);
        t.promote(at(T), DAY_US);
        assert!(t.issue(at(T)).unwrap() > v2_token);
    }
}
