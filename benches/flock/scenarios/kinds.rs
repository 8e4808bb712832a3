//! Scenario 7: what the lock kinds and BOUND cost, each against its exclusive, unbound
//! counterpart measured in the same run (INFO commandstats usec per call, `used_memory`).

use crate::config::*;
use crate::conn::*;
use crate::format::*;
use crate::measure::*;
use crate::report::*;
use crate::scenarios::memory::used_memory;
use flock_testkit::*;

const TTL: &str = "600000";

fn key(i: usize) -> String {
    format!("lock:{i:08}")
}

fn owner(i: usize) -> String {
    format!("{:032x}-{i:06}", i.wrapping_mul(0x9e37_79b9_7f4a_7c15))
}

/// ACQUIRE (then RELEASE) of `n` free keys with `opts`: the usec per call of each.
fn free_keys(c: &mut Conn, port: u16, n: usize, opts: &'static [&'static str]) -> (f64, f64) {
    c.call(&["FLUSHALL"]);
    wait_rehash(c);
    c.reset_stats();
    let t = drive(port, 8, 16, n, 1, &|i, c| {
        let (k, o) = (key(i), owner(i));
        let mut args = vec!["FLOCK.ACQUIRE", &k, &o, TTL];
        args.extend_from_slice(opts);
        c.push(&args)
    });
    expect("FLOCK.ACQUIRE", &t, n, |t| t.int);
    let acq = c.cmdstats().cost("flock.acquire");
    c.reset_stats();
    let t = drive(port, 8, 16, n, 1, &|i, c| {
        c.push(&["FLOCK.RELEASE", &key(i), &owner(i)])
    });
    // BOUND grants may already have ended with their connections: only time the calls.
    if opts.is_empty() || opts[0] != "BOUND" {
        expect("FLOCK.RELEASE", &t, n, |t| t.one);
    }
    (acq, c.cmdstats().cost("flock.release"))
}

/// ACQUIRE SHARED + RELEASE pairs by `pairs` new owners on one key that `holders` other readers
/// hold throughout: the usec per call of each.
fn crowded_key(c: &mut Conn, port: u16, holders: usize, pairs: usize) -> (f64, f64) {
    c.call(&["FLUSHALL"]);
    for h in 0..holders {
        c.push(&[
            "FLOCK.ACQUIRE",
            "crowd",
            &format!("holder-{h}"),
            TTL,
            "SHARED",
        ]);
        if h % 256 == 255 {
            c.drain(&mut Tally::default());
        }
    }
    c.drain(&mut Tally::default());
    c.reset_stats();
    let t = drive(port, 8, 16, 2 * pairs, 2, &|i, c| {
        let o = owner(i / 2);
        if i % 2 == 0 {
            c.push(&["FLOCK.ACQUIRE", "crowd", &o, TTL, "SHARED"])
        } else {
            c.push(&["FLOCK.RELEASE", "crowd", &o])
        }
    });
    expect("ACQUIRE SHARED + RELEASE", &t, 2 * pairs, |t| t.int);
    let s = c.cmdstats();
    (s.cost("flock.acquire"), s.cost("flock.release"))
}

