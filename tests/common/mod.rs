//! Test harness for the flock module: starts throw-away redis-server (or valkey-server)
//! processes with the module loaded, each in its own temp dir on its own port.
//!
//! Environment:
//! - `REDIS_SERVER`: server binary (default `redis-server`; `valkey-server` works too).
//! - `FLOCK_MODULE`: module path (default `<crate>/target/release/libredis_flock.so`).
//! - `FLOCK_KEEP_TMP=1`: keep the temp dirs (logs, RDB, AOF) for post-mortem.
#![allow(dead_code)]

use std::collections::HashSet;
use std::fs;
use std::io::Read;
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;
use std::thread::sleep;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

/// Generous bound for anything that "should happen soon" on a loaded 2-core CI box.
pub const DEADLINE: Duration = Duration::from_secs(10);
/// Poll interval for `wait_until`.
pub const POLL: Duration = Duration::from_millis(15);
/// 2^53: every token must stay below this (JavaScript safe integers).
pub const TWO_POW_53: i64 = 1 << 53;

static DIR_COUNTER: AtomicUsize = AtomicUsize::new(0);
static PORTS_USED: Mutex<Option<HashSet<u16>>> = Mutex::new(None);

// ---------------------------------------------------------------------------------------------
// paths and ports
// ---------------------------------------------------------------------------------------------

pub fn server_binary() -> String {
    std::env::var("REDIS_SERVER").unwrap_or_else(|_| "redis-server".to_string())
}

/// The Python that runs examples/ and the Python client: the project's `.venv` (scripts/deps.sh
/// installs redis-py there), else `python3` on the PATH.
pub fn python() -> PathBuf {
    let venv = Path::new(env!("CARGO_MANIFEST_DIR")).join(".venv/bin/python");
    if venv.is_file() {
        venv
    } else {
        PathBuf::from("python3")
    }
}

pub fn module_path() -> PathBuf {
    let p = match std::env::var_os("FLOCK_MODULE") {
        Some(p) => PathBuf::from(p),
        None => Path::new(env!("CARGO_MANIFEST_DIR")).join("target/release/libredis_flock.so"),
    };
    if !p.is_file() {
        panic!(
            "flock module not found at {}: build the module first: cargo build --release \
             (or point FLOCK_MODULE at the .so)",
            p.display()
        );
    }
    p
}

pub fn unique_temp_dir() -> PathBuf {
    let n = DIR_COUNTER.fetch_add(1, Ordering::SeqCst);
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.subsec_nanos())
        .unwrap_or(0);
    let dir =
        std::env::temp_dir().join(format!("flock-test-{}-{}-{}", std::process::id(), n, nanos));
    fs::create_dir_all(&dir).unwrap_or_else(|e| panic!("create temp dir {}: {e}", dir.display()));
    dir
}

/// A port that is free right now, at most 55535 (cluster bus = port + 10000), and not handed
/// out before by this process.
pub fn free_port() -> u16 {
    for _ in 0..10_000 {
        let l = TcpListener::bind("127.0.0.1:0").expect("bind 127.0.0.1:0");
        let port = l.local_addr().expect("local_addr").port();
        drop(l);
        if port > 55535 || port < 1024 {
            continue;
        }
        let mut g = PORTS_USED.lock().unwrap_or_else(|e| e.into_inner());
        let set = g.get_or_insert_with(HashSet::new);
        if set.insert(port) {
            return port;
        }
    }
    panic!("could not find a free port <= 55535");
}

/// Last `n` lines of a file (lossy UTF-8), for failure messages.
pub fn tail(path: &Path, n: usize) -> String {
    let mut s = Vec::new();
    if let Ok(mut f) = fs::File::open(path) {
        let _ = f.read_to_end(&mut s);
    }
    let s = String::from_utf8_lossy(&s);
    let lines: Vec<&str> = s.lines().collect();
    let start = lines.len().saturating_sub(n);
    lines[start..].join("\n")
}

// ---------------------------------------------------------------------------------------------
// server
// ---------------------------------------------------------------------------------------------

#[derive(Clone, Default)]
pub struct ServerBuilder {
    module_args: Vec<String>,
    extra: Vec<Vec<String>>,
    replica_of: Option<u16>,
    no_module: bool,
}

