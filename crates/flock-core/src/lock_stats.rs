//! Per-class lock statistics for TTL sizing (FLOCK.STATS), pure: no server needed.
//!
//! The rule practitioners give for lease locks is "measure the p99 of the critical section
//! under load and set the TTL to 5-10 times it". The server sees every grant start and end, so
//! it can measure: per lock *class* (the key name with its identifiers folded to `#`), how
//! grants ended, how long released grants were held, the ttls asked for and how long granted
//! waiters waited. Memory is bounded: fixed-size histograms, at most `max_classes` classes.

use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};
use std::sync::OnceLock;

/// FNV-1a over the class name: the class table is looked up on every grant and release, and
/// class names are short and not attacker-chosen in a way a DoS could use beyond the
/// `max_classes` bound, so a fast non-keyed hash beats std's SipHash here.
#[derive(Default)]
pub struct ClassHasher(u64);

impl Hasher for ClassHasher {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        let mut h = if self.0 == 0 {
            0xcbf2_9ce4_8422_2325
        } else {
            self.0
        };
        for &b in bytes {
            h ^= u64::from(b);
            h = h.wrapping_mul(0x0000_0100_0000_01b3);
        }
        self.0 = h;
    }
}

/// The longest class name kept (bytes); longer names are cut.
pub const MAX_CLASS_LEN: usize = 128;

/// What [`fold_class`] needs to know of a byte, one table lookup per byte (the fold runs on
/// every grant: a few instructions a byte instead of a chain of range tests).
const ALNUM: u8 = 1;
const HEX: u8 = 2;
const DIGIT: u8 = 4;
const PRINTABLE: u8 = 8;

const BYTE_KIND: [u8; 256] = {
    let mut t = [0u8; 256];
    let mut b = 0;
    while b < 256 {
        let c = b as u8;
        let mut k = 0;
        if c.is_ascii_alphanumeric() {
            k |= ALNUM;
        }
        if c.is_ascii_hexdigit() {
            k |= HEX;
        }
        if c.is_ascii_digit() {
            k |= DIGIT;
        }
        if c >= 0x20 && c < 0x7f {
            k |= PRINTABLE;
        }
        t[b] = k;
        b += 1;
    }
    t
};

/// The class of a key: every maximal run of ASCII letters and digits that consists only of hex
/// digits and holds at least one decimal digit becomes `#`, and `#`s separated only by `-`
/// merge into one. Unprintable bytes become `?`; the class is cut to [`MAX_CLASS_LEN`] bytes.
/// Writes into `out` (no allocation) and returns the class's length.
///
/// One pass, one table lookup a byte (this runs on every grant): a run's bytes are copied as
/// they come, and taken back for a `#` when the run turns out to be an identifier.
pub fn fold_class(key: &[u8], out: &mut [u8; MAX_CLASS_LEN]) -> usize {
    let mut n = 0;
    let mut i = 0;
    while let Some(&b) = key.get(i) {
        if n >= MAX_CLASS_LEN {
            break;
        }
        i += 1;
        let kind = BYTE_KIND[usize::from(b)];
        if kind & ALNUM == 0 {
            if let Some(o) = out.get_mut(n) {
                *o = if kind & PRINTABLE != 0 { b } else { b'?' };
            }
            n += 1;
            continue;
        }
        // A run of letters and digits: where it starts in `out`, and what all of its bytes
        // and any of them are. Past the end of `out` it is still read to its end: it may
        // fold to one `#`.
        let at = n;
        let (mut all, mut any) = (kind, kind);
        if let Some(o) = out.get_mut(n) {
            *o = b;
            n += 1;
        }
        while let Some(&c) = key.get(i) {
            let k = BYTE_KIND[usize::from(c)];
            if k & ALNUM == 0 {
                break;
            }
            all &= k;
            any |= k;
            if let Some(o) = out.get_mut(n) {
                *o = c;
                n += 1;
            }
            i += 1;
        }
        n = end_run(out, n, at, all, any);
    }
    n
}

