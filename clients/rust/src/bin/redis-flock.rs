//! `redis-flock`: run a command under a flock lock (`run`, for scripts and cron, as `consul
//! lock` or ShedLock do), and look at locks from a shell (`info`, `holders`, `waiters`,
//! `watch`, `stats`). The exit statuses and the environment are in the crate's README.

#[path = "redis_flock/conn.rs"]
mod conn;
#[path = "redis_flock/inspect.rs"]
mod inspect;
#[path = "redis_flock/run.rs"]
mod run;

use std::ffi::OsString;
use std::time::Duration;

use clap::{Args, Parser, Subcommand};
use flock_client::{Mode, Wait};

use conn::{EX_UNAVAILABLE, EX_USAGE};

/// Run a command under a flock lock, or look at locks.
#[derive(Parser)]
#[command(name = "redis-flock", version)]
struct Cli {
    /// The server: redis://[user:password@]host:port[/db]; with --cluster one or more seed
    /// nodes, comma-separated.
    #[arg(
        long,
        env = "REDIS_URL",
        hide_env_values = true,
        default_value = "redis://127.0.0.1:6379",
        global = true
    )]
    url: String,
    /// Talk to a Redis Cluster (the URL names seed nodes).
    #[arg(long, global = true)]
    cluster: bool,
    #[command(subcommand)]
    command: Sub,
}

#[derive(Subcommand)]
enum Sub {
    /// Run COMMAND while holding the lock KEY (FLOCK_KEY, FLOCK_OWNER and FLOCK_TOKEN in its
    /// environment, in a process group of its own that gets SIGTERM, then SIGKILL after
    /// --grace, when the lock is lost).
    #[command(after_help = RUN_STATUSES)]
    Run(RunArgs),
    /// FLOCK.INFO KEY: one `field<TAB>value` line per field; nothing when the key is unknown.
    Info { key: String },
    /// FLOCK.HOLDERS KEY: one `owner<TAB>token<TAB>ttl_ms` line per live grant, oldest first.
    Holders { key: String },
    /// FLOCK.WAITERS KEY: one `owner<TAB>mode<TAB>waited_ms` line per waiting request, first
    /// in line first.
    Waiters { key: String },
    /// Follow KEY: one `event<TAB>owner<TAB>token` line per change (held, released, expired,
    /// revoked, closed, lost, gone), until interrupted.
    Watch { key: String },
    /// FLOCK.STATS GET: one `class<TAB>figure<TAB>value` line per figure, for every class or
    /// the named ones.
    Stats { classes: Vec<String> },
}

/// `run`'s exit statuses, as `--help` shows them (the README's table).
const RUN_STATUSES: &str = "\
Exit status:
  COMMAND's own   COMMAND exited with the lock held throughout (128 + N when signal N ended it)
  75              the lock was not granted (--conflict-exit-code); COMMAND never started
  3               the lock was lost while COMMAND ran (--lost-exit-code)
  64              bad arguments
  69              the server cannot be reached, has no flock module, or too few replicas
                  acknowledged a --replicas grant; COMMAND never started
  127 / 126       COMMAND not found / not runnable";

#[derive(Args)]
struct RunArgs {
    /// The lock key.
    key: String,
    /// Lease length in milliseconds; the watchdog renews at a third of it.
    #[arg(
        long,
        value_name = "MS",
        default_value_t = 30_000,
        value_parser = clap::value_parser!(u64).range(1..)
    )]
    ttl: u64,
    /// Wait up to MS milliseconds for the lock, in the server's FIFO queue (`forever`: no
    /// limit). Without it (or with 0): one try.
    #[arg(long, value_name = "MS", value_parser = parse_wait)]
    wait: Option<Wait>,
    /// A shared (read) lock: any number of shared holders together.
    #[arg(long, conflicts_with = "limit")]
    shared: bool,
    /// A counted lock: at most N holders at once.
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..))]
    limit: Option<u32>,
    /// A grant bound to redis-flock's connection: it ends when that connection closes.
    #[arg(long, conflicts_with = "replicas")]
    bound: bool,
    /// Start COMMAND only after N replicas acknowledged the grant (and count each renewal
    /// only once they acknowledged it).
    #[arg(long, value_name = "N")]
    replicas: Option<u32>,
    /// The owner name (default: 128 random bits in hex).
    #[arg(long, value_name = "NAME")]
    owner: Option<String>,
    /// After a loss, SIGKILL COMMAND's process group this many milliseconds after SIGTERM.
    #[arg(long, value_name = "MS", default_value_t = 10_000)]
    grace: u64,
    /// Exit status when the lock is not granted (COMMAND never started).
    #[arg(long, value_name = "STATUS", default_value_t = 75)]
    conflict_exit_code: u8,
    /// Exit status when the lock was lost while COMMAND ran.
    #[arg(long, value_name = "STATUS", default_value_t = 3)]
    lost_exit_code: u8,
    /// The command and its arguments, after `--`.
    #[arg(last = true, required = true, value_name = "COMMAND")]
    command: Vec<OsString>,
}

