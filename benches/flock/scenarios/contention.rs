//! Scenario 4: contention: N clients, one lock, a 1 ms critical section, BLOCK vs polling.

use crate::config::*;
use crate::conn::*;
use crate::format::*;
use crate::measure::*;
use crate::recipes::*;
use crate::report::*;
use crate::system::*;
use flock_testkit::*;
use std::fmt::Write as _;
use std::sync::Barrier;
use std::thread::{self, sleep};
use std::time::{Duration, Instant};

#[derive(Clone, Copy, PartialEq)]
pub(crate) enum Method {
    Block,
    Poll10,
    Redlock,
}

pub(crate) struct Cont {
    pub(crate) grants_per_s: f64,
    pub(crate) waits: Vec<u64>,
    pub(crate) per_client: Vec<u64>,
}

/// `clients` threads compete for one lock for `secs`; each holds it for 1 ms, then works
/// `think` outside the lock before it tries again.
pub(crate) fn contention(
    port: u16,
    clients: usize,
    secs: f64,
    think: Duration,
    method: Method,
    cad: &str,
) -> Cont {
    let dur = Duration::from_secs_f64(secs);
    let barrier = Barrier::new(clients);
    // every client connects first; the clock starts when the last one is ready
    let start_at = std::sync::OnceLock::new();
    let results: Vec<(u64, Vec<u64>)> = thread::scope(|s| {
        let hs: Vec<_> = (0..clients)
            .map(|i| {
                let barrier = &barrier;
                let start_at = &start_at;
                s.spawn(move || {
                    let mut c = Conn::open(port);
                    let owner = uuid(500_000 + i);
                    let mut rng = Rng::new((i as u64 + 77) ^ now_nanos());
                    let mut waits = Vec::new();
                    let mut grants = 0u64;
                    barrier.wait();
                    let start: Instant = *start_at.get_or_init(Instant::now);
                    let end = start + dur;
                    'outer: loop {
                        let t0 = Instant::now();
                        if t0 >= end {
                            break;
                        }
                        let got = loop {
                            let granted = match method {
                                Method::Block => matches!(
                                    c.call(&[
                                        "FLOCK.ACQUIRE",
                                        "lk",
                                        &owner,
                                        "10000",
                                        "BLOCK",
                                        "2000"
                                    ]),
                                    Reply::Int(_)
                                ),
                                _ => matches!(
                                    c.call(&["SET", "lk", &owner, "NX", "PX", "10000"]),
                                    Reply::Status(ref s) if s == "OK"
                                ),
                            };
                            if granted {
                                break true;
                            }
                            if Instant::now() >= end {
                                break false;
                            }
                            match method {
                                Method::Block => {}
                                Method::Poll10 => sleep(Duration::from_millis(10)),
                                Method::Redlock => {
                                    sleep(Duration::from_millis(50 + rng.below(201)))
                                }
                            }
                            if Instant::now() >= end {
                                break false;
                            }
                        };
                        let t1 = Instant::now();
                        let release = |c: &mut Conn| {
                            let r = match method {
                                Method::Block => c.call(&["FLOCK.RELEASE", "lk", &owner]),
                                _ => c.call(&["EVALSHA", cad, "1", "lk", &owner]),
                            };
                            assert_eq!(r, Reply::Int(1), "release in the contention scenario");
                        };
                        if got && t1 < end {
                            waits.push((t1 - t0).as_micros() as u64);
                            grants += 1;
                            sleep(Duration::from_millis(1)); // the critical section
                            release(&mut c);
                            if !think.is_zero() {
                                sleep(think); // work outside the lock
                            }
                        } else {
                            // a wait still going on at the end counts with what it has lasted
                            waits.push((end.min(t1) - t0).as_micros() as u64);
                            if got {
                                release(&mut c);
                            }
                            break 'outer;
                        }
                    }
                    (grants, waits)
                })
            })
            .collect();
        hs.into_iter()
            .map(|h| h.join().expect("client thread"))
            .collect()
    });
    let per_client: Vec<u64> = results.iter().map(|r| r.0).collect();
    let mut waits: Vec<u64> = results.into_iter().flat_map(|r| r.1).collect();
    waits.sort_unstable();
    let total: u64 = per_client.iter().sum();
    Cont {
        grants_per_s: total as f64 / secs,
        waits,
        per_client,
    }
}

