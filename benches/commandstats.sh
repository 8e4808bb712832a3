#!/usr/bin/env bash
# Server cost per call, side by side in one run on one server: flock's commands against the
# usual ways of building a lock from plain Redis. Prints INFO commandstats usec_per_call and
# the ratios. Usage: benches/commandstats.sh [requests per round] [rounds]
set -euo pipefail
cd "$(dirname "$0")/.."
N=${1:-200000}
ROUNDS=${2:-3}
KEYS=100000
REDIS_SERVER=${REDIS_SERVER:-redis-server}
MODULE=${FLOCK_MODULE:-$PWD/target/release/libredis_flock.so}
PORT=${PORT:-$((20000 + RANDOM % 20000))}
DIR=$(mktemp -d)
trap 'redis-cli -p $PORT shutdown nosave >/dev/null 2>&1 || true; rm -rf "$DIR"' EXIT

"$REDIS_SERVER" --port "$PORT" --bind 127.0.0.1 --dir "$DIR" --save "" --appendonly no \
  --loadmodule "$MODULE" --daemonize yes --logfile "$DIR/log" >/dev/null
for _ in $(seq 50); do redis-cli -p "$PORT" ping >/dev/null 2>&1 && break; sleep 0.1; done
C="redis-cli -p $PORT"
B="redis-benchmark -p $PORT -q -n $N -r $KEYS -P 16 -c 8"

CAD="if redis.call('get', KEYS[1]) == ARGV[1] then return redis.call('del', KEYS[1]) else return 0 end"
FENCE_ACQ="if redis.call('set', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then return redis.call('incr', KEYS[2]) else return false end"
FENCE_WRITE="if redis.call('get', KEYS[1]) == ARGV[1] then return redis.call('set', KEYS[2], ARGV[2]) else return redis.error_reply('stale') end"

$C config resetstat >/dev/null
for round in $(seq "$ROUNDS"); do
  echo "round $round/$ROUNDS" >&2
  $B flock.acquire flk:__rand_int__ owner-0123456789abcdef0123456789abcdef 60000 >/dev/null
  $B set slk:__rand_int__ owner-0123456789abcdef0123456789abcdef NX PX 60000 >/dev/null
  $B flock.release flk:__rand_int__ owner-0123456789abcdef0123456789abcdef >/dev/null
  $B eval "$CAD" 1 slk:__rand_int__ owner-0123456789abcdef0123456789abcdef >/dev/null
  $C set fence:tok 0 >/dev/null
  $B evalsha "$($C script load "$FENCE_ACQ")" 2 elk:__rand_int__ fence:tok owner 60000 >/dev/null
  $C flushall >/dev/null
done
$C info commandstats | tr -d '\r' > "$DIR/locks"
$C config resetstat >/dev/null
# Fenced writes: one live lock, many writes.
T=$($C flock.acquire wlk owner 600000)
$C set wlk:s owner >/dev/null
SHA=$($C script load "$FENCE_WRITE")
for round in $(seq "$ROUNDS"); do
  $B flock.fenced wlk "$T" set data:__rand_int__ v >/dev/null
  $B set data:__rand_int__ v >/dev/null
  $B evalsha "$SHA" 2 wlk:s data:__rand_int__ owner v >/dev/null
  $B flock.check wlk "$T" >/dev/null
  $B get wlk:s >/dev/null
done

$C info commandstats | tr -d '\r' > "$DIR/writes"
usec() { grep "^cmdstat_$2:" "$DIR/$1" | sed 's/.*usec_per_call=\([0-9.]*\).*/\1/'; }
ratio() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.2f", a / b }'; }
echo "server: $("$REDIS_SERVER" --version | head -1)"
echo "requests per round: $N, rounds: $ROUNDS, keys: $KEYS, pipeline 16, 8 clients"
printf '%-44s %14s\n' "locks (section 1)" usec_per_call
printf '%-44s %14s\n' "FLOCK.ACQUIRE" "$(usec locks flock.acquire)"
printf '%-44s %14s\n' "SET key owner NX PX ttl" "$(usec locks set)"
printf '%-44s %14s\n' "Lua SET NX PX + INCR token (EVALSHA)" "$(usec locks evalsha)"
printf '%-44s %14s\n' "FLOCK.RELEASE" "$(usec locks flock.release)"
printf '%-44s %14s\n' "Lua compare-and-delete (EVAL)" "$(usec locks eval)"
printf '%-44s %14s\n' "fenced writes (section 2)" usec_per_call
printf '%-44s %14s\n' "FLOCK.FENCED lk T SET k v" "$(usec writes flock.fenced)"
printf '%-44s %14s\n' "SET k v" "$(usec writes set)"
printf '%-44s %14s\n' "Lua token check + SET (EVALSHA)" "$(usec writes evalsha)"
printf '%-44s %14s\n' "FLOCK.CHECK" "$(usec writes flock.check)"
printf '%-44s %14s\n' "GET" "$(usec writes get)"
echo
echo "ratios"
echo "  FLOCK.ACQUIRE / SET NX PX:              $(ratio "$(usec locks flock.acquire)" "$(usec locks set)")"
echo "  FLOCK.ACQUIRE / Lua fenced acquire:     $(ratio "$(usec locks flock.acquire)" "$(usec locks evalsha)")"
echo "  FLOCK.RELEASE / Lua compare-and-delete: $(ratio "$(usec locks flock.release)" "$(usec locks eval)")"
echo "  FLOCK.FENCED+SET / SET:                 $(ratio "$(usec writes flock.fenced)" "$(usec writes set)")"
echo "  FLOCK.FENCED+SET / Lua check+SET:       $(ratio "$(usec writes flock.fenced)" "$(usec writes evalsha)")"
echo "  FLOCK.CHECK / GET:                      $(ratio "$(usec writes flock.check)" "$(usec writes get)")"
