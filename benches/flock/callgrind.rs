//! Callgrind: instructions per call under valgrind (noise-free), and where flock's commands
//! spend them (the call tree of callgrind_annotate).

use crate::config::*;
use crate::conn::*;
use crate::format::*;
use crate::measure::*;
use crate::recipes::*;
use crate::report::*;
use crate::system::*;
use flock_testkit::*;
use std::collections::BTreeMap;
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::thread::sleep;
use std::time::{Duration, Instant};

pub(crate) fn callgrind(cfg: &Cfg, rep: &mut Report) {
    let have = |cmd: &str| {
        Command::new(cmd)
            .arg("--version")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_ok()
    };
    if !have("valgrind") || !have("callgrind_annotate") || !have("callgrind_control") {
        rep.notes
            .push("valgrind/callgrind_annotate not installed: no instruction counts.".into());
        return;
    }
    eprintln!(
        "[callgrind] instructions per call ({} calls per command)",
        thousands(cfg.cg_calls)
    );
    let dir = std::env::temp_dir().join(format!("flock-bench-cg-{}", std::process::id()));
    let _ = std::fs::create_dir_all(&dir);
    let port = flock_testkit::free_port();
    let module = flock_testkit::module_path();
    let mut child = match Command::new("valgrind")
        .args([
            "--tool=callgrind",
            "--cache-sim=yes",
            "--dump-instr=no",
            &format!("--callgrind-out-file={}/cg.out", dir.display()),
            &flock_testkit::server_binary(),
            "--port",
            &port.to_string(),
            "--bind",
            "127.0.0.1",
            "--dir",
            &dir.display().to_string(),
            "--save",
            "",
            "--appendonly",
            "no",
            "--loadmodule",
            &module.display().to_string(),
        ])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
    {
        Ok(c) => c,
        Err(e) => {
            rep.notes.push(format!("could not run valgrind: {e}"));
            return;
        }
    };
    let pid = child.id().to_string();
    let start = Instant::now();
    let mut c = loop {
        if let Ok(s) = TcpStream::connect(("127.0.0.1", port)) {
            drop(s);
            let mut c = Conn::open(port);
            if matches!(c.call(&["PING"]), Reply::Status(_)) {
                break c;
            }
        }
        if start.elapsed() > Duration::from_secs(120) {
            let _ = child.kill();
            rep.notes
                .push("redis-server under valgrind did not start.".into());
            return;
        }
        sleep(Duration::from_millis(200));
    };
    let cad = c.script(CAD);
    let facq = c.script(FENCE_ACQ);
    let fw = c.script(FENCE_WRITE);
    let delifeq = has_delifeq(&mut c);
    let owner = uuid(424242);
    let tok = c
        .call(&["FLOCK.ACQUIRE", "wlk", &owner, LONG_TTL])
        .int()
        .unwrap_or(0)
        .to_string();
    c.call(&["SET", "wlk:tok", &tok]);
    c.call(&["SET", "wlk:owner", &owner]);
    let n = cfg.cg_calls;
    type Maker<'a> = Box<dyn Fn(usize, &mut Conn) + 'a>;
    let mut phases: Vec<(&str, &str, Maker)> = vec![
        (
            "FLOCK.ACQUIRE",
            "flock",
            Box::new(|i, c: &mut Conn| {
                c.push(&["FLOCK.ACQUIRE", &format!("f:{i:07}"), &uuid(i), TTL])
            }),
        ),
        (
            "SET NX PX",
            "set",
            Box::new(|i, c: &mut Conn| {
                c.push(&["SET", &format!("s:{i:07}"), &uuid(i), "NX", "PX", TTL])
            }),
        ),
        (
            "FLOCK.MACQUIRE of 3",
            "flock",
            Box::new(|i, c: &mut Conn| {
                // Keys as long as the ACQUIRE phase's (`f:0000001`), so that the key's own
                // cost in the keyspace is the same per key.
                let keys = [0, 1, 2].map(|j| format!("{j}:{i:07}"));
                c.push(&[
                    "FLOCK.MACQUIRE",
                    "3",
                    &keys[0],
                    &keys[1],
                    &keys[2],
                    &uuid(i),
                    TTL,
                ])
            }),
        ),
        (
            "Lua fenced acquire",
            "lua",
            Box::new(|i, c: &mut Conn| {
                push_acquire(c, Kind::LuaFenced, &format!("l:{i:07}"), &uuid(i), &facq)
            }),
        ),
        (
            "FLOCK.RELEASE",
            "flock",
            Box::new(|i, c: &mut Conn| c.push(&["FLOCK.RELEASE", &format!("f:{i:07}"), &uuid(i)])),
        ),
        (
            "Lua compare-and-delete",
            "set",
            Box::new(|i, c: &mut Conn| {
                c.push(&["EVALSHA", &cad, "1", &format!("s:{i:07}"), &uuid(i)])
            }),
        ),
        (
            "FLOCK.CHECK",
            "flock",
            Box::new(|_, c: &mut Conn| c.push(&["FLOCK.CHECK", "wlk", &tok])),
        ),
        (
            "GET",
            "get",
            Box::new(|_, c: &mut Conn| c.push(&["GET", "wlk:owner"])),
        ),
        (
            "FLOCK.FENCED + SET",
            "flock",
            Box::new(|i, c: &mut Conn| push_fenced_write(c, None, i, &tok)),
        ),
        (
            "Lua token check + SET",
            "lua",
            Box::new(|i, c: &mut Conn| push_fenced_write(c, Some(&fw), i, &tok)),
        ),
    ];
    if delifeq {
        // Valkey 9's owner-checked delete, on keys of its own (their SETs are a phase of their
        // own, not reported).
        phases.push((
            "SET NX PX, keys for DELIFEQ",
            "set",
            Box::new(|i, c: &mut Conn| {
                c.push(&["SET", &format!("d:{i:07}"), &uuid(i), "NX", "PX", TTL])
            }),
        ));
        phases.push((
            "DELIFEQ",
            "set",
            Box::new(|i, c: &mut Conn| c.push(&["DELIFEQ", &format!("d:{i:07}"), &uuid(i)])),
        ));
    }
    let mut files = vec![];
    let _ = run_out("callgrind_control", &["-z", &pid]);
    for (pi, (name, _, make)) in phases.iter().enumerate() {
        let mut t = Tally::default();
        for i in 0..n {
            make(i, &mut c);
            if i % 16 == 15 {
                c.drain(&mut t);
            }
        }
        c.drain(&mut t);
        if t.err > 0 {
            eprintln!("  warning: callgrind phase {name}: {t:?}");
        }
        let _ = run_out("callgrind_control", &[&format!("--dump=phase{pi}"), &pid]);
        files.push(pi);
    }
    c.push(&["SHUTDOWN", "NOSAVE"]); // no reply: the server closes the connection
    c.flush();
    let _ = child.wait();
    // parse the dumps: cg.out.<pid>.<n> in order (the first dump after -z)
    let mut dumps: Vec<PathBuf> = std::fs::read_dir(&dir)
        .map(|rd| rd.flatten().map(|e| e.path()).collect())
        .unwrap_or_default();
    dumps.retain(|p| {
        let s = p.display().to_string();
        s.contains("cg.out") && std::fs::read_to_string(p).is_ok_and(|t| t.contains("phase"))
    });
    let phase_of = |p: &Path| -> Option<usize> {
        let t = std::fs::read_to_string(p).ok()?;
        let l = t.lines().find(|l| l.starts_with("desc: Trigger:"))?;
        let i = l.find("phase")?;
        l[i + 5..]
            .trim()
            .trim_end_matches(|ch: char| !ch.is_ascii_digit())
            .parse()
            .ok()
    };
    let mut per_phase: BTreeMap<usize, PathBuf> = BTreeMap::new();
    for p in dumps {
        if let Some(i) = phase_of(&p) {
            per_phase.insert(i, p);
        }
    }
    let mut ir = BTreeMap::new();
    let mut details = String::new();
    for (pi, (name, _, _)) in phases.iter().enumerate() {
        let Some(p) = per_phase.get(&pi) else {
            continue;
        };
        let Some(out) = run_out(
            "callgrind_annotate",
            &[
                "--inclusive=yes",
                "--tree=calling",
                "--threshold=100",
                &p.display().to_string(),
            ],
        ) else {
            continue;
        };
        let (tree, events, names) = parse_tree(&out);
        let total: f64 = out
            .lines()
            .find(|l| l.contains("PROGRAM TOTALS"))
            .and_then(|l| l.split_whitespace().next())
            .map(|v| v.replace(',', "").parse().unwrap_or(f64::NAN))
            .unwrap_or(f64::NAN);
        // per call, inside call(): Ir, I1 misses, D1 misses, LL data misses
        let ev = |e: &[&str]| -> f64 {
            let Some(v) = events.get("call") else {
                return f64::NAN;
            };
            let mut sum = 0.0;
            for name in e {
                match names.iter().position(|x| x == name) {
                    Some(i) if i < v.len() => sum += v[i],
                    _ => return f64::NAN,
                }
            }
            sum / n as f64
        };
        ir.insert(
            *name,
            [
                ev(&["Ir"]),
                ev(&["I1mr"]),
                ev(&["D1mr", "D1mw"]),
                ev(&["DLmr", "DLmw"]),
                total / n as f64,
            ],
        );
        if [
            "FLOCK.ACQUIRE",
            "SET NX PX",
            "FLOCK.RELEASE",
            "FLOCK.CHECK",
            "FLOCK.FENCED + SET",
            "DELIFEQ",
            "FLOCK.MACQUIRE of 3",
        ]
        .contains(name)
        {
            details += &breakdown(name, &tree, n as f64);
        }
    }
    if std::env::var_os("FLOCK_BENCH_KEEP_CG").is_some() {
        eprintln!("  callgrind dumps kept in {}", dir.display());
    } else {
        let _ = std::fs::remove_dir_all(&dir);
    }
    if ir.is_empty() {
        rep.notes.push("callgrind produced no usable dumps.".into());
        return;
    }
    let get = |k: &str| ir.get(k).copied().unwrap_or([f64::NAN; 5]);
    let mut pairs = vec![
        ("FLOCK.ACQUIRE", "SET NX PX"),
        ("FLOCK.ACQUIRE", "Lua fenced acquire"),
        ("FLOCK.RELEASE", "Lua compare-and-delete"),
        ("FLOCK.CHECK", "GET"),
        ("FLOCK.FENCED + SET", "Lua token check + SET"),
        ("FLOCK.MACQUIRE of 3", "FLOCK.ACQUIRE"),
    ];
    if delifeq {
        pairs.insert(3, ("FLOCK.RELEASE", "DELIFEQ"));
    }
    let mut rows = vec![];
    for (i, k) in ["ir", "i1", "d1", "ll"].iter().enumerate() {
        rep.fact(&format!("cg.{k}.acq"), get("FLOCK.ACQUIRE")[i]);
        rep.fact(&format!("cg.{k}.set"), get("SET NX PX")[i]);
    }
    for (a, b) in pairs {
        let (va, vb) = (get(a), get(b));
        rows.push(vec![
            format!("{a} vs {b}"),
            format!("{:.0} / {:.0} = {}", va[0], vb[0], x(va[0] / vb[0])),
            format!("{:.0} / {:.0}", va[1], vb[1]),
            format!("{:.1} / {:.1}", va[2], vb[2]),
            format!("{:.2} / {:.2}", va[3], vb[3]),
            format!("{:.0} / {:.0} = {}", va[4], vb[4], x(va[4] / vb[4])),
        ]);
    }
    let mut body = format!(
        "Counted by `valgrind --tool=callgrind --cache-sim=yes` on redis-server (one \
         connection, 16 commands per pipeline, {} calls per command on fresh keys, one dump per \
         command with `callgrind_control --dump`), per call, flock / baseline. Unlike time, \
         these counts do not depend on what else the machine runs. Ir: instructions inside \
         Redis's `call()`, i.e. the command itself (for the scripts: the whole script); I1, D1: \
         instruction and data cache misses of the first level; LL: data misses of the last \
         level (callgrind simulates this machine's cache sizes); whole server: all instructions \
         per call, with reading, parsing and replying. Callgrind does not see the time of clock \
         reads (vDSO) or what a cache miss costs: where a ratio of time is worse than the ratio \
         of instructions, look at the misses.\n\n",
        thousands(n)
    );
    body += &table(
        &[
            "flock vs baseline",
            "Ir in call()",
            "I1 misses",
            "D1 misses",
            "LL misses",
            "Ir, whole server",
        ],
        &rows,
    );
    body += &details;
    rep.profile = Some(body);
}

