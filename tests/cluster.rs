//! Redis Cluster: routing with a cluster client nobody here wrote (redis-rs), CROSSSLOT for
//! FENCED, a held lock moved by slot migration, waiters of a key that moves away, failover
//! with grants that reached the replica and grants lost in asynchronous replication.
//!
//! Each test starts its own cluster of 3 masters and 3 replicas on loopback (free ports below
//! 55536, temp dirs), created with `redis-cli --cluster create ... --cluster-replicas 1`.

use flock_testkit::*;
use std::process::Command;
use std::thread::{self, sleep};
use std::time::{Duration, Instant};

fn cluster_conn(cluster: &Cluster) -> redis::cluster::ClusterConnection {
    redis::cluster::ClusterClient::new(cluster.urls())
        .expect("cluster client")
        .get_connection()
        .expect("cluster connection")
}

#[test]
fn cluster_clients_route_every_command_and_fenced_checks_slots() {
    let cluster = Cluster::start();
    let mut any = cluster.nodes[0].srv.conn();
    // Key positions, as cluster clients and ACLs read them.
    for (cmd, want) in [
        (vec!["FLOCK.ACQUIRE", "lk", "o", "1000"], vec!["lk"]),
        (vec!["FLOCK.RELEASE", "lk", "o"], vec!["lk"]),
        (vec!["FLOCK.RENEW", "lk", "o", "1000"], vec!["lk"]),
        (vec!["FLOCK.CHECK", "lk", "5"], vec!["lk"]),
        (vec!["FLOCK.INFO", "lk"], vec!["lk"]),
        (vec!["FLOCK.REVOKE", "lk"], vec!["lk"]),
        (
            vec!["FLOCK.FENCED", "{o}:lk", "5", "SET", "{o}:data", "v"],
            vec!["{o}:lk", "{o}:data"],
        ),
    ] {
        let mut full = vec!["COMMAND", "GETKEYS"];
        full.extend(cmd.iter());
        let keys: Vec<String> = call(&mut any, &full)
            .array()
            .unwrap_or_else(|| panic!("GETKEYS {cmd:?}"))
            .iter()
            .filter_map(|r| r.string())
            .collect();
        assert_eq!(keys, want, "{cmd:?}");
    }
    // redis-py's RedisCluster, in the example.
    let out = Command::new(python())
        .arg(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/examples/cluster_fenced.py"
        ))
        .args(["--port", &cluster.nodes[0].srv.port().to_string()])
        .output()
        .expect("run python3 examples/cluster_fenced.py (make test installs redis-py)");
    assert!(
        out.status.success(),
        "examples/cluster_fenced.py failed:\n{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    // redis-rs's cluster client routes by those positions: locks on keys all over the slots.
    let mut cc = cluster_conn(&cluster);
    let mut tokens = Vec::new();
    for i in 0..60 {
        let key = format!("lock:{i}");
        let t: i64 = redis::cmd("FLOCK.ACQUIRE")
            .arg(&key)
            .arg("worker")
            .arg(30_000)
            .query(&mut cc)
            .unwrap_or_else(|e| panic!("ACQUIRE {key} through the cluster client: {e}"));
        assert!(t > 0);
        let ttl: i64 = redis::cmd("FLOCK.CHECK")
            .arg(&key)
            .arg(t)
            .query(&mut cc)
            .expect("CHECK");
        assert!(ttl > 0);
        tokens.push((key, t));
    }
    let masters_used: std::collections::HashSet<u16> = tokens
        .iter()
        .map(|(k, _)| cluster.master_of(key_slot(&mut any, k)).srv.port())
        .collect();
    assert_eq!(masters_used.len(), 3, "keys landed on every master");
    // A lock and its data share a slot with a hash tag: FENCED runs there.
    let t: i64 = redis::cmd("FLOCK.ACQUIRE")
        .arg("{order:42}:lock")
        .arg("w")
        .arg(30_000)
        .query(&mut cc)
        .unwrap();
    let ok: String = redis::cmd("FLOCK.FENCED")
        .arg("{order:42}:lock")
        .arg(t)
        .arg("SET")
        .arg("{order:42}:data")
        .arg("paid")
        .query(&mut cc)
        .expect("FENCED with a hash-tagged data key");
    assert_eq!(ok, "OK");
    let v: String = redis::cmd("GET")
        .arg("{order:42}:data")
        .query(&mut cc)
        .unwrap();
    assert_eq!(v, "paid");
    // Inner keys in another slot: CROSSSLOT, nothing written.
    let master = cluster.master_of(key_slot(&mut any, "{order:42}:lock"));
    let mut m = master.srv.conn();
    let r = call(
        &mut m,
        &[
            "FLOCK.FENCED",
            "{order:42}:lock",
            &t.to_string(),
            "SET",
            "elsewhere",
            "x",
        ],
    );
    assert_err_prefix(&r, "CROSSSLOT", "FENCED with an inner key in another slot");
    let r: redis::RedisResult<String> = redis::cmd("FLOCK.FENCED")
        .arg("{order:42}:lock")
        .arg(t)
        .arg("SET")
        .arg("elsewhere")
        .arg("x")
        .query(&mut cc);
    assert!(r.is_err(), "CROSSSLOT through the cluster client: {r:?}");
    let v: Option<String> = redis::cmd("GET").arg("elsewhere").query(&mut cc).unwrap();
    assert_eq!(v, None);
    // Releases route too.
    for (key, _) in &tokens {
        let n: i64 = redis::cmd("FLOCK.RELEASE")
            .arg(key)
            .arg("worker")
            .query(&mut cc)
            .unwrap();
        assert_eq!(n, 1, "{key}");
    }
}

