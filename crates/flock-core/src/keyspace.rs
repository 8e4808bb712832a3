//! What becomes of locks when Redis, not a FLOCK command, changes the keyspace or the server:
//! a lock key restored, copied, renamed or moved (keyspace events), and role changes, the end
//! of loading, flushes, SWAPDB and closed connections (server events).
//!
//! The module turns each event into one of the values below and carries out the steps
//! decided here, in order; it decides none of them itself.

use crate::clock::Deadline;
use crate::errors::Fixed;
use crate::state::LockState;

/// How a lock value arrived under a key name.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Arrival {
    /// RESTORE (and MIGRATE, which restores on its target).
    Restored,
    /// COPY's new key.
    Copied,
    /// RENAME's new name.
    Renamed,
    /// MOVE's new database.
    Moved,
}

/// What a keyspace event asks of this server.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct KeyEventPlan {
    /// A lock may have arrived under the event's key: see [`arrive`].
    pub arrival: Option<Arrival>,
    /// Clients waiting for the key's name must have it looked at again right after the
    /// command (it may have been deleted, flushed, renamed away or overwritten: the waiters
    /// are then handed the lock or told why not).
    pub revisit_if_waited: bool,
}

/// The plan for keyspace event `event` (Redis's name for it). Only a master acts: a replica
/// follows its master's effects (G7).
pub fn on_key_event(event: &[u8], master: bool) -> KeyEventPlan {
    if !master {
        return KeyEventPlan {
            arrival: None,
            revisit_if_waited: false,
        };
    }
    let arrival = match event {
        b"restore" => Some(Arrival::Restored),
        b"copy_to" => Some(Arrival::Copied),
        b"rename_to" => Some(Arrival::Renamed),
        b"move_to" => Some(Arrival::Moved),
        _ => None,
    };
    KeyEventPlan {
        arrival,
        revisit_if_waited: true,
    }
}

/// What to do with a lock that arrived, once [`arrive`] has adjusted it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Arrived {
    /// Its bound grants followed the value: the bindings index must find them under the
    /// key's new name (or database).
    pub rebind: bool,
    /// The lock's next deadline: its timer is armed for it anew, replacing any pending one
    /// (and its FLOCK.STATS class is forgotten: it counts for the name it has now).
    pub next: Option<Deadline>,
    /// It holds nothing live and no delayed slot (a COPY that left bound grants out): a
    /// look right after the command deletes it.
    pub look_again: bool,
}

/// Adjust a lock that arrived as `how` on a master. A restored lock's bound grants have no
/// connection in this process: they are not live from now on, so the lock is due at once and
/// its timer ends them and replicates that (G11).
pub fn arrive(state: &mut LockState, how: Arrival) -> Arrived {
    if how == Arrival::Restored {
        state.orphan_bound();
    }
    let next = state.next_deadline();
    Arrived {
        rebind: matches!(how, Arrival::Renamed | Arrival::Moved),
        next,
        look_again: next.is_none(),
    }
}

/// The value COPY makes of a lock: the same grants but the bound ones. A binding lives with
/// one connection and one value (G11); the copy gets its name and timer when it arrives
/// ([`Arrival::Copied`]).
pub fn copy_of(state: &LockState) -> LockState {
    let mut copy = state.clone();
    copy.retain_grants(|g| !g.bound());
    copy
}

/// A change of the server that matters to locks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ServerChange {
    /// The module was loaded (the server is starting, or MODULE LOAD): nothing is loaded yet.
    Started,
    /// A fork child was born (BGSAVE, or an AOF rewrite: a new AOF incr file has begun).
    ForkStarted,
    /// This server became a master (`true`) or a replica.
    RoleChanged { master: bool },
    /// Loading (RDB, AOF, a full sync) ended.
    LoadingEnded,
    /// FLUSHDB (`Some(db)`) or FLUSHALL (`None`) is about to free the values.
    FlushStarting { db: Option<i32> },
    /// A flush is over.
    FlushEnded,
    /// SWAPDB swapped these databases.
    DbsSwapped { first: i32, second: i32 },
    /// A client connection closed.
    ClientClosed { client: u64 },
}

