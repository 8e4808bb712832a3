//! The report: checks against the targets, sections, facts, and the notes on where
//! the time goes for each missed target.

use crate::config::*;
use crate::format::*;
use std::collections::BTreeMap;
use std::fmt::Write as _;

#[derive(Clone, Copy)]
pub(crate) enum Goal {
    AtMost(f64),
    AtLeast(f64),
    Below(f64),
}

impl Goal {
    pub(crate) fn holds(&self, v: f64) -> bool {
        match *self {
            Goal::AtMost(t) => v <= t,
            Goal::AtLeast(t) => v >= t,
            Goal::Below(t) => v < t,
        }
    }
    pub(crate) fn show(&self) -> String {
        match *self {
            Goal::AtMost(t) => format!("≤ {t:.2}x"),
            Goal::AtLeast(t) => format!("≥ {t:.2}x"),
            Goal::Below(t) => format!("< {t:.2}x"),
        }
    }
    pub(crate) fn value(&self) -> f64 {
        match *self {
            Goal::AtMost(t) | Goal::AtLeast(t) | Goal::Below(t) => t,
        }
    }
}

/// One ratio, with its target when the issue sets one.
pub(crate) struct Check {
    pub(crate) section: &'static str,
    pub(crate) what: String,
    pub(crate) value: f64,
    pub(crate) goal: Option<Goal>,
    /// false for an absolute number (not charted)
    pub(crate) ratio: bool,
    /// a bigger ratio is better (throughput); else smaller is better (cost, memory, waits)
    pub(crate) higher: bool,
    pub(crate) shown: String,
    pub(crate) target_text: String,
}

impl Check {
    pub(crate) fn pass(&self) -> Option<bool> {
        self.goal
            .map(|g| self.value.is_finite() && g.holds(self.value))
    }
    pub(crate) fn mark(&self) -> &'static str {
        match self.pass() {
            Some(true) => "**met**",
            Some(false) => "**missed**",
            None => "",
        }
    }
}

#[derive(Default)]
pub(crate) struct Report {
    pub(crate) sections: Vec<(String, String)>,
    pub(crate) checks: Vec<Check>,
    pub(crate) notes: Vec<String>,
    pub(crate) profile: Option<String>,
    /// measured numbers that the "where the time goes" notes quote
    pub(crate) facts: BTreeMap<String, f64>,
}

impl Report {
    pub(crate) fn check(
        &mut self,
        section: &'static str,
        what: &str,
        value: f64,
        goal: Option<Goal>,
    ) {
        self.checks.push(Check {
            section,
            what: what.to_string(),
            value,
            goal,
            ratio: true,
            higher: matches!(goal, Some(Goal::AtLeast(_)))
                || what.starts_with("cycles/s")
                || what.starts_with("grants/s"),
            shown: x(value),
            target_text: goal.map_or("—".into(), |g| g.show()),
        });
    }
    pub(crate) fn fact(&mut self, k: &str, v: f64) {
        self.facts.insert(k.to_string(), v);
    }
    pub(crate) fn get(&self, k: &str) -> f64 {
        self.facts.get(k).copied().unwrap_or(f64::NAN)
    }
    pub(crate) fn missed(&self, what_prefix: &str) -> bool {
        self.checks
            .iter()
            .any(|c| c.what.starts_with(what_prefix) && c.pass() == Some(false))
    }
    pub(crate) fn value_of(&self, what: &str) -> f64 {
        self.checks
            .iter()
            .rev()
            .find(|c| c.what == what)
            .map_or(f64::NAN, |c| c.value)
    }
    pub(crate) fn mark_of(&self, what: &str) -> String {
        self.checks
            .iter()
            .rev()
            .find(|c| c.what == what)
            .map_or(String::new(), |c| c.mark().to_string())
    }
    pub(crate) fn section(&mut self, title: &str, body: String) {
        println!("\n## {title}\n\n{body}");
        self.sections.push((title.to_string(), body));
    }
}