/// A function of a callgrind dump: inclusive Ir and its callees (name, inclusive Ir).
pub(crate) type Tree = BTreeMap<String, (f64, Vec<(String, f64)>)>;

/// Parse `callgrind_annotate --inclusive=yes --tree=calling`: blocks of `<` callers, one `*`
/// line (the function, inclusive), `>` callees. Returns the tree (Ir only) and, per function,
/// every event's inclusive count (in the order of `Events shown:`), with the event names.
pub(crate) fn parse_tree(out: &str) -> (Tree, BTreeMap<String, Vec<f64>>, Vec<String>) {
    let mut tree = Tree::new();
    let mut events = BTreeMap::new();
    let mut names = vec![];
    let mut current: Option<String> = None;
    for l in out.lines() {
        let t = l.trim();
        if let Some(e) = t.strip_prefix("Events shown:") {
            names = e.split_whitespace().map(str::to_string).collect();
            continue;
        }
        if t.is_empty() {
            current = None;
            continue;
        }
        // "1,234 (5.0%) 567 ( 1.2%) * file:function (2,000x) [object]"
        let mut vals = vec![];
        let mut kind = None;
        let mut rest = "";
        let mut pos = 0;
        for tok in t.split_whitespace() {
            let at = t[pos..].find(tok).map_or(pos, |i| pos + i);
            pos = at + tok.len();
            if let Ok(v) = tok.replace(',', "").parse::<f64>() {
                vals.push(v);
            } else if tok == "." {
                vals.push(0.0); // callgrind_annotate shows a zero count as "."
            } else if tok.starts_with('(') || tok.ends_with("%)") {
                continue;
            } else if matches!(tok, "*" | ">" | "<") {
                kind = tok.chars().next();
                rest = t[pos..].trim();
                break;
            } else {
                break;
            }
        }
        let (Some(kind), Some(&ir)) = (kind, vals.first()) else {
            continue;
        };
        let f = rest.split(" [").next().unwrap_or(rest);
        let f = f.split(" (").next().unwrap_or(f);
        let f = f.split_once(':').map_or(f, |r| r.1).trim().to_string();
        match kind {
            '*' => {
                tree.entry(f.clone()).or_insert((ir, vec![]));
                events.entry(f.clone()).or_insert(vals);
                current = Some(f);
            }
            '>' => {
                if let Some(cur) = &current {
                    if let Some(e) = tree.get_mut(cur) {
                        e.1.push((f, ir));
                    }
                }
            }
            _ => {}
        }
    }
    (tree, events, names)
}

