#!/usr/bin/env bash
# The setup's own test: makes this machine look new, then runs `make test` on a clean clone.
#   1. removes what a new Debian machine of this kind lacks: redis-server, redis-tools,
#      libclang-dev (and libclang-14-dev, libclang1-14), faketime (libfaketime), patchelf;
#   2. clones the repository (HEAD of the current branch) into a temporary directory, so no
#      .venv/, target/ or .run/ of this work tree is seen;
#   3. runs `make test` there and reports its time, the tests passed/failed/ignored per test
#      binary, and whether any test announced a skip.
# Destructive for the machine's packages (make test puts them back): root only, and only with
# --yes. Usage: scripts/fresh-machine-check.sh --yes [--keep]
set -uo pipefail
repo="$(cd "$(dirname "$0")/.." && pwd)"
[ "${1:-}" = "--yes" ] || { sed -n '2,11p' "$0"; echo "refusing without --yes"; exit 2; }
[ "$(id -u)" = 0 ] || { echo "fresh-machine-check: run as root"; exit 2; }
keep="${2:-}"

echo "== removing what a new machine lacks"
export DEBIAN_FRONTEND=noninteractive
apt-get remove -y -qq redis-server redis-tools libclang-dev libclang-14-dev libclang1-14 \
  faketime libfaketime patchelf >/dev/null 2>&1
for probe in redis-server redis-cli patchelf; do
  command -v "$probe" >/dev/null 2>&1 && echo "   still present: $probe"
done
ldconfig -p | grep -E '[[:space:]]libclang(-[0-9.]+)?\.so' && echo "   still present: libclang"
ldconfig -p | grep -q 'libclang-cpp' && echo "   present, as on a new machine: libclang-cpp (not what bindgen loads)"

work="$(mktemp -d /tmp/flock-fresh.XXXXXX)"
echo "== git clone $repo $work/flock"
git clone -q "$repo" "$work/flock" || exit 1
cd "$work/flock" || exit 1
echo "   at $(git log --oneline -1)"

echo "== make test"
start=$(date +%s)
make test >"$work/make-test.log" 2>&1
rc=$?
secs=$(( $(date +%s) - start ))
echo "== per test binary"
# make client-test prefixes each suite's lines with its name ("[rust] "): taken off first.
unprefix='{sub(/^\[[a-z0-9-]+\] /, "")}'
awk "$unprefix"'/Running (unittests|tests\/)/{f=$2} /^test result:/{print "   " f ": " $0}' "$work/make-test.log"
passed=$(awk "$unprefix"'/^test result:/{for(i=1;i<=NF;i++) if($(i+1)~/^passed/) n+=$i} END{print n+0}' "$work/make-test.log")
failed=$(awk "$unprefix"'/^test result:/{for(i=1;i<=NF;i++) if($(i+1)~/^failed/) n+=$i} END{print n+0}' "$work/make-test.log")
ignored=$(awk "$unprefix"'/^test result:/{for(i=1;i<=NF;i++) if($(i+1)~/^ignored/) n+=$i} END{print n+0}' "$work/make-test.log")
skips=$(grep -cE 'SKIPPED|\.\.\. ignored' "$work/make-test.log")
# The Python (pytest's last line) and Node.js (the suite's summary line) suites' counts too.
read -r cpassed cfailed < <(awk "$unprefix"'/^[0-9]+ (passed|failed)[ ,]/ || /^node client: [0-9]+ tests,/ {
  for (i = 1; i < NF; i++) { w = $(i+1); gsub(/,/, "", w); if (w == "passed") p += $i; if (w == "failed") f += $i } }
  END { print p+0, f+0 }' "$work/make-test.log")
passed=$((passed + cpassed)); failed=$((failed + cfailed))
echo "== installed by make test"
grep '^deps:' "$work/make-test.log" | sed 's/^/   /'
echo "== fresh-machine-check: make test exit $rc in ${secs}s; $passed passed, $failed failed, $ignored ignored; lines mentioning a skip: $skips"
echo "   full log: $work/make-test.log"
if [ "$rc" -ne 0 ]; then tail -40 "$work/make-test.log"; fi
[ "$keep" = "--keep" ] || rm -rf "$work/flock"
[ "$rc" -eq 0 ] && [ "$failed" -eq 0 ] && [ "$ignored" -eq 0 ] && [ "$skips" -eq 0 ]