pub(crate) fn jain(v: &[u64]) -> f64 {
    let s: f64 = v.iter().map(|&x| x as f64).sum();
    let s2: f64 = v.iter().map(|&x| (x as f64) * (x as f64)).sum();
    if s2 == 0.0 {
        return 0.0;
    }
    s * s / (v.len() as f64 * s2)
}

pub(crate) fn run(cfg: &Cfg, rep: &mut Report) {
    eprintln!(
        "[4] contention: {:?} clients x 3 methods x {:.1} s",
        cfg.s4_clients, cfg.s4_secs
    );
    let max_c = *cfg.s4_clients.iter().max().unwrap_or(&128);
    let srv = Server::builder()
        .arg("maxclients", &(max_c + 1000).to_string())
        .start();
    let port = srv.port();
    let mut c = Conn::open(port);
    let cad = c.script(CAD);
    let methods = [
        (Method::Block, "flock `BLOCK`"),
        (Method::Poll10, "`SET NX` + 10 ms sleep"),
        (Method::Redlock, "`SET NX` + 50-250 ms back-off"),
    ];
    let mut rows = vec![];
    let sec = "4. Contention: one lock, many clients";
    // the loop (no pause between critical sections), plus 32 clients that work 10 ms
    // outside the lock between critical sections
    let mut configs: Vec<(usize, u64)> = cfg.s4_clients.iter().map(|&n| (n, 0)).collect();
    if cfg.s4_clients.contains(&32) {
        configs.push((32, 10));
    }
    let label = |n: usize, think: u64| {
        if think == 0 {
            format!("{n}")
        } else {
            format!("{n} + {think} ms work")
        }
    };
    for (ci, &(n, think)) in configs.iter().enumerate() {
        eprintln!("  {}", label(n, think));
        let mut res = vec![];
        for (m, name) in rotate(&methods, ci) {
            c.call(&["FLUSHALL"]);
            let r = contention(port, n, cfg.s4_secs, Duration::from_millis(think), m, &cad);
            res.push((m, name, r));
        }
        res.sort_by_key(|(m, _, _)| *m as u8);
        for (_, name, r) in &res {
            let mn = r.per_client.iter().min().copied().unwrap_or(0);
            let mx = r.per_client.iter().max().copied().unwrap_or(0);
            rows.push(vec![
                label(n, think),
                name.to_string(),
                format!("{:.0}", r.grants_per_s),
                ms(pct(&r.waits, 0.5)),
                ms(pct(&r.waits, 0.99)),
                ms(r.waits.last().copied().unwrap_or(0)),
                format!("{:.3}", jain(&r.per_client)),
                format!("{mn} / {mx}"),
            ]);
        }
        let flock = &res[0].2;
        if n == 32 && think == 0 {
            rep.fact("s4.gps.flock", flock.grants_per_s);
            rep.fact("s4.gps.poll", res[1].2.grants_per_s);
            rep.fact("s4.gps.redlock", res[2].2.grants_per_s);
            rep.fact("s4.p99.flock", pct(&flock.waits, 0.99) as f64 / 1000.0);
            rep.fact("s4.p99.poll", pct(&res[1].2.waits, 0.99) as f64 / 1000.0);
            rep.fact("s4.p99.redlock", pct(&res[2].2.waits, 0.99) as f64 / 1000.0);
            rep.fact("s4.jain.flock", jain(&flock.per_client));
            rep.fact("s4.jain.poll", jain(&res[1].2.per_client));
            rep.fact("s4.jain.redlock", jain(&res[2].2.per_client));
        }
        let best = if res[1].2.grants_per_s >= res[2].2.grants_per_s {
            &res[1].2
        } else {
            &res[2].2
        };
        let gps = flock.grants_per_s / best.grants_per_s;
        let p99_best_poll = pct(&res[1].2.waits, 0.99)
            .min(pct(&res[2].2.waits, 0.99))
            .max(1);
        let p99 = pct(&flock.waits, 0.99) as f64 / p99_best_poll as f64;
        let (g1, g2) = if n == 32 && think == 0 {
            (Some(Goal::AtLeast(5.0)), Some(Goal::Below(1.0)))
        } else {
            (None, None)
        };
        rep.check(
            sec,
            &format!(
                "grants/s with {} clients, flock / best polling",
                label(n, think)
            ),
            gps,
            g1,
        );
        rep.check(
            sec,
            &format!(
                "p99 wait with {} clients, flock / lower polling p99",
                label(n, think)
            ),
            p99,
            g2,
        );
    }
    eprintln!("  hand-off latency, one waiter");
    let mut lat = vec![];
    for (m, name) in methods.iter().take(2) {
        c.call(&["FLUSHALL"]);
        let n = if *m == Method::Block {
            cfg.s4_handoffs
        } else {
            cfg.s4_handoffs / 4
        };
        lat.push((*name, handoff_latency(port, n, *m, &cad)));
    }
    let lat_ratio = pct(&lat[0].1, 0.5) as f64 / pct(&lat[1].1, 0.5).max(1) as f64;
    rep.check(
        sec,
        "hand-off latency p50, flock / SET NX + 10 ms polling",
        lat_ratio,
        None,
    );
    drop(srv);
    let mut body = format!(
        "N clients (threads, each with its own connection) compete for one lock for {:.1} s: \
         acquire, hold it for a 1 ms critical section (`sleep(1 ms)`), release, repeat. flock \
         waits with `FLOCK.ACQUIRE lk owner 10000 BLOCK 2000`; the polling clients retry \
         `SET lk owner NX PX 10000` after a fixed 10 ms sleep, or after a Redlock-style random \
         50-250 ms back-off, and release with the Lua compare-and-delete. A wait runs from the \
         first try to the grant; a wait still going on when time is up counts with what it has \
         lasted. Fairness: Jain's index over the clients' grant counts (1 = all equal) and the \
         fewest / most grants of one client. The machine has {} cores for the server and all \
         client threads.\n\n\
         In that loop a polling client that releases tries again at once and usually takes the \
         lock straight back (its wait is a few microseconds), so the lock is never idle and \
         grants/s is bounded by the 1 ms critical section for every method; what differs is who \
         gets the grants (fairness) and how long the others wait. The extra \"32 + 10 ms work\" \
         rows (no target) let each client work 10 ms outside the lock before it tries again, as \
         real workers do; then a lock released while every poller sleeps stays idle until the \
         next poll.\n\n\
         Read the p99 column with the fairness columns: with few polling clients most grants go \
         to the client that has just released (a wait of microseconds), so the polling p99 can \
         be tiny while another client waits the whole run (max wait, and 0 grants in min / max \
         grants).\n\n",
        cfg.s4_secs,
        ncpu()
    );
    body += &table(
        &[
            "clients",
            "method",
            "grants/s",
            "wait p50 ms",
            "wait p99 ms",
            "wait max ms",
            "Jain",
            "min / max grants",
        ],
        &rows,
    );
    body +=
        "\nRatios (flock / best polling baseline; for p99 the lower of the two polling p99s):\n\n";
    let mut rrows = vec![];
    for &(n, think) in &configs {
        let g = format!(
            "grants/s with {} clients, flock / best polling",
            label(n, think)
        );
        let p = format!(
            "p99 wait with {} clients, flock / lower polling p99",
            label(n, think)
        );
        let gv = rep
            .checks
            .iter()
            .rev()
            .find(|c| c.what == g)
            .map(|c| c.value)
            .unwrap_or(f64::NAN);
        let pv = rep
            .checks
            .iter()
            .rev()
            .find(|c| c.what == p)
            .map(|c| c.value)
            .unwrap_or(f64::NAN);
        let targeted = n == 32 && think == 0;
        rrows.push(vec![
            label(n, think),
            x(gv),
            if targeted {
                "≥ 5.00x".into()
            } else {
                "—".into()
            },
            rep.mark_of(&g),
            x(pv),
            if targeted {
                "< 1.00x".into()
            } else {
                "—".into()
            },
            rep.mark_of(&p),
        ]);
    }
    body += &table(
        &[
            "clients",
            "grants/s ratio",
            "target",
            "",
            "p99 wait ratio",
            "target",
            "",
        ],
        &rrows,
    );
    let _ = write!(
        body,
        "\n**Hand-off latency.** One client holds the lock and one waits for it (flock: blocked \
         in `FLOCK.ACQUIRE ... BLOCK 0`; polling: `SET NX` every 10 ms, the release landing at \
         a random point of its sleep). Time from sending the release to the waiter holding the \
         lock, measured by the clients, {} hand-offs for flock, {} for polling:\n\n",
        thousands(lat[0].1.len()),
        thousands(lat[1].1.len())
    );
    let lrows: Vec<Vec<String>> = lat
        .iter()
        .map(|(name, l)| {
            vec![
                name.to_string(),
                ms(pct(l, 0.5)),
                ms(pct(l, 0.99)),
                ms(l.last().copied().unwrap_or(0)),
            ]
        })
        .collect();
    body += &table(&["waiter", "p50 ms", "p99 ms", "max ms"], &lrows);
    let _ = writeln!(body, "\nflock / polling, p50: {}.", x(lat_ratio));
    rep.section(sec, body);
}

