//! The value stored under a lock key: one allocation per lock.
//!
//! A lock's block is a 32-byte [`Head`], then the owner (in the compact form), then the key's
//! name (which the deadline index needs to find the key again, so that the index keeps no
//! copy of its own). The head holds what this server keeps beside the state (the deadline
//! index position, the FLOCK.STATS class, the database) and the state itself in one of three
//! forms:
//! - **compact**: the key's one grant when that is all the key is (exclusive or shared, no
//!   lock-delay, nobody waiting: `LockState::lone_grant`): token, deadline, start time, and
//!   the owner's bytes after the head; a block made for a BOUND grant ends with 8 bytes more
//!   for its binding. Most locks, most of the time. In a **narrow** block (most) the token
//!   and the times are packed into 16 bytes of the head ([`Narrow`]: exact, or not used); a
//!   grant that does not pack so (a lease or a holding longer than 12.7 days, a clock stepped
//!   by more than 32 s since the module started, a loaded or replicated grant more than 8 s
//!   old; tokens running ahead of the clock after a raised mark are measured from an anchor
//!   instead: [`anchors`]), a name over 255 bytes or a database past 255 make a **wide** block, whose head is
//!   followed by a 16-byte [`Ext`] (48 bytes in all, as every head was before). With a
//!   36-byte owner and a 12-byte name a held lock is one 80-byte allocation (96 when bound).
//! - **empty**: no grant (a key about to be deleted).
//! - **full**: a pointer to a boxed [`LockRecord`] (any state, and the waiters' key).
//!
//! The engine works on a `LockState`; [`lock_mut`] hands one out for the length of a command
//! (the compact form decoded, the full one borrowed) and stores it back in the best form that
//! fits when the [`LockMut`] goes. Reached only through an open [`Key`], whose borrow bounds
//! every access to the block.
//!
//! The layout is private to this file, and so is every unsafe method on a block. The safe
//! API ([`RecordPtr`]'s public methods, [`lock_of`], [`lock_mut`], [`lone_of`], [`create`],
//! [`create_lone`], [`rename_in`]) rests on one invariant, argued here once: **a
//! [`RecordPtr`] names a live block.** It holds because
//! - a `RecordPtr` is made only in this folder, from a live block of ours: the value of an
//!   open key of our type (`block_of`), a block just allocated, or a value Redis hands to a
//!   callback of our type;
//! - safe code keeps one only while its block lives: for the length of a command or callback
//!   that holds the key open (Redis runs module code on its main thread, one callback at a
//!   time, and only the key's deletion or overwrite frees the block), and in the deadline
//!   index (`store/expiry.rs`), which lets go of a block before it is freed: the type's free
//!   takes it out on the main thread (`free_effort` makes every per-key free synchronous), a
//!   flush takes its databases' entries out before freeing their values (possibly on a
//!   lazy-free thread), and a server that becomes a replica empties the index. An entry that
//!   comes due leaves the index and is only compared with the key's value ([`Key::holds`]),
//!   never read through;
//! - a block is freed only by the type's free callback (`lock_type.rs`) and by this file
//!   (a block Redis refused, the old block of a renamed lock), never by safe code.

use super::server;
use flock_core::deadlines::NOWHERE;
use flock_core::engine::LoneGrant;
use flock_core::lock_stats::ClassRef;
use flock_core::state::Mode;
use flock_core::{Deadline, Grant, LockState};
use std::alloc::{self, Layout};
use std::ops::Deref;
use std::os::raw::{c_int, c_void};
use std::ptr::{self, NonNull};
use std::sync::OnceLock;

/// A key by database and name, owned (it outlives commands: waiter queues, deferred jobs).
pub type KeyId = (c_int, Vec<u8>);

/// A lock's state in any form, with the waiters' key: what the full form boxes, and what a
/// command works on.
#[derive(Debug, Default)]
pub struct LockRecord {
    pub state: LockState,
    /// Set once clients wait for this value's key (and only then are the wait queues
    /// consulted, which keeps the uncontended path off the registry): the key to look at
    /// again when the value is freed (deleted, overwritten by another type, flushed, evicted).
    pub watched: Option<Box<KeyId>>,
}

// ---------------------------------------------------------------------------------------------
// The block
// ---------------------------------------------------------------------------------------------