#[test]
fn slot_migration_keeps_the_lock_and_token_order_and_answers_waiters() {
    let cluster = Cluster::start();
    let mut any = cluster.nodes[0].srv.conn();
    let lock = "{mig}:lock";
    let ended = "{mig}:ended";
    let s = key_slot(&mut any, lock);
    let from = cluster.master_of(s);
    let to = cluster.other_master(from);
    let mut src = from.srv.conn();
    let t_ended = grant(&mut src, ended, "gone", 30_000);
    assert_eq!(release(&mut src, ended, "gone"), 1);
    let t_lock = grant(&mut src, lock, "holder", 20_000);
    // A client waits on the lock at the source.
    let mut waiter = from.srv.conn();
    let w = thread::spawn(move || {
        let start = Instant::now();
        let r = call(
            &mut waiter,
            &["FLOCK.ACQUIRE", lock, "waiter", "10000", "BLOCK", "0"],
        );
        (r, start.elapsed())
    });
    wait_until("the waiter blocks", || {
        info_field(&mut src, "clients", "blocked_clients").as_deref() == Some("1")
    });
    let before = Instant::now();
    cluster.migrate_slot(s, from, to);
    // The waiter is told at once, with an error cluster clients retry.
    let (r, waited) = w.join().expect("waiter");
    assert_err_prefix(&r, "TRYAGAIN", "waiter of a key that moved");
    println!("migration: the waiter got {r:?} after waiting {waited:?} in all");
    assert!(before.elapsed() < Duration::from_secs(10));
    assert_eq!(
        call(&mut src, &["CLUSTER", "COUNTKEYSINSLOT", &s.to_string()]).int(),
        Some(0),
        "no second copy left at the source"
    );
    // The lock arrived whole: owner, token, deadline.
    let mut dst = to.srv.conn();
    let (o, tok, ttl) = held(&mut dst, lock);
    assert_eq!((o.as_str(), tok), ("holder", t_lock));
    assert!(ttl > 10_000 && ttl <= 20_000, "ttl after migration {ttl}");
    assert!(check(&mut dst, lock, t_lock) > 0);
    // The target's next tokens for those keys are above every token the source issued.
    let t_new = grant(&mut dst, ended, "next", 30_000);
    assert!(
        t_new > t_lock && t_new > t_ended,
        "{t_new} vs {t_lock} / {t_ended}"
    );
    println!(
        "migration: source tokens {t_lock} (held) and {t_ended} (ended); ttl on the target \
         {ttl} ms; the target's next token {t_new}"
    );
    assert_eq!(release(&mut dst, lock, "holder"), 1);
    let t_next = grant(&mut dst, lock, "after", 1000);
    assert!(t_next > t_lock);
    // Expiry runs on the target.
    wait_until(
        "the migrated lock's successor expires on the target",
        || exists(&mut dst, lock) == 0,
    );
}

