//! Self-test of the shared harness (crates/flock-testkit) on a plain server (no module): start, restart
//! from RDB and AOF, replicas. When these fail, the other test files' failures mean nothing.

use flock_testkit::*;

#[test]
fn plain_server_starts_restarts_and_replicates() {
    let mut srv = Server::builder().without_module().start();
    let mut c = srv.conn();
    assert_eq!(
        call(&mut c, &["SET", "k", "v"]).string().as_deref(),
        Some("OK")
    );
    assert_eq!(call(&mut c, &["SAVE"]).string().as_deref(), Some("OK"));
    let port = srv.port();
    assert!(port <= 55535);
    srv.restart();
    assert_eq!(srv.port(), port);
    let mut c = srv.conn();
    assert_eq!(
        call(&mut c, &["GET", "k"]).string().as_deref(),
        Some("v"),
        "RDB not reloaded"
    );

    let mut rep = Server::builder().without_module().replica_of(&srv).start();
    let mut r = rep.conn();
    assert_eq!(
        call(&mut c, &["SET", "k2", "v2"]).string().as_deref(),
        Some("OK")
    );
    wait_replica(&mut c);
    assert_eq!(call(&mut r, &["GET", "k2"]).string().as_deref(), Some("v2"));
    assert_err_prefix(
        &call(&mut r, &["SET", "x", "y"]),
        "READONLY",
        "write on replica",
    );
    assert_eq!(
        info_field(&mut r, "replication", "role").as_deref(),
        Some("slave")
    );
    assert!(rep.is_alive());
    rep.stop();
    assert!(!rep.is_alive());
}

#[test]
fn plain_server_aof_restart() {
    let mut srv = Server::builder()
        .without_module()
        .arg("appendonly", "yes")
        .arg("appendfsync", "always")
        .start();
    let mut c = srv.conn();
    call(&mut c, &["SET", "a", "1"]);
    rewrite_aof(&mut c);
    call(&mut c, &["SET", "b", "2"]);
    srv.restart();
    let mut c = srv.conn();
    assert_eq!(call(&mut c, &["GET", "a"]).string().as_deref(), Some("1"));
    assert_eq!(call(&mut c, &["GET", "b"]).string().as_deref(), Some("2"));
    srv.shutdown_save();
    assert!(!srv.is_alive());
    srv.start_again();
    let mut c = srv.conn();
    assert_eq!(dbsize(&mut c), 2);
}

#[test]
fn server_error_text_is_reconstructed() {
    let srv = Server::builder().without_module().start();
    let mut c = srv.conn();
    call(&mut c, &["SET", "s", "v"]);
    let r = call(&mut c, &["LPUSH", "s", "x"]);
    assert_err_prefix(&r, "WRONGTYPE Operation against a key", "WRONGTYPE text");
    let r = call(&mut c, &["GET"]);
    assert_err_prefix(&r, "ERR wrong number of arguments", "arity text");
    let r = call(&mut c, &["SET", "k", "v", "FOO"]);
    assert_eq!(r, Reply::Err("ERR syntax error".into()));
    assert_eq!(call(&mut c, &["GET", "nokey"]), Reply::Nil);
}
