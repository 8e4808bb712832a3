#!/usr/bin/env bash
# The module floor: builds benches/floor/minlock.c (the least a module can do for an
# owner-checked acquire and release) and runs `make bench`'s server-cost scenario (and the
# memory one: SCENARIOS=1,3 by default) with it loaded beside flock, on Valkey 9.1 by default
# (it has DELIFEQ). The report goes to target/bench-floor/BENCHMARKS.md (or the directory
# given second; docs/valkey-9.1/ holds the last one published).
#   scripts/bench-floor.sh [redis-7.0|valkey-8.1|valkey-9.1] [out-dir]
set -euo pipefail
cd "$(dirname "$0")/.."
server=${1:-valkey-9.1}
out=${2:-target/bench-floor}
bin=$(scripts/servers.sh "$server") || { echo "bench-floor: no $server (make deps installs it)" >&2; exit 1; }
# redismodule.h comes with the redis-module crate the module is built with.
manifest=$(cargo metadata --format-version 1 | grep -o '"manifest_path":"[^"]*/redis-module-[0-9][^"]*/Cargo.toml"' | head -n 1 | cut -d'"' -f4)
[ -n "$manifest" ] || { echo "bench-floor: redis-module's sources not found" >&2; exit 1; }
mkdir -p target/floor
cc -O2 -fPIC -shared -I"$(dirname "$manifest")/src/include" -o target/floor/minlock.so benches/floor/minlock.c
cargo build --release
REDIS_SERVER=$bin FLOCK_MODULE=$PWD/target/release/libredis_flock.so \
  FLOCK_BENCH_FLOOR_MODULE=$PWD/target/floor/minlock.so \
  cargo bench --bench flock -- --only "${SCENARIOS:-1,3}" --no-callgrind --out "$out"
