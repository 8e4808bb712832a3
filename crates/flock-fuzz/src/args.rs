//! The argument parsers against an independent reference written from the contract
//! (docs/SPEC.md, "Errors").

use crate::bytes::Bytes;
use flock_core::args::{self, ArgError};
use flock_core::state::Mode;
use flock_core::{Now, MAX_OWNER_LEN, MAX_TOKEN};

/// Interesting argument values: limits of every range, option names, odd spellings.
const DICTIONARY: &[&[u8]] = &[
    b"0",
    b"1",
    b"-1",
    b"-0",
    b"+1",
    b"007",
    b"100",
    b"86400000",
    b"86400001",
    b"315360000000",
    b"9007199254740991",
    b"9007199254740992",
    b"9223372036854775807",
    b"9223372036854775808",
    b"-9223372036854775808",
    b"-9223372036854775809",
    b"00000000000000000001",
    b"18446744073709551616",
    b"1.5",
    b"1e3",
    b" 1",
    b"1 ",
    b"0x10",
    b"",
    b"BLOCK",
    b"block",
    b"BlOcK",
    b"GRANT",
    b"grant",
    b"DELAY",
    b"delay",
    b"SHARED",
    b"shared",
    b"LIMIT",
    b"limit",
    b"BOUND",
    b"bound",
    b"STATE",
    b"permits",
    b"exclusive",
    b"o",
    b"\0",
    b"\r\n",
    b"blpop",
    b"XREAD",
    b"xreadgroup",
    b"FLOCK.ACQUIRE",
    b"flock.fenced",
    b"Flock.",
    b"SET",
    b"MULTI",
    b"evalsha_ro",
];

fn fuzz_arg(r: &mut Bytes<'_>) -> Vec<u8> {
    match r.u8() % 8 {
        0..=3 => DICTIONARY[r.below(DICTIONARY.len())].to_vec(),
        4 => {
            // owners at and past the length limit
            let n = [0, 1, MAX_OWNER_LEN - 1, MAX_OWNER_LEN, MAX_OWNER_LEN + 1][r.below(5)];
            vec![b'x'; n]
        }
        5 => (r.u64() as i64).to_string().into_bytes(),
        _ => {
            let n = r.below(24);
            r.slice(n).to_vec()
        }
    }
}

/// The integer format of the contract: an optional '-', then 1 to 19 decimal digits without a
/// leading zero ("0" alone is zero), whose
/// value fits in a signed 64-bit integer. Written without `str::parse`, from the digits.
pub fn ref_int(b: &[u8]) -> Option<i64> {
    let (neg, digits) = match b.first() {
        Some(b'-') => (true, &b[1..]),
        _ => (false, b),
    };
    if digits.is_empty() || digits.len() > 19 || !digits.iter().all(|c| c.is_ascii_digit()) {
        return None;
    }
    // Redis's string2ll: "0" alone, else no leading zero (so no "-0" either).
    if digits[0] == b'0' && (digits.len() > 1 || neg) {
        return None;
    }
    let mut v: i128 = 0;
    for d in digits {
        v = v * 10 + i128::from(d - b'0');
    }
    if neg {
        v = -v;
    }
    i64::try_from(v).ok()
}

fn ref_owner(b: &[u8]) -> Result<&[u8], ArgError> {
    if (1..=256).contains(&b.len()) {
        Ok(b)
    } else {
        Err(ArgError::Owner)
    }
}

fn ref_ttl(b: &[u8], max: u64) -> Result<u64, ArgError> {
    match ref_int(b) {
        Some(v) if v >= 1 && (v as u64) <= max => Ok(v as u64),
        _ => Err(ArgError::Ttl { max }),
    }
}

fn ref_token(b: &[u8]) -> Result<u64, ArgError> {
    match ref_int(b) {
        Some(v) if v >= 1 => Ok(v as u64),
        _ => Err(ArgError::Token),
    }
}

