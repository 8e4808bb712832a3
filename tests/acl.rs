//! Key specs as ACL reads them: CHECK and INFO only read their key, so a user with read-only
//! access to it (`%R~`) may call them and nothing that changes a lock; a user with write-only
//! access (`%W~`) may not read a lock; FENCED asks for read access to its lock key and for what
//! the inner command declares on the inner keys. And FENCED refuses to touch its own lock key.
use flock_testkit::*;

fn setuser(admin: &mut redis::Connection, name: &str, keys: &str) {
    let r = call(
        admin,
        &[
            "ACL",
            "SETUSER",
            name,
            "on",
            ">pw",
            keys,
            "+flock.acquire",
            "+flock.release",
            "+flock.renew",
            "+flock.check",
            "+flock.info",
            "+flock.revoke",
            "+flock.fenced",
            "+get",
            "+set",
        ],
    );
    assert_ok(&r, "ACL SETUSER");
}

fn is_noperm(r: &Reply) -> bool {
    r.err().is_some_and(|e| e.starts_with("NOPERM"))
}

#[test]
fn read_only_users_check_and_inspect_but_never_change_a_lock() {
    let srv = Server::start();
    let mut admin = srv.conn();
    setuser(&mut admin, "reader", "%R~orders:*");
    setuser(&mut admin, "writer", "%W~orders:*");
    setuser(&mut admin, "both", "~orders:*");
    let t = grant(&mut admin, "orders:lock", "w1", 60_000);
    assert_ok(&call(&mut admin, &["SET", "orders:data", "v"]), "SET");
    let tok = t.to_string();

    // (user, command, allowed)
    let table: &[(&str, &[&str], bool)] = &[
        ("reader", &["FLOCK.CHECK", "orders:lock", &tok], true),
        ("reader", &["FLOCK.INFO", "orders:lock"], true),
        ("reader", &["GET", "orders:data"], true),
        (
            "reader",
            &["FLOCK.FENCED", "orders:lock", &tok, "GET", "orders:data"],
            true,
        ),
        (
            "reader",
            &["FLOCK.ACQUIRE", "orders:other", "r", "1000"],
            false,
        ),
        ("reader", &["FLOCK.RELEASE", "orders:lock", "w1"], false),
        (
            "reader",
            &["FLOCK.RENEW", "orders:lock", "w1", "1000"],
            false,
        ),
        ("reader", &["FLOCK.REVOKE", "orders:lock"], false),
        (
            "reader",
            &[
                "FLOCK.FENCED",
                "orders:lock",
                &tok,
                "SET",
                "orders:data",
                "x",
            ],
            false,
        ),
        ("writer", &["FLOCK.CHECK", "orders:lock", &tok], false),
        ("writer", &["FLOCK.INFO", "orders:lock"], false),
        (
            "writer",
            &[
                "FLOCK.FENCED",
                "orders:lock",
                &tok,
                "SET",
                "orders:data",
                "x",
            ],
            false,
        ),
        ("both", &["FLOCK.CHECK", "orders:lock", &tok], true),
        (
            "both",
            &["FLOCK.ACQUIRE", "orders:other", "b", "1000"],
            true,
        ),
        (
            "both",
            &[
                "FLOCK.FENCED",
                "orders:lock",
                &tok,
                "SET",
                "orders:data",
                "y",
            ],
            true,
        ),
        ("both", &["FLOCK.RELEASE", "orders:other", "b"], true),
        ("reader", &["FLOCK.CHECK", "elsewhere", &tok], false),
    ];
    let mut bad = Vec::new();
    for (user, cmd, allowed) in table {
        let mut c = srv.conn_as(user, "pw");
        let r = call(&mut c, cmd);
        // ACL DRYRUN (7.0+) must agree with what the call did.
        let mut dry = vec!["ACL", "DRYRUN", user];
        dry.extend(cmd.iter());
        let d = call(&mut admin, &dry);
        eprintln!("{user} {cmd:?}: {r:?} (DRYRUN {d:?})");
        if is_noperm(&r) == *allowed {
            bad.push(format!("{user} {cmd:?}: {r:?}, expected allowed={allowed}"));
        }
        if (d == Reply::Status("OK".into())) != *allowed {
            bad.push(format!(
                "ACL DRYRUN {user} {cmd:?}: {d:?}, expected allowed={allowed}"
            ));
        }
    }
    assert!(bad.is_empty(), "{}", bad.join("\n"));
    // The reader changed nothing; the one permitted write is "both"'s.
    assert_eq!(held(&mut admin, "orders:lock").1, t);
    assert_eq!(
        call(&mut admin, &["GET", "orders:data"]),
        Reply::Bulk(b"y".to_vec())
    );
    assert_eq!(exists(&mut admin, "orders:other"), 0);
}