const FORM_EMPTY: u8 = 0;
const FORM_COMPACT: u8 = 1;
const FORM_FULL: u8 = 2;
const FORM_MASK: u8 = 0b11;
/// Compact: the grant is a shared one (else exclusive).
const SHARED: u8 = 0b100;
/// The block ends with an 8-byte area for a compact grant's BOUND mark and binding (made so
/// when its first grant was bound; an unbound grant leaves it 0).
const TIE_AREA: u8 = 0b1000;
/// The head is followed by an [`Ext`]: the block was made for a grant whose times or token
/// do not pack in 16 bytes ([`Narrow`]), a name over 255 bytes or a database past 255.
const WIDE: u8 = 0b1_0000;
/// The block carries its key's name and database (blocks made by RDB loading, RESTORE and
/// COPY get them when they are first armed).
const NAMED: u8 = 0b1000_0000;
/// What a block keeps of its flags whatever its form.
const KEPT: u8 = NAMED | TIE_AREA | WIDE;

/// A compact lock's one grant in a narrow block: token and times packed in two words.
/// - `w0`: the monotonic deadline (bits 0..48: 8.9 years of microseconds), then the wall
///   clock's offset from it (bits 48..64, signed milliseconds: see [`wall_delta`]);
/// - `w1`: the deadline minus the start time (bits 0..40: 12.7 days of microseconds), then
///   the token's distance from the start time on the wall clock (bits 40..64, signed
///   microseconds: see [`token_guess`]).
///
/// A grant whose fields do not pack so exactly goes to a wide block (a new block) or to the
/// full form (a narrow block's next state): the packing is exact or not used.
#[repr(C)]
#[derive(Clone, Copy)]
struct Narrow {
    w0: u64,
    w1: u64,
}

const DEADLINE_BITS: u32 = 48;
const SINCE_BITS: u32 = 40;
/// The token's distance: the 24 bits above the start time's 40.
const TOKEN_SPAN: i64 = 1 << (64 - SINCE_BITS - 1);

/// A compact lock's one grant in a wide block: the times here, the token and the wall
/// clock's offset in the [`Ext`].
#[repr(C)]
#[derive(Clone, Copy)]
struct WideTimes {
    deadline_mono_us: u64,
    since_mono_us: u64,
}

#[repr(C)]
union Body {
    narrow: Narrow,
    wide: WideTimes,
    full: *mut LockRecord,
}

/// The block's head (32 bytes); a wide block's [`Ext`] follows it.
#[repr(C)]
pub struct Head {
    class: ClassRef,
    /// Where the block's deadline-index entry sits ([`NOWHERE`]: not armed).
    pos: u32,
    /// `FORM_*`, `SHARED`, `TIE_AREA`, `WIDE` and `NAMED`.
    flags: u8,
    /// Bytes between the head (and ext) and the name: the compact form's owner (its length),
    /// left as they are when the block changes form (the block's size never changes).
    owner_area: u8,
    /// Narrow: the name's length, then the database. Wide: the database (little-endian u16;
    /// the name's length is in the [`Ext`]).
    small: [u8; 2],
    body: Body,
}

/// What a wide block keeps after its head.
#[repr(C)]
struct Ext {
    /// Compact: the token.
    token: u64,
    name_len: u32,
    /// Compact: the deadline's wall-clock time, as milliseconds from the monotonic deadline
    /// plus [`wall_base`] (exact: the wall deadline travels, G7, and DEBUG DIGEST shows it).
    wall_delta: i32,
}

const _: () = assert!(std::mem::size_of::<Head>() == 32);
const _: () = assert!(std::mem::size_of::<Ext>() == 16);
const _: () = assert!(std::mem::align_of::<Ext>() <= std::mem::align_of::<Head>());

/// A record as Redis stores it (the value pointer of a key of our type): a live block (the
/// invariant in the module docs), read and written through the safe methods below.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RecordPtr(NonNull<Head>);

// SAFETY: records are touched only on Redis's main thread (and freed on a lazy-free thread
// only after the deadline index has let go of them); the index that holds these pointers sits
// behind a mutex because it is a static.
unsafe impl Send for RecordPtr {}

/// `wall_ms - mono_ms` when this process first needed it: compact deadlines keep their wall
/// time as an offset from the monotonic deadline plus this (32 bits in a wide block: enough
/// for any deadline within 24 days of what the clocks said then, beyond which the lock takes
/// the full form; 16 bits in a narrow one: 32 s, beyond which the grant takes a wide block).
fn wall_base() -> i64 {
    static BASE: OnceLock<i64> = OnceLock::new();
    *BASE.get_or_init(|| {
        let now = server::now();
        now.wall_ms - (now.mono_us / 1000) as i64
    })
}

