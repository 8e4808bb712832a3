//! The locks compared: flock's commands and the baselines people build from plain Redis today
//! (SET NX PX, the Lua compare-and-delete release, a Lua fenced acquire and write), as the
//! commands each scenario pipelines.

use crate::conn::*;

/// Release: delete the key only when it still holds our owner (the Redis docs' recipe).
pub(crate) const CAD: &str = "if redis.call('get', KEYS[1]) == ARGV[1] then return redis.call('del', KEYS[1]) else return 0 end";
/// Fenced acquire: SET NX PX plus INCR of a per-lock token key.
pub(crate) const FENCE_ACQ: &str = "if redis.call('set', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then return redis.call('incr', KEYS[2]) else return false end";
/// Fenced write: compare the live token kept in a key, then write.
pub(crate) const FENCE_WRITE: &str = "if redis.call('get', KEYS[1]) == ARGV[1] then return redis.call('set', KEYS[2], ARGV[2]) else return redis.error_reply('FENCED stale token') end";

pub(crate) const TTL: &str = "60000";
pub(crate) const LONG_TTL: &str = "3600000";

/// Whether the server has Valkey's owner-checked delete, `DELIFEQ key value` (Valkey 9):
/// then it is the release a Valkey user would pick, and the bench measures RELEASE against it
/// too. `COMMAND INFO` answers an unknown command with a nil entry.
pub(crate) fn has_delifeq(c: &mut Conn) -> bool {
    match c.call(&["COMMAND", "INFO", "DELIFEQ"]) {
        flock_testkit::Reply::Array(v) => v
            .first()
            .is_some_and(|e| !matches!(e, flock_testkit::Reply::Nil)),
        _ => false,
    }
}

pub(crate) fn lock_key(i: usize) -> String {
    format!("lock:{i:07}")
}

#[derive(Clone, Copy, PartialEq)]
pub(crate) enum Kind {
    Flock,
    SetNx,
    LuaFenced,
}

pub(crate) fn push_acquire(c: &mut Conn, kind: Kind, key: &str, owner: &str, facq: &str) {
    match kind {
        Kind::Flock => c.push(&["FLOCK.ACQUIRE", key, owner, TTL]),
        Kind::SetNx => c.push(&["SET", key, owner, "NX", "PX", TTL]),
        Kind::LuaFenced => c.push(&["EVALSHA", facq, "2", key, &format!("{key}:tok"), owner, TTL]),
    }
}

pub(crate) fn push_release(c: &mut Conn, kind: Kind, key: &str, owner: &str, cad: &str) {
    match kind {
        Kind::Flock => c.push(&["FLOCK.RELEASE", key, owner]),
        _ => c.push(&["EVALSHA", cad, "1", key, owner]),
    }
}

/// A fenced write (`SET data:NNNNNNN v`) under the lock `wlk` held with token `tok`: through
/// FLOCK.FENCED, or, given the Lua fenced-write script's sha, with the token kept in `wlk:tok`.
pub(crate) fn push_fenced_write(c: &mut Conn, lua_sha: Option<&str>, i: usize, tok: &str) {
    let data = format!("data:{i:07}");
    match lua_sha {
        None => c.push(&["FLOCK.FENCED", "wlk", tok, "SET", &data, "v"]),
        Some(sha) => c.push(&["EVALSHA", sha, "2", "wlk:tok", &data, tok, "v"]),
    }
}
