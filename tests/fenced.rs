//! FLOCK.FENCED: writes run only under the live grant (G5), with the caller's ACL rights,
//! inner keys reported for ACL and cluster routing, the inner write replicated as itself.

use flock_testkit::*;

fn fenced(c: &mut redis::Connection, key: &str, token: i64, cmd: &[&str]) -> Reply {
    let mut args = vec![
        "FLOCK.FENCED".to_string(),
        key.to_string(),
        token.to_string(),
    ];
    args.extend(cmd.iter().map(|s| s.to_string()));
    call(c, &args)
}

fn get(c: &mut redis::Connection, key: &str) -> Reply {
    call(c, &["GET", key])
}

#[test]
fn the_live_token_writes() {
    let srv = Server::start();
    let mut c = srv.conn();
    let t = grant(&mut c, "lk", "a", 30_000);
    assert_eq!(
        fenced(&mut c, "lk", t, &["SET", "data:1", "v1"]),
        Reply::Status("OK".into())
    );
    assert_eq!(get(&mut c, "data:1"), Reply::Bulk(b"v1".to_vec()));
    assert_eq!(
        fenced(&mut c, "lk", t, &["INCRBY", "n", "5"]).int(),
        Some(5)
    );
    assert_eq!(
        fenced(&mut c, "lk", t, &["GET", "data:1"]),
        Reply::Bulk(b"v1".to_vec())
    );
    // RESP3 callers get RESP3 replies.
    let mut c3 = srv.conn_resp3();
    call(&mut c3, &["HSET", "h", "f", "v"]);
    let r = fenced(&mut c3, "lk", t, &["HGETALL", "h"]);
    assert!(
        matches!(r, Reply::Map(_)),
        "RESP3 HGETALL through FENCED: {r:?}"
    );
    assert_eq!(flock_stat(&mut c, "fenced_accepted"), 4);
}

#[test]
fn stale_tokens_are_refused_and_nothing_is_written() {
    let srv = Server::start();
    let mut c = srv.conn();
    let is_refused = |r: &Reply, what: &str| {
        assert_err_prefix(r, "FENCED token", what);
        assert_err_contains(r, "is not the live grant of lk", what);
    };
    // Never issued, and no lock at all.
    is_refused(&fenced(&mut c, "lk", 12345, &["SET", "d", "x"]), "no lock");
    let t1 = grant(&mut c, "lk", "a", 30_000);
    is_refused(
        &fenced(&mut c, "lk", t1 + 1, &["SET", "d", "x"]),
        "never issued",
    );
    is_refused(
        &fenced(&mut c, "lk", t1 - 1, &["SET", "d", "x"]),
        "older than the grant",
    );
    // Released.
    assert_eq!(release(&mut c, "lk", "a"), 1);
    is_refused(&fenced(&mut c, "lk", t1, &["SET", "d", "x"]), "released");
    // Expired.
    let t2 = grant(&mut c, "lk", "a", 50);
    wait_until("lease ends", || check(&mut c, "lk", t2) == 0);
    is_refused(&fenced(&mut c, "lk", t2, &["SET", "d", "x"]), "expired");
    // Revoked.
    let t3 = grant(&mut c, "lk", "a", 30_000);
    assert_eq!(call(&mut c, &["FLOCK.REVOKE", "lk"]).int(), Some(1));
    is_refused(&fenced(&mut c, "lk", t3, &["SET", "d", "x"]), "revoked");
    // Superseded by a newer grant to someone else.
    let t4 = grant(&mut c, "lk", "b", 30_000);
    is_refused(&fenced(&mut c, "lk", t3, &["SET", "d", "x"]), "superseded");
    assert_eq!(
        get(&mut c, "d"),
        Reply::Nil,
        "a refused FENCED wrote something"
    );
    assert_eq!(
        fenced(&mut c, "lk", t4, &["SET", "d", "b"]),
        Reply::Status("OK".into())
    );
    assert_eq!(flock_stat(&mut c, "fenced_rejected"), 7);
    // Bad tokens and wrong types are input errors, not FENCED refusals.
    assert_err_prefix(
        &fenced(&mut c, "lk", 0, &["SET", "d", "x"]),
        "ERR invalid token",
        "0",
    );
    call(&mut c, &["SET", "str", "v"]);
    assert_err_prefix(
        &fenced(&mut c, "str", 1, &["SET", "d", "x"]),
        "WRONGTYPE",
        "string",
    );
    assert_err_contains(
        &call(&mut c, &["FLOCK.FENCED", "lk", "1"]),
        "wrong number",
        "arity",
    );
    assert_eq!(get(&mut c, "d"), Reply::Bulk(b"b".to_vec()));
}

