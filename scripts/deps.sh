#!/usr/bin/env bash
# Installs what a fresh Debian machine lacks to build and test flock:
# redis-server (the server the tests start), libclang (bindgen, used by the redis-module
# crate's build script) and a C compiler. As root it runs apt-get; otherwise it prints the
# exact command and fails.
set -euo pipefail

need=()
if [ -z "${REDIS_SERVER:-}" ] || [ "${REDIS_SERVER}" = "redis-server" ]; then
  command -v redis-server >/dev/null 2>&1 || need+=(redis-server)
  command -v redis-cli >/dev/null 2>&1 || need+=(redis-tools)
fi
if ! ldconfig -p 2>/dev/null | grep -q 'libclang[-.0-9]*\.so' \
   && ! ls /usr/lib/llvm-*/lib/libclang*.so* >/dev/null 2>&1; then
  need+=(libclang-dev)
fi
command -v cc >/dev/null 2>&1 || need+=(build-essential)
command -v python3 >/dev/null 2>&1 || need+=(python3)

if [ "${#need[@]}" -gt 0 ]; then
  if [ "$(id -u)" = "0" ]; then
    echo "deps: installing ${need[*]}"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    apt-get install -y -qq "${need[@]}" >/dev/null
  else
    echo "deps: missing ${need[*]}. Run as root:"
    echo "  apt-get update && apt-get install -y ${need[*]}"
    exit 1
  fi
fi

# redis-py, for the Python examples in examples/ (tests/examples.rs runs them).
if ! python3 -c "import redis" >/dev/null 2>&1; then
  if ! python3 -m pip --version >/dev/null 2>&1; then
    if [ "$(id -u)" = "0" ] && command -v apt-get >/dev/null 2>&1; then
      echo "deps: installing python3-pip"
      export DEBIAN_FRONTEND=noninteractive
      apt-get update -qq
      apt-get install -y -qq python3-pip >/dev/null
    else
      echo "deps: python3 has no pip, which the examples need to install redis-py. Run as root:"
      echo "  apt-get update && apt-get install -y python3-pip"
      exit 1
    fi
  fi
  echo "deps: installing redis-py (python3 -m pip install redis)"
  # Debian's Python is "externally managed" (PEP 668): plain pip refuses; then retry with
  # --break-system-packages.
  if ! pip_out=$(python3 -m pip install --quiet redis 2>&1); then
    if printf '%s' "$pip_out" | grep -q externally-managed-environment; then
      python3 -m pip install --quiet --break-system-packages redis
    else
      printf '%s\n' "$pip_out"
      echo "deps: python3 -m pip install redis failed"
      exit 1
    fi
  fi
  if ! python3 -c "import redis" >/dev/null 2>&1; then
    echo "deps: redis-py still cannot be imported by python3; install it: python3 -m pip install redis"
    exit 1
  fi
fi

if ! command -v cargo >/dev/null 2>&1; then
  echo "deps: cargo (the Rust toolchain) is missing: install it with rustup (https://rustup.rs)."
  exit 1
fi
