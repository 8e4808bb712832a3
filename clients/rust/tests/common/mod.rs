//! Test harness: real `redis-server` processes with the flock module, on free loopback ports,
//! each in a temp dir, killed (and the dir removed) on drop. `REDIS_SERVER` names the binary
//! (default `redis-server`), `REDIS_CLI` the cli (default `redis-cli`), `FLOCK_MODULE` the
//! module (default `<workspace>/target/release/libredis_flock.so`).
#![allow(dead_code)]

use std::net::TcpListener;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use redis::aio::MultiplexedConnection;
use redis::AsyncConnectionConfig;
use tokio::time::Instant;

static SEQ: AtomicU32 = AtomicU32::new(0);

pub fn module_path() -> String {
    std::env::var("FLOCK_MODULE").unwrap_or_else(|_| {
        let ws = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..");
        ws.join("target/release/libredis_flock.so")
            .to_string_lossy()
            .into_owned()
    })
}

fn server_bin() -> String {
    std::env::var("REDIS_SERVER").unwrap_or_else(|_| "redis-server".into())
}

pub fn cli_bin() -> String {
    std::env::var("REDIS_CLI").unwrap_or_else(|_| "redis-cli".into())
}

fn free_port() -> u16 {
    // Below 55536: cluster bus ports are port + 10000.
    for _ in 0..200 {
        let l = TcpListener::bind("127.0.0.1:0").expect("bind loopback");
        let p = l.local_addr().expect("addr").port();
        if p <= 55535 && TcpListener::bind(("127.0.0.1", p + 10000)).is_ok() {
            return p;
        }
    }
    panic!("no free port");
}

pub struct Server {
    pub port: u16,
    pub dir: PathBuf,
    child: Child,
}

impl Server {
    pub fn start() -> Server {
        Self::start_with(&[])
    }

    pub fn start_with(extra: &[&str]) -> Server {
        let module = module_path();
        assert!(
            std::path::Path::new(&module).exists(),
            "flock module not found at {module} (set FLOCK_MODULE)"
        );
        let mut last = String::new();
        for _ in 0..5 {
            let port = free_port();
            let dir = std::env::temp_dir().join(format!(
                "flock-client-test-{}-{}-{}",
                std::process::id(),
                SEQ.fetch_add(1, Ordering::Relaxed),
                port
            ));
            std::fs::create_dir_all(&dir).expect("temp dir");
            let mut cmd = Command::new(server_bin());
            cmd.args(["--port", &port.to_string(), "--bind", "127.0.0.1"])
                .args(["--dir", &dir.to_string_lossy()])
                .args(["--save", "", "--appendonly", "no"])
                .args(["--loadmodule", &module])
                .args(extra)
                .stdout(Stdio::null())
                .stderr(Stdio::null());
            let child = cmd.spawn().expect("spawn redis-server (set REDIS_SERVER)");
            let mut srv = Server { port, dir, child };
            if srv.wait_ready() {
                return srv;
            }
            last = format!("port {port}");
            drop(srv);
        }
        panic!("redis-server did not start ({last})");
    }

    fn wait_ready(&mut self) -> bool {
        let start = std::time::Instant::now();
        while start.elapsed() < Duration::from_secs(10) {
            if let Ok(Some(_)) = self.child.try_wait() {
                return false;
            }
            if let Ok(c) = redis::Client::open(self.url()) {
                if let Ok(mut conn) = c.get_connection_with_timeout(Duration::from_millis(200)) {
                    if redis::cmd("PING").query::<String>(&mut conn).is_ok() {
                        return true;
                    }
                }
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        false
    }

    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}/", self.port)
    }