fn wall_delta(d: Deadline) -> Option<i32> {
    let mono_ms = i64::try_from(d.mono_us / 1000).ok()?;
    i32::try_from(d.wall_ms.checked_sub(mono_ms)?.checked_sub(wall_base())?).ok()
}

/// The token a grant that started at `since_mono_us` would have if it was issued then, on
/// this server, from the wall clock (`token = max(high water + 1, wall clock in us)`): the
/// start time moved to the wall clock by the offset its deadline keeps, or the token anchor
/// of that start time when tokens ran ahead of the clock then ([`anchors`]). A grant made here
/// is within a millisecond of it (or a few grants past its anchor); one that arrived (loaded,
/// replicated) is behind it by its age. `None`: out of range.
fn token_guess(since_mono_us: u64, wall_delta: i32) -> Option<i64> {
    let offset_ms = wall_base().checked_add(i64::from(wall_delta))?;
    let clock = i64::try_from(since_mono_us)
        .ok()?
        .checked_add(offset_ms.checked_mul(1000)?)?;
    Some(clock.max(i64::try_from(anchors::base_for(since_mono_us)).ok()?))
}

/// A compact grant's token and times, as a block keeps them.
#[derive(Clone, Copy)]
struct Times {
    token: u64,
    deadline_mono_us: u64,
    since_mono_us: u64,
    wall_delta: i32,
}

impl Times {
    /// `None`: the wall deadline is too far from the monotonic one (the full form).
    fn of(g: &Grant) -> Option<Times> {
        Some(Times {
            token: g.token,
            deadline_mono_us: g.deadline.mono_us,
            since_mono_us: g.since_mono_us,
            wall_delta: wall_delta(g.deadline)?,
        })
    }

    /// Packed for a narrow block, when every field fits exactly.
    fn narrow(self) -> Option<Narrow> {
        let deadline = self.deadline_mono_us;
        let wall = i16::try_from(self.wall_delta).ok()?;
        let since_d = deadline.checked_sub(self.since_mono_us)?;
        let token_d = i64::try_from(self.token)
            .ok()?
            .checked_sub(token_guess(self.since_mono_us, self.wall_delta)?)?;
        if token_d >= TOKEN_SPAN {
            // Tokens run ahead of the clock (a raised mark): the grants after this one are
            // measured from it.
            anchors::ahead(self.token);
        }
        if deadline >> DEADLINE_BITS != 0
            || since_d >> SINCE_BITS != 0
            || !(-TOKEN_SPAN..TOKEN_SPAN).contains(&token_d)
        {
            return None;
        }
        Some(Narrow {
            w0: deadline | (u64::from(wall as u16) << DEADLINE_BITS),
            w1: since_d | ((token_d as u64) << SINCE_BITS),
        })
    }

    fn deadline(self) -> Deadline {
        Deadline {
            wall_ms: (self.deadline_mono_us / 1000) as i64
                + wall_base()
                + i64::from(self.wall_delta),
            mono_us: self.deadline_mono_us,
        }
    }
}

impl Narrow {
    /// The fields back, exactly as [`Times::narrow`] packed them (wrapping arithmetic: the
    /// packing checked that none of it wraps).
    fn times(self) -> Times {
        let deadline_mono_us = self.w0 & ((1 << DEADLINE_BITS) - 1);
        let wall_delta = i32::from((self.w0 >> DEADLINE_BITS) as u16 as i16);
        let since_mono_us = deadline_mono_us.wrapping_sub(self.w1 & ((1 << SINCE_BITS) - 1));
        let token_d = (self.w1 as i64) >> SINCE_BITS;
        let clock = (since_mono_us as i64).wrapping_add(
            wall_base()
                .wrapping_add(i64::from(wall_delta))
                .wrapping_mul(1000),
        );
        // As `token_guess` (the packing checked that the anchor fits an i64).
        let guess = clock.max(anchors::base_for(since_mono_us) as i64);
        Times {
            token: guess.wrapping_add(token_d) as u64,
            deadline_mono_us,
            since_mono_us,
            wall_delta,
        }
    }
}

const TIE_BYTES: usize = 8;

