//! The coordination checks (checker/watch.rs) catch what they should: synthetic histories with
//! a watcher told of an end that did not happen, of the wrong end, of one end twice, a missed
//! release, `gone` for a live grant, and a MACQUIRE that never answered or was never granted.

use super::selftest::{kind_rec, violations_of};
use super::*;
use crate::history::coord::*;

const MS: u64 = 1000;

/// Grant 10 of key 0 by `a`, ttl 1 s, proved live at 0..1 ms and 100..101 ms, released by its
/// holder at 200..201 ms.
fn released_grant() -> History {
    let mut h = History::default();
    let mut g = kind_rec(
        0,
        "a",
        10,
        Kind::Exclusive,
        1000,
        &[(0, MS), (100 * MS, 101 * MS)],
    );
    g.proofs.push((200 * MS, 201 * MS));
    g.proof_epochs.push(0);
    g.touched = 200 * MS;
    g.released = Some(201 * MS);
    h.grants.push(g);
    h
}

fn watch(token: i64, timeout_ms: u64, send_ms: u64, ack_ms: u64, told: Told) -> WatchRec {
    WatchRec {
        watcher: 0,
        key: 0,
        token,
        timeout_ms,
        send: send_ms * MS,
        ack: ack_ms * MS,
        epoch: 0,
        told,
    }
}

fn fired(event: &str, owner: Option<&str>, token: i64) -> Told {
    Told::Fired {
        event: event.into(),
        owner: owner.map(str::to_string),
        token,
    }
}

fn found(h: &mut History, what: &str) -> bool {
    violations_of(h, &[]).iter().any(|v| v.contains(what))
}

#[test]
fn a_watch_told_of_the_release_that_came_passes() {
    let mut h = released_grant();
    h.watches
        .push(watch(10, 3000, 150, 202, fired("released", Some("a"), 10)));
    h.watches
        .push(watch(10, 3000, 300, 301, fired("gone", None, 10)));
    h.watches
        .push(watch(0, 3000, 50, 51, fired("held", Some("a"), 10)));
    let v = violations_of(&mut h, &[]);
    assert!(v.is_empty(), "{v:?}");
    assert_eq!(h.checks.get("WATCH ends matched to their cause"), Some(&1));
}

#[test]
fn a_release_told_that_nobody_made_is_flagged() {
    let mut h = released_grant();
    h.grants[0].released = None;
    h.watches
        .push(watch(10, 3000, 150, 202, fired("released", Some("a"), 10)));
    assert!(found(&mut h, "nothing in the history ended it that way"));
}

#[test]
fn the_wrong_end_is_flagged() {
    // Released by its holder, but told `expired` long before its 1 s lease could run out,
    // `revoked` with no operator about, `closed` though it was not bound.
    for event in ["expired", "revoked", "closed", "lost"] {
        let mut h = released_grant();
        h.watches
            .push(watch(10, 3000, 150, 202, fired(event, Some("a"), 10)));
        assert!(
            found(&mut h, "nothing in the history ended it that way"),
            "{event} passed"
        );
    }
}

#[test]
fn an_end_before_a_later_proof_is_flagged() {
    let mut h = released_grant();
    h.grants[0].unsure = true; // a release may have come: the cause alone would pass
    h.watches
        .push(watch(10, 3000, 50, 60, fired("released", Some("a"), 10)));
    assert!(found(&mut h, "an end that did not happen"));
}

#[test]
fn an_end_told_twice_is_flagged() {
    let mut h = released_grant();
    h.watches
        .push(watch(10, 3000, 150, 202, fired("released", Some("a"), 10)));
    h.watches
        .push(watch(10, 3000, 300, 301, fired("released", Some("a"), 10)));
    assert!(found(&mut h, "was told twice"));
}

#[test]
fn a_missed_release_is_flagged() {
    // Watched from 150 ms with a 100 ms timeout, nil at 251 ms: it waited on the server from
    // at most 151 ms to at least 250 ms, and the release came at 200..201 ms.
    let mut h = released_grant();
    h.watches.push(watch(10, 100, 150, 251, Told::TimedOut));
    assert!(found(&mut h, "an end not reported"));
    // A nil that may have come before the release is no violation.
    let mut h = released_grant();
    h.watches.push(watch(10, 100, 20, 121, Told::TimedOut));
    let v = violations_of(&mut h, &[]);
    assert!(v.is_empty(), "{v:?}");
}

#[test]
fn gone_for_a_grant_surely_live_is_flagged() {
    let mut h = released_grant();
    h.watches
        .push(watch(10, 3000, 10, 20, fired("gone", None, 10)));
    assert!(found(&mut h, "proved itself live before and after"));
}

