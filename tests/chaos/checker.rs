//! The history checker: reads a finished run's history and server-side logs and lists every
//! violation of the guarantees (G1 to G5, G9, durability; see main.rs); and its self-test on
//! synthetic histories with planted violations.

use crate::history::*;
use crate::EPS_US;
use std::collections::HashMap;

pub(crate) fn check_history(sh: &Shared, h: &mut History, logs: &HashMap<usize, Vec<String>>) {
    let mut v: Vec<String> = Vec::new();

    // G3: no token twice (tokens are server-wide: across keys too).
    let mut by_token: HashMap<i64, (usize, &str)> = HashMap::new();
    for g in &h.grants {
        if let Some((k, o)) = by_token.insert(g.token, (g.key, &g.owner)) {
            if k != g.key || o != g.owner {
                v.push(format!(
                    "token {} issued twice: to {o} on key {k} and to {} on key {} (G3)",
                    g.token, g.owner, g.key
                ));
            }
        }
    }
    *h.checks.entry("G3 distinct tokens").or_default() += by_token.len() as u64;

    // G3: real-time order. A grant acknowledged before another was asked for has the smaller
    // token.
    let mut by_ack: Vec<(u64, i64)> = h.grants.iter().map(|g| (g.ack, g.token)).collect();
    by_ack.sort_unstable();
    let mut by_send: Vec<(u64, i64)> = h.grants.iter().map(|g| (g.send, g.token)).collect();
    by_send.sort_unstable();
    let (mut j, mut max_before) = (0usize, (0i64, 0u64));
    let mut pairs = 0u64;
    for (send, token) in &by_send {
        while j < by_ack.len() && by_ack[j].0 < *send {
            if by_ack[j].1 > max_before.0 {
                max_before = (by_ack[j].1, by_ack[j].0);
            }
            j += 1;
        }
        pairs += j as u64;
        if max_before.0 != 0 && *token <= max_before.0 && *token != max_before.0 {
            v.push(format!(
                "token {token} asked for at {:.3}s is not above token {} acknowledged at \
                 {:.3}s (G3)",
                *send as f64 / 1e6,
                max_before.0,
                max_before.1 as f64 / 1e6
            ));
        }
    }
    *h.checks.entry("G3 ordered grant pairs").or_default() += pairs;

    // G1: sure-live spans per key.
    for k in 0..sh.keys {
        let grants: Vec<&GrantRec> = h.grants.iter().filter(|g| g.key == k).collect();
        // spans: (start, end, token)
        let mut spans: Vec<(u64, u64, i64)> = Vec::new();
        for g in &grants {
            let first_ack = g.proofs.iter().map(|p| p.1).min().unwrap_or(u64::MAX);
            let last_send = g.proofs.iter().map(|p| p.0).max().unwrap_or(0);
            if first_ack < last_send {
                spans.push((first_ack, last_send, g.token));
            }
        }
        spans.sort_unstable();
        // prefix: the two largest ends (with different tokens) among spans starting <= s
        let mut prefix: Vec<[(u64, i64); 2]> = Vec::with_capacity(spans.len());
        let mut best = [(0u64, 0i64); 2];
        for s in &spans {
            let cand = (s.1, s.2);
            if cand.0 > best[0].0 {
                if best[0].1 != cand.1 {
                    best[1] = best[0];
                }
                best[0] = cand;
            } else if cand.0 > best[1].0 && cand.1 != best[0].1 {
                best[1] = cand;
            }
            prefix.push(best);
        }
        let mut n = 0u64;
        for g in &grants {
            for p in &g.proofs {
                // spans starting at or before p.0
                let idx = spans.partition_point(|s| s.0 <= p.0);
                if idx == 0 {
                    continue;
                }
                n += 1;
                let b = prefix[idx - 1];
                let other = if b[0].1 != g.token { b[0] } else { b[1] };
                if other.1 != 0 && other.0 >= p.1 {
                    v.push(format!(
                        "two live grants of {}: token {} proved live within ({:.3}s, {:.3}s) \
                         while token {} was live throughout it (G1)",
                        sh.lock_key(k),
                        g.token,
                        p.0 as f64 / 1e6,
                        p.1 as f64 / 1e6,
                        other.1
                    ));
                }
            }
        }
        *h.checks
            .entry("G1 proofs checked against other grants")
            .or_default() += n;
    }

    // G9: no lease ended early (unless revoked, deleted or lost in a failover).
    let mut early_checked = 0u64;
    for g in &h.grants {
        for &(send, ack, epoch, lower) in &g.ends {
            let deadline = lower + g.ttl_us;
            if ack + EPS_US >= deadline
                || epoch != g.failover_epoch
                || g.lost_in_failover
                || g.released.is_some_and(|r| r <= send)
            {
                continue;
            }
            let touched = h
                .operator
                .iter()
                .any(|o| o.key == g.key && o.send < ack && o.done > g.send);
            if touched {
                continue;
            }
            v.push(format!(
                "lease of token {} on {} ({} ms) ended early: seen over at {:.3}s..{:.3}s, \
                 {} ms before its end, with no REVOKE or DEL (G9)",
                g.token,
                sh.lock_key(g.key),
                g.ttl_us / 1000,
                send as f64 / 1e6,
                ack as f64 / 1e6,
                (deadline - ack) / 1000
            ));
        }
        early_checked += g.ends.len() as u64;
    }
    *h.checks.entry("G9 lease ends checked").or_default() += early_checked;

    // Writes and logs.
    let tags: HashMap<&str, &WriteRec> = h.writes.iter().map(|w| (w.tag.as_str(), w)).collect();
    for k in 0..sh.keys {
        let log = &logs[&k];
        let mut last = 0i64;
        for (i, entry) in log.iter().enumerate() {
            let token: i64 = entry
                .split(':')
                .next()
                .and_then(|t| t.parse().ok())
                .unwrap_or(0);
            if token < last {
                v.push(format!(
                    "log of {} goes back in token order at entry {i}: {token} after {last} (G1/G5)",
                    sh.lock_key(k)
                ));
            }
            last = last.max(token);
            match tags.get(entry.as_str()) {
                Some(w) if w.outcome == Outcome::Refused => v.push(format!(
                    "a refused FENCED write is in the log of {}: {entry} (G5)",
                    sh.lock_key(k)
                )),
                None => v.push(format!(
                    "the log of {} holds {entry}, which no client wrote",
                    sh.lock_key(k)
                )),
                _ => {}
            }
        }
        *h.checks.entry("log entries checked").or_default() += log.len() as u64;
        let present: std::collections::HashSet<&str> = log.iter().map(String::as_str).collect();
        for w in h.writes.iter().filter(|w| w.key == k) {
            if w.outcome == Outcome::Accepted
                && !w.lost_in_failover
                && !present.contains(w.tag.as_str())
            {
                v.push(format!(
                    "acknowledged FENCED write {} missing from the log of {}",
                    w.tag,
                    sh.lock_key(k)
                ));
            }
        }
        // Real-time order of accepted writes.
        let mut acc: Vec<&WriteRec> = h
            .writes
            .iter()
            .filter(|w| w.key == k && w.outcome == Outcome::Accepted)
            .collect();
        acc.sort_by_key(|w| w.ack);
        let mut by_send = acc.clone();
        by_send.sort_by_key(|w| w.send);
        let (mut j, mut max_tok) = (0usize, 0i64);
        for w in &by_send {
            while j < acc.len() && acc[j].ack < w.send {
                max_tok = max_tok.max(acc[j].token);
                j += 1;
            }
            if w.token < max_tok {
                v.push(format!(
                    "FENCED write with token {} accepted after a write with token {max_tok} was \
                     acknowledged (G5)",
                    w.token
                ));
            }
        }
    }
    for x in v {
        h.violation(x);
    }
}

