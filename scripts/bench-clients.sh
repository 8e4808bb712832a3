#!/usr/bin/env bash
# The clients' cost, as `make bench` measures it: the latency a client adds to one scoped lock
# (lock() + release()) over the raw FLOCK.ACQUIRE + FLOCK.RELEASE, on loopback, against one
# throw-away redis-server with the module. Targets: under 50 us per lock for Rust, under 150 us
# for Python and Node. Writes the figures to $1 (a Markdown file) and prints them.
set -euo pipefail
cd "$(dirname "$0")/.."
out="${1:-target/bench-clients.md}"
iters="${BENCH_CLIENT_ITERS:-5000}"
module="$(pwd)/target/release/libredis_flock.so"
dir="$(mktemp -d /tmp/flock-bench-clients.XXXXXX)"
port=0
trap 'if [ "$port" != 0 ]; then redis-cli -p "$port" shutdown nosave >/dev/null 2>&1 || true; fi; rm -rf "$dir"' EXIT
# A random port can be taken (another server of the bench, closing down): try a few, and go
# on only with a server that answers.
for _ in 1 2 3 4 5; do
  try=$(( 20000 + RANDOM % 20000 ))
  "${REDIS_SERVER:-redis-server}" --port "$try" --bind 127.0.0.1 --dir "$dir" --save '' \
    --appendonly no --loadmodule "$module" --logfile "$dir/server.log" --daemonize yes || continue
  for _ in $(seq 50); do
    if redis-cli -p "$try" ping 2>/dev/null | grep -q PONG; then port=$try; break; fi
    sleep 0.1
  done
  [ "$port" != 0 ] && break
done
if [ "$port" = 0 ]; then
  echo "bench-clients: no redis-server with the module came up; its log:" >&2
  cat "$dir/server.log" >&2 || true
  exit 1
fi

mkdir -p "$(dirname "$out")"
{
  echo "# Client cost per scoped lock"
  echo
  echo "Measured by \`make bench\` (scripts/bench-clients.sh) on $(date -u '+%Y-%m-%d %H:%M UTC'), $iters iterations each,"
  echo "raw commands and client calls in alternating rounds, one redis-server $(redis-server --version | sed -n 's/.* v=\([^ ]*\).*/\1/p') on loopback."
  echo
  echo "## Rust (flock-client)"
  echo '```'
  cargo run -q -p flock-client --release --example bench -- --port "$port" --iters "$iters"
  echo '```'
  if [ -f clients/python/bench.py ]; then
    .venv/bin/python -m pip install --quiet --disable-pip-version-check -e clients/python >&2
    echo
    echo "## Python (redis-flock)"
    echo '```'
    .venv/bin/python clients/python/bench.py --port "$port" --iterations "$iters"
    echo '```'
  fi
  if [ -f clients/node/bench.mjs ]; then
    echo
    echo "## Node.js (redis-flock)"
    echo '```'
    # The package's build (dist/) and its dev dependencies (ioredis, node-redis) come from npm ci.
    (cd clients/node && { [ -d node_modules ] && [ -d dist ] || npm ci --no-audit --no-fund >&2; } \
      && node bench.mjs --port "$port" --iterations "$iters")
    echo '```'
  fi
} | tee "$out.tmp"
mv "$out.tmp" "$out"
echo "bench-clients: wrote $out"
