//! Shared and permit keys through DEBUG RELOAD, RDB, AOF, rewrite, DUMP/RESTORE and COPY,
//! the v1 fixtures, and forged AOFs that must not load.

use super::helpers::*;
use flock_testkit::*;
use std::path::{Path, PathBuf};

/// The keys every persistence test carries: `rw` (readers r1, r2 live, r3 revoked: a delayed
/// slot), `sem` (LIMIT 3: p1, p2 live, p3 revoked), `x` (exclusive), `dl` (LIMIT 2, only a
/// delayed slot). Needs a lock-delay long
/// enough to outlast the test. Returns the largest token issued.
fn kinds_setup(c: &mut redis::Connection) -> i64 {
    grant_kind(c, "rw", "r1", 60_000, &["SHARED"]);
    grant_kind(c, "rw", "r2", 50_000, &["SHARED"]);
    grant_kind(c, "rw", "r3", 60_000, &["SHARED"]);
    assert_eq!(revoke(c, &["rw", "r3"]), 1);
    grant_kind(c, "sem", "p1", 60_000, &["LIMIT", "3"]);
    grant_kind(c, "sem", "p2", 40_000, &["LIMIT", "3"]);
    grant_kind(c, "sem", "p3", 60_000, &["LIMIT", "3"]);
    assert_eq!(revoke(c, &["sem", "p3"]), 1);
    // A key that only a delayed slot keeps.
    grant_kind(c, "dl", "p", 60_000, &["LIMIT", "2"]);
    assert_eq!(revoke(c, &["dl"]), 1);
    let t = grant_kind(c, "x", "a", 60_000, &[]);
    assert_eq!(shape(c, "dl"), sh("none", 0, 2, 1, 0));
    assert_eq!(shape(c, "rw"), sh("shared", 2, 0, 1, 0));
    assert_eq!(shape(c, "sem"), sh("permits", 2, 3, 1, 0));
    t
}

type State3 = Vec<(Snap, Vec<i64>)>;

fn kinds_state(c: &mut redis::Connection, keys: &[&str]) -> State3 {
    keys.iter().map(|k| snap(c, k)).collect()
}

/// The state is as before, behaves as before (the delayed slots still count) and new tokens
/// are above `max`. Changes nothing of rw, sem, x.
#[track_caller]
fn assert_kinds_survived(c: &mut redis::Connection, before: &State3, max: i64, what: &str) {
    let keys = ["rw", "sem", "x", "dl"];
    let now = kinds_state(c, &keys);
    for ((k, a), b) in keys.iter().zip(before).zip(&now) {
        assert_same_state(a, b, &format!("{what}: {k}"));
    }
    for (o, t) in before[0].0.grants.iter().chain(&before[1].0.grants) {
        assert!(
            check(c, if o.starts_with('r') { "rw" } else { "sem" }, *t) > 0,
            "{what}: {o}'s token"
        );
    }
    refused(
        c,
        "sem",
        "p4",
        &["LIMIT", "3"],
        &format!("{what}: 2 live permits and a delayed slot"),
    );
    refused(
        c,
        "rw",
        "w",
        &[],
        &format!("{what}: a writer on a read-locked key"),
    );
    refused_with(
        c,
        "sem",
        "p4",
        &["LIMIT", "2"],
        "ERR limit mismatch: sem admits 3 shared holders",
    );
    let r = acq(c, "rw", "r1", 60_000, &[]);
    assert_eq!(
        r,
        Reply::Err("ERR owner already holds a shared grant of rw".into()),
        "{what}"
    );
    let fresh = format!("fresh:{}", now_us());
    let t = grant_kind(c, &fresh, "n", 10_000, &["SHARED"]);
    assert!(t > max, "{what}: new token {t} not above {max}");
    call(c, &["DEL", &fresh]);
}

