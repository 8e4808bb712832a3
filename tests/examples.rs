//! The runnable examples in examples/ (Python 3 + redis-py): each runs against a throw-away
//! server and must exit 0. A missing redis-py fails the test (never a silent skip): `make test`
//! installs it (scripts/deps.sh).

use flock_testkit::*;
use std::io::Read;
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::{Command, Stdio};
use std::thread::sleep;
use std::time::{Duration, Instant};

/// An example that runs longer than this is killed and fails (each takes about a second).
const EXAMPLE_TIMEOUT: Duration = Duration::from_secs(120);

fn require_redis_py() {
    let out = Command::new(python())
        .args(["-c", "import redis"])
        .output()
        .unwrap_or_else(|e| {
            panic!("cannot run python3 ({e}): the examples need Python 3; run `make test`")
        });
    if !out.status.success() {
        panic!(
            "python3 cannot import redis (redis-py), which the examples need: run `make test` \
             (it installs it), or `.venv/bin/pip install redis`\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
}

/// Run `python3 examples/<name>.py --port <port>` and fail with its output unless it exits 0.
fn run_example(name: &str) {
    require_redis_py();
    let srv = Server::start();
    let script = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("examples")
        .join(format!("{name}.py"));
    assert!(script.is_file(), "{} is missing", script.display());
    let mut child = Command::new(python())
        .arg(&script)
        .args(["--port", &srv.port().to_string(), "--host", "127.0.0.1"])
        .env("PYTHONUNBUFFERED", "1")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        // its own process group, so that a timeout kills the example's children too
        .process_group(0)
        .spawn()
        .unwrap_or_else(|e| panic!("cannot run python3 {}: {e}", script.display()));
    let pgid = child.id();
    let mut out_pipe = child.stdout.take().expect("stdout");
    let mut err_pipe = child.stderr.take().expect("stderr");
    let out_t = std::thread::spawn(move || {
        let mut s = Vec::new();
        let _ = out_pipe.read_to_end(&mut s);
        s
    });
    let err_t = std::thread::spawn(move || {
        let mut s = Vec::new();
        let _ = err_pipe.read_to_end(&mut s);
        s
    });
    let start = Instant::now();
    let status = loop {
        if let Some(st) = child.try_wait().expect("wait for python3") {
            break Some(st);
        }
        if start.elapsed() > EXAMPLE_TIMEOUT {
            break None;
        }
        sleep(Duration::from_millis(20));
    };
    // Whatever is left of the example's process group (a stopped child after a failure, or
    // everything after a timeout) goes now, so that the pipes close.
    let _ = Command::new("kill")
        .args(["-KILL", "--", &format!("-{pgid}")])
        .stderr(Stdio::null())
        .status();
    if status.is_none() {
        let _ = child.kill();
        let _ = child.wait();
    }
    let stdout = String::from_utf8_lossy(&out_t.join().expect("stdout reader")).into_owned();
    let stderr = String::from_utf8_lossy(&err_t.join().expect("stderr reader")).into_owned();
    match status {
        Some(st) if st.success() => {
            // shown with --nocapture
            println!("--- examples/{name}.py ---\n{stdout}");
        }
        Some(st) => panic!(
            "examples/{name}.py failed ({st})\n--- stdout ---\n{stdout}\n--- stderr ---\n{stderr}\n{}",
            srv.log_tail(20)
        ),
        None => panic!(
            "examples/{name}.py did not finish within {EXAMPLE_TIMEOUT:?} (killed)\n\
             --- stdout ---\n{stdout}\n--- stderr ---\n{stderr}\n{}",
            srv.log_tail(20)
        ),
    }
}

#[test]
fn example_gc_pause() {
    run_example("gc_pause");
}

#[test]
fn example_sql_fence() {
    run_example("sql_fence");
}

#[test]
fn example_ttl_advice() {
    run_example("ttl_advice");
}
