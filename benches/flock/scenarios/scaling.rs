//! Scenario 5: scaling: ACQUIRE/RELEASE cost with many lock keys held and many waiters queued.

use crate::config::*;
use crate::conn::*;
use crate::format::*;
use crate::measure::*;
use crate::recipes::*;
use crate::report::*;
use flock_testkit::*;
use std::fmt::Write as _;
use std::io::Write;
use std::net::TcpStream;
use std::time::Duration;

/// ACQUIRE+RELEASE pairs on `pairs` fresh probe keys; returns (acquire, release) usec/call.
pub(crate) fn probe_pairs(
    c: &mut Conn,
    port: u16,
    pairs: usize,
    kind: Kind,
    cad: &str,
) -> (f64, f64) {
    c.reset_stats();
    let t = drive(port, 4, 32, pairs * 2, 2, &|i, c| {
        let k = format!("p:{:07}", i / 2);
        let o = uuid(i / 2);
        if i % 2 == 0 {
            push_acquire(c, kind, &k, &o, "");
        } else {
            push_release(c, kind, &k, &o, cad);
        }
    });
    if t.one != pairs as u64 {
        eprintln!("  warning: probe pairs: {t:?}");
    }
    let st = c.cmdstats();
    match kind {
        Kind::Flock => (st.cost("flock.acquire"), st.cost("flock.release")),
        _ => (st.cost("set"), st.cost("evalsha")),
    }
}

/// One measurement of the waiters part of scenario 5: `nw` clients wait on `busy`; then
/// ACQUIRE+RELEASE of free keys, ACQUIRE of `busy` (nil), and RELEASE of `busy` (a hand-off
/// when somebody waits), in an order rotated by `round`. The waiters leave at the end.
pub(crate) fn measure_waiters(
    c: &mut Conn,
    port: u16,
    cfg: &Cfg,
    nw: usize,
    round: usize,
    w: &mut Samples,
) {
    c.call(&["FLUSHALL"]);
    assert!(c
        .call(&["FLOCK.ACQUIRE", "busy", "holder", LONG_TTL])
        .int()
        .is_some());
    let h = cfg.s5_handoffs;
    let per_waiter = h.checked_div(nw).map_or(0, |q| q + 3);
    let mut socks = Vec::with_capacity(nw);
    for i in 0..nw {
        let mut out = Vec::new();
        for j in 0..per_waiter {
            out.extend(flock_testkit::resp_command(&[
                "FLOCK.ACQUIRE",
                "busy",
                &format!("w{i}-{}", j % 2),
                LONG_TTL,
                "BLOCK",
                "0",
            ]));
        }
        let mut s = TcpStream::connect(("127.0.0.1", port)).expect("waiter connect");
        s.write_all(&out).expect("waiter write");
        socks.push(s);
        if i % 500 == 499 {
            wait_for("waiters to queue", Duration::from_secs(60), || {
                c.blocked_clients() > i
            });
        }
    }
    wait_for("waiters to queue", Duration::from_secs(60), || {
        c.blocked_clients() == nw
    });
    for step in rotate(&[0, 1, 2], round) {
        match step {
            0 => {
                let (a, r) = probe_pairs(c, port, cfg.s5_pairs, Kind::Flock, "");
                w.add(&format!("w{nw}.acq_free"), a);
                w.add(&format!("w{nw}.rel_free"), r);
            }
            1 => {
                c.reset_stats();
                let t = drive(port, 4, 32, cfg.s5_pairs, 1, &|_, c| {
                    c.push(&["FLOCK.ACQUIRE", "busy", "newcomer", TTL])
                });
                expect("ACQUIRE busy key", &t, cfg.s5_pairs, |t| t.nil);
                w.add(
                    &format!("w{nw}.acq_busy"),
                    c.cmdstats().cost("flock.acquire"),
                );
            }
            _ => {
                c.reset_stats();
                if nw == 0 {
                    // plain release of the busy key, taken again at once
                    let mut t = Tally::default();
                    for _ in 0..h {
                        c.push(&["FLOCK.RELEASE", "busy", "holder"]);
                        c.push(&["FLOCK.ACQUIRE", "busy", "holder", LONG_TTL]);
                    }
                    c.drain(&mut t);
                    w.add(
                        &format!("w{nw}.rel_busy"),
                        c.cmdstats().cost("flock.release"),
                    );
                } else {
                    for _ in 0..h {
                        let info = c.call(&["FLOCK.INFO", "busy"]);
                        let owner = flock_testkit::parse_info(&info, "FLOCK.INFO busy")
                            .and_then(|i| i.owner)
                            .expect("busy key has an owner");
                        let owner = String::from_utf8_lossy(&owner).into_owned();
                        let r = c.call(&["FLOCK.RELEASE", "busy", &owner]);
                        assert_eq!(r, Reply::Int(1), "hand-off release");
                    }
                    wait_for("waiters to queue again", Duration::from_secs(60), || {
                        c.blocked_clients() == nw
                    });
                    let st = c.cmdstats();
                    w.add(&format!("w{nw}.rel_busy"), st.cost("flock.release"));
                    let cyc = (st.usec("flock.release") + st.usec("flock.acquire"))
                        / st.calls("flock.release");
                    w.add(&format!("w{nw}.handoff"), cyc);
                }
            }
        }
    }
    drop(socks);
    wait_for("waiters to leave", Duration::from_secs(60), || {
        c.blocked_clients() == 0
    });
}

