//! Keyspace events, INFO counters and FLOCK.STATS per grant, and a read-only ACL user.

use super::helpers::*;
use flock_testkit::*;

#[test]
fn keyspace_events_and_info_counters_come_once_per_grant() {
    let srv = Server::start();
    let mut c = srv.conn();
    set_config(&mut c, "notify-keyspace-events", "Kd");
    let mut sub = KeyspaceEvents::subscribe(&srv);
    let base: Vec<i64> = [
        "grants",
        "releases",
        "revokes",
        "expirations",
        "blocked_acquires",
    ]
    .iter()
    .map(|n| flock_stat(&mut c, n))
    .collect();
    grant_kind(&mut c, "rw", "w", 60_000, &[]);
    let r1 = spawn_acq(&srv, "rw", "r1", 60_000, &["SHARED", "BLOCK", "0"]);
    wait_blocked(&mut c, 1);
    let r2 = spawn_acq(&srv, "rw", "r2", 60_000, &["SHARED", "BLOCK", "0"]);
    wait_blocked(&mut c, 2);
    rel(&mut c, "rw", "w");
    tok(&join(r1, "r1"), "r1");
    tok(&join(r2, "r2"), "r2");
    grant_kind(&mut c, "rw", "r3", 60_000, &["SHARED"]);
    grant_kind(&mut c, "rw", "r3", 60_000, &["SHARED"]); // a repeat: no new grant
    assert_eq!(revoke(&mut c, &["rw"]), 3);
    let t = grant_kind(&mut c, "sem", "p1", 60_000, &["LIMIT", "2"]);
    grant_kind(&mut c, "sem", "p2", 40, &["LIMIT", "2"]);
    wait_until("p2 expires", || owners(&mut c, "sem") == ["p1"]);
    assert_eq!(
        call(&mut c, &["FLOCK.RELEASE", "sem", "p1", &t.to_string()]),
        Reply::Int(1)
    );
    // A sentinel: every event before it has arrived once it is seen.
    grant_kind(&mut c, "sentinel", "s", 60_000, &[]);
    sub.read_until(b"__keyspace@0__:sentinel");
    let counts: Vec<(&str, &str, usize)> = [
        ("rw", "flock.acquired"),
        ("rw", "flock.released"),
        ("rw", "flock.revoked"),
        ("sem", "flock.acquired"),
        ("sem", "flock.expired"),
        ("sem", "flock.released"),
    ]
    .iter()
    .map(|(k, e)| (*k, *e, sub.count(k, e)))
    .collect();
    assert_eq!(
        counts,
        [
            ("rw", "flock.acquired", 4),
            ("rw", "flock.released", 1),
            ("rw", "flock.revoked", 3),
            ("sem", "flock.acquired", 2),
            ("sem", "flock.expired", 1),
            ("sem", "flock.released", 1),
        ]
    );
    let now: Vec<i64> = [
        "grants",
        "releases",
        "revokes",
        "expirations",
        "blocked_acquires",
    ]
    .iter()
    .map(|n| flock_stat(&mut c, n))
    .collect();
    let delta: Vec<i64> = now.iter().zip(&base).map(|(a, b)| a - b).collect();
    // grants: w, r1, r2, r3, p1, p2, sentinel; releases: w, p1; revokes: 3; expirations: p2.
    assert_eq!(
        delta,
        [7, 2, 3, 1, 2],
        "INFO flock grants/releases/revokes/expirations/blocked"
    );
}

#[test]
fn a_read_only_user_lists_holders_and_changes_nothing() {
    let srv = Server::start();
    let mut admin = srv.conn();
    for (user, keys) in [("reader", "%R~orders:*"), ("writer", "%W~orders:*")] {
        let r = call(
            &mut admin,
            &[
                "ACL",
                "SETUSER",
                user,
                "on",
                ">pw",
                keys,
                "+flock.holders",
                "+flock.info",
                "+flock.acquire",
                "+flock.release",
            ],
        );
        assert_ok(&r, "ACL SETUSER");
    }
    let t = grant_kind(&mut admin, "orders:lock", "a", 60_000, &["SHARED"]);
    let mut reader = srv.conn_as("reader", "pw");
    assert_eq!(holder_tokens(&mut reader, "orders:lock"), hv(&[("a", t)]));
    assert_eq!(kinfo(&mut reader, "orders:lock").mode, "shared");
    let r = acq(&mut reader, "orders:lock", "b", 1000, &["SHARED"]);
    assert_err_prefix(&r, "NOPERM", "ACQUIRE by a read-only user");
    assert_err_prefix(
        &call(&mut reader, &["FLOCK.HOLDERS", "other"]),
        "NOPERM",
        "HOLDERS outside the pattern",
    );
    let mut writer = srv.conn_as("writer", "pw");
    assert_err_prefix(
        &call(&mut writer, &["FLOCK.HOLDERS", "orders:lock"]),
        "NOPERM",
        "HOLDERS by a write-only user",
    );
    let dry = call(
        &mut admin,
        &["ACL", "DRYRUN", "reader", "FLOCK.HOLDERS", "orders:lock"],
    );
    assert_eq!(dry, Reply::Status("OK".into()), "ACL DRYRUN agrees");
    assert_eq!(owners(&mut admin, "orders:lock"), ["a"], "nothing changed");
}

#[test]
fn flock_stats_counts_every_grant_of_every_kind() {
    let srv = Server::start();
    let mut c = srv.conn();
    let map = |r: &Reply| -> Vec<(String, Reply)> {
        r.pairs()
            .unwrap_or_else(|| panic!("not a map: {r:?}"))
            .into_iter()
            .map(|(k, v)| (k.string().unwrap_or_default(), v))
            .collect()
    };
    let get = |m: &[(String, Reply)], k: &str| -> Reply {
        m.iter()
            .find(|(n, _)| n == k)
            .map(|(_, v)| v.clone())
            .unwrap_or_else(|| panic!("no {k} in {m:?}"))
    };
    // Three readers released, two permits revoked, one writer expired: one class.
    for i in 0..3 {
        grant_kind(&mut c, "job:1", &format!("r{i}"), 60_000, &["SHARED"]);
    }
    for i in 0..3 {
        rel(&mut c, "job:1", &format!("r{i}"));
    }
    grant_kind(&mut c, "job:2", "p1", 60_000, &["LIMIT", "2"]);
    grant_kind(&mut c, "job:2", "p2", 60_000, &["LIMIT", "2"]);
    assert_eq!(revoke(&mut c, &["job:2"]), 2);
    grant_kind(&mut c, "job:3", "w", 30, &[]);
    wait_until("the writer's lease ends", || exists(&mut c, "job:3") == 0);
    let top = map(&call(&mut c, &["FLOCK.STATS", "GET", "job:#"]));
    let class = map(&get(&map(&get(&top, "classes")), "job:#"));
    let n = |k: &str| {
        get(&class, k)
            .int()
            .unwrap_or_else(|| panic!("{k}: {class:?}"))
    };
    assert_eq!(
        (n("grants"), n("released"), n("revoked"), n("expired")),
        (6, 3, 2, 1),
        "FLOCK.STATS of job:#: {class:?}"
    );
}