impl ServerBuilder {
    /// Arguments appended after `--loadmodule PATH`, e.g. `&["max-ttl-ms", "5000"]`.
    pub fn module_args(mut self, args: &[&str]) -> Self {
        self.module_args.extend(args.iter().map(|s| s.to_string()));
        self
    }
    /// An extra `--name value` config option (later ones override the defaults).
    pub fn arg(mut self, name: &str, value: &str) -> Self {
        let name = name.trim_start_matches("--");
        self.extra.push(vec![name.to_string(), value.to_string()]);
        self
    }
    /// An extra option with several values, e.g. `args("save", &["900", "1"])`.
    pub fn args(mut self, name: &str, values: &[&str]) -> Self {
        let name = name.trim_start_matches("--");
        let mut v = vec![name.to_string()];
        v.extend(values.iter().map(|s| s.to_string()));
        self.extra.push(v);
        self
    }
    /// Start as a replica of `master` (with `--replicaof`); `start()` then waits for the link.
    pub fn replica_of(mut self, master: &Server) -> Self {
        self.replica_of = Some(master.port());
        self
    }
    /// Do not load the flock module (a plain server).
    pub fn without_module(mut self) -> Self {
        self.no_module = true;
        self
    }
    pub fn start(self) -> Server {
        let module = if self.no_module {
            None
        } else {
            Some(module_path())
        };
        let mut srv = Server {
            child: None,
            port: 0,
            dir: unique_temp_dir(),
            bin: server_binary(),
            module,
            cfg: self,
        };
        // The port we picked may get taken between probing and the server's bind: retry.
        let mut last_err = String::new();
        for _ in 0..5 {
            srv.port = free_port();
            match srv.spawn_and_wait() {
                Ok(()) => {
                    if srv.cfg.replica_of.is_some() {
                        srv.wait_link_up();
                    }
                    return srv;
                }
                Err(e) => {
                    if e.contains("Address already in use") {
                        last_err = e;
                        continue;
                    }
                    panic!("{e}");
                }
            }
        }
        panic!("server did not start (port trouble): {last_err}");
    }
}

pub struct Server {
    child: Option<Child>,
    port: u16,
    dir: PathBuf,
    bin: String,
    module: Option<PathBuf>,
    cfg: ServerBuilder,
}

impl Server {
    /// A server with the module loaded and default settings.
    pub fn start() -> Server {
        Server::builder().start()
    }

    pub fn builder() -> ServerBuilder {
        ServerBuilder::default()
    }

    pub fn port(&self) -> u16 {
        self.port
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    pub fn log_path(&self) -> PathBuf {
        self.dir.join("server.log")
    }

    pub fn log_tail(&self, n: usize) -> String {
        format!(
            "--- server.log (tail) ---\n{}\n--- stdout/stderr (tail) ---\n{}",
            tail(&self.log_path(), n),
            tail(&self.dir.join("stdio.log"), n)
        )
    }

    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(|c| c.id())
    }

