//! The RDB layout with an in-memory tape: round trips, hand-written sequences as the code
//! before this module wrote them, truncated and corrupt input, and the RDB files earlier
//! versions wrote (fixtures/, read with a small RDB reader of their own).

use super::*;
use crate::snapshot::GrantImage;
use crate::state::Mode;
use crate::test_states::{every_form, T0};

/// One saved value, with the kind it was saved as.
#[derive(Clone, Debug, PartialEq, Eq)]
enum V {
    U(u64),
    S(i64),
    B(Vec<u8>),
}

impl RdbSink for Vec<V> {
    fn save_unsigned(&mut self, v: u64) {
        self.push(V::U(v));
    }
    fn save_signed(&mut self, v: i64) {
        self.push(V::S(v));
    }
    fn save_bytes(&mut self, b: &[u8]) {
        self.push(V::B(b.to_vec()));
    }
}

/// Reads a tape back; a read past its end or of another kind fails. `disk`: an integer read
/// as signed may have been saved as unsigned (on disk Redis keeps both as the same unsigned,
/// and `RedisModule_LoadSigned` reinterprets it).
struct Tape {
    values: Vec<V>,
    at: usize,
    disk: bool,
}

impl Tape {
    fn new(values: Vec<V>) -> Tape {
        Tape {
            values,
            at: 0,
            disk: false,
        }
    }

    fn next(&mut self) -> Option<V> {
        let v = self.values.get(self.at).cloned();
        self.at += 1;
        v
    }
}

impl RdbSource for Tape {
    fn load_unsigned(&mut self) -> Option<u64> {
        match self.next()? {
            V::U(v) => Some(v),
            _ => None,
        }
    }
    fn load_signed(&mut self) -> Option<i64> {
        match self.next()? {
            V::S(v) => Some(v),
            V::U(v) if self.disk => Some(v as i64),
            _ => None,
        }
    }
    fn load_bytes(&mut self) -> Option<Vec<u8>> {
        match self.next()? {
            V::B(b) => Some(b),
            _ => None,
        }
    }
}

fn saved(state: &LockState) -> Vec<V> {
    let mut tape = Vec::new();
    save_lock(state, &mut tape);
    tape
}

fn load(encver: i32, values: Vec<V>) -> Option<LockImage> {
    load_lock(encver, &mut Tape::new(values))
}

fn g(owner: &[u8], token: u64, deadline_wall_ms: i64, bound: bool) -> GrantImage {
    GrantImage {
        owner: owner.to_vec(),
        token,
        deadline_wall_ms,
        bound,
    }
}

#[test]
fn every_form_survives_save_and_load() {
    for (name, state) in every_form() {
        let image = load(ENCODING_VERSION, saved(&state)).unwrap_or_else(|| panic!("{name}"));
        assert_eq!(image, LockImage::of(&state), "{name}");
    }
}

#[test]
fn v2_layout_is_the_one_written_before() {
    use V::*;
    // what the module writes: mode code, limit, last token, grants (owner, token,
    // deadline, bound) in token order, delays.
    let (_, state) = every_form()
        .into_iter()
        .find(|(n, _)| *n == "permits of 3, two grants, one delay")
        .expect("the form");
    let ms = T0.wall_ms;
    let want = vec![
        U(2),
        U(3),
        U(22),
        U(2),
        B(b"j1".to_vec()),
        U(21),
        S(ms + 1000),
        U(0),
        B(b"j2".to_vec()),
        U(22),
        S(ms + 500),
        U(1),
        U(1),
        S(ms + 40),
    ];
    assert_eq!(saved(&state), want);
    let (_, held) = every_form().into_iter().next().expect("exclusive held");
    assert_eq!(
        saved(&held),
        vec![
            U(0),
            U(0),
            U(5),
            U(1),
            B(b"a".to_vec()),
            U(5),
            S(ms + 1000),
            U(0),
            U(0)
        ]
    );
}

#[test]
fn hand_written_v1_values_load() {
    use V::*;
    let held = load(1, vec![U(7), S(123), B(b"o".to_vec())]).expect("a held key");
    assert_eq!(
        held,
        LockImage {
            last_token: 7,
            grants: vec![g(b"o", 7, 123, false)],
            ..LockImage::default()
        }
    );
    let delayed = load(1, vec![U(9), S(456), B(Vec::new())]).expect("a delayed key");
    assert_eq!(
        delayed,
        LockImage {
            last_token: 9,
            delays: vec![456],
            ..LockImage::default()
        }
    );
    // What no v1 master wrote.
    assert_eq!(load(1, vec![U(0), S(1), B(b"o".to_vec())]), None, "token 0");
    assert_eq!(
        load(1, vec![U(MAX_TOKEN + 1), S(1), B(b"o".to_vec())]),
        None
    );
    assert_eq!(
        load(1, vec![U(1), S(1), B(vec![b'x'; 257])]),
        None,
        "owner too long"
    );
}

