//! Random calls and random waits of every kind checked against a model of the rules.

use super::helpers::*;
use flock_testkit::*;

/// What the model says an ACQUIRE without BLOCK answers.
#[derive(Debug, PartialEq)]
enum Want {
    Token(i64),
    New,
    Nil,
    Err(String),
}

#[test]
fn random_calls_of_every_kind_match_a_model_of_the_rules() {
    // Seeded (FLOCK_KINDS_SEED to repeat a run); no BLOCK and no expiry, so that a simple
    // model of SPEC's rules predicts every reply: G1 (an exclusive grant alone, never more
    // than the limit), G3 (tokens grow), G4 (the holder's repeat), the error texts, the
    // token-qualified calls and REVOKE's count.
    let seed = seed_from_env("FLOCK_KINDS_SEED");
    eprintln!("FLOCK_KINDS_SEED={seed}");
    let mut rng = Rng::new(seed);
    let srv = Server::start();
    let mut c = srv.conn();
    set_config(&mut c, "flock.max-holders", "4");
    let keys = ["k0", "k1"];
    let owners_ = ["a", "b", "c", "d", "e", "f"];
    // mode: "x", "s" or the limit as text; each key: (mode, [(owner, token)]).
    let mut model: Vec<(String, Vec<(String, i64)>)> = vec![(String::new(), Vec::new()); 2];
    let mut last = 0i64;
    for step in 0..5_000 {
        let ki = rng.below(2) as usize;
        let key = keys[ki];
        let owner = rng.pick(&owners_);
        let (mode, grants) = &mut model[ki];
        let held = grants.iter().position(|(o, _)| o == owner);
        let what = format!("seed {seed} step {step}");
        match rng.below(10) {
            0..=4 => {
                let m = rng.pick(&["x", "s", "2", "3"]);
                let opts: Vec<&str> = match m {
                    "x" => vec![],
                    "s" => vec!["SHARED"],
                    n => vec!["LIMIT", n],
                };
                let noun = |m: &str| match m {
                    "x" => "an exclusive",
                    "s" => "a shared",
                    _ => "a permit",
                };
                let want = if let Some(i) = held {
                    if *mode == m {
                        Want::Token(grants[i].1)
                    } else {
                        Want::Err(format!(
                            "ERR owner already holds {} grant of {key}",
                            noun(mode)
                        ))
                    }
                } else if !grants.is_empty() && *mode != "x" && m != "x" && *mode != m {
                    Want::Err(if *mode == "s" {
                        format!("ERR limit mismatch: {key} admits any number of shared holders")
                    } else {
                        format!("ERR limit mismatch: {key} admits {mode} shared holders")
                    })
                } else {
                    let cap = match m {
                        "x" => 1,
                        "s" => 4,
                        n => n.parse().unwrap(),
                    };
                    let fits = grants.is_empty() || (*mode == m && m != "x" && grants.len() < cap);
                    if fits {
                        Want::New
                    } else {
                        Want::Nil
                    }
                };
                let r = acq(&mut c, key, owner, 600_000, &opts);
                match (&want, &r) {
                    (Want::Token(t), Reply::Int(g)) if g == t => {}
                    (Want::New, Reply::Int(g)) if *g > last => {
                        last = *g;
                        *mode = m.to_string();
                        grants.push((owner.to_string(), *g));
                    }
                    (Want::Nil, Reply::Nil) => {}
                    (Want::Err(e), Reply::Err(g)) if e == g => {}
                    _ => panic!("{what}: ACQUIRE {key} {owner} {opts:?}: want {want:?}, got {r:?} (model {mode} {grants:?}, last token {last})"),
                }
            }
            5 | 6 => {
                // RELEASE, half of the time with a token (right or wrong).
                let tok_arg = match (held, rng.chance(50)) {
                    (Some(i), true) if rng.chance(70) => Some(grants[i].1),
                    (_, true) => Some(last + 1),
                    _ => None,
                };
                let mut args = vec!["FLOCK.RELEASE".to_string(), key.into(), owner.into()];
                args.extend(tok_arg.map(|t| t.to_string()));
                let want = match held {
                    Some(i) if tok_arg.is_none_or(|t| t == grants[i].1) => {
                        grants.remove(i);
                        1
                    }
                    _ => 0,
                };
                assert_eq!(call(&mut c, &args), Reply::Int(want), "{what}: {args:?}");
            }
            7 => {
                let want = held.map(|i| grants[i].1);
                let r = call(&mut c, &["FLOCK.RENEW", key, owner, "600000"]);
                assert_eq!(r.int(), want, "{what}: RENEW {key} {owner}");
            }
            8 => {
                if rng.chance(30) {
                    let n = grants.len() as i64;
                    grants.clear();
                    assert_eq!(revoke(&mut c, &[key]), n, "{what}: REVOKE {key}");
                } else {
                    let n = held.map(|i| grants.remove(i)).is_some() as i64;
                    let r = revoke(&mut c, &[key, owner]);
                    assert_eq!(r, n, "{what}: REVOKE {key} {owner}");
                }
            }
            _ => {
                // CHECK of a random grant's token, live or not.
                if let Some((_, t)) = grants.first() {
                    assert!(check(&mut c, key, *t) > 0, "{what}: CHECK of a live token");
                }
                assert_eq!(
                    check(&mut c, key, last + 1),
                    0,
                    "{what}: CHECK of a never issued token"
                );
            }
        }
        if grants.is_empty() {
            mode.clear();
        }
        // The server agrees with the model: same grants in token order, same mode.
        let (mode, grants) = &model[ki];
        assert_eq!(&holder_tokens(&mut c, key), grants, "{what}: HOLDERS {key}");
        if grants.is_empty() {
            assert_eq!(
                exists(&mut c, key),
                0,
                "{what}: {key} without grants exists"
            );
        } else {
            let k = kinfo(&mut c, key);
            let (m, limit) = match mode.as_str() {
                "x" => ("exclusive", 0),
                "s" => ("shared", 0),
                n => ("permits", n.parse().unwrap()),
            };
            assert_eq!(
                (k.mode.as_str(), k.limit, k.holders),
                (m, limit, grants.len() as i64),
                "{what}: INFO {key}"
            );
        }
    }
}

