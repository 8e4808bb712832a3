#!/usr/bin/env bash
# The byte budget of a held lock, by allocation size class (docs/MEMORY.md).
#
#   benches/memory-budget.sh [flock|set] [N] [MODULE.so]
#
# Starts redis-server (REDIS_SERVER, default redis-server: it must use jemalloc, whose
# MEMORY MALLOC-STATS this reads) with the module, takes N locks (default 100,000; keys
# lock:0000000..., a 36-byte owner each, ttl 60 s) with FLOCK.ACQUIRE or with
# SET key owner NX PX 60000, and prints the used_memory delta per lock and, per jemalloc size
# class, how many allocations the locks added and their bytes per lock. Counting allocations
# by class, rather than only used_memory, says which allocation each byte belongs to.
set -euo pipefail
MODE=${1:-flock}
N=${2:-100000}
SO=${3:-$(cd "$(dirname "$0")/.." && pwd)/target/release/libredis_flock.so}
SERVER=${REDIS_SERVER:-redis-server}
PORT=$((20000 + RANDOM % 20000))
D=$(mktemp -d)
"$SERVER" --port "$PORT" --bind 127.0.0.1 --dir "$D" --save "" --appendonly no \
  --loadmodule "$SO" >"$D/log" 2>&1 &
PID=$!
trap 'kill $PID 2>/dev/null || true; wait $PID 2>/dev/null || true; rm -rf "$D"' EXIT
cli() { redis-cli -p "$PORT" "$@"; }
for _ in $(seq 100); do cli PING >/dev/null 2>&1 && break; sleep 0.1; done
# jemalloc's bins (small classes) and large classes: class size, bytes allocated, regions.
bins() {
  cli MEMORY MALLOC-STATS | awk '
    /^bins:/ {f = 1; next}
    /^large:/ {f = 2; next}
    /^extents:|^---/ {f = 0}
    f == 1 && $1 ~ /^[0-9]+$/ {print "small", $1, $3, $11}
    f == 2 && $1 ~ /^[0-9]+$/ {print "large", $1, $3, $11}'
}
used() { cli INFO memory | awk -F: '/^used_memory:/ {print $2 + 0}'; }
cli FLUSHALL >/dev/null
sleep 0.3
bins >"$D/b0"
m0=$(used)
python3 - "$MODE" "$N" >"$D/cmds" <<'PY'
import sys
mode, n = sys.argv[1], int(sys.argv[2])
def resp(*a):
    return "*%d\r\n" % len(a) + "".join("$%d\r\n%s\r\n" % (len(x), x) for x in a)
w = sys.stdout.write
for i in range(n):
    k = "lock:%07d" % i
    o = "%08x-0000-4000-8000-%012x" % (i, i)
    w(resp("FLOCK.ACQUIRE", k, o, "60000") if mode == "flock" else resp("SET", k, o, "NX", "PX", "60000"))
PY
cli --pipe <"$D/cmds" >/dev/null
sleep 1.3 # the server's cron finishes rehashing
bins >"$D/b1"
m1=$(used)
python3 -c "print('used_memory delta per lock: %d / %d = %.1f' % ($m1 - $m0, $N, ($m1 - $m0) / $N))"
echo "MEMORY USAGE lock:0000500: $(cli MEMORY USAGE lock:0000500)"
awk -v n="$N" '
  NR == FNR {a[$1 " " $2] = $3; r[$1 " " $2] = $4; next}
  {
    k = $1 " " $2; d = $3 - a[k]; c = $4 - r[k]
    if ($1 == "small" && d >= n)
      printf "  class %6d B: %+9d allocations (%.3f per lock) = %6.1f B per lock\n", $2, c, c / n, d / n
    if ($1 == "large") L += d
  }
  END {printf "  large classes (tables, vectors): %.1f B per lock\n", L / n}' "$D/b0" "$D/b1"
