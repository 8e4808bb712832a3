//! The `flocklock` Redis data type's callbacks: persistence (RDB, AOF rewrite, DUMP/RESTORE),
//! COPY, MEMORY USAGE, DEBUG DIGEST, free, and the server-wide token high-water mark saved as
//! RDB aux data. What a lock looks like on disk is flock-core's [`Snapshot`]. Their
//! trampolines, and the free itself, are in `ffi/lock_type.rs`.
//!
//! [`Snapshot`]: flock_core::Snapshot

use super::events;
use crate::ffi::block::{KeyId, LockRecord, RecordPtr};
use crate::ffi::{self, Aof, Digest, RStr, RdbReader, RdbWriter};
use crate::peers::replication;
use crate::server;
use crate::store::expiry;
use crate::waiting::jobs;
use flock_core::{engine, keyspace, rdb, LockState};
use std::ffi::c_int;
use std::ffi::CStr;

/// Current RDB encoding version (flock-core's layout); `rdb_load` accepts this and every
/// older one. 1: exclusive keys only (token, deadline, owner). 2: every kind.
pub const ENCODING_VERSION: c_int = rdb::ENCODING_VERSION;

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
        // The copy gets its name and timer when the copy_to event arms it.
        Some(LockRecord {
            state: keyspace::copy_of(state),
            watched: None,
        })
    }

    /// DEL, UNLINK, RELEASE, overwrite, eviction, MIGRATE's delete, a slot trimmed after it
    /// moved, and a synchronous flush free on the main thread: the key leaves this node, by
    /// the one path of `events::key_left`. A lazy-free thread (FLUSHALL ASYNC) must not touch
    /// the index; the flush event already took those out.
    fn freeing(block: RecordPtr, bound: impl FnOnce() -> Vec<(u64, u64)>) -> bool {
        let main_thread = server::on_main_thread();
        if main_thread {
            events::key_left(block, bound);
        }
        main_thread
    }

    #[inline]
    fn freed(watched: Option<Box<KeyId>>, main_thread: bool) {
        if let Some(key) = watched {
            jobs::schedule_revisit(*key, main_thread);
        }
    }

    // Aux data: the token high-water mark, so that tokens keep growing across restarts and
    // full syncs even with the wall clock set back (G3).
    fn aux_save(mut w: &RdbWriter<'_>) {
        let mark = server::tokens().high_water();
        rdb::save_aux(mark, &mut w);
    }

    fn aux_load(mut r: &RdbReader<'_>, encver: c_int, before_rdb: bool) -> bool {
        if !before_rdb {
            return false;
        }
        let Some(mark) = rdb::load_aux(encver, &mut r) else {
            return false;
        };
        server::tokens().observe(mark);
        true
    }
}

fn digest(mut md: &Digest<'_>, state: &LockState) {
    rdb::digest_lock(state, &mut md);
}

fn rdb_save(mut w: &RdbWriter<'_>, state: &LockState) {
    rdb::save_lock(state, &mut w);
}

fn rdb_load(mut r: &RdbReader<'_>, encver: c_int) -> Option<LockRecord> {
    // Refuse values no master could have written (a corrupt payload), rather than load them.
    let image = rdb::load_lock(encver, &mut r)?;
    let state = engine::load(image, server::now(), &mut server::tokens());
    // Named when first armed (the key's name is not known here).
    Some(LockRecord {
        state,
        watched: None,
    })
}
