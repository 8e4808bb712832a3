//! The history checker: many clients on real connections against a master and a replica (AOF,
//! `appendfsync always`), with faults injected, every operation recorded, and the history
//! checked against the guarantees of SPEC.md at the end.
//!
//! Keys come in three uses (history.rs `key_kind`): mutexes (exclusive grants), read/write
//! locks (SHARED readers, exclusive writers) and semaphores of 2 or 3 permits (LIMIT n).
//! Clients take random leases in their key's mode (plain and BLOCK), write through FLOCK.FENCED
//! into a per-key log (readers read it instead, and now and then try a write that must be
//! refused), check, list HOLDERS, renew and release with and without the token, repeat ACQUIRE
//! (a reader now and then in the exclusive mode, refused), try to release and renew as impostors
//! and with a token not theirs, stall past their lease and write anyway, release or abandon.
//! About a third of the acquires, on every kind of key, are BOUND (the grant lives only while
//! its connection does); a repeated ACQUIRE of a bound grant is BOUND too.
//! Some waiters hang up while they wait, some retry their wait from a second connection (the
//! retry takes the first request's place in the queue, the first gets nil); that second
//! connection also looks (CLIENT LIST) whether a BLOCK request is queued. An operator lists HOLDERS, reads INFO, REVOKEs keys or
//! one listed owner and DELs keys at random. A fault injector stalls the server (DEBUG SLEEP),
//! rewrites the AOF, changes the lock-delay, kills the master with SIGKILL and restarts it from
//! its AOF, kills the master and promotes the replica, and kills a client's lock connection
//! (CLIENT KILL ID, most often one that holds a bound grant): the client reconnects and carries
//! on under its token (a FENCED write or read, CHECK, RENEW), which must all be refused.
//!
//! Checked (each violation is printed and fails the test):
//! - G1, for every kind: an exclusive grant is its key's only live grant and no key has more
//!   live grants than its limit. A grant is live throughout the span between two of its proofs
//!   (grant, CHECK > 0, accepted FENCED, RENEW, release, a HOLDERS listing): no overlapping spans
//!   and no proof inside other grants' spans may break that. From the resource's side: a token
//!   was live from its first log entry to its last, so the tokens whose entries surround an
//!   entry are live with it (one writer on a mutex or read/write key, at most n on a semaphore);
//!   a reader's read that falls between two entries of one writer met that writer; the log of a
//!   mutex or read/write key never goes back in token order. Every HOLDERS listing is one
//!   instant: within the limit, an exclusive grant alone, in token order, owners unique, and no
//!   grant that was surely live then left out. Every FLOCK.INFO agrees with the key's use
//!   (mode, holders within the limit, the limit). Lock-delay per slot: while a grant that
//!   surely expired keeps its slot (its deadline + the lock-delay known on that master), a
//!   mutex grants nothing and no key grants an exclusive request.
//! - G2: an owner that never held the key cannot release or renew it (not even naming the
//!   holder's token), nor can the holder naming a token not its own (another holder's);
//!   REVOKE ends at most the key's limit (one for an owner).
//! - G3: no token is issued twice; a grant acknowledged before another was asked for has the
//!   smaller token, whatever the kinds of both (across restarts and failovers too).
//! - G4: the holder repeating ACQUIRE in its mode gets its token back while its lease runs;
//!   in another mode it is refused.
//! - G5: a refused FENCED write never shows up in the log; a FENCED after the holder's own
//!   release is refused; a write under a shared token is never accepted.
//! - G9: no grant proves itself (nor is listed) after its lease ran out (last extension
//!   acknowledged + ttl), and no lease ends early while nobody revoked or deleted it.
//! - durability: every grant and every FENCED write acknowledged before a SIGKILL is there
//!   after the restart (AOF, fsync always). Grants and writes lost to an (asynchronous)
//!   failover are counted, not failed, except durable grants: every fourth client is durable
//!   (docs/CLIENTS.md rule 10 with replicas=1: plain acquires and renewals each followed by
//!   `WAIT 1` on the same connection, a grant the replica did not acknowledge released at
//!   once), and a failover that loses a grant the replica acknowledged, whose lease from the
//!   last acknowledged extension still runs, is a violation (checker/failover.rs).
//! - G3 across failovers with no exception: every grant asked for after a grant lost in a
//!   failover was acknowledged has a larger token; with FLOCK_CHAOS_FAKETIME=1 (valkey-server
//!   under libfaketime) one fault sets the replica's clock a day back before a lagging
//!   failover, and every grant the promoted master makes is above every earlier token
//!   (faults/clock.rs).
//! - G6: every waiter ends with a grant, a timeout (not early) or an error; one FIFO queue per
//!   key for all kinds: no request sent after a waiter was seen queued is granted before it
//!   (a smaller token) or while it still waits (before its timeout); a retried wait holds its
//!   first request's place.
//! - G11: after a CLIENT KILL of the connection a bound grant is bound to, nothing under its
//!   token is accepted (FENCED, RENEW, CHECK > 0, repeated ACQUIRE, a HOLDERS listing) whose
//!   request was sent after the kill's reply; no bound grant is listed after a kill -9 or a
//!   failover. Its span ends at the kill, so the next grant of the key is no G1 overlap, and
//!   its early end (after a kill, a dropped connection or a restart) is no G9 violation nor a
//!   lock-delay one (the delay counts from the close).
//! - G7: master and replica have the same DEBUG DIGEST once the replica caught up.
//! - G8, G10: no crash or panic in any server log; at the end no lock key, no waiter is left.
//! - WATCH and MACQUIRE (issue 24; checker/watch.rs): watchers (clients/watch.rs) watch grants
//!   they saw (listed by HOLDERS, token 0, ended ones) and record what they were told; every
//!   end they are told has a cause in the history (released, expired, revoked, closed, lost),
//!   none is told of a grant that proved itself live afterwards, none twice, no release that
//!   surely came while a watch waited is missed, `gone` never for a grant surely live; errors
//!   only around faults (TRYAGAIN, UNBLOCKED). MACQUIRE clients (clients/multi.rs) take 2 or 3
//!   of 3 more mutex keys of one slot (`{chaosm}:lock<k>`, used by the other clients too) in
//!   random orders, mostly with BLOCK: every call answers within its timeout + 10 s (no
//!   deadlock), some are granted (progress), and their grants are ordinary grants that every
//!   check above (G1 per key first) sees.
//!
//! Environment: FLOCK_CHAOS_SECS (default 20), FLOCK_CHAOS_CLIENTS (8), FLOCK_CHAOS_KEYS (4),
//! FLOCK_CHAOS_WATCHERS (2), FLOCK_CHAOS_MULTI (2: MACQUIRE clients; 0 also drops their keys),
//! FLOCK_CHAOS_SEED, FLOCK_CHAOS_REPORT (append a Markdown table row to this file),
//! FLOCK_CHAOS_FAKETIME=1 (the servers under libfaketime, the fault a day behind),
//! REDIS_SERVER (the server binary, e.g. valkey-server).
//!
//! Layout: `history.rs` what is recorded, `clients.rs` and `clients/` the clients and the
//! operator that record it, `faults.rs` the fault driver (`faults/clock.rs` the clock a day
//! behind), `checker.rs` the history checker (`checker/failover.rs` durable grants and tokens
//! across failovers, `checker/selftest*.rs` its self-tests); this file runs them together.

