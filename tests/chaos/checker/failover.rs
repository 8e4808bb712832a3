//! What a failover may not do: lose a grant the replica acknowledged (durable grants,
//! checked at each failover against what the new master holds), or let a later token fall
//! below a token the old master issued, lost grants and masters whose clock is a day behind
//! included (G3 with no exception, checked over the whole history).

use crate::history::*;
use std::collections::HashMap;

/// Durable grants that must have crossed a failover whose old master died at `cut`, judged
/// at `now`: the replica acknowledged them (and an extension at `durable_lower`), they were
/// acknowledged before `cut`, not ended, released, revoked, deleted or replaced since, and
/// their lease counted from the last extension the replica acknowledged runs at least another
/// 100 ms.
pub(crate) fn expected_durable(h: &History, cut: u64, now: u64) -> Vec<usize> {
    let mut out = Vec::new();
    for (i, g) in h.grants.iter().enumerate() {
        if !g.durable
            || g.ack >= cut
            || g.touched >= cut
            || g.released.is_some()
            || g.unsure
            || !g.ends.is_empty()
            || g.durable_lower + g.ttl_us < now + 100_000
        {
            continue;
        }
        let touched = h.operator.iter().any(|o| o.may_end(g) && o.done > g.send);
        let replaced = h.grants.iter().any(|o| {
            o.key == g.key
                && o.token != g.token
                && o.ack > g.send
                && (o.kind == Kind::Exclusive || g.kind == Kind::Exclusive)
        });
        if !touched && !replaced {
            out.push(i);
        }
    }
    out
}

/// After a failover whose old master died at `cut`: every durable grant that must have crossed
/// over is among `holders` (each key's (owner, token) on the new master, listed at `at`).
/// Returns how many were there; each missing one is a violation.
pub(crate) fn check_durable_survivors(
    sh: &Shared,
    h: &mut History,
    holders: &HashMap<usize, Vec<(String, i64)>>,
    cut: u64,
    at: u64,
) -> u64 {
    let (mut kept, mut lost) = (0u64, 0u64);
    for i in expected_durable(h, cut, at) {
        let g = h.grants[i].clone();
        let info = holders.get(&g.key).cloned().unwrap_or_default();
        if info.iter().any(|(o, t)| *o == g.owner && *t == g.token) {
            kept += 1;
        } else {
            lost += 1;
            h.violation(format!(
                "durable grant {} of {} (owner {}, acknowledged by the replica) lost in a \
                 failover; the new master shows {info:?}",
                g.token,
                sh.lock_key(g.key),
                g.owner
            ));
        }
    }
    *h.checks
        .entry("acknowledged durable grants present after failover")
        .or_default() += kept;
    *h.checks
        .entry("acknowledged durable grants lost in failover (must be 0)")
        .or_default() += lost;
    kept
}

/// G3 with no exception, named for the two cases the clock used to decide: every grant asked
/// for after a grant lost in a failover was acknowledged has a larger token, and so has every
/// grant made by a master promoted with its clock a day behind, over every grant acknowledged
/// before it was asked for.
pub(crate) fn check_tokens_across_failovers(h: &mut History, v: &mut Vec<String>) {
    // The lost grants by acknowledgement time, with the largest token acknowledged so far.
    let mut lost: Vec<(u64, i64)> = h
        .grants
        .iter()
        .filter(|g| g.lost_in_failover)
        .map(|g| (g.ack, g.token))
        .collect();
    lost.sort_unstable();
    let mut pairs = 0u64;
    for g in &h.grants {
        let before = lost.partition_point(|&(ack, _)| ack < g.send);
        pairs += before as u64;
        if let Some(&(ack, t)) = lost[..before].iter().max_by_key(|(_, t)| *t) {
            if g.token <= t {
                v.push(format!(
                    "token {} asked for at {:.3}s is not above token {t} of a grant lost in a \
                     failover, acknowledged at {:.3}s (G3, no exception)",
                    g.token,
                    g.send as f64 / 1e6,
                    ack as f64 / 1e6
                ));
            }
        }
    }
    *h.checks
        .entry("G3 grants above an earlier grant lost in failover (pairs)")
        .or_default() += pairs;

    // Grants a master a day behind made, against every grant acknowledged before each.
    let mut by_ack: Vec<(u64, i64)> = h.grants.iter().map(|g| (g.ack, g.token)).collect();
    by_ack.sort_unstable();
    let mut best = Vec::with_capacity(by_ack.len());
    let mut m = (0i64, 0u64);
    for &(ack, t) in &by_ack {
        if t > m.0 {
            m = (t, ack);
        }
        best.push(m);
    }
    let mut skewed = 0u64;
    for g in &h.grants {
        if !h.skewed.iter().any(|&(a, b)| g.send >= a && g.send <= b) {
            continue;
        }
        skewed += 1;
        let before = by_ack.partition_point(|&(ack, _)| ack < g.send);
        if before == 0 {
            continue;
        }
        let (t, ack) = best[before - 1];
        if g.token <= t {
            v.push(format!(
                "token {} made by a master a day behind, asked for at {:.3}s, is not above \
                 token {t} acknowledged at {:.3}s (G3 without a clock assumption)",
                g.token,
                g.send as f64 / 1e6,
                ack as f64 / 1e6
            ));
        }
    }
    *h.checks
        .entry("G3 grants by a master a day behind, above every earlier token")
        .or_default() += skewed;
}
