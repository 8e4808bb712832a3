//! A key travels: through RDB (the module's layout, `flock_core::rdb`) to a restarted
//! server and to a resyncing replica, and the model's deadlines become what is left of them by
//! the wall clock. A bound grant travels as its mark only: on the master that loads it, it has
//! no connection, so it is not live from then on and ends at the next settle (G11); the
//! replica keeps the mark as it is.

use super::model::Model;
use super::server::Server;
use flock_core::engine;
use flock_core::rdb::{self, RdbSink, RdbSource};
use flock_core::snapshot::LockImage;
use flock_core::Now;

/// An RDB value in memory: what was saved, with its kind, and how far it was read.
#[derive(Default)]
struct Tape {
    values: Vec<Value>,
    at: usize,
}

enum Value {
    Unsigned(u64),
    Signed(i64),
    Bytes(Vec<u8>),
}

impl RdbSink for Tape {
    fn save_unsigned(&mut self, v: u64) {
        self.values.push(Value::Unsigned(v));
    }
    fn save_signed(&mut self, v: i64) {
        self.values.push(Value::Signed(v));
    }
    fn save_bytes(&mut self, b: &[u8]) {
        self.values.push(Value::Bytes(b.to_vec()));
    }
}

impl Tape {
    fn next(&mut self) -> Option<&Value> {
        let v = self.values.get(self.at);
        self.at += 1;
        v
    }
}

impl RdbSource for Tape {
    fn load_unsigned(&mut self) -> Option<u64> {
        match self.next()? {
            Value::Unsigned(v) => Some(*v),
            _ => None,
        }
    }
    fn load_signed(&mut self) -> Option<i64> {
        match self.next()? {
            Value::Signed(v) => Some(*v),
            _ => None,
        }
    }
    fn load_bytes(&mut self) -> Option<Vec<u8>> {
        match self.next()? {
            Value::Bytes(b) => Some(b.clone()),
            _ => None,
        }
    }
}

/// The keyspace leaves this server and comes back through RDB: each key's kind, grants
/// (owner, token, absolute wall-clock deadline) and delayed slots; the monotonic deadlines
/// are what is left of them by the local wall clock now. A replica resyncs from the same data.
pub(super) fn travel(real: &mut Server, model: &mut Model, k: usize, now: Now) {
    if let Some(st) = &real.states[k] {
        // Saved and loaded in the module's RDB layout.
        let mut tape = Tape::default();
        rdb::save_lock(st, &mut tape);
        let image = rdb::load_lock(rdb::ENCODING_VERSION, &mut tape).expect("a saved lock loads");
        assert_eq!(tape.at, tape.values.len(), "the whole value read back");
        assert_eq!(image, LockImage::of(st), "RDB carries the state's image");
        let mut loaded = engine::load(image.clone(), now, &mut real.tokens);
        // As the module does when loading ends (`expiry.rs` `arm_scanned`) and on promotion.
        let orphaned = engine::orphan_bound(&mut loaded, true);
        let copy = engine::load(image, now, &mut real.replica.tokens);
        real.replica.keys[k] = Some(copy);
        assert_eq!(
            orphaned,
            loaded.grants().iter().any(|g| g.bound()),
            "every bound grant that arrives on a master loses its connection"
        );
        real.states[k] = Some(loaded);
    } else {
        real.replica.keys[k] = None;
    }
    // The module's index is not told (DEBUG RELOAD keeps it): its entries for the key are
    // stale from now on.
    real.bindings.key_gone(k);
    // A resync carries the master's token mark (RDB aux data); between resyncs the replica
    // raises its own from the effects it applies.
    let mark = real.tokens.high_water();
    real.replica.tokens.observe(mark);

    let left = |wall_ms: i64| -> u64 {
        let ms = wall_ms.saturating_sub(now.wall_ms).max(0) as u64;
        now.mono_us + ms * 1000
    };
    let mk = &mut model.keys[k];
    if !mk.exists {
        return;
    }
    for g in &mut mk.grants {
        g.mono_us = left(g.wall_ms);
        mk.last_token = mk.last_token.max(g.token);
    }
    for d in &mut mk.delays {
        d.0 = left(d.1);
    }
    model.high_water = model.high_water.max(mk.last_token);
    model.orphan_bound(k, now);
}