mod checker;
mod clients;
mod faults;
mod history;

use checker::*;
use clients::*;
use faults::*;
use flock_testkit::*;
use history::*;
use std::collections::HashMap;
use std::sync::atomic::Ordering::SeqCst;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// A number from the environment (the `make chaos` knobs), else `default`.
pub(crate) fn env_num(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(default)
}

/// Slack for comparing the client's clock with the server's lease deadlines (deadlines that
/// travel through the AOF or replication are rounded to milliseconds).
pub(crate) const EPS_US: u64 = 5_000;

/// "N exclusive, N shared, N permits; N bound".
fn grants_by_kind(h: &History) -> String {
    let n = |k: Kind| h.grants.iter().filter(|g| g.kind == k).count();
    format!(
        "{} exclusive, {} shared, {} permits; {} bound",
        n(Kind::Exclusive),
        n(Kind::Shared),
        n(Kind::Permit),
        h.grants.iter().filter(|g| g.bound.is_some()).count()
    )
}

/// "N durable grants, N present after a failover, N lost in one".
fn durable_summary(h: &History) -> String {
    let n = |k: &str| h.checks.get(k).copied().unwrap_or(0);
    format!(
        "{} durable grants (WAIT 1 answered 1), {} present after a failover, {} lost in one",
        h.grants.iter().filter(|g| g.durable).count(),
        n("acknowledged durable grants present after failover"),
        n("acknowledged durable grants lost in failover (must be 0)")
    )
}

