//! `make bench`: flock side by side with the locks people build from plain Redis today.
//!
//! ```text
//! cargo bench --bench flock [-- --quick] [--out DIR] [--only 1,3] [--no-callgrind]
//! ```
//!
//! Starts its own redis-server(s) on loopback (free port, temp dir, the shared harness
//! crates/flock-testkit), with a private copy of target/release/libredis_flock.so (so that a rebuild
//! during the run cannot change what is measured), runs every scenario of issue 7 and prints
//! one table per scenario. Every result is a ratio against a baseline measured in the same run,
//! interleaved with it, because the machines this runs on are shared and noisy.
//!
//! A full run writes docs/BENCHMARKS.md and docs/benchmarks.svg. `--quick` (QUICK=1 make
//! bench) uses smaller counts and shorter runs, says so in its output, and writes its report
//! to target/bench-quick/ so that it never replaces the published full run.
//!
//! Scenarios:
//! 1. server cost per call (INFO commandstats), pipelined, 8 connections, many keys;
//! 2. throughput of a full acquire+release cycle, pipelined and not;
//! 3. memory per held lock and memory left by released locks, and per held lock over a grid of
//!    key lengths x owner lengths against `SET NX PX` of the same key and owner;
//! 4. contention: N clients, one lock, a 1 ms critical section, BLOCK vs polling;
//! 5. scaling: ACQUIRE/RELEASE cost with many lock keys held and many waiters queued;
//! 7. lock kinds and BOUND: shared against exclusive, a key of 1,000 readers against one of
//!    1, BOUND against unbound, one more reader's memory against a held lock's;
//! 8. FLOCK.WATCH: one watcher told against one BLOCK waiter granted (p99 from RELEASE to
//!    reply), 1,000 watchers of one grant (first and last reply), 10,000 watchers of 10,000
//!    keys (last reply, replies/s), memory per idle watcher against per idle waiter.
//! 9. FLOCK.MACQUIRE: MACQUIRE of 3 free keys against one ACQUIRE (at most 3x).
//!
//! In a full run, when valgrind is installed, a short callgrind run counts instructions per
//! call (noise-free) and lists where flock's commands spend them.

mod callgrind;
mod chart;
mod config;
mod conn;
mod format;
mod measure;
mod recipes;
mod report;
mod scenarios;
mod system;

use crate::callgrind::*;
use crate::chart::*;
use crate::config::*;
use crate::format::*;
use crate::recipes::*;
use crate::report::*;
use crate::system::*;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::time::Instant;

/// Copy the module to a private path so a rebuild during the run changes nothing measured.
fn private_module(dir: &Path) -> PathBuf {
    let src = flock_testkit::module_path();
    let dst = dir.join("libredis_flock.so");
    std::fs::copy(&src, &dst).unwrap_or_else(|e| panic!("copy {}: {e}", src.display()));
    std::env::set_var("FLOCK_MODULE", &dst);
    src
}