#[test]
fn command_info_shows_read_only_key_specs_for_check_and_info() {
    let srv = Server::start();
    let mut c = srv.conn();
    for (cmd, want_flag, refused_flag) in [
        ("flock.check", "RO", "RW"),
        ("flock.info", "RO", "RW"),
        ("flock.acquire", "RW", "RO"),
        ("flock.release", "RW", "RO"),
        ("flock.renew", "RW", "RO"),
        ("flock.revoke", "RW", "RO"),
    ] {
        let r = call(&mut c, &["COMMAND", "INFO", cmd]);
        let text = format!("{r:?}");
        assert!(
            text.contains(&format!("Bulk({:?})", want_flag.as_bytes()))
                || text.contains(&format!("Status({want_flag:?})")),
            "COMMAND INFO {cmd} lacks key-spec flag {want_flag}: {text}"
        );
        assert!(
            !text.contains(&format!("Status({refused_flag:?})")),
            "COMMAND INFO {cmd} has flag {refused_flag}: {text}"
        );
    }
    // Cluster clients route by these: the key is still argv[1].
    for cmd in [
        vec!["FLOCK.CHECK", "k1", "5"],
        vec!["FLOCK.INFO", "k2"],
        vec!["FLOCK.ACQUIRE", "k3", "o", "100"],
        vec!["FLOCK.RELEASE", "k4", "o", "7"],
    ] {
        let mut full = vec!["COMMAND", "GETKEYS"];
        full.extend(cmd.iter());
        let keys: Vec<String> = call(&mut c, &full)
            .array()
            .unwrap_or_default()
            .iter()
            .filter_map(|r| r.string())
            .collect();
        assert_eq!(keys, vec![cmd[1].to_string()], "GETKEYS {cmd:?}");
    }
}

#[test]
fn fenced_cannot_touch_its_own_lock_key_nor_flush_the_keyspace() {
    let srv = Server::start();
    let mut c = srv.conn();
    let t = grant(&mut c, "rf", "me", 60_000);
    let tok = t.to_string();
    assert_ok(&call(&mut c, &["SET", "other", "v"]), "SET other");
    for inner in [
        vec!["SET", "rf", "x"],
        vec!["DEL", "rf"],
        vec!["UNLINK", "other", "rf"],
        vec!["RENAME", "rf", "elsewhere"],
        vec!["MSET", "a", "1", "rf", "2"],
        vec!["EXPIRE", "rf", "1"],
        vec!["GET", "rf"],
    ] {
        let mut cmd = vec!["FLOCK.FENCED", "rf", &tok];
        cmd.extend(inner.iter());
        let r = call(&mut c, &cmd);
        assert_eq!(
            r,
            Reply::Err("ERR FLOCK.FENCED cannot touch its own lock key".into()),
            "FENCED rf {inner:?}"
        );
    }
    for inner in ["FLUSHDB", "FLUSHALL", "flushall"] {
        let r = call(&mut c, &["FLOCK.FENCED", "rf", &tok, inner]);
        assert_err_contains(&r, "commands on the whole keyspace", inner);
    }
    // The same refusals with a stale token: the refusal does not depend on liveness.
    let r = call(&mut c, &["FLOCK.FENCED", "rf", "1", "DEL", "rf"]);
    assert_eq!(
        r,
        Reply::Err("ERR FLOCK.FENCED cannot touch its own lock key".into())
    );
    // The lock is intact and other keys still work.
    assert_eq!(held(&mut c, "rf").1, t);
    assert_eq!(call(&mut c, &["GET", "other"]), Reply::Bulk(b"v".to_vec()));
    assert_eq!(
        call(&mut c, &["FLOCK.FENCED", "rf", &tok, "SET", "other", "w"]),
        Reply::Status("OK".into())
    );
    assert_eq!(dbsize(&mut c), 2);
}