/// Every parser against the reference, for one argument vector.
pub fn check_args(argv: &[&[u8]], max_ttl: u64) {
    let show = || {
        argv.iter()
            .map(|a| String::from_utf8_lossy(a).into_owned())
            .collect::<Vec<_>>()
    };
    for a in argv {
        assert_eq!(args::parse_i64(a), ref_int(a), "parse_i64({:?})", a);
    }

    // FLOCK.ACQUIRE key owner ttl [BLOCK timeout]
    let want = if argv.len() < 4 {
        Err(ArgError::Arity)
    } else {
        ref_owner(argv[2]).and_then(|owner| {
            let ttl_ms = ref_ttl(argv[3], max_ttl)?;
            let (mode, bound, block) = ref_acquire_options(&argv[4..], MAX_HOLDERS)?;
            Ok((owner, ttl_ms, mode, bound, block))
        })
    };
    let got = args::parse_acquire(argv, max_ttl, MAX_HOLDERS)
        .map(|a| (a.owner, a.ttl_ms, a.mode, a.bound, a.block));
    assert_eq!(got, want, "parse_acquire {:?} max {max_ttl}", show());
    if let Ok((owner, ttl, mode, _, _)) = got {
        assert!((1..=MAX_OWNER_LEN).contains(&owner.len()));
        assert!(ttl >= 1 && ttl <= max_ttl);
        assert!(mode.limit() <= MAX_HOLDERS);
    }

    // FLOCK.RELEASE key owner [token]
    let want = match argv.len() {
        3 => ref_owner(argv[2]).map(|o| (o, None)),
        4 => ref_owner(argv[2]).and_then(|o| Ok((o, Some(ref_token(argv[3])?)))),
        _ => Err(ArgError::Arity),
    };
    assert_eq!(
        args::parse_release(argv),
        want,
        "parse_release {:?}",
        show()
    );

    // FLOCK.RENEW key owner ttl [token]
    let want = match argv.len() {
        4 => ref_owner(argv[2]).and_then(|o| Ok((o, ref_ttl(argv[3], max_ttl)?, None))),
        5 => ref_owner(argv[2])
            .and_then(|o| Ok((o, ref_ttl(argv[3], max_ttl)?, Some(ref_token(argv[4])?)))),
        _ => Err(ArgError::Arity),
    };
    assert_eq!(
        args::parse_renew(argv, max_ttl),
        want,
        "parse_renew {:?}",
        show()
    );

    // FLOCK.CHECK key token
    let want = if argv.len() == 3 {
        ref_token(argv[2])
    } else {
        Err(ArgError::Arity)
    };
    assert_eq!(args::parse_check(argv), want, "parse_check {:?}", show());

    // FLOCK.INFO key
    let want = if argv.len() == 2 {
        Ok(())
    } else {
        Err(ArgError::Arity)
    };
    assert_eq!(args::parse_info(argv), want, "parse_info {:?}", show());

    // FLOCK.REVOKE key [owner]
    let want = match argv.len() {
        2 => Ok(None),
        3 => ref_owner(argv[2]).map(Some),
        _ => Err(ArgError::Arity),
    };
    assert_eq!(args::parse_revoke(argv), want, "parse_revoke {:?}", show());

    // FLOCK.APPLY: tokens must be usable (1 to 2^53-1), deadlines any i64.
    let effect_token = |b: &[u8]| match ref_token(b) {
        Ok(t) if t <= MAX_TOKEN => Ok(t),
        _ => Err(ArgError::Token),
    };
    let got = args::parse_apply(argv);
    let short_form = argv.len() >= 3
        && (argv[2].eq_ignore_ascii_case(b"grant") || argv[2].eq_ignore_ascii_case(b"delay"));
    match &got {
        Ok(image) if short_form && argv[2].eq_ignore_ascii_case(b"grant") => {
            assert!(
                matches!(argv.len(), 6 | 7),
                "GRANT with {} args",
                argv.len()
            );
            assert_eq!(image.mode, Mode::Exclusive);
            let [g] = &image.grants[..] else {
                panic!("GRANT gave {image:?}");
            };
            assert_eq!(Ok(&g.owner[..]), ref_owner(argv[3]));
            assert_eq!(Ok(g.token), effect_token(argv[4]));
            assert_eq!(Some(g.deadline_wall_ms), ref_int(argv[5]));
            assert!(image.delays.is_empty());
            assert_eq!(g.bound, argv.len() == 7, "the BOUND mark of {:?}", show());
        }
        Ok(image) if short_form => {
            assert_eq!(argv.len(), 5, "DELAY with {} args", argv.len());
            assert_eq!(Ok(image.last_token), effect_token(argv[3]));
            assert_eq!(image.delays, vec![ref_int(argv[4]).expect("until")]);
            assert!(image.grants.is_empty());
        }
        Ok(image) => {
            // STATE: what is accepted writes back as the same fields (the master's form).
            assert!(argv[2].eq_ignore_ascii_case(b"state"), "{:?}", show());
            let state = image.clone().restore(Now::new(1_000_000, 0));
            let fields = flock_core::snapshot::state_fields(&state);
            let mut again: Vec<&[u8]> = argv[..3].to_vec();
            again.extend(fields.iter().map(|f| &f[..]));
            assert_eq!(args::parse_apply(&again).as_ref(), Ok(image));
        }
        Err(e) => {
            // A well-formed effect must never be refused.
            let grant_ok = argv.len() == 6
                && argv[2].eq_ignore_ascii_case(b"grant")
                && ref_owner(argv[3]).is_ok()
                && effect_token(argv[4]).is_ok()
                && ref_int(argv[5]).is_some();
            let delay_ok = argv.len() == 5
                && argv[2].eq_ignore_ascii_case(b"delay")
                && effect_token(argv[3]).is_ok()
                && ref_int(argv[4]).is_some();
            assert!(
                !grant_ok && !delay_ok,
                "parse_apply refused {:?}: {e:?}",
                show()
            );
        }
    }

    // Error texts: every one is a proper error reply.
    for e in [
        ArgError::Arity,
        ArgError::Syntax,
        ArgError::Owner,
        ArgError::Ttl { max: max_ttl },
        ArgError::Timeout,
        ArgError::Token,
        ArgError::Limit { max: MAX_HOLDERS },
        ArgError::BoundNeedsClient,
    ] {
        let m = e.message();
        assert!(m.starts_with("ERR "), "{m}");
        assert!(!m.contains('\r') && !m.contains('\n') && !m.contains('\0'));
    }

    // FENCED refusals: every FLOCK command, every blocking or transaction command, in any
    // case; XREAD/XREADGROUP only with BLOCK.
    if let Some((cmd, rest)) = argv.split_first() {
        let lower = cmd.to_ascii_lowercase();
        let refused = args::fenced_refusal(cmd, rest).is_some();
        let must = lower.starts_with(b"flock.")
            || [
                &b"blpop"[..],
                b"brpop",
                b"brpoplpush",
                b"blmove",
                b"blmpop",
                b"bzpopmin",
                b"bzpopmax",
                b"bzmpop",
                b"multi",
                b"exec",
                b"watch",
                b"eval",
                b"evalsha",
                b"eval_ro",
                b"evalsha_ro",
                b"fcall",
                b"fcall_ro",
                b"subscribe",
                b"psubscribe",
                b"ssubscribe",
                b"monitor",
                b"wait",
                b"waitaof",
                b"shutdown",
            ]
            .contains(&lower.as_slice())
            || ((lower == b"xread" || lower == b"xreadgroup")
                && rest.iter().any(|a| a.eq_ignore_ascii_case(b"block")));
        if must {
            assert!(refused, "FENCED must refuse {:?}", show());
        }
        let may_run =
            [&b"set"[..], b"get", b"incr", b"del", b"hset", b"rpush"].contains(&lower.as_slice());
        if may_run {
            assert!(!refused, "FENCED must run {:?}", show());
        }
    }
}

