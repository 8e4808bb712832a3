//! Scenario 2: throughput of a full acquire+release cycle, pipelined and not.

use crate::config::*;
use crate::conn::*;
use crate::format::*;
use crate::measure::*;
use crate::recipes::*;
use crate::report::*;
use crate::system::*;
use flock_testkit::*;
use std::sync::Barrier;
use std::thread::{self};
use std::time::{Duration, Instant};

pub(crate) fn cycle_rate(
    port: u16,
    threads: usize,
    secs: f64,
    pipe: usize,
    kind: Kind,
    cad: &str,
    facq: &str,
) -> f64 {
    let barrier = Barrier::new(threads + 1);
    let dur = Duration::from_secs_f64(secs);
    thread::scope(|s| {
        let hs: Vec<_> = (0..threads)
            .map(|t| {
                let barrier = &barrier;
                s.spawn(move || {
                    let mut c = Conn::open(port);
                    let owner = uuid(70_000 + t);
                    let mut rng = Rng::new((t as u64 + 1) ^ now_nanos());
                    let mut tally = Tally::default();
                    let mut n = 0u64;
                    barrier.wait();
                    let start = Instant::now();
                    while start.elapsed() < dur {
                        for _ in 0..pipe {
                            let key = format!("cyc:{:06}", rng.below(100_000));
                            push_acquire(&mut c, kind, &key, &owner, facq);
                            if pipe == 1 {
                                c.drain(&mut tally);
                            }
                            push_release(&mut c, kind, &key, &owner, cad);
                            if pipe == 1 {
                                c.drain(&mut tally);
                            }
                        }
                        c.drain(&mut tally);
                        n += pipe as u64;
                    }
                    if tally.err > 0 {
                        eprintln!("  warning: errors in cycles: {tally:?}");
                    }
                    (n, start.elapsed().as_secs_f64())
                })
            })
            .collect();
        barrier.wait();
        let mut total = 0u64;
        let mut el = 0.0f64;
        for h in hs {
            let (n, e) = h.join().expect("cycle thread");
            total += n;
            el = el.max(e);
        }
        total as f64 / el
    })
}

pub(crate) fn run(cfg: &Cfg, rep: &mut Report) {
    let threads = 8;
    eprintln!(
        "[2] acquire+release cycles: {} rounds x 6 runs of {:.1} s",
        cfg.s2_rounds, cfg.s2_secs
    );
    let srv = Server::builder().start();
    let port = srv.port();
    let mut c = Conn::open(port);
    let cad = c.script(CAD);
    let facq = c.script(FENCE_ACQ);
    let mut s = Samples::default();
    let kinds = [
        (Kind::Flock, "flock"),
        (Kind::SetNx, "set"),
        (Kind::LuaFenced, "lua"),
    ];
    for round in 0..cfg.s2_rounds {
        eprintln!("  round {}/{}", round + 1, cfg.s2_rounds);
        for (pipe, mode) in [(1usize, "np"), (16usize, "p")] {
            for (kind, name) in rotate(&kinds, round) {
                c.call(&["FLUSHALL"]);
                wait_rehash(&mut c);
                let r = cycle_rate(port, threads, cfg.s2_secs, pipe, kind, &cad, &facq);
                s.add(&format!("{mode}.{name}"), r);
            }
            s.ratio(
                &format!("r.{mode}.set"),
                &format!("{mode}.flock"),
                &format!("{mode}.set"),
            );
            s.ratio(
                &format!("r.{mode}.lua"),
                &format!("{mode}.flock"),
                &format!("{mode}.lua"),
            );
        }
    }
    drop(srv);
    let sec = "2. Acquire+release cycles per second";
    rep.check(
        sec,
        "cycles/s, flock / SET NX PX + Lua release (no pipeline)",
        s.med("r.np.set"),
        None,
    );
    rep.check(
        sec,
        "cycles/s, flock / Lua fenced acquire + Lua release (no pipeline)",
        s.med("r.np.lua"),
        None,
    );
    rep.check(
        sec,
        "cycles/s, flock / SET NX PX + Lua release (pipelined)",
        s.med("r.p.set"),
        None,
    );
    rep.check(
        sec,
        "cycles/s, flock / Lua fenced acquire + Lua release (pipelined)",
        s.med("r.p.lua"),
        None,
    );
    let mut rows = vec![];
    for (mode, label) in [
        ("np", "one command at a time"),
        ("p", "16 cycles per pipeline"),
    ] {
        rows.push(vec![
            label.to_string(),
            format!("{:.0}", s.med(&format!("{mode}.flock"))),
            format!("{:.0}", s.med(&format!("{mode}.set"))),
            s.show_ratio(&format!("r.{mode}.set")),
            format!("{:.0}", s.med(&format!("{mode}.lua"))),
            s.show_ratio(&format!("r.{mode}.lua")),
        ]);
    }
    let mut body = format!(
        "Cycles per second, higher is better: {threads} client threads, each with its own \
         connection, for {:.1} s per run, {} round(s), order rotated; one cycle takes a random \
         key of 100,000 and releases it. flock: `FLOCK.ACQUIRE` + `FLOCK.RELEASE`. Baseline A: \
         `SET key owner NX PX ttl` + Lua compare-and-delete. Baseline B: Lua `SET NX PX` + \
         `INCR key:tok` + Lua compare-and-delete. Client and server share the machine's {} \
         cores, so this measures the whole round trip, not only the server.\n\n",
        cfg.s2_secs,
        cfg.s2_rounds,
        ncpu()
    );
    body += &table(
        &[
            "mode",
            "flock",
            "A: SET NX PX",
            "flock / A",
            "B: Lua fenced",
            "flock / B",
        ],
        &rows,
    );
    rep.section(sec, body);
}