fn layout(owner_area: usize, name_len: usize, tie_area: bool, wide: bool) -> Option<Layout> {
    let size = std::mem::size_of::<Head>()
        .checked_add(if wide { std::mem::size_of::<Ext>() } else { 0 })?
        .checked_add(owner_area)?
        .checked_add(name_len)?
        .checked_add(if tie_area { TIE_BYTES } else { 0 })?;
    Layout::from_size_align(size, std::mem::align_of::<Head>()).ok()
}

/// The shape of a block: what its compact form can hold.
#[derive(Clone, Copy)]
struct Area {
    owner: usize,
    tie: bool,
    wide: bool,
}

/// A compact grant written for a block of one shape.
#[derive(Clone, Copy)]
enum Packed {
    Narrow(Narrow),
    Wide(Times),
}

/// What a block is made of, in the form it will take.
enum Form<'a> {
    Empty,
    Compact {
        shared: bool,
        grant: &'a Grant,
        times: Times,
    },
    Full,
}

/// The form `rec` can take in a block of shape `area` (`None`: any, for a new block).
fn form_for(rec: &LockRecord, area: Option<Area>) -> Form<'_> {
    if rec.watched.is_some() {
        return Form::Full;
    }
    let state = &rec.state;
    if state.grants().is_empty() && state.delays.is_empty() {
        return Form::Empty;
    }
    if let Some((mode, g)) = state.lone_grant() {
        if let Some(times) = Times::of(g) {
            let fits = match area {
                Some(a) => {
                    g.owner.len() == a.owner
                        && (a.tie || g.tie_word() == 0)
                        && (a.wide || times.narrow().is_some())
                }
                None => g.owner.len() <= usize::from(u8::MAX),
            };
            if fits {
                return Form::Compact {
                    shared: mode == Mode::Shared,
                    grant: g,
                    times,
                };
            }
        }
    }
    Form::Full
}

impl RecordPtr {
    fn head(self) -> *mut Head {
        self.0.as_ptr()
    }

    /// The pointer Redis stores.
    pub(in crate::ffi) fn as_value(self) -> *mut c_void {
        self.head().cast()
    }

    /// # Safety
    /// `value` must be a live block of this module (a value of our type).
    pub(in crate::ffi) unsafe fn from_value(value: *mut c_void) -> Option<RecordPtr> {
        NonNull::new(value.cast::<Head>()).map(RecordPtr)
    }

    /// A new block for `rec` (named `db`/`name` when given), with an empty class and no index
    /// entry. `None`: out of memory (`rec` is dropped).
    pub(in crate::ffi) fn new(
        rec: LockRecord,
        name: Option<(c_int, &[u8])>,
        class: ClassRef,
    ) -> Option<Self> {
        RecordPtr::new_with(&mut Some(rec), name, class)
    }

    /// A new named block holding `grant` alone (exclusive or shared), in the compact form
    /// (the full form when it does not fit one: a permit, an owner over 255 bytes, a deadline
    /// too far out).
    #[inline(always)]
    fn new_lone(
        grant: &Grant,
        mode: Mode,
        db: c_int,
        name: &[u8],
        class: ClassRef,
    ) -> Option<Self> {
        let fits = grant.owner.len() <= usize::from(u8::MAX) && !matches!(mode, Mode::Permits(_));
        let (Some(times), true) = (Times::of(grant), fits) else {
            return RecordPtr::new_full(grant, mode, db, name, class);
        };
        let this = RecordPtr::alloc(
            Area {
                owner: grant.owner.len(),
                tie: grant.tie_word() != 0,
                wide: times.narrow().is_none(),
            },
            Some((db, name)),
            class,
        )?;
        // SAFETY: a fresh block whose owner area is the owner's length, with a tie area when
        // the grant has a tie word; its body holds no box.
        match unsafe { this.pack(times) } {
            Some(packed) => {
                // SAFETY: as above, `packed` made for this block.
                unsafe { this.write_compact(grant, mode == Mode::Shared, packed) };
                Some(this)
            }
            None => {
                // (Not reached: a block is made wide when the grant does not pack narrow.)
                // SAFETY: a fresh block, only ours.
                drop(unsafe { this.free() });
                RecordPtr::new_full(grant, mode, db, name, class)
            }
        }
    }