#[test]
fn inner_errors_pass_through_unchanged() {
    let srv = Server::start();
    let mut c = srv.conn();
    let t = grant(&mut c, "lk", "a", 30_000);
    call(&mut c, &["SET", "s", "v"]);
    let direct = call(&mut c, &["LPUSH", "s", "x"]);
    assert_eq!(
        fenced(&mut c, "lk", t, &["LPUSH", "s", "x"]),
        direct,
        "WRONGTYPE as is"
    );
    let r = fenced(&mut c, "lk", t, &["SET", "only-key"]);
    assert_err_contains(&r, "wrong number of arguments for 'set'", "inner arity");
    let r = fenced(&mut c, "lk", t, &["NOSUCHCOMMAND", "x"]);
    assert_err_contains(&r, "unknown command", "unknown inner command");
    let r = fenced(&mut c, "lk", t, &["INCR", "s"]);
    assert_eq!(r, call(&mut c, &["INCR", "s"]), "not an integer, as is");
    assert!(flock_stat(&mut c, "fenced_inner_errors") >= 4);
}

#[test]
fn commands_that_cannot_run_inside_are_refused_and_never_run() {
    let srv = Server::start();
    let mut c = srv.conn();
    let t = grant(&mut c, "lk", "a", 30_000);
    call(&mut c, &["RPUSH", "l", "x"]);
    let refused: &[&[&str]] = &[
        &["BLPOP", "l", "0"],
        &["BRPOP", "l", "0"],
        &["BLMOVE", "l", "m", "LEFT", "LEFT", "0"],
        &["XREAD", "BLOCK", "0", "STREAMS", "s", "$"],
        &["MULTI"],
        &["EXEC"],
        &["WATCH", "l"],
        &["EVAL", "return redis.call('LPOP', 'l')", "0"],
        &["FCALL", "f", "0"],
        &["FUNCTION", "FLUSH"],
        &["SCRIPT", "FLUSH"],
        &["SUBSCRIBE", "ch"],
        &["FLOCK.ACQUIRE", "lk", "b", "1000"],
        &["FLOCK.RELEASE", "lk", "a"],
        &["flock.fenced", "lk", "1", "LPOP", "l"],
        &["CLIENT", "KILL", "TYPE", "normal"],
        &["SHUTDOWN", "NOSAVE"],
    ];
    for cmd in refused {
        let r = fenced(&mut c, "lk", t, cmd);
        assert_err_prefix(&r, "ERR FLOCK.FENCED refuses", &format!("{cmd:?}"));
    }
    assert_eq!(
        call(&mut c, &["LLEN", "l"]).int(),
        Some(1),
        "a refused command ran"
    );
    assert_eq!(
        held(&mut c, "lk").1,
        t,
        "a refused FLOCK command changed the lock"
    );
    assert_eq!(call(&mut c, &["PING"]), Reply::Status("PONG".into()));
}