#[test]
fn shared_and_permit_keys_survive_debug_reload_rdb_restart_dump_restore_and_copy() {
    let mut srv = Server::builder()
        .module_args(&["lock-delay-ms", "300000"])
        .start();
    let mut c = srv.conn();
    let max = kinds_setup(&mut c);
    let keys = ["rw", "sem", "x", "dl"];
    let before = kinds_state(&mut c, &keys);

    assert_eq!(
        call(&mut c, &["DEBUG", "RELOAD"]),
        Reply::Status("OK".into())
    );
    assert_kinds_survived(&mut c, &before, max, "DEBUG RELOAD");

    assert_eq!(call(&mut c, &["SAVE"]), Reply::Status("OK".into()));
    srv.restart(); // SIGKILL: only the RDB of SAVE is left
    let mut c = srv.conn();
    assert_kinds_survived(&mut c, &before, max, "RDB restart");

    // DUMP/RESTORE onto the same server (another name) and onto another server.
    let srv2 = Server::builder()
        .module_args(&["lock-delay-ms", "300000"])
        .start();
    let mut c2 = srv2.conn();
    for k in ["rw", "sem"] {
        let payload = call(&mut c, &["DUMP", k]).bytes().expect("DUMP").to_vec();
        let copy = format!("{k}-restored");
        let r = call(
            &mut c,
            &[b"RESTORE".as_slice(), copy.as_bytes(), b"0", &payload],
        );
        assert_eq!(r, Reply::Status("OK".into()), "RESTORE {copy}");
        let a = snap(&mut c, k);
        assert_same_state(&a, &snap(&mut c, &copy), &format!("RESTORE of {k}"));
        let r = call(
            &mut c2,
            &[b"RESTORE".as_slice(), k.as_bytes(), b"0", &payload],
        );
        assert_eq!(r, Reply::Status("OK".into()), "RESTORE {k} on server 2");
        assert_same_state(
            &a,
            &snap(&mut c2, k),
            &format!("RESTORE of {k} on server 2"),
        );
        let fresh = grant_kind(&mut c2, "fresh", "n", 10_000, &["SHARED"]);
        assert!(
            fresh > max,
            "server 2 issues above restored tokens: {fresh} vs {max}"
        );
        assert_eq!(release(&mut c2, "fresh", "n"), 1);
    }
    // The restored semaphore still counts its delayed slot on server 2.
    refused(
        &mut c2,
        "sem",
        "p4",
        &["LIMIT", "3"],
        "restored semaphore with a delayed slot",
    );
    // COPY duplicates grants and delayed slots; the copy is independent.
    assert_eq!(call(&mut c, &["COPY", "sem", "sem-copy"]), Reply::Int(1));
    assert_same_state(
        &snap(&mut c, "sem"),
        &snap(&mut c, "sem-copy"),
        "COPY of sem",
    );
    assert_eq!(call(&mut c, &["COPY", "rw", "rw-copy"]), Reply::Int(1));
    assert_same_state(&snap(&mut c, "rw"), &snap(&mut c, "rw-copy"), "COPY of rw");
    rel(&mut c, "sem-copy", "p1");
    assert_eq!(
        owners(&mut c, "sem"),
        ["p1", "p2"],
        "the original after releasing the copy's p1"
    );
    assert_kinds_survived(&mut c, &before, max, "after RESTORE and COPY");
}

