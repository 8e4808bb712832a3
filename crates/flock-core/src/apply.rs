//! The effect command `FLOCK.APPLY`, written: what a master replicates and what AOF rewrite
//! emits for a key, as the words and values of its argument list. Its reader is
//! [`crate::args::parse_apply`]; the two live side by side so that the format has one home.
//!
//! The forms, after `FLOCK.APPLY key`:
//! - `GRANT owner token wall_deadline_ms` (and a trailing `BOUND` for a bound grant): an
//!   exclusive key held by one grant ([`Snapshot::Held`]);
//! - `DELAY last_token until_wall_ms`: an exclusive key nobody holds, in lock-delay
//!   ([`Snapshot::Delayed`]);
//! - `STATE` followed by [`crate::snapshot::state_fields`]: any other key ([`Snapshot::Full`]).
//!
//! And one form without a key: `FLOCK.APPLY MARK token`, the server's token mark (sent when a
//! promoted or restarted master raises it, and when a fork starts an AOF rewrite, so that the
//! mark travels in every persisted form and to every replica; see
//! [`crate::tokens::TokenIssuer::promote`]). No key form has a single argument after the key,
//! so the two cannot be taken for each other.
//!
//! The encoder ([`encode_apply`]) decides every word; the host only turns the arguments into
//! its own call. For `GRANT` and `DELAY` the arguments are a fixed small array of
//! [`ApplyArg`] (nothing is allocated: this is a write command's hot path); `STATE` comes as
//! its word and the list of fields.

use crate::snapshot::{state_fields, Snapshot};
use std::ffi::CStr;

/// The effect command's name.
pub const APPLY_COMMAND: &CStr = c"FLOCK.APPLY";
/// The word of the form of an exclusive key held by one grant.
pub const GRANT: &CStr = c"GRANT";
/// The trailing word of a bound grant's `GRANT` form.
pub const BOUND: &CStr = c"BOUND";
/// The word of the form of an exclusive key in lock-delay.
pub const DELAY: &CStr = c"DELAY";
/// The word of the form that carries a whole state.
pub const STATE: &CStr = c"STATE";

/// The word of the keyless form that carries the token mark (`FLOCK.APPLY MARK token`).
pub const MARK: &CStr = c"MARK";

/// The most arguments a short form (`GRANT ... BOUND`) has after the key.
pub const MAX_SHORT_ARGS: usize = 5;

/// One argument of a short form, in the three kinds a Redis format string passes (`c`, `b`,
/// `l` of `RedisModule_Replicate` / `RedisModule_EmitAOF`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ApplyArg<'a> {
    /// A fixed word (format `c`).
    Word(&'static CStr),
    /// A binary-safe string, an owner (format `b`: pointer and length).
    Bytes(&'a [u8]),
    /// An integer (format `l`: a `long long`), sent as its decimal text.
    Int(i64),
}

impl ApplyArg<'_> {
    /// The argument as the receiver sees it: its bytes (an integer as its decimal text).
    pub fn to_bytes(self) -> Vec<u8> {
        match self {
            ApplyArg::Word(w) => w.to_bytes().to_vec(),
            ApplyArg::Bytes(b) => b.to_vec(),
            ApplyArg::Int(v) => v.to_string().into_bytes(),
        }
    }
}