pub(crate) fn run(cfg: &Cfg, rep: &mut Report) {
    let n = cfg.s1_keys;
    let rounds = cfg.s1_rounds.min(5);
    eprintln!(
        "[7] kinds and BOUND: {rounds} rounds, {} keys",
        thousands(n)
    );
    let srv = Server::builder().start();
    let port = srv.port();
    let mut c = Conn::open(port);
    let mut s = Samples::default();
    // warm up (page faults, allocator); not measured
    free_keys(&mut c, port, n.min(20_000), &[]);
    for round in 0..rounds {
        eprintln!("  round {}/{}", round + 1, rounds);
        for g in rotate(&[0, 1, 2, 3, 4], round) {
            match g {
                0 => {
                    let (a, r) = free_keys(&mut c, port, n, &[]);
                    s.add("x.acq", a);
                    s.add("x.rel", r);
                }
                1 => {
                    let (a, r) = free_keys(&mut c, port, n, &["SHARED"]);
                    s.add("s.acq", a);
                    s.add("s.rel", r);
                }
                2 => {
                    let (a, _) = free_keys(&mut c, port, n, &["BOUND"]);
                    s.add("b.acq", a);
                }
                3 => {
                    let (a, r) = crowded_key(&mut c, port, 1, n / 2);
                    s.add("c1.acq", a);
                    s.add("c1.rel", r);
                }
                _ => {
                    let (a, r) = crowded_key(&mut c, port, 1000, n / 2);
                    s.add("c1000.acq", a);
                    s.add("c1000.rel", r);
                }
            }
        }
        s.ratio("r.s_acq", "s.acq", "x.acq");
        s.ratio("r.s_rel", "s.rel", "x.rel");
        s.ratio("r.b_acq", "b.acq", "x.acq");
        s.ratio("r.c_acq", "c1000.acq", "c1.acq");
        s.ratio("r.c_rel", "c1000.rel", "c1.rel");
        eprintln!(
            "    shared/exclusive acquire {:.2} release {:.2}  bound/unbound acquire {:.2}  1000 readers/1 acquire {:.2} release {:.2}",
            s.last("r.s_acq"),
            s.last("r.s_rel"),
            s.last("r.b_acq"),
            s.last("r.c_acq"),
            s.last("r.c_rel")
        );
    }
    // Memory: a held exclusive lock against one more reader of a key.
    c.call(&["FLUSHALL"]);
    let base = used_memory(&mut c);
    let m = 20_000;
    for i in 0..m {
        c.push(&["FLOCK.ACQUIRE", &key(i), &owner(i), TTL]);
        if i % 256 == 255 {
            c.drain(&mut Tally::default());
        }
    }
    c.drain(&mut Tally::default());
    let per_lock = (used_memory(&mut c) - base) / m as f64;
    c.call(&["FLUSHALL"]);
    c.call(&["FLOCK.ACQUIRE", "readers", &owner(0), TTL, "SHARED"]);
    let one = used_memory(&mut c);
    for i in 1..m {
        c.push(&["FLOCK.ACQUIRE", "readers", &owner(i), TTL, "SHARED"]);
        if i % 256 == 255 {
            c.drain(&mut Tally::default());
        }
    }
    c.drain(&mut Tally::default());
    let per_reader = (used_memory(&mut c) - one) / (m - 1) as f64;
    drop(srv);

    let sec = "7. Lock kinds and BOUND";
    rep.check(
        sec,
        "ACQUIRE SHARED / exclusive ACQUIRE (free key)",
        s.med("r.s_acq"),
        Some(Goal::AtMost(1.1)),
    );
    rep.check(
        sec,
        "RELEASE of a shared grant / of an exclusive one",
        s.med("r.s_rel"),
        Some(Goal::AtMost(1.1)),
    );
    rep.check(
        sec,
        "ACQUIRE BOUND / ACQUIRE",
        s.med("r.b_acq"),
        Some(Goal::AtMost(1.15)),
    );
    rep.check(
        sec,
        "ACQUIRE SHARED, key of 1,000 readers / of 1",
        s.med("r.c_acq"),
        Some(Goal::AtMost(1.25)),
    );
    rep.check(
        sec,
        "RELEASE, key of 1,000 readers / of 1",
        s.med("r.c_rel"),
        Some(Goal::AtMost(1.25)),
    );
    rep.check(
        sec,
        "memory of one more reader / of a held exclusive lock",
        per_reader / per_lock,
        Some(Goal::AtMost(1.1)),
    );
    let row = |what: &str, a: &str, b: &str, r: &str, goal: &str, check: &str| {
        vec![
            what.to_string(),
            us(s.med(a)),
            us(s.med(b)),
            s.show_ratio(r),
            goal.to_string(),
            rep.mark_of(check),
        ]
    };
    let rows = vec![
        row(
            "`ACQUIRE ... SHARED` / `ACQUIRE` (free key)",
            "s.acq",
            "x.acq",
            "r.s_acq",
            "≤ 1.10x",
            "ACQUIRE SHARED / exclusive ACQUIRE (free key)",
        ),
        row(
            "`RELEASE` shared / exclusive",
            "s.rel",
            "x.rel",
            "r.s_rel",
            "≤ 1.10x",
            "RELEASE of a shared grant / of an exclusive one",
        ),
        row(
            "`ACQUIRE ... BOUND` / `ACQUIRE`",
            "b.acq",
            "x.acq",
            "r.b_acq",
            "≤ 1.15x",
            "ACQUIRE BOUND / ACQUIRE",
        ),
        row(
            "`ACQUIRE ... SHARED`, 1,000 readers / 1",
            "c1000.acq",
            "c1.acq",
            "r.c_acq",
            "≤ 1.25x",
            "ACQUIRE SHARED, key of 1,000 readers / of 1",
        ),
        row(
            "`RELEASE`, 1,000 readers / 1",
            "c1000.rel",
            "c1.rel",
            "r.c_rel",
            "≤ 1.25x",
            "RELEASE, key of 1,000 readers / of 1",
        ),
    ];
    let mut body = format!(
        "`INFO commandstats` usec per call, {rounds} rounds, medians (ratio: median of the \
         per-round ratios). Free keys: {} distinct keys, each acquired once and released once, \
         8 connections, 16 commands per pipeline. A crowded key: one key held by 1 or 1,000 \
         readers throughout, while {} new readers each take and release it (pairs in one \
         pipeline). Owners of a key are found through an index (SipHash of the owner to its \
         place) once a key has more than 16 grants, and a grant leaves by swap-remove, so \
         neither grows with the readers. A BOUND grant also enters the connection's binding \
         index (client id to its grants).\n\n",
        thousands(n),
        thousands(n / 2)
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
    body += &format!(
        "\nMemory (`used_memory` deltas, {} locks or readers, 36-byte owners): a held exclusive \
         lock {:.0} bytes (key and value), one more reader of a read-locked key {:.0} bytes \
         ({:.2}x; {}).\n",
        thousands(m),
        per_lock,
        per_reader,
        per_reader / per_lock,
        rep.mark_of("memory of one more reader / of a held exclusive lock")
    );
    rep.section(sec, body);
}
