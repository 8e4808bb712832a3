//! The watchers: each loops over FLOCK.WATCH calls on one connection of its own and records
//! what it was told (history/coord.rs `WatchRec`). The token it watches is one it saw: a grant
//! FLOCK.HOLDERS just listed (most often), 0 (the key's oldest live grant), or a grant of the
//! history that already ended (which must be `gone`); after an end was reported it watches the
//! same token again now and then (which must be `gone` too: an end is reported once).

use super::*;
use crate::history::coord::*;

/// Parse a WATCH reply: `[key, event, owner, token]`, nil, an error.
fn told_of(r: &Reply) -> Result<Told, String> {
    match r {
        Reply::Nil => Ok(Told::TimedOut),
        Reply::Err(e) => Ok(Told::Error(e.clone())),
        Reply::Array(a) => match a.as_slice() {
            [_, ev, owner, Reply::Int(t)] if ev.string().is_some() => Ok(Told::Fired {
                event: ev.string().unwrap_or_default(),
                owner: owner.string(),
                token: *t,
            }),
            _ => Err(format!(
                "FLOCK.WATCH: not [key, event, owner, token]: {r:?}"
            )),
        },
        _ => Err(format!("FLOCK.WATCH: unexpected reply {r:?}")),
    }
}

pub(crate) fn watcher(sh: Arc<Shared>, id: usize, seed: u64) {
    let mut rng = Rng::new(seed);
    let mut conn: Option<RawConn> = None;
    // A token whose end this watcher was told, to watch once more.
    let mut again: Option<(usize, i64)> = None;
    while !sh.stop.load(SeqCst) {
        sleep(Duration::from_millis(rng.below(40)));
        sh.gate.checkpoint();
        if conn.is_none() {
            conn = RawConn::connect(sh.port.load(SeqCst)).ok();
        }
        let Some(c) = conn.as_mut() else {
            sleep(Duration::from_millis(20));
            continue;
        };
        let _ = c.set_read_timeout(Duration::from_secs(20));
        let (k, token, source) = match again.take() {
            Some((k, t)) if rng.chance(50) => (k, t, "watch an ended grant again"),
            _ => {
                let k = rng.below(sh.keys as u64) as usize;
                let pick = rng.below(100);
                if pick < 15 {
                    (k, 0, "watch token 0")
                } else if pick < 25 {
                    // A grant of this key that its holder released (most often ended).
                    let old = {
                        let h = sh.hist();
                        h.grants
                            .iter()
                            .rev()
                            .take(300)
                            .find(|g| g.key == k && g.released.is_some())
                            .map(|g| g.token)
                    };
                    match old {
                        Some(t) => (k, t, "watch a released grant"),
                        None => (k, 0, "watch token 0"),
                    }
                } else {
                    let epoch = sh.epoch();
                    let send = sh.now();
                    let r = c.call(&["FLOCK.HOLDERS", &sh.lock_key(k)]);
                    let ack = sh.now();
                    let list = match r {
                        Ok(r) if !r.is_err() => match parse_holders(&r) {
                            Ok(l) => l,
                            Err(e) => {
                                sh.hist().violation(e);
                                continue;
                            }
                        },
                        Ok(_) => continue,
                        Err(_) => {
                            conn = None;
                            continue;
                        }
                    };
                    let t = if list.is_empty() {
                        0
                    } else {
                        list[rng.below(list.len() as u64) as usize].1
                    };
                    let mut h = sh.hist();
                    h.holders.push(HoldersRec {
                        key: k,
                        send,
                        ack,
                        grants: list,
                        epoch: if sh.epoch() == epoch { epoch } else { u64::MAX },
                    });
                    (k, t, "watch a listed grant")
                }
            }
        };
        let timeout_ms = rng.pick(&[200u64, 600, 1500, 3000]);
        let Some(c) = conn.as_mut() else { continue };
        let _ = c.set_read_timeout(Duration::from_millis(timeout_ms + 20_000));
        let epoch = sh.epoch();
        let send = sh.now();
        let r = c.call(&[
            "FLOCK.WATCH",
            &timeout_ms.to_string(),
            &sh.lock_key(k),
            &token.to_string(),
        ]);
        let ack = sh.now();
        let told = match r {
            Ok(r) => match told_of(&r) {
                Ok(t) => t,
                Err(e) => {
                    sh.hist().violation(e);
                    continue;
                }
            },
            Err(e) => {
                conn = None;
                let slow = e.kind() == std::io::ErrorKind::WouldBlock
                    || e.kind() == std::io::ErrorKind::TimedOut;
                if slow {
                    Told::Hung
                } else {
                    Told::Lost
                }
            }
        };
        if let Told::Error(e) = &told {
            if e.starts_with("LOADING") || e.starts_with("READONLY") || e.starts_with("UNBLOCKED") {
                conn = None;
            }
        }
        if let Told::Fired { event, token, .. } = &told {
            if !matches!(event.as_str(), "held" | "gone") {
                again = Some((k, *token));
            }
        }
        let mut h = sh.hist();
        h.op(source);
        h.op(match &told {
            Told::Fired { event, .. } => match event.as_str() {
                "held" => "watch told: held",
                "gone" => "watch told: gone",
                "released" => "watch told: released",
                "expired" => "watch told: expired",
                "revoked" => "watch told: revoked",
                "closed" => "watch told: closed",
                "lost" => "watch told: lost",
                _ => "watch told: another event",
            },
            Told::TimedOut => "watch timed out (nil)",
            Told::Error(_) => "watch error",
            Told::Lost => "watch connection lost",
            Told::Hung => "watch hung",
        });
        h.watches.push(WatchRec {
            watcher: id,
            key: k,
            token,
            timeout_ms,
            send,
            ack,
            epoch: if sh.epoch() == epoch { epoch } else { u64::MAX },
            told,
        });
    }
}