/// Where an encoded `FLOCK.APPLY key ...` goes: the module's replication or AOF-rewrite call,
/// or a test's argument list. The sink adds `FLOCK.APPLY` ([`APPLY_COMMAND`]) and the key
/// itself; [`encode_apply`] calls exactly one of the two methods once.
///
/// In the module (`ffi/replicate.rs`): one sink per target (a context for
/// `RedisModule_Replicate`, an AOF handle for `RedisModule_EmitAOF`), whose `short` matches
/// the argument kinds to a format string, e.g. `[Word, Bytes, Int, Int]` to `"scbll"`,
/// `[Word, Bytes, Int, Int, Word]` to `"scbllc"`, `[Word, Int, Int]` to `"scll"` (the only
/// shapes [`encode_apply`] makes: see [`SHORT_SHAPES`]), and whose `state` makes Redis strings
/// of the fields for `"scv"`.
pub trait ApplySink {
    /// A short form (`GRANT`, `DELAY`): at most [`MAX_SHORT_ARGS`] arguments after the key,
    /// the first a [`ApplyArg::Word`], in one of the [`SHORT_SHAPES`].
    fn short(&mut self, args: &[ApplyArg<'_>]);
    /// The `STATE` form: `word` ([`STATE`]) and then every field, each a string.
    fn state(&mut self, word: &'static CStr, fields: &[Vec<u8>]);
}

/// The kind of an [`ApplyArg`], without its value (to describe shapes).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ArgKind {
    Word,
    Bytes,
    Int,
}

impl ApplyArg<'_> {
    /// Its kind.
    pub fn kind(self) -> ArgKind {
        match self {
            ApplyArg::Word(_) => ArgKind::Word,
            ApplyArg::Bytes(_) => ArgKind::Bytes,
            ApplyArg::Int(_) => ArgKind::Int,
        }
    }
}

/// Every shape [`ApplySink::short`] receives: `GRANT owner token deadline`,
/// `GRANT owner token deadline BOUND`, `DELAY last_token until`.
pub const SHORT_SHAPES: [&[ArgKind]; 3] = [
    &[ArgKind::Word, ArgKind::Bytes, ArgKind::Int, ArgKind::Int],
    &[
        ArgKind::Word,
        ArgKind::Bytes,
        ArgKind::Int,
        ArgKind::Int,
        ArgKind::Word,
    ],
    &[ArgKind::Word, ArgKind::Int, ArgKind::Int],
];

/// Write `FLOCK.APPLY key ...` for `snapshot` into `sink`: the one encoder of the effect
/// command. Integers are passed as `i64` as the glue passes them (`as
/// c_longlong`): tokens are at most 2^53 - 1.
pub fn encode_apply<S: ApplySink + ?Sized>(snapshot: Snapshot<'_>, sink: &mut S) {
    match snapshot {
        Snapshot::Held(g) => {
            let args = [
                ApplyArg::Word(GRANT),
                ApplyArg::Bytes(&g.owner),
                ApplyArg::Int(g.token as i64),
                ApplyArg::Int(g.deadline.wall_ms),
                ApplyArg::Word(BOUND),
            ];
            let n = if g.bound() { 5 } else { 4 };
            sink.short(&args[..n]);
        }
        Snapshot::Delayed {
            last_token,
            until_wall_ms,
        } => sink.short(&[
            ApplyArg::Word(DELAY),
            ApplyArg::Int(last_token as i64),
            ApplyArg::Int(until_wall_ms),
        ]),
        Snapshot::Full(state) => sink.state(STATE, &state_fields(state)),
    }
}

/// A sink that writes the whole argument list down as the receiver gets it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ArgvSink {
    /// The arguments after `FLOCK.APPLY key`.
    pub args: Vec<Vec<u8>>,
}

impl ApplySink for ArgvSink {
    fn short(&mut self, args: &[ApplyArg<'_>]) {
        self.args.extend(args.iter().map(|a| a.to_bytes()));
    }

    fn state(&mut self, word: &'static CStr, fields: &[Vec<u8>]) {
        self.args.push(word.to_bytes().to_vec());
        self.args.extend(fields.iter().cloned());
    }
}

/// `FLOCK.APPLY key ...` for `snapshot` as the replica (or AOF loading) receives it, the
/// command name first: what [`crate::args::parse_apply`] reads. For tests and the fuzz
/// drivers (the module sends through its own [`ApplySink`]).
pub fn apply_argv(key: &[u8], snapshot: Snapshot<'_>) -> Vec<Vec<u8>> {
    let mut sink = ArgvSink::default();
    encode_apply(snapshot, &mut sink);
    let mut argv = Vec::with_capacity(2 + sink.args.len());
    argv.push(APPLY_COMMAND.to_bytes().to_vec());
    argv.push(key.to_vec());
    argv.append(&mut sink.args);
    argv
}

#[cfg(test)]
mod tests;
