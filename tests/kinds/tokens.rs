//! Token-qualified CHECK, RENEW, RELEASE and REVOKE on shared grants and permits, FENCED
//! read-only under a shared token (G5), and RENEW never reviving an expired grant.

use super::helpers::*;
use flock_testkit::*;

#[test]
fn check_renew_release_and_revoke_treat_shared_grants_and_permits_alike() {
    let srv = Server::start();
    let mut c = srv.conn();
    for opts in [&["SHARED"][..], &["LIMIT", "5"]] {
        let t1 = grant_kind(&mut c, "k", "o1", 60_000, opts);
        let t2 = grant_kind(&mut c, "k", "o2", 60_000, opts);
        assert!(check(&mut c, "k", t1) > 50_000 && check(&mut c, "k", t2) > 50_000);
        assert_eq!(check(&mut c, "k", t2 + 1), 0);
        // Token-qualified RENEW: only the grant with that token.
        let r = call(&mut c, &["FLOCK.RENEW", "k", "o1", "5000", &t2.to_string()]);
        assert!(r.is_nil(), "{opts:?}: o1 renewing o2's token: {r:?}");
        let r = call(&mut c, &["FLOCK.RENEW", "k", "o1", "5000", &t1.to_string()]);
        assert_eq!(r, Reply::Int(t1));
        let left = check(&mut c, "k", t1);
        assert!(
            left <= 5000 && left > 3000,
            "{opts:?}: RENEW set the lease: {left}"
        );
        // Token-qualified RELEASE.
        let r = call(&mut c, &["FLOCK.RELEASE", "k", "o1", &t2.to_string()]);
        assert_eq!(r, Reply::Int(0), "{opts:?}: o1 releasing o2's token");
        let r = call(&mut c, &["FLOCK.RELEASE", "k", "o1", &t1.to_string()]);
        assert_eq!(r, Reply::Int(1));
        assert_eq!(check(&mut c, "k", t1), 0);
        assert!(
            check(&mut c, "k", t2) > 0,
            "{opts:?}: the other grant lives on"
        );
        // A late release of o1's earlier grant never ends its later one.
        let t3 = grant_kind(&mut c, "k", "o1", 60_000, opts);
        let r = call(&mut c, &["FLOCK.RELEASE", "k", "o1", &t1.to_string()]);
        assert_eq!(
            r,
            Reply::Int(0),
            "{opts:?}: a stale token released a newer grant"
        );
        let r = call(&mut c, &["FLOCK.RENEW", "k", "o1", "5000", &t1.to_string()]);
        assert!(r.is_nil(), "{opts:?}: a stale token renewed a newer grant");
        assert!(check(&mut c, "k", t3) > 50_000);
        // Untokened calls act on the owner's live grant; another owner changes nothing.
        assert_eq!(release(&mut c, "k", "nobody"), 0);
        assert_eq!(renew(&mut c, "k", "o2", 60_000), Some(t2));
        // REVOKE key owner: only that owner's grant; REVOKE key: the count of the rest.
        grant_kind(&mut c, "k", "o4", 60_000, opts);
        assert_eq!(revoke(&mut c, &["k", "o2"]), 1);
        assert_eq!(revoke(&mut c, &["k", "o2"]), 0, "nothing left of o2");
        assert_eq!(revoke(&mut c, &["k", "nobody"]), 0);
        assert_eq!(check(&mut c, "k", t2), 0);
        assert_eq!(owners(&mut c, "k"), ["o1", "o4"]);
        assert_eq!(revoke(&mut c, &["k"]), 2);
        assert_eq!(revoke(&mut c, &["k"]), 0);
        assert_eq!(exists(&mut c, "k"), 0);
    }
}

