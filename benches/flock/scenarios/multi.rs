//! Scenario 9: FLOCK.MACQUIRE of 3 free keys against one ACQUIRE of a free key, measured in the
//! same run (INFO commandstats usec per call): the issue's bound is 3x, one ACQUIRE per key.

use crate::config::*;
use crate::conn::*;
use crate::format::*;
use crate::measure::*;
use crate::report::*;
use flock_testkit::*;

const TTL: &str = "600000";

fn key(i: usize) -> String {
    format!("{{acct:{i:08}}}:lock")
}

fn owner(i: usize) -> String {
    format!("{:032x}-{i:06}", i.wrapping_mul(0x9e37_79b9_7f4a_7c15))
}

/// `n` ACQUIREs of free keys: usec per call.
fn acquires(c: &mut Conn, port: u16, n: usize) -> f64 {
    c.call(&["FLUSHALL"]);
    wait_rehash(c);
    c.reset_stats();
    let t = drive(port, 8, 16, n, 1, &|i, c| {
        c.push(&["FLOCK.ACQUIRE", &key(i), &owner(i), TTL])
    });
    expect("FLOCK.ACQUIRE", &t, n, |t| t.int);
    c.cmdstats().cost("flock.acquire")
}

/// `n` MACQUIREs of 3 free keys each (3n keys): usec per call.
fn macquires(c: &mut Conn, port: u16, n: usize) -> f64 {
    c.call(&["FLUSHALL"]);
    wait_rehash(c);
    c.reset_stats();
    let t = drive(port, 8, 16, n, 1, &|i, c| {
        let (a, b, d) = (key(3 * i), key(3 * i + 1), key(3 * i + 2));
        c.push(&["FLOCK.MACQUIRE", "3", &a, &b, &d, &owner(i), TTL])
    });
    // The replies are arrays of three tokens.
    expect("FLOCK.MACQUIRE", &t, n, |t| t.other);
    c.cmdstats().cost("flock.macquire")
}

pub(crate) fn run(cfg: &Cfg, rep: &mut Report) {
    let n = cfg.s1_keys;
    // More rounds than scenario 7's: each is short, and a shared machine is noisy.
    let rounds = cfg.s1_rounds.max(5);
    eprintln!(
        "[9] MACQUIRE of 3 keys: {rounds} rounds, {} calls each",
        thousands(n / 3)
    );
    let srv = Server::builder().start();
    let port = srv.port();
    let mut c = Conn::open(port);
    let mut s = Samples::default();
    // warm up (page faults, allocator); not measured
    acquires(&mut c, port, n.min(20_000));
    macquires(&mut c, port, n.min(20_000) / 3);
    for round in 0..rounds {
        for g in rotate(&[0, 1], round) {
            if g == 0 {
                s.add("acq", acquires(&mut c, port, n));
            } else {
                s.add("macq", macquires(&mut c, port, n / 3));
            }
        }
        s.ratio("r", "macq", "acq");
        eprintln!(
            "  round {}/{}: MACQUIRE of 3 {:.2} us, ACQUIRE {:.2} us, ratio {:.2}",
            round + 1,
            rounds,
            s.last("macq"),
            s.last("acq"),
            s.last("r")
        );
    }
    drop(srv);
    let sec = "9. MACQUIRE";
    let what = "MACQUIRE of 3 free keys / one ACQUIRE";
    rep.check(sec, what, s.med("r"), Some(Goal::AtMost(3.0)));
    let rows = vec![vec![
        "`MACQUIRE 3 k1 k2 k3` / `ACQUIRE k` (free keys)".to_string(),
        us(s.med("macq")),
        us(s.med("acq")),
        s.show_ratio("r"),
        "≤ 3.00x".to_string(),
        rep.mark_of(what),
    ]];
    let mut body = format!(
        "`INFO commandstats` usec per call, {rounds} rounds, medians (ratio: median of the \
         per-round ratios). {} ACQUIREs of distinct free keys against {} MACQUIREs of 3 distinct \
         free keys each (one hash tag per key, 36-byte owners), 8 connections, 16 commands per \
         pipeline, alternated. Each key of a MACQUIRE is an ordinary ACQUIRE run through the \
         same executor; the rest is parsing and a first look at every key (all or nothing).\n\n",
        thousands(n),
        thousands(n / 3)
    );
    body += &table(
        &[
            "call",
            "usec/call",
            "baseline usec/call",
            "ratio",
            "target",
            "",
        ],
        &rows,
    );
    rep.section(sec, body);
}