#[test]
fn shared_and_permit_keys_survive_aof_restart_and_rewrite() {
    let mut srv = Server::builder()
        .module_args(&["lock-delay-ms", "300000"])
        .arg("appendonly", "yes")
        .arg("appendfsync", "always")
        .start();
    let mut c = srv.conn();
    let max = kinds_setup(&mut c);
    let before = kinds_state(&mut c, &["rw", "sem", "x", "dl"]);
    srv.restart();
    let mut c = srv.conn();
    assert_kinds_survived(&mut c, &before, max, "AOF restart");
    rewrite_aof(&mut c);
    srv.restart();
    let mut c = srv.conn();
    assert_kinds_survived(&mut c, &before, max, "AOF rewrite and restart");
    // A hand-off after the reload is written too: r1 and r2 leave, the writer comes in.
    rel(&mut c, "rw", "r1");
    rel(&mut c, "rw", "r2");
    assert_eq!(
        shape(&mut c, "rw"),
        sh("none", 0, 0, 1, 0),
        "only r3's delayed slot left"
    );
    srv.restart();
    let mut c = srv.conn();
    assert_eq!(
        shape(&mut c, "rw"),
        sh("none", 0, 0, 1, 0),
        "after the third restart"
    );
    refused(
        &mut c,
        "rw",
        "w",
        &[],
        "the delayed reader slot still holds off a writer",
    );
}

/// Copy the fixtures of `version` (tests/fixtures/v1, v2: files earlier versions wrote) into
/// a fresh dir the server may write to.
fn fixture_dir_of(version: &str, what: &str) -> PathBuf {
    let src = Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures")).join(version);
    let src = src.as_path();
    let dir = temp_dir(what);
    std::fs::copy(src.join("dump.rdb"), dir.join("dump.rdb")).expect("copy dump.rdb");
    std::fs::create_dir_all(dir.join("aof")).expect("mkdir aof");
    for e in std::fs::read_dir(src.join("aof"))
        .expect("read aof dir")
        .flatten()
    {
        let to = dir.join("aof").join(e.file_name());
        std::fs::copy(e.path(), &to).expect("copy aof file");
        let mut p = std::fs::metadata(&to).expect("stat").permissions();
        #[allow(clippy::permissions_set_readonly_false)]
        p.set_readonly(false);
        std::fs::set_permissions(&to, p).expect("chmod");
    }
    let mut p = std::fs::metadata(dir.join("dump.rdb"))
        .expect("stat")
        .permissions();
    #[allow(clippy::permissions_set_readonly_false)]
    p.set_readonly(false);
    std::fs::set_permissions(dir.join("dump.rdb"), p).expect("chmod");
    dir
}

fn fixture_dir(what: &str) -> PathBuf {
    fixture_dir_of("v1", what)
}

#[test]
fn the_v2_fixtures_still_load_every_kind() {
    // tests/fixtures/v2/expected.json, as written by 911e741 (owners and tokens, oldest first).
    let bin_owner: Vec<u8> = (0u8..40).collect();
    let bin_owner = String::from_utf8_lossy(&bin_owner).into_owned();
    // (key, mode, limit, holders as (owner, token)).
    type Lock<'a> = (&'a str, &'a str, i64, Vec<(String, i64)>);
    let expected: [Lock; 4] = [
        (
            "fx2:x",
            "exclusive",
            0,
            hv(&[("writer-1", 1796157490799778)]),
        ),
        (
            "fx2:r",
            "shared",
            0,
            hv(&[
                ("reader-1", 1796157490800981),
                ("reader-2", 1796157490801403),
            ]),
        ),
        (
            "fx2:p",
            "permits",
            3,
            hv(&[("job-1", 1796157490801776), ("job-2", 1796157490802170)]),
        ),
        (
            "fx2:bin",
            "exclusive",
            0,
            vec![(bin_owner, 1796157490802626)],
        ),
    ];
    let (bound_key, bound_token) = ("fx2:b", 1796157490803017i64);
    let high_water = 1796157490803417i64;
    for aof in [false, true] {
        let mut b = Server::builder()
            .module_args(&["max-ttl-ms", "315360000000"])
            .dir(fixture_dir_of("v2", if aof { "v2-aof" } else { "v2-rdb" }));
        if aof {
            b = b.arg("appendonly", "yes").arg("appenddirname", "aof");
        } else {
            b = b.arg("dbfilename", "dump.rdb");
        }
        let srv = b.start();
        let mut c = srv.conn();
        let what = if aof { "v2 AOF" } else { "v2 RDB" };
        for (key, mode, limit, want) in &expected {
            assert_eq!(holder_tokens(&mut c, key), *want, "{what}: {key} holders");
            let k = kinfo(&mut c, key);
            assert_eq!(
                (k.mode.as_str(), k.limit),
                (*mode, *limit),
                "{what}: {key} kind"
            );
            for (_, t) in want {
                assert!(check(&mut c, key, *t) > 0, "{what}: {key} {t} live");
            }
        }
        // The bound grant has no connection after a restart: not live (G11).
        assert_eq!(
            check(&mut c, bound_key, bound_token),
            0,
            "{what}: {bound_key}"
        );
        assert_eq!(exists(&mut c, "fx2:released"), 0, "{what}");
        // Every new token is above every token in the file.
        let t = grant_kind(&mut c, "fx2:released", "n", 10_000, &[]);
        assert!(t > high_water, "{what}: {t} not above {high_water}");
        srv.assert_log_clean();
    }
}

