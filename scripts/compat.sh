#!/usr/bin/env bash
# The integration suite once per server (scripts/servers.sh names them): redis-7.0, valkey-8.1,
# valkey-9.1; and valkey-9.1-cluster: only the cluster binaries (cluster, asm: atomic slot
# migration, which runs on Valkey 9 in every run anyway) on Valkey 9.1. Prints, per server, its version and the tests passed/failed per test binary, then
# one summary line per server. Fails when any server failed. Logs in target/compat/<server>.log.
set -uo pipefail
cd "$(dirname "$0")/.."
module="$(pwd)/target/release/libredis_flock.so"
mkdir -p target/compat
failed=0
summary=()
for name in "$@"; do
  tests=(--test '*')
  server="$name"
  if [ "${name%-cluster}" != "$name" ]; then
    server="${name%-cluster}"
    tests=(--test cluster --test asm)
  fi
  bin="$(scripts/servers.sh "$server")" || { echo "compat: $server is not installed (scripts/deps.sh)"; exit 1; }
  version="$("$bin" --version | sed -n 's/.* v=\([^ ]*\).*/\1/p')"
  log="target/compat/$name.log"
  echo "== $name ($version): $bin"
  start=$(date +%s)
  REDIS_SERVER="$bin" FLOCK_MODULE="$module" cargo test --release --no-fail-fast "${tests[@]}" -- --test-threads=4 >"$log" 2>&1
  rc=$?
  secs=$(( $(date +%s) - start ))
  passed=$(awk '/^test result:/{for(i=1;i<=NF;i++) if($(i+1)~/^passed/) n+=$i} END{print n+0}' "$log")
  nfailed=$(awk '/^test result:/{for(i=1;i<=NF;i++) if($(i+1)~/^failed/) n+=$i} END{print n+0}' "$log")
  # Per test binary: "Running tests/x.rs" followed by its result line.
  awk '/Running tests\//{f=$2} /^test result:/{print "   " f ": " $0}' "$log"
  if [ "$rc" -ne 0 ]; then
    failed=1
    grep -E '^test .* FAILED$|^---- ' "$log" | head -20
  fi
  summary+=("$name $version: ${passed:-0} passed, ${nfailed:-0} failed, ${secs}s (exit $rc)")
done
echo "== compat summary"
printf '%s\n' "${summary[@]}"
exit "$failed"
