//! `redis-flock run`: take the lock, run COMMAND in a process group of its own while the
//! watchdog renews, stop the group when the lock is lost, release after COMMAND exits, and
//! exit with the status the contract gives (README, "Command-line tool").

use std::ffi::OsString;
use std::process::ExitStatus;
use std::time::Duration;

use flock_client::redis::{self, Value};
use flock_client::{Error, Flock, Lease, LockOptions, Mode, Target, Wait};
use nix::errno::Errno;
use nix::sys::signal::{killpg, Signal};
use nix::unistd::Pid;
use tokio::sync::mpsc;
use tokio::time::{sleep, sleep_until, Instant};

use crate::conn::{client_status, is_unknown_command, Conn};

/// The signals passed on to COMMAND's process group (Ctrl-C, `kill`, a closed terminal, and
/// the two a job may use for its own purposes). Each one redis-flock receives goes to the
/// group; the lock is held until COMMAND exits.
const FORWARDED: [Signal; 6] = [
    Signal::SIGINT,
    Signal::SIGTERM,
    Signal::SIGHUP,
    Signal::SIGQUIT,
    Signal::SIGUSR1,
    Signal::SIGUSR2,
];

/// What `run` was asked for, checked by the argument parser.
pub struct RunSpec {
    pub key: String,
    pub ttl: Duration,
    pub wait: Wait,
    pub mode: Mode,
    pub bound: bool,
    pub replicas: u32,
    pub owner: Option<String>,
    pub grace: Duration,
    pub conflict_exit_code: i32,
    pub lost_exit_code: i32,
    pub command: Vec<OsString>,
}

fn say(msg: impl std::fmt::Display) {
    eprintln!("redis-flock: {msg}");
}

/// Every forwarded signal redis-flock receives, as one stream. Installed before the lock is
/// asked for, so that a Ctrl-C during a wait ends the wait instead of killing redis-flock
/// with the default action.
fn signals() -> std::io::Result<mpsc::UnboundedReceiver<Signal>> {
    use tokio::signal::unix::{signal, SignalKind};
    let (tx, rx) = mpsc::unbounded_channel();
    for sig in FORWARDED {
        let mut stream = signal(SignalKind::from_raw(sig as i32))?;
        let tx = tx.clone();
        tokio::spawn(async move {
            while stream.recv().await.is_some() {
                if tx.send(sig).is_err() {
                    break;
                }
            }
        });
    }
    Ok(rx)
}

/// The exit status a signal means by the shell's convention.
fn signal_status(sig: Signal) -> i32 {
    128 + sig as i32
}

pub async fn run(target: Target, spec: RunSpec) -> i32 {
    let mut sigs = match signals() {
        Ok(s) => s,
        Err(e) => {
            say(format!("cannot install signal handlers: {e}"));
            return 70; // EX_SOFTWARE
        }
    };
    let flock = Flock::new(target.clone());
    let mut opts = LockOptions::new(spec.ttl)
        .wait(spec.wait)
        .mode(spec.mode)
        .bound(spec.bound)
        .replicas(spec.replicas);
    if let Some(o) = &spec.owner {
        opts = opts.owner(o.clone());
    }

    // Take the lock; a signal during the wait ends it (dropping the wait closes its
    // connection, which takes the request out of the server's queue).
    let acquired = tokio::select! {
        r = flock.acquire(spec.key.clone(), opts) => r,
        Some(sig) = sigs.recv() => {
            say(format!("{sig} while waiting for {}: COMMAND not started", spec.key));
            return signal_status(sig);
        }
    };
    let lease = match acquired {
        Ok(Some(l)) => l,
        Ok(None) | Err(Error::Busy) => {
            say(format!(
                "{} is held by another owner: COMMAND not started",
                spec.key
            ));
            return spec.conflict_exit_code;
        }
        Err(e) => {
            say(format!("cannot take {}: {e}", spec.key));
            return client_status(&e);
        }
    };

    let mut cmd = tokio::process::Command::new(&spec.command[0]);
    cmd.args(&spec.command[1..])
        .env("FLOCK_KEY", &spec.key)
        .env("FLOCK_OWNER", lease.owner())
        .env("FLOCK_TOKEN", lease.token().to_string())
        // A group of its own: a loss or a forwarded signal reaches COMMAND's children too.
        .process_group(0);
    let mut child = match cmd.spawn() {
        Ok(c) => c,
        Err(e) => {
            say(format!(
                "cannot run {}: {e}",
                spec.command[0].to_string_lossy()
            ));
            release(lease).await;
            // The shell's statuses: 127 not found, 126 found but not runnable.
            return if e.kind() == std::io::ErrorKind::NotFound {
                127
            } else {
                126
            };
        }
    };
    let Some(pgid) = child.id().map(|id| Pid::from_raw(id as i32)) else {
        // Only when the child was already reaped, which nothing here does before wait().
        release(lease).await;
        return 70;
    };

    // The grant's end heard from the server (FLOCK.WATCH, within milliseconds of a REVOKE,
    // a closed BOUND connection or a DEL), next to the lease's own loss signal (a renewal
    // refused, the local deadline passed).
    let mut watcher = tokio::spawn(watch_grant(target, spec.key.clone(), lease.token()));
    let mut lost_rx = lease.lost_signal();
    let mut lost: Option<String> = None;
    let mut kill_at: Option<Instant> = None;

    let status: ExitStatus = loop {
        tokio::select! {
            r = child.wait() => match r {
                Ok(s) => break s,
                Err(e) => {
                    say(format!("cannot wait for COMMAND: {e}"));
                    let _ = killpg(pgid, Signal::SIGKILL);
                    watcher.abort();
                    release(lease).await;
                    return 70;
                }
            },
            ev = &mut watcher, if lost.is_none() => {
                let why = ev.unwrap_or_else(|_| "lost".to_string());
                lost = Some(format!("({why} on the server)"));
                kill_at = Some(stop_group(pgid, &spec));
            }
            _ = lost_rx.wait_for(|v| *v), if lost.is_none() => {
                // The client's own watch (rule 9) may hear the loss first: it names the reason.
                lost = Some(match lease.lost_reason() {
                    Some(why) => format!("({why} on the server)"),
                    None => "(the client marked the lease lost)".to_string(),
                });
                kill_at = Some(stop_group(pgid, &spec));
            }
            Some(sig) = sigs.recv() => {
                let _ = killpg(pgid, sig);
            }
            _ = sleep_until(kill_at.unwrap_or_else(Instant::now)), if kill_at.is_some() => {
                say(format!("grace of {} ms passed: SIGKILL to COMMAND's process group", spec.grace.as_millis()));
                let _ = killpg(pgid, Signal::SIGKILL);
                kill_at = None;
            }
        }
    };
    // Decided at COMMAND's exit: held throughout unless a loss was heard by now.
    if lost.is_none() && lease.is_lost() {
        lost = Some(match lease.lost_reason() {
            Some(why) => format!("({why}, found at COMMAND's exit)"),
            None => "(found at COMMAND's exit)".to_string(),
        });
    }
    watcher.abort();

    if let Some(why) = &lost {
        // COMMAND is gone; what it started in its group must not outlive the lock either.
        reap_group(pgid, kill_at, &mut sigs).await;
        say(format!(
            "lock {} lost {why} while COMMAND ran: exit {}",
            spec.key, spec.lost_exit_code
        ));
        release(lease).await;
        return spec.lost_exit_code;
    }
    match lease.release().await {
        Ok(()) => {}
        Err(e) if e.is_lost() => {
            // The grant ended before the release reached it: it was not held throughout.
            say(format!(
                "lock {} was lost before it was released: exit {}",
                spec.key, spec.lost_exit_code
            ));
            return spec.lost_exit_code;
        }
        Err(e) => say(format!("release of {} failed: {e}", spec.key)),
    }
    exit_of(status)
}

