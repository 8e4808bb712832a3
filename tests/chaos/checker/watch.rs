//! The coordination checks (issue 24), over what the watchers were told and how the MACQUIREs
//! ended (history/coord.rs), against the rest of the history:
//! - WATCH: every reply names the token asked (or, for token 0, a grant of the key that was not
//!   surely over: `held`); `gone` never for a grant surely live throughout the call; an end
//!   (`released`, `expired`, `revoked`, `closed`, `lost`) only when the history shows a cause
//!   for it in the call's span (its holder's RELEASE, its lease run out, an operator's REVOKE
//!   or DEL, its bound connection closed, a failover or a restart), and never for a grant that
//!   proved itself live after the reply (none reported that did not happen); one end reported
//!   once (a watch sent after the end was told gets `gone`); a release that surely came while
//!   the watch waited is never missed (a nil instead); no watch answers before its timeout or
//!   hangs; errors only around faults (TRYAGAIN, UNBLOCKED, LOADING, READONLY).
//! - MACQUIRE: every call answers (a BLOCK within its timeout plus 10 s: no deadlock, whatever
//!   the key order), a BLOCK's nil not before its timeout, one distinct token per key, errors
//!   only around faults, and some were granted (progress). G1 per key needs nothing here:
//!   their grants are ordinary grants of the history.

use crate::history::coord::*;
use crate::history::*;
use crate::EPS_US;
use std::collections::HashMap;

/// An error reply a fault explains: the slot moved, a demotion or full sync, a restart.
fn fault_error(e: &str) -> bool {
    ["TRYAGAIN", "UNBLOCKED", "LOADING", "READONLY"]
        .iter()
        .any(|p| e.starts_with(p))
}

/// Whether grant `g` was surely live throughout (from, to): a proof that ended by `from` and
/// one that began at `to` or later, both on the master of failover epoch `epoch`.
fn surely_live(g: &GrantRec, from: u64, to: u64, epoch: u64) -> bool {
    let of_epoch = |i: usize| g.proof_epochs.get(i) == Some(&epoch) && epoch != u64::MAX;
    let before = (0..g.proofs.len()).any(|i| of_epoch(i) && g.proofs[i].1 <= from);
    let after = (0..g.proofs.len()).any(|i| of_epoch(i) && g.proofs[i].0 >= to);
    before && after
}

/// Whether something in the history can have ended grant `g` with `event` within (send, ack).
fn cause(h: &History, g: &GrantRec, event: &str, send: u64, ack: u64) -> bool {
    let operator = |h: &History| {
        h.operator
            .iter()
            .any(|o| o.may_end(g) && o.send <= ack + EPS_US && o.done + EPS_US >= send)
    };
    let fault = h
        .resets
        .iter()
        .any(|&r| r + EPS_US >= send && r <= ack + EPS_US)
        || g.lost_in_failover
        || h.skewed.iter().any(|&(a, b)| a <= ack && b >= send);
    match event {
        // its holder's RELEASE
        "released" => g.released.is_some_and(|r| r + EPS_US >= send) || g.unsure,
        // its lease ran out: not before the last acknowledged extension + ttl
        "expired" => g.lower + g.ttl_us <= ack + EPS_US || fault,
        // an operator's REVOKE (or DEL: the history does not tell them apart)
        "revoked" => operator(h),
        "closed" => g.bound.is_some() && h.bound_closed_before(g, ack + EPS_US),
        // a DEL, a restart, a failover
        "lost" => operator(h) || fault,
        _ => false,
    }
}