/// One thing the module does about a [`ServerChange`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Step {
    /// Remember the server's role.
    SetMaster(bool),
    /// Read the role from the server (it may have changed while loading).
    RefreshRole,
    /// A master only: raise the token mark past every token the old master (or this server
    /// before its restart) can have issued unheard of, and replicate it
    /// ([`crate::tokens::TokenIssuer::promote`], margin `flock.promotion-margin-ms`), before
    /// any grant.
    RaiseTokenMark,
    /// A master only: send the token mark to replicas and the AOF (`FLOCK.APPLY MARK`), so that
    /// it travels even where no key carries a token (an AOF rewritten after every lock was
    /// released, without an RDB preamble).
    ReplicateTokenMark,
    /// Arm every lock of every database for its next deadline, after ending the bound grants
    /// that have no connection here (a master only: a replica arms nothing).
    ArmAll,
    /// Take the timers of database `Some(db)` (all: `None`) out of the deadline index, while
    /// their values are still live.
    ForgetTimers(Option<i32>),
    /// Unblock every waiter with this error: no grant can come from this server.
    FailAllWaiters(Fixed),
    /// Look again at every key clients wait for.
    RevisitWaited,
    /// After SWAPDB of these two databases: look again at every key clients wait for, and at
    /// the same names in the other database of the pair. Waiters stay with their database's
    /// number while the values change places, so a value kept empty for a waiter (a free key
    /// heading a waiting FLOCK.MACQUIRE's queue, which only the master has) now lies where
    /// nobody waits for it: that look deletes it, else the master would keep a key its
    /// replicas never had (G7, G10).
    RevisitSwapped(i32, i32),
    /// The bindings index follows SWAPDB.
    SwapBindings(i32, i32),
    /// End the bound grants of this connection, from the event loop right after the
    /// disconnection (its waits ended already).
    CloseBoundGrants(u64),
}