    /// True when the server process is running.
    pub fn is_alive(&mut self) -> bool {
        match self.child.as_mut() {
            Some(c) => matches!(c.try_wait(), Ok(None)),
            None => false,
        }
    }

    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}/", self.port)
    }

    /// A new RESP2 connection (30 s read timeout so that a hung server fails the test).
    pub fn conn(&self) -> redis::Connection {
        self.conn_url(&self.url())
    }

    /// A new RESP3 connection.
    pub fn conn_resp3(&self) -> redis::Connection {
        self.conn_url(&format!("redis://127.0.0.1:{}/?protocol=resp3", self.port))
    }

    fn conn_url(&self, url: &str) -> redis::Connection {
        let client = redis::Client::open(url).expect("client");
        let c = client
            .get_connection_with_timeout(Duration::from_secs(10))
            .unwrap_or_else(|e| panic!("connect to {url}: {e}\n{}", self.log_tail(30)));
        c.set_read_timeout(Some(Duration::from_secs(30)))
            .expect("read timeout");
        c.set_write_timeout(Some(Duration::from_secs(30)))
            .expect("write timeout");
        c
    }

    fn command_line(&self) -> Vec<String> {
        let mut a: Vec<String> = vec![
            "--port".into(),
            self.port.to_string(),
            "--bind".into(),
            "127.0.0.1".into(),
            "--dir".into(),
            self.dir.display().to_string(),
            "--save".into(),
            "".into(),
            "--appendonly".into(),
            "no".into(),
            "--daemonize".into(),
            "no".into(),
            "--enable-debug-command".into(),
            "yes".into(),
            // replicas sync at once instead of after the default 5 s diskless delay
            "--repl-diskless-sync-delay".into(),
            "0".into(),
        ];
        if let Some(m) = &self.module {
            a.push("--loadmodule".into());
            a.push(m.display().to_string());
            a.extend(self.cfg.module_args.iter().cloned());
        }
        a.push("--logfile".into());
        a.push("server.log".into());
        if let Some(p) = self.cfg.replica_of {
            a.push("--replicaof".into());
            a.push("127.0.0.1".into());
            a.push(p.to_string());
        }
        for opt in &self.cfg.extra {
            a.push(format!("--{}", opt[0]));
            a.extend(opt[1..].iter().cloned());
        }
        a
    }

    fn spawn_and_wait(&mut self) -> Result<(), String> {
        let stdio = fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.dir.join("stdio.log"))
            .map_err(|e| format!("open stdio.log: {e}"))?;
        let stdio2 = stdio.try_clone().map_err(|e| e.to_string())?;
        let args = self.command_line();
        let child = Command::new(&self.bin)
            .args(&args)
            .current_dir(&self.dir)
            .stdin(Stdio::null())
            .stdout(stdio)
            .stderr(stdio2)
            .spawn()
            .map_err(|e| format!("cannot run {} (set REDIS_SERVER?): {e}", self.bin))?;
        self.child = Some(child);
        let start = Instant::now();
        loop {
            if let Some(c) = self.child.as_mut() {
                if let Ok(Some(status)) = c.try_wait() {
                    self.child = None;
                    return Err(format!(
                        "{} exited at start ({status}); args {:?}\n{}",
                        self.bin,
                        args,
                        self.log_tail(40)
                    ));
                }
            }
            if self.ping_ok() {
                return Ok(());
            }
            if start.elapsed() > DEADLINE {
                self.kill();
                return Err(format!(
                    "{} did not answer PING within {:?}; args {:?}\n{}",
                    self.bin,
                    DEADLINE,
                    args,
                    self.log_tail(40)
                ));
            }
            sleep(Duration::from_millis(20));
        }
    }

    fn ping_ok(&self) -> bool {
        let Ok(client) = redis::Client::open(self.url()) else {
            return false;
        };
        let Ok(mut c) = client.get_connection_with_timeout(Duration::from_millis(500)) else {
            return false;
        };
        let _ = c.set_read_timeout(Some(Duration::from_secs(2)));
        matches!(call(&mut c, &["PING"]), Reply::Status(ref s) if s == "PONG")
    }

    fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill(); // SIGKILL
            let _ = c.wait();
        }
    }

    /// SIGKILL the server (no save, no AOF flush beyond what appendfsync already did).
    pub fn stop(&mut self) {
        self.kill();
    }

    /// Start the stopped server again with the same dir, port and arguments.
    pub fn start_again(&mut self) {
        assert!(self.child.is_none(), "start_again: server still running");
        if let Err(e) = self.spawn_and_wait() {
            panic!("restart failed: {e}");
        }
        // A restarted replica is not waited on: its master may be gone on purpose; call
        // `wait_link_up()` when the link matters.
    }

    /// Change (or add) a `--name value` option for the next `start_again()`/`restart()`.
    pub fn set_arg(&mut self, name: &str, value: &str) {
        let name = name.trim_start_matches("--");
        self.cfg.extra.retain(|o| o[0] != name);
        self.cfg
            .extra
            .push(vec![name.to_string(), value.to_string()]);
    }

    /// Send a signal to the server process (e.g. "STOP", "CONT") with the `kill` utility.
    pub fn signal(&self, sig: &str) {
        let pid = self.pid().expect("server not running");
        let st = Command::new("kill")
            .arg(format!("-{sig}"))
            .arg(pid.to_string())
            .status()
            .expect("run kill");
        assert!(st.success(), "kill -{sig} {pid} failed");
    }

    /// All files under the server's dir (recursively), e.g. to inspect AOF files.
    pub fn files(&self) -> Vec<PathBuf> {
        fn walk(p: &Path, out: &mut Vec<PathBuf>) {
            if let Ok(rd) = fs::read_dir(p) {
                for e in rd.flatten() {
                    let p = e.path();
                    if p.is_dir() {
                        walk(&p, out);
                    } else {
                        out.push(p);
                    }
                }
            }
        }
        let mut v = Vec::new();
        walk(&self.dir, &mut v);
        v
    }

    /// The concatenated bytes of every AOF file (Redis 7 multi-part AOF or a single file).
    pub fn aof_bytes(&self) -> Vec<u8> {
        let mut out = Vec::new();
        for f in self.files() {
            let name = f
                .file_name()
                .map(|n| n.to_string_lossy().into_owned())
                .unwrap_or_default();
            if name.contains(".aof") && !name.ends_with(".manifest") {
                out.extend(fs::read(&f).unwrap_or_default());
            }
        }
        out
    }

    /// The incremental AOF files' text (Redis 7 multi-part AOF), CRLF shown as spaces.
    pub fn aof_incr_text(&self) -> String {
        let mut out = String::new();
        for f in self.files() {
            let name = f
                .file_name()
                .map(|n| n.to_string_lossy().into_owned())
                .unwrap_or_default();
            if name.ends_with(".incr.aof") {
                out.push_str(
                    &String::from_utf8_lossy(&fs::read(&f).unwrap_or_default())
                        .replace("\r\n", " "),
                );
            }
        }
        out
    }

    /// Kill (no save) and start again with the same dir/port/args: RDB/AOF files are reused.
    pub fn restart(&mut self) {
        self.stop();
        self.start_again();
    }

    fn wait_exit(&mut self, what: &str) {
        if let Some(c) = self.child.as_mut() {
            let start = Instant::now();
            loop {
                if let Ok(Some(_)) = c.try_wait() {
                    break;
                }
                if start.elapsed() > DEADLINE {
                    let log = self.log_tail(30);
                    self.kill();
                    panic!("server did not exit after {what}\n{log}");
                }
                sleep(POLL);
            }
        }
        self.child = None;
    }

    /// `SHUTDOWN SAVE` and wait for the process to exit (the server stays stopped).
    pub fn shutdown_save(&mut self) {
        let mut c = self.conn();
        let _ = call_raw(&mut c, &[b"SHUTDOWN".as_slice(), b"SAVE".as_slice()]);
        self.wait_exit("SHUTDOWN SAVE");
    }

    /// `SHUTDOWN NOSAVE` and wait for the process to exit (the server stays stopped).
    pub fn shutdown_nosave(&mut self) {
        let mut c = self.conn();
        let _ = call_raw(&mut c, &[b"SHUTDOWN".as_slice(), b"NOSAVE".as_slice()]);
        self.wait_exit("SHUTDOWN NOSAVE");
    }

    /// Start a replica of this server, with the same module arguments; waits until the
    /// replication link is up.
    pub fn start_replica_of(master: &Server) -> Server {
        let mut b = Server::builder();
        b.module_args = master.cfg.module_args.clone();
        b.replica_of(master).start()
    }

    /// Same as `Server::start_replica_of(self)`.
    pub fn start_replica(&self) -> Server {
        Server::start_replica_of(self)
    }

    /// Wait until `INFO replication` says `master_link_status:up` and the master lists this
    /// replica as `state=online` (before that the master neither streams to it nor asks it for
    /// acks, so a first `WAIT` can take a second).
    pub fn wait_link_up(&self) {
        let mut c = self.conn();
        let ok = poll_until(DEADLINE, || {
            info_field(&mut c, "replication", "master_link_status").as_deref() == Some("up")
        });
        if !ok {
            panic!(
                "replica on port {} did not link up within {:?}\n{}",
                self.port,
                DEADLINE,
                self.log_tail(40)
            );
        }
        let Some(mport) = self.cfg.replica_of else {
            return;
        };
        let client = redis::Client::open(format!("redis://127.0.0.1:{mport}/")).expect("client");
        let Ok(mut mc) = client.get_connection_with_timeout(Duration::from_secs(5)) else {
            return;
        };
        let me = format!("port={},state=online", self.port);
        let ok = poll_until(DEADLINE, || {
            call_raw(&mut mc, &["INFO", "replication"])
                .ok()
                .and_then(|r| r.string())
                .map(|t| t.contains(&me))
                .unwrap_or(false)
        });
        if !ok {
            panic!(
                "master on port {mport} does not list replica {} as online\n{}",
                self.port,
                self.log_tail(40)
            );
        }
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        // a SIGSTOPped server would not die from SIGKILL any slower, but be nice to `wait`
        if let Some(pid) = self.pid() {
            let _ = Command::new("kill")
                .arg("-CONT")
                .arg(pid.to_string())
                .stderr(Stdio::null())
                .status();
        }
        if std::thread::panicking() {
            eprintln!(
                "=== server on port {} ({}) ===\n{}",
                self.port,
                self.dir.display(),
                self.log_tail(25)
            );
        }
        self.kill();
        if std::env::var_os("FLOCK_KEEP_TMP").is_none() {
            let _ = fs::remove_dir_all(&self.dir);
        }
    }
}

