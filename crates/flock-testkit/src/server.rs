//! Throw-away servers: one redis-server (or valkey-server) process with the module loaded, in
//! its own temp dir on its own loopback port, SIGKILLed and its dir removed on drop. The
//! builder covers the unusual ones too: another binary, no module or a patched copy, extra
//! environment (libfaketime) and a wrapper command (valgrind).

use crate::builder::{ServerBuilder, StartFailure};
use crate::env::tail;
use crate::info::info_field;
use crate::raw::RawConn;
use crate::reply::Reply;
use crate::wait::{poll_until, DEADLINE, POLL};
use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::thread::sleep;
use std::time::{Duration, Instant};

pub struct Server {
    pub(crate) child: Option<Child>,
    pub(crate) port: u16,
    pub(crate) dir: PathBuf,
    pub(crate) bin: PathBuf,
    pub(crate) module: Option<PathBuf>,
    pub(crate) cfg: ServerBuilder,
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

    /// The whole server log.
    pub fn log(&self) -> String {
        fs::read_to_string(self.log_path()).unwrap_or_default()
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
        self.child
            .as_mut()
            .is_some_and(|c| matches!(c.try_wait(), Ok(None)))
    }

    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}/", self.port)
    }

    /// A new RESP2 connection (with the builder's read timeout, 30 s by default, so that a
    /// hung server fails the test).
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
        c.set_read_timeout(Some(self.cfg.io_timeout))
            .expect("read timeout");
        c.set_write_timeout(Some(self.cfg.io_timeout))
            .expect("write timeout");
        c
    }

    /// A new RESP2 connection authenticated as ACL user `user` with `password`.
    #[track_caller]
    pub fn conn_as(&self, user: &str, password: &str) -> redis::Connection {
        let mut c = self.conn();
        let r = crate::reply::call(&mut c, &["AUTH", user, password]);
        assert_eq!(r, Reply::Status("OK".into()), "AUTH {user}");
        c
    }

    /// A new raw RESP2 connection (see [`RawConn`]).
    pub fn raw(&self) -> RawConn {
        RawConn::connect(self.port)
            .unwrap_or_else(|e| panic!("connect {}: {e}\n{}", self.port, self.log_tail(30)))
    }

    pub(crate) fn config_file_path(&self) -> PathBuf {
        self.dir.join("redis.conf")
    }

    /// Write the redis.conf of a `config_file` server, as an operator would: the module's
    /// `loadmodule` line, the test's lines, then what the harness must decide (port, bind, dir,
    /// log file, replica of) last so that it wins.
    pub(crate) fn write_config_file(&self) {
        let Some(lines) = &self.cfg.config_file else {
            return;
        };
        let mut text = String::new();
        if let Some(m) = &self.module {
            text += &format!(
                "loadmodule {} {}\n",
                m.display(),
                self.cfg.module_args.join(" ")
            );
        }
        for l in lines {
            text += l;
            text.push('\n');
        }
        text += &format!(
            "port {}\nbind 127.0.0.1\ndir {}\nlogfile server.log\ndaemonize no\n",
            self.port,
            self.dir.display()
        );
        if let Some(p) = self.cfg.replica_of {
            text += &format!("replicaof 127.0.0.1 {p}\n");
        }
        fs::write(self.config_file_path(), text).expect("write redis.conf");
    }

    /// `--name value` pairs every server gets (the test's options come after and win).
    fn default_options(&self) -> Vec<String> {
        [
            "--port",
            &self.port.to_string(),
            "--bind",
            "127.0.0.1",
            "--dir",
            &self.dir.display().to_string(),
            "--save",
            "",
            "--appendonly",
            "no",
            "--daemonize",
            "no",
            "--enable-debug-command",
            "yes",
            // replicas sync at once instead of after the default 5 s diskless delay
            "--repl-diskless-sync-delay",
            "0",
            "--logfile",
            "server.log",
        ]
        .iter()
        .map(|s| s.to_string())
        .collect()
    }

    fn command_line(&self) -> Vec<String> {
        let mut a = if self.cfg.config_file.is_some() {
            vec![self.config_file_path().display().to_string()]
        } else {
            self.default_options()
        };
        if self.cfg.config_file.is_some() {
            // module, port, dir and replica are in the file
        } else if let Some(m) = &self.module {
            a.push("--loadmodule".into());
            a.push(m.display().to_string());
            a.extend(self.cfg.module_args.iter().cloned());
        }
        if let Some(p) = self
            .cfg
            .replica_of
            .filter(|_| self.cfg.config_file.is_none())
        {
            a.extend(["--replicaof".into(), "127.0.0.1".into(), p.to_string()]);
        }
        for opt in &self.cfg.extra {
            a.push(format!("--{}", opt[0]));
            a.extend(opt[1..].iter().cloned());
        }
        a
    }

    pub(crate) fn spawn_and_wait(&mut self) -> Result<(), StartFailure> {
        let stdio = fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.dir.join("stdio.log"))
            .map_err(|e| StartFailure::Failed(format!("open stdio.log: {e}")))?;
        let stdio2 = stdio
            .try_clone()
            .map_err(|e| StartFailure::Failed(e.to_string()))?;
        let args = self.command_line();
        // With a wrapper the program is its first word and the server binary an argument.
        let (prog, mut pre) = match self.cfg.wrapper.split_first() {
            Some((w, rest)) => (PathBuf::from(w), rest.to_vec()),
            None => (self.bin.clone(), Vec::new()),
        };
        if !self.cfg.wrapper.is_empty() {
            pre.push(self.bin.display().to_string());
        }
        let mut cmd = Command::new(&prog);
        cmd.args(&pre)
            .args(&args)
            .current_dir(&self.dir)
            .stdin(Stdio::null())
            .stdout(stdio)
            .stderr(stdio2);
        for (k, v) in &self.cfg.env {
            cmd.env(k, v);
        }
        let child = cmd.spawn().map_err(|e| {
            StartFailure::Failed(format!(
                "cannot run {} (set REDIS_SERVER?): {e}",
                prog.display()
            ))
        })?;
        self.child = Some(child);
        let start = Instant::now();
        loop {
            if let Some(c) = self.child.as_mut() {
                if let Ok(Some(status)) = c.try_wait() {
                    self.child = None;
                    return Err(StartFailure::Exited(format!(
                        "{} exited at start ({status}); args {args:?}\n{}",
                        self.bin.display(),
                        self.log_tail(40)
                    )));
                }
            }
            if self.ping_ok() {
                return Ok(());
            }
            if start.elapsed() > self.cfg.start_timeout {
                let log = self.log_tail(40);
                self.kill();
                return Err(StartFailure::Failed(format!(
                    "{} did not answer PING within {:?}; args {args:?}\n{log}",
                    self.bin.display(),
                    self.cfg.start_timeout,
                )));
            }
            sleep(Duration::from_millis(20));
        }
    }

    fn ping_ok(&self) -> bool {
        let Ok(mut c) = RawConn::connect(self.port) else {
            return false;
        };
        let _ = c.set_read_timeout(Duration::from_secs(5));
        matches!(c.call(&["PING"]), Ok(Reply::Status(ref s)) if s == "PONG")
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
            panic!("restart failed: {}", e.message());
        }
        // A restarted replica is not waited on: its master may be gone on purpose; call
        // `wait_link_up()` when the link matters.
    }

    /// Kill (no save) and start again with the same dir/port/args: RDB/AOF files are reused.
    pub fn restart(&mut self) {
        self.stop();
        self.start_again();
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
        signal(self.pid().expect("server not running"), sig);
    }

    /// A redis-rs client for this server (for a client under test to open its own
    /// connections from).
    pub fn client(&self) -> redis::Client {
        redis::Client::open(self.url()).expect("client")
    }

    /// `SHUTDOWN SAVE` or `SHUTDOWN NOSAVE`, then wait up to `within` for the process to exit
    /// (valgrind writes its report then). Returns whether it exited; the server stays stopped.
    pub fn shutdown_within(&mut self, save: bool, within: Duration) -> bool {
        if let Ok(mut c) = RawConn::connect(self.port) {
            let _ = c.call(&["SHUTDOWN", if save { "SAVE" } else { "NOSAVE" }]);
        }
        let t0 = Instant::now();
        while let Some(c) = self.child.as_mut() {
            if let Ok(Some(_)) = c.try_wait() {
                self.child = None;
                return true;
            }
            if t0.elapsed() > within {
                return false;
            }
            sleep(POLL);
        }
        true
    }

    fn shutdown_or_panic(&mut self, save: bool) {
        if !self.shutdown_within(save, DEADLINE) {
            let log = self.log_tail(30);
            self.kill();
            panic!("server did not exit after SHUTDOWN (save: {save})\n{log}");
        }
    }

    /// `SHUTDOWN SAVE` and wait for the process to exit (the server stays stopped).
    pub fn shutdown_save(&mut self) {
        self.shutdown_or_panic(true);
    }

    /// `SHUTDOWN NOSAVE` and wait for the process to exit (the server stays stopped).
    pub fn shutdown_nosave(&mut self) {
        self.shutdown_or_panic(false);
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
                "replica on port {} did not link up within {DEADLINE:?}\n{}",
                self.port,
                self.log_tail(40)
            );
        }
        let Some(mport) = self.cfg.replica_of else {
            return;
        };
        let Ok(mut mc) = RawConn::connect(mport) else {
            return;
        };
        let me = format!("port={},state=online", self.port);
        let ok = poll_until(DEADLINE, || {
            crate::info::info_text(&mut mc, "replication").contains(&me)
        });
        if !ok {
            panic!(
                "master on port {mport} does not list replica {} as online\n{}",
                self.port,
                self.log_tail(40)
            );
        }
    }

    /// The server log shows no crash and no Rust panic.
    pub fn assert_log_clean(&self) {
        let log = fs::read_to_string(self.log_path()).unwrap_or_default()
            + &fs::read_to_string(self.dir.join("stdio.log")).unwrap_or_default();
        assert!(
            !log.contains("BUG REPORT") && !log.contains("panicked"),
            "server log shows a crash or a panic:\n{}",
            self.log_tail(60)
        );
    }
}

/// Send a signal to any process of the test's (e.g. a child process that holds a lock) with
/// the `kill` utility, as [`Server::signal`] does to a server.
pub fn signal(pid: u32, sig: &str) {
    let st = Command::new("kill")
        .arg(format!("-{sig}"))
        .arg(pid.to_string())
        .status()
        .expect("run kill");
    assert!(st.success(), "kill -{sig} {pid} failed");
}

impl Drop for Server {
    fn drop(&mut self) {
        // a SIGSTOPped server dies from SIGKILL too, but `wait` is happier when it runs
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
