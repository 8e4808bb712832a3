//! Rule 11 of docs/CLIENTS.md: which live leases a `Flock` handed out, per key, so that one
//! grant never gets two lease objects (the same owner acquiring again is `Error::Busy`, or with
//! `reentrant(true)` one more hold of the same lease) and a task never waits on a lease it
//! holds itself. Leases are kept by weak reference: a forgotten lease is still dropped (and
//! released in the background).

use std::collections::HashMap;
use std::sync::{Arc, Mutex, Weak};

use crate::error::{invalid, Error, Result};
use crate::lease::Lease;
use crate::options::{LockOptions, Mode};
use crate::state::{Caller, State};
use crate::sync::lock;

/// A `Flock`'s live leases by key.
#[derive(Default)]
pub(crate) struct Held {
    by_key: Mutex<HashMap<String, Vec<Weak<State>>>>,
    /// When the map has this many keys, the keys without a live lease are dropped (so that a
    /// process locking ever new keys does not keep one entry per key it ever held).
    sweep_at: Mutex<usize>,
}

const SWEEP_MIN: usize = 1024;

/// What rule 11 says of an acquire, before anything is sent.
pub(crate) enum Reentry {
    /// Nothing held that matters: acquire as usual, with this owner when one was found
    /// (a reentrant acquire without an owner takes its task's).
    Acquire {
        owner: Option<String>,
        /// A wait would wait on a lease of the caller's own task: one try, then `Busy`.
        own_wait: bool,
    },
    /// Another hold of a lease already held (`reentrant(true)`).
    Again(Lease),
}

impl Held {
    /// The live (neither lost nor released) leases of `key`; drops the others.
    fn live(&self, key: &str) -> Vec<Arc<State>> {
        let mut map = lock(&self.by_key);
        let Some(list) = map.get_mut(key) else {
            return Vec::new();
        };
        let mut out = Vec::new();
        list.retain(|w| match w.upgrade() {
            Some(st) if !st.is_released() && !st.is_lost() => {
                out.push(st);
                true
            }
            _ => false,
        });
        if list.is_empty() {
            map.remove(key);
        }
        out
    }

    /// Rule 11 for an acquire of `key` with `opts`.
    pub(crate) fn reenter(&self, key: &str, opts: &LockOptions) -> Result<Reentry> {
        let held = self.live(key);
        if held.is_empty() {
            return Ok(Reentry::Acquire {
                owner: opts.owner.clone(),
                own_wait: false,
            });
        }
        let caller = Caller::current();
        let mine = |st: &State| st.task == caller;
        let owner = match &opts.owner {
            Some(o) => Some(o.clone()),
            // A reentrant acquire without an owner: the owner of the lease this task holds.
            None if opts.reentrant => held
                .iter()
                .find(|st| st.reentrant && mine(st))
                .map(|st| st.owner.clone()),
            None => None,
        };
        let mut own_wait = false;
        for st in &held {
            if owner.as_deref() == Some(st.owner.as_str()) {
                if !opts.reentrant {
                    return Err(Error::Busy);
                }
                if st.mode != opts.mode || st.bound != opts.bound {
                    return Err(invalid(format!(
                        "a reentrant acquire of {key:?} asks for another kind ({}) than the \
                         held lease ({})",
                        kind(opts.mode, opts.bound),
                        kind(st.mode, st.bound)
                    )));
                }
                if let Some(lease) = Lease::again(st) {
                    return Ok(Reentry::Again(lease));
                }
            }
            if mine(st) {
                own_wait = true;
            }
        }
        Ok(Reentry::Acquire { owner, own_wait })
    }

    /// A new lease of this `Flock`.
    pub(crate) fn add(&self, lease: &Lease) {
        let st = lease.state();
        let mut map = lock(&self.by_key);
        let list = map.entry(st.key.clone()).or_default();
        list.retain(|w| w.upgrade().is_some_and(|s| !s.is_released()));
        list.push(Arc::downgrade(st));
        let mut sweep_at = lock(&self.sweep_at);
        if map.len() >= (*sweep_at).max(SWEEP_MIN) {
            map.retain(|_, list| {
                list.retain(|w| w.upgrade().is_some_and(|s| !s.is_released()));
                !list.is_empty()
            });
            // Amortized: the next sweep after the map doubled again.
            *sweep_at = map.len() * 2;
        }
    }
}

fn kind(mode: Mode, bound: bool) -> String {
    let m = match mode {
        Mode::Exclusive => "exclusive".to_string(),
        Mode::Shared => "shared".to_string(),
        Mode::Permits(n) => format!("limit {n}"),
    };
    if bound {
        format!("{m}, bound")
    } else {
        m
    }
}
