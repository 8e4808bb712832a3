//! The module's settings and their one validation (pure: no server needed).
//!
//! A setting arrives three ways: as a `loadmodule` argument (`max-ttl-ms 5000` or
//! `flock.max-ttl-ms 5000`), as a `flock.max-ttl-ms 5000` line in redis.conf (what CONFIG
//! REWRITE writes), or by CONFIG SET. All three go through [`Setting::check`], so a value the
//! module holds is always one it applies as it is: CONFIG GET shows the value in effect.

use crate::args::parse_i64;

/// One numeric setting: its name without the `flock.` prefix, default and allowed range.
#[derive(Debug, PartialEq, Eq)]
pub struct Setting {
    pub name: &'static str,
    pub default: i64,
    pub min: i64,
    pub max: i64,
}

pub const MAX_TTL: Setting = Setting {
    name: "max-ttl-ms",
    default: 86_400_000,
    min: 1,
    // Ten years.
    max: 315_360_000_000,
};
pub const MAX_WAITERS: Setting = Setting {
    name: "max-waiters",
    default: 10_000,
    min: 0,
    max: 1_000_000_000,
};
pub const LOCK_DELAY: Setting = Setting {
    name: "lock-delay-ms",
    default: 0,
    min: 0,
    // One day.
    max: 86_400_000,
};

pub const MAX_HOLDERS: Setting = Setting {
    name: "max-holders",
    default: 10_000,
    min: 1,
    max: crate::state::MAX_LIMIT as i64,
};

/// How far above `max(token mark, clock)` a master starts its tokens after a promotion or a
/// restart ([`crate::tokens::TokenIssuer::promote`]): the most two servers' clocks may differ
/// with tokens still growing across a failover.
pub const PROMOTION_MARGIN: Setting = Setting {
    name: "promotion-margin-ms",
    default: 86_400_000,
    min: 1,
    // Thirty days.
    max: 2_592_000_000,
};

pub const STATS_MAX_CLASSES: Setting = Setting {
    name: "stats-max-classes",
    default: 256,
    min: 0,
    max: 100_000,
};

/// The most FLOCK.WATCH watchers of one key (0: nobody may watch).
pub const MAX_WATCHERS: Setting = Setting {
    name: "max-watchers",
    default: 10_000,
    min: 0,
    max: 1_000_000_000,
};

/// Every setting, in the order of the table in docs/guide/configuration.md.
pub const ALL: [&Setting; 7] = [
    &MAX_TTL,
    &MAX_WAITERS,
    &LOCK_DELAY,
    &MAX_HOLDERS,
    &PROMOTION_MARGIN,
    &STATS_MAX_CLASSES,
    &MAX_WATCHERS,
];

impl Setting {
    /// The value if it is in range, else the error text (without the argument's origin).
    pub fn check(&self, value: i64) -> Result<i64, String> {
        if (self.min..=self.max).contains(&value) {
            Ok(value)
        } else {
            Err(format!(
                "flock.{} must be an integer from {} to {}, not {value}",
                self.name, self.min, self.max
            ))
        }
    }

    /// A value as text, by Redis's integer rules (optional '-', no '+', no leading zeros).
    pub fn parse(&self, text: &[u8]) -> Result<i64, String> {
        match parse_i64(text) {
            Some(v) => self.check(v),
            None => Err(format!(
                "flock.{} must be an integer from {} to {}, not '{}'",
                self.name,
                self.min,
                self.max,
                String::from_utf8_lossy(text)
            )),
        }
    }
}

/// The setting `name` refers to: `max-ttl-ms` or `flock.max-ttl-ms`, in any case (Redis's own
/// config names are case-insensitive).
pub fn find(name: &[u8]) -> Option<&'static Setting> {
    let bare = if name.len() > 6 && name[..6].eq_ignore_ascii_case(b"flock.") {
        &name[6..]
    } else {
        name
    };
    ALL.into_iter()
        .find(|s| s.name.as_bytes().eq_ignore_ascii_case(bare))
}

