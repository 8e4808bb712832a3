//! The encoder against the decoder: every form written by [`encode_apply`] reads back through
//! `args::parse_apply` as the image it was written from; and the effect commands in the AOF
//! files of earlier versions (fixtures/) are what the encoder writes for the keys they load as.

use super::*;
use crate::args::parse_apply;
use crate::snapshot::LockImage;
use crate::state::LockState;
use crate::test_states::{every_form, T0};

fn argv_refs(argv: &[Vec<u8>]) -> Vec<&[u8]> {
    argv.iter().map(Vec::as_slice).collect()
}

#[test]
fn every_form_reads_back_as_its_image() {
    for (name, state) in every_form() {
        let snapshot = Snapshot::of(&state).expect("something to carry");
        let argv = apply_argv(b"k", snapshot);
        let image = parse_apply(&argv_refs(&argv)).unwrap_or_else(|e| panic!("{name}: {e:?}"));
        assert_eq!(image, snapshot.image(), "{name}");
        // And the state it restores to carries the same again.
        let back = image.restore(T0);
        assert_eq!(LockImage::of(&back), snapshot.image(), "{name}: restored");
    }
}

#[test]
fn short_forms_have_the_documented_shapes_and_words() {
    struct Shapes(Vec<Vec<ArgKind>>, Vec<Vec<u8>>);
    impl ApplySink for Shapes {
        fn short(&mut self, args: &[ApplyArg<'_>]) {
            assert!(args.len() <= MAX_SHORT_ARGS);
            self.0.push(args.iter().map(|a| a.kind()).collect());
        }
        fn state(&mut self, word: &'static CStr, fields: &[Vec<u8>]) {
            assert_eq!(word, STATE);
            self.1 = fields.to_vec();
        }
    }
    for (name, state) in every_form() {
        let snapshot = Snapshot::of(&state).expect("something to carry");
        let mut sink = Shapes(Vec::new(), Vec::new());
        encode_apply(snapshot, &mut sink);
        let argv = apply_argv(b"k", snapshot);
        match snapshot {
            Snapshot::Full(s) => {
                assert!(sink.0.is_empty(), "{name}");
                assert_eq!(sink.1, state_fields(s), "{name}");
                assert_eq!(argv[2], b"STATE");
            }
            Snapshot::Held(g) => {
                let shape = &sink.0[0][..];
                assert_eq!(shape, SHORT_SHAPES[usize::from(g.bound())], "{name}");
                assert_eq!(argv[2], b"GRANT");
                assert_eq!(argv.last().map(|a| &a[..] == b"BOUND"), Some(g.bound()));
            }
            Snapshot::Delayed { .. } => {
                assert_eq!(&sink.0[0][..], SHORT_SHAPES[2], "{name}");
                assert_eq!(argv[2], b"DELAY");
            }
        }
        assert_eq!(&argv[..2], [b"FLOCK.APPLY".to_vec(), b"k".to_vec()]);
    }
}

/// The commands of a RESP file (an AOF written without an RDB preamble).
fn resp_commands(mut bytes: &[u8]) -> Vec<Vec<Vec<u8>>> {
    fn line<'a>(b: &mut &'a [u8]) -> &'a [u8] {
        let end = b.windows(2).position(|w| w == b"\r\n").expect("CRLF");
        let l = &b[..end];
        *b = &b[end + 2..];
        l
    }
    let num = |l: &[u8], prefix: u8| -> usize {
        assert_eq!(l[0], prefix);
        std::str::from_utf8(&l[1..])
            .expect("ascii")
            .parse()
            .expect("count")
    };
    let mut out = Vec::new();
    while !bytes.is_empty() {
        let n = num(line(&mut bytes), b'*');
        let mut argv = Vec::with_capacity(n);
        for _ in 0..n {
            let len = num(line(&mut bytes), b'$');
            argv.push(bytes[..len].to_vec());
            assert_eq!(&bytes[len..len + 2], b"\r\n");
            bytes = &bytes[len + 2..];
        }
        out.push(argv);
    }
    out
}

/// Each `FLOCK.APPLY` of an earlier version's AOF parses, and the key it loads as is
/// written back as the very same command.
fn aof_round_trip(aof: &[u8]) -> usize {
    let mut seen = 0;
    for argv in resp_commands(aof) {
        if argv[0] != b"FLOCK.APPLY" {
            continue;
        }
        let image = parse_apply(&argv_refs(&argv)).expect("an earlier version's effect");
        let state: LockState = image.restore(T0);
        let snapshot = Snapshot::of(&state).expect("something to carry");
        assert_eq!(apply_argv(&argv[1], snapshot), argv);
        seen += 1;
    }
    seen
}

#[test]
fn v1_aof_effects_are_written_the_same_today() {
    assert_eq!(
        aof_round_trip(include_bytes!(
            "../../../../tests/fixtures/v1/aof/appendonly.aof.3.base.aof"
        )),
        4
    );
}

#[test]
fn v2_aof_effects_are_written_the_same_today() {
    assert_eq!(
        aof_round_trip(include_bytes!(
            "../../../../tests/fixtures/v2/aof/appendonly.aof.2.base.aof"
        )),
        5
    );
}

#[test]
fn the_keyless_mark_form_reads_back_and_no_key_form_is_taken_for_it() {
    use crate::args::{parse_apply, parse_apply_mark, ArgError};
    let mark = |words: &[&str]| {
        let argv: Vec<&[u8]> = words.iter().map(|w| w.as_bytes()).collect();
        parse_apply_mark(&argv)
    };
    assert_eq!(
        mark(&["FLOCK.APPLY", "MARK", "1796000000000000"]),
        Some(Ok(1_796_000_000_000_000))
    );
    assert_eq!(mark(&["FLOCK.APPLY", "mark", "7"]), Some(Ok(7)));
    // Not a token, or past 2^53: refused, never a mark.
    assert_eq!(
        mark(&["FLOCK.APPLY", "MARK", "0"]),
        Some(Err(ArgError::Token))
    );
    assert_eq!(
        mark(&["FLOCK.APPLY", "MARK", "x"]),
        Some(Err(ArgError::Token))
    );
    assert_eq!(
        mark(&["FLOCK.APPLY", "MARK", "9007199254740992"]),
        Some(Err(ArgError::Token))
    );
    // A key named MARK with one of the key forms is not the mark form.
    assert_eq!(mark(&["FLOCK.APPLY", "MARK", "DELAY", "5", "1000"]), None);
    let delay: Vec<&[u8]> = ["FLOCK.APPLY", "MARK", "DELAY", "5", "1000"]
        .iter()
        .map(|w| w.as_bytes())
        .collect();
    assert!(parse_apply(&delay).is_ok());
}
