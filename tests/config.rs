//! Configuration, every way it arrives: `loadmodule` arguments, redis.conf `flock.*` lines,
//! `--flock.*` on the command line, CONFIG SET, and CONFIG REWRITE followed by a restart. Each
//! bad form refuses to load (or is refused) with a message that names the argument and the
//! range; each good form is in effect, and CONFIG GET shows what the module applies.
use flock_testkit::*;
use std::fs;

/// Start a server whose redis.conf loads the module with `module_args` and holds `conf_lines`
/// (`ServerBuilder::config_file`); `cli` are extra command-line options
/// (`--flock.max-ttl-ms 8000`). Its whole log when it exits at start.
fn start(module_args: &[&str], conf_lines: &[&str], cli: &[&str]) -> Result<Server, String> {
    let mut b = Server::builder()
        .module_args(module_args)
        .config_file(conf_lines);
    for pair in cli.chunks(2) {
        b = b.args(pair[0], &pair[1..]);
    }
    b.try_start()
}

fn up(module_args: &[&str], conf_lines: &[&str], cli: &[&str]) -> Server {
    match start(module_args, conf_lines, cli) {
        Ok(s) => s,
        Err(log) => panic!(
            "server with module args {module_args:?}, conf {conf_lines:?}, cli {cli:?} did not \
             start:\n{log}"
        ),
    }
}

fn config_get(c: &mut redis::Connection, name: &str) -> i64 {
    let r = call(c, &["CONFIG", "GET", name]);
    r.pairs()
        .and_then(|p| p.first().and_then(|(_, v)| v.string()))
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("CONFIG GET {name}: {r:?}"))
}

/// What the module applies as flock.max-ttl-ms: ACQUIRE accepts `max` and refuses `max + 1`,
/// naming `max` in the error.
fn assert_max_ttl_applied(c: &mut redis::Connection, max: i64) {
    let ok = call(c, &["FLOCK.ACQUIRE", "cfg:probe", "o", &max.to_string()]);
    assert!(ok.int().is_some(), "ttl {max} must be accepted: {ok:?}");
    assert_eq!(call(c, &["FLOCK.RELEASE", "cfg:probe", "o"]), Reply::Int(1));
    let r = call(
        c,
        &["FLOCK.ACQUIRE", "cfg:probe", "o", &(max + 1).to_string()],
    );
    assert_err_contains(
        &r,
        &format!("from 1 to {max} (flock.max-ttl-ms)"),
        "ttl max+1",
    );
}

#[test]
fn bad_load_arguments_refuse_to_load_and_say_why() {
    let range = "must be an integer from 1 to 315360000000";
    let table: &[(&[&str], &str)] = &[
        (&["bogus", "1"], "unknown argument 'bogus'"),
        (&["max-ttl-ms"], "argument 'max-ttl-ms' has no value"),
        (
            &["max-ttl-ms", "0"],
            "flock.max-ttl-ms must be an integer from 1 to 315360000000, not 0",
        ),
        (&["max-ttl-ms", "99999999999999"], "not 99999999999999"),
        (&["max-ttl-ms", "abc"], "not 'abc'"),
        (&["max-ttl-ms", "+5000"], range),
        (&["max-ttl-ms", "05000"], range),
        (
            &["lock-delay-ms", "-1"],
            "flock.lock-delay-ms must be an integer from 0 to 86400000, not -1",
        ),
        (
            &["max-waiters", "-1"],
            "flock.max-waiters must be an integer from 0 to 1000000000, not -1",
        ),
        (
            &["max-ttl-ms", "5000", "max-ttl-ms", "6000"],
            "argument 'max-ttl-ms' is given twice",
        ),
        (
            &["max-ttl-ms", "5000", "flock.MAX-TTL-MS", "6000"],
            "is given twice",
        ),
    ];
    let mut bad = Vec::new();
    for (args, want) in table {
        match start(args, &[], &[]) {
            Ok(_) => bad.push(format!("{args:?} loaded")),
            Err(log) => {
                let line = log
                    .lines()
                    .find(|l| l.contains("refusing to load"))
                    .unwrap_or("")
                    .to_string();
                eprintln!("{args:?}: {line}");
                if !line.contains(want) {
                    bad.push(format!("{args:?}: log line {line:?} lacks {want:?}"));
                }
            }
        }
    }
    assert!(bad.is_empty(), "{}", bad.join("\n"));
}