/// A connection to `srv` authenticated as ACL user `user` with password `pw`.
pub fn user_conn(srv: &Server, user: &str) -> redis::Connection {
    let mut c = srv.conn();
    assert_eq!(
        call(&mut c, &["AUTH", user, "pw"]),
        Reply::Status("OK".into()),
        "AUTH {user}"
    );
    c
}

/// A server started from a redis.conf file, as an operator starts one (`make run` does, and
/// CONFIG REWRITE needs a file to write). The file is `conf` plus the port, dir and logfile
/// lines the harness sets; `cli` are extra command-line options.
pub struct ConfServer {
    child: Child,
    pub port: u16,
    pub dir: PathBuf,
    cli: Vec<String>,
}

impl ConfServer {
    /// Start it and wait until it answers PING; `Err(log)` when the server exited instead.
    pub fn start(dir: PathBuf, conf: &str, cli: &[&str]) -> Result<ConfServer, String> {
        let port = free_port();
        let text = format!(
            "{conf}\nport {port}\nbind 127.0.0.1\ndir {}\nlogfile {}\ndaemonize no\n",
            dir.display(),
            dir.join("server.log").display(),
        );
        fs::write(dir.join("redis.conf"), text).expect("write redis.conf");
        let child = Self::spawn(&dir, cli);
        let mut srv = ConfServer {
            child,
            port,
            dir,
            cli: cli.iter().map(|s| s.to_string()).collect(),
        };
        srv.wait_up()?;
        Ok(srv)
    }