fn main() {
    let cfg = Cfg::from_args();
    let started = Instant::now();
    let nofile = raise_nofile();
    let tmp = std::env::temp_dir().join(format!("flock-bench-{}", std::process::id()));
    std::fs::create_dir_all(&tmp).expect("temp dir");
    let module_src = private_module(&tmp);
    let load_before = loadavg();
    let date = date_utc();
    let server_version = run_out(&flock_testkit::server_binary(), &["--version"])
        .unwrap_or_else(|| "unknown".into());
    let commit =
        run_out("git", &["rev-parse", "--short", "HEAD"]).unwrap_or_else(|| "unknown".into());
    let dirty = run_out(
        "git",
        &[
            "status",
            "--porcelain",
            "--",
            "src",
            "Cargo.toml",
            "Cargo.lock",
        ],
    )
    .is_some_and(|s| !s.is_empty());
    eprintln!(
        "flock bench ({} mode): module {} (commit {commit}{}), {server_version}, load {load_before}",
        if cfg.quick { "QUICK" } else { "full" },
        module_src.display(),
        if dirty { ", uncommitted changes" } else { "" },
    );
    if load_before
        .split_whitespace()
        .next()
        .and_then(|v| v.parse::<f64>().ok())
        .is_some_and(|l| l > ncpu() as f64 * 0.5)
    {
        eprintln!("  note: the machine is busy (load {load_before}); the ratios hold up better than absolute numbers");
    }

    let mut rep = Report::default();
    type Scenario = fn(&Cfg, &mut Report, u64);
    let runs: [(u32, Scenario); 8] = [
        (1, |c, r, _| scenarios::cost::run(c, r)),
        (2, |c, r, _| scenarios::cycles::run(c, r)),
        (3, |c, r, _| scenarios::memory::run(c, r)),
        (4, |c, r, _| scenarios::contention::run(c, r)),
        (5, scenarios::scaling::run),
        (7, |c, r, _| scenarios::kinds::run(c, r)),
        (8, |c, r, _| scenarios::watch::run(c, r)),
        (9, |c, r, _| scenarios::multi::run(c, r)),
    ];
    for (i, run) in runs {
        if cfg.runs(i) {
            let t = Instant::now();
            run(&cfg, &mut rep, nofile);
            eprintln!("  [{i}] took {:.1} s", t.elapsed().as_secs_f64());
        }
    }
    // callgrind is "scenario 6": on by default in a full run, on request (--only 6) otherwise
    if cfg
        .only
        .as_ref()
        .map_or(cfg.callgrind && !cfg.quick, |o| o.contains(&6))
    {
        callgrind(&cfg, &mut rep);
    }
    let load_after = loadavg();
    let elapsed = started.elapsed().as_secs_f64();
    let _ = std::fs::remove_dir_all(&tmp);

    // ---- summary ----
    let targets: Vec<&Check> = rep.checks.iter().filter(|c| c.goal.is_some()).collect();
    let met = targets.iter().filter(|c| c.pass() == Some(true)).count();
    let mut summary = format!("{met} of {} targets met.\n\n", targets.len());
    summary += &table(
        &["scenario", "flock / baseline", "measured", "target", ""],
        &targets
            .iter()
            .map(|c| {
                vec![
                    c.section.to_string(),
                    c.what.clone(),
                    c.shown.clone(),
                    c.target_text.clone(),
                    c.mark().into(),
                ]
            })
            .collect::<Vec<_>>(),
    );
    println!("\n## Targets\n\n{summary}");
    println!(
        "\n{} mode, {:.0} s, load average {load_before} at the start, {load_after} at the end.",
        if cfg.quick { "QUICK" } else { "full" },
        elapsed
    );

    // ---- files ----
    let _ = std::fs::create_dir_all(&cfg.out);
    let chart_checks: Vec<&Check> = rep.checks.iter().filter(|c| c.ratio).collect();
    let title = format!(
        "flock vs the usual Redis locks{} ({})",
        if cfg.quick { ", QUICK run" } else { "" },
        date
    );
    let svg = svg_chart(&chart_checks, &title);
    let svg_path = cfg.out.join("benchmarks.svg");
    std::fs::write(&svg_path, svg).expect("write benchmarks.svg");

    let mut md = String::new();
    let _ = writeln!(md, "# flock benchmarks\n");
    let _ =
        writeln!(
        md,
        "flock next to the locks people build from plain Redis today, measured by `make bench` \
         ([benches/flock/](../benches/flock/)) on {date}{}. Every number that matters here is \
         a **ratio against a baseline measured in the same run** (interleaved with it), because \
         the machine is shared and noisy: absolute numbers move from run to run, the ratios much \
         less.\n",
        if cfg.quick { " in **QUICK mode** (smaller counts, shorter runs)" } else { "" }
    );
    let _ = writeln!(md, "![flock / baseline ratios](benchmarks.svg)\n");
    let _ = writeln!(md, "## Targets\n\n{summary}");
    let _ = writeln!(md, "## Setup\n");
    let mut setup_rows = machine();
    setup_rows.push((
        "load average (1, 5, 15 min)".into(),
        format!("{load_before} at the start, {load_after} at the end"),
    ));
    setup_rows.push(("server".into(), server_version.clone()));
    setup_rows.push((
        "module".into(),
        format!(
            "`target/release/libredis_flock.so` built by `cargo build --release` from commit `{commit}`{}",
            if dirty { " plus uncommitted changes to src/" } else { "" }
        ),
    ));
    setup_rows.push((
        "run".into(),
        format!(
            "{} mode, {elapsed:.0} s",
            if cfg.quick { "QUICK" } else { "full" }
        ),
    ));
    md += &table(
        &["", ""],
        &setup_rows
            .into_iter()
            .map(|(a, b)| vec![a, b])
            .collect::<Vec<_>>(),
    );
    let _ = writeln!(
        md,
        "\nEach scenario starts its own `redis-server` on 127.0.0.1 and a free port, in a temp \
         dir, with no persistence (as the test harness does: `redis-server --port P --bind \
         127.0.0.1 --dir D --save \"\" --appendonly no --loadmodule libredis_flock.so`; the \
         contention and waiters servers add `--maxclients`, the waiters one the module argument \
         `max-waiters 1000000`). Server and clients share the machine's {} cores over \
         loopback. Nothing consumes replication, so neither flock nor `SET` builds \
         replication effects (flock's `INFO flock_replicating_effects:0`).\n",
        ncpu()
    );
    for (title, body) in &rep.sections {
        let _ = writeln!(md, "## {title}\n\n{body}");
    }
    let notes = where_time_goes(&rep, &cfg);
    if !notes.is_empty() || rep.profile.is_some() {
        let _ = writeln!(md, "## Where the time goes\n");
        if !notes.is_empty() {
            let _ = writeln!(md, "For the targets this run missed:\n\n{notes}");
            println!("\n## Where the time goes\n\n{notes}");
        }
        if let Some(p) = &rep.profile {
            let _ = writeln!(md, "{p}");
        }
    }
    let _ = writeln!(md, "## Exact commands\n");
    let _ = writeln!(
        md,
        "```sh\nmake bench            # = make build, then: cargo bench --bench flock\nQUICK=1 make bench    # = cargo bench --bench flock -- --quick (report in target/bench-quick/)\n```\n"
    );
    let _ = writeln!(md, "Options after `--`: `--quick`, `--only 1,3` (scenarios), `--out DIR`, `--no-callgrind`. `REDIS_SERVER` and `FLOCK_MODULE` work as for the tests.\n");
    let _ = writeln!(
        md,
        "The Lua baselines (loaded with `SCRIPT LOAD`, run with `EVALSHA`):\n"
    );
    let _ = writeln!(md, "```lua\n-- compare-and-delete release: EVALSHA sha 1 key owner\n{CAD}\n\n-- fenced acquire: EVALSHA sha 2 key key:tok owner ttl\n{FENCE_ACQ}\n\n-- fenced write: EVALSHA sha 2 lock:tok data:key token value\n{FENCE_WRITE}\n```\n");
    let _ = writeln!(md, "Commands per scenario (`<owner>` is a 36-byte UUID-like string, `<T>` the lock's token):\n");
    let cmds = [
        "1: `FLOCK.ACQUIRE lock:NNNNNNN <owner> 60000`, `SET lock:NNNNNNN <owner> NX PX 60000`, `EVALSHA <fenced acquire> 2 lock:NNNNNNN lock:NNNNNNN:tok <owner> 60000`, `FLOCK.RELEASE lock:NNNNNNN <owner>`, `EVALSHA <compare-and-delete> 1 lock:NNNNNNN <owner>`, `FLOCK.CHECK wlk <T>`, `GET wlk:owner`, `FLOCK.FENCED wlk <T> SET data:NNNNNNN v`, `EVALSHA <fenced write> 2 wlk:tok data:NNNNNNN <T> v`, `SET data:NNNNNNN v`",
        "2: as in 1, on `cyc:NNNNNN` (random of 100,000), acquire then release",
        "3: as in 1, 100,000 locks, then `INFO memory` `used_memory`; the grid: `FLOCK.ACQUIRE key owner 60000` and `SET key owner NX PX 60000` of 50,000 keys of 8, 13, 20, 32, 48 bytes (`lock:grid...:NNNNNN`) and owners of 16, 36, 64 bytes",
        "4: `FLOCK.ACQUIRE lk <owner> 10000 BLOCK 2000` / `FLOCK.RELEASE lk <owner>`; `SET lk <owner> NX PX 10000` / `EVALSHA <compare-and-delete> 1 lk <owner>`",
        "5: preload `FLOCK.ACQUIRE h:NNNNNNN <owner> 3600000` and `SET s:NNNNNNN <owner> NX PX 3600000`; probes `FLOCK.ACQUIRE p:NNNNNNN <owner> 60000` + `FLOCK.RELEASE p:NNNNNNN <owner>` (baseline `SET ... NX PX` + compare-and-delete); waiters `FLOCK.ACQUIRE busy w<i>-<j> 3600000 BLOCK 0`; `FLOCK.ACQUIRE busy newcomer 60000`; `FLOCK.INFO busy` then `FLOCK.RELEASE busy <owner>`",
    ];
    for c in cmds {
        let _ = writeln!(md, "- {c}");
    }
    let _ = writeln!(md, "\nusec per call comes from `INFO commandstats` (`usec` / `calls`) after `CONFIG RESETSTAT`: the server's time inside the command, without reading, parsing and replying.");
    if !rep.notes.is_empty() {
        let _ = writeln!(md, "\n## Notes\n");
        for n in &rep.notes {
            let _ = writeln!(md, "- {n}");
        }
    }
    let md_path = cfg.out.join("BENCHMARKS.md");
    std::fs::write(&md_path, md).expect("write BENCHMARKS.md");
    for n in &rep.notes {
        println!("note: {n}");
    }
    println!("wrote {} and {}", md_path.display(), svg_path.display());
}
