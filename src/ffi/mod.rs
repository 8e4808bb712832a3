//! The Redis module API, fenced in: the only code of the crate that is `unsafe` (`lib.rs`
//! denies it everywhere else), and the only code that names `redis_module::raw`.
//!
//! Everything here turns the C API into safe Rust for the layers above: handles with
//! lifetimes ([`Ctx`], [`RStr`]) instead of raw pointers, safe decodings of what Redis passes
//! (context flags, server events, key flags), RAII for what must be freed (strings, call
//! replies, key positions), and, for every callback Redis calls (commands, timers, events,
//! blocked clients, the data type, INFO, the cluster bus, SCAN), a thin generic trampoline
//! that converts the raw arguments and calls a safe function of the layer that registered it.
//! Those handlers come in as type parameters (`create_timer::<T>`, `create_command::<H>`...),
//! so this folder imports nothing from the layers above but the one function a loader must
//! call: the module's init (`module.rs`).
//!
//! Calling the module API is `unsafe`, and every call says so at its site: [`api!`] must be
//! used inside an `unsafe` block, with a `SAFETY:` note saying why the handles are valid. The
//! safe wrappers rest on one invariant of the whole module, argued here once: a [`Ctx`] or
//! [`RStr`] is made only in this folder, from a handle Redis gave the callback that is running
//! (a command, a timer, an event, a type callback), with the lifetime of that callback, or
//! from the module's own detached context ([`module_ctx`], `'static`: it lives as long as the
//! module); so a handle a safe function holds is valid while it can be named. Every wrapper
//! checks for null, and none keeps a handle beyond the call. The lock's memory block has an
//! invariant of its own, argued in `block.rs`.

use redis_module::raw;

/// Call `RedisModule_<name>(args)`, or evaluate `fallback` if the server lacks it.
///
/// Expands to unsafe operations (reading the API table, calling a C function), so it only
/// compiles inside an `unsafe` block: the caller states why the call is sound. Not exported:
/// only this folder calls the API.
macro_rules! api {
    ($name:ident, $fallback:expr; $($arg:expr),* $(,)?) => {
        match redis_module::raw::$name {
            Some(f) => f($($arg),*),
            None => $fallback,
        }
    };
}

pub mod block;
mod blocked;
mod call;
mod command_info;
mod events;
mod handle;
mod key;
mod lock_type;
mod module;
mod replicate;
mod reply;
mod server;
mod timer;

pub use blocked::{BlockedClient, BlockedClientHandler};
pub use call::{
    call_argv, call_cluster_nodes, command_keys, command_keys_with_flags, CallReply, KeysRequest,
};
pub use command_info::{describe_commands, KeyFlags};
pub use events::{subscribe, subscribe_slot_migration, EventHandler, NotifyClasses, ServerEvent};
pub use handle::{bytes, Ctx, RStr, RString, Status};
pub use key::{notify, Key, KeyKind};
pub use lock_type::{create_lock_type, Aof, Digest, LockTypeMethods, RdbReader, RdbWriter};
pub use module::{
    create_command, create_container, create_subcommand, load_configs, on_load,
    register_cluster_receiver, register_info, scan_db, send_cluster_message, set_options,
    ClusterReceiver, Command, Container, InfoCtx, InfoHandler, OnLoad,
};
pub use replicate::{
    emit_aof, replicate_delete, replicate_mark, replicate_state, replicate_verbatim,
};
pub use reply::{
    reply_array, reply_bulk, reply_error_static, reply_error_string, reply_int, reply_map,
    reply_null, reply_simple, wrong_arity,
};
pub use server::{
    avoid_replica_traffic, init_module_ctx, is_connected_client, module_ctx, monotonic_us, now,
    server_info_field, server_info_text, server_version,
};
pub use timer::{create_timer, stop_timer, Timer};

/// API functions this module calls directly; loading fails cleanly when one is missing.
pub fn missing_api() -> Option<&'static str> {
    macro_rules! need {
        ($($name:ident),* $(,)?) => {
            // SAFETY: reads the API table Redis filled in before calling the module's init.
            $(if unsafe { raw::$name }.is_none() { return Some(stringify!($name)); })*
        };
    }
    need!(
        RedisModule_OpenKey,
        RedisModule_GetCommand,
        RedisModule_CreateSubcommand,
        RedisModule_ReplyWithArray,
        RedisModule_SetCommandInfo,
        RedisModule_KeyAtPosWithFlags,
        RedisModule_GetCommandKeysWithFlags,
        RedisModule_CloseKey,
        RedisModule_KeyType,
        RedisModule_ModuleTypeGetType,
        RedisModule_ModuleTypeGetValue,
        RedisModule_ModuleTypeSetValue,
        RedisModule_ModuleTypeReplaceValue,
        RedisModule_DeleteKey,
        RedisModule_StringPtrLen,
        RedisModule_CreateString,
        RedisModule_HoldString,
        RedisModule_FreeString,
        RedisModule_ReplyWithLongLong,
        RedisModule_ReplyWithNull,
        RedisModule_ReplyWithError,
        RedisModule_ReplyWithSimpleString,
        RedisModule_ReplyWithStringBuffer,
        RedisModule_ReplyWithMap,
        RedisModule_WrongArity,
        RedisModule_GetContextFlags,
        RedisModule_Replicate,
        RedisModule_ReplicateVerbatim,
        RedisModule_EmitAOF,
        RedisModule_CreateTimer,
        RedisModule_StopTimer,
        RedisModule_MonotonicMicroseconds,
        RedisModule_SelectDb,
        RedisModule_GetSelectedDb,
        RedisModule_Scan,
        RedisModule_ScanCursorCreate,
        RedisModule_ScanCursorDestroy,
        RedisModule_NotifyKeyspaceEvent,
        RedisModule_SubscribeToKeyspaceEvents,
        RedisModule_SubscribeToServerEvent,
        RedisModule_CreateCommand,
        RedisModule_GetDetachedThreadSafeContext,
        RedisModule_SaveUnsigned,
        RedisModule_SaveSigned,
        RedisModule_SaveStringBuffer,
        RedisModule_LoadUnsigned,
        RedisModule_LoadSigned,
        RedisModule_LoadStringBuffer,
        RedisModule_IsIOError,
        RedisModule_Free,
        RedisModule_InfoAddSection,
        RedisModule_InfoAddFieldULongLong,
        RedisModule_RegisterInfoFunc,
        RedisModule_DigestAddStringBuffer,
        RedisModule_DigestAddLongLong,
        RedisModule_DigestEndSequence,
        RedisModule_BlockClient,
        RedisModule_UnblockClient,
        RedisModule_SetDisconnectCallback,
        RedisModule_GetBlockedClientPrivateData,
        RedisModule_GetClientId,
        RedisModule_GetClientInfoById,
        RedisModule_Call,
        RedisModule_CallReplyType,
        RedisModule_ReplyWithCallReply,
        RedisModule_FreeCallReply,
        RedisModule_IsKeysPositionRequest,
        RedisModule_KeyAtPos,
        RedisModule_GetCommandKeys,
        RedisModule_GetServerInfo,
        RedisModule_ServerInfoGetFieldSigned,
        RedisModule_FreeServerInfo,
        RedisModule_CallReplyStringPtr,
        RedisModule_AvoidReplicaTraffic,
    );
    None
}
