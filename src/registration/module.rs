//! Registration, all in one place: the data type, the commands (the one table: what each is
//! comes from `flock_core::commands`, paired here with its handler), the configuration (`config::init`), the INFO
//! section, the server and keyspace events, and the handlers the mechanisms call back (due
//! deadlines, deferred jobs). `ffi/module.rs`'s OnLoad calls [`init`].

use super::{config, events, lock_type};
use crate::commands::{fenced, handlers, macquire, stats as stats_command, watch};
use crate::ffi::{self, Ctx, RStr, Status};
use crate::peers::cluster;
use crate::server::{self, stats};
use crate::store::{bindings, expiry};
use crate::waiting::{jobs, waiters, watchers};
use flock_core::commands::{self, CommandSpec};
use flock_core::migration;
use redis_module::{Context, RedisString};
use std::ffi::{c_int, CStr, CString};

/// The module: what its OnLoad does.
pub struct Flock;

impl ffi::OnLoad for Flock {
    fn init(ctx: Ctx<'_>, load: &Context, args: &[RedisString]) -> Result<(), ()> {
        init(ctx, load, args)
    }
}

/// The module's init (OnLoad): `Err` refuses to load (the reason is in the log).
fn init(ctx: Ctx<'_>, load: &Context, args: &[RedisString]) -> Result<(), ()> {
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
    let extra = if slot_migration_handled(ctx, load) {
        migration::OPTION_HANDLE_ATOMIC_SLOT_MIGRATION
    } else {
        0
    };
    ffi::set_options(load, extra);
    expiry::set_due_handler(events::on_due);
    jobs::set_runner(events::run_job);
    watchers::set_slot_check(cluster::serves_stably);
    if let Err(e) = register_commands(ctx) {
        load.log_warning(&format!("refusing to load: {e}"));
        return Err(());
    }
    ffi::register_info::<Info>(ctx);
    ffi::subscribe::<events::Events>(ctx, events::SUBSCRIBED);
    cluster::init(ctx);
    events::on_start();
    Ok(())
}