/// The class's length after the run copied to `out[at..n]`: unchanged, or the run replaced
/// by a `#` (merged with one that only dashes separate from it) when it is an identifier.
#[inline]
fn end_run(out: &mut [u8; MAX_CLASS_LEN], n: usize, at: usize, all: u8, any: u8) -> usize {
    if all & HEX == 0 || any & DIGIT == 0 {
        return n;
    }
    let head = out.get(..at).unwrap_or(&[]);
    let dashes = head.iter().rev().take_while(|&&c| c == b'-').count();
    let back = at - dashes;
    if dashes > 0 && back > 0 && head.get(back - 1) == Some(&b'#') {
        return back;
    }
    if head.last() == Some(&b'#') {
        return at;
    }
    match out.get_mut(at) {
        Some(o) => {
            *o = b'#';
            at + 1
        }
        None => at,
    }
}

/// Growth factor between histogram buckets: a bucket's geometric middle is within 3% of every
/// value in it (sqrt(1.06) - 1 = 2.96%).
const RATIO: f64 = 1.06;
/// Bucket 0 holds 0; bucket b >= 1 holds [RATIO^(b-1), RATIO^b). 460 buckets reach past
/// 4e11 ms (12 years), beyond the largest ttl.
pub const BUCKETS: usize = 460;

/// The bucket boundaries as integers, found once from the definition
/// ([`LogHistogram::bucket_by_log`]): a release then finds its bucket with four comparisons
/// (no logarithm, no branch on the data) instead of a float logarithm and division.
struct Bounds {
    /// `lowest[b]`: the smallest value whose bucket is at least `b`; `u64::MAX` past the last
    /// bucket (the padding lets the search below read up to 15 places beyond any start).
    lowest: [u64; BUCKETS + 16],
    /// `first[k]`: the bucket of 2^k. The values with the same highest bit, [2^k, 2^(k+1)),
    /// span at most 12 buckets from there (ln 2 / ln 1.06 < 12).
    first: [u16; 64],
}

impl Bounds {
    fn new() -> Bounds {
        let mut lowest = [u64::MAX; BUCKETS + 16];
        lowest[0] = 0;
        for (b, low) in lowest.iter_mut().enumerate().take(BUCKETS).skip(1) {
            // The bucket only grows with the value: bisect for its first value.
            let (mut lo, mut hi) = (1u64, u64::MAX);
            while lo < hi {
                let mid = lo + (hi - lo) / 2;
                if LogHistogram::bucket_by_log(mid) >= b {
                    hi = mid;
                } else {
                    lo = mid + 1;
                }
            }
            *low = lo;
        }
        let mut first = [0u16; 64];
        for (k, f) in first.iter_mut().enumerate() {
            *f = LogHistogram::bucket_by_log(1u64 << k) as u16;
        }
        Bounds { lowest, first }
    }

    #[inline]
    fn bucket(&self, v: u64) -> usize {
        if v == 0 {
            return 0;
        }
        let k = (63 - v.leading_zeros()) as usize;
        let mut b = usize::from(self.first.get(k).copied().unwrap_or(0));
        for step in [8, 4, 2, 1] {
            if self.lowest.get(b + step).is_some_and(|&low| low <= v) {
                b += step;
            }
        }
        // Only u64::MAX itself passes the padding.
        b.min(BUCKETS - 1)
    }
}

fn bounds() -> &'static Bounds {
    static BOUNDS: OnceLock<Bounds> = OnceLock::new();
    BOUNDS.get_or_init(Bounds::new)
}

/// A fixed-size log-bucket histogram of milliseconds.
#[derive(Clone)]
pub struct LogHistogram {
    counts: [u32; BUCKETS],
    total: u64,
    min: u64,
    max: u64,
    /// The last value recorded and its bucket: ttls repeat, and a repeat skips the logarithm.
    last: (u64, usize),
}

impl Default for LogHistogram {
    fn default() -> Self {
        LogHistogram {
            counts: [0; BUCKETS],
            total: 0,
            min: u64::MAX,
            max: 0,
            last: (0, 0),
        }
    }
}

