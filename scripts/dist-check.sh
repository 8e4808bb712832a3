#!/usr/bin/env bash
# Checks the release archive that `make dist` built, as a user would receive it (`make dist-check`):
#   1. unpacks dist/flock-<version>-x86_64-linux-gnu.tar.gz in a temporary folder, checks it has
#      the one top folder flock-<version>/ with the expected files, the archive's .sha256 and
#      `sha256sum -c SHA256SUMS`;
#   2. reads the dynamic symbols (objdump -T) of the module and of the redis-flock tool and fails
#      if any needs a glibc newer than 2.17, or a library outside glibc; prints each one's
#      highest GLIBC_ version (the floor a machine needs); runs `redis-flock --version`, and
#      `redis-flock run` against a port nothing listens on (status 69, COMMAND not started);
#   3. for each server (scripts/servers.sh: redis-7.0, valkey-8.1, valkey-9.1), on a free
#      loopback port in a temporary folder:
#        a. starts it with the archive's redis.conf.example (its loadmodule line pointed at the
#           unpacked module) and runs a lock with redis-cli: FLOCK.ACQUIRE k me 30000 gives a
#           token, FLOCK.CHECK k <token> is the remaining lease
#           (1 to 30000 ms), FLOCK.RELEASE k me is 1, FLOCK.CHECK then 0;
#           then the unpacked redis-flock (REDIS_URL): `run K -- true` exits 0; `run K -- sh -c
#           'exit 3'` exits 3 (COMMAND's own status; --lost-exit-code 100 there, so a 3 cannot
#           be the tool's loss status); a run whose COMMAND calls `redis-flock holders K` and
#           `info K` and FLOCK.CHECKs $FLOCK_TOKEN sees its own grant; with K held by another
#           owner, `run K -- true` exits 75 and COMMAND does not run; `holders K` prints nothing
#           once the lock is released;
#        b. starts it without the module and loads it the other way INSTALL shows, MODULE LOADEX
#           <path> CONFIG flock.max-ttl-ms 60000, then checks CONFIG GET and runs the same lock.
# Stops every server it started (also on failure or Ctrl-C) and removes the folder. Exits
# non-zero with a message naming the failed step.
set -euo pipefail
cd "$(dirname "$0")/.."
root="$(pwd)"

GLIBC_FLOOR=2.17
if [ "$#" -gt 0 ]; then SERVERS=("$@"); else SERVERS=(redis-7.0 valkey-8.1 valkey-9.1); fi

fail() { echo "dist-check: FAILED: $*" >&2; exit 1; }

version="$(awk '/^\[/{p=($0=="[package]")} p && /^version[[:space:]]*=/{gsub(/.*=[[:space:]]*"|".*/,""); print; exit}' Cargo.toml)"
[ -n "$version" ] || fail "no version in the [package] table of Cargo.toml"
name="flock-$version"
archive="$root/dist/$name-x86_64-linux-gnu.tar.gz"
[ -f "$archive" ] || fail "$archive does not exist: run make dist"
command -v redis-cli >/dev/null || fail "redis-cli is missing (scripts/deps.sh installs redis-tools)"
command -v objdump >/dev/null || fail "objdump is missing (binutils)"

