//! Keyspace notifications as a test sees them, and blocked clients.

use crate::info::info_field;
use crate::reply::{call, Reply};
use crate::server::Server;
use crate::wait::{contains_bytes, wait_until, DEADLINE};
use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

/// A RESP2 `PSUBSCRIBE __keyspace@0__:*` connection that collects what it is sent. Made once
/// the server has answered the PSUBSCRIBE, so no later event can be missed.
pub struct KeyspaceEvents {
    s: TcpStream,
    seen: Vec<u8>,
}

impl KeyspaceEvents {
    /// Turns keyspace notifications on (`Kd`: module events included) and subscribes.
    pub fn subscribe(srv: &Server) -> KeyspaceEvents {
        let r = call(
            &mut srv.conn(),
            &["CONFIG", "SET", "notify-keyspace-events", "Kd"],
        );
        assert_eq!(
            r,
            Reply::Status("OK".into()),
            "CONFIG SET notify-keyspace-events"
        );
        let mut s = TcpStream::connect(("127.0.0.1", srv.port())).expect("connect");
        s.set_read_timeout(Some(Duration::from_millis(200)))
            .expect("timeout");
        let p = "__keyspace@0__:*";
        s.write_all(format!("*2\r\n$10\r\nPSUBSCRIBE\r\n${}\r\n{p}\r\n", p.len()).as_bytes())
            .expect("subscribe");
        let mut sub = KeyspaceEvents {
            s,
            seen: Vec::new(),
        };
        sub.read_until(b"psubscribe");
        sub
    }

    /// Read until `needle` was seen (`DEADLINE` at most).
    #[track_caller]
    pub fn read_until(&mut self, needle: &[u8]) {
        let deadline = Instant::now() + DEADLINE;
        let mut buf = [0u8; 4096];
        while !contains_bytes(&self.seen, needle) && Instant::now() < deadline {
            if let Ok(n) = self.s.read(&mut buf) {
                self.seen.extend_from_slice(buf.get(..n).unwrap_or(&[]));
            }
        }
        assert!(
            contains_bytes(&self.seen, needle),
            "no {:?} in {:?}",
            String::from_utf8_lossy(needle),
            String::from_utf8_lossy(&self.seen)
        );
    }

    /// How often `event` was sent for `key` so far.
    pub fn count(&self, key: &str, event: &str) -> usize {
        let needle = format!("__keyspace@0__:{key}\r\n${}\r\n{event}\r\n", event.len());
        let n = needle.as_bytes();
        self.seen.windows(n.len()).filter(|w| *w == n).count()
    }
}

/// Redis's `blocked_clients` (INFO clients); -1 when unreadable.
pub fn blocked_clients(c: &mut redis::Connection) -> i64 {
    info_field(c, "clients", "blocked_clients")
        .and_then(|v| v.parse().ok())
        .unwrap_or(-1)
}

/// Wait until exactly `n` clients are blocked (so that the arrival order is known).
#[track_caller]
pub fn wait_blocked(c: &mut redis::Connection, n: i64) {
    wait_until(&format!("{n} blocked clients"), || blocked_clients(c) == n);
}
