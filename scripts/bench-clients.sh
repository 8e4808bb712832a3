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
# The replica is started inside the { ... } | tee below, a subshell: the ports it was tried on
# reach this trap through $dir/replica.ports (a variable set there would not).
trap 'for p in $(cat "$dir/replica.ports" 2>/dev/null) "$port"; do if [ "$p" != 0 ]; then redis-cli -p "$p" shutdown nosave >/dev/null 2>&1 || true; fi; done; rm -rf "$dir"' EXIT
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
  echo "raw commands and client calls alternating (Rust in rounds, Python and Node.js lock by lock), one redis-server $(redis-server --version | sed -n 's/.* v=\([^ ]*\).*/\1/p') on loopback."
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

  # Durable grants (client rule 10): the same server with one replica, each client's lease with
  # replicas=1 (ACQUIRE + WAIT 1 pipelined) against its plain lease, alternating.
  # 10,000 each (QUICK=1 and other counts under 5,000: that count): a p99 of 2,000 samples is the
  # 20th worst and moved by several hundred us from run to run on a 2-core machine.
  diters=$(( iters < 5000 ? iters : 10000 ))
  rport=0
  for _ in 1 2 3 4 5; do
    try=$(( 20000 + RANDOM % 20000 ))
    [ "$try" = "$port" ] && continue
    mkdir -p "$dir/replica"
    "${REDIS_SERVER:-redis-server}" --port "$try" --bind 127.0.0.1 --dir "$dir/replica" --save '' \
      --appendonly no --loadmodule "$module" --logfile "$dir/replica.log" --daemonize yes \
      --replicaof 127.0.0.1 "$port" || continue
    echo "$try" >> "$dir/replica.ports"
    for _ in $(seq 50); do
      if redis-cli -p "$try" ping 2>/dev/null | grep -q PONG; then rport=$try; break; fi
      sleep 0.1
    done
    [ "$rport" != 0 ] && break
  done
  # Linked, and acknowledging (a new replica's first acknowledgement can take a second).
  acked=0
  for _ in $(seq 100); do
    redis-cli -p "$port" set bench:durable:probe 1 >/dev/null 2>&1 || true
    if [ "$(redis-cli -p "$port" wait 1 200 2>/dev/null)" = 1 ]; then acked=1; break; fi
    sleep 0.1
  done
  redis-cli -p "$port" del bench:durable:probe >/dev/null 2>&1 || true
  echo
  echo "## Durable grants: replicas=1, one replica on loopback, $diters iterations each"
  if [ "$acked" != 1 ]; then
    echo "bench-clients: the replica did not come up or acknowledge writes; its log:" >&2
    cat "$dir/replica.log" >&2 || true
    exit 1
  else
    echo
    echo "### Rust"
    echo '```'
    FLOCK_MODULE="$module" cargo run -q -p flock-client --release --example durable_cost -- --port "$port" --iters "$diters"
    echo '```'
    echo
    echo "### Python"
    echo '```'
    .venv/bin/python clients/python/bench.py --port "$port" --iterations "$diters" --replicas 1
    echo '```'
    if [ -f clients/node/bench.mjs ]; then
      echo
      echo "### Node.js"
      echo '```'
      (cd clients/node && node bench.mjs --port "$port" --iterations "$diters" --replicas 1)
      echo '```'
    fi
  fi
} | tee "$out.tmp"
mv "$out.tmp" "$out"
echo "bench-clients: wrote $out"