pub(crate) fn check_coordination(sh: &Shared, h: &mut History) {
    let mut v = Vec::new();
    let by_token: HashMap<i64, usize> = h
        .grants
        .iter()
        .enumerate()
        .map(|(i, g)| (g.token, i))
        .collect();
    let mut n: HashMap<&'static str, u64> = HashMap::new();
    // End reports per token, for "reported once": (send, ack, epoch).
    let mut ends: HashMap<i64, Vec<(u64, u64, u64)>> = HashMap::new();
    for w in &h.watches {
        let key = sh.lock_key(w.key);
        let what = format!(
            "watcher {}: FLOCK.WATCH {} {key} {} sent at {:.3}s, answered at {:.3}s",
            w.watcher,
            w.timeout_ms,
            w.token,
            w.send as f64 / 1e6,
            w.ack as f64 / 1e6
        );
        let (event, owner, token) = match &w.told {
            Told::Hung => {
                v.push(format!(
                    "{what}: no answer within its timeout + 20 s (hung)"
                ));
                continue;
            }
            Told::Lost => continue,
            Told::Error(e) => {
                if fault_error(e) {
                    *n.entry("WATCH errors around faults").or_default() += 1;
                } else {
                    v.push(format!("{what}: unexpected error {e}"));
                }
                continue;
            }
            Told::TimedOut => {
                let waited = w.ack.saturating_sub(w.send);
                if waited + 2_000 < w.timeout_ms * 1000 {
                    v.push(format!(
                        "{what}: nil after {} ms, before its timeout",
                        waited / 1000
                    ));
                }
                // The watch waited on the server from R (send <= R <= ack - timeout) to R +
                // timeout: a RELEASE whose request came after ack - timeout and whose reply came
                // before send + timeout ended the grant while it was watched (or before the
                // watch came: then `gone`). Nil is a missed end.
                let t = w.timeout_ms * 1000;
                let Some(g) = by_token.get(&w.token).map(|&i| &h.grants[i]) else {
                    continue;
                };
                let Some(r) = g.released else { continue };
                if w.epoch == u64::MAX || g.failover_epoch != w.epoch || g.key != w.key {
                    continue;
                }
                *n.entry("WATCH nils checked against releases").or_default() += 1;
                if g.touched >= (w.ack + EPS_US).saturating_sub(t) && r + EPS_US <= w.send + t {
                    v.push(format!(
                        "{what}: nil, yet grant {} was released by its holder at {:.3}s..{:.3}s \
                         while the watch surely waited (an end not reported)",
                        g.token,
                        g.touched as f64 / 1e6,
                        r as f64 / 1e6
                    ));
                }
                continue;
            }
            Told::Fired {
                event,
                owner,
                token,
            } => (event.as_str(), owner, *token),
        };
        if w.token != 0 && token != w.token {
            v.push(format!(
                "{what}: told {event} of token {token}, another token"
            ));
            continue;
        }
        if (w.token == 0) != (event == "held") {
            v.push(format!("{what}: told {event} (held answers token 0 alone)"));
            continue;
        }
        if event == "gone" && owner.is_some() {
            v.push(format!("{what}: gone names an owner {owner:?}"));
        }
        let Some(g) = by_token.get(&token).map(|&i| &h.grants[i]) else {
            // A grant whose reply no client read (a hang-up, a lost reply): not in the history.
            *n.entry("WATCH reports of grants outside the history")
                .or_default() += 1;
            continue;
        };
        if g.key != w.key || (event != "gone" && owner.as_deref() != Some(g.owner.as_str())) {
            v.push(format!(
                "{what}: told {event} of {owner:?}, token {token}, a grant of {} by {}",
                sh.lock_key(g.key),
                g.owner
            ));
            continue;
        }
        match event {
            "held" => {
                *n.entry("WATCH held checked").or_default() += 1;
                let over = g.released.is_some_and(|r| r + EPS_US < w.send)
                    && g.failover_epoch == w.epoch
                    && !g.lost_in_failover;
                if g.send > w.ack + EPS_US || over {
                    v.push(format!(
                        "{what}: held by token {token}, granted at {:.3}s..{:.3}s, released at \
                         {:?}: not live during the call",
                        g.send as f64 / 1e6,
                        g.ack as f64 / 1e6,
                        g.released
                    ));
                }
            }
            "gone" => {
                *n.entry("WATCH gone checked").or_default() += 1;
                if surely_live(g, w.send, w.ack, w.epoch) {
                    v.push(format!(
                        "{what}: gone, yet grant {token} proved itself live before and after the \
                         call"
                    ));
                }
            }
            _ => {
                *n.entry("WATCH ends checked").or_default() += 1;
                ends.entry(token)
                    .or_default()
                    .push((w.send, w.ack, w.epoch));
                let late = g
                    .proofs
                    .iter()
                    .zip(&g.proof_epochs)
                    .find(|(p, &e)| e == w.epoch && e != u64::MAX && p.0 > w.ack + EPS_US);
                if let Some((p, _)) = late {
                    v.push(format!(
                        "{what}: told {event}, yet grant {token} proved itself live at \
                         {:.3}s..{:.3}s, after the reply (an end that did not happen)",
                        p.0 as f64 / 1e6,
                        p.1 as f64 / 1e6
                    ));
                }
                let same_master = w.epoch != u64::MAX
                    && g.failover_epoch == w.epoch
                    && g.proof_epochs.iter().all(|&e| e == w.epoch);
                if !same_master {
                    *n.entry("WATCH ends across a failover (not checked)")
                        .or_default() += 1;
                } else if cause(h, g, event, w.send, w.ack) {
                    *n.entry("WATCH ends matched to their cause").or_default() += 1;
                } else {
                    v.push(format!(
                        "{what}: told {event} of grant {token} ({}, ttl {} ms, last extended at \
                         {:.3}s, released {:?}, bound {:?}), but nothing in the history ended \
                         it that way then",
                        g.owner,
                        g.ttl_us / 1000,
                        g.lower as f64 / 1e6,
                        g.released,
                        g.bound
                    ));
                }
            }
        }
    }
    // One end, told once: a watch sent after an end of the same grant was told (on the same
    // master) gets `gone`, never the end again.
    for (token, mut e) in ends {
        e.sort_unstable();
        for (i, a) in e.iter().enumerate() {
            if let Some(b) = e[i + 1..]
                .iter()
                .find(|b| b.0 > a.1 + EPS_US && b.2 == a.2 && a.2 != u64::MAX)
            {
                v.push(format!(
                    "the end of grant {token} was told twice: to a watch answered at {:.3}s and \
                     to one sent at {:.3}s",
                    a.1 as f64 / 1e6,
                    b.0 as f64 / 1e6
                ));
                break;
            }
        }
    }

    // MACQUIRE: every call finishes, one token per key, progress.
    let mut granted = 0u64;
    for m in &h.multis {
        let keys: Vec<String> = m.keys.iter().map(|&k| sh.lock_key(k)).collect();
        let what = format!(
            "client {}: FLOCK.MACQUIRE {} {} BLOCK {:?} sent at {:.3}s",
            m.client,
            keys.len(),
            keys.join(" "),
            m.block,
            m.send as f64 / 1e6
        );
        match &m.end {
            MultiEnd::Hung => v.push(format!(
                "{what}: no answer within its timeout + 10 s (a deadlock, or a lost wake-up)"
            )),
            MultiEnd::Nil => {
                let waited = (m.ack - m.send) / 1000;
                if let Some(t) = m.block.filter(|&t| waited + 2 < t) {
                    v.push(format!("{what}: nil after {waited} ms, before its {t} ms"));
                }
            }
            MultiEnd::Error(e) if fault_error(e) => {
                *n.entry("MACQUIRE errors around faults").or_default() += 1
            }
            MultiEnd::Error(e) => v.push(format!("{what}: unexpected error {e}")),
            MultiEnd::Lost => {}
            MultiEnd::Granted(t) => {
                granted += 1;
                let mut d = t.clone();
                d.sort_unstable();
                d.dedup();
                if t.len() != m.keys.len() || d.len() != t.len() || t.iter().any(|&x| x <= 0) {
                    v.push(format!(
                        "{what}: granted tokens {t:?}, not one distinct per key"
                    ));
                }
            }
        }
    }
    if h.multis.len() >= 20 && granted == 0 {
        v.push(format!(
            "none of {} MACQUIREs was granted (no progress)",
            h.multis.len()
        ));
    }
    let blocked = h.multis.iter().filter(|m| m.block.is_some()).count() as u64;
    *h.checks
        .entry("MACQUIRE BLOCK calls that finished")
        .or_default() += h
        .multis
        .iter()
        .filter(|m| m.block.is_some() && m.end != MultiEnd::Hung)
        .count() as u64;
    *h.checks.entry("MACQUIRE BLOCK calls").or_default() += blocked;
    *h.checks.entry("MACQUIRE granted").or_default() += granted;
    for (k, c) in n {
        *h.checks.entry(k).or_default() += c;
    }
    for x in v {
        h.violation(x);
    }
}
