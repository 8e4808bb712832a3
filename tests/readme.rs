//! The sessions of README.md and of every guide in docs/guide/ (README.md first, then the
//! guides by file name), replayed as a new user would type them: in order, on one server
//! started like `make run` does (redis.conf.example with the module path filled in), each
//! `127.0.0.1:6379>` block in a fresh `redis-cli`, each `$` block in a fresh shell.
//!
//! What the docs show must be what redis-cli prints, with three allowances: tokens (the
//! 16-digit numbers) differ from run to run, so each one the docs show is bound to the one
//! this run printed at the same place, and must be the same wherever the docs repeat it (a
//! token the docs type into a later command is replaced by its bound value); remaining
//! times (other integers of 1000 or more) may differ by a fifth; redis-cli's `(1.00s)`
//! timing lines (how long a command took) are not compared; and an ACL refusal matches any
//! ACL refusal (`(error) NOPERM ...`), whose wording is the server's own (the docs show
//! Redis 7.0's; Valkey words them differently). A block marked `<!-- not replayed: why -->` on the line
//! before it (two terminals, a cluster) is skipped and must say why.
use flock_testkit::*;
use std::collections::HashMap;
use std::io::{BufRead, BufReader, Write};
use std::path::Path;
use std::process::{Command, Stdio};

/// One session from the README or a guide.
#[derive(Debug)]
struct Session {
    /// Where it is: the file and the line number of its opening fence, for messages.
    at: String,
    shell: bool,
    /// (command, expected output lines)
    steps: Vec<(String, Vec<String>)>,
}

const PROMPT: &str = "127.0.0.1:6379> ";

/// The sessions of one Markdown file (`name` for messages), and how many were marked as not
/// replayed.
fn parse_readme(name: &str, text: &str) -> (Vec<Session>, usize) {
    let lines: Vec<&str> = text.lines().collect();
    let mut sessions = Vec::new();
    let mut skipped = 0;
    let mut i = 0;
    while i < lines.len() {
        let fence = lines[i].trim_start();
        if !fence.starts_with("```") {
            i += 1;
            continue;
        }
        let open = i;
        let mut body = Vec::new();
        i += 1;
        while i < lines.len() && !lines[i].trim_start().starts_with("```") {
            body.push(lines[i]);
            i += 1;
        }
        i += 1;
        let prev = lines[..open].iter().rev().find(|l| !l.trim().is_empty());
        let marked = prev.is_some_and(|l| l.trim_start().starts_with("<!-- not replayed"));
        let shell = body.first().is_some_and(|l| l.starts_with("$ "));
        let cli = body.first().is_some_and(|l| l.starts_with(PROMPT));
        if !(shell || cli) {
            continue;
        }
        if marked {
            let why = prev.map(|l| l.trim()).unwrap_or("");
            assert!(
                why.len() > "<!-- not replayed: -->".len(),
                "{name} line {}: a skipped session must say why: {why}",
                open + 1
            );
            skipped += 1;
            continue;
        }
        let marker = if shell { "$ " } else { PROMPT };
        let mut steps: Vec<(String, Vec<String>)> = Vec::new();
        for l in body {
            if let Some(cmd) = l.strip_prefix(marker) {
                steps.push((cmd.to_string(), Vec::new()));
            } else if let Some(last) = steps.last_mut() {
                last.1.push(l.to_string());
            } else {
                panic!("{name} line {}: output before the first command", open + 1);
            }
        }
        sessions.push(Session {
            at: format!("{name} line {}", open + 1),
            shell,
            steps,
        });
    }
    (sessions, skipped)
}

/// Runs of digits and of everything else.
fn pieces(s: &str) -> Vec<&str> {
    let mut out = Vec::new();
    let mut start = 0;
    let b = s.as_bytes();
    for i in 1..=b.len() {
        if i == b.len() || b[i].is_ascii_digit() != b[i - 1].is_ascii_digit() {
            out.push(&s[start..i]);
            start = i;
        }
    }
    out
}

fn is_token(p: &str) -> bool {
    p.len() >= 16 && p.bytes().all(|c| c.is_ascii_digit())
}

/// README tokens and the tokens this run printed in their place.
#[derive(Default)]
struct Tokens {
    readme_to_real: HashMap<String, String>,
    real_to_readme: HashMap<String, String>,
}

impl Tokens {
    /// A command with the README's tokens replaced by this run's.
    fn substitute(&self, cmd: &str) -> String {
        pieces(cmd)
            .into_iter()
            .map(|p| self.readme_to_real.get(p).map_or(p, |s| s.as_str()))
            .collect()
    }