#[test]
fn fenced_under_a_shared_token_runs_only_reads() {
    let srv = Server::start();
    let mut c = srv.conn();
    call(&mut c, &["SET", "data", "v0"]);
    let ts = grant_kind(&mut c, "rw", "r", 60_000, &["SHARED"]).to_string();
    let fenced = |c: &mut redis::Connection, tok: &str, cmd: &[&str]| {
        let mut a = vec!["FLOCK.FENCED", "rw", tok];
        a.extend_from_slice(cmd);
        call(c, &a)
    };
    let ro = "ERR FLOCK.FENCED with a shared grant runs read-only commands only";
    let rejected0 = flock_stat(&mut c, "fenced_rejected");
    for cmd in [
        &["SET", "data", "v1"][..],
        &["INCR", "n"],
        &["DEL", "data"],
        &["HSET", "h", "f", "v"],
        &["EXPIRE", "data", "100"],
    ] {
        assert_eq!(
            fenced(&mut c, &ts, cmd),
            Reply::Err(ro.into()),
            "{cmd:?} under a read lock"
        );
    }
    assert_eq!(
        flock_stat(&mut c, "fenced_rejected") - rejected0,
        5,
        "each refusal counted"
    );
    assert_eq!(
        call(&mut c, &["GET", "data"]).string().as_deref(),
        Some("v0"),
        "nothing written"
    );
    assert_eq!(
        exists(&mut c, "n") + exists(&mut c, "h"),
        0,
        "nothing written"
    );
    // Reads run, in the caller's protocol.
    assert_eq!(
        fenced(&mut c, &ts, &["GET", "data"]).string().as_deref(),
        Some("v0")
    );
    assert_eq!(fenced(&mut c, &ts, &["EXISTS", "data"]), Reply::Int(1));
    let mut c3 = srv.conn_resp3();
    call(&mut c, &["HSET", "hh", "f", "v"]);
    let r = fenced(&mut c3, &ts, &["HGETALL", "hh"]);
    assert!(matches!(r, Reply::Map(_)), "RESP3 reply of the read: {r:?}");
    // Scripts are refused anyway, read-only ones too.
    let r = fenced(&mut c, &ts, &["EVAL_RO", "return 1", "0"]);
    assert!(
        r.is_err() && r != Reply::Err(ro.into()),
        "EVAL_RO refused as a script: {r:?}"
    );
    // A permit's token and an exclusive token write.
    let tp = grant_kind(&mut c, "sem", "p", 60_000, &["LIMIT", "2"]).to_string();
    let r = call(
        &mut c,
        &["FLOCK.FENCED", "sem", &tp, "SET", "data", "by-permit"],
    );
    assert_eq!(r, Reply::Status("OK".into()), "a permit writes");
    let tx = grant_kind(&mut c, "x", "w", 60_000, &[]).to_string();
    let r = call(
        &mut c,
        &["FLOCK.FENCED", "x", &tx, "SET", "data", "by-writer"],
    );
    assert_eq!(r, Reply::Status("OK".into()), "an exclusive grant writes");
    assert_eq!(
        call(&mut c, &["GET", "data"]).string().as_deref(),
        Some("by-writer")
    );
    // A released shared token reads nothing.
    rel(&mut c, "rw", "r");
    assert_err_prefix(
        &fenced(&mut c, &ts, &["GET", "data"]),
        "FENCED",
        "a stale shared token",
    );
}

#[test]
fn renew_never_revives_an_expired_shared_grant_or_permit() {
    let srv = Server::start();
    let mut c = srv.conn();
    for opts in [&["SHARED"][..], &["LIMIT", "2"]] {
        let keep = grant_kind(&mut c, "k", "keep", 60_000, opts);
        let t = grant_kind(&mut c, "k", "short", 50, opts);
        wait_until("the short grant expires", || check(&mut c, "k", t) == 0);
        assert_eq!(
            renew(&mut c, "k", "short", 60_000),
            None,
            "{opts:?}: RENEW revived"
        );
        let r = call(
            &mut c,
            &["FLOCK.RENEW", "k", "short", "60000", &t.to_string()],
        );
        assert!(r.is_nil(), "{opts:?}: token-qualified RENEW revived: {r:?}");
        assert_eq!(
            release(&mut c, "k", "short"),
            0,
            "{opts:?}: RELEASE of an expired grant"
        );
        assert_eq!(holder_tokens(&mut c, "k"), hv(&[("keep", keep)]));
        assert_eq!(revoke(&mut c, &["k"]), 1);
    }
}
