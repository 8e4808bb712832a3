#!/usr/bin/env bash
# Installs what `make dist` needs beyond scripts/deps.sh (which `make dist` runs first):
#   PyPI, into the project's .venv/:  ziglang         zig, the C toolchain and glibc 2.17 stubs the
#                                                     release build links against
#                                     cargo-zigbuild  cargo with zig as the linker (`cargo zigbuild`)
# and checks that the Rust toolchain has the host target's std (x86_64-unknown-linux-gnu;
# zigbuild builds for the host target with a glibc suffix, so no other std is needed).
# Kept out of scripts/deps.sh so the everyday `make test` does not download zig (about 50 MB).
# Prints nothing when everything is present.
set -euo pipefail
cd "$(dirname "$0")/.."

VENV=.venv
[ -x "$VENV/bin/python" ] || { echo "dist-deps: $VENV is missing: run scripts/deps.sh first"; exit 1; }

py_missing=()
"$VENV/bin/python" -m ziglang version >/dev/null 2>&1 || py_missing+=(ziglang)
[ -x "$VENV/bin/cargo-zigbuild" ] || py_missing+=(cargo-zigbuild)
if [ "${#py_missing[@]}" -gt 0 ]; then
  echo "dist-deps: $VENV/bin/pip install ${py_missing[*]}"
  "$VENV/bin/pip" install --quiet --disable-pip-version-check "${py_missing[@]}"
fi
"$VENV/bin/python" -m ziglang version >/dev/null 2>&1 || { echo "dist-deps: zig does not run after pip install ziglang"; exit 1; }
"$VENV/bin/cargo-zigbuild" --version >/dev/null 2>&1 || { echo "dist-deps: cargo-zigbuild does not run after pip install"; exit 1; }

host="$(rustc -vV | sed -n 's/^host: //p')"
[ "$host" = "x86_64-unknown-linux-gnu" ] || { echo "dist-deps: the release build is for x86_64 Linux; this toolchain's host is $host"; exit 1; }
if command -v rustup >/dev/null 2>&1 && ! rustup target list --installed 2>/dev/null | grep -x "$host" >/dev/null; then
  echo "dist-deps: the Rust std for $host is not installed (rustup target add $host)"
  exit 1
fi