/// Time (us) from the holder sending its release until one waiting client holds the lock,
/// `n` times. The holder uses its own connection; the waiter is a thread with its own.
pub(crate) fn handoff_latency(port: u16, n: usize, method: Method, cad: &str) -> Vec<u64> {
    use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
    use std::sync::mpsc;
    let mut holder = Conn::open(port);
    let tries = AtomicUsize::new(0);
    let granted_at = AtomicU64::new(0);
    let origin = Instant::now();
    let (go_tx, go_rx) = mpsc::channel::<Option<usize>>();
    let (done_tx, done_rx) = mpsc::channel::<()>();
    let mut out = Vec::with_capacity(n);
    thread::scope(|s| {
        let (tries, granted_at) = (&tries, &granted_at);
        s.spawn(move || {
            let mut c = Conn::open(port);
            while let Ok(Some(i)) = go_rx.recv() {
                let owner = format!("waiter-{i}");
                match method {
                    Method::Block => {
                        tries.fetch_add(1, Ordering::SeqCst);
                        let r = c.call(&["FLOCK.ACQUIRE", "hk", &owner, "10000", "BLOCK", "0"]);
                        assert!(matches!(r, Reply::Int(_)), "hand-off: {r:?}");
                    }
                    _ => loop {
                        let r = c.call(&["SET", "hk", &owner, "NX", "PX", "10000"]);
                        if matches!(r, Reply::Status(ref s) if s == "OK") {
                            break;
                        }
                        tries.fetch_add(1, Ordering::SeqCst);
                        sleep(Duration::from_millis(10));
                    },
                }
                granted_at.store(origin.elapsed().as_micros() as u64, Ordering::SeqCst);
                let r = match method {
                    Method::Block => c.call(&["FLOCK.RELEASE", "hk", &owner]),
                    _ => c.call(&["EVALSHA", cad, "1", "hk", &owner]),
                };
                assert_eq!(r, Reply::Int(1), "hand-off: waiter release");
                done_tx.send(()).expect("done");
            }
        });
        let mut rng = Rng::new((4242) ^ now_nanos());
        for i in 0..n {
            let r = match method {
                Method::Block => holder.call(&["FLOCK.ACQUIRE", "hk", "holder", "10000"]),
                _ => holder.call(&["SET", "hk", "holder", "NX", "PX", "10000"]),
            };
            assert!(!r.is_nil() && !r.is_err(), "hand-off: holder acquire {r:?}");
            tries.store(0, Ordering::SeqCst);
            go_tx.send(Some(i)).expect("go");
            match method {
                Method::Block => wait_for("the waiter to block", Duration::from_secs(10), || {
                    tries.load(Ordering::SeqCst) > 0 && holder.blocked_clients() == 1
                }),
                _ => {
                    wait_for("the waiter to poll", Duration::from_secs(10), || {
                        tries.load(Ordering::SeqCst) > 0
                    });
                    sleep(Duration::from_micros(rng.below(10_000)));
                }
            }
            let t0 = origin.elapsed().as_micros() as u64;
            let r = match method {
                Method::Block => holder.call(&["FLOCK.RELEASE", "hk", "holder"]),
                _ => holder.call(&["EVALSHA", cad, "1", "hk", "holder"]),
            };
            assert_eq!(r, Reply::Int(1), "hand-off: holder release");
            done_rx.recv().expect("waiter done");
            out.push(granted_at.load(Ordering::SeqCst).saturating_sub(t0));
        }
        go_tx.send(None).expect("stop");
    });
    out.sort_unstable();
    out
}
