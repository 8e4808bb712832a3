//! The leader election of docs/guide/coordination.md, replayed from the guide's own text: the
//! blocks marked `election terminal 1` and `election terminal 2` (tests/readme.rs skips them:
//! two terminals) are read from the file, and each terminal's commands are typed into a
//! `redis-cli` of its own, in the guide's order, against a real server. Where terminal 2's
//! block ends on a command without output (its FLOCK.WATCH waits), the leader dies: terminal
//! 1's `redis-cli` is killed (SIGKILL, as a crashed leader), and terminal 2's next block,
//! which repeats that command, shows what it was told; it must come at once (within a second
//! of the kill). Every reply is compared with the guide as tests/readme.rs does: the guide's
//! 16-digit tokens are bound to this run's (the same wherever the guide repeats one) and
//! redis-cli's `(1.23s)` timing lines are not compared. So the guide and this test cannot
//! drift apart: change the guide's commands and this test types the new ones.

use flock_testkit::*;
use std::collections::HashMap;
use std::io::{BufRead, BufReader, Write};
use std::path::Path;
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};
use std::time::{Duration, Instant};

const PROMPT: &str = "127.0.0.1:6379> ";

/// One block of the guide: which terminal, and its (command, expected output) steps.
#[derive(Debug)]
struct Block {
    terminal: u8,
    line: usize,
    steps: Vec<(String, Vec<String>)>,
}

