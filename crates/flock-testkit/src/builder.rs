//! How a throw-away server is described before it starts: module and its arguments, config
//! options, a replica's master, another binary, environment, wrapper, dir, config file,
//! timeouts; and the start itself, which retries when the port it picked was taken.

use crate::env::{free_port, module_path, server_binary, temp_dir};
use crate::server::Server;
use crate::wait::DEADLINE;
use std::fs;
use std::path::{Path, PathBuf};
use std::time::Duration;

#[derive(Clone)]
pub struct ServerBuilder {
    pub(crate) bin: Option<PathBuf>,
    pub(crate) module: Option<PathBuf>,
    pub(crate) no_module: bool,
    pub(crate) module_args: Vec<String>,
    /// `--name values...` options after the defaults (so that they override them).
    pub(crate) extra: Vec<Vec<String>>,
    pub(crate) replica_of: Option<u16>,
    pub(crate) env: Vec<(String, String)>,
    pub(crate) wrapper: Vec<String>,
    pub(crate) dir: Option<PathBuf>,
    /// Lines of a redis.conf the server starts from (see `config_file`).
    pub(crate) config_file: Option<Vec<String>>,
    pub(crate) start_timeout: Duration,
    pub(crate) io_timeout: Duration,
}

impl Default for ServerBuilder {
    fn default() -> Self {
        ServerBuilder {
            bin: None,
            module: None,
            no_module: false,
            module_args: Vec::new(),
            extra: Vec::new(),
            replica_of: None,
            env: Vec::new(),
            wrapper: Vec::new(),
            dir: None,
            config_file: None,
            start_timeout: DEADLINE,
            io_timeout: Duration::from_secs(30),
        }
    }
}

impl ServerBuilder {
    /// Arguments appended after `--loadmodule PATH`, e.g. `&["max-ttl-ms", "5000"]`.
    pub fn module_args(mut self, args: &[&str]) -> Self {
        self.module_args.extend(args.iter().map(|s| s.to_string()));
        self
    }
    /// An extra `--name value` config option (later ones override the defaults).
    pub fn arg(self, name: &str, value: &str) -> Self {
        self.args(name, &[value])
    }
    /// An extra option with several values, e.g. `args("save", &["900", "1"])`.
    pub fn args(mut self, name: &str, values: &[&str]) -> Self {
        let mut v = vec![name.trim_start_matches("--").to_string()];
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
    /// Another server binary than `REDIS_SERVER` (e.g. valkey-server for the adversity tests).
    pub fn bin(mut self, bin: &Path) -> Self {
        self.bin = Some(bin.to_path_buf());
        self
    }
    /// Another module file than `FLOCK_MODULE` (e.g. a copy patched to load libfaketime).
    pub fn module(mut self, module: &Path) -> Self {
        self.module = Some(module.to_path_buf());
        self
    }
    /// An environment variable of the server process.
    pub fn env(mut self, name: &str, value: &str) -> Self {
        self.env.push((name.to_string(), value.to_string()));
        self
    }
    /// A command the server runs under, e.g. `["valgrind", "--leak-check=full"]`.
    pub fn wrapper(mut self, cmd: &[String]) -> Self {
        self.wrapper = cmd.to_vec();
        self
    }
    /// Run in `dir` (made by the caller, e.g. with `temp_dir`, because something must go
    /// there before the start); it is removed on drop like a dir of our own.
    pub fn dir(mut self, dir: PathBuf) -> Self {
        self.dir = Some(dir);
        self
    }
    /// Start from a redis.conf in the server's dir, as an operator starts a server (CONFIG
    /// REWRITE needs a file to write): the `loadmodule` line, `lines`, and the port, dir and
    /// log file the harness sets; none of the other defaults. The `arg`/`args` options go on
    /// the command line after it (where the server treats them as config-file lines too).
    /// Written once: a restart reads what CONFIG REWRITE made of it.
    pub fn config_file(mut self, lines: &[&str]) -> Self {
        self.config_file = Some(lines.iter().map(|s| s.to_string()).collect());
        self
    }
    /// How long a start may take until PING answers (a server under valgrind is slow).
    pub fn start_timeout(mut self, d: Duration) -> Self {
        self.start_timeout = d;
        self
    }
    /// Read/write timeout of `conn()` connections.
    pub fn io_timeout(mut self, d: Duration) -> Self {
        self.io_timeout = d;
        self
    }

    /// Start, and panic (with the log) when the server does not come up.
    pub fn start(self) -> Server {
        match self.try_start() {
            Ok(srv) => srv,
            Err(log) => panic!("server exited at start:\n{log}"),
        }
    }

    /// Start; when the server exits at start (e.g. the module refuses to load), its whole log
    /// instead. Panics when it neither answers nor exits within the start timeout.
    pub fn try_start(mut self) -> Result<Server, String> {
        let module = if self.no_module {
            None
        } else {
            Some(self.module.take().unwrap_or_else(module_path))
        };
        let mut srv = Server {
            child: None,
            port: 0,
            dir: self.dir.take().unwrap_or_else(|| temp_dir("test")),
            bin: self
                .bin
                .take()
                .unwrap_or_else(|| PathBuf::from(server_binary())),
            module,
            cfg: self,
        };
        // The port we picked may get taken between probing and the server's bind: retry.
        let mut last_err = String::new();
        for _ in 0..5 {
            srv.port = free_port();
            srv.write_config_file();
            match srv.spawn_and_wait() {
                Ok(()) => {
                    if srv.cfg.replica_of.is_some() {
                        srv.wait_link_up();
                    }
                    return Ok(srv);
                }
                Err(StartFailure::Exited(e)) if e.contains("Address already in use") => {
                    last_err = e
                }
                Err(StartFailure::Exited(_)) => {
                    let stdio = fs::read_to_string(srv.dir.join("stdio.log")).unwrap_or_default();
                    return Err(srv.log() + &stdio);
                }
                Err(StartFailure::Failed(e)) => panic!("{e}"),
            }
        }
        panic!("server did not start (port trouble): {last_err}");
    }
}

/// Why a start failed: the process exited (its message and log tail), or it could not be
/// run or neither answered PING nor exited in time.
pub(crate) enum StartFailure {
    Exited(String),
    Failed(String),
}

impl StartFailure {
    pub(crate) fn message(self) -> String {
        match self {
            StartFailure::Exited(m) | StartFailure::Failed(m) => m,
        }
    }
}
