//! Calling commands from the module (`RedisModule_Call`), and asking the server which
//! arguments of a command are keys (getkeys-api).

use super::command_info::KeyFlags;
use super::handle::{Ctx, RStr, Status};
use redis_module::raw;
use std::ffi::CStr;
use std::os::raw::c_int;
use std::ptr::{self, NonNull};

/// A command's reply, freed on drop.
pub struct CallReply(NonNull<raw::RedisModuleCallReply>);

impl CallReply {
    /// Whether the reply is an error.
    pub fn is_error(&self) -> bool {
        // SAFETY: the live reply.
        let t = unsafe { api!(RedisModule_CallReplyType, 0; self.0.as_ptr()) };
        t == raw::REDISMODULE_REPLY_ERROR as c_int
    }

    /// The text of a string, status or error reply.
    pub fn text(&self) -> Option<&[u8]> {
        let mut len = 0usize;
        // SAFETY: the live reply; the pointer is valid while the reply lives (the borrow).
        let p =
            unsafe { api!(RedisModule_CallReplyStringPtr, ptr::null(); self.0.as_ptr(), &mut len) };
        if p.is_null() {
            return None;
        }
        // SAFETY: `len` bytes at `p`, owned by the live reply.
        Some(unsafe { std::slice::from_raw_parts(p.cast::<u8>(), len) })
    }

    /// Pass the reply on to the client of `ctx` (then free it).
    pub fn reply_to(self, ctx: Ctx<'_>) -> Status {
        // SAFETY: a live command context and reply (freed on drop, once).
        Status(unsafe { api!(RedisModule_ReplyWithCallReply, 0; ctx.ptr(), self.0.as_ptr()) })
    }
}

impl Drop for CallReply {
    fn drop(&mut self) {
        // SAFETY: the reply RedisModule_Call made, freed once.
        unsafe { api!(RedisModule_FreeCallReply, (); self.0.as_ptr()) };
    }
}

/// `CLUSTER NODES`.
pub fn call_cluster_nodes(ctx: Ctx<'_>) -> Option<CallReply> {
    // SAFETY: a live context; "c" takes one C string, NUL-terminated.
    let reply = unsafe {
        api!(RedisModule_Call, ptr::null_mut(); ctx.ptr(), c"CLUSTER".as_ptr(), c"c".as_ptr(), c"NODES".as_ptr())
    };
    NonNull::new(reply).map(CallReply)
}

/// Call command `name` with the arguments `args`, with the call flags `flags`, which end in
/// the format `v` (the argument vector) and hold nothing but flags before it. `None`: the
/// call was refused (errno says why) or the flags are not such.
pub fn call_argv(ctx: Ctx<'_>, name: &CStr, flags: &CStr, args: &[RStr<'_>]) -> Option<CallReply> {
    let Some((b'v', only_flags)) = flags.to_bytes().split_last() else {
        return None;
    };
    if !only_flags.iter().all(|b| b"!ACDEKMRSTWX03".contains(b)) {
        return None;
    }
    // SAFETY: a live command context; `name` is NUL-terminated; the format's one `v` takes
    // the vector of `args.len()` string handles (live during the call; Redis only reads
    // them); `RStr` is a transparent string pointer.
    let reply = unsafe {
        api!(RedisModule_Call, ptr::null_mut();
            ctx.ptr(),
            name.as_ptr(),
            flags.as_ptr(),
            args.as_ptr().cast::<*mut raw::RedisModuleString>().cast_mut(),
            args.len()
        )
    };
    NonNull::new(reply).map(CallReply)
}

/// An array of key positions (and their flags) the server allocated for us, freed on drop.
pub struct KeyPositions {
    positions: NonNull<c_int>,
    flags: *mut c_int,
    n: usize,
}

impl KeyPositions {
    /// Each key's position in the argument vector given, and its flags when asked for them.
    pub fn iter(&self) -> impl Iterator<Item = (c_int, Option<KeyFlags>)> + '_ {
        (0..self.n).map(|i| {
            // SAFETY: Redis returned arrays of `n` positions and flags (freed on drop).
            let pos = unsafe { *self.positions.as_ptr().add(i) };
            let flags = if self.flags.is_null() {
                None
            } else {
                // SAFETY: as above.
                Some(KeyFlags(unsafe { *self.flags.add(i) } as u32))
            };
            (pos, flags)
        })
    }
}

impl Drop for KeyPositions {
    fn drop(&mut self) {
        // SAFETY: the arrays Redis allocated for us, each freed once.
        unsafe {
            api!(RedisModule_Free, (); self.positions.as_ptr().cast());
            if !self.flags.is_null() {
                api!(RedisModule_Free, (); self.flags.cast());
            }
        }
    }
}

/// The key positions of the command `args` (from its name on).
pub fn command_keys(ctx: Ctx<'_>, args: &[RStr<'_>]) -> Option<KeyPositions> {
    let mut n: c_int = 0;
    // SAFETY: a live command context; `args` holds the command's argument handles (Redis
    // only reads them).
    let positions = unsafe {
        api!(RedisModule_GetCommandKeys, ptr::null_mut();
            ctx.ptr(), args.as_ptr().cast::<*mut raw::RedisModuleString>().cast_mut(), args.len() as c_int, &mut n)
    };
    Some(KeyPositions {
        positions: NonNull::new(positions)?,
        flags: ptr::null_mut(),
        n: n.max(0) as usize,
    })
}

/// [`command_keys`] with each key's flags.
pub fn command_keys_with_flags(ctx: Ctx<'_>, args: &[RStr<'_>]) -> Option<KeyPositions> {
    let mut n: c_int = 0;
    let mut flags: *mut c_int = ptr::null_mut();
    // SAFETY: as in `command_keys`; Redis fills `n`, and `flags` with an array it allocates
    // (freed on drop).
    let positions = unsafe {
        api!(RedisModule_GetCommandKeysWithFlags, ptr::null_mut();
            ctx.ptr(), args.as_ptr().cast::<*mut raw::RedisModuleString>().cast_mut(), args.len() as c_int, &mut n, &mut flags)
    };
    Some(KeyPositions {
        positions: NonNull::new(positions)?,
        flags,
        n: n.max(0) as usize,
    })
}

/// The context of a keys-position request (a getkeys-api command asked where its keys are).
#[derive(Clone, Copy)]
pub struct KeysRequest<'a>(pub(in crate::ffi) Ctx<'a>);

impl<'a> KeysRequest<'a> {
    /// The context (to ask the server about the inner command's keys).
    pub fn ctx(self) -> Ctx<'a> {
        self.0
    }

    /// The argument at `pos` is a key, used as `flags` say. The caller keeps `pos` inside
    /// the argument vector (servers index it with the position).
    pub fn key_at(self, pos: c_int, flags: KeyFlags) {
        // SAFETY: the live context of a keys-position request.
        unsafe { api!(RedisModule_KeyAtPosWithFlags, (); self.0.ptr(), pos, flags.0 as c_int) };
    }
}