#[test]
fn hand_written_v2_values_load() {
    use V::*;
    let shared = load(
        2,
        vec![
            U(1),
            U(0),
            U(12),
            U(2),
            B(b"r1".to_vec()),
            U(11),
            S(100),
            U(0),
            B(b"r2".to_vec()),
            U(12),
            S(-5),
            U(1),
            U(2),
            S(30),
            S(10),
        ],
    )
    .expect("a shared key");
    assert_eq!(
        shared,
        LockImage {
            mode: Mode::Shared,
            last_token: 12,
            grants: vec![g(b"r1", 11, 100, false), g(b"r2", 12, -5, true)],
            delays: vec![30, 10],
        }
    );
    let delayed = load(2, vec![U(0), U(0), U(4), U(0), U(1), S(77)]).expect("delayed");
    assert_eq!(
        delayed,
        LockImage {
            last_token: 4,
            delays: vec![77],
            ..LockImage::default()
        }
    );
    let refused: [(&str, Vec<V>); 7] = [
        ("mode 3", vec![U(3), U(0), U(1), U(0), U(0)]),
        ("exclusive with a limit", vec![U(0), U(1), U(1), U(0), U(0)]),
        ("permits of 0", vec![U(2), U(0), U(1), U(0), U(0)]),
        (
            "bound mark 2",
            vec![
                U(0),
                U(0),
                U(1),
                U(1),
                B(b"a".to_vec()),
                U(1),
                S(1),
                U(2),
                U(0),
            ],
        ),
        (
            "too many grants",
            vec![U(1), U(0), U(1), U(u64::from(MAX_LIMIT) + 1)],
        ),
        ("too many delays", vec![U(1), U(0), U(1), U(0), U(u64::MAX)]),
        (
            "two slots on an exclusive key",
            vec![U(0), U(0), U(1), U(0), U(2), S(1), S(2)],
        ),
    ];
    for (name, values) in refused {
        assert_eq!(load(2, values), None, "{name}");
    }
}

#[test]
fn wrong_kinds_and_versions_load_as_nothing() {
    use V::*;
    assert_eq!(
        load(1, vec![S(7), S(1), B(b"o".to_vec())]),
        None,
        "a signed token"
    );
    assert_eq!(load(1, vec![U(7), S(1), U(1)]), None, "an integer owner");
    let (_, held) = every_form().into_iter().next().expect("exclusive held");
    for encver in [0, 3, -1, i32::MAX] {
        assert_eq!(load(encver, saved(&held)), None, "encver {encver}");
    }
}

#[test]
fn truncated_values_load_as_nothing() {
    for (name, state) in every_form() {
        let tape = saved(&state);
        for n in 0..tape.len() {
            assert_eq!(
                load(2, tape[..n].to_vec()),
                None,
                "{name}: {n} of {}",
                tape.len()
            );
        }
    }
    let v1 = [V::U(7), V::S(1), V::B(b"o".to_vec())];
    for n in 0..v1.len() {
        assert_eq!(load(1, v1[..n].to_vec()), None);
    }
}

#[test]
fn aux_round_trip_and_refusals() {
    let mut tape = Vec::new();
    save_aux(1234, &mut tape);
    assert_eq!(tape, vec![V::U(1234)]);
    for encver in [1, 2] {
        assert_eq!(load_aux(encver, &mut Tape::new(tape.clone())), Some(1234));
    }
    assert_eq!(load_aux(3, &mut Tape::new(tape.clone())), None);
    assert_eq!(load_aux(0, &mut Tape::new(tape)), None);
    assert_eq!(
        load_aux(2, &mut Tape::new(vec![V::U(MAX_TOKEN)])),
        Some(MAX_TOKEN)
    );
    assert_eq!(load_aux(2, &mut Tape::new(vec![V::U(MAX_TOKEN + 1)])), None);
    assert_eq!(load_aux(2, &mut Tape::new(Vec::new())), None);
}

#[derive(Default)]
struct Digest(Vec<V>, usize);

impl DigestSink for Digest {
    fn add_long_long(&mut self, v: i64) {
        self.0.push(V::S(v));
    }
    fn add_bytes(&mut self, b: &[u8]) {
        self.0.push(V::B(b.to_vec()));
    }
    fn end_sequence(&mut self) {
        self.1 += 1;
    }
}