    /// [`RecordPtr::new_lone`]'s block in the full form.
    // Not reached by a grant of a new key in practice: out of the hot ACQUIRE's code.
    #[cold]
    #[inline(never)]
    fn new_full(
        grant: &Grant,
        mode: Mode,
        db: c_int,
        name: &[u8],
        class: ClassRef,
    ) -> Option<Self> {
        let rec = LockRecord {
            state: LockState::with_grant(mode, grant.clone()),
            watched: None,
        };
        RecordPtr::new(rec, Some((db, name)), class)
    }

    /// [`RecordPtr::new`] that leaves `rec` in place when it makes no block (and takes it
    /// when it does).
    fn new_with(
        slot: &mut Option<LockRecord>,
        name: Option<(c_int, &[u8])>,
        class: ClassRef,
    ) -> Option<Self> {
        let rec = slot.as_ref()?;
        let area = match form_for(rec, None) {
            Form::Compact { grant, times, .. } => Area {
                owner: grant.owner.len(),
                tie: grant.tie_word() != 0,
                wide: times.narrow().is_none(),
            },
            _ => Area {
                owner: 0,
                tie: false,
                wide: false,
            },
        };
        let this = RecordPtr::alloc(area, name, class)?;
        if let Some(rec) = slot.take() {
            // SAFETY: a fresh block in the empty form: its body holds no box.
            unsafe { this.store(rec) };
        }
        Some(this)
    }

    /// A fresh block in the empty form, with room for an owner of `area.owner` bytes (and a
    /// tie word when `area.tie`), wide when `area.wide` or when the name or the database does
    /// not fit a narrow head, its name written (named when its database fits), no index
    /// entry.
    #[inline(always)]
    fn alloc(area: Area, name: Option<(c_int, &[u8])>, class: ClassRef) -> Option<Self> {
        let name_bytes = name.map_or(&[][..], |(_, n)| n);
        let name_len = u32::try_from(name_bytes.len()).ok()?;
        let owner_len = u8::try_from(area.owner).ok()?;
        let db = name.and_then(|(db, _)| u16::try_from(db).ok());
        let narrow_small = match (u8::try_from(name_len), db.map(u8::try_from)) {
            (Ok(len), None) => Some([len, 0]),
            (Ok(len), Some(Ok(db))) => Some([len, db]),
            _ => None,
        };
        let (wide, small) = match narrow_small {
            Some(small) if !area.wide => (false, small),
            _ => (true, db.unwrap_or(0).to_le_bytes()),
        };
        let layout = layout(area.owner, name_bytes.len(), area.tie, wide)?;
        // SAFETY: the layout's size is at least the head's 32 bytes.
        let block = NonNull::new(unsafe { alloc::alloc(layout) }.cast::<Head>())?;
        let head = Head {
            class,
            pos: NOWHERE,
            flags: FORM_EMPTY
                | if db.is_some() { NAMED } else { 0 }
                | if area.tie { TIE_AREA } else { 0 }
                | if wide { WIDE } else { 0 },
            owner_area: owner_len,
            small,
            body: Body {
                narrow: Narrow { w0: 0, w1: 0 },
            },
        };
        let this = RecordPtr(block);
        // SAFETY: a fresh allocation of the block's layout: the head, a wide block's ext and
        // the name fit.
        unsafe {
            block.as_ptr().write(head);
            if wide {
                this.ext().write(Ext {
                    token: 0,
                    name_len,
                    wall_delta: 0,
                });
            }
            ptr::copy_nonoverlapping(name_bytes.as_ptr(), this.name_ptr(), name_bytes.len());
        }
        Some(this)
    }

    /// `times` packed for this block's shape; `None`: they do not fit a narrow block.
    ///
    /// # Safety
    /// `self` must be a live block.
    unsafe fn pack(self, times: Times) -> Option<Packed> {
        // SAFETY: by the caller.
        if unsafe { self.wide() } {
            Some(Packed::Wide(times))
        } else {
            times.narrow().map(Packed::Narrow)
        }
    }

