//! Loading and registration: `RedisModule_OnLoad` (the `redis_module!` macro), commands and
//! subcommands, the INFO section, module configs, the cluster bus, and SCAN.
//!
//! OnLoad runs the module's init through [`OnLoad`], which the crate root names for it (so
//! this folder names nothing above it); every other callback is handed in by the
//! registration as a type parameter of the functions below.

use super::call::KeysRequest;
use super::handle::{argv_slice, Ctx, RStr, Status};
use super::key::Key;
use redis_module::{raw, Context, RedisString};
use std::ffi::CStr;
use std::mem::ManuallyDrop;
use std::os::raw::{c_char, c_int, c_uchar, c_void};
use std::ptr::{self, NonNull};

/// What `RedisModule_OnLoad` runs: the module's init (`Err` refuses to load, the reason is
/// in the log). The crate root names it (`lib.rs` holds the `redis_module!` entry point), so
/// nothing in this folder names the layers above it.
pub trait OnLoad {
    fn init(ctx: Ctx<'_>, load: &Context, args: &[RedisString]) -> Result<(), ()>;
}

/// `RedisModule_OnLoad`'s body, for the `redis_module!` entry point: the init of `M` on the
/// load context as a safe handle.
pub fn on_load<M: OnLoad>(load: &Context, args: &[RedisString]) -> redis_module::Status {
    // SAFETY: the init context Redis passed to OnLoad, live while it runs.
    let Some(ctx) = (unsafe { Ctx::from_raw(load.ctx) }) else {
        return redis_module::Status::Err;
    };
    match M::init(ctx, load, args) {
        Ok(()) => redis_module::Status::Ok,
        Err(()) => redis_module::Status::Err,
    }
}

/// The module's options: Redis flags RDB read errors rather than abort (`RdbReader` checks the
/// flag), and a replica may load a full sync asynchronously (`repl-diskless-load swapdb`,
/// serving reads from its old data meanwhile). The latter holds because on a replica nothing
/// the module keeps beside the keys points into them: no timer is armed, nobody waits, no
/// binding is kept (see tests/async_load.rs), and the token mark only grows. `extra`: further
/// option bits the caller decided this server has (Valkey 9's atomic slot migration); the
/// crate's bindings predate them, so they go in as raw bits.
pub fn set_options(load: &Context, extra: c_int) {
    let known = raw::ModuleOptions::HANDLE_IO_ERRORS | raw::ModuleOptions::HANDLE_REPL_ASYNC_LOAD;
    // SAFETY: the OnLoad context; the server reads the whole mask once (it replaces any
    // earlier one), and a server without a bit's meaning never sees it (the caller's check).
    unsafe { api!(RedisModule_SetModuleOptions, (); load.ctx, known.bits() | extra) };
}

/// Apply redis.conf's lines for the registered configs; false when one was refused.
pub fn load_configs(ctx: Ctx<'_>) -> bool {
    // SAFETY: the function pointer comes from the server (None on servers without module
    // configs, which flock's minimum version always has); ctx is the OnLoad context.
    match unsafe { raw::RedisModule_LoadConfigs } {
        Some(load_configs) => {
            // SAFETY: as above.
            unsafe { load_configs(ctx.ptr()) == raw::REDISMODULE_OK as i32 }
        }
        None => true,
    }
}

// ---- commands ----

/// A command handler.
pub trait Command {
    /// The command is flagged `getkeys-api`: it answers keys-position requests ([`Self::keys`]).
    const GETKEYS: bool = false;
    fn run(ctx: Ctx<'_>, args: &[RStr<'_>]) -> Status;
    /// Report which arguments are keys.
    fn keys(_req: KeysRequest<'_>, _args: &[RStr<'_>]) {}
}

