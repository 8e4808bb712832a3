//! How numbers are shown in the report: ratios, microseconds, milliseconds, Markdown tables.

use std::fmt::Write as _;

pub(crate) fn x(r: f64) -> String {
    if !r.is_finite() {
        "n/a".into()
    } else if r >= 10.0 {
        format!("{r:.1}x")
    } else if r < 0.1 {
        format!("{r:.3}x")
    } else {
        format!("{r:.2}x")
    }
}

pub(crate) fn us(v: f64) -> String {
    if !v.is_finite() {
        "n/a".into()
    } else {
        format!("{v:.2}")
    }
}

pub(crate) fn ms(us: u64) -> String {
    let m = us as f64 / 1000.0;
    if m >= 100.0 {
        format!("{m:.0}")
    } else if m >= 10.0 {
        format!("{m:.1}")
    } else {
        format!("{m:.2}")
    }
}

pub(crate) fn thousands(n: usize) -> String {
    let s = n.to_string();
    let mut out = String::new();
    for (i, ch) in s.chars().enumerate() {
        if i > 0 && (s.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(ch);
    }
    out
}

pub(crate) fn table(headers: &[&str], rows: &[Vec<String>]) -> String {
    let mut s = String::new();
    let _ = writeln!(s, "| {} |", headers.join(" | "));
    let _ = writeln!(
        s,
        "|{}|",
        headers
            .iter()
            .enumerate()
            .map(|(i, _)| if i == 0 { "---" } else { "---:" })
            .collect::<Vec<_>>()
            .join("|")
    );
    for r in rows {
        let _ = writeln!(s, "| {} |", r.join(" | "));
    }
    s
}
