//! Valkey 9's atomic slot migration (`CLUSTER MIGRATESLOTS`): what each of its server events
//! asks of flock, and whether the server may be told that flock handles it at all.
//!
//! How Valkey moves a slot (its `cluster_migrateslots.c`): the source forks and sends the
//! slot's keys as an AOF-style snapshot (the type's AOF rewrite: `FLOCK.APPLY` per lock), then
//! streams what it propagates for those slots (the same effects replicas get), pauses writes,
//! and hands the slots over; the target then owns them, and the source deletes their keys.
//! While it imports, the target holds keys it does not serve yet; an import that fails is
//! undone by deleting them. The module learns each step from a server event, carries out the
//! steps below, and decides none of them itself.

use crate::errors::Fixed;
use crate::slots::key_slot;

/// The option bit Valkey 9 reads as "this module handles atomic slot migration"
/// (`VALKEYMODULE_OPTIONS_HANDLE_ATOMIC_SLOT_MIGRATION`). Redis has no such option: there
/// the bit is unassigned (7.x) or may mean something else (8.x), so it is declared only to
/// Valkey 9 and later ([`declares_atomic_slot_migration`]).
pub const OPTION_HANDLE_ATOMIC_SLOT_MIGRATION: i32 = 1 << 5;

/// Valkey's server event of atomic slot migration (`VALKEYMODULE_EVENT_ATOMIC_SLOT_MIGRATION`).
pub const EVENT_ATOMIC_SLOT_MIGRATION: u64 = 19;

/// Whether to declare [`OPTION_HANDLE_ATOMIC_SLOT_MIGRATION`] and follow the migration
/// events: only on Valkey (INFO's `server_name`) 9.0 or later (`RedisModule_GetServerVersion`,
/// `0x00MMmmpp`). Valkey 8.1 has neither the option nor the event; on Redis the bit is not
/// Valkey's.
pub fn declares_atomic_slot_migration(server_name: Option<&str>, version: i32) -> bool {
    server_name == Some("valkey") && version >= 0x09_00_00
}

/// A subevent of [`EVENT_ATOMIC_SLOT_MIGRATION`] (numbered as Valkey numbers them).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SlotMove {
    /// This node (the target) starts receiving the slots.
    ImportStarted,
    /// This node (the source) starts sending them.
    ExportStarted,
    /// The import failed or was cancelled; the server deleted what had arrived.
    ImportAborted,
    /// The export failed or was cancelled; the slots stay here, keys and all.
    ExportAborted,
    /// This node owns the slots now.
    ImportCompleted,
    /// The target owns the slots now; the server deletes their keys here.
    ExportCompleted,
}

impl SlotMove {
    /// The subevent's number (`None`: one this version does not know).
    pub fn from_subevent(sub: u64) -> Option<SlotMove> {
        Some(match sub {
            0 => SlotMove::ImportStarted,
            1 => SlotMove::ExportStarted,
            2 => SlotMove::ImportAborted,
            3 => SlotMove::ExportAborted,
            4 => SlotMove::ImportCompleted,
            5 => SlotMove::ExportCompleted,
            _ => return None,
        })
    }
}

/// One thing the module does about a [`SlotMove`], for the slots the event names.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MoveStep {
    /// Locks arriving in these slots are the source's until the import completes: no timer is
    /// armed for them and none of their deadlines is acted on here (the source's effects end
    /// them; an expiry of ours would race the source's renewals).
    HoldImports,
    /// The slots are no longer being imported.
    EndImports,
    /// A master: every lock of these slots arrived as by RESTORE: its bound grants have no
    /// connection here and end at once (G11), and it is armed for its next deadline, replacing
    /// any entry it had. The tokens they carry raised the mark as they arrived (G3); the mark
    /// goes to replicas and the AOF too.
    ArmArrived,
    /// Build and send the effects of every change even when no replica, AOF or backlog
    /// consumes them: the export streams the slots' effects to the target.
    StreamEffects,
    /// The export is over: effects are built only when something consumes them again.
    EndStreamEffects,
    /// These slots' keys are not this node's any more (the server deletes them next): no
    /// deadline of theirs is acted on (a grant made or ended here from now on would be a
    /// second copy of the lock's history).
    ForgetDeadlines,
    /// Their waiters are told this error now, before anything here could grant them: the
    /// target serves their keys, where a retry goes.
    FailWaiters(Fixed),
    /// Their watchers are told this error now (the target serves their keys).
    FailWatchers(Fixed),
}

/// The steps of `m` on a master (`true`) or a replica, in order. A replica follows its
/// master's effects: it arms nothing and holds no waiter of a slot its master gives away
/// (Valkey fires these events on replicas only for the imports their master streams).
pub fn on_slot_move(m: SlotMove, master: bool) -> Vec<MoveStep> {
    match (m, master) {
        (SlotMove::ImportStarted, _) => vec![MoveStep::HoldImports],
        (SlotMove::ImportAborted, _) => vec![MoveStep::EndImports],
        (SlotMove::ImportCompleted, true) => vec![MoveStep::EndImports, MoveStep::ArmArrived],
        (SlotMove::ImportCompleted, false) => vec![MoveStep::EndImports],
        (SlotMove::ExportStarted, true) => vec![MoveStep::StreamEffects],
        // Nothing left: the keys stay, with their timers, waiters and watchers.
        (SlotMove::ExportAborted, true) => vec![MoveStep::EndStreamEffects],
        (SlotMove::ExportCompleted, true) => vec![
            MoveStep::EndStreamEffects,
            MoveStep::ForgetDeadlines,
            MoveStep::FailWaiters(Fixed::WaitedKeyMoved),
            MoveStep::FailWatchers(Fixed::WaitedKeyMoved),
        ],
        (SlotMove::ExportStarted | SlotMove::ExportAborted | SlotMove::ExportCompleted, false) => {
            vec![]
        }
    }
}