#[test]
fn acl_rights_are_the_callers_own() {
    let srv = Server::start();
    let mut admin = srv.conn();
    let t = grant(&mut admin, "lk", "a", 30_000);
    call(&mut admin, &["SET", "secret", "s3cret"]);
    call(&mut admin, &["SET", "data:keep", "v"]);
    let r = call(
        &mut admin,
        &[
            "ACL",
            "SETUSER",
            "app",
            "on",
            ">pw",
            "~lk",
            "~data:*",
            "+flock.fenced",
            "+set",
            "+get",
            "+flushall",
        ],
    );
    assert_eq!(r, Reply::Status("OK".into()));
    call(
        &mut admin,
        &[
            "ACL",
            "SETUSER",
            "weak",
            "on",
            ">pw",
            "~lk",
            "~data:*",
            "+flock.fenced",
            "+get",
        ],
    );
    let mut app = srv.conn();
    call(&mut app, &["AUTH", "app", "pw"]);
    let mut weak = srv.conn();
    call(&mut weak, &["AUTH", "weak", "pw"]);
    // Allowed: a key and command the user may use directly.
    assert_eq!(
        fenced(&mut app, "lk", t, &["SET", "data:1", "ok"]),
        Reply::Status("OK".into())
    );
    // A key outside the user's patterns.
    let r = fenced(&mut app, "lk", t, &["SET", "secret", "stolen"]);
    assert_err_prefix(&r, "NOPERM", "key outside the user's patterns");
    assert_eq!(get(&mut admin, "secret"), Reply::Bulk(b"s3cret".to_vec()));
    // A command the user may not run.
    let r = fenced(&mut weak, "lk", t, &["SET", "data:2", "x"]);
    assert!(r.is_err(), "SET without +set went through FENCED: {r:?}");
    assert_eq!(get(&mut admin, "data:2"), Reply::Nil);
    let r = fenced(&mut weak, "lk", t, &["FLUSHALL"]);
    assert!(
        r.is_err(),
        "FLUSHALL without +flushall went through FENCED: {r:?}"
    );
    assert_eq!(get(&mut admin, "data:keep"), Reply::Bulk(b"v".to_vec()));
    // FENCED itself needs its own permission.
    call(
        &mut admin,
        &["ACL", "SETUSER", "nofence", "on", ">pw", "~*", "+set"],
    );
    let mut nofence = srv.conn();
    call(&mut nofence, &["AUTH", "nofence", "pw"]);
    let r = fenced(&mut nofence, "lk", t, &["SET", "data:3", "x"]);
    assert_err_prefix(&r, "NOPERM", "FLOCK.FENCED without +flock.fenced");
}

#[test]
fn getkeys_reports_the_lock_and_the_inner_keys() {
    let srv = Server::start();
    let mut c = srv.conn();
    let keys = |c: &mut redis::Connection, args: &[&str]| -> Vec<String> {
        let mut full = vec!["COMMAND", "GETKEYS"];
        full.extend_from_slice(args);
        call(c, &full)
            .array()
            .unwrap_or_else(|| panic!("GETKEYS {args:?}"))
            .iter()
            .filter_map(|r| r.string())
            .collect()
    };
    assert_eq!(
        keys(&mut c, &["FLOCK.FENCED", "lk", "5", "SET", "data:1", "v"]),
        ["lk", "data:1"]
    );
    assert_eq!(
        keys(
            &mut c,
            &[
                "FLOCK.FENCED",
                "{o}:lk",
                "5",
                "MSET",
                "{o}:a",
                "1",
                "{o}:b",
                "2"
            ]
        ),
        ["{o}:lk", "{o}:a", "{o}:b"]
    );
    assert_eq!(keys(&mut c, &["FLOCK.FENCED", "lk", "5", "PING"]), ["lk"]);
}

#[test]
fn the_inner_write_is_replicated_and_logged_as_itself() {
    // fsync every write: the AOF file is read below, right after the writes.
    let master = Server::builder()
        .arg("appendonly", "yes")
        .arg("appendfsync", "always")
        .start();
    let replica = Server::start_replica_of(&master);
    let mut m = master.conn();
    let mut r = replica.conn();
    let t = grant(&mut m, "lk", "a", 30_000);
    assert_eq!(
        fenced(&mut m, "lk", t, &["SET", "data:1", "from-fenced"]),
        Reply::Status("OK".into())
    );
    assert_eq!(
        fenced(&mut m, "lk", t, &["HSET", "h", "f", "v"]).int(),
        Some(1)
    );
    assert_err_prefix(
        &fenced(&mut m, "lk", t + 1, &["SET", "data:2", "stale"]),
        "FENCED",
        "stale",
    );
    wait_replica(&mut m);
    assert_eq!(get(&mut r, "data:1"), Reply::Bulk(b"from-fenced".to_vec()));
    assert_eq!(
        call(&mut r, &["HGET", "h", "f"]),
        Reply::Bulk(b"v".to_vec())
    );
    assert_eq!(get(&mut r, "data:2"), Reply::Nil);
    assert_eq!(
        call(&mut m, &["DEBUG", "DIGEST"]),
        call(&mut r, &["DEBUG", "DIGEST"])
    );
    let aof = String::from_utf8_lossy(&master.aof_bytes()).to_lowercase();
    assert!(
        aof.contains("from-fenced"),
        "the inner SET is not in the AOF"
    );
    assert!(
        !aof.contains("flock.fenced"),
        "FENCED was written to the AOF verbatim"
    );
}