/// One key of `random_waits_of_every_kind_follow_one_fifo_queue`'s model.
#[derive(Default, Debug)]
struct QKey {
    /// "x", "s" or the limit as text (meaningful while `grants` is not empty).
    mode: String,
    grants: Vec<(String, i64)>,
    /// Waiting requests in arrival order: (owner, mode).
    queue: Vec<(String, String)>,
}

impl QKey {
    /// SPEC: "a shared waiter or permit when no exclusive grant is live and the limit is not
    /// reached"; an exclusive one when no grant is live.
    fn fits(&self, m: &str, max_holders: usize) -> bool {
        if self.grants.is_empty() {
            return true;
        }
        match m {
            "x" => false,
            "s" => self.mode == "s" && self.grants.len() < max_holders,
            n => self.mode == n && self.grants.len() < n.parse::<usize>().unwrap(),
        }
    }
    /// The key's limit: that of its live shared grants, else of its waiting shared requests.
    fn limit(&self) -> Option<String> {
        if !self.grants.is_empty() && self.mode != "x" {
            return Some(self.mode.clone());
        }
        self.queue
            .iter()
            .find(|(_, m)| m != "x")
            .map(|(_, m)| m.clone())
    }
}

#[test]
fn random_waits_of_every_kind_follow_one_fifo_queue() {
    // Seeded (FLOCK_KINDS_SEED): owners on their own connections send ACQUIRE ... BLOCK 0
    // for random kinds, the test releases and revokes; a model of SPEC's queue (one FIFO per
    // key, grant from the head while the head fits, nobody jumps it, the key's limit from
    // grants and waiting requests) predicts who holds after every step and which waiter
    // is answered, and with what. Waits are never retried or abandoned here (see the tests
    // above for those).
    let seed = seed_from_env("FLOCK_KINDS_SEED");
    eprintln!("FLOCK_KINDS_SEED={seed}");
    let mut rng = Rng::new(seed);
    let srv = Server::start();
    let mut c = srv.conn();
    let max_holders = 3;
    set_config(&mut c, "flock.max-holders", &max_holders.to_string());
    let names = ["a", "b", "c", "d", "e", "f", "g"];
    let mut conns: Vec<RawConn> = names
        .iter()
        .map(|_| RawConn::connect(srv.port()).expect("connect"))
        .collect();
    // Which key each owner's connection waits on (a blocked connection sends nothing else).
    let mut waiting: Vec<Option<usize>> = vec![None; names.len()];
    let keys = ["q0", "q1"];
    let mut model: Vec<QKey> = vec![QKey::default(), QKey::default()];
    let mut last = 0i64;
    // How much of the queue the run exercised: requests queued, hand-offs, the longest queue.
    let (mut queued, mut handed, mut longest) = (0, 0, 0);
    for step in 0..1_000 {
        let what = format!("seed {seed} step {step}");
        let ki = rng.below(2) as usize;
        let key = keys[ki];
        let k = &mut model[ki];
        let mut check_waiters = false;
        match rng.below(10) {
            0..=4 => {
                let free: Vec<usize> = (0..names.len()).filter(|&i| waiting[i].is_none()).collect();
                if free.is_empty() {
                    continue;
                }
                let oi = rng.pick(&free);
                let owner = names[oi];
                let m = rng.pick(&["x", "x", "s", "s", "2"]);
                let mut args = vec!["FLOCK.ACQUIRE", key, owner, "600000"];
                match m {
                    "x" => {}
                    "s" => args.push("SHARED"),
                    n => args.extend(["LIMIT", n]),
                }
                args.extend(["BLOCK", "0"]);
                conns[oi].send(&args).expect("send");
                let holds = k.grants.iter().position(|(o, _)| o == owner);
                let at_once = match holds {
                    Some(i) if k.mode == m => Some(Reply::Int(k.grants[i].1)),
                    Some(_) => Some(Reply::Err(format!(
                        "ERR owner already holds {} grant of {key}",
                        match k.mode.as_str() {
                            "x" => "an exclusive",
                            "s" => "a shared",
                            _ => "a permit",
                        }
                    ))),
                    None => match k.limit() {
                        Some(l) if m != "x" && l != m => Some(Reply::Err(if l == "s" {
                            format!("ERR limit mismatch: {key} admits any number of shared holders")
                        } else {
                            format!("ERR limit mismatch: {key} admits {l} shared holders")
                        })),
                        _ => None,
                    },
                };
                if let Some(want) = at_once {
                    let r = conns[oi].read_reply().expect("reply");
                    assert_eq!(r, want, "{what}: {args:?} (model {k:?})");
                } else if k.queue.is_empty() && k.fits(m, max_holders) {
                    let r = conns[oi].read_reply().expect("reply");
                    let t = r.int().unwrap_or_else(|| {
                        panic!("{what}: {args:?}: {r:?}, model grants at once ({k:?})")
                    });
                    assert!(t > last, "{what}: token {t} not above {last}");
                    last = t;
                    k.mode = m.to_string();
                    k.grants.push((owner.to_string(), t));
                } else {
                    k.queue.push((owner.to_string(), m.to_string()));
                    queued += 1;
                    longest = longest.max(k.queue.len());
                    waiting[oi] = Some(ki);
                    check_waiters = true;
                }
            }
            5 | 6 => {
                if k.grants.is_empty() {
                    continue;
                }
                let i = rng.below(k.grants.len() as u64) as usize;
                let (o, _) = k.grants.remove(i);
                assert_eq!(release(&mut c, key, &o), 1, "{what}: RELEASE {key} {o}");
            }
            7 => {
                let o = rng.pick(&names);
                let n = k
                    .grants
                    .iter()
                    .position(|(g, _)| g == o)
                    .map(|i| k.grants.remove(i))
                    .is_some();
                assert_eq!(
                    revoke(&mut c, &[key, o]),
                    n as i64,
                    "{what}: REVOKE {key} {o}"
                );
            }
            8 => {
                let n = k.grants.len() as i64;
                k.grants.clear();
                assert_eq!(revoke(&mut c, &[key]), n, "{what}: REVOKE {key}");
            }
            _ => {
                // A request without BLOCK from the control connection: never jumps the queue.
                let o = rng.pick(&names);
                let m = rng.pick(&["x", "s"]);
                let opts: &[&str] = if m == "s" { &["SHARED"] } else { &[] };
                let r = acq(&mut c, key, o, 600_000, opts);
                let holds = k.grants.iter().position(|(g, _)| g == o);
                match holds {
                    Some(i) if k.mode == m => assert_eq!(r, Reply::Int(k.grants[i].1), "{what}"),
                    Some(_) => assert!(r.is_err(), "{what}: other mode: {r:?}"),
                    None if r.is_err() => {
                        assert!(
                            k.limit().is_some_and(|l| m == "s" && l != "s"),
                            "{what}: {r:?} ({k:?})"
                        )
                    }
                    None if !k.queue.is_empty() || !k.fits(m, max_holders) => {
                        assert!(
                            r.is_nil(),
                            "{what}: {o} {m} jumped the queue or did not fit: {r:?} ({k:?})"
                        )
                    }
                    None => {
                        let t = tok(&r, &what);
                        assert!(t > last);
                        last = t;
                        k.mode = m.to_string();
                        k.grants.push((o.to_string(), t));
                    }
                }
            }
        }
        // Serve the queue as SPEC says: from the head while the head fits.
        while let Some((o, m)) = k.queue.first().cloned() {
            if !k.fits(&m, max_holders) {
                break;
            }
            k.queue.remove(0);
            handed += 1;
            let oi = names.iter().position(|n| *n == o).unwrap();
            waiting[oi] = None;
            let r = conns[oi].read_reply().unwrap_or_else(|e| {
                panic!("{what}: {o} ({m}) should have been granted {key} ({k:?}): {e}")
            });
            let t = tok(&r, &format!("{what}: {o} handed {key}"));
            assert!(t > last, "{what}: hand-off token {t} not above {last}");
            last = t;
            if k.grants.is_empty() {
                k.mode = m.clone();
            }
            k.grants.push((o, t));
        }
        if check_waiters {
            let n = k.queue.len() as i64;
            wait_until(&format!("{what}: {n} waiters on {key}"), || {
                parse_k(&call(&mut c, &["FLOCK.INFO", key]), key).is_some_and(|i| i.waiters == n)
            });
        }
        let k = &model[ki];
        assert_eq!(
            holder_tokens(&mut c, key),
            k.grants,
            "{what}: HOLDERS {key} (model {k:?})"
        );
        match parse_k(&call(&mut c, &["FLOCK.INFO", key]), key) {
            None => assert!(
                k.grants.is_empty() && k.queue.is_empty(),
                "{what}: {key} gone, model {k:?}"
            ),
            Some(i) => assert_eq!(
                i.waiters,
                k.queue.len() as i64,
                "{what}: waiters of {key} ({k:?})"
            ),
        }
    }
    eprintln!(
        "queue model: {queued} requests queued, {handed} handed off, longest queue {longest}"
    );
    assert!(
        queued > 20 && handed > 10,
        "the run hardly waited: {queued} queued, {handed} handed off"
    );
}