/// The `loadmodule` arguments, as pairs of name and value. Anything that is not exactly a list
/// of known names each followed by a valid value, each name at most once, is an error that
/// names the argument and the allowed range: the module then refuses to load.
pub fn parse_load_args(args: &[&[u8]]) -> Result<Vec<(&'static Setting, i64)>, String> {
    let mut out: Vec<(&'static Setting, i64)> = Vec::new();
    let mut rest = args;
    while let [name, tail @ ..] = rest {
        let shown = String::from_utf8_lossy(name);
        let Some(setting) = find(name) else {
            let known: Vec<&str> = ALL.iter().map(|s| s.name).collect();
            return Err(format!(
                "unknown argument '{shown}': flock takes {} (each optionally as flock.<name>), \
                 each followed by a value",
                known.join(", ")
            ));
        };
        let [value, after @ ..] = tail else {
            return Err(format!(
                "argument '{shown}' has no value: it must be followed by an integer from {} to {}",
                setting.min, setting.max
            ));
        };
        if out.iter().any(|(s, _)| *s == setting) {
            return Err(format!(
                "argument '{shown}' is given twice (flock.{})",
                setting.name
            ));
        }
        let v = setting
            .parse(value)
            .map_err(|e| format!("argument '{shown}': {e}"))?;
        out.push((setting, v));
        rest = after;
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn load(args: &[&str]) -> Result<Vec<(&'static str, i64)>, String> {
        let v: Vec<&[u8]> = args.iter().map(|a| a.as_bytes()).collect();
        parse_load_args(&v).map(|pairs| pairs.into_iter().map(|(s, v)| (s.name, v)).collect())
    }

    /// Load arguments and the (setting, value) pairs they set.
    type LoadCase<'a> = (&'a [&'a str], &'a [(&'a str, i64)]);

    #[test]
    fn good_load_arguments() {
        let table: &[LoadCase<'_>] = &[
            (&[], &[]),
            (&["max-ttl-ms", "60000"], &[("max-ttl-ms", 60000)]),
            (&["flock.max-ttl-ms", "60000"], &[("max-ttl-ms", 60000)]),
            (&["MAX-TTL-MS", "5000"], &[("max-ttl-ms", 5000)]),
            (&["FLOCK.Lock-Delay-Ms", "0"], &[("lock-delay-ms", 0)]),
            (
                &["max-waiters", "0", "lock-delay-ms", "86400000"],
                &[("max-waiters", 0), ("lock-delay-ms", 86_400_000)],
            ),
            (
                &["max-ttl-ms", "315360000000"],
                &[("max-ttl-ms", 315_360_000_000)],
            ),
        ];
        for (args, want) in table {
            assert_eq!(load(args), Ok(want.to_vec()), "{args:?}");
        }
    }

    #[test]
    fn bad_load_arguments_name_the_argument_and_the_range() {
        let table: &[(&[&str], &str)] = &[
            (&["bogus", "1"], "unknown argument 'bogus'"),
            (&["flock.", "1"], "unknown argument 'flock.'"),
            (&["max-ttl-ms"], "argument 'max-ttl-ms' has no value: it must be followed by an integer from 1 to 315360000000"),
            (&["max-ttl-ms", "0"], "argument 'max-ttl-ms': flock.max-ttl-ms must be an integer from 1 to 315360000000, not 0"),
            (&["max-ttl-ms", "99999999999999"], "not 99999999999999"),
            (&["max-ttl-ms", "abc"], "argument 'max-ttl-ms': flock.max-ttl-ms must be an integer from 1 to 315360000000, not 'abc'"),
            (&["max-ttl-ms", "+5"], "not '+5'"),
            (&["max-ttl-ms", "05"], "not '05'"),
            (&["lock-delay-ms", "-1"], "flock.lock-delay-ms must be an integer from 0 to 86400000, not -1"),
            (&["max-waiters", "-1"], "flock.max-waiters must be an integer from 0 to 1000000000, not -1"),
            (&["max-ttl-ms", "5", "flock.max-ttl-ms", "6"], "argument 'flock.max-ttl-ms' is given twice (flock.max-ttl-ms)"),
            (&["max-ttl-ms", "5", "bogus"], "unknown argument 'bogus'"),
        ];
        for (args, want) in table {
            match load(args) {
                Ok(v) => panic!("{args:?} loaded as {v:?}"),
                Err(e) => assert!(e.contains(want), "{args:?}: {e:?} lacks {want:?}"),
            }
        }
    }

    #[test]
    fn config_set_uses_the_same_check() {
        assert_eq!(MAX_TTL.check(1), Ok(1));
        assert!(MAX_TTL.check(0).is_err());
        assert!(MAX_TTL.check(MAX_TTL.max + 1).is_err());
        assert_eq!(LOCK_DELAY.check(0), Ok(0));
        assert!(MAX_WAITERS.check(-1).is_err());
        for s in ALL {
            assert_eq!(s.check(s.default), Ok(s.default), "{}", s.name);
        }
    }
}