/// Slot ranges (inclusive), as the event names them.
pub type SlotRanges = [(u16, u16)];

/// Whether `key` hashes into one of `ranges`.
pub fn key_in(ranges: &SlotRanges, key: &[u8]) -> bool {
    let slot = key_slot(key);
    ranges.iter().any(|&(lo, hi)| (lo..=hi).contains(&slot))
}

/// Slot ranges from the event's `(start, end)` pairs as the server passed them: pairs out of
/// the slot space or reversed are left out (never trusted to index anything).
pub fn ranges_of(pairs: impl IntoIterator<Item = (i64, i64)>) -> Vec<(u16, u16)> {
    pairs
        .into_iter()
        .filter_map(|(lo, hi)| {
            let lo = u16::try_from(lo).ok().filter(|s| *s < 16384)?;
            let hi = u16::try_from(hi).ok().filter(|s| *s < 16384)?;
            (lo <= hi).then_some((lo, hi))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    macro_rules! declare_cases {
        ($($name:ident: $server:expr, $version:expr => $want:expr;)*) => {$(
            #[test]
            fn $name() {
                assert_eq!(declares_atomic_slot_migration($server, $version), $want);
            }
        )*};
    }

    declare_cases! {
        valkey_9_0_declares: Some("valkey"), 0x09_00_00 => true;
        valkey_9_1_2_declares: Some("valkey"), 0x09_01_02 => true;
        valkey_8_1_does_not: Some("valkey"), 0x08_01_04 => false;
        redis_7_0_does_not: None, 0x07_00_0f => false;
        redis_8_4_does_not: Some("redis"), 0x08_04_00 => false;
        a_redis_9_would_not: None, 0x09_00_00 => false;
    }

    macro_rules! move_cases {
        ($($name:ident: $m:expr, $master:expr => [$($step:expr),*];)*) => {$(
            #[test]
            fn $name() {
                assert_eq!(on_slot_move($m, $master), vec![$($step),*]);
            }
        )*};
    }

    move_cases! {
        an_import_holds_its_keys: SlotMove::ImportStarted, true => [MoveStep::HoldImports];
        a_replica_of_the_target_holds_them_too: SlotMove::ImportStarted, false => [MoveStep::HoldImports];
        an_aborted_import_ends_the_hold: SlotMove::ImportAborted, true => [MoveStep::EndImports];
        a_completed_import_arms_what_arrived: SlotMove::ImportCompleted, true
            => [MoveStep::EndImports, MoveStep::ArmArrived];
        a_replica_arms_nothing: SlotMove::ImportCompleted, false => [MoveStep::EndImports];
        an_export_streams_effects: SlotMove::ExportStarted, true => [MoveStep::StreamEffects];
        an_aborted_export_keeps_everything: SlotMove::ExportAborted, true => [MoveStep::EndStreamEffects];
        a_completed_export_lets_the_keys_go: SlotMove::ExportCompleted, true
            => [
                MoveStep::EndStreamEffects,
                MoveStep::ForgetDeadlines,
                MoveStep::FailWaiters(Fixed::WaitedKeyMoved),
                MoveStep::FailWatchers(Fixed::WaitedKeyMoved)
            ];
        a_replica_of_the_source_waits_for_its_masters_deletes: SlotMove::ExportCompleted, false => [];
        a_replica_streams_nothing: SlotMove::ExportStarted, false => [];
    }

    #[test]
    fn subevents_are_numbered_as_valkey_numbers_them() {
        let all = [
            SlotMove::ImportStarted,
            SlotMove::ExportStarted,
            SlotMove::ImportAborted,
            SlotMove::ExportAborted,
            SlotMove::ImportCompleted,
            SlotMove::ExportCompleted,
        ];
        for (n, m) in all.into_iter().enumerate() {
            assert_eq!(SlotMove::from_subevent(n as u64), Some(m));
        }
        assert_eq!(SlotMove::from_subevent(6), None);
    }

    #[test]
    fn keys_are_found_in_their_slot_ranges() {
        // CLUSTER KEYSLOT foo = 12182, bar = 5061.
        let ranges = [(5000, 5100), (12182, 12182)];
        assert!(key_in(&ranges, b"foo"));
        assert!(key_in(&ranges, b"bar"));
        assert!(key_in(&ranges, b"{bar}:lock"));
        assert!(!key_in(&ranges, b"123456789"), "slot 12739");
        assert!(!key_in(&[], b"foo"));
    }

    #[test]
    fn ranges_out_of_the_slot_space_are_left_out() {
        assert_eq!(
            ranges_of([(0, 10), (20, 5), (-1, 3), (16383, 16383), (16000, 16384)]),
            vec![(0, 10), (16383, 16383)]
        );
    }
}
