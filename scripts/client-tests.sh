#!/usr/bin/env bash
# make client-test: the clients' suites at the same time, since they mostly wait on servers and
# timers: the Rust client (cargo test -p flock-client), the Node.js client (clients/node/test.sh,
# every library), the Python client on the newest redis-py and on redis-py 5
# (.venv/redis-py5, scripts/deps.sh installs it). Each suite's output goes to the terminal with
# its name in front of every line, and unprefixed to target/client-test/<name>.log. Exits 1
# when any suite failed (each suite's own runner fails on a failed, skipped or missing test),
# after a summary line per suite.
# Env: FLOCK_MODULE (required), PY (default .venv/bin/python), REDIS_SERVER, VALKEY_SERVER.
set -uo pipefail
cd "$(dirname "$0")/.."
repo=$(pwd)
: "${FLOCK_MODULE:?set FLOCK_MODULE to the module (make client-test does)}"
export FLOCK_MODULE
PY="${PY:-$repo/.venv/bin/python}"
logs="$repo/target/client-test"
mkdir -p "$logs"

# The Python client and its test extras, once for both Python runs (two pip installs into one
# environment at the same time could tread on each other).
"$PY" -m pip install --quiet --disable-pip-version-check -e "$repo/clients/python[test]" || exit 1

# The Rust client's test binaries are built first at a lower priority, so that the compiler
# takes what CPU the waiting suites leave; the tests themselves then run at normal priority.
rust() {
  nice -n 10 cargo test -p flock-client --no-run && cargo test -p flock-client
}
node_suite() { bash clients/node/test.sh; }
python_newest() { PY="$PY" FLOCK_PY_INSTALL=0 bash clients/python/test.sh; }
python_redis5() {
  PYTHONPATH="$repo/.venv/redis-py5${PYTHONPATH:+:$PYTHONPATH}" PY="$PY" FLOCK_PY_INSTALL=0 \
    FLOCK_REDIS_PY=5 bash clients/python/test.sh
}

names=(rust node python python-redis5)
funcs=(rust node_suite python_newest python_redis5)
pids=()
start=$(date +%s)
for i in "${!names[@]}"; do
  name=${names[$i]}
  (
    t0=$(date +%s)
    "${funcs[$i]}" 2>&1 | tee "$logs/$name.log" | sed -u "s/^/[$name] /"
    rc=${PIPESTATUS[0]}
    echo "$rc $(( $(date +%s) - t0 ))" > "$logs/$name.status"
    exit "$rc"
  ) &
  pids+=($!)
done

failed=0
for i in "${!names[@]}"; do
  wait "${pids[$i]}"
  rc=$?
  [ "$rc" -eq 0 ] || failed=1
done
echo "client-test: all suites done in $(( $(date +%s) - start )) s (logs in $logs/)"
for name in "${names[@]}"; do
  read -r rc secs < "$logs/$name.status" || { rc=1; secs='?'; }
  if [ "$rc" -eq 0 ]; then echo "client-test: $name passed in $secs s"
  else echo "client-test: $name FAILED (exit $rc) in $secs s: $logs/$name.log"; fi
done
exit "$failed"