    pub fn addr(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    pub fn client(&self) -> redis::Client {
        redis::Client::open(self.url()).expect("client")
    }

    /// A raw connection of the test's own (no response timeout: the machine may be loaded).
    pub async fn raw(&self) -> MultiplexedConnection {
        self.client()
            .get_multiplexed_async_connection_with_config(
                &AsyncConnectionConfig::new().set_response_timeout(None),
            )
            .await
            .expect("raw connection")
    }

    pub fn signal(&self, sig: &str) {
        signal(self.pid(), sig);
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        signal(self.child.id(), "CONT");
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

pub fn signal(pid: u32, sig: &str) {
    let st = Command::new("kill")
        .args([format!("-{sig}"), pid.to_string()])
        .status()
        .expect("kill");
    assert!(st.success(), "kill -{sig} {pid}");
}

pub async fn q<T: redis::FromRedisValue>(c: &mut MultiplexedConnection, args: &[&str]) -> T {
    let mut cmd = redis::cmd(args[0]);
    for a in &args[1..] {
        cmd.arg(*a);
    }
    cmd.query_async(c)
        .await
        .unwrap_or_else(|e| panic!("{args:?}: {e}"))
}

/// A field of INFO (section `section`) as a number.
pub async fn info_num(c: &mut MultiplexedConnection, section: &str, field: &str) -> i64 {
    let text: String = q(c, &["INFO", section]).await;
    text.lines()
        .find_map(|l| l.strip_prefix(&format!("{field}:")))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or_else(|| panic!("no {field} in INFO {section}:\n{text}"))
}

/// Poll `f` (test-side only) until it holds, up to `limit`.
pub async fn wait_until<F, Fut>(what: &str, limit: Duration, mut f: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let start = Instant::now();
    loop {
        if f().await {
            return;
        }
        assert!(start.elapsed() < limit, "timed out waiting for: {what}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// Three masters, no replicas, made by `redis-cli --cluster create`.
pub struct Cluster {
    pub nodes: Vec<Server>,
    pub ids: Vec<String>,
}

impl Cluster {
    pub async fn start() -> Cluster {
        let nodes: Vec<Server> = (0..3)
            .map(|_| {
                Server::start_with(&[
                    "--cluster-enabled",
                    "yes",
                    "--cluster-config-file",
                    "nodes.conf",
                    "--cluster-node-timeout",
                    "5000",
                ])
            })
            .collect();
        let out = Command::new(cli_bin())
            .args(["--cluster", "create"])
            .args(nodes.iter().map(|n| n.addr()))
            .args(["--cluster-replicas", "0", "--cluster-yes"])
            .output()
            .expect("redis-cli --cluster create");
        assert!(
            out.status.success(),
            "cluster create: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        let mut ids = Vec::new();
        for n in &nodes {
            let mut c = n.raw().await;
            ids.push(q::<String>(&mut c, &["CLUSTER", "MYID"]).await);
        }
        let cluster = Cluster { nodes, ids };
        for n in &cluster.nodes {
            let c = n.raw().await;
            wait_until("cluster_state:ok", Duration::from_secs(30), || {
                let mut c = c.clone();
                async move {
                    let info: String = q(&mut c, &["CLUSTER", "INFO"]).await;
                    let nodes: String = q(&mut c, &["CLUSTER", "NODES"]).await;
                    info.contains("cluster_state:ok")
                        && nodes
                            .lines()
                            .filter(|l| l.contains("master") && l.split_whitespace().count() > 8)
                            .count()
                            == 3
                }
            })
            .await;
        }
        cluster
    }

    pub fn urls(&self) -> Vec<String> {
        self.nodes.iter().map(|n| n.url()).collect()
    }

    /// Index of the master serving `slot`.
    pub async fn master_of(&self, slot: u16) -> usize {
        let mut c = self.nodes[0].raw().await;
        let text: String = q(&mut c, &["CLUSTER", "NODES"]).await;
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
                    return self.ids.iter().position(|id| id == f[0]).expect("known id");
                }
            }
        }
        panic!("no master for slot {slot}");
    }

    /// Move `slot` from node `from` to node `to` as `redis-cli --cluster reshard` does:
    /// SETSLOT IMPORTING / MIGRATING, MIGRATE the keys, SETSLOT NODE on every master.
    pub async fn move_slot(&self, slot: u16, from: usize, to: usize) {
        let s = slot.to_string();
        let mut src = self.nodes[from].raw().await;
        let mut dst = self.nodes[to].raw().await;
        let _: () = q(
            &mut dst,
            &["CLUSTER", "SETSLOT", &s, "IMPORTING", &self.ids[from]],
        )
        .await;
        let _: () = q(
            &mut src,
            &["CLUSTER", "SETSLOT", &s, "MIGRATING", &self.ids[to]],
        )
        .await;
        loop {
            let keys: Vec<String> = q(&mut src, &["CLUSTER", "GETKEYSINSLOT", &s, "100"]).await;
            if keys.is_empty() {
                break;
            }
            let port = self.nodes[to].port.to_string();
            let mut args = vec!["MIGRATE", "127.0.0.1", &port, "", "0", "5000", "KEYS"];
            args.extend(keys.iter().map(String::as_str));
            let _: () = q(&mut src, &args).await;
        }
        for i in [to, from] {
            let mut c = self.nodes[i].raw().await;
            let _: () = q(&mut c, &["CLUSTER", "SETSLOT", &s, "NODE", &self.ids[to]]).await;
        }
        for (i, n) in self.nodes.iter().enumerate() {
            if i != to && i != from {
                let mut c = n.raw().await;
                let _: () = q(&mut c, &["CLUSTER", "SETSLOT", &s, "NODE", &self.ids[to]]).await;
            }
        }
    }
}