/// The election blocks of the guide, in order.
fn election_blocks(text: &str) -> Vec<Block> {
    let lines: Vec<&str> = text.lines().collect();
    let mut out = Vec::new();
    let mut i = 0;
    while i < lines.len() {
        if !lines[i].trim_start().starts_with("```") {
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
        let marker = lines[..open]
            .iter()
            .rev()
            .find(|l| !l.trim().is_empty())
            .copied()
            .unwrap_or("");
        let terminal = if marker.contains("election terminal 1") {
            1
        } else if marker.contains("election terminal 2") {
            2
        } else {
            continue;
        };
        let mut steps: Vec<(String, Vec<String>)> = Vec::new();
        for l in body {
            match l.strip_prefix(PROMPT) {
                Some(cmd) => steps.push((cmd.to_string(), Vec::new())),
                None => steps
                    .last_mut()
                    .unwrap_or_else(|| panic!("output before a command at line {}", open + 1))
                    .1
                    .push(l.to_string()),
            }
        }
        out.push(Block {
            terminal,
            line: open + 1,
            steps,
        });
    }
    out
}

/// Runs of digits and of everything else.
fn pieces(s: &str) -> Vec<&str> {
    let b = s.as_bytes();
    let mut out = Vec::new();
    let mut start = 0;
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

fn is_timing(l: &str) -> bool {
    l.starts_with('(') && l.ends_with("s)") && l[1..l.len() - 2].parse::<f64>().is_ok()
}

/// The guide's tokens bound to this run's.
#[derive(Default)]
struct Tokens(HashMap<String, String>);

impl Tokens {
    fn substitute(&self, cmd: &str) -> String {
        pieces(cmd)
            .into_iter()
            .map(|p| self.0.get(p).map_or(p, String::as_str))
            .collect()
    }

    fn line_matches(&mut self, want: &str, got: &str) -> bool {
        let (w, g) = (pieces(want), pieces(got));
        if w.len() != g.len() {
            return false;
        }
        for (a, b) in w.iter().zip(&g) {
            if is_token(a) && is_token(b) {
                let bound = self.0.entry(a.to_string()).or_insert_with(|| b.to_string());
                if bound != b {
                    return false;
                }
            } else if a != b {
                return false;
            }
        }
        true
    }

    /// Whether `got` (timing lines left out) is what the guide shows.
    fn matches(&mut self, want: &[String], got: &[String]) -> bool {
        let want: Vec<&String> = want.iter().filter(|l| !is_timing(l)).collect();
        let got: Vec<&String> = got.iter().filter(|l| !is_timing(l)).collect();
        want.len() == got.len() && want.iter().zip(&got).all(|(w, g)| self.line_matches(w, g))
    }
}

/// A terminal: a `redis-cli` fed one line at a time. After each command a line with a lone
/// `"` makes redis-cli print `Invalid argument(s)` without sending anything, once the
/// command's reply is printed: that ends the command's output.
struct Terminal {
    child: Child,
    stdin: ChildStdin,
    out: BufReader<ChildStdout>,
}

impl Terminal {
    fn open(port: u16) -> Terminal {
        let mut child = Command::new(redis_cli())
            .args(["--no-raw", "-p", &port.to_string()])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("run redis-cli");
        let stdin = child.stdin.take().expect("stdin");
        let out = BufReader::new(child.stdout.take().expect("stdout"));
        Terminal { child, stdin, out }
    }

    fn send(&mut self, cmd: &str) {
        writeln!(self.stdin, "{cmd}\n\"").expect("write to redis-cli");
        self.stdin.flush().expect("flush");
    }

    fn read(&mut self) -> Vec<String> {
        let mut got = Vec::new();
        loop {
            let mut l = String::new();
            if self.out.read_line(&mut l).expect("read redis-cli") == 0 {
                panic!("redis-cli ended; it printed {got:?}");
            }
            let l = l.trim_end_matches('\n').to_string();
            if l == "Invalid argument(s)" {
                return got;
            }
            got.push(l);
        }
    }
}

#[test]
fn the_guides_election_replays_in_two_terminals() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let text = std::fs::read_to_string(root.join("docs/guide/coordination.md")).expect("guide");
    let blocks = election_blocks(&text);
    assert!(
        blocks.len() >= 3 && blocks.iter().any(|b| b.terminal == 1),
        "docs/guide/coordination.md lost its election blocks: {blocks:?}"
    );
    let srv = Server::start();
    let mut probe = RawConn::connect(srv.port()).expect("connect");
    let mut terms = [Terminal::open(srv.port()), Terminal::open(srv.port())];
    let mut tokens = Tokens::default();
    // Terminal 2's command that waits, sent and not yet answered.
    let mut waiting: Option<String> = None;
    let mut told_after = None;
    for b in &blocks {
        let t = (b.terminal - 1) as usize;
        for (i, (cmd, want)) in b.steps.iter().enumerate() {
            let got = if waiting.as_deref() == Some(cmd.as_str()) && i == 0 && b.terminal == 2 {
                // The waiting WATCH: the leader dies now, and its follower is told.
                waiting = None;
                assert!(
                    poll_until(Duration::from_secs(10), || {
                        info_i64(&mut probe, "flock", "flock_watchers") == 1
                    }),
                    "terminal 2's FLOCK.WATCH never waited"
                );
                let leader = &mut terms[0];
                let killed = Instant::now();
                leader.child.kill().expect("kill terminal 1's redis-cli");
                let _ = leader.child.wait();
                let got = terms[1].read();
                told_after = Some(killed.elapsed());
                got
            } else if want.is_empty() && i + 1 == b.steps.len() && b.terminal == 2 {
                // A command the guide shows waiting: its answer comes in a later block.
                terms[t].send(&tokens.substitute(cmd));
                waiting = Some(cmd.clone());
                continue;
            } else {
                terms[t].send(&tokens.substitute(cmd));
                terms[t].read()
            };
            assert!(
                tokens.matches(want, &got),
                "docs/guide/coordination.md line {}, terminal {}, `{cmd}`:\n  the guide shows: \
                 {want:?}\n  redis-cli printed: {got:?}",
                b.line,
                b.terminal
            );
        }
    }
    assert!(
        waiting.is_none(),
        "the guide never shows what {waiting:?} was told"
    );
    let took = told_after.expect("the guide's follower never waited for the leader");
    assert!(
        took < Duration::from_secs(1),
        "the follower was told {took:?} after the leader's redis-cli was killed"
    );
    eprintln!(
        "election: {} blocks replayed, {} tokens bound, the follower told {took:?} after the kill",
        blocks.len(),
        tokens.0.len()
    );
    // Nothing left: the guide's new leader stepped down, nobody watches.
    for t in terms.iter_mut().skip(1) {
        drop(t.stdin.write_all(b"QUIT\n"));
        let _ = t.child.wait();
    }
    assert_eq!(
        probe.call(&["EXISTS", "service:leader"]).expect("EXISTS"),
        Reply::Int(0)
    );
    assert_eq!(info_i64(&mut probe, "flock", "flock_watchers"), 0);
}
