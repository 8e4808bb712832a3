//! The SVG chart of every flock / baseline ratio (docs/benchmarks.svg).

use crate::format::*;
use crate::report::*;
use std::fmt::Write as _;

pub(crate) fn esc(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
}

pub(crate) fn svg_chart(checks: &[&Check], title: &str) -> String {
    let lo_ticks = [0.01, 0.03, 0.1, 0.3, 1.0, 3.0, 10.0, 30.0, 100.0];
    let mut vmin: f64 = 1.0;
    let mut vmax: f64 = 1.0;
    for c in checks {
        if c.value.is_finite() && c.value > 0.0 {
            vmin = vmin.min(c.value);
            vmax = vmax.max(c.value);
        }
        if let Some(g) = c.goal {
            vmin = vmin.min(g.value());
            vmax = vmax.max(g.value());
        }
    }
    let lo = lo_ticks
        .iter()
        .copied()
        .filter(|t| *t <= vmin / 1.15)
        .fold(0.01, f64::max);
    let hi = lo_ticks
        .iter()
        .copied()
        .rev()
        .filter(|t| *t >= vmax * 1.15)
        .fold(100.0, f64::min);
    let (w, left, right) = (1120.0, 420.0, 880.0);
    let row_h = 22.0;
    let head_h = 26.0;
    let mut y = 70.0;
    let mut body = String::new();
    let xpos =
        |v: f64| left + (v.clamp(lo, hi).ln() - lo.ln()) / (hi.ln() - lo.ln()) * (right - left);
    let mut last_section = "";
    for c in checks {
        if c.section != last_section {
            last_section = c.section;
            y += 6.0;
            let _ = write!(
                body,
                r##"<text x="10" y="{:.1}" font-weight="bold" font-size="13">{}</text>"##,
                y + 15.0,
                esc(c.section)
            );
            y += head_h;
        }
        let (color, mark) = match c.pass() {
            Some(true) => ("#2e7d32", " ✓"),
            Some(false) => ("#c62828", " ✗"),
            None => ("#9e9e9e", ""),
        };
        let _ = write!(
            body,
            r##"<text x="{:.1}" y="{:.1}" font-size="11.5" text-anchor="end">{}</text>"##,
            left - 8.0,
            y + 15.0,
            esc(&c.what)
        );
        if c.value.is_finite() && c.value > 0.0 {
            let (x0, x1) = (xpos(1.0), xpos(c.value));
            let (a, b) = if x0 <= x1 { (x0, x1) } else { (x1, x0) };
            let _ = write!(
                body,
                r##"<rect x="{a:.1}" y="{:.1}" width="{:.1}" height="{:.1}" fill="{color}" opacity="0.85"/>"##,
                y + 4.0,
                (b - a).max(1.5),
                row_h - 8.0
            );
        }
        if let Some(g) = c.goal {
            let gx = xpos(g.value());
            let _ = write!(
                body,
                r##"<line x1="{gx:.1}" x2="{gx:.1}" y1="{:.1}" y2="{:.1}" stroke="#000" stroke-width="2"/>"##,
                y + 1.0,
                y + row_h - 1.0
            );
        }
        let target = c
            .goal
            .map_or(String::new(), |g| format!(" (target {})", g.show()));
        let _ = write!(
            body,
            r##"<text x="{:.1}" y="{:.1}" font-size="11.5" fill="{color}">{}{}{}</text>"##,
            right + 8.0,
            y + 15.0,
            esc(&format!(
                "{} {}",
                if c.higher { "↑" } else { "↓" },
                x(c.value)
            )),
            mark,
            esc(&target)
        );
        y += row_h;
    }
    let h = y + 40.0;
    let mut s = format!(
        r##"<svg xmlns="http://www.w3.org/2000/svg" width="{w:.0}" height="{h:.0}" viewBox="0 0 {w:.0} {h:.0}" font-family="Helvetica, Arial, sans-serif">
<rect width="100%" height="100%" fill="#fff"/>
<text x="10" y="22" font-size="16" font-weight="bold">{}</text>
<text x="10" y="42" font-size="11.5" fill="#444">flock / baseline, measured in the same run, log scale. Bars start at 1x; black tick = target; ↓ lower is better, ↑ higher is better. Green: met, red: missed, grey: no target.</text>
"##,
        esc(title)
    );
    // grid
    for t in lo_ticks.iter().copied().filter(|t| *t >= lo && *t <= hi) {
        let gx = xpos(t);
        let strong = (t - 1.0).abs() < 1e-9;
        let _ = write!(
            s,
            r##"<line x1="{gx:.1}" x2="{gx:.1}" y1="56" y2="{:.1}" stroke="{}" stroke-width="{}"/>"##,
            h - 30.0,
            if strong { "#555" } else { "#ddd" },
            if strong { 1.5 } else { 1.0 }
        );
        let _ = write!(
            s,
            r##"<text x="{gx:.1}" y="{:.1}" font-size="11" text-anchor="middle" fill="#444">{}x</text>"##,
            h - 14.0,
            if t < 1.0 {
                format!("{t}")
            } else {
                format!("{t:.0}")
            }
        );
        let _ = write!(
            s,
            r##"<text x="{gx:.1}" y="66" font-size="10" text-anchor="middle" fill="#888">{}x</text>"##,
            if t < 1.0 {
                format!("{t}")
            } else {
                format!("{t:.0}")
            }
        );
    }
    s += &body;
    s += "</svg>\n";
    s
}