fn parse_wait(s: &str) -> Result<Wait, String> {
    match s {
        "forever" | "inf" | "infinity" => Ok(Wait::Forever),
        _ => match s.parse::<u64>() {
            Ok(0) => Ok(Wait::None),
            Ok(ms) => Ok(Wait::For(Duration::from_millis(ms))),
            Err(_) => Err(format!(
                "`{s}` is not a number of milliseconds or `forever`"
            )),
        },
    }
}

fn main() {
    let cli = match Cli::try_parse() {
        Ok(c) => c,
        Err(e) => {
            // --help and --version are not errors; everything else is a usage error (64).
            let _ = e.print();
            std::process::exit(if e.use_stderr() { EX_USAGE } else { 0 });
        }
    };
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
    {
        Ok(r) => r,
        Err(e) => {
            eprintln!("redis-flock: cannot start: {e}");
            std::process::exit(70);
        }
    };
    let status = runtime.block_on(dispatch(cli));
    // Leaving the runtime without waiting for the lease's background tasks.
    runtime.shutdown_timeout(Duration::from_millis(100));
    std::process::exit(status);
}

/// The URL as it may be printed: the user and password between `://` and `@` left out.
fn without_password(url: &str) -> String {
    match (url.find("://"), url.rfind('@')) {
        (Some(i), Some(j)) if j > i => format!("{}://***{}", &url[..i], &url[j..]),
        _ => url.to_string(),
    }
}

async fn dispatch(cli: Cli) -> i32 {
    let target = match conn::target(&cli.url, cli.cluster) {
        Ok(t) => t,
        Err(e) => {
            eprintln!("redis-flock: bad --url / REDIS_URL: {e}");
            return EX_USAGE;
        }
    };
    let result = match cli.command {
        Sub::Run(a) => {
            let mode = match (a.shared, a.limit) {
                (true, _) => Mode::Shared,
                (false, Some(n)) => Mode::Permits(n),
                (false, None) => Mode::Exclusive,
            };
            let spec = run::RunSpec {
                key: a.key,
                ttl: Duration::from_millis(a.ttl),
                wait: a.wait.unwrap_or(Wait::None),
                mode,
                bound: a.bound,
                replicas: a.replicas.unwrap_or(0),
                owner: a.owner,
                grace: Duration::from_millis(a.grace),
                conflict_exit_code: i32::from(a.conflict_exit_code),
                lost_exit_code: i32::from(a.lost_exit_code),
                command: a.command,
            };
            return run::run(target, spec).await;
        }
        Sub::Info { key } => inspect::info(&target, &key).await,
        Sub::Holders { key } => inspect::triples(&target, "FLOCK.HOLDERS", &key).await,
        Sub::Waiters { key } => inspect::triples(&target, "FLOCK.WAITERS", &key).await,
        Sub::Watch { key } => inspect::watch(&target, &key).await,
        Sub::Stats { classes } => inspect::stats(&target, &classes).await,
    };
    match result {
        Ok(()) => 0,
        Err(inspect::Failed(msg, status)) => {
            if !msg.is_empty() {
                eprintln!("redis-flock: {msg}");
                if status == EX_UNAVAILABLE {
                    eprintln!(
                        "redis-flock: is the server at {} up, with the flock module loaded?",
                        without_password(&cli.url)
                    );
                }
            }
            status
        }
    }
}
