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

if ! command -v cargo >/dev/null 2>&1; then
  echo "deps: cargo (the Rust toolchain) is missing: install it with rustup (https://rustup.rs)."
  exit 1
fi