/// COMMAND's own status, or 128 + the signal that ended it.
fn exit_of(status: ExitStatus) -> i32 {
    use std::os::unix::process::ExitStatusExt;
    match (status.code(), status.signal()) {
        (Some(c), _) => c,
        (None, Some(s)) => 128 + s,
        (None, None) => 70,
    }
}

/// The lock is lost: SIGTERM to COMMAND's group now, SIGKILL at the returned instant.
fn stop_group(pgid: Pid, spec: &RunSpec) -> Instant {
    say(format!(
        "lock {} lost: SIGTERM to COMMAND's process group, SIGKILL after {} ms",
        spec.key,
        spec.grace.as_millis()
    ));
    let _ = killpg(pgid, Signal::SIGTERM);
    Instant::now() + spec.grace
}

/// After a loss and COMMAND's exit: wait for the rest of its group to leave, until the grace
/// ends, then SIGKILL what is left. Signals received meanwhile still go to the group.
async fn reap_group(
    pgid: Pid,
    kill_at: Option<Instant>,
    sigs: &mut mpsc::UnboundedReceiver<Signal>,
) {
    loop {
        if killpg(pgid, None) == Err(Errno::ESRCH) {
            return;
        }
        let Some(at) = kill_at else {
            // SIGKILL was sent already: nothing in the group can outlive it.
            let _ = killpg(pgid, Signal::SIGKILL);
            return;
        };
        if Instant::now() >= at {
            say("grace passed: SIGKILL to what is left of COMMAND's process group");
            let _ = killpg(pgid, Signal::SIGKILL);
            return;
        }
        tokio::select! {
            _ = sleep(Duration::from_millis(20)) => {}
            Some(sig) = sigs.recv() => { let _ = killpg(pgid, sig); }
        }
    }
}

/// Release after COMMAND, reporting only what went wrong.
async fn release(lease: Lease) {
    let key = lease.key().to_string();
    if let Err(e) = lease.release().await {
        if !e.is_lost() {
            say(format!("release of {key} failed: {e}"));
        }
    }
}

/// Resolves with the event when the server says the grant `token` of `key` ended
/// (`revoked`, `expired`, `closed`, `released`, `lost`, or `gone` when it had ended before
/// the watch began). A connection failure watches again on a new connection (a grant that
/// ended meanwhile answers `gone` at once, so nothing is missed); a server without
/// FLOCK.WATCH leaves the loss to the lease's own signal.
async fn watch_grant(target: Target, key: String, token: u64) -> String {
    let mut failures = 0u32;
    loop {
        let reply = match Conn::open(&target).await {
            Ok(mut c) => {
                let mut cmd = redis::cmd("FLOCK.WATCH");
                cmd.arg(0).arg(&key).arg(token);
                c.query::<Value>(&cmd).await
            }
            Err(e) => Err(e),
        };
        match reply {
            Ok(Value::Array(items)) => {
                let event = match items.get(1) {
                    Some(Value::BulkString(b)) => String::from_utf8_lossy(b).into_owned(),
                    Some(Value::SimpleString(s)) => s.clone(),
                    _ => "lost".to_string(),
                };
                return event;
            }
            // Unblocked without an event (CLIENT UNBLOCK): watch again.
            Ok(_) => failures = 0,
            Err(e) if is_unknown_command(&e) => std::future::pending::<()>().await,
            Err(_) => failures = failures.saturating_add(1),
        }
        let backoff = Duration::from_millis(50u64 << failures.min(4));
        sleep(backoff).await;
    }
}