    fn spawn<A: AsRef<std::ffi::OsStr>>(dir: &Path, cli: &[A]) -> Child {
        Command::new(server_binary())
            .arg(dir.join("redis.conf"))
            .args(cli)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("spawn server")
    }

    fn wait_up(&mut self) -> Result<(), String> {
        let t0 = std::time::Instant::now();
        while t0.elapsed() < DEADLINE {
            if let Ok(Some(_)) = self.child.try_wait() {
                return Err(self.log());
            }
            if let Ok(mut c) = RawConn::connect(self.port) {
                if c.call(&["PING"]).is_ok_and(|r| r == Reply::Status("PONG".into())) {
                    return Ok(());
                }
            }
            sleep(POLL);
        }
        panic!("server neither answered nor exited within {DEADLINE:?}:\n{}", self.log());
    }

    /// SIGKILL it and start it again from the same redis.conf (which CONFIG REWRITE may have
    /// changed).
    pub fn restart(&mut self) -> Result<(), String> {
        let _ = self.child.kill();
        let _ = self.child.wait();
        self.child = Self::spawn(&self.dir, &self.cli);
        self.wait_up()
    }

    pub fn conf_path(&self) -> PathBuf {
        self.dir.join("redis.conf")
    }

    pub fn log(&self) -> String {
        fs::read_to_string(self.dir.join("server.log")).unwrap_or_default()
    }

    pub fn conn(&self) -> redis::Connection {
        redis::Client::open(format!("redis://127.0.0.1:{}/", self.port))
            .and_then(|c| c.get_connection())
            .expect("connect")
    }
}

impl Drop for ConfServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        if std::env::var_os("FLOCK_KEEP_TMP").is_none() {
            let _ = fs::remove_dir_all(&self.dir);
        }
    }
}

// ---------------------------------------------------------------------------------------------
// replies
// ---------------------------------------------------------------------------------------------

/// A server reply in a shape convenient for assertions (RESP2 and RESP3).
#[derive(Clone, Debug, PartialEq)]
pub enum Reply {
    Nil,
    Int(i64),
    Bulk(Vec<u8>),
    Status(String),
    Array(Vec<Reply>),
    Map(Vec<(Reply, Reply)>),
    Double(f64),
    Bool(bool),
    /// full error text, e.g. "ERR invalid ttl" or "WRONGTYPE Operation against ..."
    Err(String),
    Other(String),
}

impl Reply {
    pub fn is_nil(&self) -> bool {
        matches!(self, Reply::Nil)
    }
    pub fn int(&self) -> Option<i64> {
        match self {
            Reply::Int(i) => Some(*i),
            _ => None,
        }
    }
    pub fn err(&self) -> Option<&str> {
        match self {
            Reply::Err(e) => Some(e),
            _ => None,
        }
    }
    pub fn is_err(&self) -> bool {
        matches!(self, Reply::Err(_))
    }
    /// Bulk or status as bytes.
    pub fn bytes(&self) -> Option<&[u8]> {
        match self {
            Reply::Bulk(b) => Some(b),
            Reply::Status(s) => Some(s.as_bytes()),
            _ => None,
        }
    }
    pub fn string(&self) -> Option<String> {
        self.bytes()
            .map(|b| String::from_utf8_lossy(b).into_owned())
    }
    pub fn array(&self) -> Option<&[Reply]> {
        match self {
            Reply::Array(a) => Some(a),
            _ => None,
        }
    }
    /// Field/value pairs of a RESP3 map or a RESP2 flat array.
    pub fn pairs(&self) -> Option<Vec<(Reply, Reply)>> {
        match self {
            Reply::Map(m) => Some(m.clone()),
            Reply::Array(a) if a.len() % 2 == 0 => {
                Some(a.chunks(2).map(|c| (c[0].clone(), c[1].clone())).collect())
            }
            _ => None,
        }
    }
}

fn convert(v: redis::Value) -> Reply {
    use redis::Value as V;
    match v {
        V::Nil => Reply::Nil,
        V::Int(i) => Reply::Int(i),
        V::BulkString(b) => Reply::Bulk(b),
        V::Array(a) | V::Set(a) => Reply::Array(a.into_iter().map(convert).collect()),
        V::SimpleString(s) => Reply::Status(s),
        V::Okay => Reply::Status("OK".into()),
        V::Map(m) => Reply::Map(
            m.into_iter()
                .map(|(k, v)| (convert(k), convert(v)))
                .collect(),
        ),
        V::Attribute { data, .. } => convert(*data),
        V::Double(d) => Reply::Double(d),
        V::Boolean(b) => Reply::Bool(b),
        V::VerbatimString { text, .. } => Reply::Bulk(text.into_bytes()),
        V::ServerError(e) => Reply::Err(match e.details() {
            Some(d) => format!("{} {}", e.code(), d),
            None => e.code().to_string(),
        }),
        other => Reply::Other(format!("{other:?}")),
    }
}

