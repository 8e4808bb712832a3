//! The RDB layout of a `flocklock` value, its DEBUG DIGEST, and the aux data (the token
//! high-water mark): the order and kind of every field written and read, behind small sinks
//! and sources the module implements with `RedisModule_Save*` / `RedisModule_Load*` /
//! `RedisModule_DigestAdd*`.
//!
//! Encoding version 2 (written today): unsigned mode code and limit (0 0: exclusive, 1 0:
//! shared, 2 n: permits of n), unsigned last token, unsigned number of grants, each as string
//! owner, unsigned token, signed deadline (Unix ms), unsigned bound mark (0 or 1); unsigned
//! number of delayed slots, each as its signed end (Unix ms). Grants in token order.
//!
//! Encoding version 1 (read only): unsigned token, signed deadline (Unix ms), string owner
//! (empty: an exclusive key in lock-delay until the deadline; else its one grant).
//!
//! Aux data (before the keyspace): one unsigned, the token high-water mark.
//!
//! Every value read goes through [`LockImage::validate`]: a payload no master could have
//! written loads as nothing (`None`), never as a broken lock, and nothing here panics.

use crate::snapshot::{mode_code, mode_from_code, GrantImage, LockImage};
use crate::state::{LockState, MAX_LIMIT};
use crate::tokens::MAX_TOKEN;

/// The RDB encoding version written ([`save_lock`]); [`load_lock`] reads it and every older
/// one (1..=`ENCODING_VERSION`). The glue registers its type with it (`registration/lock_type.rs`
/// `ENCODING_VERSION`).
pub const ENCODING_VERSION: i32 = 2;

/// Where an RDB value is written: `RedisModule_SaveUnsigned`, `RedisModule_SaveSigned`,
/// `RedisModule_SaveStringBuffer` on the module's `RedisModuleIO`.
pub trait RdbSink {
    fn save_unsigned(&mut self, v: u64);
    fn save_signed(&mut self, v: i64);
    fn save_bytes(&mut self, b: &[u8]);
}

/// Where an RDB value is read from: `RedisModule_LoadUnsigned`, `RedisModule_LoadSigned`,
/// `RedisModule_LoadStringBuffer`, each followed by `RedisModule_IsIOError`. A read that
/// failed (the payload ended early or is corrupt) is `None`; the loaders stop at the first.
pub trait RdbSource {
    fn load_unsigned(&mut self) -> Option<u64>;
    fn load_signed(&mut self) -> Option<i64>;
    /// A string buffer (an empty one is `Some(vec![])`).
    fn load_bytes(&mut self) -> Option<Vec<u8>>;
}

/// Where a value's DEBUG DIGEST goes: `RedisModule_DigestAddLongLong`,
/// `RedisModule_DigestAddStringBuffer`, `RedisModule_DigestEndSequence`.
pub trait DigestSink {
    fn add_long_long(&mut self, v: i64);
    fn add_bytes(&mut self, b: &[u8]);
    fn end_sequence(&mut self);
}

/// Write `state` in the current encoding ([`ENCODING_VERSION`]): the module's callback is a
/// sink over its `RedisModuleIO` and one call of this.
pub fn save_lock<S: RdbSink + ?Sized>(state: &LockState, sink: &mut S) {
    let (code, limit) = mode_code(state.mode);
    sink.save_unsigned(code);
    sink.save_unsigned(limit);
    sink.save_unsigned(state.last_token);
    sink.save_unsigned(state.grants().len() as u64);
    // In token order, as every persisted form (LockImage::validate checks it).
    for g in state.grants().by_token() {
        sink.save_bytes(&g.owner);
        sink.save_unsigned(g.token);
        sink.save_signed(g.deadline.wall_ms);
        sink.save_unsigned(u64::from(g.bound()));
    }
    sink.save_unsigned(state.delays.len() as u64);
    for d in state.delays.iter() {
        sink.save_signed(d.wall_ms);
    }
}

