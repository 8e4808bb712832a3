//! The operator: REVOKEs and DELs lock keys, lists HOLDERS and reads FLOCK.INFO at random,
//! and checks each INFO against the key's use.

use super::*;

pub(crate) fn operator(sh: Arc<Shared>, seed: u64) {
    let mut rng = Rng::new(seed);
    let mut conn: Option<RawConn> = None;
    while !sh.stop.load(SeqCst) {
        sleep(Duration::from_millis(100 + rng.below(600)));
        sh.gate.checkpoint();
        if conn.is_none() {
            conn = RawConn::connect(sh.port.load(SeqCst)).ok();
        }
        let Some(c) = conn.as_mut() else { continue };
        let k = rng.below(sh.keys as u64) as usize;
        let key = sh.lock_key(k);
        // First a look at the key's holders (for the checker, and an owner to revoke).
        let epoch = sh.epoch();
        let send = sh.now();
        let listed = c.call(&["FLOCK.HOLDERS", &key]);
        let ack = sh.now();
        let mut victim = None;
        match &listed {
            Ok(r) if !r.is_err() => match parse_holders(r) {
                Ok(list) => {
                    if !list.is_empty() {
                        victim = Some(list[rng.below(list.len() as u64) as usize].0.clone());
                    }
                    let mut h = sh.hist();
                    h.op("operator HOLDERS");
                    h.holders.push(HoldersRec {
                        key: k,
                        send,
                        ack,
                        grants: list,
                        epoch: if sh.epoch() == epoch { epoch } else { u64::MAX },
                    });
                }
                Err(e) => sh.hist().violation(e),
            },
            Ok(_) => {}
            Err(_) => {
                conn = None;
                continue;
            }
        }
        let Some(c) = conn.as_mut() else { continue };
        if let Ok(r) = c.call(&["FLOCK.INFO", &key]) {
            if !r.is_nil() && !r.is_err() {
                check_info(&sh, k, &r);
            }
        }
        let pick = rng.below(100);
        // REVOKE key, REVOKE key owner (a holder just listed), DEL.
        let (name, owner, args): (&'static str, Option<String>, Vec<String>) = match pick {
            0..=39 => (
                "operator REVOKE",
                None,
                vec!["FLOCK.REVOKE".into(), key.clone()],
            ),
            40..=69 => {
                let o = victim.unwrap_or_else(|| "nobody".into());
                (
                    "operator REVOKE owner",
                    Some(o.clone()),
                    vec!["FLOCK.REVOKE".into(), key.clone(), o],
                )
            }
            _ => ("operator DEL", None, vec!["DEL".into(), key.clone()]),
        };
        let send = sh.now();
        let r = c.call(&args);
        let done = sh.now();
        let mut h = sh.hist();
        h.op(name);
        let one_owner = owner.is_some();
        h.operator.push(OperatorOp {
            key: k,
            owner,
            send,
            done,
        });
        // REVOKE's reply is the number of grants it ended: at most one per owner, at most the
        // key's limit, and at most one client's grant each (a client holds one grant at once).
        let most = if one_owner || name == "operator DEL" {
            1
        } else {
            sh.kinds[k].limit().min(sh.workers) as i64
        };
        match r {
            Ok(Reply::Int(n)) if (0..=most).contains(&n) => {}
            Ok(Reply::Err(e)) if e.starts_with("LOADING") || e.starts_with("READONLY") => {
                conn = None
            }
            Ok(other) => h.violation(format!(
                "{args:?}: unexpected reply {other:?} (at most {most} grants can end)"
            )),
            Err(_) => conn = None,
        }
    }
}

/// One FLOCK.INFO reply of key `k` (one instant) agrees with the key's use: `mode` one of those
/// its requests can make, `holders` within the limit (one for an exclusive grant, none for
/// `none`), `limit` that of its requests (a semaphore's n, else 0), `owner` only when exclusive.
fn check_info(sh: &Shared, k: usize, r: &Reply) {
    let key = sh.lock_key(k);
    let mut h = sh.hist();
    h.op("operator INFO");
    let Some(pairs) = r.pairs() else {
        h.violation(format!("FLOCK.INFO {key}: not a map: {r:?}"));
        return;
    };
    let get = |name: &str| {
        pairs
            .iter()
            .find(|(f, _)| f.string().as_deref() == Some(name))
            .map(|(_, v)| v.clone())
    };
    let int = |name: &str| get(name).and_then(|v| v.int());
    let (mode, holders, limit) = (
        get("mode").and_then(|m| m.string()),
        int("holders"),
        int("limit"),
    );
    let kind = sh.kinds[k];
    let (modes, want_limit): (&[&str], i64) = match kind {
        KeyKind::Exclusive => (&["exclusive", "none"], 0),
        KeyKind::ReadWrite => (&["exclusive", "shared", "none"], 0),
        KeyKind::Semaphore(n) => (&["permits", "none"], n as i64),
    };
    let owner_set = get("owner").is_some_and(|o| !o.is_nil());
    let ok = match (mode.as_deref(), holders, limit) {
        (Some(m), Some(n), Some(l)) if modes.contains(&m) && l == want_limit => match m {
            "exclusive" => n == 1 && owner_set,
            "none" => n == 0 && !owner_set,
            _ => n >= 1 && n as usize <= kind.limit() && !owner_set,
        },
        _ => false,
    };
    *h.checks
        .entry("INFO mode/holders/limit checked")
        .or_default() += 1;
    if !ok {
        h.violation(format!(
            "FLOCK.INFO {key} ({}): {r:?} (mode one of {modes:?}, holders within the limit, \
             limit {want_limit})",
            kind.name()
        ));
    }
}