/// On Valkey 9 and later, follow its atomic slot migration events; true when the server may
/// then be told that flock handles such migrations (`CLUSTER MIGRATESLOTS` is refused while
/// a loaded module has not said so). Elsewhere the option's bit is not Valkey's: nothing.
fn slot_migration_handled(ctx: Ctx<'_>, load: &Context) -> bool {
    let name = ffi::server_info_text(ctx, c"server", c"server_name");
    let version = ffi::server_version();
    if !migration::declares_atomic_slot_migration(name.as_deref(), version) {
        return false;
    }
    if !ffi::subscribe_slot_migration::<events::Events>(ctx, migration::EVENT_ATOMIC_SLOT_MIGRATION)
    {
        load.log_warning("the atomic slot migration event could not be followed: not declaring it");
        return false;
    }
    load.log_notice("declaring atomic slot migration support (CLUSTER MIGRATESLOTS)");
    true
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
handler!(StatsHelp, stats_command::help);
handler!(Watch, watch::watch);
handler!(Waiters, watch::waiters);

/// How a command of the table is registered.
#[derive(Clone, Copy)]
enum Registered {
    /// A command with its handler (`ffi::create_command` of its handler type).
    Command(fn(Ctx<'_>, &CStr, &CStr, (c_int, c_int, c_int)) -> bool),
    /// A container of subcommands, with no handler of its own.
    Container,
    /// A subcommand of the container registered before it.
    Sub(fn(ffi::Container<'_>, &CStr, &CStr) -> bool),
}

/// The one command table: every command as `flock_core::commands` describes it (name, flags,
/// arity, key spec, COMMAND DOCS), with the handler that runs it.
const COMMANDS: [(&CommandSpec, Registered); 16] = [
    (
        &commands::ACQUIRE,
        Registered::Command(ffi::create_command::<Acquire>),
    ),
    (
        &commands::RELEASE,
        Registered::Command(ffi::create_command::<Release>),
    ),
    (
        &commands::RENEW,
        Registered::Command(ffi::create_command::<Renew>),
    ),
    (
        &commands::CHECK,
        Registered::Command(ffi::create_command::<Check>),
    ),
    (
        &commands::INFO,
        Registered::Command(ffi::create_command::<LockInfo>),
    ),
    (
        &commands::HOLDERS,
        Registered::Command(ffi::create_command::<Holders>),
    ),
    (
        &commands::REVOKE,
        Registered::Command(ffi::create_command::<Revoke>),
    ),
    (
        &commands::FENCED,
        Registered::Command(ffi::create_command::<fenced::Fenced>),
    ),
    (&commands::STATS, Registered::Container),
    (
        &commands::STATS_GET,
        Registered::Sub(ffi::create_subcommand::<StatsGet>),
    ),
    (
        &commands::STATS_RESET,
        Registered::Sub(ffi::create_subcommand::<StatsReset>),
    ),
    (
        &commands::STATS_HELP,
        Registered::Sub(ffi::create_subcommand::<StatsHelp>),
    ),
    (
        &commands::APPLY,
        Registered::Command(ffi::create_command::<Apply>),
    ),
    (
        &commands::WATCH,
        Registered::Command(ffi::create_command::<Watch>),
    ),
    (
        &commands::WAITERS,
        Registered::Command(ffi::create_command::<Waiters>),
    ),
    (
        &commands::MACQUIRE,
        Registered::Command(ffi::create_command::<macquire::Macquire>),
    ),
];

/// Register every command of [`COMMANDS`], then tell the server what each is (arity, key
/// specs, docs). Flags and key positions matter to cluster clients and ACLs.
fn register_commands(ctx: Ctx<'_>) -> Result<(), String> {
    let mut container = None;
    for (spec, how) in COMMANDS {
        let name = spec.name;
        // The legacy key range (FLOCK.FENCED reports its keys itself).
        let range = commands::key_range(spec);
        let keys = (range.first, range.last, range.step);
        let ok = match how {
            Registered::Command(create) => create(ctx, name, spec.flags, keys),
            Registered::Container => {
                container = ffi::create_container(ctx, name);
                container.is_some()
            }
            Registered::Sub(create) => {
                let sub = spec.subcommand().and_then(|s| CString::new(s).ok());
                match (container, sub) {
                    (Some(parent), Some(sub)) => create(parent, &sub, spec.flags),
                    _ => false,
                }
            }
        };
        if !ok {
            return Err(format!("could not register {}", name.to_string_lossy()));
        }
    }
    let specs: Vec<&CommandSpec> = COMMANDS.iter().map(|(spec, _)| *spec).collect();
    ffi::describe_commands(ctx, &specs)
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
        // One look at the issuer (its lock is not reentrant: one guard per statement).
        let (mark, headroom) = {
            let now = server::now();
            let tokens = server::tokens();
            (tokens.high_water(), tokens.headroom(now))
        };
        let fields: [(&CStr, u64); 22] = [
            (c"grants", stats::GRANTS.get()),
            (c"releases", stats::RELEASES.get()),
            (c"expirations", stats::EXPIRATIONS.get()),
            (c"revokes", stats::REVOKES.get()),
            (c"renewals", stats::RENEWALS.get()),
            (c"contended_acquires", stats::CONTENDED.get()),
            (c"blocked_acquires", stats::BLOCKED.get()),
            // FLOCK.MACQUIREs granted (each key's grant counts in `grants` too).
            (c"multi_grants", stats::MULTI_GRANTS.get()),
            (
                c"blocked_clients",
                (waiters::blocked_now() + watchers::watching_now()) as u64,
            ),
            // Clients blocked in FLOCK.WATCH now.
            (c"watchers", watchers::watching_now() as u64),
            (c"timeouts", stats::TIMEOUTS.get()),
            (c"fenced_accepted", stats::FENCED_ACCEPTED.get()),
            (c"fenced_rejected", stats::FENCED_REJECTED.get()),
            (c"fenced_inner_errors", stats::FENCED_INNER_ERRORS.get()),
            // Bound grants ended because their connection closed (or had none on this master).
            (c"bound_closed", stats::BOUND_CLOSED.get()),
            (c"bound_grants", bindings::count() as u64),
            (c"token_high_water", mark),
            // Tokens left below 2^53 (what promotions' margins and the clock have not used).
            (c"token_headroom", headroom),
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
