//! The bindings index, table-style: each case feeds the index what the engine and the
//! keyspace events feed the module's, then checks how many bound grants it counts and which
//! keys closing a connection looks at. One test per case.

use super::*;

#[derive(Clone, Copy)]
enum Op {
    /// `Effect::Bind`: client, token, database, key.
    Bind(u64, u64, c_int, &'static str),
    /// `Effect::Unbind`: client, token, database, key.
    Unbind(u64, u64, c_int, &'static str),
    /// RENAME or MOVE of a bound grant: client, token, from, to.
    Moved(u64, u64, (c_int, &'static str), (c_int, &'static str)),
    /// SWAPDB.
    Swap(c_int, c_int),
}
use Op::*;

/// Run `ops`, then check the count and what closing `client` looks at (`keys`, sorted).
fn run_case(ops: &[Op], count: usize, client: u64, keys: &[(c_int, &str)]) {
    let mut ix = BindingIndex::default();
    for &op in ops {
        match op {
            Bind(c, t, db, k) => ix.bind(c, t, (db, k.as_bytes())),
            Unbind(c, t, db, k) => ix.unbind(c, t, (db, k.as_bytes())),
            Moved(c, t, (fd, fk), (td, tk)) => {
                ix.moved(c, t, (fd, fk.as_bytes()), (td, tk.as_bytes()))
            }
            Swap(a, b) => ix.swap_dbs(a, b),
        }
    }
    assert_eq!(ix.count(), count, "count");
    let want: Vec<(c_int, Vec<u8>)> = keys.iter().map(|&(d, k)| (d, k.into())).collect();
    assert_eq!(
        ix.take(client),
        want,
        "the keys closing client {client} looks at"
    );
    assert!(ix.take(client).is_empty(), "taken once");
}

macro_rules! cases {
    ($($name:ident: [$($op:expr),* $(,)?] => count $n:expr, close $c:expr => [$($key:expr),* $(,)?];)*) => {$(
        #[test]
        fn $name() {
            run_case(&[$($op),*], $n, $c, &[$($key),*]);
        }
    )*};
}

cases! {
    a_bound_grant_is_listed_once_per_key:
        [Bind(1, 10, 0, "a"), Bind(1, 11, 0, "a"), Bind(1, 12, 0, "b"), Bind(2, 13, 0, "c")]
        => count 4, close 1 => [(0, "a"), (0, "b")];
    unbinding_the_newest_pops_it:
        [Bind(1, 10, 0, "a"), Bind(1, 11, 0, "b"), Unbind(1, 11, 0, "b")]
        => count 1, close 1 => [(0, "a")];
    unbinding_out_of_order_marks_it_gone:
        [Bind(1, 10, 0, "a"), Bind(1, 11, 0, "b"), Unbind(1, 10, 0, "a")]
        => count 1, close 1 => [(0, "b")];
    unbinding_everything_forgets_the_client:
        [Bind(1, 10, 0, "a"), Bind(1, 11, 0, "b"), Unbind(1, 10, 0, "a"), Unbind(1, 11, 0, "b")]
        => count 0, close 1 => [];
    a_grant_unbound_twice_leaves_the_older_grant_listed:
        // The newest entry popped, then unbound again (the key's departure read a stale
        // copy): the second unbind names an entry no longer listed, and must not make the
        // connection forget its older bound grant (G11).
        [Bind(1, 10, 0, "a"), Bind(1, 11, 0, "b"), Unbind(1, 11, 0, "b"), Unbind(1, 11, 0, "b")]
        => count 1, close 1 => [(0, "a")];
    a_grant_unbound_twice_out_of_order_is_gone_once:
        [Bind(1, 10, 0, "a"), Bind(1, 11, 0, "b"), Bind(1, 12, 0, "c"),
         Unbind(1, 10, 0, "a"), Unbind(1, 10, 0, "a")]
        => count 2, close 1 => [(0, "b"), (0, "c")];
    unbinding_one_copy_twin_leaves_the_other:
        [Bind(1, 10, 0, "a"), Bind(1, 10, 0, "b"), Unbind(1, 10, 0, "a")]
        => count 1, close 1 => [(0, "b")];
    a_rename_moves_the_entry:
        [Bind(1, 10, 0, "a"), Moved(1, 10, (0, "a"), (0, "c"))]
        => count 1, close 1 => [(0, "c")];
    renaming_one_copy_twin_leaves_the_other:
        // The twin under "b" is the newer entry: found by token alone it would move instead.
        [Bind(1, 10, 0, "a"), Bind(1, 10, 0, "b"), Moved(1, 10, (0, "a"), (0, "c"))]
        => count 2, close 1 => [(0, "b"), (0, "c")];
    renaming_the_newer_twin_leaves_the_older:
        [Bind(1, 10, 0, "a"), Bind(1, 10, 0, "b"), Moved(1, 10, (0, "b"), (0, "c"))]
        => count 2, close 1 => [(0, "a"), (0, "c")];
    renaming_one_twin_over_the_other_leaves_one_entry:
        // RENAME a b: b's own bound grant went with its overwritten value.
        [Bind(1, 10, 0, "a"), Bind(1, 10, 0, "b"), Moved(1, 10, (0, "a"), (0, "b"))]
        => count 1, close 1 => [(0, "b")];
    renaming_over_a_twin_unbound_out_of_order:
        [Bind(1, 10, 0, "b"), Bind(1, 10, 0, "a"), Bind(1, 11, 0, "x"), Unbind(1, 10, 0, "b"),
         Moved(1, 10, (0, "a"), (0, "b"))]
        => count 2, close 1 => [(0, "b"), (0, "x")];
    a_move_changes_the_database_only:
        [Bind(1, 10, 0, "a"), Bind(1, 10, 1, "a"), Moved(1, 10, (0, "a"), (2, "a"))]
        => count 2, close 1 => [(1, "a"), (2, "a")];
    a_rename_over_a_twin_after_a_grant_unbound_twice_keeps_the_moved_grant_listed:
        // The stale gone mark of the second unbind (c's) makes `live` count 0 once the move
        // drops b's twin: the move must compact before it forgets the connection, as unbind
        // does (G11).
        [Bind(1, 10, 0, "a"), Bind(1, 10, 0, "b"), Bind(1, 12, 0, "c"), Unbind(1, 12, 0, "c"),
         Unbind(1, 12, 0, "c"), Moved(1, 10, (0, "a"), (0, "b"))]
        => count 1, close 1 => [(0, "b")];
    moving_an_entry_the_index_lacks_changes_nothing:
        [Bind(1, 10, 0, "a"), Moved(1, 11, (0, "a"), (0, "c")), Moved(2, 10, (0, "a"), (0, "c")),
         Moved(1, 10, (0, "z"), (0, "c"))]
        => count 1, close 1 => [(0, "a")];
    swapdb_swaps_entries_and_gone_marks:
        [Bind(1, 10, 0, "a"), Bind(1, 11, 1, "b"), Bind(1, 12, 0, "c"), Unbind(1, 10, 0, "a"),
         Swap(0, 1), Unbind(1, 11, 0, "b")]
        => count 1, close 1 => [(1, "c")];
}

#[test]
fn the_list_stays_near_the_live_count() {
    let mut ix = BindingIndex::default();
    for t in 0..1000 {
        ix.bind(1, t, (0, b"k"));
    }
    // Out of order: each unbind marks one gone, compaction keeps the list short.
    for t in 0..990 {
        ix.unbind(1, t, (0, b"k"));
    }
    assert_eq!(ix.count(), 10);
    let b = ix.by_client.get(&1).expect("client 1");
    assert!(b.grants.len() <= 2 * 10 + 16 + 1, "{}", b.grants.len());
}