impl LogHistogram {
    /// The bucket of `v`, by definition (a logarithm); [`Bounds`] gives the same with a few
    /// comparisons.
    fn bucket_by_log(v: u64) -> usize {
        if v == 0 {
            return 0;
        }
        let b = 1 + ((v as f64).ln() / RATIO.ln()) as usize;
        b.min(BUCKETS - 1)
    }

    /// The bucket of `v`, as [`LogHistogram::bucket_by_log`] defines it.
    #[inline]
    fn bucket(v: u64) -> usize {
        bounds().bucket(v)
    }

    pub fn record(&mut self, v: u64) {
        let b = if v == self.last.0 {
            self.last.1
        } else {
            let b = Self::bucket(v);
            self.last = (v, b);
            b
        };
        self.record_in(v, b);
    }

    /// Count `v`, whose bucket the caller already knows (one logarithm for two histograms).
    fn record_in(&mut self, v: u64, b: usize) {
        if let Some(c) = self.counts.get_mut(b) {
            *c = c.saturating_add(1);
        }
        self.total += 1;
        self.min = self.min.min(v);
        self.max = self.max.max(v);
    }

    pub fn count(&self) -> u64 {
        self.total
    }

    pub fn max(&self) -> u64 {
        self.max
    }

    /// The `p`-quantile (0 < p <= 1): the geometric middle of the bucket holding the value of
    /// rank ceil(p * count), kept within the smallest and largest values seen (so a single
    /// value, or a constant one, comes back exactly). None when empty.
    pub fn quantile(&self, p: f64) -> Option<u64> {
        if self.total == 0 {
            return None;
        }
        let rank = ((p * self.total as f64).ceil() as u64).clamp(1, self.total);
        let mut seen = 0u64;
        for (b, &c) in self.counts.iter().enumerate() {
            seen += u64::from(c);
            if seen >= rank {
                if b == 0 {
                    return Some(0);
                }
                let lo = RATIO.powi(b as i32 - 1);
                let mid = (lo * RATIO.sqrt()).round() as u64;
                // max/min, not clamp: float rounding can put `lo` a hair above `max`.
                return Some(mid.max(lo.ceil() as u64).min(self.max).max(self.min));
            }
        }
        Some(self.max)
    }
}

/// One class's figures.
#[derive(Clone, Default)]
pub struct ClassStats {
    pub grants: u64,
    pub released: u64,
    pub expired: u64,
    pub revoked: u64,
    pub closed: u64,
    pub renewals: u64,
    /// How long grants ended by RELEASE were held.
    pub hold: LogHistogram,
    /// The ttls asked for by grants.
    pub ttl: LogHistogram,
    /// How long BLOCK waits that were granted took.
    pub wait: LogHistogram,
}

/// Releases needed before a TTL advice is given.
pub const ADVICE_MIN_RELEASES: u64 = 100;

impl ClassStats {
    /// Grants that ended, however they ended.
    pub fn ended(&self) -> u64 {
        self.released + self.expired + self.revoked + self.closed
    }

    /// `[5x, 10x]` the hold p99, once at least 100 releases were seen and while at most 1% of
    /// the ended grants expired (the releases alone then hide the sections that ran out).
    pub fn ttl_advice_ms(&self) -> Option<[u64; 2]> {
        if self.released < ADVICE_MIN_RELEASES || self.expired * 100 > self.ended() {
            return None;
        }
        let p99 = self.hold.quantile(0.99)?.max(1);
        Some([p99.saturating_mul(5), p99.saturating_mul(10)])
    }
}

/// What can happen to a grant, as the statistics count it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Event {
    /// A grant with this ttl (ms).
    Granted {
        ttl_ms: u64,
    },
    /// A grant after a BLOCK wait of this long (ms); counted besides `Granted`.
    Waited {
        wait_ms: u64,
    },
    /// Ended by RELEASE after being held this long (ms).
    Released {
        held_ms: u64,
    },
    Expired,
    Revoked,
    Closed,
    Renewed,
}

