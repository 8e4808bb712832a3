//! The run's options (`--quick`, `--only`, `--out`, `--no-callgrind`) and the sizes they imply.

use std::path::{Path, PathBuf};

pub(crate) struct Cfg {
    pub(crate) quick: bool,
    pub(crate) out: PathBuf,
    pub(crate) only: Option<Vec<u32>>,
    pub(crate) callgrind: bool,
    pub(crate) s1_keys: usize,
    pub(crate) s1_rounds: usize,
    pub(crate) s2_secs: f64,
    pub(crate) s2_rounds: usize,
    pub(crate) s3_locks: usize,
    /// Locks per point of the memory grid (key length x owner length).
    pub(crate) s3_grid_locks: usize,
    pub(crate) s4_secs: f64,
    pub(crate) s4_clients: Vec<usize>,
    pub(crate) s4_handoffs: usize,
    pub(crate) s5_levels: Vec<usize>,
    pub(crate) s5_waiters: Vec<usize>,
    pub(crate) s5_pairs: usize,
    pub(crate) s5_rounds: usize,
    pub(crate) s5_handoffs: usize,
    pub(crate) cg_calls: usize,
}

impl Cfg {
    pub(crate) fn from_args() -> Cfg {
        let root = Path::new(env!("CARGO_MANIFEST_DIR"));
        let mut quick = false;
        let mut out = None;
        let mut only = None;
        let mut callgrind = true;
        let mut args = std::env::args().skip(1);
        while let Some(a) = args.next() {
            match a.as_str() {
                "--quick" => quick = true,
                "--bench" => {} // cargo bench passes it to harness = false targets
                "--out" => out = args.next().map(PathBuf::from),
                "--only" => {
                    only = args.next().map(|s| {
                        s.split(',')
                            .filter_map(|x| x.trim().parse().ok())
                            .collect::<Vec<u32>>()
                    })
                }
                "--no-callgrind" => callgrind = false,
                "-h" | "--help" => {
                    println!(
                        "cargo bench --bench flock [-- --quick] [--out DIR] [--only 1,2,3,4,5,6,7,8,9 (6: callgrind)] [--no-callgrind]"
                    );
                    std::process::exit(0);
                }
                other if other.starts_with('-') => {
                    eprintln!("unknown option {other} (try --help)");
                    std::process::exit(2);
                }
                _ => {} // a benchmark name filter from cargo: ignore
            }
        }
        let out = out.unwrap_or_else(|| {
            if quick {
                root.join("target/bench-quick")
            } else {
                root.join("docs")
            }
        });
        if quick {
            Cfg {
                quick,
                out,
                only,
                callgrind: false,
                s1_keys: 50_000,
                s1_rounds: 2,
                s2_secs: 0.6,
                s2_rounds: 1,
                s3_locks: 100_000,
                s3_grid_locks: 20_000,
                s4_secs: 1.0,
                s4_clients: vec![2, 8, 32, 128],
                s4_handoffs: 400,
                s5_levels: vec![1, 10_000, 100_000],
                s5_waiters: vec![0, 100, 1_000],
                s5_pairs: 20_000,
                s5_rounds: 1,
                s5_handoffs: 300,
                cg_calls: 2_000,
            }
        } else {
            Cfg {
                quick,
                out,
                only,
                callgrind,
                s1_keys: 100_000,
                s1_rounds: 7,
                s2_secs: 3.0,
                s2_rounds: 3,
                s3_locks: 100_000,
                s3_grid_locks: 50_000,
                s4_secs: 5.0,
                s4_clients: vec![2, 8, 32, 128],
                s4_handoffs: 2_000,
                s5_levels: vec![1, 10_000, 1_000_000],
                s5_waiters: vec![0, 100, 10_000],
                s5_pairs: 50_000,
                s5_rounds: 3,
                s5_handoffs: 2_000,
                cg_calls: 20_000,
            }
        }
    }

    pub(crate) fn runs(&self, scenario: u32) -> bool {
        // 6 is the callgrind profile, see main()
        self.only.as_ref().is_none_or(|o| o.contains(&scenario))
    }
}