/// Notes, from this run's numbers, on each missed target.
pub(crate) fn where_time_goes(rep: &Report, cfg: &Cfg) -> String {
    let mut out = String::new();
    let f = |k: &str| rep.get(k);
    if rep.missed("FLOCK.ACQUIRE / SET NX PX") {
        let _ = write!(
            out,
            "- **FLOCK.ACQUIRE vs SET NX PX** ({}): {:.2} against {:.2} usec per call (medians; \
             per-round ratios from {:.2} to {:.2}).",
            x(rep.value_of("FLOCK.ACQUIRE / SET NX PX")),
            f("s1.acq.flock"),
            f("s1.acq.set"),
            f("s1.acq_set.lo"),
            f("s1.acq_set.hi"),
        );
        if f("cg.ir.acq").is_finite() {
            let _ = write!(
                out,
                " By instructions flock is cheaper ({:.0} against {:.0}, {}), so the time goes \
                 elsewhere: per call it has {:.0} against {:.0} instruction-cache misses and \
                 {:.1} against {:.1} last-level data misses (callgrind's simulation, below).",
                f("cg.ir.acq"),
                f("cg.ir.set"),
                x(f("cg.ir.acq") / f("cg.ir.set")),
                f("cg.i1.acq"),
                f("cg.i1.set"),
                f("cg.ll.acq"),
                f("cg.ll.set"),
            );
        }
        if f("s3.flock").is_finite() {
            let _ = write!(
                out,
                " Each lock also takes {:.0} bytes against {:.0} (scenario 3): more memory to \
                 allocate and write per grant.",
                f("s3.flock"),
                f("s3.set")
            );
        }
        out += "\n";
    }
    if rep.missed("bytes per held lock, flock / SET NX PX") {
        let _ = writeln!(
            out,
            "- **Memory per held lock** ({}): {:.0} bytes of `used_memory` per lock against \
             {:.0} for `SET NX PX`. `MEMORY USAGE` reports {:.0} against {:.0} for one key, so \
             about {:.0} bytes per lock (against {:.0}) sit outside what the key's value reports: \
             the keyspace's own entry and table slots, and whatever the module keeps beside the \
             value, with allocator rounding.",
            x(rep.value_of("bytes per held lock, flock / SET NX PX")),
            f("s3.flock"),
            f("s3.set"),
            f("s3.mu.flock"),
            f("s3.mu.set"),
            f("s3.flock") - f("s3.mu.flock"),
            f("s3.set") - f("s3.mu.set"),
        );
    }
    if rep.missed("grants/s with 32 clients") {
        let _ = writeln!(
            out,
            "- **Grants per second with 32 clients** ({}): every method grants about as fast \
             as the 1 ms critical section allows ({:.0} flock, {:.0} 10 ms polling, {:.0} \
             back-off grants/s, one grant every {:.2} ms: the critical section, `sleep`'s \
             overshoot and the release). In a tight loop the polling client that releases takes the lock \
             straight back, so the lock never sits idle and no waiting strategy can be 5x \
             faster. What flock changes is who waits and for how long: p99 wait {:.1} ms \
             against {:.0} ms and {:.0} ms, Jain's fairness {:.3} against {:.3} and {:.3}; and \
             when clients work between critical sections, the polled lock does sit idle (the \
             \"32 + 10 ms work\" rows: {}).",
            x(rep.value_of("grants/s with 32 clients, flock / best polling")),
            f("s4.gps.flock"),
            f("s4.gps.poll"),
            f("s4.gps.redlock"),
            1000.0 / f("s4.gps.flock"),
            f("s4.p99.flock"),
            f("s4.p99.poll"),
            f("s4.p99.redlock"),
            f("s4.jain.flock"),
            f("s4.jain.poll"),
            f("s4.jain.redlock"),
            x(rep.value_of("grants/s with 32 + 10 ms work clients, flock / best polling")),
        );
    }
    let wmax = cfg.s5_waiters.iter().copied().max().unwrap_or(0);
    let waiter_misses: Vec<&Check> = rep
        .checks
        .iter()
        .filter(|c| c.what.contains("waiters / with") && c.pass() == Some(false))
        .collect();
    if !waiter_misses.is_empty() {
        let list: Vec<String> = waiter_misses
            .iter()
            .map(|c| format!("{} {}", c.what, x(c.value)))
            .collect();
        // does it grow with the count, or switch on with the first waiter?
        let w1 = cfg.s5_waiters.iter().copied().find(|&v| v > 0).unwrap_or(0);
        let pairs: Vec<(f64, f64)> = [
            "ACQUIRE of a free key",
            "RELEASE of a free key",
            "ACQUIRE of the waited key (nil)",
        ]
        .iter()
        .map(|l| {
            (
                rep.value_of(&format!("{l} with {} waiters / with 0", thousands(w1))),
                rep.value_of(&format!("{l} with {} waiters / with 0", thousands(wmax))),
            )
        })
        .filter(|(a, b)| a.is_finite() && b.is_finite())
        .collect();
        // "step": no ratio at the most waiters is more than 15% above the one at the fewest
        let step = !pairs.is_empty() && pairs.iter().all(|(a, b)| *b <= a * 1.15);
        let shape = if step {
            format!(
                "the growth is a step, not a slope: it is there with {} waiters and no bigger \
                 with {} (compare the rows). So it is a fixed cost per call that switches on \
                 while anybody waits on any key, not a cost that grows with the queue.",
                thousands(w1),
                thousands(wmax)
            )
        } else {
            format!(
                "the growth differs between {} and {} waiters ({}){}",
                thousands(w1),
                thousands(wmax),
                pairs
                    .iter()
                    .map(|(a, b)| format!("{} -> {}", x(*a), x(*b)))
                    .collect::<Vec<_>>()
                    .join(", "),
                if cfg.quick {
                    "; QUICK mode measures each count once, and one noisy moment can do that: \
                     check it against a full run."
                } else {
                    ": part of the cost grows with the number of waiters."
                }
            )
        };
        let _ = writeln!(out, "- **Waiters** ({}): {shape}", list.join("; "));
    }
    out
}