#[test]
fn failover_keeps_deadlines_and_issues_greater_tokens() {
    let cluster = Cluster::start();
    let mut any = cluster.nodes[0].srv.conn();
    // 1. CLUSTER FAILOVER: grants that reached the replica.
    let key = "{fo1}:lock";
    let master = cluster.master_of(key_slot(&mut any, key));
    let replica = cluster.replica_of(master);
    let mut m = master.srv.conn();
    let t1 = grant(&mut m, key, "a", 4000);
    let other = "{fo1}:other";
    let t_other = grant(&mut m, other, "b", 60_000);
    assert!(call(&mut m, &["WAIT", "1", "5000"]).int().unwrap_or(0) >= 1);
    cluster.wait_replicas_synced();
    let mut r = replica.srv.conn();
    // A manual failover can time out on a loaded box (it waits for offsets to match): retry.
    let promoted = (0..3).any(|_| {
        call(&mut r, &["CLUSTER", "FAILOVER"]);
        poll_until(Duration::from_secs(8), || {
            info_field(&mut r, "replication", "role").as_deref() == Some("master")
        })
    });
    assert!(promoted, "CLUSTER FAILOVER did not promote the replica");
    let (o, tok, ttl) = held(&mut r, key);
    assert_eq!((o.as_str(), tok), ("a", t1));
    assert!(ttl > 0 && ttl <= 4000, "deadline kept: ttl {ttl}");
    let t2 = grant(&mut r, "{fo1}:new", "c", 30_000);
    assert!(t2 > t1 && t2 > t_other);
    // Expiry resumes on the new master.
    let start = Instant::now();
    wait_until("expiry on the new master", || exists(&mut r, key) == 0);
    assert!(start.elapsed() < Duration::from_millis(ttl as u64 + 3000));
    println!(
        "failover: old master tokens {t1}, {t_other}; new master's first token {t2}; \
         lock with {ttl} ms left after promotion left the keyspace after {:?}",
        start.elapsed()
    );

    // 2. FAILOVER FORCE with the old master dead and a grant lost in async replication.
    let key = "{fo2}:lock";
    let master = cluster.master_of(key_slot(&mut any, key));
    let replica = cluster.replica_of(master);
    let mut m = master.srv.conn();
    grant(&mut m, "{fo2}:seen", "a", 60_000);
    assert!(call(&mut m, &["WAIT", "1", "5000"]).int().unwrap_or(0) >= 1);
    replica.srv.signal("STOP");
    call(&mut m, &["CLIENT", "KILL", "TYPE", "replica"]);
    let t_lost = grant(&mut m, key, "lost", 60_000);
    master.srv.signal("KILL");
    replica.srv.signal("CONT");
    let mut r = replica.srv.conn();
    sleep(Duration::from_millis(200));
    call(&mut r, &["CLUSTER", "FAILOVER", "FORCE"]);
    wait_until("the replica took over", || {
        info_field(&mut r, "replication", "role").as_deref() == Some("master")
    });
    assert_eq!(
        exists(&mut r, key),
        0,
        "the grant was really lost in replication"
    );
    let t_after = grant(&mut r, key, "new-holder", 30_000);
    assert!(
        t_after > t_lost,
        "token {t_after} after failover not above the lost grant's {t_lost}"
    );
    println!("forced failover: lost grant's token {t_lost}; new master's token {t_after}");
}