    /// Put `grant` in the block as its compact form (shared or exclusive), keeping the
    /// block's NAMED, TIE_AREA and WIDE marks.
    ///
    /// # Safety
    /// `self` must be a live block whose owner area is `grant`'s owner's length, whose tie
    /// area (if any) may take the grant's tie word (a grant with one needs it), whose body
    /// holds no box, and `packed` must be [`RecordPtr::pack`]'s for this block.
    unsafe fn write_compact(self, grant: &Grant, shared: bool, packed: Packed) {
        // SAFETY: by the caller. The owner is always written (a few bytes): a new block's
        // owner area is not yet initialised, so it is never read before.
        unsafe {
            let head = self.head();
            ptr::copy_nonoverlapping(grant.owner.as_ptr(), self.tail(), self.owner_area());
            if self.tie_area() {
                self.tie_ptr().write_unaligned(grant.tie_word());
            }
            match packed {
                Packed::Narrow(n) => (*head).body.narrow = n,
                Packed::Wide(t) => {
                    let ext = self.ext();
                    (*ext).token = t.token;
                    (*ext).wall_delta = t.wall_delta;
                    (*head).body.wide = WideTimes {
                        deadline_mono_us: t.deadline_mono_us,
                        since_mono_us: t.since_mono_us,
                    };
                }
            }
            let kept = (*head).flags & KEPT;
            (*head).flags = FORM_COMPACT | kept | if shared { SHARED } else { 0 };
        }
    }

    /// # Safety (for every method below)
    /// `self` must be a live block, not borrowed elsewhere for the duration of the call.
    unsafe fn flags(self) -> u8 {
        // SAFETY: by the caller.
        unsafe { (*self.head()).flags }
    }

    unsafe fn wide(self) -> bool {
        // SAFETY: by the caller.
        unsafe { self.flags() & WIDE != 0 }
    }

    /// A wide block's ext, right after the head (only valid in a wide block).
    unsafe fn ext(self) -> *mut Ext {
        // SAFETY: inside the block when it is wide (the caller asks only then).
        unsafe { self.head().add(1).cast::<Ext>() }
    }

    unsafe fn tail(self) -> *mut u8 {
        // SAFETY: the tail starts right after the head (and a wide block's ext), inside the
        // block.
        unsafe {
            let at = std::mem::size_of::<Head>()
                + if self.wide() {
                    std::mem::size_of::<Ext>()
                } else {
                    0
                };
            self.head().cast::<u8>().add(at)
        }
    }

    unsafe fn owner_area(self) -> usize {
        // SAFETY: by the caller.
        usize::from(unsafe { (*self.head()).owner_area })
    }

    unsafe fn name_len(self) -> usize {
        // SAFETY: by the caller; a wide block's ext is there.
        unsafe {
            if self.wide() {
                (*self.ext()).name_len as usize
            } else {
                usize::from((*self.head()).small[0])
            }
        }
    }

    unsafe fn db(self) -> c_int {
        // SAFETY: by the caller.
        unsafe {
            let small = (*self.head()).small;
            if self.wide() {
                c_int::from(u16::from_le_bytes(small))
            } else {
                c_int::from(small[1])
            }
        }
    }

    unsafe fn area(self) -> Area {
        // SAFETY: by the caller.
        unsafe {
            Area {
                owner: self.owner_area(),
                tie: self.tie_area(),
                wide: self.wide(),
            }
        }
    }

    unsafe fn name_ptr(self) -> *mut u8 {
        // SAFETY: the name follows the owner area, inside the block.
        unsafe { self.tail().add(self.owner_area()) }
    }

    unsafe fn tie_area(self) -> bool {
        // SAFETY: by the caller.
        unsafe { self.flags() & TIE_AREA != 0 }
    }

    /// The tie area, right after the name (unaligned).
    unsafe fn tie_ptr(self) -> *mut u64 {
        // SAFETY: by the caller; inside the block when it has a tie area.
        unsafe { self.name_ptr().add(self.name_len()).cast::<u64>() }
    }

    /// The deadline-index position.
    #[inline]
    pub fn pos(self) -> u32 {
        // SAFETY: a live block (the invariant).
        unsafe { (*self.head()).pos }
    }

    #[inline]
    pub fn set_pos(self, pos: u32) {
        // SAFETY: a live block (the invariant).
        unsafe { (*self.head()).pos = pos }
    }

    /// The FLOCK.STATS class kept with the lock.
    #[inline]
    pub fn class(self) -> ClassRef {
        // SAFETY: a live block (the invariant).
        unsafe { (*self.head()).class }
    }

    #[inline]
    pub fn set_class(self, class: ClassRef) {
        // SAFETY: a live block (the invariant).
        unsafe { (*self.head()).class = class }
    }

