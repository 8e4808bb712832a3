//! Scenario 1: server cost per call (INFO commandstats), pipelined, 8 connections, many keys.

use crate::config::*;
use crate::conn::*;
use crate::format::*;
use crate::measure::*;
use crate::recipes::*;
use crate::report::*;
use flock_testkit::*;

pub(crate) fn run(cfg: &Cfg, rep: &mut Report) {
    let n = cfg.s1_keys;
    eprintln!(
        "[1] server cost per call: {} rounds x 10 passes of {} calls",
        cfg.s1_rounds,
        thousands(n)
    );
    // scripts/bench-floor.sh: a minimal module's acquire and release beside flock's
    // (benches/floor/minlock.c), the least any module pays for an owner-checked delete.
    let floor = std::env::var("FLOCK_BENCH_FLOOR_MODULE").ok();
    let srv = match &floor {
        Some(m) => Server::builder().arg("--loadmodule", m).start(),
        None => Server::builder().start(),
    };
    let port = srv.port();
    let mut c = Conn::open(port);
    let cad = c.script(CAD);
    let facq = c.script(FENCE_ACQ);
    let fw = c.script(FENCE_WRITE);
    let delifeq = has_delifeq(&mut c);
    // Valkey 9's DELIFEQ: a fourth lock kind's release (SET NX PX, then DELIFEQ).
    let mut groups: Vec<usize> = if delifeq {
        vec![0, 1, 2, 3]
    } else {
        vec![0, 1, 2]
    };
    if floor.is_some() {
        groups.push(4);
    }
    let groups = &groups[..];
    let mut s = Samples::default();
    let (conns, depth) = (8, 16);
    // warm up the fresh server (page faults, allocator); not measured
    for kind in [Kind::Flock, Kind::SetNx, Kind::LuaFenced] {
        let m = n.min(20_000);
        drive(port, conns, depth, m, 1, &|i, c| {
            push_acquire(c, kind, &lock_key(i), &uuid(i), &facq)
        });
        drive(port, conns, depth, m, 1, &|i, c| {
            push_release(c, kind, &lock_key(i), &uuid(i), &cad)
        });
        c.call(&["FLUSHALL"]);
    }
    for round in 0..cfg.s1_rounds {
        eprintln!("  round {}/{}", round + 1, cfg.s1_rounds);
        for g in rotate(groups, round) {
            c.call(&["FLUSHALL"]);
            wait_rehash(&mut c);
            c.reset_stats();
            match g {
                0 => {
                    let t = drive(port, conns, depth, n, 1, &|i, c| {
                        push_acquire(c, Kind::Flock, &lock_key(i), &uuid(i), &facq)
                    });
                    expect("FLOCK.ACQUIRE", &t, n, |t| t.int);
                    s.add("acq.flock", c.cmdstats().cost("flock.acquire"));
                    c.reset_stats();
                    let t = drive(port, conns, depth, n, 1, &|i, c| {
                        push_release(c, Kind::Flock, &lock_key(i), &uuid(i), &cad)
                    });
                    expect("FLOCK.RELEASE", &t, n, |t| t.one);
                    s.add("rel.flock", c.cmdstats().cost("flock.release"));
                }
                1 => {
                    let t = drive(port, conns, depth, n, 1, &|i, c| {
                        push_acquire(c, Kind::SetNx, &lock_key(i), &uuid(i), &facq)
                    });
                    expect("SET NX PX", &t, n, |t| t.ok);
                    s.add("acq.set", c.cmdstats().cost("set"));
                    c.reset_stats();
                    let t = drive(port, conns, depth, n, 1, &|i, c| {
                        push_release(c, Kind::SetNx, &lock_key(i), &uuid(i), &cad)
                    });
                    expect("Lua compare-and-delete", &t, n, |t| t.one);
                    s.add("rel.cad", c.cmdstats().cost("evalsha"));
                }
                2 => {
                    let t = drive(port, conns, depth, n, 1, &|i, c| {
                        push_acquire(c, Kind::LuaFenced, &lock_key(i), &uuid(i), &facq)
                    });
                    expect("Lua fenced acquire", &t, n, |t| t.int);
                    s.add("acq.lua", c.cmdstats().cost("evalsha"));
                }
                4 => {
                    let t = drive(port, conns, depth, n, 1, &|i, c| {
                        c.push(&["MIN.ACQUIRE", &lock_key(i), &uuid(i)])
                    });
                    expect("MIN.ACQUIRE", &t, n, |t| t.int);
                    s.add("acq.min", c.cmdstats().cost("min.acquire"));
                    c.reset_stats();
                    let t = drive(port, conns, depth, n, 1, &|i, c| {
                        c.push(&["MIN.RELEASE", &lock_key(i), &uuid(i)])
                    });
                    expect("MIN.RELEASE", &t, n, |t| t.one);
                    s.add("rel.min", c.cmdstats().cost("min.release"));
                }
                _ => {
                    let t = drive(port, conns, depth, n, 1, &|i, c| {
                        push_acquire(c, Kind::SetNx, &lock_key(i), &uuid(i), &facq)
                    });
                    expect("SET NX PX", &t, n, |t| t.ok);
                    c.reset_stats();
                    let t = drive(port, conns, depth, n, 1, &|i, c| {
                        c.push(&["DELIFEQ", &lock_key(i), &uuid(i)])
                    });
                    expect("DELIFEQ", &t, n, |t| t.one);
                    s.add("rel.delifeq", c.cmdstats().cost("delifeq"));
                }
            }
        }
        // checks and fenced writes under one live lock
        c.call(&["FLUSHALL"]);
        let owner = uuid(999_999_999);
        let tok = c
            .call(&["FLOCK.ACQUIRE", "wlk", &owner, LONG_TTL])
            .int()
            .expect("FLOCK.ACQUIRE wlk");
        let tok = tok.to_string();
        c.call(&["SET", "wlk:tok", &tok]);
        c.call(&["SET", "wlk:owner", &owner]);
        for w in rotate(&[0, 1, 2, 3, 4], round) {
            c.reset_stats();
            match w {
                0 => {
                    let t = drive(port, conns, depth, n, 1, &|_, c| {
                        c.push(&["FLOCK.CHECK", "wlk", &tok])
                    });
                    expect("FLOCK.CHECK", &t, n, |t| t.int);
                    s.add("check", c.cmdstats().cost("flock.check"));
                }
                1 => {
                    let t = drive(port, conns, depth, n, 1, &|_, c| {
                        c.push(&["GET", "wlk:owner"])
                    });
                    expect("GET", &t, n, |t| t.other);
                    s.add("get", c.cmdstats().cost("get"));
                }
                2 => {
                    let t = drive(port, conns, depth, n, 1, &|i, c| {
                        push_fenced_write(c, None, i, &tok)
                    });
                    expect("FLOCK.FENCED SET", &t, n, |t| t.ok);
                    s.add("fenced", c.cmdstats().cost("flock.fenced"));
                }
                3 => {
                    let t = drive(port, conns, depth, n, 1, &|i, c| {
                        push_fenced_write(c, Some(&fw), i, &tok)
                    });
                    expect("Lua token check + SET", &t, n, |t| t.ok);
                    s.add("luaw", c.cmdstats().cost("evalsha"));
                }
                _ => {
                    let t = drive(port, conns, depth, n, 1, &|i, c| {
                        c.push(&["SET", &format!("data:{i:07}"), "v"])
                    });
                    expect("SET", &t, n, |t| t.ok);
                    s.add("set", c.cmdstats().cost("set"));
                }
            }
        }
        s.ratio("r.acq_set", "acq.flock", "acq.set");
        s.ratio("r.acq_lua", "acq.flock", "acq.lua");
        s.ratio("r.rel_cad", "rel.flock", "rel.cad");
        if delifeq {
            s.ratio("r.rel_delifeq", "rel.flock", "rel.delifeq");
        }
        if floor.is_some() {
            s.ratio("r.acq_min", "acq.flock", "acq.min");
            s.ratio("r.rel_min", "rel.flock", "rel.min");
            s.ratio("r.minacq_set", "acq.min", "acq.set");
            if delifeq {
                s.ratio("r.min_delifeq", "rel.min", "rel.delifeq");
            }
        }
        s.ratio("r.check_get", "check", "get");
        s.ratio("r.fenced_luaw", "fenced", "luaw");
        s.ratio("r.fenced_set", "fenced", "set");
        eprintln!(
            "    acquire/SET {:.2}  acquire/Lua {:.2}  release/CAD {:.2}  check/GET {:.2}  fenced/Lua {:.2}   (flock acquire {:.2} us, SET {:.2} us)",
            s.last("r.acq_set"),
            s.last("r.acq_lua"),
            s.last("r.rel_cad"),
            s.last("r.check_get"),
            s.last("r.fenced_luaw"),
            s.last("acq.flock"),
            s.last("acq.set")
        );
    }
    drop(srv);
    rep.fact("s1.acq.flock", s.med("acq.flock"));
    rep.fact("s1.acq.set", s.med("acq.set"));
    rep.fact("s1.acq_set.lo", s.range("r.acq_set").0);
    rep.fact("s1.acq_set.hi", s.range("r.acq_set").1);

    let sec = "1. Server cost per call";
    rep.check(
        sec,
        "FLOCK.ACQUIRE / SET NX PX",
        s.med("r.acq_set"),
        Some(Goal::AtMost(1.0)),
    );
    rep.check(
        sec,
        "FLOCK.ACQUIRE / Lua fenced acquire",
        s.med("r.acq_lua"),
        Some(Goal::AtMost(0.35)),
    );
    rep.check(
        sec,
        "FLOCK.RELEASE / Lua compare-and-delete",
        s.med("r.rel_cad"),
        Some(Goal::AtMost(0.4)),
    );
    if delifeq {
        rep.check(
            sec,
            "FLOCK.RELEASE / DELIFEQ",
            s.med("r.rel_delifeq"),
            Some(Goal::AtMost(1.0)),
        );
    }
    rep.check(sec, "FLOCK.CHECK / GET", s.med("r.check_get"), None);
    rep.check(
        sec,
        "FLOCK.FENCED+SET / Lua check+SET",
        s.med("r.fenced_luaw"),
        None,
    );
    rep.check(
        sec,
        "FLOCK.FENCED+SET / SET alone",
        s.med("r.fenced_set"),
        None,
    );

    let row = |flock: &str, fk: &str, base: &str, bk: &str, rk: &str, what: &str, goal: &str| {
        vec![
            flock.to_string(),
            us(s.med(fk)),
            base.to_string(),
            us(s.med(bk)),
            s.show_ratio(rk),
            goal.to_string(),
            rep.mark_of(what),
        ]
    };
    let mut rows = vec![
        row(
            "`FLOCK.ACQUIRE`",
            "acq.flock",
            "`SET key owner NX PX ttl`",
            "acq.set",
            "r.acq_set",
            "FLOCK.ACQUIRE / SET NX PX",
            "≤ 1.00x",
        ),
        row(
            "`FLOCK.ACQUIRE`",
            "acq.flock",
            "Lua `SET NX PX` + `INCR` token key",
            "acq.lua",
            "r.acq_lua",
            "FLOCK.ACQUIRE / Lua fenced acquire",
            "≤ 0.35x",
        ),
        row(
            "`FLOCK.RELEASE`",
            "rel.flock",
            "Lua compare-and-delete",
            "rel.cad",
            "r.rel_cad",
            "FLOCK.RELEASE / Lua compare-and-delete",
            "≤ 0.40x",
        ),
        row(
            "`FLOCK.CHECK`",
            "check",
            "`GET`",
            "get",
            "r.check_get",
            "",
            "—",
        ),
        row(
            "`FLOCK.FENCED` + `SET`",
            "fenced",
            "Lua token check + `SET`",
            "luaw",
            "r.fenced_luaw",
            "",
            "—",
        ),
        row(
            "`FLOCK.FENCED` + `SET`",
            "fenced",
            "`SET` alone (no check)",
            "set",
            "r.fenced_set",
            "",
            "—",
        ),
    ];
    if delifeq {
        rows.insert(
            3,
            row(
                "`FLOCK.RELEASE`",
                "rel.flock",
                "`DELIFEQ key owner` (Valkey 9)",
                "rel.delifeq",
                "r.rel_delifeq",
                "FLOCK.RELEASE / DELIFEQ",
                "≤ 1.00x",
            ),
        );
    }
    if floor.is_some() {
        rows.push(row(
            "`FLOCK.ACQUIRE`",
            "acq.flock",
            "`MIN.ACQUIRE` (the module floor)",
            "acq.min",
            "r.acq_min",
            "",
            "—",
        ));
        rows.push(row(
            "`MIN.ACQUIRE` (the module floor)",
            "acq.min",
            "`SET key owner NX PX ttl`",
            "acq.set",
            "r.minacq_set",
            "",
            "—",
        ));
        rows.push(row(
            "`FLOCK.RELEASE`",
            "rel.flock",
            "`MIN.RELEASE` (the module floor)",
            "rel.min",
            "r.rel_min",
            "",
            "—",
        ));
        if delifeq {
            rows.push(row(
                "`MIN.RELEASE` (the module floor)",
                "rel.min",
                "`DELIFEQ key owner` (Valkey 9)",
                "rel.delifeq",
                "r.min_delifeq",
                "",
                "—",
            ));
        }
    }
    let mut body = format!(
        "`INFO commandstats` usec per call (usec / calls), lower is better. {} rounds; each round \
         runs every command over {} keys (each key acquired once and released once, so every \
         ACQUIRE is a grant and every RELEASE releases), 8 connections, 16 commands per \
         pipeline, `CONFIG RESETSTAT` before each pass, `FLUSHALL` between the lock kinds, the \
         order rotated from round to round. usec columns are medians over the rounds; the ratio \
         is the median of the per-round ratios (range in brackets). The Lua scripts run with \
         `EVALSHA`, as client libraries do. The load comes from the bench's own pipelining \
         client rather than `redis-benchmark`, whose random keys cannot make every RELEASE \
         find its lock held (nor every ACQUIRE find its key free); the server time per call \
         that `INFO commandstats` reports does not depend on the client.{}\n\n",
        cfg.s1_rounds,
        thousands(n),
        if delifeq {
            " The server has Valkey's `DELIFEQ` (an owner-checked delete, Valkey 9), so it is a \
             baseline too: a fourth lock kind, `SET NX PX` then `DELIFEQ`, in the rotation."
        } else {
            ""
        }
    );
    if floor.is_some() {
        body += "**The module floor** (this run was made by `scripts/bench-floor.sh`): \
                 `MIN.ACQUIRE` and `MIN.RELEASE` come from a minimal module loaded beside flock \
                 ([benches/floor/minlock.c](../benches/floor/minlock.c)): the owner kept in a \
                 module value, one allocation, no token, no timer, no clock, no statistics. \
                 What it costs is what the module API costs (the dispatch, opening and closing \
                 the key, the module value's extra indirection, the notification, the reply): \
                 no module lock can go below it, and the rows against it show what flock's \
                 fencing token, expiry timer and statistics add.\n\n";
    }
    body += &table(
        &[
            "flock",
            "usec/call",
            "baseline",
            "usec/call",
            "ratio",
            "target",
            "",
        ],
        &rows,
    );
    rep.section(sec, body);
}