    /// Whether `real` is what `readme` shows, binding new tokens.
    fn line_matches(&mut self, readme: &str, real: &str) -> bool {
        const NOPERM: &str = "(error) NOPERM ";
        if readme.starts_with(NOPERM) && real.starts_with(NOPERM) {
            return true;
        }
        let (a, b) = (pieces(readme), pieces(real));
        if a.len() != b.len() {
            return false;
        }
        for (e, r) in a.iter().zip(b.iter()) {
            let digits =
                e.bytes().all(|c| c.is_ascii_digit()) && r.bytes().all(|c| c.is_ascii_digit());
            if is_token(e) {
                if !is_token(r) {
                    return false;
                }
                match (self.readme_to_real.get(*e), self.real_to_readme.get(*r)) {
                    (Some(x), _) if x != r => return false,
                    (_, Some(y)) if y != e => return false,
                    _ => {
                        self.readme_to_real.insert(e.to_string(), r.to_string());
                        self.real_to_readme.insert(r.to_string(), e.to_string());
                    }
                }
            } else if digits && e.len() >= 4 {
                let (x, y): (f64, f64) = match (e.parse(), r.parse()) {
                    (Ok(x), Ok(y)) => (x, y),
                    _ => return false,
                };
                if (x - y).abs() > x / 5.0 {
                    return false;
                }
            } else if e != r {
                return false;
            }
        }
        true
    }
}

fn is_timing(l: &str) -> bool {
    l.starts_with('(') && l.ends_with("s)") && l[1..l.len() - 2].parse::<f64>().is_ok()
}

/// One redis-cli session: a fresh redis-cli fed one line at a time. After each command a
/// line with a lone `"` makes redis-cli print `Invalid argument(s)` without sending anything:
/// that marks the end of the command's output.
fn run_cli(port: u16, s: &Session, tokens: &mut Tokens) -> Vec<String> {
    let mut child = Command::new(redis_cli())
        .args(["--no-raw", "-p", &port.to_string()])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run redis-cli (make test installs redis-tools)");
    let mut stdin = child.stdin.take().expect("stdin");
    let mut out = BufReader::new(child.stdout.take().expect("stdout"));
    let mut failures = Vec::new();
    for (cmd, want) in &s.steps {
        let sent = tokens.substitute(cmd);
        writeln!(stdin, "{sent}\n\"").expect("write to redis-cli");
        stdin.flush().expect("flush");
        let mut got = Vec::new();
        loop {
            let mut l = String::new();
            if out.read_line(&mut l).expect("read redis-cli") == 0 {
                failures.push(format!("redis-cli ended during `{sent}`"));
                break;
            }
            let l = l.trim_end_matches('\n').to_string();
            if l == "Invalid argument(s)" {
                break;
            }
            got.push(l);
        }
        compare(&s.at, cmd, want, &got, tokens, &mut failures);
    }
    drop(stdin);
    let _ = child.wait();
    failures
}

/// One shell session: the commands in one bash, redis-cli pointed at the test server (and
/// formatted as on a terminal, except inside `$(...)`, where a terminal's redis-cli prints raw).
fn run_shell(port: u16, s: &Session, tokens: &mut Tokens) -> Vec<String> {
    let mut script = format!(
        "redis-cli() {{ if [ \"$BASH_SUBSHELL\" -gt 0 ]; then command {cli} -p {port} \"$@\"; \
         else command {cli} --no-raw -p {port} \"$@\"; fi; }}\n",
        cli = redis_cli()
    );
    for (i, (cmd, _)) in s.steps.iter().enumerate() {
        script.push_str(&format!("echo '@@step {i}'\n{}\n", tokens.substitute(cmd)));
    }
    script.push_str(&format!("echo '@@step {}'\n", s.steps.len()));
    let out = Command::new("bash")
        .args(["-c", &script])
        .stderr(Stdio::inherit())
        .output()
        .expect("run bash");
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let mut outputs: Vec<Vec<String>> = vec![Vec::new(); s.steps.len() + 1];
    let mut at: Option<usize> = None;
    for l in text.lines() {
        if let Some(n) = l
            .strip_prefix("@@step ")
            .and_then(|n| n.parse::<usize>().ok())
        {
            at = Some(n);
        } else if let Some(v) = at.and_then(|n| outputs.get_mut(n)) {
            v.push(l.to_string());
        }
    }
    let mut failures = Vec::new();
    for (i, (cmd, want)) in s.steps.iter().enumerate() {
        compare(&s.at, cmd, want, &outputs[i], tokens, &mut failures);
    }
    failures
}

fn compare(
    at: &str,
    cmd: &str,
    want: &[String],
    got: &[String],
    tokens: &mut Tokens,
    failures: &mut Vec<String>,
) {
    let want: Vec<&String> = want.iter().filter(|l| !is_timing(l)).collect();
    let got: Vec<&String> = got.iter().filter(|l| !is_timing(l)).collect();
    let same = want.len() == got.len()
        && want
            .iter()
            .zip(got.iter())
            .all(|(w, g)| tokens.line_matches(w, g));
    if !same {
        failures.push(format!(
            "block at {at}, `{cmd}`:\n  the docs show: {want:?}\n  redis-cli printed: {got:?}"
        ));
    }
}