    /// The database and name the block carries, if it was given them (borrowed with the
    /// handle: the block lives at least as long, by the invariant).
    #[inline]
    pub fn name(&self) -> Option<(c_int, &[u8])> {
        let this = *self;
        // SAFETY: a live block (the invariant); the name's bytes are inside the block, and
        // nothing writes them while it lives (the block's size and name never change).
        unsafe {
            if this.flags() & NAMED == 0 {
                return None;
            }
            Some((
                this.db(),
                std::slice::from_raw_parts(this.name_ptr(), this.name_len()),
            ))
        }
    }

    /// The same name under another database (MOVE, SWAPDB: no new block needed); false when
    /// the database number does not fit the block (past 255 in a narrow one, past 65535).
    pub fn set_db(self, db: c_int) -> bool {
        // SAFETY: a live block (the invariant).
        unsafe {
            let head = self.head();
            if self.wide() {
                match u16::try_from(db) {
                    Ok(db) => (*head).small = db.to_le_bytes(),
                    Err(_) => return false,
                }
            } else {
                match u8::try_from(db) {
                    Ok(db) => (*head).small[1] = db,
                    Err(_) => return false,
                }
            }
            true
        }
    }

    /// The block's state, as a `LockRecord` of its own (compact, empty) or borrowed (full).
    ///
    /// # Safety
    /// `self` must be a live block, not changed while the result lives.
    unsafe fn load<'a>(self) -> Work<'a> {
        // SAFETY: by the caller; the form says which body field is valid.
        unsafe {
            let head = self.head();
            match self.flags() & FORM_MASK {
                FORM_COMPACT => match self.lone() {
                    Some(lone) => Work::Own(LockRecord {
                        state: lone.state(),
                        watched: None,
                    }),
                    None => Work::Own(LockRecord::default()),
                },
                FORM_FULL => match (*head).body.full.as_mut() {
                    Some(rec) => Work::Full(rec),
                    None => Work::Own(LockRecord::default()),
                },
                _ => Work::Own(LockRecord::default()),
            }
        }
    }

    /// The block's one grant, read in place, when the block is in the compact form.
    ///
    /// # Safety
    /// `self` must be a live block, not changed while the result lives.
    #[inline]
    unsafe fn lone<'a>(self) -> Option<LoneGrant<'a>> {
        // SAFETY: by the caller; the compact body is valid in the compact form (narrow or
        // wide as the block is, a wide block's ext after the head), its owner is
        // `owner_area` bytes at the tail, and its tie word after the name.
        unsafe {
            let head = self.head();
            let flags = (*head).flags;
            if flags & FORM_MASK != FORM_COMPACT {
                return None;
            }
            let times = if flags & WIDE != 0 {
                let w = (*head).body.wide;
                let ext = self.ext();
                Times {
                    token: (*ext).token,
                    deadline_mono_us: w.deadline_mono_us,
                    since_mono_us: w.since_mono_us,
                    wall_delta: (*ext).wall_delta,
                }
            } else {
                (*head).body.narrow.times()
            };
            Some(LoneGrant {
                mode: if flags & SHARED != 0 {
                    Mode::Shared
                } else {
                    Mode::Exclusive
                },
                owner: std::slice::from_raw_parts(self.tail(), self.owner_area()),
                token: times.token,
                deadline: times.deadline(),
                since_mono_us: times.since_mono_us,
                tie_word: if flags & TIE_AREA != 0 {
                    self.tie_ptr().read_unaligned()
                } else {
                    0
                },
            })
        }
    }

    /// Put `rec` in the block (whose full-form box, if any, it came out of or is no longer
    /// in use): compact or empty when it fits, else boxed.
    ///
    /// # Safety
    /// `self` must be a live block whose body holds no box (any box it had is gone or is
    /// `rec`'s own, taken out by the caller).
    unsafe fn store(self, rec: LockRecord) {
        // SAFETY: by the caller; the owner is written only when it is exactly the owner
        // area's length, and the grant only when it packs for the block's shape.
        unsafe {
            let head = self.head();
            let kept = (*head).flags & KEPT;
            match form_for(&rec, Some(self.area())) {
                Form::Compact {
                    shared,
                    grant,
                    times,
                } => {
                    // (`form_for` checked that it packs: the box below is not reached.)
                    if let Some(packed) = self.pack(times) {
                        self.write_compact(grant, shared, packed);
                        return;
                    }
                }
                Form::Empty => {
                    (*head).flags = FORM_EMPTY | kept;
                    return;
                }
                Form::Full => {}
            }
            (*head).body.full = Box::into_raw(Box::new(rec));
            (*head).flags = FORM_FULL | kept;
        }
    }