#[test]
fn the_v1_fixtures_still_load_as_exclusive_locks() {
    let expected = [
        ("fx:held", b"worker-a".to_vec(), 1796112043312069i64),
        (
            "{fx}:tagged",
            b"owner with spaces".to_vec(),
            1796112043315934,
        ),
        ("fx:binary", b"bin\x00owner\xff".to_vec(), 1796112050324158),
        ("fx:renewed", b"worker-r".to_vec(), 1796112043324004),
    ];
    let high_water = 1796112050324158i64;
    for aof in [false, true] {
        let mut b = Server::builder()
            .module_args(&["max-ttl-ms", "315360000000"])
            .dir(fixture_dir(if aof { "v1-aof" } else { "v1-rdb" }));
        if aof {
            b = b.arg("appendonly", "yes").arg("appenddirname", "aof");
        } else {
            b = b.arg("dbfilename", "dump.rdb");
        }
        let srv = b.start();
        let mut c = srv.conn();
        let what = if aof { "v1 AOF" } else { "v1 RDB" };
        assert_eq!(dbsize(&mut c), 4, "{what}: four locks");
        assert_eq!(exists(&mut c, "fx:released"), 0, "{what}");
        for (key, owner, token) in &expected {
            let i = info(&mut c, key).unwrap_or_else(|| panic!("{what}: {key} missing"));
            assert_eq!(
                (i.owner.as_deref(), i.token),
                (Some(owner.as_slice()), *token),
                "{what}: {key}"
            );
            assert_eq!(
                shape(&mut c, key),
                sh("exclusive", 1, 0, 0, 0),
                "{what}: {key}"
            );
            let h = call(&mut c, &["FLOCK.HOLDERS", key]);
            let h = h.array().expect("HOLDERS array");
            assert_eq!(h.len(), 1, "{what}: {key}: one holder");
            assert!(check(&mut c, key, *token) > 0, "{what}: {key}: live");
        }
        // New grants of any kind are above the fixture's high-water mark.
        let t = grant_kind(&mut c, "fx:released", "n", 10_000, &["SHARED"]);
        assert!(t > high_water, "{what}: {t} not above {high_water}");
        let t2 = grant_kind(&mut c, "new", "n", 10_000, &["LIMIT", "2"]);
        assert!(t2 > t, "{what}");
        srv.assert_log_clean();
    }
}