/// `flock.max-holders` in these checks.
const MAX_HOLDERS: u32 = 100;

/// ACQUIRE's options by the contract: SHARED, BOUND, LIMIT n and BLOCK timeout, any order,
/// each at most once, not SHARED with LIMIT (else a syntax error); then LIMIT's value from 1
/// to `max_holders` and BLOCK's from 0.
#[allow(clippy::type_complexity)]
fn ref_acquire_options(
    opts: &[&[u8]],
    max_holders: u32,
) -> Result<(Mode, bool, Option<u64>), ArgError> {
    let mut seen: Vec<Vec<u8>> = Vec::new();
    let (mut limit, mut block) = (None, None);
    let mut i = 0;
    while i < opts.len() {
        let name = opts[i].to_ascii_uppercase();
        if seen.contains(&name) {
            return Err(ArgError::Syntax);
        }
        match &name[..] {
            b"SHARED" | b"BOUND" => i += 1,
            b"LIMIT" | b"BLOCK" => {
                let value = *opts.get(i + 1).ok_or(ArgError::Syntax)?;
                if name == b"LIMIT" {
                    limit = Some(value);
                } else {
                    block = Some(value);
                }
                i += 2;
            }
            _ => return Err(ArgError::Syntax),
        }
        seen.push(name);
    }
    let has = |n: &[u8]| seen.iter().any(|s| s == n);
    if has(b"SHARED") && has(b"LIMIT") {
        return Err(ArgError::Syntax);
    }
    let mode = match limit {
        Some(v) => match ref_int(v) {
            Some(n) if n >= 1 && n <= i64::from(max_holders) => Mode::Permits(n as u32),
            _ => return Err(ArgError::Limit { max: max_holders }),
        },
        None if has(b"SHARED") => Mode::Shared,
        None => Mode::Exclusive,
    };
    let block = match block {
        Some(t) => match ref_int(t) {
            Some(v) if v >= 0 => Some(v as u64),
            _ => return Err(ArgError::Timeout),
        },
        None => None,
    };
    Ok((mode, has(b"BOUND"), block))
}

/// libFuzzer target: one argument vector per input (the first byte picks `flock.max-ttl-ms`).
pub fn args_target(data: &[u8]) {
    let mut r = Bytes::new(data);
    let max_ttl = match r.u8() % 4 {
        0 => 86_400_000,
        1 => 1,
        2 => 315_360_000_000,
        _ => 1 + u64::from(r.u32()),
    };
    let argc = r.below(9);
    let owned: Vec<Vec<u8>> = (0..argc).map(|_| fuzz_arg(&mut r)).collect();
    let argv: Vec<&[u8]> = owned.iter().map(|a| a.as_slice()).collect();
    check_args(&argv, max_ttl);
}