/// Where a key's class sits in the table, as [`Stats::record_for`] hands it out for the host
/// to keep beside the lock (the module keeps it in the lock's record): the lock's later
/// events (release, expiry, renewal, a waiter's grant) then skip folding the key name and
/// looking the class up. It names the table's epoch too, which every RESET changes, so a
/// reference from before a RESET finds nothing and the name is folded again; it cannot count
/// for a class created since. (The epoch wraps after 2^32 - 1 RESETs: only a reference kept
/// across all of them could land in a wrong class.) The default refers to nothing.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ClassRef {
    index: u32,
    /// 0: refers to nothing (tables start at epoch 1).
    epoch: u32,
}

/// Every class seen since the start or the last reset, first come, up to `max_classes`.
pub struct Stats {
    /// The classes in the order they came, and an index by name.
    entries: Vec<(Box<[u8]>, Box<ClassStats>)>,
    index: HashMap<Box<[u8]>, usize, BuildHasherDefault<ClassHasher>>,
    /// The entry the last lookup by name found: most events of a busy server go to the class
    /// of the one before, and comparing with it is cheaper than hashing.
    last: usize,
    /// Which table this is (see [`ClassRef`]); never 0.
    epoch: u32,
    /// Where a key's class is folded: kept, rather than zeroed on the stack for every grant.
    scratch: [u8; MAX_CLASS_LEN],
    /// Grants of classes beyond `max_classes`.
    pub overflow: u64,
    /// Hold times of every release, all classes together (INFO flock).
    pub all_holds: LogHistogram,
}

impl Default for Stats {
    fn default() -> Self {
        Stats {
            entries: Vec::new(),
            index: HashMap::default(),
            last: 0,
            epoch: 1,
            scratch: [0; MAX_CLASS_LEN],
            overflow: 0,
            all_holds: LogHistogram::default(),
        }
    }
}

impl Stats {
    /// Count `event` for `key`'s class. A class beyond `max_classes` is not created: its grants
    /// count in `overflow`.
    pub fn record(&mut self, key: &[u8], event: Event, max_classes: usize) {
        self.record_for(&mut ClassRef::default(), key, event, max_classes);
    }

    /// Like [`Stats::record`], for a lock that keeps `class` beside it: when `class` refers to
    /// this table the key name is not looked at; otherwise the class is found (or created)
    /// by name and `class` set to it. A class that did not fit leaves `class` referring to
    /// nothing, so the name is looked up again next time, as [`Stats::record`] does.
    #[inline]
    pub fn record_for(
        &mut self,
        class: &mut ClassRef,
        key: &[u8],
        event: Event,
        max_classes: usize,
    ) {
        if let Event::Released { held_ms } = event {
            // Its bucket, once, for this histogram and the class's below.
            self.all_holds.record(held_ms);
        }
        let at = if class.epoch == self.epoch {
            class.index as usize
        } else {
            match self.find_or_add(key, max_classes) {
                Some(at) => {
                    *class = ClassRef {
                        // Fits: max_classes is bounded far below u32::MAX by its config.
                        index: u32::try_from(at).unwrap_or(u32::MAX),
                        epoch: self.epoch,
                    };
                    at
                }
                None => {
                    if matches!(event, Event::Granted { .. }) {
                        self.overflow += 1;
                    }
                    return;
                }
            }
        };
        let Some((_, entry)) = self.entries.get_mut(at) else {
            return;
        };
        match event {
            Event::Granted { ttl_ms } => {
                entry.grants += 1;
                entry.ttl.record(ttl_ms);
            }
            Event::Waited { wait_ms } => entry.wait.record(wait_ms),
            Event::Released { held_ms } => {
                entry.released += 1;
                let b = self.all_holds.last.1;
                entry.hold.record_in(held_ms, b);
            }
            Event::Expired => entry.expired += 1,
            Event::Revoked => entry.revoked += 1,
            Event::Closed => entry.closed += 1,
            Event::Renewed => entry.renewals += 1,
        }
    }