#[test]
fn a_forged_aof_never_loads_a_state_that_breaks_the_kinds_rules() {
    // G1/G8 against files: FLOCK.APPLY STATE lines that no master writes (too many permits,
    // two exclusive grants, an owner twice, tokens out of order, bad limits, a last token
    // below a grant's) are appended to the AOF. The server must come up, and whatever it
    // loaded must obey the rules.
    let mut srv = Server::builder()
        .arg("appendonly", "yes")
        .arg("appendfsync", "always")
        .start();
    let mut c = srv.conn();
    grant_kind(&mut c, "good", "p1", 60_000, &["LIMIT", "2"]);
    let t0 = now_us();
    let dl = (now_ms() + 60_000).to_string();
    let t = |i: i64| (t0 + 1_000 + i).to_string();
    let g =
        |o: &'static str, i: i64| -> Vec<String> { vec![o.into(), t(i), dl.clone(), "0".into()] };
    let state = |key: &str,
                 mode: &str,
                 limit: &str,
                 last: String,
                 grants: Vec<Vec<String>>|
     -> Vec<String> {
        let mut v: Vec<String> = ["FLOCK.APPLY", key, "STATE", mode, limit]
            .iter()
            .map(|s| s.to_string())
            .collect();
        v.push(last);
        v.push(grants.len().to_string());
        v.extend(grants.into_iter().flatten());
        v.push("0".into());
        v
    };
    let forged = [
        state(
            "f:three-of-two",
            "permits",
            "2",
            t(3),
            vec![g("a", 1), g("b", 2), g("c", 3)],
        ),
        state(
            "f:two-exclusive",
            "exclusive",
            "0",
            t(5),
            vec![g("a", 4), g("b", 5)],
        ),
        state(
            "f:owner-twice",
            "shared",
            "0",
            t(7),
            vec![g("a", 6), g("a", 7)],
        ),
        state(
            "f:out-of-order",
            "shared",
            "0",
            t(9),
            vec![g("a", 9), g("b", 8)],
        ),
        state("f:limit-zero", "permits", "0", t(10), vec![g("a", 10)]),
        state(
            "f:shared-with-limit",
            "shared",
            "5",
            t(11),
            vec![g("a", 11)],
        ),
        state("f:bad-mode", "readers", "0", t(12), vec![g("a", 12)]),
        state("f:last-below", "permits", "3", t(0), vec![g("a", 13)]),
    ];
    srv.stop();
    let incr = srv
        .files()
        .into_iter()
        .find(|p| p.to_string_lossy().ends_with(".incr.aof"))
        .expect("an incremental AOF file");
    let mut bytes = std::fs::read(&incr).expect("read AOF");
    for f in &forged {
        encode_command(&mut bytes, f);
    }
    std::fs::write(&incr, bytes).expect("write AOF");
    srv.start_again();
    let mut c = srv.conn();
    srv.assert_log_clean();
    assert_eq!(owners(&mut c, "good"), ["p1"], "the genuine key loaded");
    let mut max = 0;
    for f in &forged {
        let key = f[1].as_str();
        let h = holder_tokens(&mut c, key);
        let Some(k) = parse_k(&call(&mut c, &["FLOCK.INFO", key]), key) else {
            continue; // refused: fine
        };
        eprintln!("forged {key} loaded as {k:?} {h:?}");
        let mut seen: Vec<&str> = h.iter().map(|(o, _)| o.as_str()).collect();
        seen.dedup();
        assert_eq!(seen.len(), h.len(), "{key}: an owner holds twice: {h:?}");
        assert!(
            h.windows(2).all(|w| w[0].1 < w[1].1),
            "{key}: HOLDERS not in token order: {h:?}"
        );
        match k.mode.as_str() {
            "exclusive" => assert_eq!(h.len(), 1, "{key}: G1: {h:?}"),
            "permits" => assert!(
                k.limit >= 1 && h.len() as i64 <= k.limit,
                "{key}: G1: {k:?} {h:?}"
            ),
            "shared" => assert_eq!(k.limit, 0, "{key}: {k:?}"),
            m => panic!("{key}: mode {m}"),
        }
        max = max.max(h.iter().map(|(_, t)| *t).max().unwrap_or(0));
    }
    let fresh = grant_kind(&mut c, "fresh", "n", 10_000, &["SHARED"]);
    assert!(
        fresh > max,
        "G3: a new token {fresh} not above a loaded one {max}"
    );
}