tmp="$(mktemp -d /tmp/flock-dist-check.XXXXXX)"
pids=()
cleanup() {
  local pid
  for pid in "${pids[@]+"${pids[@]}"}"; do
    kill "$pid" 2>/dev/null || true
  done
  for pid in "${pids[@]+"${pids[@]}"}"; do
    wait "$pid" 2>/dev/null || true
  done
  rm -rf "$tmp"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# ---- 1. the archive and its checksums ----
echo "== $archive: $(stat -c %s "$archive") bytes ($(du -h "$archive" | cut -f1))"
if [ -f "$archive.sha256" ]; then
  (cd "$(dirname "$archive")" && sha256sum --quiet -c "$(basename "$archive").sha256") \
    || fail "the archive does not match $archive.sha256"
  echo "   $(basename "$archive").sha256: OK"
else
  fail "$archive.sha256 is missing"
fi
tops="$(tar tzf "$archive" | cut -d/ -f1 | sort -u)"
[ "$tops" = "$name" ] || fail "the archive should have the one top folder $name/, it has: $(echo $tops)"
tar xzf "$archive" -C "$tmp"
pkg="$tmp/$name"
for f in libredis_flock.so redis-flock redis.conf.example LICENSE INSTALL SHA256SUMS; do
  [ -f "$pkg/$f" ] || fail "$name/$f is missing from the archive"
done
[ -x "$pkg/redis-flock" ] || fail "$name/redis-flock is not executable"
(cd "$pkg" && sha256sum --quiet -c SHA256SUMS) || fail "sha256sum -c SHA256SUMS failed in $name/"
listed="$(awk '{print $2}' "$pkg/SHA256SUMS" | sort | tr '\n' ' ')"
present="$(cd "$pkg" && ls -A | grep -vx SHA256SUMS | sort | tr '\n' ' ')"
[ "$listed" = "$present" ] || fail "SHA256SUMS lists '$listed' but the folder has '$present'"
echo "   $name/: $(echo $present), SHA256SUMS: OK ($(wc -l <"$pkg/SHA256SUMS") files)"
so="$pkg/libredis_flock.so"

# ---- 2. the glibc floor, and the tool on its own ----
tool="$pkg/redis-flock"

# check_elf FILE WHAT: fails if any symbol of FILE needs a glibc newer than $GLIBC_FLOOR, or a
# library or symbol version outside glibc; sets $highest and prints what it found.
check_elf() {
  local file="$1" what="$2" versions newer needed lib others weak
  versions="$(objdump -T "$file" | grep -o 'GLIBC_[0-9][0-9.]*' | sed 's/GLIBC_//' | sort -uV)"
  [ -n "$versions" ] || fail "objdump -T names no GLIBC_ version in $file"
  highest="$(tail -n 1 <<<"$versions")"
  newer="$(awk -v f="$GLIBC_FLOOR" 'BEGIN{split(f,F,".")} {split($0,V,"."); if (V[1]>F[1] || (V[1]==F[1] && V[2]+0>F[2]+0)) print}' <<<"$versions")"
  if [ -n "$newer" ]; then
    objdump -T "$file" | grep -E "GLIBC_($(echo $newer | tr ' ' '|' | sed 's/\./\\./g'))[^0-9.]" >&2 || true
    fail "$what needs GLIBC_$highest, newer than $GLIBC_FLOOR (symbols above)"
  fi
  # Libraries it needs: only glibc's own, and no symbol version from another (GCC_, GLIBCXX_).
  needed="$(readelf -d "$file" | sed -n 's/.*(NEEDED).*\[\(.*\)\]/\1/p' | tr '\n' ' ')"
  for lib in $needed; do
    case "$lib" in
      libc.so.6|libm.so.6|libdl.so.2|libpthread.so.0|librt.so.1|ld-linux-x86-64.so.2) ;;
      *) fail "$what needs $lib, which is not part of glibc (needed: $needed)" ;;
    esac
  done
  others="$(readelf -V "$file" | sed -n '/\.gnu\.version_r/,$p' | grep -o 'Name: [^ ]*' | awk '{print $2}' | grep -v '^GLIBC_' | sort -u | tr '\n' ' ' || true)"
  [ -z "$others" ] || fail "$what needs symbol versions outside glibc: $others"
  weak="$(objdump -T "$file" | awk '$2=="w" && $4=="*UND*" {print $NF}' | sort | tr '\n' ' ')"
  echo "== $what: GLIBC floor $highest (no symbol needs more than $GLIBC_FLOOR; versions used: $(echo $versions))"
  echo "   needs: $needed(no other library's symbol versions)"
  [ -z "$weak" ] || echo "   weak, unversioned, looked up at run time if present: $weak"
}
check_elf "$so" "the module (libredis_flock.so)"
module_floor="$highest"
check_elf "$tool" "the tool (redis-flock)"
tool_floor="$highest"

free_port() {
  python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1]); s.close()'
}

tool_version="$("$tool" --version)" || fail "redis-flock --version exited $?"
[[ "$tool_version" =~ ^redis-flock\ [0-9]+\.[0-9]+\.[0-9]+ ]] || fail "redis-flock --version printed '$tool_version'"
"$tool" --help | grep '^ *run ' >/dev/null || fail "redis-flock --help does not list the run subcommand"
# Nothing listens on a port just freed: status 69 (EX_UNAVAILABLE), COMMAND never started.
marker="$tmp/unreachable-ran"
status=0
REDIS_URL="redis://127.0.0.1:$(free_port)" "$tool" run k -- touch "$marker" 2>"$tmp/unreachable.err" || status=$?
[ "$status" = 69 ] || { cat "$tmp/unreachable.err" >&2; fail "redis-flock run against a closed port exited $status, not 69"; }
[ ! -e "$marker" ] || fail "redis-flock run against a closed port started COMMAND"
echo "   $tool_version; --help lists run; run against a closed port -> 69, COMMAND not started"

# ---- 3. load it into each server ----