#[test]
fn digest_layout() {
    use V::*;
    let ms = T0.wall_ms;
    let forms = every_form();
    let form = |name: &str| &forms.iter().find(|(n, _)| *n == name).expect(name).1;
    let digest = |state: &LockState| {
        let mut d = Digest::default();
        digest_lock(state, &mut d);
        assert_eq!(d.1, 1, "one sequence");
        d.0
    };
    // An exclusive key adds no mode (as v1 did).
    assert_eq!(
        digest(form("exclusive held")),
        vec![B(b"a".to_vec()), S(5), S(ms + 1000)]
    );
    assert_eq!(
        digest(form("exclusive bound")),
        vec![B(b"a".to_vec()), S(6), S(ms + 1000), S(1)]
    );
    assert_eq!(digest(form("exclusive delayed")), vec![S(7), S(ms + 50)]);
    // Grants in token order, delays sorted.
    assert_eq!(
        digest(form("permits of 4, delays only")),
        vec![S(2), S(4), S(31), S(ms + 10), S(ms + 20), S(ms + 30)]
    );
    assert_eq!(
        digest(form("grants pushed out of token order")),
        vec![
            S(1),
            S(0),
            B(b"early".to_vec()),
            S(41),
            S(ms + 1000),
            B(b"late".to_vec()),
            S(45),
            S(ms + 1000)
        ]
    );
    // A copy that loaded the key agrees.
    for (name, state) in &forms {
        let copy = LockImage::of(state).restore(T0);
        assert_eq!(digest(&copy), digest(state), "{name}");
    }
}

/// The module values (and the aux data) of an RDB file: a reader of just what the fixtures
/// hold (Redis 7.0, RDB version 10).
struct RdbFile<'a>(&'a [u8]);

/// A key's module value: its name, encoding version and values.
type ModuleValue = (Vec<u8>, i32, Vec<V>);

impl<'a> RdbFile<'a> {
    fn take(&mut self, n: usize) -> &'a [u8] {
        let (head, rest) = self.0.split_at(n);
        self.0 = rest;
        head
    }

    fn byte(&mut self) -> u8 {
        self.take(1)[0]
    }

    /// A length, or (`true`) the code of a specially encoded string.
    fn len(&mut self) -> (u64, bool) {
        let b = self.byte();
        match b >> 6 {
            0 => (u64::from(b & 0x3f), false),
            1 => ((u64::from(b & 0x3f) << 8) | u64::from(self.byte()), false),
            2 if b == 0x80 => (
                u64::from(u32::from_be_bytes(self.take(4).try_into().expect("4"))),
                false,
            ),
            2 if b == 0x81 => (
                u64::from_be_bytes(self.take(8).try_into().expect("8")),
                false,
            ),
            3 => (u64::from(b & 0x3f), true),
            _ => panic!("length byte {b:#x}"),
        }
    }

    fn string(&mut self) -> Vec<u8> {
        match self.len() {
            (n, false) => self.take(n as usize).to_vec(),
            (0, true) => (self.byte() as i8).to_string().into_bytes(),
            (1, true) => i16::from_le_bytes(self.take(2).try_into().expect("2"))
                .to_string()
                .into_bytes(),
            (2, true) => i32::from_le_bytes(self.take(4).try_into().expect("4"))
                .to_string()
                .into_bytes(),
            (code, true) => panic!("string encoding {code} (LZF) not expected here"),
        }
    }

    /// Module values up to their end mark: every integer as unsigned (how Redis stores both).
    fn module_values(&mut self) -> Vec<V> {
        let mut out = Vec::new();
        loop {
            match self.len().0 {
                0 => return out,
                2 => out.push(V::U(self.len().0)),
                5 => out.push(V::B(self.string())),
                op => panic!("module opcode {op}"),
            }
        }
    }

    /// (aux values, each key's module value).
    fn read(mut self) -> (Vec<V>, Vec<ModuleValue>) {
        assert_eq!(self.take(9), b"REDIS0010");
        let (mut aux, mut keys) = (Vec::new(), Vec::new());
        loop {
            match self.byte() {
                0xfa => {
                    self.string();
                    self.string();
                }
                0xf7 => {
                    self.len();
                    assert_eq!(self.len().0, 2, "the `when` of module aux data");
                    assert_eq!(self.len().0, 1, "before the keyspace");
                    aux = self.module_values();
                }
                0xfe => {
                    self.len();
                }
                0xfb => {
                    self.len();
                    self.len();
                }
                0xff => return (aux, keys),
                7 => {
                    let key = self.string();
                    let encver = (self.len().0 & 1023) as i32;
                    keys.push((key, encver, self.module_values()));
                }
                op => panic!("RDB opcode {op:#x}"),
            }
        }
    }
}