pub(crate) fn run(cfg: &Cfg, rep: &mut Report, nofile: u64) {
    let sec = "5. Scaling";
    eprintln!(
        "[5] scaling: held keys {:?}, waiters {:?}",
        cfg.s5_levels, cfg.s5_waiters
    );
    // --- held keys ---
    let srv = Server::builder().start();
    let port = srv.port();
    let mut c = Conn::open(port);
    let cad = c.script(CAD);
    let mut s = Samples::default();
    // warm up the fresh server (page faults, allocator) before the first level is measured
    for kind in [Kind::Flock, Kind::SetNx] {
        probe_pairs(&mut c, port, cfg.s5_pairs, kind, &cad);
    }
    let mut have = 0usize;
    for &level in &cfg.s5_levels {
        eprintln!("  {} lock keys held", thousands(level));
        let from = have;
        let t = drive(port, 4, 256, level - from, 1, &|i, c| {
            let i = from + i;
            c.push(&["FLOCK.ACQUIRE", &format!("h:{i:07}"), &uuid(i), LONG_TTL])
        });
        expect("preload FLOCK.ACQUIRE", &t, level - from, |t| t.int);
        let t = drive(port, 4, 256, level - from, 1, &|i, c| {
            let i = from + i;
            c.push(&["SET", &format!("s:{i:07}"), &uuid(i), "NX", "PX", LONG_TTL])
        });
        expect("preload SET NX PX", &t, level - from, |t| t.ok);
        have = level;
        wait_rehash(&mut c);
        for round in 0..cfg.s5_rounds {
            for kind in rotate(&[Kind::Flock, Kind::SetNx], round) {
                let (a, r) = probe_pairs(&mut c, port, cfg.s5_pairs, kind, &cad);
                let tag = if kind == Kind::Flock { "flock" } else { "set" };
                s.add(&format!("k{level}.{tag}.acq"), a);
                s.add(&format!("k{level}.{tag}.rel"), r);
            }
        }
    }
    drop(srv);
    let base = cfg.s5_levels[0];
    let mut rows = vec![];
    for &level in &cfg.s5_levels {
        let g = |tag: &str, op: &str| {
            s.med(&format!("k{level}.{tag}.{op}")) / s.med(&format!("k{base}.{tag}.{op}"))
        };
        rows.push(vec![
            thousands(level),
            us(s.med(&format!("k{level}.flock.acq"))),
            x(g("flock", "acq")),
            us(s.med(&format!("k{level}.set.acq"))),
            x(g("set", "acq")),
            us(s.med(&format!("k{level}.flock.rel"))),
            x(g("flock", "rel")),
            us(s.med(&format!("k{level}.set.rel"))),
            x(g("set", "rel")),
        ]);
        if level != base {
            rep.check(
                sec,
                &format!(
                    "ACQUIRE growth at {} keys, relative to SET NX PX's",
                    thousands(level)
                ),
                g("flock", "acq") / g("set", "acq"),
                Some(Goal::AtMost(1.25)),
            );
            rep.check(
                sec,
                &format!(
                    "RELEASE growth at {} keys, relative to Lua release's",
                    thousands(level)
                ),
                g("flock", "rel") / g("set", "rel"),
                Some(Goal::AtMost(1.25)),
            );
        }
    }
    let mut body = format!(
        "**Held lock keys.** The server holds N flock locks and N `SET NX PX` locks (keys \
         `h:...` and `s:...`, ttl 1 h); then {} ACQUIRE+RELEASE pairs on other keys are timed \
         with `INFO commandstats` (4 connections, 32 commands per pipeline), flock and the \
         `SET NX PX` / Lua compare-and-delete baseline alternately, {} round(s), medians. \
         \"growth\" is the cost at N over the cost at {} key(s). Target: flat within noise, \
         i.e. flock's growth at most 1.25x the baseline's growth at the same N (the baseline \
         shows what a bigger keyspace costs Redis itself).{}\n\n",
        thousands(cfg.s5_pairs),
        cfg.s5_rounds,
        thousands(base),
        if cfg.quick {
            " QUICK mode: at most 100,000 keys instead of 1,000,000."
        } else {
            ""
        }
    );
    body += &table(
        &[
            "lock keys held",
            "FLOCK.ACQUIRE usec",
            "growth",
            "SET NX PX usec",
            "growth",
            "FLOCK.RELEASE usec",
            "growth",
            "Lua release usec",
            "growth",
        ],
        &rows,
    );
    let mut krows = vec![];
    for &level in &cfg.s5_levels[1..] {
        for op in ["ACQUIRE", "RELEASE"] {
            let w = if op == "ACQUIRE" {
                format!(
                    "ACQUIRE growth at {} keys, relative to SET NX PX's",
                    thousands(level)
                )
            } else {
                format!(
                    "RELEASE growth at {} keys, relative to Lua release's",
                    thousands(level)
                )
            };
            let v = rep
                .checks
                .iter()
                .rev()
                .find(|c| c.what == w)
                .map(|c| c.value)
                .unwrap_or(f64::NAN);
            krows.push(vec![
                format!("{} at {} keys", op, thousands(level)),
                x(v),
                "≤ 1.25x".into(),
                rep.mark_of(&w),
            ]);
        }
    }
    body += "\n";
    body += &table(
        &["flock growth / baseline growth", "ratio", "target", ""],
        &krows,
    );

    // --- waiters ---
    let wmax = *cfg.s5_waiters.iter().max().unwrap_or(&0);
    let need_fd = wmax as u64 + 2000;
    let waiters: Vec<usize> = if nofile < need_fd {
        let keep: Vec<usize> = cfg
            .s5_waiters
            .iter()
            .copied()
            .filter(|&w| (w as u64) + 2000 <= nofile)
            .collect();
        rep.notes.push(format!(
            "RLIMIT_NOFILE is {nofile}: waiter counts above {} were skipped (raise `ulimit -n`).",
            nofile.saturating_sub(2000)
        ));
        keep
    } else {
        cfg.s5_waiters.clone()
    };
    let srv = Server::builder()
        .arg("maxclients", &(wmax + 1000).to_string())
        .module_args(&["max-waiters", "1000000"])
        .start();
    let port = srv.port();
    let mut c = Conn::open(port);
    let mut w = Samples::default();
    let rounds = cfg.s5_rounds;
    let w0 = waiters.first().copied().unwrap_or(0);
    let w1 = waiters.iter().copied().find(|&v| v > 0).unwrap_or(0);
    // each round sets up every waiter count in turn (order rotated), so that every count has
    // a 0-waiter measurement close in time to compare with
    for round in 0..rounds {
        eprintln!(
            "  round {}/{rounds}: waiters {:?}",
            round + 1,
            rotate(&waiters, round)
        );
        for nw in rotate(&waiters, round) {
            measure_waiters(&mut c, port, cfg, nw, round, &mut w);
        }
        for &nw in &waiters {
            for k in ["acq_free", "rel_free", "acq_busy"] {
                w.ratio(
                    &format!("r{nw}.{k}"),
                    &format!("w{nw}.{k}"),
                    &format!("w{w0}.{k}"),
                );
            }
            w.ratio(
                &format!("r{nw}.rel_busy"),
                &format!("w{nw}.rel_busy"),
                &format!("w{w1}.rel_busy"),
            );
        }
    }
    drop(srv);
    let mut rows = vec![];
    for &nw in &waiters {
        // median of the per-round ratios against the same round's baseline count
        let g = |k: &str, _b: usize| w.med(&format!("r{nw}.{k}"));
        rows.push(vec![
            thousands(nw),
            format!(
                "{} ({})",
                us(w.med(&format!("w{nw}.acq_free"))),
                x(g("acq_free", w0))
            ),
            format!(
                "{} ({})",
                us(w.med(&format!("w{nw}.rel_free"))),
                x(g("rel_free", w0))
            ),
            format!(
                "{} ({})",
                us(w.med(&format!("w{nw}.acq_busy"))),
                x(g("acq_busy", w0))
            ),
            if nw == 0 {
                format!("{} (no hand-off)", us(w.med(&format!("w{nw}.rel_busy"))))
            } else {
                format!(
                    "{} ({})",
                    us(w.med(&format!("w{nw}.rel_busy"))),
                    x(g("rel_busy", w1))
                )
            },
            if nw == 0 {
                "—".into()
            } else {
                us(w.med(&format!("w{nw}.handoff")))
            },
        ]);
        if nw != w0 {
            for (k, label) in [
                ("acq_free", "ACQUIRE of a free key"),
                ("rel_free", "RELEASE of a free key"),
                ("acq_busy", "ACQUIRE of the waited key (nil)"),
            ] {
                rep.check(
                    sec,
                    &format!("{label} with {} waiters / with {w0}", thousands(nw)),
                    g(k, w0),
                    Some(Goal::AtMost(1.25)),
                );
            }
        }
        if nw > w1 {
            rep.check(
                sec,
                &format!(
                    "RELEASE with hand-off, {} waiters / {} waiters",
                    thousands(nw),
                    thousands(w1)
                ),
                g("rel_busy", w1),
                Some(Goal::AtMost(1.25)),
            );
        }
    }
    let _ = write!(
        body,
        "\n**Waiters.** One key (`busy`) is held and N clients wait on it with \
         `FLOCK.ACQUIRE busy w<i> 3600000 BLOCK 0` (raw connections, each with a few such \
         commands pipelined so that it queues again after its grant). Timed with `INFO \
         commandstats`; each of {} round(s) sets up every count in turn; usec are medians, the \
         growth in brackets is the median of the per-round ratios against {} waiters: {} \
         ACQUIRE+RELEASE pairs on other keys; {} `FLOCK.ACQUIRE busy newcomer` (nil: the key is \
         held, and a caller without `BLOCK` never overtakes the queue); {} `FLOCK.RELEASE` of \
         the waited key, each handing it to the first waiter (its growth is against {} waiters: \
         with 0 waiters a release has no hand-off to do). \"hand-off, all in\" adds the server \
         time of the waiter's side (its reply, and its next `ACQUIRE ... BLOCK` queueing \
         again) per release. Target: flat, at most 1.25x.{}\n\n",
        rounds,
        w0,
        thousands(cfg.s5_pairs),
        thousands(cfg.s5_pairs),
        thousands(cfg.s5_handoffs),
        thousands(w1),
        if cfg.quick {
            " QUICK mode: at most 1,000 waiters instead of 10,000."
        } else {
            ""
        }
    );
    body += &table(
        &[
            "waiters",
            "ACQUIRE free key usec",
            "RELEASE free key usec",
            "ACQUIRE waited key usec",
            "RELEASE waited key usec",
            "hand-off, all in, usec",
        ],
        &rows,
    );
    let mut wrows = vec![];
    for ch in rep
        .checks
        .iter()
        .filter(|c| c.section == sec && c.what.contains("waiters"))
    {
        wrows.push(vec![
            ch.what.clone(),
            ch.shown.clone(),
            ch.target_text.clone(),
            ch.mark().into(),
        ]);
    }
    body += "\n";
    body += &table(&["growth with waiters", "ratio", "target", ""], &wrows);
    rep.section(sec, body);
}