    /// The entry of `key`'s class, created when new and within `max_classes`.
    fn find_or_add(&mut self, key: &[u8], max_classes: usize) -> Option<usize> {
        let n = fold_class(key, &mut self.scratch);
        let class = self.scratch.get(..n).unwrap_or(&[]);
        let at = match self.entries.get(self.last) {
            Some((name, _)) if **name == *class => self.last,
            _ => match self.index.get(class) {
                Some(&i) => i,
                None => {
                    if self.entries.len() >= max_classes {
                        return None;
                    }
                    self.entries.push((class.into(), Box::default()));
                    self.index.insert(class.into(), self.entries.len() - 1);
                    self.entries.len() - 1
                }
            },
        };
        self.last = at;
        Some(at)
    }

    /// The classes, sorted by name; only `names` (class names, not keys) when given.
    pub fn classes(&self, names: Option<&[&[u8]]>) -> Vec<(&[u8], &ClassStats)> {
        let entry = |i: usize| self.entries.get(i).map(|(k, v)| (&**k, &**v));
        let mut v: Vec<(&[u8], &ClassStats)> = match names {
            None => self.entries.iter().map(|(k, v)| (&**k, &**v)).collect(),
            Some(names) => names
                .iter()
                .filter_map(|n| self.index.get(*n).and_then(|&i| entry(i)))
                .collect(),
        };
        v.sort_by(|a, b| a.0.cmp(b.0));
        v.dedup_by(|a, b| a.0 == b.0);
        v
    }

    /// Empty the table; references handed out before refer to nothing from now on.
    pub fn reset(&mut self) {
        let epoch = match self.epoch.wrapping_add(1) {
            0 => 1,
            e => e,
        };
        *self = Stats {
            epoch,
            ..Stats::default()
        };
    }

    /// Bytes this table holds (fixed per class), for MEMORY-style reporting and tests.
    pub fn class_bytes() -> usize {
        std::mem::size_of::<ClassStats>() + MAX_CLASS_LEN
    }
}

/// A reply, as FLOCK.STATS GET gives it: maps (flat arrays in RESP2), integers, nil.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Out {
    Int(u64),
    Nil,
    Arr(Vec<Out>),
    Map(Vec<(Vec<u8>, Out)>),
}

fn field(name: &str, v: Out) -> (Vec<u8>, Out) {
    (name.as_bytes().to_vec(), v)
}

fn quantiles(h: &LogHistogram, with_max: bool, with_p99: bool) -> Out {
    let q = |p: f64| h.quantile(p).map_or(Out::Nil, Out::Int);
    let mut m = vec![field("p50", q(0.5))];
    if with_p99 {
        m.push(field("p99", q(0.99)));
    }
    if with_max {
        m.push(field(
            "max",
            if h.count() == 0 {
                Out::Nil
            } else {
                Out::Int(h.max())
            },
        ));
    }
    Out::Map(m)
}

impl ClassStats {
    /// This class's figures as FLOCK.STATS GET shows them.
    pub fn report(&self) -> Out {
        Out::Map(vec![
            field("grants", Out::Int(self.grants)),
            field("released", Out::Int(self.released)),
            field("expired", Out::Int(self.expired)),
            field("revoked", Out::Int(self.revoked)),
            field("closed", Out::Int(self.closed)),
            field("renewals", Out::Int(self.renewals)),
            field("hold_ms", quantiles(&self.hold, true, true)),
            field("ttl_ms", quantiles(&self.ttl, false, false)),
            field("wait_ms", quantiles(&self.wait, false, true)),
            field(
                "ttl_advice_ms",
                self.ttl_advice_ms().map_or(Out::Nil, |[lo, hi]| {
                    Out::Arr(vec![Out::Int(lo), Out::Int(hi)])
                }),
            ),
        ])
    }
}

