//! A test cluster: six servers with the module, three masters and three replicas, every node
//! agreeing on the slots and every replica caught up before a test starts.

use crate::env::redis_cli;
use crate::info::info_field;
use crate::reply::{call, Reply};
use crate::server::Server;
use crate::wait::wait_until;
use std::path::Path;
use std::process::Command;

/// One node of a test cluster: its server and its cluster node id.
pub struct Node {
    pub srv: Server,
    pub id: String,
}

/// Six servers with the module as a Redis Cluster of three masters with one replica each,
/// created with `redis-cli --cluster create`.
pub struct Cluster {
    pub nodes: Vec<Node>,
}

impl Cluster {
    pub fn start() -> Cluster {
        Cluster::start_on(None, 1, &[])
    }

    /// Three masters with `replicas` replicas each, on `bin` (`None`: `REDIS_SERVER`), each
    /// server also given the `extra` settings.
    pub fn start_on(bin: Option<&Path>, replicas: usize, extra: &[(&str, &str)]) -> Cluster {
        let mut servers = Vec::new();
        for _ in 0..3 * (1 + replicas) {
            let mut b = Server::builder()
                .arg("cluster-enabled", "yes")
                .arg("cluster-config-file", "nodes.conf")
                .arg("cluster-node-timeout", "2000")
                .arg("cluster-require-full-coverage", "no");
            if let Some(bin) = bin {
                b = b.bin(bin);
            }
            for (name, value) in extra {
                b = b.arg(name, value);
            }
            servers.push(b.start());
        }
        let addrs: Vec<String> = servers
            .iter()
            .map(|s| format!("127.0.0.1:{}", s.port()))
            .collect();
        let out = Command::new(redis_cli())
            .arg("--cluster")
            .arg("create")
            .args(&addrs)
            .args(["--cluster-replicas", &replicas.to_string(), "--cluster-yes"])
            .output()
            .expect("run redis-cli --cluster create");
        assert!(
            out.status.success(),
            "cluster create failed: {}\n{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        let nodes = servers
            .into_iter()
            .map(|srv| {
                let id = call(&mut srv.conn(), &["CLUSTER", "MYID"])
                    .string()
                    .expect("MYID");
                Node { srv, id }
            })
            .collect::<Vec<_>>();
        let cluster = Cluster { nodes };
        cluster.wait_ok();
        if replicas > 0 {
            cluster.wait_replicas_synced();
        }
        cluster
    }

    pub fn wait_ok(&self) {
        for n in &self.nodes {
            let mut c = n.srv.conn();
            wait_until("cluster_state:ok on every node", || {
                info_cluster(&mut c).contains("cluster_state:ok")
            });
        }
        // Every node agrees on every slot's master.
        wait_until("all nodes see 3 masters with slots", || {
            self.nodes.iter().all(|n| {
                let text = nodes_text(&n.srv);
                text.lines()
                    .filter(|l| l.contains("master") && l.split_whitespace().count() > 8)
                    .count()
                    == 3
            })
        });
    }

    /// Every replica's link is up and it has caught up with its master.
    pub fn wait_replicas_synced(&self) {
        for n in &self.nodes {
            let mut c = n.srv.conn();
            if info_field(&mut c, "replication", "role").as_deref() != Some("slave") {
                continue;
            }
            wait_until("replica link up", || {
                info_field(&mut c, "replication", "master_link_status").as_deref() == Some("up")
            });
        }
        for n in &self.nodes {
            let mut c = n.srv.conn();
            if info_field(&mut c, "replication", "role").as_deref() != Some("master") {
                continue;
            }
            wait_until("the master sees its replica online and caught up", || {
                let text = call(&mut c, &["INFO", "replication"])
                    .string()
                    .unwrap_or_default();
                let offset =
                    info_field(&mut c, "replication", "master_repl_offset").unwrap_or_default();
                text.lines().any(|l| {
                    l.starts_with("slave0:")
                        && l.contains("state=online")
                        && l.contains(&format!("offset={offset},"))
                })
            });
        }
    }

    pub fn node_by_id(&self, id: &str) -> &Node {
        self.nodes.iter().find(|n| n.id == id).expect("node id")
    }

    /// The master serving `slot`, as the first node sees it.
    pub fn master_of(&self, slot: u16) -> &Node {
        let text = nodes_text(&self.nodes[0].srv);
        for line in text.lines() {
            let f: Vec<&str> = line.split_whitespace().collect();
            if f.len() < 9 || !f[2].contains("master") {
                continue;
            }
            for r in &f[8..] {
                if r.starts_with('[') {
                    continue;
                }
                let (lo, hi) = match r.split_once('-') {
                    Some((a, b)) => (a.parse::<u16>().unwrap(), b.parse::<u16>().unwrap()),
                    None => (r.parse().unwrap(), r.parse().unwrap()),
                };
                if (lo..=hi).contains(&slot) {
                    return self.node_by_id(f[0]);
                }
            }
        }
        panic!("no master for slot {slot}:\n{text}");
    }

    /// A master other than `than` (a slot's migration target).
    pub fn other_master(&self, than: &Node) -> &Node {
        self.nodes
            .iter()
            .find(|n| n.id != than.id && is_master(&n.srv))
            .expect("another master")
    }

    pub fn replica_of(&self, master: &Node) -> &Node {
        self.nodes
            .iter()
            .find(|n| {
                nodes_text(&n.srv).lines().any(|l| {
                    let f: Vec<&str> = l.split_whitespace().collect();
                    f.len() > 3
                        && f[2].contains("myself")
                        && f[2].contains("slave")
                        && f[3] == master.id
                })
            })
            .expect("a replica of the master")
    }

    pub fn urls(&self) -> Vec<String> {
        self.nodes.iter().map(|n| n.srv.url()).collect()
    }

    /// Move `slot` from `from` to `to` the way `redis-cli --cluster reshard` does: IMPORTING
    /// and MIGRATING, MIGRATE of its keys in batches, then SETSLOT NODE on every master.
    pub fn migrate_slot(&self, slot: u16, from: &Node, to: &Node) {
        let s = slot.to_string();
        let mut src = from.srv.conn();
        let mut dst = to.srv.conn();
        assert_eq!(
            call(&mut dst, &["CLUSTER", "SETSLOT", &s, "IMPORTING", &from.id]),
            Reply::Status("OK".into())
        );
        assert_eq!(
            call(&mut src, &["CLUSTER", "SETSLOT", &s, "MIGRATING", &to.id]),
            Reply::Status("OK".into())
        );
        loop {
            let keys = call(&mut src, &["CLUSTER", "GETKEYSINSLOT", &s, "100"]);
            let keys: Vec<String> = keys
                .array()
                .unwrap_or(&[])
                .iter()
                .filter_map(|k| k.string())
                .collect();
            if keys.is_empty() {
                break;
            }
            let port = to.srv.port().to_string();
            let mut args = vec![
                "MIGRATE",
                "127.0.0.1",
                port.as_str(),
                "",
                "0",
                "5000",
                "KEYS",
            ];
            args.extend(keys.iter().map(String::as_str));
            let r = call(&mut src, &args);
            assert_eq!(r, Reply::Status("OK".into()), "MIGRATE {keys:?}");
        }
        for n in &self.nodes {
            if is_master(&n.srv) {
                call(
                    &mut n.srv.conn(),
                    &["CLUSTER", "SETSLOT", &s, "NODE", &to.id],
                );
            }
        }
    }
}

/// Whether `srv` is a master, by its own `CLUSTER NODES` line.
pub fn is_master(srv: &Server) -> bool {
    nodes_text(srv)
        .lines()
        .any(|l| l.contains("myself") && l.contains("master"))
}

/// The cluster slot of `key` (`CLUSTER KEYSLOT`).
pub fn key_slot(c: &mut redis::Connection, key: &str) -> u16 {
    call(c, &["CLUSTER", "KEYSLOT", key])
        .int()
        .expect("KEYSLOT") as u16
}

/// `CLUSTER INFO` text.
pub fn info_cluster(c: &mut redis::Connection) -> String {
    call(c, &["CLUSTER", "INFO"]).string().unwrap_or_default()
}

/// `CLUSTER NODES` text, as `srv` sees it.
pub fn nodes_text(srv: &Server) -> String {
    call(&mut srv.conn(), &["CLUSTER", "NODES"])
        .string()
        .unwrap_or_default()
}