/// Read one value written with encoding version `encver`, checked ([`LockImage::validate`]);
/// `None` for an unknown version, a failed read, or a value no master could have written.
///.
pub fn load_lock<S: RdbSource + ?Sized>(encver: i32, source: &mut S) -> Option<LockImage> {
    match encver {
        1 => load_v1(source),
        2 => load_v2(source),
        _ => None,
    }
}

fn load_v1<S: RdbSource + ?Sized>(r: &mut S) -> Option<LockImage> {
    let token = r.load_unsigned()?;
    let deadline = r.load_signed()?;
    let owner = r.load_bytes()?;
    LockImage::from_rdb_v1(token, deadline, &owner).ok()
}

fn load_v2<S: RdbSource + ?Sized>(r: &mut S) -> Option<LockImage> {
    let code = r.load_unsigned()?;
    let limit = r.load_unsigned()?;
    let mode = mode_from_code(code, limit).ok()?;
    let last_token = r.load_unsigned()?;
    let count = |n: u64| (n <= u64::from(MAX_LIMIT)).then_some(n as usize);
    let n = count(r.load_unsigned()?)?;
    let mut grants = Vec::with_capacity(n.min(64));
    for _ in 0..n {
        let owner = r.load_bytes()?;
        let token = r.load_unsigned()?;
        let deadline_wall_ms = r.load_signed()?;
        let bound = match r.load_unsigned()? {
            0 => false,
            1 => true,
            _ => return None,
        };
        grants.push(GrantImage {
            owner,
            token,
            deadline_wall_ms,
            bound,
        });
    }
    let m = count(r.load_unsigned()?)?;
    let mut delays = Vec::with_capacity(m.min(64));
    for _ in 0..m {
        delays.push(r.load_signed()?);
    }
    LockImage {
        mode,
        last_token,
        grants,
        delays,
    }
    .validate()
    .ok()
}

/// Write the aux data: the token high-water `mark` (the glue calls it for
/// `REDISMODULE_AUX_BEFORE_RDB` only)..
pub fn save_aux<S: RdbSink + ?Sized>(mark: u64, sink: &mut S) {
    sink.save_unsigned(mark);
}

/// Read the aux data written with encoding version `encver`: the token high-water mark to
/// observe; `None` for an unknown version, a failed read or a mark above [`MAX_TOKEN`] (the
/// glue answers `REDISMODULE_ERR`; it keeps its own check of `when`).
pub fn load_aux<S: RdbSource + ?Sized>(encver: i32, source: &mut S) -> Option<u64> {
    if !(1..=ENCODING_VERSION).contains(&encver) {
        return None;
    }
    source.load_unsigned().filter(|&mark| mark <= MAX_TOKEN)
}

/// The DEBUG DIGEST of `state`: the same on a master and its replicas when they agree on what
/// travels. Exclusive keys add no mode (as v1 did); grants in token order (master and replica
/// may keep them in different orders); the last token only for a key with delayed slots and no
/// grant; the delayed slots' ends sorted..
pub fn digest_lock<S: DigestSink + ?Sized>(state: &LockState, sink: &mut S) {
    let (code, limit) = mode_code(state.mode);
    if code != 0 {
        sink.add_long_long(code as i64);
        sink.add_long_long(limit as i64);
    }
    for g in state.grants().by_token() {
        sink.add_bytes(&g.owner);
        sink.add_long_long(g.token as i64);
        sink.add_long_long(g.deadline.wall_ms);
        if g.bound() {
            sink.add_long_long(1);
        }
    }
    if state.grants().is_empty() && !state.delays.is_empty() {
        sink.add_long_long(state.last_token as i64);
    }
    let mut ends: Vec<i64> = state.delays.iter().map(|d| d.wall_ms).collect();
    ends.sort_unstable();
    for end in ends {
        sink.add_long_long(end);
    }
    sink.end_sequence();
}

#[cfg(test)]
mod tests;