impl Stats {
    /// FLOCK.STATS GET [class ...]: `classes` (a map of class name to its figures; classes
    /// named but never seen are left out) and `overflow`.
    pub fn report(&self, names: Option<&[&[u8]]>) -> Out {
        let classes = self
            .classes(names)
            .into_iter()
            .map(|(name, c)| (name.to_vec(), c.report()))
            .collect();
        Out::Map(vec![
            field("classes", Out::Map(classes)),
            field("overflow", Out::Int(self.overflow)),
        ])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn class(key: &str) -> String {
        let mut buf = [0u8; MAX_CLASS_LEN];
        let n = fold_class(key.as_bytes(), &mut buf);
        String::from_utf8_lossy(&buf[..n]).into_owned()
    }

    #[test]
    fn classes_fold_identifiers() {
        let table = [
            ("lock:orders:42", "lock:orders:#"),
            ("lock:orders:7", "lock:orders:#"),
            ("{order:42}:lock", "{order:#}:lock"),
            ("job:550e8400-e29b-41d4-a716-446655440000", "job:#"),
            ("shard-1:lock", "shard-#:lock"),
            ("item_123", "item_#"),
            ("v2:lock", "v2:lock"),
            ("deadbeef:lock", "deadbeef:lock"),
            ("cafe42:lock", "#:lock"),
            ("a:1-2-3:b", "a:#:b"),
            ("a:1--2:b", "a:#:b"),
            ("1-x-2", "#-x-#"),
            ("lock\n\x01", "lock??"),
            ("", ""),
            ("-1", "-#"),
            ("1-", "#-"),
        ];
        for (key, want) in table {
            assert_eq!(class(key), want, "{key:?}");
        }
        let long = "x".repeat(500);
        assert_eq!(class(&long).len(), MAX_CLASS_LEN);
    }

    /// The fold as it was first written (a chain of range tests per byte): the table-driven
    /// [`fold_class`] must give the same class for every key.
    fn reference_fold(key: &[u8], out: &mut [u8; MAX_CLASS_LEN]) -> usize {
        let mut n = 0;
        let mut i = 0;
        // One pass over the key (this runs on every grant and release); stops once the class
        // is full.
        while i < key.len() && n < MAX_CLASS_LEN {
            let b = key[i];
            if !b.is_ascii_alphanumeric() {
                out[n] = if (0x20..0x7f).contains(&b) { b } else { b'?' };
                n += 1;
                i += 1;
                continue;
            }
            let start = i;
            let (mut all_hex, mut any_digit) = (true, false);
            while let Some(&c) = key.get(i) {
                if !c.is_ascii_alphanumeric() {
                    break;
                }
                all_hex &= c.is_ascii_hexdigit();
                any_digit |= c.is_ascii_digit();
                i += 1;
            }
            if all_hex && any_digit {
                // Merge with a `#` that only dashes separate from this one.
                let mut back = n;
                while back > 0 && out[back - 1] == b'-' {
                    back -= 1;
                }
                if back > 0 && back < n && out[back - 1] == b'#' {
                    n = back;
                } else if !(n > 0 && out[n - 1] == b'#') {
                    out[n] = b'#';
                    n += 1;
                }
            } else {
                let take = (i - start).min(MAX_CLASS_LEN - n);
                out[n..n + take].copy_from_slice(&key[start..start + take]);
                n += take;
            }
        }
        n
    }

    #[test]
    fn the_table_driven_fold_matches_the_first_one() {
        // Keys made of the bytes the fold tells apart, from a fixed-seed generator.
        let alphabet = b"09afAFgzGZ-_:#{}. \x01\x7f\xff";
        let mut seed = 0x2545_f491_4f6c_dd1du64;
        let mut next = || {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed
        };
        for _ in 0..20_000 {
            let len = (next() % 160) as usize;
            let key: Vec<u8> = (0..len)
                .map(|_| alphabet[(next() % alphabet.len() as u64) as usize])
                .collect();
            let (mut a, mut b) = ([0u8; MAX_CLASS_LEN], [0u8; MAX_CLASS_LEN]);
            let (na, nb) = (fold_class(&key, &mut a), reference_fold(&key, &mut b));
            assert_eq!(a[..na], b[..nb], "{key:?}");
        }
    }

    #[test]
    fn a_kept_class_reference_counts_like_the_name_and_dies_with_reset() {
        let mut s = Stats::default();
        let mut class = ClassRef::default();
        s.record_for(&mut class, b"job:1", Event::Granted { ttl_ms: 100 }, 8);
        assert_ne!(class, ClassRef::default(), "the grant hands out its class");
        let kept = class;
        // Later events of the lock go to the kept class (the name is not looked at again).
        s.record_for(&mut class, b"job:1", Event::Renewed, 8);
        s.record_for(&mut class, b"job:1", Event::Released { held_ms: 7 }, 8);
        assert_eq!(class, kept);
        let all = s.classes(None);
        assert_eq!(all.len(), 1);
        let c = all[0].1;
        assert_eq!((c.grants, c.renewals, c.released), (1, 1, 1));
        assert_eq!(c.hold.max(), 7);
        // After a RESET the old reference finds nothing; the event goes by name, to a new class.
        s.reset();
        s.record_for(&mut class, b"other:2", Event::Expired, 8);
        assert_ne!(class, kept);
        let all = s.classes(None);
        assert_eq!(all.len(), 1);
        assert_eq!((all[0].0, all[0].1.expired), (&b"other:#"[..], 1));
        // A class that does not fit is not kept: with room later, the name finds its class.
        let mut s = Stats::default();
        s.record(b"a:1", Event::Granted { ttl_ms: 1 }, 1);
        let mut none = ClassRef::default();
        s.record_for(&mut none, b"b:1", Event::Granted { ttl_ms: 1 }, 1);
        assert_eq!((none, s.overflow), (ClassRef::default(), 1));
        s.record(b"b:2", Event::Granted { ttl_ms: 1 }, 2);
        s.record_for(&mut none, b"b:1", Event::Released { held_ms: 1 }, 2);
        assert_ne!(none, ClassRef::default());
        let b = s.classes(Some(&[b"b:#"]))[0].1;
        assert_eq!((b.grants, b.released), (1, 1));
    }

    #[test]
    fn the_bucket_table_agrees_with_the_logarithm() {
        let b = bounds();
        let check = |v: u64| assert_eq!(b.bucket(v), LogHistogram::bucket_by_log(v), "value {v}");
        (0..200_000).for_each(check);
        // Every boundary and its neighbours, and the top of the range.
        for &low in b.lowest.iter().take(BUCKETS) {
            for v in [low.saturating_sub(1), low, low.saturating_add(1)] {
                check(v);
            }
        }
        for k in 0..64 {
            let p = 1u64 << k;
            for v in [
                p - 1,
                p,
                p + 1,
                p | (p >> 1),
                p.wrapping_mul(2).wrapping_sub(1),
            ] {
                check(v);
            }
        }
        check(u64::MAX);
        let mut seed = 0x9e37_79b9_7f4a_7c15u64;
        for _ in 0..200_000 {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            check(seed >> (seed % 64));
        }
    }

    #[test]
    fn quantiles_are_within_three_percent() {
        for &v in &[
            1u64,
            2,
            3,
            10,
            17,
            99,
            1000,
            12_345,
            999_999,
            86_400_000,
            315_360_000_000,
        ] {
            let mut h = LogHistogram::default();
            h.record(v);
            let q = h.quantile(0.5).expect("one value");
            let err = (q as f64 - v as f64).abs() / v as f64;
            assert!(err <= 0.03, "{v}: quantile {q} off by {err}");
        }
        // 1..=1000: p50 near 500, p99 near 990, max exact.
        let mut h = LogHistogram::default();
        for v in 1..=1000 {
            h.record(v);
        }
        let p50 = h.quantile(0.5).expect("p50") as f64;
        let p99 = h.quantile(0.99).expect("p99") as f64;
        assert!((p50 - 500.0).abs() / 500.0 <= 0.03, "p50 {p50}");
        assert!((p99 - 990.0).abs() / 990.0 <= 0.03, "p99 {p99}");
        assert_eq!(h.max(), 1000);
        assert_eq!(LogHistogram::default().quantile(0.5), None);
        let mut z = LogHistogram::default();
        z.record(0);
        assert_eq!(z.quantile(0.99), Some(0));
    }

    #[test]
    fn a_class_stays_within_eight_kilobytes() {
        assert!(Stats::class_bytes() <= 8 * 1024, "{}", Stats::class_bytes());
    }

    #[test]
    fn counters_advice_bound_and_reset() {
        let mut s = Stats::default();
        for i in 0..150u64 {
            s.record(
                format!("job:{i}").as_bytes(),
                Event::Granted { ttl_ms: 30_000 },
                4,
            );
            s.record(
                format!("job:{i}").as_bytes(),
                Event::Released {
                    held_ms: 10 + i % 10,
                },
                4,
            );
        }
        s.record(b"job:1", Event::Renewed, 4);
        s.record(b"job:2", Event::Granted { ttl_ms: 100 }, 4);
        s.record(b"job:2", Event::Expired, 4);
        s.record(b"job:3", Event::Waited { wait_ms: 40 }, 4);
        let all = s.classes(None);
        assert_eq!(all.len(), 1);
        let (name, c) = all[0];
        assert_eq!(name, b"job:#");
        assert_eq!(
            (c.grants, c.released, c.expired, c.renewals),
            (151, 150, 1, 1)
        );
        assert_eq!(c.wait.count(), 1);
        // 1 expiry in 151 ended grants is under 1%: the advice is [5x, 10x] the p99 (~19 ms).
        let [lo, hi] = c.ttl_advice_ms().expect("advice");
        assert!((90..=100).contains(&lo) && hi == lo * 2, "{lo} {hi}");
        // Two more expiries push it over 1%: no advice.
        s.record(b"job:4", Event::Expired, 4);
        s.record(b"job:5", Event::Expired, 4);
        assert_eq!(s.classes(None)[0].1.ttl_advice_ms(), None);
        // The bound: 4 classes, further grants count in overflow.
        for k in ["a:1", "b:1", "c:1", "d:1", "e:1"] {
            s.record(k.as_bytes(), Event::Granted { ttl_ms: 1 }, 4);
        }
        assert_eq!(s.classes(None).len(), 4);
        assert_eq!(s.overflow, 2);
        assert_eq!(s.classes(Some(&[b"a:#", b"zz", b"a:#"])).len(), 1);
        assert_eq!(s.all_holds.count(), 150);
        s.reset();
        assert!(s.classes(None).is_empty());
        assert_eq!(s.overflow, 0);
    }

    #[test]
    fn the_report_has_every_field() {
        let mut s = Stats::default();
        s.record(b"job:1", Event::Granted { ttl_ms: 1000 }, 8);
        let Out::Map(top) = s.report(None) else {
            panic!("not a map")
        };
        assert_eq!(top[0].0, b"classes");
        assert_eq!(top[1], (b"overflow".to_vec(), Out::Int(0)));
        let Out::Map(classes) = &top[0].1 else {
            panic!("classes")
        };
        let (name, Out::Map(fields)) = &classes[0] else {
            panic!("class")
        };
        assert_eq!(name, b"job:#");
        let names: Vec<&[u8]> = fields.iter().map(|(k, _)| k.as_slice()).collect();
        assert_eq!(
            names,
            [
                &b"grants"[..],
                b"released",
                b"expired",
                b"revoked",
                b"closed",
                b"renewals",
                b"hold_ms",
                b"ttl_ms",
                b"wait_ms",
                b"ttl_advice_ms"
            ]
        );
        assert_eq!(fields[0].1, Out::Int(1));
        assert_eq!(
            fields[6].1,
            Out::Map(vec![
                field("p50", Out::Nil),
                field("p99", Out::Nil),
                field("max", Out::Nil)
            ])
        );
        assert_eq!(fields[7].1, Out::Map(vec![field("p50", Out::Int(1000))]));
        assert_eq!(fields[9].1, Out::Nil);
        let Out::Map(none) = &s.report(Some(&[b"nope"])) else {
            panic!()
        };
        assert_eq!(none[0].1, Out::Map(vec![]));
    }

    #[test]
    fn fewer_than_a_hundred_releases_give_no_advice() {
        let mut s = Stats::default();
        for _ in 0..99 {
            s.record(b"k", Event::Granted { ttl_ms: 1000 }, 10);
            s.record(b"k", Event::Released { held_ms: 5 }, 10);
        }
        assert_eq!(s.classes(None)[0].1.ttl_advice_ms(), None);
        s.record(b"k", Event::Released { held_ms: 5 }, 10);
        assert!(s.classes(None)[0].1.ttl_advice_ms().is_some());
    }
}