/// One accepted form of flock.max-ttl-ms: (`loadmodule` arguments, redis.conf lines, server
/// command-line arguments, the value it must take).
type Form<'a> = (&'a [&'a str], &'a [&'a str], &'a [&'a str], i64);

#[test]
fn every_accepted_form_is_in_effect_and_shown_by_config_get() {
    let forms: &[Form] = &[
        (&["max-ttl-ms", "60000"], &[], &[], 60_000),
        (&["flock.max-ttl-ms", "61000"], &[], &[], 61_000),
        (&["MAX-TTL-MS", "5000"], &[], &[], 5_000),
        (&[], &["flock.max-ttl-ms 7000"], &[], 7_000),
        (&[], &[], &["--flock.max-ttl-ms", "8000"], 8_000),
        (&[], &[], &[], 86_400_000),
    ];
    for (args, lines, cli, want) in forms {
        let srv = up(args, lines, cli);
        let mut c = srv.conn();
        assert_eq!(
            config_get(&mut c, "flock.max-ttl-ms"),
            *want,
            "{args:?} {lines:?} {cli:?}"
        );
        assert_max_ttl_applied(&mut c, *want);
    }
    // The other two settings as load arguments.
    let srv = up(&["max-waiters", "0", "lock-delay-ms", "250"], &[], &[]);
    let mut c = srv.conn();
    assert_eq!(config_get(&mut c, "flock.max-waiters"), 0);
    assert_eq!(config_get(&mut c, "flock.lock-delay-ms"), 250);
    grant(&mut c, "busy", "a", 60_000);
    let r = call(
        &mut c,
        &["FLOCK.ACQUIRE", "busy", "b", "1000", "BLOCK", "100"],
    );
    assert!(r.is_err(), "max-waiters 0 must refuse every waiter: {r:?}");
}

#[test]
fn config_file_lines_take_precedence_over_load_arguments_and_say_so() {
    let srv = up(&["max-ttl-ms", "60000"], &["flock.max-ttl-ms 7000"], &[]);
    let mut c = srv.conn();
    assert_eq!(config_get(&mut c, "flock.max-ttl-ms"), 7_000);
    assert_max_ttl_applied(&mut c, 7_000);
    let log = srv.log();
    assert!(
        log.contains(
            "the configuration file sets flock.max-ttl-ms 7000, which takes precedence over \
             the loadmodule argument max-ttl-ms 60000"
        ),
        "no warning in the log:\n{log}"
    );
    // A command-line option is a config-file line too.
    let srv = up(
        &["max-ttl-ms", "60000"],
        &[],
        &["--flock.max-ttl-ms", "8000"],
    );
    let mut c = srv.conn();
    assert_eq!(config_get(&mut c, "flock.max-ttl-ms"), 8_000);
    assert!(srv
        .log()
        .contains("sets flock.max-ttl-ms 8000, which takes precedence"));
    // A bad config-file line refuses to start, naming the setting.
    match start(&[], &["flock.max-ttl-ms 0"], &[]) {
        Ok(_) => panic!("flock.max-ttl-ms 0 in redis.conf loaded"),
        Err(log) => assert!(
            log.contains("flock.max-ttl-ms") && log.contains("between 1 and 315360000000"),
            "{log}"
        ),
    }
    // An unknown flock.* line too: the server refuses module configs nobody registered
    // ("Module Configuration detected without loadmodule directive or no ApplyConfig call").
    match start(&[], &["flock.bogus 1"], &[]) {
        Ok(_) => panic!("flock.bogus in redis.conf loaded"),
        Err(log) => assert!(log.contains("Module Configuration detected"), "{log}"),
    }
}

#[test]
fn config_set_checks_the_same_ranges_and_config_get_shows_the_value_in_effect() {
    let srv = up(&[], &[], &[]);
    let mut c = srv.conn();
    let table: &[(&str, &str, bool)] = &[
        ("flock.max-ttl-ms", "0", false),
        ("flock.max-ttl-ms", "315360000001", false),
        ("flock.max-ttl-ms", "abc", false),
        ("flock.max-ttl-ms", "4000", true),
        ("flock.lock-delay-ms", "-1", false),
        ("flock.lock-delay-ms", "86400001", false),
        ("flock.lock-delay-ms", "100", true),
        ("flock.max-waiters", "-1", false),
        ("flock.max-waiters", "1000000001", false),
        ("flock.max-waiters", "5", true),
    ];
    for (name, value, accepted) in table {
        let before = config_get(&mut c, name);
        let r = call(&mut c, &["CONFIG", "SET", name, value]);
        assert_eq!(!r.is_err(), *accepted, "CONFIG SET {name} {value}: {r:?}");
        let after = config_get(&mut c, name);
        if *accepted {
            assert_eq!(after.to_string(), *value, "{name}");
        } else {
            assert_eq!(
                after, before,
                "a refused CONFIG SET {name} {value} changed it"
            );
        }
    }
    assert_max_ttl_applied(&mut c, 4_000);
}

#[test]
fn config_rewrite_survives_a_restart_and_overrides_the_load_argument() {
    let mut srv = up(&["max-ttl-ms", "60000"], &[], &[]);
    let mut c = srv.conn();
    assert_eq!(config_get(&mut c, "flock.max-ttl-ms"), 60_000);
    assert!(!call(&mut c, &["CONFIG", "SET", "flock.max-ttl-ms", "9000"]).is_err());
    assert!(!call(&mut c, &["CONFIG", "REWRITE"]).is_err());
    let conf = fs::read_to_string(srv.dir().join("redis.conf")).expect("redis.conf");
    assert!(
        conf.contains("flock.max-ttl-ms 9000"),
        "CONFIG REWRITE wrote:\n{conf}"
    );
    // Restart from the rewritten file: the rewritten line wins over the loadmodule argument.
    srv.restart();
    let mut c = srv.conn();
    assert_eq!(config_get(&mut c, "flock.max-ttl-ms"), 9_000);
    assert_max_ttl_applied(&mut c, 9_000);
    assert!(srv
        .log()
        .contains("sets flock.max-ttl-ms 9000, which takes precedence"));
}
