#!/usr/bin/env bash
# make integration-test: builds every test binary of tests/ (cargo test --test '*' --no-run), then
# runs INTEGRATION_JOBS of them at a time (default 3), each with --test-threads=TEST_THREADS
# (default 4). A binary's time is mostly its few longest tests, which wait on servers and timers:
# more threads per binary do not shorten it, more binaries at once do. Each binary's output is
# printed whole when it ends, headed by cargo's own "Running tests/<file> (<binary>)" line, and
# kept in target/integration-test/<binary>.log. Exits 1 when any binary failed (or none was
# built), after naming them.
# Env: FLOCK_MODULE (required), TEST_PROFILE (default test-fast), INTEGRATION_JOBS, TEST_THREADS.
set -uo pipefail
cd "$(dirname "$0")/.."
: "${FLOCK_MODULE:?set FLOCK_MODULE to the module (make integration-test does)}"
export FLOCK_MODULE
profile="${TEST_PROFILE:-test-fast}"
jobs="${INTEGRATION_JOBS:-3}"
export threads="${TEST_THREADS:-4}"
export out=target/integration-test
rm -rf "$out"
mkdir -p "$out"
start=$(date +%s)

cargo test --profile "$profile" --test '*' --no-run --message-format=json-render-diagnostics \
  > "$out/build.json" || exit 1
python3 - "$out/build.json" > "$out/binaries" <<'EOF'
import json, os, sys
for line in open(sys.argv[1]):
    try:
        m = json.loads(line)
    except ValueError:
        continue
    if (m.get("reason") == "compiler-artifact" and m.get("executable")
            and m["profile"]["test"] and "test" in m["target"]["kind"]):
        print(m["target"]["name"], os.path.relpath(m["executable"]),
              os.path.relpath(m["target"]["src_path"]))
EOF
n=$(wc -l < "$out/binaries")
[ "$n" -gt 0 ] || { echo "integration-test: no test binary was built" >&2; exit 1; }

# One binary: its output to its log, then the log printed in one piece (under a lock, so that
# two binaries ending together do not interleave).
run_one() {
  local name=$1 exe=$2 src=$3 log="$out/$1.log"
  { echo "     Running $src ($exe)"; "$exe" --test-threads="$threads"; } > "$log" 2>&1
  echo $? > "$out/$name.rc"
  flock "$out/.print" cat "$log"
}
export -f run_one
xargs -P "$jobs" -L 1 bash -c 'run_one "$@"' _ < "$out/binaries"

failed=()
while read -r name _; do
  rc=$(cat "$out/$name.rc" 2>/dev/null || echo missing)
  [ "$rc" = 0 ] || failed+=("$name (exit $rc)")
done < "$out/binaries"
secs=$(( $(date +%s) - start ))
if [ "${#failed[@]}" -gt 0 ]; then
  echo "integration-test: ${#failed[@]} of $n test binaries FAILED in $secs s: ${failed[*]} (logs in $out/)" >&2
  exit 1
fi
echo "integration-test: $n test binaries passed in $secs s, $jobs at a time (logs in $out/)"