/// Send one command (binary-safe args); server errors become `Reply::Err`. Connection/IO
/// failures are returned as `Err` (e.g. the server died).
pub fn call_raw<A: AsRef<[u8]>>(con: &mut redis::Connection, args: &[A]) -> Result<Reply, String> {
    use redis::ConnectionLike;
    let mut cmd = redis::Cmd::new();
    for a in args {
        cmd.arg(a.as_ref());
    }
    match con.req_command(&cmd) {
        Ok(v) => Ok(convert(v)),
        Err(e) => match e.code() {
            Some(code) => Ok(Reply::Err(match e.detail() {
                Some(d) => format!("{code} {d}"),
                None => code.to_string(),
            })),
            None => Err(format!("connection error: {e}")),
        },
    }
}

/// Like `call_raw` but panics on a connection error.
pub fn call<A: AsRef<[u8]>>(con: &mut redis::Connection, args: &[A]) -> Reply {
    match call_raw(con, args) {
        Ok(r) => r,
        Err(e) => {
            let shown: Vec<String> = args.iter().map(|a| show(a.as_ref())).collect();
            panic!("{shown:?}: {e}")
        }
    }
}

/// Printable form of an argument (truncated).
pub fn show(b: &[u8]) -> String {
    let s: String = String::from_utf8_lossy(&b[..b.len().min(60)])
        .escape_debug()
        .collect();
    if b.len() > 60 {
        format!("{s}...({} bytes)", b.len())
    } else {
        s
    }
}

/// Assert that `r` is an error whose text starts with `prefix`.
#[track_caller]
pub fn assert_err_prefix(r: &Reply, prefix: &str, what: &str) {
    match r {
        Reply::Err(e) if e.starts_with(prefix) => {}
        other => panic!("{what}: expected an error starting with {prefix:?}, got {other:?}"),
    }
}

/// Assert that `r` is an error containing `needle`.
#[track_caller]
pub fn assert_err_contains(r: &Reply, needle: &str, what: &str) {
    match r {
        Reply::Err(e) if e.contains(needle) => {}
        other => panic!("{what}: expected an error containing {needle:?}, got {other:?}"),
    }
}

// ---------------------------------------------------------------------------------------------
// flock helpers
// ---------------------------------------------------------------------------------------------

#[derive(Clone, Debug, PartialEq)]
pub struct LockInfo {
    pub owner: Option<Vec<u8>>,
    pub token: i64,
    pub ttl: i64,
    pub waiters: i64,
    pub fields: Vec<(String, Reply)>,
}

#[track_caller]
pub fn acquire(con: &mut redis::Connection, key: &str, owner: &str, ttl: i64) -> Option<i64> {
    let r = call(con, &["FLOCK.ACQUIRE", key, owner, &ttl.to_string()]);
    match r {
        Reply::Nil => None,
        Reply::Int(t) => {
            assert!(t > 0 && t < TWO_POW_53, "token {t} out of range (0, 2^53)");
            Some(t)
        }
        other => panic!("FLOCK.ACQUIRE {key} {owner} {ttl}: unexpected reply {other:?}"),
    }
}

/// ACQUIRE that must be granted.
#[track_caller]
pub fn grant(con: &mut redis::Connection, key: &str, owner: &str, ttl: i64) -> i64 {
    acquire(con, key, owner, ttl)
        .unwrap_or_else(|| panic!("FLOCK.ACQUIRE {key} {owner} {ttl}: nil, expected a grant"))
}

#[track_caller]
pub fn release(con: &mut redis::Connection, key: &str, owner: &str) -> i64 {
    match call(con, &["FLOCK.RELEASE", key, owner]) {
        Reply::Int(i) if i == 0 || i == 1 => i,
        other => panic!("FLOCK.RELEASE {key} {owner}: unexpected reply {other:?}"),
    }
}

#[track_caller]
pub fn renew(con: &mut redis::Connection, key: &str, owner: &str, ttl: i64) -> Option<i64> {
    match call(con, &["FLOCK.RENEW", key, owner, &ttl.to_string()]) {
        Reply::Nil => None,
        Reply::Int(t) => Some(t),
        other => panic!("FLOCK.RENEW {key} {owner} {ttl}: unexpected reply {other:?}"),
    }
}

#[track_caller]
pub fn check(con: &mut redis::Connection, key: &str, token: i64) -> i64 {
    match call(con, &["FLOCK.CHECK", key, &token.to_string()]) {
        Reply::Int(i) if i >= 0 => i,
        other => panic!("FLOCK.CHECK {key} {token}: unexpected reply {other:?}"),
    }
}