/// Each key of an earlier version's RDB file, loaded: (key, image).
fn load_file(bytes: &[u8]) -> (u64, Vec<(Vec<u8>, LockImage)>) {
    let (aux, keys) = RdbFile(bytes).read();
    let mark = load_aux(
        ENCODING_VERSION,
        &mut Tape {
            values: aux,
            at: 0,
            disk: true,
        },
    )
    .expect("mark");
    let images = keys
        .into_iter()
        .map(|(key, encver, values)| {
            let mut tape = Tape {
                values: values.clone(),
                at: 0,
                disk: true,
            };
            let image = load_lock(encver, &mut tape).unwrap_or_else(|| panic!("{key:?} loads"));
            assert_eq!(tape.at, values.len(), "every value read");
            (key, image)
        })
        .collect();
    (mark, images)
}

/// A grant as (owner, token, bound).
type Holder = (Vec<u8>, u64, bool);

fn holders(image: &LockImage) -> Vec<Holder> {
    image
        .grants
        .iter()
        .map(|g| (g.owner.clone(), g.token, g.bound))
        .collect()
}

#[test]
fn v1_rdb_file_loads() {
    let (mark, images) = load_file(include_bytes!("../../../../tests/fixtures/v1/dump.rdb"));
    assert_eq!(mark, 1_796_112_050_324_158);
    let want: [(&[u8], &[u8], u64); 4] = [
        (b"fx:held", b"worker-a", 1_796_112_043_312_069),
        (b"{fx}:tagged", b"owner with spaces", 1_796_112_043_315_934),
        (b"fx:binary", b"bin\0owner\xff", 1_796_112_050_324_158),
        (b"fx:renewed", b"worker-r", 1_796_112_043_324_004),
    ];
    assert_eq!(images.len(), want.len());
    for (key, owner, token) in want {
        let (_, image) = images.iter().find(|(k, _)| k == key).expect("the key");
        assert_eq!(image.mode, Mode::Exclusive);
        assert_eq!(
            holders(image),
            vec![(owner.to_vec(), token, false)],
            "{key:?}"
        );
        assert!(image.token() <= mark);
    }
}

#[test]
fn v2_rdb_file_loads_and_is_written_the_same_today() {
    let bytes = include_bytes!("../../../../tests/fixtures/v2/dump.rdb");
    let (mark, images) = load_file(bytes);
    assert!(mark >= 1_796_157_490_803_417);
    let binary: Vec<u8> = (0u8..40).collect();
    let h = |o: &[u8], t: u64| (o.to_vec(), t, false);
    let want: [(&[u8], Mode, Vec<Holder>); 5] = [
        (
            b"fx2:x",
            Mode::Exclusive,
            vec![h(b"writer-1", 1_796_157_490_799_778)],
        ),
        (
            b"fx2:r",
            Mode::Shared,
            vec![
                h(b"reader-1", 1_796_157_490_800_981),
                h(b"reader-2", 1_796_157_490_801_403),
            ],
        ),
        (
            b"fx2:p",
            Mode::Permits(3),
            vec![
                h(b"job-1", 1_796_157_490_801_776),
                h(b"job-2", 1_796_157_490_802_170),
            ],
        ),
        (
            b"fx2:bin",
            Mode::Exclusive,
            vec![h(&binary, 1_796_157_490_802_626)],
        ),
        (
            b"fx2:b",
            Mode::Exclusive,
            vec![(b"bound-1".to_vec(), 1_796_157_490_803_017, true)],
        ),
    ];
    assert_eq!(images.len(), want.len());
    for (key, mode, grants) in want {
        let (_, image) = images.iter().find(|(k, _)| k == key).expect("the key");
        assert_eq!((image.mode, holders(image)), (mode, grants), "{key:?}");
    }
    // Saved again today, each key is the very values of the file.
    let (_, keys) = RdbFile(bytes).read();
    for ((key, _, values), (_, image)) in keys.iter().zip(&images) {
        let state = image.clone().restore(T0);
        let on_disk: Vec<V> = saved(&state)
            .into_iter()
            .map(|v| match v {
                V::S(s) => V::U(s as u64),
                v => v,
            })
            .collect();
        assert_eq!(&on_disk, values, "{key:?}");
    }
}