/// The steps of a [`ServerChange`], in order.
pub fn consequences(change: ServerChange) -> Vec<Step> {
    match change {
        // Before the first grant: tokens above the old master's, lost ones included.
        // Before anything is loaded: a restart from no file at all, or from an AOF that loads
        // no key (no loading events then), still starts above the clock by the margin.
        // Replicated once loading ends (nothing can be propagated before).
        ServerChange::Started => vec![Step::RaiseTokenMark],
        // The new AOF incr file (a rewrite) begins with the mark; to a replica it is a mark
        // it already has.
        ServerChange::ForkStarted => vec![Step::ReplicateTokenMark],
        ServerChange::RoleChanged { master: true } => vec![
            Step::SetMaster(true),
            Step::RaiseTokenMark,
            Step::ReplicateTokenMark,
            Step::ArmAll,
        ],
        // Redis disconnects blocked clients itself on demotion; none must be left waiting
        // for a grant this server can no longer make. A replica arms nothing (it follows its
        // master's effects), and its values may yet be freed by a full sync without a flush
        // event first.
        ServerChange::RoleChanged { master: false } => vec![
            Step::SetMaster(false),
            Step::FailAllWaiters(Fixed::UnblockedNowReplica),
            Step::ForgetTimers(None),
        ],
        // A restart is a promotion of what was persisted: its last grants may be lost too.
        ServerChange::LoadingEnded => vec![
            Step::RefreshRole,
            Step::RaiseTokenMark,
            Step::ReplicateTokenMark,
            Step::ArmAll,
            Step::RevisitWaited,
        ],
        ServerChange::FlushStarting { db } => vec![Step::ForgetTimers(db)],
        ServerChange::FlushEnded => vec![Step::RevisitWaited],
        ServerChange::DbsSwapped { first, second } => vec![
            Step::SwapBindings(first, second),
            Step::ArmAll,
            Step::RevisitSwapped(first, second),
        ],
        ServerChange::ClientClosed { client } => vec![Step::CloseBoundGrants(client)],
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::clock::Now;
    use crate::state::{Grant, Mode};

    fn now() -> Now {
        Now::new(1_000_000_000, 1_000_000_000)
    }

    fn lock(bound: &[bool]) -> LockState {
        let mut state = LockState::with_grant(Mode::Shared, Grant::new(b"g0", 1, 1000, now()));
        state.retain_grants(|_| false);
        for (i, &b) in bound.iter().enumerate() {
            let mut g = Grant::new(format!("g{i}").as_bytes(), i as u64 + 1, 1000, now());
            g.bind(b.then_some(42));
            state.push_grant(g);
        }
        state
    }

    macro_rules! key_event_cases {
        ($($name:ident: $event:expr, $master:expr => $arrival:expr, $revisit:expr;)*) => {$(
            #[test]
            fn $name() {
                assert_eq!(
                    on_key_event($event, $master),
                    KeyEventPlan { arrival: $arrival, revisit_if_waited: $revisit }
                );
            }
        )*};
    }

    key_event_cases! {
        restore_arrives: b"restore", true => Some(Arrival::Restored), true;
        copy_arrives: b"copy_to", true => Some(Arrival::Copied), true;
        rename_arrives: b"rename_to", true => Some(Arrival::Renamed), true;
        move_arrives: b"move_to", true => Some(Arrival::Moved), true;
        del_only_revisits: b"del", true => None, true;
        rename_from_only_revisits: b"rename_from", true => None, true;
        a_replica_does_nothing: b"restore", false => None, false;
    }

    #[test]
    fn a_restored_lock_loses_its_bound_grants_and_is_due_at_once() {
        // As loaded: the bound mark travels, the connection does not.
        let mut state = lock(&[false, false]);
        let mut g = Grant::new(b"restored", 9, 1000, now());
        g.set_bound_mark(true);
        state.push_grant(g);
        let before = state.next_deadline();
        let arrived = arrive(&mut state, Arrival::Restored);
        assert!(!arrived.rebind);
        assert!(!arrived.look_again);
        assert!(
            arrived.next.is_some_and(|n| Some(n) != before),
            "due at once"
        );
    }

    #[test]
    fn renamed_and_moved_locks_rebind() {
        for how in [Arrival::Renamed, Arrival::Moved] {
            let mut state = lock(&[true]);
            let arrived = arrive(&mut state, how);
            assert!(arrived.rebind, "{how:?}");
            assert_eq!(arrived.next, state.next_deadline());
            assert!(state.grants().iter().all(|g| g.bound_client() == Some(42)));
        }
    }

    #[test]
    fn copy_leaves_bound_grants_out_and_an_empty_copy_is_looked_at() {
        let copy = copy_of(&lock(&[true, false, true]));
        assert_eq!(copy.grants().len(), 1);
        assert!(copy.grants().iter().all(|g| !g.bound()));
        let mut empty = copy_of(&lock(&[true]));
        let arrived = arrive(&mut empty, Arrival::Copied);
        assert!(
            arrived.look_again,
            "nothing left: deleted right after the command"
        );
        assert!(!arrived.rebind);
    }

    macro_rules! server_cases {
        ($($name:ident: $change:expr => [$($step:expr),*];)*) => {$(
            #[test]
            fn $name() {
                assert_eq!(consequences($change), vec![$($step),*]);
            }
        )*};
    }

    server_cases! {
        promotion_raises_the_token_mark_and_arms_every_lock: ServerChange::RoleChanged { master: true }
            => [Step::SetMaster(true), Step::RaiseTokenMark, Step::ReplicateTokenMark, Step::ArmAll];
        a_start_raises_the_token_mark: ServerChange::Started => [Step::RaiseTokenMark];
        a_fork_sends_the_token_mark: ServerChange::ForkStarted => [Step::ReplicateTokenMark];
        demotion_fails_waiters_and_forgets_timers: ServerChange::RoleChanged { master: false }
            => [Step::SetMaster(false), Step::FailAllWaiters(Fixed::UnblockedNowReplica), Step::ForgetTimers(None)];
        loading_ended_arms_and_revisits: ServerChange::LoadingEnded
            => [Step::RefreshRole, Step::RaiseTokenMark, Step::ReplicateTokenMark, Step::ArmAll, Step::RevisitWaited];
        flushdb_forgets_its_timers: ServerChange::FlushStarting { db: Some(3) }
            => [Step::ForgetTimers(Some(3))];
        flushall_forgets_every_timer: ServerChange::FlushStarting { db: None }
            => [Step::ForgetTimers(None)];
        a_flush_revisits_waited_keys: ServerChange::FlushEnded => [Step::RevisitWaited];
        swapdb_swaps_bindings_then_arms: ServerChange::DbsSwapped { first: 0, second: 1 }
            => [Step::SwapBindings(0, 1), Step::ArmAll, Step::RevisitSwapped(0, 1)];
        a_closed_connection_ends_its_bound_grants: ServerChange::ClientClosed { client: 9 }
            => [Step::CloseBoundGrants(9)];
    }
}