/// Parse a FLOCK.INFO reply (RESP2 flat array or RESP3 map).
#[track_caller]
pub fn parse_info(r: &Reply, what: &str) -> Option<LockInfo> {
    if r.is_nil() {
        return None;
    }
    let pairs = r
        .pairs()
        .unwrap_or_else(|| panic!("{what}: FLOCK.INFO reply is not a map: {r:?}"));
    let mut fields = Vec::new();
    for (k, v) in pairs {
        let k = k
            .string()
            .unwrap_or_else(|| panic!("{what}: FLOCK.INFO field name not a string: {k:?}"));
        fields.push((k, v));
    }
    let get = |name: &str| -> Reply {
        fields
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.clone())
            .unwrap_or_else(|| panic!("{what}: FLOCK.INFO has no field {name:?}: {r:?}"))
    };
    let owner = match get("owner") {
        Reply::Nil => None,
        o => Some(
            o.bytes()
                .unwrap_or_else(|| panic!("{what}: owner not a string: {o:?}"))
                .to_vec(),
        ),
    };
    let int = |name: &str| -> i64 {
        let v = get(name);
        match v {
            Reply::Int(i) => i,
            // tolerate a numeric string
            ref b => b
                .string()
                .and_then(|s| s.parse().ok())
                .unwrap_or_else(|| panic!("{what}: field {name} not an integer: {v:?}")),
        }
    };
    Some(LockInfo {
        owner,
        token: int("token"),
        ttl: int("ttl"),
        waiters: int("waiters"),
        fields,
    })
}

#[track_caller]
pub fn info(con: &mut redis::Connection, key: &str) -> Option<LockInfo> {
    let r = call(con, &["FLOCK.INFO", key]);
    parse_info(&r, &format!("FLOCK.INFO {key}"))
}

/// `INFO key` that must show a holder; returns (owner as string, token, ttl).
#[track_caller]
pub fn held(con: &mut redis::Connection, key: &str) -> (String, i64, i64) {
    let i = info(con, key).unwrap_or_else(|| panic!("FLOCK.INFO {key}: nil, expected a holder"));
    let o = i
        .owner
        .clone()
        .unwrap_or_else(|| panic!("FLOCK.INFO {key}: no owner: {i:?}"));
    (String::from_utf8_lossy(&o).into_owned(), i.token, i.ttl)
}

#[track_caller]
pub fn exists(con: &mut redis::Connection, key: &str) -> i64 {
    call(con, &["EXISTS", key]).int().expect("EXISTS reply")
}

#[track_caller]
pub fn dbsize(con: &mut redis::Connection) -> i64 {
    call(con, &["DBSIZE"]).int().expect("DBSIZE reply")
}

/// A field of `INFO section` (e.g. `info_field(c, "replication", "master_link_status")`).
pub fn info_field(con: &mut redis::Connection, section: &str, field: &str) -> Option<String> {
    let r = call_raw(con, &["INFO", section]).ok()?;
    let text = r.string()?;
    for line in text.lines() {
        if let Some((k, v)) = line.split_once(':') {
            if k == field {
                return Some(v.trim().to_string());
            }
        }
    }
    None
}

/// Poll `cond` every ~15 ms until it holds or `timeout` passes; returns whether it held.
pub fn poll_until(timeout: Duration, mut cond: impl FnMut() -> bool) -> bool {
    let start = Instant::now();
    loop {
        if cond() {
            return true;
        }
        if start.elapsed() > timeout {
            return false;
        }
        sleep(POLL);
    }
}

/// Wait (up to `DEADLINE`) for `cond`; panic with `what` otherwise.
#[track_caller]
pub fn wait_until(what: &str, cond: impl FnMut() -> bool) {
    if !poll_until(DEADLINE, cond) {
        panic!("timed out after {DEADLINE:?} waiting for: {what}");
    }
}

/// `WAIT 1 5000` must report the replica.
#[track_caller]
pub fn wait_replica(con: &mut redis::Connection) {
    let r = call(con, &["WAIT", "1", "5000"]);
    assert!(r.int().unwrap_or(0) >= 1, "WAIT 1 5000: {r:?}");
}

/// BGREWRITEAOF and wait until it finished.
#[track_caller]
pub fn rewrite_aof(con: &mut redis::Connection) {
    // may answer "Background append only file rewriting started" or "scheduled"
    let r = call(con, &["BGREWRITEAOF"]);
    assert!(!r.is_err(), "BGREWRITEAOF: {r:?}");
    wait_until("AOF rewrite to finish", || {
        info_field(con, "persistence", "aof_rewrite_in_progress").as_deref() == Some("0")
            && info_field(con, "persistence", "aof_rewrite_scheduled").as_deref() == Some("0")
    });
    let st = info_field(con, "persistence", "aof_last_bgrewrite_status");
    assert_eq!(st.as_deref(), Some("ok"), "aof_last_bgrewrite_status");
}

