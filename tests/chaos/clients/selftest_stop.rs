//! The checker's record of a client's last connection: a client whose thread ends at the run's
//! stop closes its lock connection, and its bound grants end on the server then. Watchers still
//! running may be told "closed" for them, which the checker allows only after a recorded close.

use super::Client;
use crate::history::Shared;
use flock_testkit::*;
use std::sync::Arc;
use std::time::Duration;

#[test]
fn a_client_that_stops_records_the_close_of_its_connection_before_the_server_ends_its_grant() {
    let srv = Server::start();
    let sh = Arc::new(Shared::new(srv.port(), 1, 1));
    let mut c = Client::new(0, sh.clone(), Rng::new(7), false);
    assert!(c.connect(), "connect to the server");
    let key = sh.lock_key(0);
    let args: Vec<String> = ["FLOCK.ACQUIRE", &key, "stopper", "60000", "BOUND"]
        .iter()
        .map(|s| s.to_string())
        .collect();
    match c.call(&args, Duration::from_secs(5)) {
        super::Call::Reply(Reply::Int(t)) => assert!(t > 0),
        super::Call::Reply(r) => panic!("ACQUIRE BOUND answered {r:?}"),
        super::Call::Lost(e) => panic!("ACQUIRE BOUND lost: {e}"),
    }
    let gen = c.gen;
    let before_stop = sh.now();
    drop(c);
    let mut look = srv.raw();
    assert!(
        poll_until(Duration::from_secs(10), || {
            look.call(&["EXISTS", &key]).ok() == Some(Reply::Int(0))
        }),
        "the bound grant ended with its connection"
    );
    let seen_gone = sh.now();
    let closed = sh.hist().closed.get(&(0, gen)).copied();
    let closed = closed.expect("the close of the stopped client's connection is recorded");
    assert!(
        before_stop <= closed && closed <= seen_gone,
        "recorded at {closed} us, between the stop ({before_stop}) and the key seen gone ({seen_gone})"
    );
}