unsafe extern "C" fn run<H: Command>(
    ctx: *mut raw::RedisModuleCtx,
    argv: *mut *mut raw::RedisModuleString,
    argc: c_int,
) -> c_int {
    // SAFETY: the live context of this command.
    let Some(ctx) = (unsafe { Ctx::from_raw(ctx) }) else {
        return raw::REDISMODULE_ERR as c_int;
    };
    // SAFETY: Redis passes `argc` argument strings that live while the command runs.
    let args = unsafe { argv_slice(argv, argc) };
    // SAFETY: the live context of this command.
    if H::GETKEYS && unsafe { api!(RedisModule_IsKeysPositionRequest, 0; ctx.ptr()) } != 0 {
        H::keys(KeysRequest(ctx), args);
        return raw::REDISMODULE_OK as c_int;
    }
    H::run(ctx, args).0
}

/// Register command `name` (with `flags` and the legacy key range) run by `H`.
pub fn create_command<H: Command>(
    ctx: Ctx<'_>,
    name: &CStr,
    flags: &CStr,
    keys: (c_int, c_int, c_int),
) -> bool {
    // SAFETY: the init context; name and flags are NUL-terminated; the handler is a plain
    // function.
    let ok = unsafe {
        api!(RedisModule_CreateCommand, raw::REDISMODULE_ERR as c_int;
            ctx.ptr(), name.as_ptr(), Some(run::<H>), flags.as_ptr(), keys.0, keys.1, keys.2)
    };
    ok == raw::REDISMODULE_OK as c_int
}

/// A command that only holds subcommands.
#[derive(Clone, Copy)]
pub struct Container<'a>(
    NonNull<raw::RedisModuleCommand>,
    std::marker::PhantomData<&'a ()>,
);

/// Register `name` as a container of subcommands (no handler: Redis answers for a missing or
/// unknown subcommand).
pub fn create_container<'a>(ctx: Ctx<'a>, name: &CStr) -> Option<Container<'a>> {
    // SAFETY: the init context; the name and flags are NUL-terminated; no handler.
    let made = unsafe {
        api!(RedisModule_CreateCommand, raw::REDISMODULE_ERR as c_int;
            ctx.ptr(), name.as_ptr(), None, c"".as_ptr(), 0, 0, 0)
    };
    // SAFETY: as above; the command was just created in this context.
    let parent = unsafe { api!(RedisModule_GetCommand, ptr::null_mut(); ctx.ptr(), name.as_ptr()) };
    if made != raw::REDISMODULE_OK as c_int {
        return None;
    }
    NonNull::new(parent).map(|p| Container(p, std::marker::PhantomData))
}

/// Register subcommand `name` of `parent`, run by `H`.
pub fn create_subcommand<H: Command>(parent: Container<'_>, name: &CStr, flags: &CStr) -> bool {
    // SAFETY: `parent` is a container created in this OnLoad; names and flags NUL-terminated.
    let ok = unsafe {
        api!(RedisModule_CreateSubcommand, raw::REDISMODULE_ERR as c_int;
            parent.0.as_ptr(), name.as_ptr(), Some(run::<H>), flags.as_ptr(), 0, 0, 0)
    };
    ok == raw::REDISMODULE_OK as c_int
}

// ---- INFO ----

/// The INFO section's fields.
pub trait InfoHandler {
    fn info(info: &InfoCtx<'_>);
}

/// The context of an INFO callback.
pub struct InfoCtx<'a>(
    NonNull<raw::RedisModuleInfoCtx>,
    std::marker::PhantomData<&'a ()>,
);

impl InfoCtx<'_> {
    /// Start the section (`""`: the module's own, named after it).
    pub fn add_section(&self, name: &CStr) {
        // SAFETY: the INFO context Redis passed; the name is NUL-terminated.
        unsafe { api!(RedisModule_InfoAddSection, 0; self.0.as_ptr(), name.as_ptr()) };
    }

    pub fn add_field_u64(&self, name: &CStr, value: u64) {
        // SAFETY: as above.
        unsafe {
            api!(RedisModule_InfoAddFieldULongLong, 0; self.0.as_ptr(), name.as_ptr() as *const c_char, value)
        };
    }
}

