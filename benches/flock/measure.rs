//! Samples and their statistics (median, quantiles, per-round ratios), and generated owners.

use crate::format::*;
use flock_testkit::*;
use std::collections::BTreeMap;

/// A 36-byte owner that looks like a UUID, derived from `i`.
pub(crate) fn uuid(i: usize) -> String {
    let a = splitmix(i as u64);
    let b = splitmix(a);
    format!(
        "{:08x}-{:04x}-4{:03x}-{:x}{:03x}-{:012x}",
        a >> 32,
        (a >> 16) & 0xffff,
        a & 0xfff,
        8 + (b >> 62),
        (b >> 48) & 0xfff,
        b & 0xffff_ffff_ffff
    )
}

pub(crate) fn rotate<T: Copy>(v: &[T], by: usize) -> Vec<T> {
    let mut r = v.to_vec();
    let k = by % r.len().max(1);
    r.rotate_left(k);
    r
}

pub(crate) fn median(v: &[f64]) -> f64 {
    let mut v: Vec<f64> = v.iter().copied().filter(|x| x.is_finite()).collect();
    if v.is_empty() {
        return f64::NAN;
    }
    v.sort_by(|a, b| a.partial_cmp(b).unwrap());
    let n = v.len();
    if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    }
}

/// The q-quantile (nearest rank) of sorted values.
pub(crate) fn pct(sorted: &[u64], q: f64) -> u64 {
    if sorted.is_empty() {
        return 0;
    }
    let idx = ((q * sorted.len() as f64).ceil() as usize).clamp(1, sorted.len()) - 1;
    sorted[idx]
}

#[derive(Default)]
pub(crate) struct Samples(pub(crate) BTreeMap<String, Vec<f64>>);

impl Samples {
    pub(crate) fn add(&mut self, k: &str, v: f64) {
        self.0.entry(k.to_string()).or_default().push(v);
    }
    pub(crate) fn last(&self, k: &str) -> f64 {
        self.0
            .get(k)
            .and_then(|v| v.last().copied())
            .unwrap_or(f64::NAN)
    }
    pub(crate) fn med(&self, k: &str) -> f64 {
        self.0.get(k).map_or(f64::NAN, |v| median(v))
    }
    pub(crate) fn range(&self, k: &str) -> (f64, f64) {
        let v = self.0.get(k).cloned().unwrap_or_default();
        let lo = v.iter().copied().fold(f64::INFINITY, f64::min);
        let hi = v.iter().copied().fold(f64::NEG_INFINITY, f64::max);
        (lo, hi)
    }
    /// Record `a / b` of the latest samples under `k` (a per-round ratio).
    pub(crate) fn ratio(&mut self, k: &str, a: &str, b: &str) {
        let r = self.last(a) / self.last(b);
        self.add(k, r);
    }
    /// "1.09x" or, with several rounds, "1.09x (1.02-1.15)".
    pub(crate) fn show_ratio(&self, k: &str) -> String {
        let n = self.0.get(k).map_or(0, |v| v.len());
        let (lo, hi) = self.range(k);
        if n > 1 {
            format!("{} ({:.2}-{:.2})", x(self.med(k)), lo, hi)
        } else {
            x(self.med(k))
        }
    }
}
