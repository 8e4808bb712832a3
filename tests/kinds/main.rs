//! Lock kinds end to end (issue #13, SPEC "Lock kinds", "Token-qualified calls"): exclusive,
//! SHARED (read/write locks) and LIMIT n (semaphores whose every permit has its own owner,
//! lease and token) against real servers: one FIFO queue for all kinds, owners unique per
//! key (G4, a second wait replaces the first), the key's limit and its error texts, option
//! syntax, flock.max-holders, per-slot lock-delay, HOLDERS and INFO, token-qualified calls,
//! FENCED read-only under a shared token (G5), persistence (RDB v2, AOF, rewrite, DEBUG
//! RELOAD, DUMP/RESTORE, COPY, the v1 fixtures), replication and promotion (G7), cluster slot
//! migration, keyspace events and INFO counters per grant, ACL, and no residue (G10).
//!
//! Waiters are threads with their own connection; the order they queue in is fixed by
//! waiting until the server counts each one blocked before the next one is sent.
//!
//! One test binary (a binary per file would link once each), one module per concern;
//! `helpers` is what they share.

mod events;
mod helpers;
mod holders_info;
mod keyspace;
mod leaving;
mod memory;
mod model;
mod persistence;
mod queue;
mod replication;
mod tokens;