unsafe extern "C" fn info<H: InfoHandler>(
    ctx: *mut raw::RedisModuleInfoCtx,
    _for_crash_report: i32,
) {
    if let Some(ctx) = NonNull::new(ctx) {
        H::info(&InfoCtx(ctx, std::marker::PhantomData));
    }
}

/// Register `H` as the module's INFO section.
pub fn register_info<H: InfoHandler>(ctx: Ctx<'_>) {
    // SAFETY: the init context; `info` is a plain function of this file.
    unsafe { api!(RedisModule_RegisterInfoFunc, 0; ctx.ptr(), Some(info::<H>)) };
}

// ---- the cluster bus ----

/// What a module message of the cluster bus does.
pub trait ClusterReceiver {
    fn on_message(payload: &[u8]);
}

unsafe extern "C" fn on_cluster_message<H: ClusterReceiver>(
    _ctx: *mut raw::RedisModuleCtx,
    _sender: *const c_char,
    _type: u8,
    payload: *const c_uchar,
    len: u32,
) {
    if payload.is_null() {
        return;
    }
    // SAFETY: Redis passes a payload of `len` bytes, valid during the callback.
    H::on_message(unsafe { std::slice::from_raw_parts(payload, len as usize) });
}

/// Receive the cluster bus messages of type `msg_type` with `H`.
pub fn register_cluster_receiver<H: ClusterReceiver>(ctx: Ctx<'_>, msg_type: u8) {
    // SAFETY: the init context; the receiver is a plain function of this file.
    unsafe {
        api!(RedisModule_RegisterClusterMessageReceiver, ();
            ctx.ptr(), msg_type, Some(on_cluster_message::<H>))
    };
}

/// Send `payload` as a message of type `msg_type` to every node.
pub fn send_cluster_message(ctx: Ctx<'_>, msg_type: u8, payload: &[u8]) {
    // SAFETY: a live context; a null target broadcasts; Redis copies the bytes.
    unsafe {
        api!(RedisModule_SendClusterMessage, 0;
            ctx.ptr(), ptr::null(), msg_type, payload.as_ptr().cast::<c_char>(), payload.len() as u32)
    };
}

// ---- SCAN ----

unsafe extern "C" fn scanned<F: FnMut(Ctx<'_>, RStr<'_>, &mut Key)>(
    ctx: *mut raw::RedisModuleCtx,
    keyname: *mut raw::RedisModuleString,
    key: *mut raw::RedisModuleKey,
    data: *mut c_void,
) {
    if key.is_null() {
        return;
    }
    // SAFETY: Redis passes the live context and key name of this callback.
    let (Some(ctx), Some(keyname)) = (unsafe { Ctx::from_raw(ctx) }, unsafe {
        RStr::from_raw(keyname)
    }) else {
        return;
    };
    // SAFETY: `data` is the closure `scan_db` passed, alive during the scan and touched by
    // nothing else meanwhile.
    let Some(f) = (unsafe { data.cast::<F>().as_mut() }) else {
        return;
    };
    // Redis passes a key handle valid during this callback; it is Redis's to close.
    let mut key = ManuallyDrop::new(Key { ptr: key });
    f(ctx, keyname, &mut key);
}

/// Call `f` on every key of the database selected in `ctx` (its name and the key, open for
/// reading); false when no scan could start.
pub fn scan_db<F: FnMut(Ctx<'_>, RStr<'_>, &mut Key)>(ctx: Ctx<'_>, mut f: F) -> bool {
    // SAFETY: takes no arguments; the cursor is destroyed below.
    let cursor = unsafe { api!(RedisModule_ScanCursorCreate, ptr::null_mut();) };
    if cursor.is_null() {
        return false;
    }
    let data: *mut F = &mut f;
    // SAFETY: a live context and cursor; `scanned` only touches the key it is given and the
    // closure `data` points to, which outlives the scan.
    while unsafe { api!(RedisModule_Scan, 0; ctx.ptr(), cursor, Some(scanned::<F>), data.cast()) }
        != 0
    {}
    // SAFETY: created above, destroyed once.
    unsafe { api!(RedisModule_ScanCursorDestroy, (); cursor) };
    true
}