# start_server NAME-TAG BIN DIR ARGS... : starts BIN in the background, waits for PING.
start_server() {
  local tag="$1" bin="$2" dir="$3"; shift 3
  port="$(free_port)"
  mkdir -p "$dir"
  "$bin" "$@" --port "$port" --bind 127.0.0.1 --dir "$dir" --logfile "$dir/server.log" \
    --daemonize no >"$dir/stdout.log" 2>&1 &
  pid=$!
  pids+=("$pid")
  local i
  for i in $(seq 1 100); do
    if [ "$(redis-cli -p "$port" PING 2>/dev/null)" = "PONG" ]; then return 0; fi
    if ! kill -0 "$pid" 2>/dev/null; then
      tail -n 20 "$dir/server.log" "$dir/stdout.log" >&2 2>/dev/null || true
      fail "$tag: the server exited at startup (log above)"
    fi
    sleep 0.1
  done
  tail -n 20 "$dir/server.log" >&2 || true
  fail "$tag: no PONG on 127.0.0.1:$port after 10 s"
}

stop_server() {
  redis-cli -p "$port" SHUTDOWN NOSAVE >/dev/null 2>&1 || true
  local i
  for i in $(seq 1 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
  kill "$pid" 2>/dev/null || true
  wait "$pid" 2>/dev/null || true
  local keep=() p
  for p in "${pids[@]+"${pids[@]}"}"; do [ "$p" = "$pid" ] || keep+=("$p"); done
  pids=("${keep[@]+"${keep[@]}"}")
}

cli() { redis-cli -p "$port" "$@"; }

# run_lock TAG: ACQUIRE, CHECK, RELEASE on the server at $port; sets $token.
run_lock() {
  local tag="$1" reply
  token="$(cli FLOCK.ACQUIRE k me 30000)"
  [[ "$token" =~ ^[0-9]+$ ]] || fail "$tag: FLOCK.ACQUIRE k me 30000 gave '$token', not a token"
  # CHECK answers the lease's remaining milliseconds (at least 1) while the token is live, else 0.
  remaining="$(cli FLOCK.CHECK k "$token")"
  [[ "$remaining" =~ ^[0-9]+$ ]] && [ "$remaining" -ge 1 ] && [ "$remaining" -le 30000 ] \
    || fail "$tag: FLOCK.CHECK k $token gave '$remaining', not the remaining lease (1 to 30000 ms)"
  reply="$(cli FLOCK.RELEASE k me)"
  [ "$reply" = "1" ] || fail "$tag: FLOCK.RELEASE k me gave '$reply', not 1"
  reply="$(cli FLOCK.CHECK k "$token")"
  [ "$reply" = "0" ] || fail "$tag: FLOCK.CHECK after the release gave '$reply', not 0"
}

# run_tool TAG DIR: the unpacked redis-flock against the server at $port (REDIS_URL).
run_tool() {
  local tag="$1" dir="$2" status out tok
  export REDIS_URL="redis://127.0.0.1:$port"
  status=0; "$tool" run dk -- true || status=$?
  [ "$status" = 0 ] || fail "$tag: redis-flock run dk -- true exited $status, not 0"
  status=0; "$tool" run dk --lost-exit-code 100 -- sh -c 'exit 3' || status=$?
  [ "$status" = 3 ] || fail "$tag: redis-flock run dk -- sh -c 'exit 3' exited $status, not COMMAND's 3"
  # COMMAND sees its own grant: FLOCK_TOKEN, the holders and info lines, FLOCK.CHECK.
  status=0
  "$tool" run dk --owner dist-check --ttl 30000 -- sh -c '
      echo "$FLOCK_KEY $FLOCK_OWNER $FLOCK_TOKEN" >"$1/env"
      "$0" holders "$FLOCK_KEY" >"$1/holders" && "$0" info "$FLOCK_KEY" >"$1/info" &&
      redis-cli -p "$2" FLOCK.CHECK "$FLOCK_KEY" "$FLOCK_TOKEN" >"$1/check"' "$tool" "$dir" "$port" || status=$?
  [ "$status" = 0 ] || fail "$tag: redis-flock run dk --owner dist-check -- (holders, info, FLOCK.CHECK) exited $status"
  read -r _ _ tok <"$dir/env"
  [ "$(cat "$dir/env")" = "dk dist-check $tok" ] && [[ "$tok" =~ ^[0-9]+$ ]] \
    || fail "$tag: COMMAND's FLOCK_KEY FLOCK_OWNER FLOCK_TOKEN were '$(cat "$dir/env")'"
  out="$(cat "$dir/holders")"
  [[ "$out" =~ ^dist-check$'\t'"$tok"$'\t'[0-9]+$ ]] || fail "$tag: redis-flock holders dk printed '$out' under the lock, not 'dist-check<TAB>$tok<TAB>ttl'"
  grep -qx "owner"$'\t'"dist-check" "$dir/info" && grep -qx "token"$'\t'"$tok" "$dir/info" \
    || fail "$tag: redis-flock info dk printed '$(tr '\t\n' ' ;' <"$dir/info")' under the lock"
  out="$(cat "$dir/check")"
  [[ "$out" =~ ^[0-9]+$ ]] && [ "$out" -ge 1 ] && [ "$out" -le 30000 ] \
    || fail "$tag: FLOCK.CHECK dk \$FLOCK_TOKEN gave '$out' inside COMMAND, not the remaining lease"
  # Held by another owner: not granted (75), COMMAND never started.
  [[ "$(cli FLOCK.ACQUIRE dk other 30000)" =~ ^[0-9]+$ ]] || fail "$tag: FLOCK.ACQUIRE dk other 30000 gave no token"
  status=0; "$tool" run dk -- touch "$dir/conflict-ran" 2>"$dir/conflict.err" || status=$?
  [ "$status" = 75 ] || { cat "$dir/conflict.err" >&2; fail "$tag: redis-flock run on a held key exited $status, not 75"; }
  [ ! -e "$dir/conflict-ran" ] || fail "$tag: redis-flock run on a held key started COMMAND"
  [ "$(cli FLOCK.RELEASE dk other)" = "1" ] || fail "$tag: FLOCK.RELEASE dk other was not 1"
  out="$("$tool" holders dk)" || fail "$tag: redis-flock holders dk exited $?"
  [ -z "$out" ] || fail "$tag: redis-flock holders dk printed '$out' after every release"
  unset REDIS_URL
  tool_token="$tok"
}

results=()
for server in "${SERVERS[@]}"; do
  bin="$(scripts/servers.sh "$server")" || fail "$server is not installed (scripts/deps.sh installs it)"
  sver="$("$bin" --version | sed -n 's/.* v=\([^ ]*\).*/\1/p')"
  echo "== $server ($sver): $bin"

  # a. loadmodule in the shipped redis.conf.example
  dir="$tmp/$server-conf"
  mkdir -p "$dir"
  sed "s#^loadmodule [^ ]*libredis_flock\.so#loadmodule $so#" "$pkg/redis.conf.example" >"$dir/redis.conf"
  grep -q "^loadmodule $so" "$dir/redis.conf" || fail "redis.conf.example has no loadmodule line for libredis_flock.so"
  start_server "$server loadmodule" "$bin" "$dir" "$dir/redis.conf"
  mods="$(cli INFO modules | tr -d '\r' | grep '^module:' | tr '\n' ' ')"
  [[ "$mods" == *name=flock* ]] || fail "$server: INFO modules does not show flock: '$mods'"
  run_lock "$server (loadmodule)"
  echo "   loadmodule (redis.conf.example): ACQUIRE -> $token, CHECK -> $remaining (ms left), RELEASE -> 1"
  run_tool "$server redis-flock" "$dir"
  echo "   redis-flock: run -- true -> 0, run -- sh -c 'exit 3' -> 3, run under owner dist-check: token $tool_token, holders/info show it, FLOCK.CHECK live; held elsewhere -> 75 (not started); holders after -> nothing"
  stop_server

  # b. MODULE LOADEX ... CONFIG into a running server
  dir="$tmp/$server-loadex"
  start_server "$server loadex" "$bin" "$dir" --save '' --appendonly no --enable-module-command local
  reply="$(cli MODULE LOADEX "$so" CONFIG flock.max-ttl-ms 60000)"
  [ "$reply" = "OK" ] || { tail -n 5 "$dir/server.log" >&2; fail "$server: MODULE LOADEX $so CONFIG flock.max-ttl-ms 60000 gave '$reply'"; }
  reply="$(cli CONFIG GET flock.max-ttl-ms | tail -n 1)"
  [ "$reply" = "60000" ] || fail "$server: CONFIG GET flock.max-ttl-ms gave '$reply' after LOADEX, not 60000"
  run_lock "$server (MODULE LOADEX)"
  echo "   MODULE LOADEX ... CONFIG flock.max-ttl-ms 60000: OK, CONFIG GET -> 60000; ACQUIRE -> $token, CHECK -> $remaining (ms left), RELEASE -> 1"
  stop_server
  results+=("$server $sver: loaded, lock OK, redis-flock OK")
done

echo "== dist-check summary"
echo "   archive: $(basename "$archive"), $(stat -c %s "$archive") bytes; GLIBC floor: module $module_floor, redis-flock $tool_floor"
printf '   %s\n' "${results[@]}"
echo "dist-check: ${#results[@]} passed, 0 failed"
