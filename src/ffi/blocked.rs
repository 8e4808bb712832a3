//! Blocked clients: `RedisModule_BlockClient` handles, unblocked once with a value of the
//! handler's own type, which Redis keeps until the handler's reply and free callbacks.

use super::handle::{Ctx, Status};
use redis_module::raw;
use std::marker::PhantomData;
use std::os::raw::{c_int, c_void};
use std::ptr::{self, NonNull};

/// The callbacks of a blocked client, and what it is unblocked with.
pub trait BlockedClientHandler {
    /// What the client is unblocked with (boxed, owned by Redis until [`Self::free`]).
    type Data;
    /// The reply, from the data it was unblocked with (`None`: none).
    fn reply(ctx: Ctx<'_>, data: Option<&mut Self::Data>) -> Status;
    /// CLIENT UNBLOCK (Redis's timeout callback; flock times waiters out itself).
    fn unblocked(ctx: Ctx<'_>) -> Status;
    /// The client went away while blocked.
    fn disconnected(ctx: Ctx<'_>);
    /// Redis is done with the data (after the reply, or without one).
    fn free(data: Box<Self::Data>);
}

/// A blocked client, unblocked exactly once (by [`BlockedClient::unblock`], which consumes
/// it).
pub struct BlockedClient<H: BlockedClientHandler> {
    bc: NonNull<raw::RedisModuleBlockedClient>,
    _handler: PhantomData<fn() -> H>,
}

// SAFETY: the handle is only used on Redis's main thread; it sits in a static registry
// (behind a mutex), which needs it to be `Send`.
unsafe impl<H: BlockedClientHandler> Send for BlockedClient<H> {}

unsafe extern "C" fn on_reply<H: BlockedClientHandler>(
    ctx: *mut raw::RedisModuleCtx,
    _argv: *mut *mut raw::RedisModuleString,
    _argc: c_int,
) -> c_int {
    // SAFETY: the reply callback's live context.
    let Some(ctx) = (unsafe { Ctx::from_raw(ctx) }) else {
        return raw::REDISMODULE_ERR as c_int;
    };
    // SAFETY: the private data is the `H::Data` boxed by `unblock` (or null), owned by Redis
    // until `free_data`; nothing else touches it while its reply is made.
    let d = unsafe { api!(RedisModule_GetBlockedClientPrivateData, ptr::null_mut(); ctx.ptr()) }
        .cast::<H::Data>();
    // SAFETY: as above.
    H::reply(ctx, unsafe { d.as_mut() }).0
}

unsafe extern "C" fn on_unblocked<H: BlockedClientHandler>(
    ctx: *mut raw::RedisModuleCtx,
    _argv: *mut *mut raw::RedisModuleString,
    _argc: c_int,
) -> c_int {
    // SAFETY: the callback's live context.
    match unsafe { Ctx::from_raw(ctx) } {
        Some(ctx) => H::unblocked(ctx).0,
        None => raw::REDISMODULE_ERR as c_int,
    }
}

unsafe extern "C" fn on_disconnect<H: BlockedClientHandler>(
    ctx: *mut raw::RedisModuleCtx,
    _bc: *mut raw::RedisModuleBlockedClient,
) {
    // SAFETY: the callback's live context.
    if let Some(ctx) = unsafe { Ctx::from_raw(ctx) } {
        H::disconnected(ctx);
    }
}

unsafe extern "C" fn free_data<H: BlockedClientHandler>(
    _ctx: *mut raw::RedisModuleCtx,
    privdata: *mut c_void,
) {
    if privdata.is_null() {
        return;
    }
    // SAFETY: Redis hands back, once, the `H::Data` boxed by `unblock`.
    H::free(unsafe { Box::from_raw(privdata.cast::<H::Data>()) });
}

impl<H: BlockedClientHandler> BlockedClient<H> {
    /// Block the client of `ctx` (a command context that may block: not in MULTI or a
    /// script), with no Redis timeout and a disconnect callback. `None`: Redis refused.
    pub fn block(ctx: Ctx<'_>) -> Option<BlockedClient<H>> {
        // SAFETY: a live command context; the callbacks are plain functions of this file.
        let bc = unsafe {
            api!(RedisModule_BlockClient, ptr::null_mut();
                ctx.ptr(),
                Some(on_reply::<H>),
                Some(on_unblocked::<H>),
                Some(free_data::<H>),
                0
            )
        };
        let bc = NonNull::new(bc)?;
        // SAFETY: the handle made above, not yet unblocked.
        unsafe {
            api!(RedisModule_SetDisconnectCallback, (); bc.as_ptr(), Some(on_disconnect::<H>))
        };
        Some(BlockedClient {
            bc,
            _handler: PhantomData,
        })
    }

    /// Unblock the client with `data` (Redis owns it from now on and hands it to
    /// `H::reply`, then to `H::free`). Consumes the handle: it is never touched again.
    pub fn unblock(self, data: Option<H::Data>) {
        let data = data.map_or(ptr::null_mut(), |d| {
            Box::into_raw(Box::new(d)).cast::<c_void>()
        });
        // SAFETY: `bc` is a handle from BlockClient not unblocked before (this consumes it).
        unsafe { api!(RedisModule_UnblockClient, 0; self.bc.as_ptr(), data) };
    }
}
