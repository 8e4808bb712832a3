//! The checker's failover checks catch what they should: a token below a grant lost in a
//! failover, a token of a master a day behind below an earlier one, and a durable grant the
//! new master does not hold; and they pass the same histories done right.

use super::failover::*;
use super::selftest::{kind_rec, synthetic_shared, violations_of};
use crate::history::*;
use std::collections::HashMap;

const MS: u64 = 1000;

/// Key 0's grant of token 100, acknowledged at 1 ms and lost in a failover; key 2's grant
/// asked for at 10 ms with `later` as its token.
fn after_a_lost_grant(later: i64) -> History {
    let mut h = History::default();
    let mut lost = kind_rec(0, "a", 100, Kind::Exclusive, 100, &[(0, MS)]);
    lost.lost_in_failover = true;
    h.grants.push(lost);
    h.grants.push(kind_rec(
        2,
        "b",
        later,
        Kind::Permit,
        100,
        &[(10 * MS, 11 * MS)],
    ));
    h
}

#[test]
fn a_token_below_a_grant_lost_in_failover_is_flagged() {
    let v = violations_of(&mut after_a_lost_grant(50), &[]);
    assert!(
        v.iter().any(|x| x.contains("grant lost in a failover")),
        "{v:?}"
    );
}

#[test]
fn a_token_above_every_lost_grant_passes() {
    let mut h = after_a_lost_grant(150);
    let v = violations_of(&mut h, &[]);
    assert!(v.iter().all(|x| !x.contains("G3")), "{v:?}");
    assert_eq!(
        h.checks
            .get("G3 grants above an earlier grant lost in failover (pairs)")
            .copied(),
        Some(1)
    );
}

/// A grant of token 100 acknowledged at 1 ms on key 0, then a master a day behind from 5 ms
/// to 20 ms whose grant on key 2, asked for at 10 ms, has token `later`.
fn on_a_master_a_day_behind(later: i64) -> History {
    let mut h = after_a_lost_grant(later);
    h.grants[0].lost_in_failover = false;
    h.skewed.push((5 * MS, 20 * MS));
    h
}

#[test]
fn a_small_token_from_a_master_a_day_behind_is_flagged() {
    let v = violations_of(&mut on_a_master_a_day_behind(90), &[]);
    assert!(
        v.iter()
            .any(|x| x.contains("made by a master a day behind")),
        "{v:?}"
    );
}

#[test]
fn a_master_a_day_behind_above_every_earlier_token_passes() {
    let mut h = on_a_master_a_day_behind(101);
    let v = violations_of(&mut h, &[]);
    assert!(v.iter().all(|x| !x.contains("G3")), "{v:?}");
    assert_eq!(
        h.checks
            .get("G3 grants by a master a day behind, above every earlier token")
            .copied(),
        Some(1)
    );
}

/// A durable grant of 4 s on key 0 acknowledged at 1 ms (its replica acknowledged it), and a
/// plain one of 4 s on key 2; the old master dies at 100 ms, the new one lists at 200 ms.
fn durable_history() -> History {
    let mut h = History {
        quiet: true,
        ..Default::default()
    };
    let mut d = kind_rec(0, "d", 10, Kind::Exclusive, 4000, &[(0, MS)]);
    d.durable = true;
    h.grants.push(d);
    h.grants.push(kind_rec(
        2,
        "p",
        11,
        Kind::Permit,
        4000,
        &[(2 * MS, 3 * MS)],
    ));
    h
}

fn listing(entries: &[(usize, &str, i64)]) -> HashMap<usize, Vec<(String, i64)>> {
    let mut m: HashMap<usize, Vec<(String, i64)>> = (0..3).map(|k| (k, Vec::new())).collect();
    for (k, o, t) in entries {
        m.entry(*k).or_default().push((o.to_string(), *t));
    }
    m
}

#[test]
fn a_durable_grant_lost_in_failover_is_flagged() {
    let sh = synthetic_shared(3);
    let mut h = durable_history();
    // The new master has the plain grant (a plain one may be lost: not this check's business)
    // but not the durable one.
    let kept = check_durable_survivors(&sh, &mut h, &listing(&[(2, "p", 11)]), 100 * MS, 200 * MS);
    assert_eq!(kept, 0);
    assert_eq!(h.violations.len(), 1, "{:?}", h.violations);
    assert!(
        h.violations[0].contains("durable grant 10"),
        "{:?}",
        h.violations
    );
    assert_eq!(
        h.checks
            .get("acknowledged durable grants lost in failover (must be 0)")
            .copied(),
        Some(1)
    );
}

#[test]
fn a_durable_grant_the_new_master_holds_passes() {
    let sh = synthetic_shared(3);
    let mut h = durable_history();
    let kept = check_durable_survivors(&sh, &mut h, &listing(&[(0, "d", 10)]), 100 * MS, 200 * MS);
    assert_eq!(kept, 1);
    assert!(h.violations.is_empty(), "{:?}", h.violations);
}

#[test]
fn a_durable_grant_that_ended_before_the_failover_need_not_survive() {
    let sh = synthetic_shared(3);
    // Released by its holder, revoked by the operator, or its acknowledged lease over: none
    // of these must be on the new master.
    let mut released = durable_history();
    released.grants[0].released = Some(50 * MS);
    let mut revoked = durable_history();
    revoked.operator.push(OperatorOp {
        key: 0,
        owner: None,
        send: 40 * MS,
        done: 41 * MS,
    });
    let mut short = durable_history();
    short.grants[0].ttl_us = 150 * MS;
    for mut h in [released, revoked, short] {
        check_durable_survivors(&sh, &mut h, &listing(&[]), 100 * MS, 200 * MS);
        assert!(h.violations.is_empty(), "{:?}", h.violations);
    }
}
