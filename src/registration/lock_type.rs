//! The `flocklock` Redis data type's callbacks: persistence (RDB, AOF rewrite, DUMP/RESTORE),
//! COPY, MEMORY USAGE, DEBUG DIGEST, free, and the server-wide token high-water mark saved as
//! RDB aux data. What a lock looks like on disk is flock-core's [`Snapshot`]. Their
//! trampolines, and the free itself, are in `ffi/lock_type.rs`.
//!
//! [`Snapshot`]: flock_core::Snapshot

use crate::ffi::block::{KeyId, LockRecord, RecordPtr};
use crate::ffi::{self, Aof, Digest, RStr, RdbReader, RdbWriter};
use crate::peers::replication;
use crate::server;
use crate::store::expiry;
use crate::waiting::jobs;
use flock_core::snapshot::{mode_code, mode_from_code, GrantImage, LockImage};
use flock_core::state::MAX_LIMIT;
use flock_core::{engine, LockState, MAX_TOKEN};
use std::ffi::c_int;
use std::ffi::CStr;

/// Current RDB encoding version; `rdb_load` accepts this and every older one.
/// 1: exclusive keys only (token, deadline, owner). 2: every kind (see `rdb_save`).
pub const ENCODING_VERSION: c_int = 2;

/// The data type.
pub struct FlockLock;

impl ffi::LockTypeMethods for FlockLock {
    const NAME: &'static CStr = c"flocklock";
    const ENCODING_VERSION: c_int = ENCODING_VERSION;

    fn rdb_load(r: &RdbReader<'_>, encver: c_int) -> Option<LockRecord> {
        rdb_load(r, encver)
    }

    fn rdb_save(w: &RdbWriter<'_>, state: &LockState) {
        rdb_save(w, state);
    }

    fn aof_rewrite(aof: Aof<'_>, key: RStr<'_>, state: &LockState) {
        if let Some(snapshot) = flock_core::Snapshot::of(state) {
            replication::emit_aof(aof, key, snapshot);
        }
    }

    fn mem_usage(block: RecordPtr) -> usize {
        block.bytes()
            + if block.pos() != flock_core::deadlines::NOWHERE {
                expiry::TIMER_BYTES
            } else {
                0
            }
    }

    fn digest(md: &Digest<'_>, state: &LockState) {
        digest(md, state);
    }

    fn copy(state: &LockState) -> Option<LockRecord> {
        // The copy gets its name and timer when the copy_to event arms it. A binding lives
        // with one connection and one value: COPY leaves bound grants out (G11).
        let mut state = state.clone();
        state.retain_grants(|g| !g.bound());
        Some(LockRecord {
            state,
            watched: None,
        })
    }

    /// DEL, UNLINK, RELEASE, overwrite, eviction and a synchronous flush free on the main
    /// thread: take the block out of the deadline index now (G10). A lazy-free thread
    /// (FLUSHALL ASYNC) must not touch the index; the flush event already took those out.
    fn freeing(block: RecordPtr) -> bool {
        let main_thread = server::on_main_thread();
        if main_thread {
            expiry::disarm(block);
        }
        main_thread
    }

    fn freed(watched: Option<Box<KeyId>>, main_thread: bool) {
        if let Some(key) = watched {
            jobs::schedule_revisit(*key, main_thread);
        }
    }

    // Aux data: the token high-water mark, so that tokens keep growing across restarts and
    // full syncs even with the wall clock set back (G3).
    fn aux_save(w: &RdbWriter<'_>) {
        w.unsigned(server::tokens().high_water());
    }

    fn aux_load(r: &RdbReader<'_>, encver: c_int, before_rdb: bool) -> bool {
        if !(1..=ENCODING_VERSION).contains(&encver) || !before_rdb {
            return false;
        }
        let Some(mark) = r.unsigned().filter(|&m| m <= MAX_TOKEN) else {
            return false;
        };
        server::tokens().observe(mark);
        true
    }
}

fn digest(md: &Digest<'_>, state: &LockState) {
    let (code, limit) = mode_code(state.mode);
    // Exclusive keys add no mode, as v1 did.
    if code != 0 {
        md.add_long_long(code as i64);
        md.add_long_long(limit as i64);
    }
    // In token order: master and replica may keep their grants in different orders.
    for g in state.grants().by_token() {
        md.add_string_buffer(&g.owner);
        md.add_long_long(g.token as i64);
        md.add_long_long(g.deadline.wall_ms);
        if g.bound() {
            md.add_long_long(1);
        }
    }
    if state.grants().is_empty() && !state.delays.is_empty() {
        md.add_long_long(state.last_token as i64);
    }
    let mut ends: Vec<i64> = state.delays.iter().map(|d| d.wall_ms).collect();
    ends.sort_unstable();
    for end in ends {
        md.add_long_long(end);
    }
    md.end_sequence();
}

// RDB layout, encoding version 2: unsigned mode code and limit (0 0: exclusive, 1 0: shared,
// 2 n: permits of n), unsigned last token, unsigned number of grants, each as string owner,
// unsigned token, signed deadline (Unix ms), unsigned bound mark; unsigned number of delayed
// slots, each as its signed end (Unix ms).
fn rdb_save(w: &RdbWriter<'_>, state: &LockState) {
    let (code, limit) = mode_code(state.mode);
    w.unsigned(code);
    w.unsigned(limit);
    w.unsigned(state.last_token);
    w.unsigned(state.grants().len() as u64);
    // In token order, as every persisted form (LockImage::validate checks it).
    for g in state.grants().by_token() {
        w.bytes(&g.owner);
        w.unsigned(g.token);
        w.signed(g.deadline.wall_ms);
        w.unsigned(u64::from(g.bound()));
    }
    w.unsigned(state.delays.len() as u64);
    for d in state.delays.iter() {
        w.signed(d.wall_ms);
    }
}

fn read_v1(r: &RdbReader<'_>) -> Option<LockImage> {
    let token = r.unsigned()?;
    let deadline = r.signed()?;
    let owner = r.bytes()?;
    LockImage::from_rdb_v1(token, deadline, &owner).ok()
}

fn read_v2(r: &RdbReader<'_>) -> Option<LockImage> {
    let mode = mode_from_code(r.unsigned()?, r.unsigned()?).ok()?;
    let last_token = r.unsigned()?;
    let count = |n: u64| (n <= u64::from(MAX_LIMIT)).then_some(n as usize);
    let n = count(r.unsigned()?)?;
    let mut grants = Vec::with_capacity(n.min(64));
    for _ in 0..n {
        let owner = r.bytes()?;
        let token = r.unsigned()?;
        let deadline_wall_ms = r.signed()?;
        let bound = match r.unsigned()? {
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
    let m = count(r.unsigned()?)?;
    let mut delays = Vec::with_capacity(m.min(64));
    for _ in 0..m {
        delays.push(r.signed()?);
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

fn rdb_load(r: &RdbReader<'_>, encver: c_int) -> Option<LockRecord> {
    // Refuse values no master could have written (a corrupt payload), rather than load them.
    let image = match encver {
        1 => read_v1(r),
        2 => read_v2(r),
        _ => None,
    }?;
    let state = engine::load(image, server::now(), &mut server::tokens());
    // Named when first armed (the key's name is not known here).
    Some(LockRecord {
        state,
        watched: None,
    })
}