#[test]
fn held_of_a_released_grant_or_another_key_is_flagged() {
    let mut h = released_grant();
    h.watches
        .push(watch(0, 3000, 300, 301, fired("held", Some("a"), 10)));
    assert!(found(&mut h, "not live during the call"));
    let mut h = released_grant();
    let mut w = watch(0, 3000, 50, 51, fired("held", Some("a"), 10));
    w.key = 1;
    h.watches.push(w);
    assert!(found(&mut h, "a grant of"));
}

#[test]
fn a_hung_watch_or_an_unexpected_error_is_flagged() {
    let mut h = released_grant();
    h.watches.push(watch(10, 200, 150, 30_000, Told::Hung));
    assert!(found(&mut h, "hung"));
    let mut h = released_grant();
    h.watches.push(watch(
        10,
        200,
        150,
        160,
        Told::Error("ERR something else".into()),
    ));
    assert!(found(&mut h, "unexpected error"));
    let mut h = released_grant();
    h.watches.push(watch(
        10,
        200,
        150,
        160,
        Told::Error("UNBLOCKED this server is now a replica".into()),
    ));
    let v = violations_of(&mut h, &[]);
    assert!(v.is_empty(), "{v:?}");
}

fn multi(block: Option<u64>, send_ms: u64, ack_ms: u64, end: MultiEnd) -> MultiRec {
    MultiRec {
        client: 0,
        keys: vec![2, 0],
        block,
        send: send_ms * MS,
        ack: ack_ms * MS,
        end,
    }
}

#[test]
fn a_macquire_that_never_answers_is_flagged() {
    let mut h = History::default();
    h.multis.push(multi(Some(300), 0, 10_300, MultiEnd::Hung));
    assert!(found(&mut h, "a deadlock"));
}

#[test]
fn a_macquire_nil_before_its_timeout_or_with_wrong_tokens_is_flagged() {
    let mut h = History::default();
    h.multis.push(multi(Some(300), 0, 100, MultiEnd::Nil));
    assert!(found(&mut h, "before its 300 ms"));
    let mut h = History::default();
    h.multis
        .push(multi(Some(300), 0, 100, MultiEnd::Granted(vec![5])));
    assert!(found(&mut h, "not one distinct per key"));
    let mut h = History::default();
    h.multis
        .push(multi(None, 0, 1, MultiEnd::Granted(vec![5, 5])));
    assert!(found(&mut h, "not one distinct per key"));
}

#[test]
fn macquires_never_granted_are_no_progress() {
    let mut h = History::default();
    for i in 0..20 {
        h.multis
            .push(multi(Some(50), i * 100, i * 100 + 51, MultiEnd::Nil));
    }
    assert!(found(&mut h, "no progress"));
    h.multis
        .push(multi(Some(50), 5000, 5001, MultiEnd::Granted(vec![7, 8])));
    let v = violations_of(&mut h, &[]);
    assert!(v.is_empty(), "{v:?}");
}

#[test]
fn a_macquire_grant_overlapping_another_on_one_of_its_keys_is_g1() {
    // Keys 3 to 5 are the MACQUIRE clients' mutexes of one slot.
    let sh = Shared::new(0, 3, 0).with_multi_keys(3);
    assert_eq!(sh.lock_key(3), "{chaosm}:lock3");
    assert_eq!(sh.kinds[3..], [KeyKind::Exclusive; 3]);
    let logs: HashMap<usize, Vec<String>> = (0..6).map(|k| (k, Vec::new())).collect();
    let run = |grants: Vec<GrantRec>| {
        let mut h = History {
            quiet: true,
            grants,
            ..Default::default()
        };
        h.multis.push(MultiRec {
            client: 0,
            keys: vec![4, 3],
            block: Some(1000),
            send: 0,
            ack: MS,
            end: MultiEnd::Granted(vec![10, 11]),
        });
        check_history(&sh, &mut h, &logs);
        h.violations
    };
    // The MACQUIRE's grants of keys 4 and 3, live from 0 to 50 ms.
    let multi = |k: usize, t: i64| {
        kind_rec(
            k,
            "m1",
            t,
            Kind::Exclusive,
            1000,
            &[(0, MS), (50 * MS, 51 * MS)],
        )
    };
    let v = run(vec![multi(4, 10), multi(3, 11)]);
    assert!(v.is_empty(), "{v:?}");
    // A single-key client proves a grant of key 3 at 20 ms: two live grants of a mutex.
    let other = kind_rec(3, "c1", 20, Kind::Exclusive, 1000, &[(20 * MS, 21 * MS)]);
    let v = run(vec![multi(4, 10), multi(3, 11), other]);
    assert!(v.iter().any(|x| x.contains("G1")), "{v:?}");
}
