//! Redis Cluster: the token high-water mark shared between nodes, and whether this node still
//! serves a key's slot (for waiters whose key migrated away).

use crate::ffi::{self, Ctx};
use crate::server;
use flock_core::slots::{key_slot, slot_state, SlotState};
use std::sync::atomic::{AtomicBool, Ordering};

/// Cluster bus message type carrying a node's token high-water mark (8 bytes, little endian).
const MSG_HIGH_WATER: u8 = 1;

static ENABLED: AtomicBool = AtomicBool::new(false);

pub fn init(ctx: Ctx<'_>) {
    let on = ctx.flags().is_cluster();
    ENABLED.store(on, Ordering::Relaxed);
    if on {
        ffi::register_cluster_receiver::<HighWater>(ctx, MSG_HIGH_WATER);
    }
}

pub fn enabled() -> bool {
    ENABLED.load(Ordering::Relaxed)
}

/// Tell every node our high-water mark (from the cron, ten times a second). A node that gets
/// a slot by migration or failover then issues tokens above every token we issued up to the
/// last broadcast, whatever the clocks say (G3 across nodes).
pub fn broadcast_high_water(ctx: Ctx<'_>) {
    if !enabled() || !server::is_master() {
        return;
    }
    let mark = server::tokens().high_water();
    if mark == 0 {
        return;
    }
    ffi::send_cluster_message(ctx, MSG_HIGH_WATER, &mark.to_le_bytes());
}

/// Another node's high-water mark: tokens issued here stay above it.
struct HighWater;

impl ffi::ClusterReceiver for HighWater {
    fn on_message(payload: &[u8]) {
        let Ok(bytes) = <[u8; 8]>::try_from(payload) else {
            return;
        };
        let mark = u64::from_le_bytes(bytes);
        if mark <= flock_core::MAX_TOKEN {
            server::tokens().observe(mark);
        }
    }
}

/// Whether this node serves the slot of `key` and is not migrating it away.
pub fn serves_stably(ctx: Ctx<'_>, key: &[u8]) -> bool {
    if !enabled() {
        return true;
    }
    let Some(reply) = ffi::call_cluster_nodes(ctx) else {
        return false;
    };
    match reply.text() {
        Some(text) => {
            slot_state(&String::from_utf8_lossy(text), key_slot(key)) == SlotState::Stable
        }
        None => false,
    }
}
