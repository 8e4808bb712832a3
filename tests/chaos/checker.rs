//! The history checker: reads a finished run's history and server-side logs and lists every
//! violation of the guarantees (G1 to G6, G9, durability; see main.rs), for every lock kind.
//! Its self-test on synthetic histories with planted violations is in `checker/selftest.rs`.

use crate::history::*;
use crate::EPS_US;
use std::collections::HashMap;

mod failover;
mod selftest;
mod selftest_failover;
mod selftest_watch;
mod watch;

pub(crate) use failover::check_durable_survivors;

/// A sure-live span of one grant: it was live throughout (start, end).
#[derive(Clone, Copy, Debug)]
struct Span {
    start: u64,
    end: u64,
    token: i64,
    kind: Kind,
    /// The failover epoch of the proofs it comes from.
    epoch: u64,
}

/// Whether `n` grants of the kinds in `kinds` can all be live together on a key of `limit`.
fn may_coexist(kinds: &[Kind], limit: usize) -> bool {
    kinds.len() <= 1 || (kinds.len() <= limit && !kinds.contains(&Kind::Exclusive))
}

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

    // G3: real-time order, over every grant of every kind. A grant acknowledged before another
    // was asked for has the smaller token.
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
    failover::check_tokens_across_failovers(h, &mut v);

    // The grants of each token, and every moment each grant was seen live: its own proofs
    // and every FLOCK.HOLDERS that listed it (anyone's: a listing is the server's word).
    let index: HashMap<(usize, i64), usize> = h
        .grants
        .iter()
        .enumerate()
        .map(|(i, g)| ((g.key, g.token), i))
        .collect();
    // (send, ack, epoch); proofs whose epoch is unknown (a failover while they ran) left out.
    let mut proofs: Vec<Vec<(u64, u64, u64)>> = h
        .grants
        .iter()
        .map(|g| {
            g.proofs
                .iter()
                .zip(&g.proof_epochs)
                .filter(|(_, &e)| e != u64::MAX)
                .map(|(p, &e)| (p.0, p.1, e))
                .collect()
        })
        .collect();
    for s in h.holders.iter().filter(|s| s.epoch != u64::MAX) {
        for (_, t, _) in &s.grants {
            if let Some(&i) = index.get(&(s.key, *t)) {
                proofs[i].push((s.send, s.ack, s.epoch));
            }
        }
    }

    // G1 per key, for every kind: an exclusive grant is its key's only live grant; a key never
    // has more live grants than its limit.
    // Each key's sure-live spans, in key order.
    let mut spans_of: Vec<Vec<Span>> = Vec::with_capacity(sh.keys);
    for k in 0..sh.keys {
        let limit = sh.kinds[k].limit();
        let grants: Vec<usize> = (0..h.grants.len())
            .filter(|&i| h.grants[i].key == k)
            .collect();
        let mut spans: Vec<Span> = Vec::new();
        for &i in &grants {
            let mut epochs: Vec<u64> = proofs[i].iter().map(|p| p.2).collect();
            epochs.sort_unstable();
            epochs.dedup();
            for e in epochs {
                let of = || proofs[i].iter().filter(move |p| p.2 == e);
                let first_ack = of().map(|p| p.1).min().unwrap_or(u64::MAX);
                let last_send = of().map(|p| p.0).max().unwrap_or(0);
                if first_ack < last_send {
                    spans.push(Span {
                        start: first_ack,
                        end: last_send,
                        token: h.grants[i].token,
                        kind: h.grants[i].kind,
                        epoch: e,
                    });
                }
            }
        }
        spans.sort_by_key(|s| s.start);

        // Sure-live spans that overlap: all of them were live at the latest start among them.
        let mut active: Vec<Span> = Vec::new();
        let mut n = 0u64;
        for s in &spans {
            active.retain(|a| a.end > s.start);
            active.push(*s);
            let active: Vec<Span> = active
                .iter()
                .filter(|a| a.epoch == s.epoch)
                .copied()
                .collect();
            n += 1;
            let kinds: Vec<Kind> = active.iter().map(|a| a.kind).collect();
            if !may_coexist(&kinds, limit) {
                let list: Vec<String> = active
                    .iter()
                    .map(|a| format!("{} {}", a.kind.name(), a.token))
                    .collect();
                v.push(format!(
                    "{} live grants of {} ({}) at {:.3}s: {} (G1)",
                    active.len(),
                    sh.lock_key(k),
                    sh.kinds[k].name(),
                    s.start as f64 / 1e6,
                    list.join(", ")
                ));
            }
        }
        *h.checks.entry("G1 sure-live spans swept").or_default() += n;

        // A proof of one grant (it was live at an instant within it) inside other grants'
        // sure-live spans: all of them were live at that instant.
        let mut all: Vec<(u64, u64, u64, usize)> = grants
            .iter()
            .flat_map(|&i| proofs[i].iter().map(move |p| (p.0, p.1, p.2, i)))
            .collect();
        all.sort_unstable();
        let (mut next, mut active) = (0usize, Vec::<Span>::new());
        let mut n = 0u64;
        for &(send, ack, epoch, i) in &all {
            while next < spans.len() && spans[next].start <= send {
                active.push(spans[next]);
                next += 1;
            }
            active.retain(|a| a.end > send);
            let g = &h.grants[i];
            let around: Vec<&Span> = active
                .iter()
                .filter(|a| a.end >= ack && a.token != g.token && a.epoch == epoch)
                .collect();
            if around.is_empty() {
                continue;
            }
            n += 1;
            let mut kinds: Vec<Kind> = around.iter().map(|a| a.kind).collect();
            kinds.push(g.kind);
            if !may_coexist(&kinds, limit) {
                let list: Vec<String> = around
                    .iter()
                    .map(|a| format!("{} {}", a.kind.name(), a.token))
                    .collect();
                v.push(format!(
                    "two live grants of {} ({}): {} token {} proved live within ({:.3}s, \
                     {:.3}s) while {} were live throughout it (G1)",
                    sh.lock_key(k),
                    sh.kinds[k].name(),
                    g.kind.name(),
                    g.token,
                    send as f64 / 1e6,
                    ack as f64 / 1e6,
                    list.join(", ")
                ));
            }
        }
        *h.checks
            .entry("G1 proofs checked against other grants")
            .or_default() += n;
        spans_of.push(spans);
    }

    // FLOCK.HOLDERS: one instant's live grants, checked as they are listed, against what the
    // clients know of them, and against the grants that were surely live at that instant.
    for s in &h.holders {
        let (k, limit) = (s.key, sh.kinds[s.key].limit());
        let what = format!(
            "FLOCK.HOLDERS {} at {:.3}s..{:.3}s",
            sh.lock_key(k),
            s.send as f64 / 1e6,
            s.ack as f64 / 1e6
        );
        let kinds: Vec<Kind> = s
            .grants
            .iter()
            .map(|(_, t, _)| {
                index
                    .get(&(k, *t))
                    .map(|&i| h.grants[i].kind)
                    // An unknown grant (its reply was lost) of a mutex is exclusive; of another
                    // key, it is counted but its kind is unknown.
                    .unwrap_or(match sh.kinds[k] {
                        KeyKind::Exclusive => Kind::Exclusive,
                        _ => Kind::Permit,
                    })
            })
            .collect();
        if !may_coexist(&kinds, limit) {
            v.push(format!("{what} lists {:?} (G1)", s.grants));
        }
        if s.grants.windows(2).any(|w| w[0].1 >= w[1].1) {
            v.push(format!("{what} is not in token order: {:?}", s.grants));
        }
        let mut owners: Vec<&str> = s.grants.iter().map(|e| e.0.as_str()).collect();
        owners.sort_unstable();
        if owners.windows(2).any(|w| w[0] == w[1]) {
            v.push(format!(
                "{what} lists an owner twice (owners are unique per key): {:?}",
                s.grants
            ));
        }
        for (o, t, ttl) in &s.grants {
            let Some(&i) = index.get(&(k, *t)) else {
                continue;
            };
            let g = &h.grants[i];
            if *o != g.owner || *ttl < 1 || *ttl as u64 > g.ttl_us / 1000 {
                v.push(format!(
                    "{what} lists [{o}, {t}, {ttl}] for the grant of {} with a {} ms ttl",
                    g.owner,
                    g.ttl_us / 1000
                ));
            }
            if s.send > g.upper + g.ttl_us + EPS_US {
                v.push(format!(
                    "{what} lists token {t} {} ms after its lease ran out (G9)",
                    (s.send - g.upper - g.ttl_us) / 1000
                ));
            }
        }
        for sp in &spans_of[k] {
            if sp.epoch == s.epoch
                && sp.start <= s.send
                && sp.end >= s.ack
                && !s.grants.iter().any(|e| e.1 == sp.token)
            {
                v.push(format!(
                    "{what} leaves out token {}, live throughout it: {:?}",
                    sp.token, s.grants
                ));
            }
        }
    }
    *h.checks.entry("HOLDERS listings checked").or_default() += h.holders.len() as u64;

    // G9: no lease ended early (unless revoked, deleted or lost in a failover).
    let mut early_checked = 0u64;
    for g in &h.grants {
        for &(send, ack, epoch, lower) in &g.ends {
            let deadline = lower + g.ttl_us;
            if ack + EPS_US >= deadline
                || epoch != g.failover_epoch
                || g.lost_in_failover
                || g.released.is_some_and(|r| r <= send)
                || h.bound_closed_before(g, ack)
            {
                continue;
            }
            let touched = h
                .operator
                .iter()
                .any(|o| o.may_end(g) && o.send < ack && o.done > g.send);
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

    // Lock-delay per slot: a grant that expired keeps its slot taken for the lock-delay,
    // counted from its deadline (at least its last extension's send + ttl). Meanwhile a mutex
    // is granted in no mode, and no key grants an exclusive request (a delayed slot holds off
    // exclusive grants on a read/write key too), and a semaphore has one permit fewer.
    // Only grants that surely expired: not released (or unsure), revoked, deleted or lost, and
    // within one stretch of a known lock-delay on one master (no kill, failover or change).
    let mut eras: Vec<(u64, u64, u64)> = Vec::new();
    for (i, &(at, ms)) in h.lock_delay.iter().enumerate() {
        let end = h.lock_delay.get(i + 1).map_or(u64::MAX, |e| e.0);
        if let Some(ms) = ms.filter(|&ms| ms > 0) {
            eras.push((at, end, ms * 1000));
        }
    }
    let mut delayed = 0u64;
    // A semaphore's surely delayed slots: (key, token, from, to), after the latest moment the
    // lease can have run out and before the earliest the delay can have ended.
    let mut slots: Vec<(usize, i64, u64, u64)> = Vec::new();
    for g in &h.grants {
        if g.released.is_some() || g.unsure || g.lost_in_failover {
            continue;
        }
        let deadline = g.lower + g.ttl_us;
        let Some(&(_, end, d)) = eras.iter().find(|e| e.0 < g.send && deadline + e.2 < e.1) else {
            continue;
        };
        let until = deadline + d;
        // A bound grant whose connection closed meanwhile ended then (its delay counted from
        // the close, SPEC flock.lock-delay-ms).
        if h.bound_closed_before(g, until) {
            continue;
        }
        if h.operator
            .iter()
            .any(|o| o.may_end(g) && o.done > g.send && o.send < until)
        {
            continue;
        }
        delayed += 1;
        if matches!(sh.kinds[g.key], KeyKind::Semaphore(_)) {
            let from = g.upper + g.ttl_us + EPS_US;
            if from + EPS_US < until {
                slots.push((g.key, g.token, from, until - EPS_US));
            }
        }
        for o in &h.grants {
            let blocked = sh.kinds[g.key] == KeyKind::Exclusive || o.kind == Kind::Exclusive;
            // A later grant (a larger token) acknowledged before the slot was free again.
            if o.key != g.key
                || o.token <= g.token
                || !blocked
                || o.ack + EPS_US >= until
                || o.ack >= end
            {
                continue;
            }
            v.push(format!(
                "{} token {} of {} granted at {:.3}s..{:.3}s, within the {} ms lock-delay of \
                 token {} (its lease ran out at {:.3}s at the earliest, not released or \
                 revoked)",
                o.kind.name(),
                o.token,
                sh.lock_key(g.key),
                o.send as f64 / 1e6,
                o.ack as f64 / 1e6,
                d / 1000,
                g.token,
                deadline as f64 / 1e6
            ));
        }
    }
    *h.checks
        .entry("lock-delay: expired grants whose delay was checked")
        .or_default() += delayed;
    // A permit granted while earlier permits' slots were surely delayed: those slots, the
    // permits surely live then and the new one are within the limit.
    let mut n = 0u64;
    for o in h.grants.iter().filter(|o| o.kind == Kind::Permit) {
        let (k, limit) = (o.key, sh.kinds[o.key].limit());
        let taken: Vec<i64> = slots
            .iter()
            .filter(|s| s.0 == k && s.1 < o.token && s.2 <= o.send && s.3 >= o.ack)
            .map(|s| s.1)
            .collect();
        if taken.is_empty() {
            continue;
        }
        n += 1;
        let live: Vec<i64> = spans_of[k]
            .iter()
            .filter(|sp| sp.token != o.token && sp.start <= o.send && sp.end >= o.ack)
            .map(|sp| sp.token)
            .collect();
        if taken.len() + live.len() + 1 > limit {
            v.push(format!(
                "permit {} of {} granted at {:.3}s..{:.3}s while the slots of {taken:?} were in \
                 lock-delay and {live:?} were live: more than its {limit} permits",
                o.token,
                sh.lock_key(k),
                o.send as f64 / 1e6,
                o.ack as f64 / 1e6
            ));
        }
    }
    *h.checks
        .entry("lock-delay: permits granted beside delayed slots")
        .or_default() += n;

    // G11: a bound grant never outlives its connection. After a CLIENT KILL of the connection
    // it is bound to, nothing under its token is accepted: no FENCED write or read, RENEW,
    // CHECK > 0, repeated ACQUIRE, HOLDERS listing, whose request was sent after the kill's
    // reply (one sent before may have run before the kill). Its sure-live span ends before the
    // kill, so a grant of the key right after it is no overlap (G1 above).
    let mut ended_by_kill = 0u64;
    let mut g11 = 0u64;
    for kill in &h.kills {
        for g in &h.grants {
            if g.bound != Some((kill.client, kill.gen)) || g.send > kill.ack {
                continue;
            }
            let live_at_kill = g.released.is_none_or(|r| r > kill.send)
                && g.upper + g.ttl_us > kill.send
                && !g.ends.iter().any(|e| e.1 < kill.send);
            if live_at_kill {
                ended_by_kill += 1;
            }
            let mut late: Vec<(u64, u64, &str)> = g
                .proofs
                .iter()
                .filter(|p| p.0 > kill.ack)
                .map(|p| {
                    (
                        p.0,
                        p.1,
                        "a proof of life (CHECK > 0, FENCED, RENEW, ACQUIRE)",
                    )
                })
                .collect();
            late.extend(
                h.writes
                    .iter()
                    .filter(|w| {
                        w.key == g.key
                            && w.token == g.token
                            && w.outcome == Outcome::Accepted
                            && w.send > kill.ack
                    })
                    .map(|w| (w.send, w.ack, "an accepted FENCED write")),
            );
            late.extend(
                h.holders
                    .iter()
                    .filter(|s| {
                        s.key == g.key
                            && s.send > kill.ack
                            && s.grants.iter().any(|e| e.1 == g.token)
                    })
                    .map(|s| (s.send, s.ack, "a FLOCK.HOLDERS listing")),
            );
            g11 += 1;
            if let Some((send, ack, what)) = late.into_iter().min() {
                v.push(format!(
                    "bound grant {} of {} (owner {}, connection id {} of client {}) killed by \
                     CLIENT KILL at {:.3}s..{:.3}s, yet {what} under it at {:.3}s..{:.3}s \
                     (G11)",
                    g.token,
                    sh.lock_key(g.key),
                    g.owner,
                    kill.conn_id,
                    kill.client,
                    kill.send as f64 / 1e6,
                    kill.ack as f64 / 1e6,
                    send as f64 / 1e6,
                    ack as f64 / 1e6
                ));
            }
        }
    }
    *h.checks
        .entry("G11 bound grants checked after their connection's kill")
        .or_default() += g11;
    *h.checks
        .entry("G11 bound grants ended by CLIENT KILL")
        .or_default() += ended_by_kill;

    // G5: a write under a shared (read) token is never accepted.
    for w in &h.writes {
        if w.kind == Kind::Shared && w.outcome == Outcome::Accepted {
            v.push(format!(
                "FENCED write {} under a shared token was accepted (G5)",
                w.tag
            ));
        }
    }
    *h.checks
        .entry("G5 writes under shared tokens refused")
        .or_default() += h.writes.iter().filter(|w| w.kind == Kind::Shared).count() as u64;

    // Writes and logs: the resource's own view.
    let tags: HashMap<&str, &WriteRec> = h.writes.iter().map(|w| (w.tag.as_str(), w)).collect();
    let kind_of = |k: usize, t: i64| index.get(&(k, t)).map(|&i| h.grants[i].kind);
    for k in 0..sh.keys {
        let log = &logs[&k];
        let tokens: Vec<i64> = log
            .iter()
            .map(|e| {
                e.split(':')
                    .next()
                    .and_then(|t| t.parse().ok())
                    .unwrap_or(0)
            })
            .collect();
        // Only exclusive grants write to a mutex's or a read/write key's log, one after the
        // other: token order. A semaphore's permits write side by side.
        let one_writer = !matches!(sh.kinds[k], KeyKind::Semaphore(_));
        let mut last = 0i64;
        for (i, entry) in log.iter().enumerate() {
            let token = tokens[i];
            if one_writer && token < last {
                v.push(format!(
                    "log of {} goes back in token order at entry {i}: {token} after {last} (G1/G5)",
                    sh.lock_key(k)
                ));
            }
            last = last.max(token);
            if kind_of(k, token) == Some(Kind::Shared) {
                v.push(format!(
                    "the log of {} holds {entry}, written under a shared token (G5)",
                    sh.lock_key(k)
                ));
            }
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

        // A token was live from its first entry to its last (a grant is one continuous
        // holding): at every entry, the tokens whose entries surround it were live with the
        // entry's own. No more than the writers' limit, and an exclusive one alone.
        let writers = if sh.kinds[k] == KeyKind::ReadWrite {
            1
        } else {
            sh.kinds[k].limit()
        };
        let mut first_last: HashMap<i64, (usize, usize)> = HashMap::new();
        for (i, &t) in tokens.iter().enumerate() {
            first_last.entry(t).or_insert((i, i)).1 = i;
        }
        let mut diff = vec![0i64; log.len() + 1];
        for &(f, l) in first_last.values() {
            if l > f + 1 {
                diff[f + 1] += 1;
                diff[l] -= 1;
            }
        }
        let (mut cover, mut reported) = (0i64, 0);
        for (i, &t) in tokens.iter().enumerate() {
            cover += diff[i];
            let (f, l) = first_last[&t];
            let own = (f < i && i < l) as i64;
            let live = (cover - own + 1) as usize;
            if live > writers && reported < 5 {
                reported += 1;
                let around: Vec<i64> = first_last
                    .iter()
                    .filter(|(&u, &(f, l))| u != t && f < i && i < l)
                    .map(|(&u, _)| u)
                    .collect();
                v.push(format!(
                    "log of {} ({}): entry {i} by token {t} lies between the entries of \
                     tokens {around:?}: {live} writers live at once, at most {writers} may be \
                     (G1)",
                    sh.lock_key(k),
                    sh.kinds[k].name()
                ));
            }
        }
        *h.checks
            .entry("log entries checked against writers' spans")
            .or_default() += log.len() as u64;

        // A reader's FENCED LINDEX -1 ran right after the entry it read and before the next
        // entry written on the same master (same failover epoch: a failover keeps a prefix of
        // the old master's log, so a surviving next entry of that epoch followed the read
        // there). When both entries are one writer's, that writer was live throughout, beside
        // the reader (G1).
        let position: HashMap<&str, usize> = log
            .iter()
            .enumerate()
            .map(|(i, e)| (e.as_str(), i))
            .collect();
        let mut n = 0u64;
        for r in h.reads.iter().filter(|r| r.key == k && r.epoch != u64::MAX) {
            let Some(i) = r.last.as_deref().and_then(|e| position.get(e).copied()) else {
                continue;
            };
            let Some(next) = log.get(i + 1) else { continue };
            if tags.get(next.as_str()).map(|w| w.epoch) != Some(r.epoch) {
                continue;
            }
            n += 1;
            let (a, b) = (tokens[i], tokens[i + 1]);
            if a == b && kind_of(k, a) != Some(Kind::Shared) {
                v.push(format!(
                    "reader token {} of {} read the log between two entries of writer token \
                     {a} ({} and {next}): reader and writer live together (G1)",
                    r.token,
                    sh.lock_key(k),
                    log[i]
                ));
            }
        }
        *h.checks
            .entry("reads placed between log entries")
            .or_default() += n;

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
        if !one_writer {
            continue;
        }
        // Real-time order of accepted writes (one writer at a time).
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

    // G6 FIFO, one queue per key for all kinds: a request that surely waited in the queue
    // before another was sent is granted first; no later request is granted while it waits.
    let (mut fifo, mut pairs) = ([0u64; 3], 0u64);
    for w in &h.waiters {
        let Some(queued) = w.queued_by else { continue };
        let mut checked = false;
        for g in h
            .grants
            .iter()
            .filter(|g| g.key == w.key && g.queue_send > queued)
        {
            // Pairs where a jump was possible: the other request came before the waiter's
            // answer (or its timeout).
            pairs += match (w.granted, w.waited_until) {
                (Some(_), _) => (g.send < w.ack) as u64,
                (None, Some(until)) => (g.send < until) as u64,
                (None, None) => 0,
            };
            let jumped = match (w.granted, w.waited_until) {
                (Some(t), _) => g.token != t && g.token < t && g.failover_epoch == w.epoch,
                (None, Some(until)) => g.ack < until,
                (None, None) => false,
            };
            checked |= w.granted.is_some() || w.waited_until.is_some();
            if jumped {
                v.push(format!(
                    "{} request sent at {:.3}s after a {} waiter of {} (sent at {:.3}s{}) was \
                     queued ({:.3}s) was granted token {} while that waiter waited ({}) (G6 \
                     FIFO)",
                    g.kind.name(),
                    g.send as f64 / 1e6,
                    w.kind.name(),
                    sh.lock_key(w.key),
                    w.send as f64 / 1e6,
                    if w.retried {
                        ", a retry in its earlier request's place"
                    } else {
                        ""
                    },
                    queued as f64 / 1e6,
                    g.token,
                    match w.granted {
                        Some(t) => format!("it was granted token {t} later"),
                        None => "it timed out later".into(),
                    }
                ));
            }
        }
        if checked {
            fifo[w.kind as usize] += 1;
        }
    }
    *h.checks
        .entry("G6 FIFO: later grants checked against queued waiters")
        .or_default() += pairs;
    for (kind, n) in [Kind::Exclusive, Kind::Shared, Kind::Permit]
        .iter()
        .zip(fifo)
    {
        let name = match kind {
            Kind::Exclusive => "G6 FIFO: queued exclusive waiters checked",
            Kind::Shared => "G6 FIFO: queued shared waiters checked",
            Kind::Permit => "G6 FIFO: queued permit waiters checked",
        };
        *h.checks.entry(name).or_default() += n;
    }
    for x in v {
        h.violation(x);
    }
    // WATCH and MACQUIRE (issue 24): checker/watch.rs.
    watch::check_coordination(sh, h);
}
