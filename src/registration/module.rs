//! Registration, all in one place: the data type, the commands (with their flags and key
//! positions; `command_info.rs` describes them), the configuration (`config::init`), the INFO
//! section, the server and keyspace events, and the handlers the mechanisms call back (due
//! deadlines, deferred jobs). `ffi/module.rs`'s OnLoad calls [`init`].

use super::{command_info, config, events, lock_type};
use crate::commands::{fenced, handlers, stats as stats_command};
use crate::ffi::{self, Ctx, RStr, Status};
use crate::peers::cluster;
use crate::server::{self, stats};
use crate::store::{bindings, expiry};
use crate::waiting::{jobs, waiters};
use redis_module::{Context, RedisString};
use std::ffi::{c_int, CStr};

/// The module's init (OnLoad): `Err` refuses to load (the reason is in the log).
pub fn init(ctx: Ctx<'_>, load: &Context, args: &[RedisString]) -> Result<(), ()> {
    if !ffi::create_lock_type::<lock_type::FlockLock>(ctx) {
        return Err(());
    }
    if let Err(e) = config::init(ctx, load, args) {
        load.log_warning(&format!("refusing to load: {e}"));
        return Err(());
    }
    if let Some(name) = ffi::missing_api() {
        load.log_warning(&format!("this server lacks {name}; refusing to load"));
        return Err(());
    }
    server::init(ctx);
    ffi::handle_io_errors(load);
    expiry::set_due_handler(events::on_due);
    jobs::set_runner(events::run_job);
    if let Err(e) = register_commands(ctx).and_then(|()| command_info::describe(ctx)) {
        load.log_warning(&format!("refusing to load: {e}"));
        return Err(());
    }
    ffi::register_info::<Info>(ctx);
    ffi::subscribe::<events::Events>(ctx, events::SUBSCRIBED);
    cluster::init(ctx);
    Ok(())
}

/// A command handler type for each function of `handlers.rs` and `commands/stats.rs`.
macro_rules! handler {
    ($name:ident, $f:path) => {
        struct $name;
        impl ffi::Command for $name {
            #[inline]
            fn run(ctx: Ctx<'_>, args: &[RStr<'_>]) -> Status {
                $f(ctx, args)
            }
        }
    };
}

handler!(Acquire, handlers::acquire);
handler!(Release, handlers::release);
handler!(Renew, handlers::renew);
handler!(Check, handlers::check);
handler!(LockInfo, handlers::info);
handler!(Holders, handlers::holders);
handler!(Revoke, handlers::revoke);
handler!(Apply, handlers::apply);
handler!(StatsGet, stats_command::get);
handler!(StatsReset, stats_command::reset);

/// `ffi::create_command` for one handler type.
type Register = fn(Ctx<'_>, &CStr, &CStr, (c_int, c_int, c_int)) -> bool;
/// `ffi::create_subcommand` for one handler type.
type RegisterSub = fn(ffi::Container<'_>, &CStr, &CStr) -> bool;

/// Register every command. Flags and key positions matter to cluster clients and ACLs.
fn register_commands(ctx: Ctx<'_>) -> Result<(), String> {
    let first_key = (1, 1, 1);
    let table: [(&CStr, Register, &CStr); 9] = [
        (
            c"flock.acquire",
            ffi::create_command::<Acquire>,
            c"write deny-oom",
        ),
        (
            c"flock.release",
            ffi::create_command::<Release>,
            c"write fast",
        ),
        (c"flock.renew", ffi::create_command::<Renew>, c"write fast"),
        (
            c"flock.check",
            ffi::create_command::<Check>,
            c"readonly fast",
        ),
        (
            c"flock.info",
            ffi::create_command::<LockInfo>,
            c"readonly fast",
        ),
        (
            c"flock.holders",
            ffi::create_command::<Holders>,
            c"readonly",
        ),
        (
            c"flock.revoke",
            ffi::create_command::<Revoke>,
            c"write fast",
        ),
        (c"flock.apply", ffi::create_command::<Apply>, c"write"),
        (
            c"flock.fenced",
            ffi::create_command::<fenced::Fenced>,
            c"write getkeys-api",
        ),
    ];
    for (name, create, flags) in table {
        if !create(ctx, name, flags, first_key) {
            return Err(format!("could not register {}", name.to_string_lossy()));
        }
    }
    // FLOCK.STATS, a container of GET and RESET (so that an ACL can allow GET alone).
    let Some(parent) = ffi::create_container(ctx, c"flock.stats") else {
        return Err("could not register flock.stats".to_string());
    };
    let subs: [(&CStr, RegisterSub, &CStr); 2] = [
        (c"get", ffi::create_subcommand::<StatsGet>, c"readonly fast"),
        (c"reset", ffi::create_subcommand::<StatsReset>, c"fast"),
    ];
    for (name, create, flags) in subs {
        if !create(parent, name, flags) {
            return Err(format!(
                "could not register flock.stats|{}",
                name.to_string_lossy()
            ));
        }
    }
    Ok(())
}

/// The `INFO flock` section (fields appear as `flock_<name>`).
struct Info;

impl ffi::InfoHandler for Info {
    fn info(info: &ffi::InfoCtx<'_>) {
        info.add_section(c"");
        let holds = stats::with_classes(|table| {
            let h = &table.all_holds;
            [
                h.quantile(0.5).unwrap_or(0),
                h.quantile(0.99).unwrap_or(0),
                h.max(),
            ]
        });
        let fields: [(&CStr, u64); 19] = [
            (c"grants", stats::GRANTS.get()),
            (c"releases", stats::RELEASES.get()),
            (c"expirations", stats::EXPIRATIONS.get()),
            (c"revokes", stats::REVOKES.get()),
            (c"renewals", stats::RENEWALS.get()),
            (c"contended_acquires", stats::CONTENDED.get()),
            (c"blocked_acquires", stats::BLOCKED.get()),
            (c"blocked_clients", waiters::blocked_now() as u64),
            (c"timeouts", stats::TIMEOUTS.get()),
            (c"fenced_accepted", stats::FENCED_ACCEPTED.get()),
            (c"fenced_rejected", stats::FENCED_REJECTED.get()),
            (c"fenced_inner_errors", stats::FENCED_INNER_ERRORS.get()),
            // Bound grants ended because their connection closed (or had none on this master).
            (c"bound_closed", stats::BOUND_CLOSED.get()),
            (c"bound_grants", bindings::count() as u64),
            (c"token_high_water", server::tokens().high_water()),
            (
                c"replicating_effects",
                server::replication_consumed() as u64,
            ),
            // How long grants ended by RELEASE were held, over all lock classes (FLOCK.STATS).
            (c"hold_ms_p50", holds[0]),
            (c"hold_ms_p99", holds[1]),
            (c"hold_ms_max", holds[2]),
        ];
        for (name, value) in fields {
            info.add_field_u64(name, value);
        }
    }
}