    /// Take a full form's box out of the block, which is left in the empty form; `None` for
    /// any other form.
    ///
    /// # Safety
    /// `self` must be a live block whose box nothing borrows.
    unsafe fn take_box(self) -> Option<LockRecord> {
        // SAFETY: by the caller; the full form's body is the box made by `store`.
        unsafe {
            let head = self.head();
            if (*head).flags & FORM_MASK != FORM_FULL {
                return None;
            }
            let rec = *Box::from_raw((*head).body.full);
            (*head).flags = ((*head).flags & KEPT) | FORM_EMPTY;
            Some(rec)
        }
    }

    /// A copy of the block's state (COPY, persistence, reads).
    ///
    /// # Safety
    /// `self` must be a live block, not changed while the result lives.
    pub(in crate::ffi) unsafe fn state<'a>(self) -> StateRef<'a> {
        // SAFETY: by the caller; the borrow of a full form's state is bounded by the caller
        // (see `lock_of`, which ties it to the key).
        match unsafe { self.load() } {
            Work::Own(rec) => StateRef::Own(rec.state),
            Work::Full(rec) => StateRef::Full(&rec.state),
        }
    }

    /// Bytes of the block and of what it owns (MEMORY USAGE), the index entry not included.
    pub fn bytes(self) -> usize {
        // SAFETY: a live block (the invariant).
        unsafe {
            let own = layout(
                self.owner_area(),
                self.name_len(),
                self.tie_area(),
                self.wide(),
            )
            .map_or(0, |l| l.size());
            let boxed = match self.load() {
                Work::Full(rec) => {
                    let s = &rec.state;
                    std::mem::size_of::<LockRecord>()
                        + s.grants().iter().map(|g| g.owner.len()).sum::<usize>()
                        + s.grants().heap_bytes()
                        + s.delays.heap_bytes()
                }
                Work::Own(_) => 0,
            };
            own + boxed
        }
    }

    /// Free the block and what it owns; returns the waiters' key it had, if any.
    ///
    /// # Safety
    /// `self` must be a live block that nothing refers to any more (out of the deadline
    /// index, out of the keyspace); it is gone after this.
    pub(in crate::ffi) unsafe fn free(self) -> Option<Box<KeyId>> {
        // SAFETY: by the caller; the layout is the one the block was made with (its owner
        // area, name length, tie area and width never change).
        unsafe {
            let head = self.head();
            let watched = if (*head).flags & FORM_MASK == FORM_FULL {
                let rec = Box::from_raw((*head).body.full);
                rec.watched
            } else {
                None
            };
            if let Some(layout) = layout(
                self.owner_area(),
                self.name_len(),
                self.tie_area(),
                self.wide(),
            ) {
                alloc::dealloc(head.cast(), layout);
            }
            watched
        }
    }

    /// The same lock in a new block named `db`/`name`; the old block is left empty (its
    /// index entry, if any, stays with it: the caller moves it). `None`: no memory (the old
    /// block is as it was).
    ///
    /// # Safety
    /// `self` must be a live block.
    unsafe fn renamed(self, db: c_int, name: &[u8]) -> Option<RecordPtr> {
        // SAFETY: by the caller; a full form's box moves to the new block (the old one is
        // marked empty so that freeing it leaves the box alone).
        unsafe {
            let head = self.head();
            let rec = match self.load() {
                Work::Own(rec) => rec,
                Work::Full(_) => {
                    let rec = *Box::from_raw((*head).body.full);
                    (*head).flags = ((*head).flags & KEPT) | FORM_EMPTY;
                    rec
                }
            };
            let class = self.class();
            let mut rec = Some(rec);
            let made = RecordPtr::new_with(&mut rec, Some((db, name)), class);
            if let Some(rec) = rec {
                // Not stored anywhere: back where it came from.
                self.store(rec);
            }
            made
        }
    }
}

/// A lock's state for a command: its own (decoded from a compact block) or the full form's.
enum Work<'a> {
    Own(LockRecord),
    Full(&'a mut LockRecord),
}

/// A block's state for reading.
pub enum StateRef<'a> {
    Own(LockState),
    Full(&'a LockState),
}

impl Deref for StateRef<'_> {
    type Target = LockState;
    fn deref(&self) -> &LockState {
        match self {
            StateRef::Own(s) => s,
            StateRef::Full(s) => s,
        }
    }
}

mod anchors;
mod open;
pub use open::*;