/// "N WATCH replies (N ends checked), N MACQUIREs (N granted, N BLOCK finished of N)".
fn coordination_summary(h: &History) -> String {
    let n = |k: &str| h.checks.get(k).copied().unwrap_or(0);
    let fired = h
        .watches
        .iter()
        .filter(|w| matches!(w.told, coord::Told::Fired { .. }))
        .count();
    format!(
        "{} WATCHes ({fired} told an event, {} ends matched to their cause), {} MACQUIREs ({} \
         granted, {} of {} BLOCK calls finished)",
        h.watches.len(),
        n("WATCH ends matched to their cause"),
        h.multis.len(),
        n("MACQUIRE granted"),
        n("MACQUIRE BLOCK calls that finished"),
        n("MACQUIRE BLOCK calls")
    )
}

/// "N CLIENT KILLs, N bound grants ended by them".
fn kills_summary(h: &History) -> String {
    format!(
        "{} CLIENT KILLs, {} bound grants ended by them",
        h.kills.len(),
        h.checks
            .get("G11 bound grants ended by CLIENT KILL")
            .copied()
            .unwrap_or(0)
    )
}

#[test]
fn history_checker_under_faults() {
    let secs = env_num("FLOCK_CHAOS_SECS", 20);
    let clients = env_num("FLOCK_CHAOS_CLIENTS", 8) as usize;
    let keys = env_num("FLOCK_CHAOS_KEYS", 4) as usize;
    let seed = env_num("FLOCK_CHAOS_SEED", now_us() as u64);
    // Issue 24: watchers (FLOCK.WATCH) and MACQUIRE clients on 3 more keys of one slot.
    let watchers = env_num("FLOCK_CHAOS_WATCHERS", 2) as usize;
    let multis = env_num("FLOCK_CHAOS_MULTI", 2) as usize;
    let server = server_binary();
    eprintln!(
        "chaos: {secs} s, {clients} clients, {keys} keys, seed {seed} \
         (FLOCK_CHAOS_SEED to replay the choices), server {server}"
    );
    // FLOCK_CHAOS_FAKETIME=1: the servers run under libfaketime, and one fault promotes a
    // replica whose clock is a day behind (faults/clock.rs; valkey-server only).
    let faked = std::env::var("FLOCK_CHAOS_FAKETIME").is_ok_and(|v| v == "1");
    let (servers, clocks) = chaos_servers(faked);
    // Workers: the clients, the operator, the MACQUIRE clients (ids after the operator's, for
    // their connection slots) and the watchers.
    let workers = clients + 1 + multis + watchers;
    let multi_keys = if multis > 0 { 3 } else { 0 };
    let sh = Arc::new(Shared::new(servers[0].port(), keys, workers).with_multi_keys(multi_keys));
    let uses: Vec<String> = (0..sh.keys)
        .map(|k| format!("{}: {}", sh.lock_key(k), sh.kinds[k].name()))
        .collect();
    eprintln!("chaos: keys {}", uses.join(", "));
    let mut inj = Injector {
        sh: sh.clone(),
        servers,
        master: 0,
        rng: Rng::new(seed ^ 0xFA17),
        clocks,
    };
    inj.attach_replica();

    let mut threads = Vec::new();
    for id in 0..clients {
        let sh = sh.clone();
        threads.push(std::thread::spawn(move || {
            let rng = Rng::new(seed.wrapping_add(id as u64 + 1));
            Client::new(id, sh, rng, id % 4 == 3).run();
        }));
    }
    {
        let sh = sh.clone();
        threads.push(std::thread::spawn(move || operator(sh, seed ^ 0x0BE7)));
    }
    for j in 0..multis {
        let sh = sh.clone();
        let id = clients + 1 + j;
        threads.push(std::thread::spawn(move || {
            let rng = Rng::new(seed.wrapping_add(0x3AC0 + id as u64));
            Client::new(id, sh, rng, false).run_multi();
        }));
    }
    for j in 0..watchers {
        let sh = sh.clone();
        threads.push(std::thread::spawn(move || {
            watcher(sh, j, seed.wrapping_add(0xEA7C + j as u64))
        }));
    }
    let until = Instant::now() + Duration::from_secs(secs);
    inj.run(until);
    sh.stop.store(true, SeqCst);
    sh.gate.resume();
    for t in threads {
        t.join().expect("worker thread panicked");
    }

    // Quiesce: every lease ends (at most 4 s, plus lock-delay), the replica catches up.
    let port = inj.master_port();
    let mut c = RawConn::connect(port).expect("connect to the master at the end");
    let lock_keys: Vec<String> = (0..sh.keys).map(|k| sh.lock_key(k)).collect();
    let drained = poll_until(Duration::from_secs(15), || {
        lock_keys
            .iter()
            .all(|k| c.call(&["EXISTS", k]).ok() == Some(Reply::Int(0)))
    });
    let mut h = std::mem::take(&mut *sh.hist());
    if !drained {
        // Which keys, and what is in them (a lock, waiters, or an empty key nobody uses).
        let mut left = Vec::new();
        for k in &lock_keys {
            if c.call(&["EXISTS", k]).ok() == Some(Reply::Int(1)) {
                let info = c.call(&["FLOCK.INFO", k]).ok();
                let waiters = c.call(&["FLOCK.WAITERS", k]).ok();
                left.push(format!("{k} (INFO {info:?}, WAITERS {waiters:?})"));
            }
        }
        h.violation(format!(
            "lock keys still exist 15 s after the last client stopped (G10): {}",
            left.join(", ")
        ));
    }
    let blocked = info_of(port, "flock", "flock_blocked_clients");
    if blocked.as_deref() != Some("0") {
        h.violation(format!(
            "flock_blocked_clients is {blocked:?} at the end (G10)"
        ));
    }
    inj.compare_digests();
    let mut logs = HashMap::new();
    for k in 0..sh.keys {
        let r = c
            .call(&["LRANGE", &sh.log_key(k), "0", "-1"])
            .expect("LRANGE");
        let v: Vec<String> = r
            .array()
            .map(|a| a.iter().filter_map(Reply::string).collect())
            .unwrap_or_default();
        logs.insert(k, v);
    }
    // Faults and checks recorded by the injector after the take above.
    {
        let late = std::mem::take(&mut *sh.hist());
        for (k, n) in late.checks {
            *h.checks.entry(k).or_default() += n;
        }
        for (k, n) in late.faults {
            *h.faults.entry(k).or_default() += n;
        }
        for x in late.violations {
            h.violations.push(x);
        }
    }
    check_history(&sh, &mut h, &logs);
    for s in inj.servers.iter_mut() {
        let log = std::fs::read_to_string(s.log_path()).unwrap_or_default();
        if log.contains("BUG REPORT") || log.contains("panicked") {
            h.violation(format!(
                "server on port {} logged a crash or panic (G8):\n{}",
                s.port(),
                s.log_tail(40)
            ));
        }
    }

    // Report.
    let total_ops: u64 = h.ops.values().sum();
    let total_faults: u64 = h.faults.values().sum();
    eprintln!(
        "\n=== chaos report: {secs} s, {clients} clients, {keys} keys, seed {seed}, {server} ==="
    );
    eprintln!("operations ({total_ops}):");
    for (k, n) in &h.ops {
        eprintln!("  {k:<45} {n}");
    }
    eprintln!("waiters (BLOCK) ended with:");
    for (k, n) in &h.waits {
        eprintln!("  {k:<45} {n}");
    }
    eprintln!("faults injected ({total_faults}):");
    for (k, n) in &h.faults {
        eprintln!("  {k:<45} {n}");
    }
    eprintln!("checks:");
    for (k, n) in &h.checks {
        eprintln!("  {k:<45} {n}");
    }
    eprintln!(
        "grants: {} ({}), FENCED writes: {}, FENCED reads: {}",
        h.grants.len(),
        grants_by_kind(&h),
        h.writes.len(),
        h.reads.len()
    );
    eprintln!("{}", kills_summary(&h));
    eprintln!("{}", durable_summary(&h));
    eprintln!("{}", coordination_summary(&h));
    eprintln!("violations: {}", h.violations.len());
    for x in h.violations.iter().take(30) {
        eprintln!("  - {x}");
    }
    if let Ok(path) = std::env::var("FLOCK_CHAOS_REPORT") {
        use std::io::Write;
        let name = std::path::Path::new(&server)
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or(server.clone());
        let faults: Vec<String> = h.faults.iter().map(|(k, n)| format!("{k}: {n}")).collect();
        let row = format!(
            "| history checker, {name}, {secs} s, {clients} clients, {keys} keys | {total_ops} ({} grants: {}; {} FENCED writes; {}; {}; {}) | {total_faults} ({}) | {} |\n",
            h.grants.len(),
            grants_by_kind(&h),
            h.writes.len(),
            kills_summary(&h),
            durable_summary(&h),
            coordination_summary(&h),
            faults.join(", "),
            h.violations.len()
        );
        if let Ok(mut f) = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&path)
        {
            let _ = f.write_all(row.as_bytes());
        }
    }
    assert!(
        h.violations.is_empty(),
        "{} violations (first: {})",
        h.violations.len(),
        h.violations[0]
    );
    assert!(
        h.grants.len() > 50 && h.faults.contains_key("kill -9 master, restart from AOF"),
        "the run exercised too little: {} grants, faults {:?}",
        h.grants.len(),
        h.faults
    );
    // Every kind of key took part (the first three keys are a mutex, a read/write lock and a
    // semaphore), and the queue was seen with waiters in it.
    let kinds = grants_by_kind(&h);
    let each = [Kind::Exclusive, Kind::Shared, Kind::Permit]
        .iter()
        .all(|&k| {
            h.grants.iter().filter(|g| g.kind == k).count() >= 10
                && h.grants.iter().any(|g| g.kind == k && g.bound.is_some())
        });
    // The watchers were told of ends, and the MACQUIRE clients were granted.
    assert!(
        watchers == 0
            || h.watches.iter().any(
                |w| matches!(&w.told, coord::Told::Fired { event, .. } if event == "released")
            ),
        "no watcher was told of a release: {}",
        coordination_summary(&h)
    );
    assert!(
        multis == 0 || h.checks.get("MACQUIRE granted").copied().unwrap_or(0) >= 5,
        "the MACQUIRE clients made too little progress: {}",
        coordination_summary(&h)
    );
    // Durable clients took part (every fourth client is one).
    assert!(
        clients < 4 || h.grants.iter().filter(|g| g.durable).count() >= 10,
        "the run had too few durable grants: {}",
        durable_summary(&h)
    );
    let fifo: u64 = h
        .checks
        .iter()
        .filter(|(k, _)| k.starts_with("G6 FIFO"))
        .map(|(_, n)| n)
        .sum();
    assert!(
        keys < 3 || (each && fifo > 0 && !h.holders.is_empty()),
        "the run exercised too few kinds: grants {kinds}, {fifo} queued waiters checked, {} \
         HOLDERS listings",
        h.holders.len()
    );
}
