//! FLOCK.WATCH and FLOCK.WAITERS: parse, look at each key, then answer at once or block.
//! What a pair answers is flock-core's `watch` rule; the blocked watchers are kept and told
//! by `waiting/watchers.rs`.

use crate::ffi::block::{self, Found};
use crate::ffi::{self, Ctx, Key, RStr, Status};
use crate::server;
use crate::waiting::waiters;
use crate::waiting::watchers::{self, Pair, Pairs, Refused};
use flock_core::errors::Fixed;
use flock_core::watch::{self, AtCall, WatchArgError};

fn reply_arg_error(ctx: Ctx<'_>, e: WatchArgError) -> Status {
    match e {
        WatchArgError::Arity => ffi::wrong_arity(ctx),
        other => ffi::reply_error_static(ctx, other.text().text()),
    }
}

/// `FLOCK.WATCH timeout key token [key token ...]`
pub fn watch(ctx: Ctx<'_>, args: &[RStr<'_>]) -> Status {
    let argv: Vec<&[u8]> = args.iter().map(ffi::bytes).collect();
    let parsed = match watch::parse_watch(&argv) {
        Ok(p) => p,
        Err(e) => return reply_arg_error(ctx, e),
    };
    let now = server::now();
    let db = ctx.selected_db();
    // Every key first: a key of another type is an error whatever the other pairs say.
    let mut pairs = Pairs::with_capacity(parsed.pairs.len());
    let mut fired = None;
    for (i, (name, token)) in parsed.pairs.iter().enumerate() {
        let Some(key_name) = args.get(2 + 2 * i) else {
            return ffi::wrong_arity(ctx);
        };
        let key = Key::open(ctx, *key_name, false);
        let found = block::lock_of(&key);
        let state = match &found {
            Found::OtherType => return ffi::reply_error_static(ctx, Fixed::WrongType.text()),
            Found::Lock(s) => Some(&**s),
            Found::Nothing => None,
        };
        match watch::at_call(state, *token, now) {
            AtCall::Fire(f) => {
                if fired.is_none() {
                    fired = Some((*name, f));
                }
            }
            AtCall::Wait { owner } => pairs.push(Pair {
                name: Box::from(*name),
                owner: owner.map_or_else(Box::default, Box::from),
                token: *token,
                db,
                on_replica: !server::is_master(),
            }),
        }
    }
    if let Some((name, f)) = fired {
        return watchers::reply_now(ctx, name, &f);
    }
    // Inside MULTI/EXEC or a script the answer comes at once: nothing fired, so nil.
    if !waiters::can_block(ctx) {
        return ffi::reply_null(ctx);
    }
    match watchers::block(ctx, pairs, parsed.timeout_ms) {
        Ok(()) => Status::OK,
        Err(Refused::TooMany) => ffi::reply_error_static(ctx, Fixed::TooManyWatchers.text()),
        Err(Refused::Failed) => ffi::reply_error_static(ctx, Fixed::CouldNotBlock.text()),
    }
}

/// `FLOCK.WAITERS key [COUNT n]`
pub fn waiters(ctx: Ctx<'_>, args: &[RStr<'_>]) -> Status {
    let argv: Vec<&[u8]> = args.iter().map(ffi::bytes).collect();
    let count = match watch::parse_waiters(&argv) {
        Ok(c) => c,
        Err(e) => return reply_arg_error(ctx, e),
    };
    let Some(key_name) = args.get(1).copied() else {
        return ffi::wrong_arity(ctx);
    };
    let key = Key::open(ctx, key_name, false);
    if matches!(block::lock_of(&key), Found::OtherType) {
        return ffi::reply_error_static(ctx, Fixed::WrongType.text());
    }
    let queue = waiters::in_line(ctx, key_name);
    let lines = watch::waiters_reply(
        queue.iter().map(|(o, m, s)| (&**o, *m, *s)),
        count,
        server::is_master(),
        server::now().mono_us,
    );
    ffi::reply_array(ctx, lines.len());
    for l in &lines {
        ffi::reply_array(ctx, 3);
        ffi::reply_bulk(ctx, l.owner);
        ffi::reply_bulk(ctx, l.mode.as_bytes());
        ffi::reply_int(ctx, l.waited_ms as i64);
    }
    Status::OK
}