/// Microseconds since the epoch (local wall clock).
pub fn now_us() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_micros() as i64)
        .unwrap_or(0)
}

/// Byte-substring search.
pub fn contains_bytes(hay: &[u8], needle: &[u8]) -> bool {
    needle.is_empty()
        || hay
            .windows(needle.len())
            .any(|w| w.eq_ignore_ascii_case(needle))
}

/// RESP encoding of one command (to write AOF files by hand).
pub fn resp_command<A: AsRef<[u8]>>(args: &[A]) -> Vec<u8> {
    let mut buf = format!("*{}\r\n", args.len()).into_bytes();
    for a in args {
        let a = a.as_ref();
        buf.extend_from_slice(format!("${}\r\n", a.len()).as_bytes());
        buf.extend_from_slice(a);
        buf.extend_from_slice(b"\r\n");
    }
    buf
}

/// Milliseconds since the epoch (local wall clock).
pub fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or(0)
}

// ---------------------------------------------------------------------------------------------
// a minimal raw RESP2 client (for fuzzing: redis-rs refuses error lines that are not UTF-8,
// and Redis echoes arguments in "unknown command" errors)
// ---------------------------------------------------------------------------------------------

pub struct RawConn {
    reader: std::io::BufReader<std::net::TcpStream>,
    writer: std::net::TcpStream,
}

impl RawConn {
    pub fn connect(port: u16) -> std::io::Result<RawConn> {
        let s = std::net::TcpStream::connect(("127.0.0.1", port))?;
        s.set_nodelay(true)?;
        s.set_read_timeout(Some(Duration::from_secs(30)))?;
        s.set_write_timeout(Some(Duration::from_secs(30)))?;
        Ok(RawConn {
            reader: std::io::BufReader::new(s.try_clone()?),
            writer: s,
        })
    }

    pub fn set_read_timeout(&self, d: Duration) -> std::io::Result<()> {
        self.writer.set_read_timeout(Some(d))
    }

    pub fn send<A: AsRef<[u8]>>(&mut self, args: &[A]) -> std::io::Result<()> {
        use std::io::Write;
        let mut buf = format!("*{}\r\n", args.len()).into_bytes();
        for a in args {
            let a = a.as_ref();
            buf.extend_from_slice(format!("${}\r\n", a.len()).as_bytes());
            buf.extend_from_slice(a);
            buf.extend_from_slice(b"\r\n");
        }
        self.writer.write_all(&buf)
    }

    pub fn call<A: AsRef<[u8]>>(&mut self, args: &[A]) -> std::io::Result<Reply> {
        self.send(args)?;
        self.read_reply()
    }

    fn line(&mut self) -> std::io::Result<Vec<u8>> {
        use std::io::BufRead;
        let mut l = Vec::new();
        let n = self.reader.read_until(b'\n', &mut l)?;
        if n == 0 {
            return Err(std::io::Error::new(
                std::io::ErrorKind::UnexpectedEof,
                "connection closed",
            ));
        }
        if l.ends_with(b"\r\n") {
            l.truncate(l.len() - 2);
        } else {
            return Err(std::io::Error::new(
                std::io::ErrorKind::InvalidData,
                "line without CRLF",
            ));
        }
        Ok(l)
    }

    pub fn read_reply(&mut self) -> std::io::Result<Reply> {
        let bad = |m: &str| std::io::Error::new(std::io::ErrorKind::InvalidData, m.to_string());
        let l = self.line()?;
        if l.is_empty() {
            return Err(bad("empty reply line"));
        }
        let rest = &l[1..];
        let num = || -> std::io::Result<i64> {
            std::str::from_utf8(rest)
                .ok()
                .and_then(|s| s.parse().ok())
                .ok_or_else(|| bad("bad number"))
        };
        match l[0] {
            b'+' => Ok(Reply::Status(String::from_utf8_lossy(rest).into_owned())),
            b'-' => Ok(Reply::Err(String::from_utf8_lossy(rest).into_owned())),
            b':' => Ok(Reply::Int(num()?)),
            b'$' => {
                let n = num()?;
                if n < 0 {
                    return Ok(Reply::Nil);
                }
                let mut b = vec![0u8; n as usize + 2];
                self.reader.read_exact(&mut b)?;
                b.truncate(n as usize);
                Ok(Reply::Bulk(b))
            }
            b'*' => {
                let n = num()?;
                if n < 0 {
                    return Ok(Reply::Nil);
                }
                let mut v = Vec::with_capacity(n as usize);
                for _ in 0..n {
                    v.push(self.read_reply()?);
                }
                Ok(Reply::Array(v))
            }
            _ => Err(bad("unknown reply type")),
        }
    }
}
