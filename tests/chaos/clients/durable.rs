//! Durable clients (docs/CLIENTS.md rule 10, as the three clients build it): ACQUIRE and RENEW
//! sent back to back with `WAIT 1 ms` on the same connection. A grant the replica did not
//! acknowledge in time is released at once (token-qualified) and never used; an extension it
//! did not acknowledge leaves the durable floor where it was. faults.rs then holds every
//! failover to losing none of the grants the replica acknowledged.

use super::*;

/// How long a durable client's WAIT may block (the clients' `durable_timeout`).
pub(crate) const DURABLE_WAIT_MS: u64 = 250;

impl Client {
    /// `args`, then `WAIT 1 DURABLE_WAIT_MS`, on one connection without waiting in between: the
    /// first's answer, and how many replicas acknowledged it (None: no integer came back).
    pub(crate) fn call_durable(
        &mut self,
        args: &[String],
        timeout: Duration,
    ) -> (Call, Option<i64>) {
        let Some(c) = self.conn.as_mut() else {
            return (Call::Lost("not connected".into()), None);
        };
        let _ = c.set_read_timeout(timeout);
        self.sent_epoch = self.sh.epoch();
        let wait = ["WAIT".to_string(), "1".into(), DURABLE_WAIT_MS.to_string()];
        c.queue(args);
        c.queue(&wait);
        if let Err(e) = c.flush() {
            self.drop_conn();
            return (Call::Lost(e.to_string()), None);
        }
        let first = c.read_reply();
        let first = self.finish(first);
        let Some(c) = self.conn.as_mut() else {
            return (first, None);
        };
        match c.read_reply() {
            Ok(Reply::Int(n)) => (first, Some(n)),
            Ok(_) => (first, None),
            Err(_) => {
                self.drop_conn();
                (first, None)
            }
        }
    }

    /// Grant `g` came back without the replica's acknowledgement: release it by its token, as
    /// the clients do before they raise `LockNotDurableError`, and record how that went.
    pub(crate) fn release_not_durable(&mut self, g: usize) {
        let sh = self.sh.clone();
        let (key, owner, token) = {
            let h = sh.hist();
            let r = &h.grants[g];
            (sh.lock_key(r.key), r.owner.clone(), r.token)
        };
        sh.hist().op("durable acquire not acknowledged: released");
        if !self.connect() {
            sh.hist().grants[g].unsure = true;
            return;
        }
        let send = sh.now();
        sh.hist().grants[g].touched = send;
        let args = ["FLOCK.RELEASE".into(), key, owner, token.to_string()];
        let r = self.call(&args, Duration::from_secs(20));
        let ack = sh.now();
        match r {
            Call::Reply(Reply::Int(1)) => {
                self.proof(g, send, ack, "RELEASE");
                sh.hist().grants[g].released = Some(ack);
            }
            Call::Reply(Reply::Int(0)) => self.ended(g, send, ack),
            Call::Lost(_) => sh.hist().grants[g].unsure = true,
            Call::Reply(Reply::Err(_)) => sh.hist().grants[g].unsure = true,
            Call::Reply(r) => sh
                .hist()
                .violation(format!("{args:?}: unexpected reply {r:?}")),
        }
    }
}