// ---------------------------------------------------------------------------------------------
// the checker catches what it should (synthetic histories)
// ---------------------------------------------------------------------------------------------

fn synthetic_shared(keys: usize) -> Shared {
    Shared::new(0, keys, 0)
}

fn grant_rec(key: usize, owner: &str, token: i64, ttl_ms: u64, proofs: &[(u64, u64)]) -> GrantRec {
    GrantRec {
        key,
        owner: owner.into(),
        token,
        ttl_us: ttl_ms * 1000,
        send: proofs[0].0,
        ack: proofs[0].1,
        lower: proofs[0].0,
        upper: proofs[0].1,
        proofs: proofs.to_vec(),
        ends: Vec::new(),
        released: None,
        unsure: false,
        touched: proofs[0].0,
        failover_epoch: 0,
        lost_in_failover: false,
    }
}

fn violations_of(h: &mut History, logs: &[(usize, &[&str])]) -> Vec<String> {
    let sh = synthetic_shared(2);
    h.quiet = true;
    let mut l: HashMap<usize, Vec<String>> = (0..2).map(|k| (k, Vec::new())).collect();
    for (k, entries) in logs {
        l.insert(*k, entries.iter().map(|s| s.to_string()).collect());
    }
    check_history(&sh, h, &l);
    std::mem::take(&mut h.violations)
}