/// Where one command's instructions go: from `call()` follow the callee that takes (nearly)
/// all of it down to the command's own function, then list what that one calls (and, for a
/// callee with a big share, what it calls).
pub(crate) fn breakdown(name: &str, tree: &Tree, calls: f64) -> String {
    let Some(&(call_ir, _)) = tree.get("call") else {
        return String::new();
    };
    let mut at = "call".to_string();
    for _ in 0..8 {
        let Some((inc, callees)) = tree.get(&at) else {
            break;
        };
        match callees.iter().max_by(|a, b| a.1.partial_cmp(&b.1).unwrap()) {
            Some((f, v)) if *v >= 0.7 * inc && tree.contains_key(f) => at = f.clone(),
            _ => break,
        }
    }
    let Some((inc, callees)) = tree.get(&at) else {
        return String::new();
    };
    let short = |f: &str| -> String {
        let f = f.replace("redis_flock::", "");
        let f = if f.len() > 70 {
            format!("{}...", &f[..70])
        } else {
            f
        };
        format!("`{}`", f.replace('|', "\\|"))
    };
    let mut rows = vec![vec![
        format!("{} (all of it)", short(&at)),
        format!("{:.0}", inc / calls),
        format!("{:.0}%", inc / call_ir * 100.0),
    ]];
    let mut listed = 0.0;
    for (f, v) in callees
        .iter()
        .filter(|(_, v)| *v >= 0.01 * call_ir)
        .take(12)
    {
        listed += v;
        rows.push(vec![
            format!("&nbsp;&nbsp;{}", short(f)),
            format!("{:.0}", v / calls),
            format!("{:.0}%", v / call_ir * 100.0),
        ]);
        if *v >= 0.2 * call_ir {
            if let Some((_, sub)) = tree.get(f) {
                for (g, w) in sub.iter().filter(|(_, w)| *w >= 0.02 * call_ir).take(5) {
                    rows.push(vec![
                        format!("&nbsp;&nbsp;&nbsp;&nbsp;↳ {}", short(g)),
                        format!("{:.0}", w / calls),
                        format!("{:.0}%", w / call_ir * 100.0),
                    ]);
                }
            }
        }
    }
    rows.push(vec![
        format!("&nbsp;&nbsp;its own code and smaller calls"),
        format!("{:.0}", (inc - listed) / calls),
        format!("{:.0}%", (inc - listed) / call_ir * 100.0),
    ]);
    format!(
        "\n**{name}**: {:.0} instructions per call in `call()`.\n\n{}",
        call_ir / calls,
        table(&["function", "Ir per call", "of call()"], &rows)
    )
}