#[test]
fn every_readme_session_replays_verbatim() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut files = vec!["README.md".to_string()];
    let mut guides: Vec<String> = std::fs::read_dir(root.join("docs/guide"))
        .expect("docs/guide")
        .map(|e| {
            e.expect("docs/guide entry")
                .file_name()
                .to_string_lossy()
                .into_owned()
        })
        .filter(|n| n.ends_with(".md"))
        .map(|n| format!("docs/guide/{n}"))
        .collect();
    guides.sort();
    files.extend(guides);
    let mut sessions = Vec::new();
    let mut skipped = 0;
    let mut per_file = Vec::new();
    for f in &files {
        let text = std::fs::read_to_string(root.join(f)).expect("a Markdown file");
        let (s, k) = parse_readme(f, &text);
        per_file.push(format!("{f}: {}", s.len()));
        sessions.extend(s);
        skipped += k;
    }
    let commands: usize = sessions.iter().map(|s| s.steps.len()).sum();
    // The README keeps a first session, and the guides hold the rest (24 in all today).
    assert!(
        sessions
            .iter()
            .filter(|s| s.at.starts_with("README.md "))
            .count()
            >= 2,
        "the README lost its first session"
    );
    assert!(
        sessions.len() >= 20,
        "only {} sessions found ({})",
        sessions.len(),
        per_file.join(", ")
    );
    // The server as `make run` starts it.
    let example = std::fs::read_to_string(root.join("redis.conf.example")).expect("conf");
    // Its loadmodule line with our module: the harness writes that line, with the example's
    // arguments, and the rest of the file as it is.
    let mut module_args: Vec<&str> = Vec::new();
    let mut lines: Vec<&str> = Vec::new();
    for l in example.lines() {
        match l.strip_prefix("loadmodule ") {
            Some(rest) => module_args = rest.split_whitespace().skip(1).collect(),
            None => lines.push(l),
        }
    }
    let srv = Server::builder()
        .module_args(&module_args)
        .config_file(&lines)
        .try_start()
        .unwrap_or_else(|log| panic!("redis.conf.example did not start:\n{log}"));
    let mut tokens = Tokens::default();
    let mut failures = Vec::new();
    for s in &sessions {
        let f = if s.shell {
            run_shell(srv.port(), s, &mut tokens)
        } else {
            run_cli(srv.port(), s, &mut tokens)
        };
        failures.extend(f);
    }
    eprintln!(
        "replayed {} sessions ({commands} commands) of {} files ({}), {skipped} marked as not \
         replayed, {} tokens bound",
        sessions.len(),
        files.len(),
        per_file.join(", "),
        tokens.readme_to_real.len()
    );
    assert!(failures.is_empty(), "{}", failures.join("\n"));
    // Every session cleaned up after itself: nothing held, the settings as they started.
    // A session may leave background redis-cli processes that were granted a BOUND lock and
    // exit on their own (docs/guide/waiting.md's WAITERS session): their locks end when their
    // connections close, so give them a moment.
    let mut c = RawConn::connect(srv.port()).expect("connect");
    let t0 = std::time::Instant::now();
    let mut keys = c.call(&["KEYS", "*lock*"]).expect("KEYS");
    while keys != Reply::Array(vec![]) && t0.elapsed() < std::time::Duration::from_secs(5) {
        std::thread::sleep(std::time::Duration::from_millis(20));
        keys = c.call(&["KEYS", "*lock*"]).expect("KEYS");
    }
    assert_eq!(keys, Reply::Array(vec![]), "locks left after the sessions");
    let delay = c
        .call(&["CONFIG", "GET", "flock.lock-delay-ms"])
        .expect("CONFIG GET");
    assert_eq!(
        delay,
        Reply::Array(vec![
            Reply::Bulk(b"flock.lock-delay-ms".to_vec()),
            Reply::Bulk(b"0".to_vec())
        ])
    );
}

#[test]
fn the_matcher_binds_tokens_and_refuses_what_differs() {
    let mut t = Tokens::default();
    assert!(t.line_matches("(integer) 1796023207562139", "(integer) 1796115000000001"));
    assert!(t.line_matches(
        "4) (integer) 1796023207562139",
        "4) (integer) 1796115000000001"
    ));
    assert!(!t.line_matches("(integer) 1796023207562139", "(integer) 1796115000000002"));
    assert!(!t.line_matches("(integer) 1796000000000000", "(integer) 1796115000000001"));
    assert!(t.line_matches("(integer) 29599", "(integer) 29990"));
    assert!(!t.line_matches("(integer) 29599", "(integer) 100"));
    assert!(!t.line_matches("(integer) 1", "(integer) 0"));
    assert!(!t.line_matches("OK", "(nil)"));
    assert_eq!(
        t.substitute("FLOCK.CHECK lk 1796023207562139"),
        "FLOCK.CHECK lk 1796115000000001"
    );
    assert!(is_timing("(1.00s)") && !is_timing("(nil)"));
    assert!(t.line_matches(
        "(error) NOPERM this user has no permissions to run the 'flock.acquire' command",
        "(error) NOPERM User reader has no permissions to run the 'flock.acquire' command"
    ));
    assert!(!t.line_matches("(error) NOPERM this user has no permissions", "(integer) 1"));
}