#[test]
fn the_checker_finds_planted_violations() {
    let ms = |x: u64| x * 1000;
    // A clean history: two grants of key 0 one after the other, one of key 1.
    let mut h = History::default();
    h.grants
        .push(grant_rec(0, "a", 10, 100, &[(0, ms(1)), (ms(50), ms(51))]));
    h.grants.push(grant_rec(
        0,
        "b",
        20,
        100,
        &[(ms(60), ms(61)), (ms(90), ms(91))],
    ));
    h.grants
        .push(grant_rec(1, "c", 30, 100, &[(ms(95), ms(96))]));
    assert!(
        violations_of(&mut h, &[]).is_empty(),
        "clean history flagged"
    );

    // G1: b proves itself while a is live throughout (a proved live at 1 ms and at 50 ms).
    let mut h = History::default();
    h.grants
        .push(grant_rec(0, "a", 10, 100, &[(0, ms(1)), (ms(50), ms(51))]));
    h.grants
        .push(grant_rec(0, "b", 20, 100, &[(ms(10), ms(11))]));
    let v = violations_of(&mut h, &[]);
    assert!(v.iter().any(|x| x.contains("(G1)")), "G1 not found: {v:?}");

    // G3: the same token for two owners; a later grant with a smaller token.
    let mut h = History::default();
    h.grants.push(grant_rec(0, "a", 10, 10, &[(0, ms(1))]));
    h.grants
        .push(grant_rec(1, "b", 10, 10, &[(ms(20), ms(21))]));
    h.grants.push(grant_rec(1, "c", 5, 10, &[(ms(40), ms(41))]));
    let v = violations_of(&mut h, &[]);
    assert!(v.iter().any(|x| x.contains("issued twice")), "{v:?}");
    assert!(v.iter().any(|x| x.contains("is not above")), "{v:?}");

    // G9: a lease seen over long before its end, with nobody revoking it.
    let mut h = History::default();
    let mut g = grant_rec(0, "a", 10, 1000, &[(0, ms(1))]);
    g.ends.push((ms(100), ms(101), 0, 0));
    h.grants.push(g.clone());
    let v = violations_of(&mut h, &[]);
    assert!(v.iter().any(|x| x.contains("ended early")), "{v:?}");
    // ...but not when the operator revoked it meanwhile.
    h.grants = vec![g];
    h.operator.push(OperatorOp {
        key: 0,
        send: ms(50),
        done: ms(51),
    });
    assert!(violations_of(&mut h, &[]).is_empty());

    // Logs: back in token order, a refused write present, an accepted write missing.
    let mut h = History::default();
    for (tag, token, outcome) in [
        ("20:1:1", 20, Outcome::Accepted),
        ("10:1:2", 10, Outcome::Refused),
        ("20:1:3", 20, Outcome::Accepted),
    ] {
        h.writes.push(WriteRec {
            key: 0,
            token,
            tag: tag.into(),
            send: 0,
            ack: 1,
            outcome,
            lost_in_failover: false,
        });
    }
    let v = violations_of(&mut h, &[(0, &["20:1:1", "10:1:2"])]);
    assert!(
        v.iter().any(|x| x.contains("goes back in token order")),
        "{v:?}"
    );
    assert!(
        v.iter()
            .any(|x| x.contains("refused FENCED write is in the log")),
        "{v:?}"
    );
    assert!(v.iter().any(|x| x.contains("20:1:3 missing")), "{v:?}");
}
