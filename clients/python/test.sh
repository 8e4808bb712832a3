#!/usr/bin/env bash
# The Python client's suite, as `make test` runs it:
#   PY=/path/to/venv/bin/python clients/python/test.sh [pytest args...]
# Installs redis-flock (editable) with its test extras (pytest, from PyPI) into PY's
# environment, then runs pytest against real servers: REDIS_SERVER (default redis-server) with
# the module FLOCK_MODULE (default target/release/libredis_flock.so of the repo).
# Exits non-zero when a test fails, is skipped, or when no test was collected.
# The tests mostly wait on servers and timers, so they run in PYTEST_WORKERS (default 4)
# pytest-xdist processes; PYTEST_WORKERS=0 runs them in this one process.
# FLOCK_PY_INSTALL=0: skip the install (make client-test installs once, then runs two suites).
# FLOCK_REDIS_PY=5: fail unless the redis-py that `import redis` finds is 5.x (the redis-py 5
# run of make client-test, which puts redis-py 5 first on PYTHONPATH).
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
if [ "${FLOCK_PY_INSTALL:-1}" != 0 ]; then
  "$PY" -m pip install --quiet --disable-pip-version-check -e "$here[test]"
fi
cd "$here"
ver="$("$PY" -c 'import redis; print(redis.__version__)')"
echo "clients/python/test.sh: redis-py $ver ($("$PY" -c 'import redis; print(redis.__file__)'))"
if [ -n "${FLOCK_REDIS_PY:-}" ] && [ "${ver%%.*}" != "$FLOCK_REDIS_PY" ]; then
  echo "clients/python/test.sh: redis-py $ver is not the $FLOCK_REDIS_PY.x asked for (FLOCK_REDIS_PY)" >&2
  exit 1
fi
workers=(); [ "${PYTEST_WORKERS:-4}" != 0 ] && workers=(-n "${PYTEST_WORKERS:-4}")
# pytest exits 5 when it collected no tests: that fails this script too.
exec "$PY" -m pytest -q -p no:cacheprovider "${workers[@]}" "$@"
