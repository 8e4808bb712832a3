#!/usr/bin/env bash
# The Python client's suite, as `make test` runs it:
#   PY=/path/to/venv/bin/python clients/python/test.sh [pytest args...]
# Installs redis-flock (editable) with its test extras (pytest, from PyPI) into PY's
# environment, then runs pytest against real servers: REDIS_SERVER (default redis-server) with
# the module FLOCK_MODULE (default target/release/libredis_flock.so of the repo).
# Exits non-zero when a test fails, is skipped, or when no test was collected.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
repo="$(cd "$here/../.." && pwd)"
PY="${PY:-$repo/.venv/bin/python}"
case "$PY" in
  /*) ;;
  */*) PY="$(cd "$(dirname "$PY")" && pwd)/$(basename "$PY")" ;;  # relative to the caller's cwd
  *) PY="$(command -v "$PY" || echo "$PY")" ;;
esac
if [ ! -x "$PY" ]; then
  echo "clients/python/test.sh: $PY is not a python executable (set PY=/path/to/venv/bin/python)" >&2
  exit 1
fi
export FLOCK_MODULE="${FLOCK_MODULE:-$repo/target/release/libredis_flock.so}"
"$PY" -m pip install --quiet --disable-pip-version-check -e "$here[test]"
cd "$here"
# pytest exits 5 when it collected no tests: that fails this script too.
exec "$PY" -m pytest -q -p no:cacheprovider "$@"
