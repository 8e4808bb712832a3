#!/usr/bin/env bash
# Builds the release archive dist/flock-<version>-x86_64-linux-gnu.tar.gz (`make dist`):
#   flock-<version>/libredis_flock.so     the module, linked against glibc 2.17 symbols, so it
#                                         loads on any x86_64 Linux with glibc 2.17 or newer
#                                         (RHEL/CentOS 7+, Ubuntu 18.04+, Debian 9+, Amazon Linux 2)
#   flock-<version>/redis-flock           the command-line tool (clients/rust's binary: `run` a
#                                         command under a lock, `info`, `holders`, ...), built
#                                         the same way for the same glibc
#   flock-<version>/redis.conf.example    the repository's example configuration
#   flock-<version>/LICENSE, CHANGELOG.md
#   flock-<version>/INSTALL               how to check, install and load it
#   flock-<version>/SHA256SUMS            sha256sum of every other file in the folder
# and dist/flock-<version>-x86_64-linux-gnu.tar.gz.sha256 beside the archive.
# The build is one `cargo zigbuild --target x86_64-unknown-linux-gnu.2.17` for both (zig as C
# compiler and linker, against zig's glibc 2.17 stubs); output in
# target/x86_64-unknown-linux-gnu/release/, apart from the everyday target/release/. Building
# them together unifies only build-time features (of a proc-macro's syn), not the module's
# dependencies. scripts/deps.sh and scripts/dist-deps.sh install what it needs (make dist runs
# both). Fails if any symbol of either file needs a glibc newer than 2.17.
set -euo pipefail
cd "$(dirname "$0")/.."
root="$(pwd)"

GLIBC_FLOOR=2.17
TRIPLE=x86_64-unknown-linux-gnu
die() { echo "dist: $*" >&2; exit 1; }

# The redis-flock package's version: the first `version =` of the [package] table.
version="$(awk '/^\[/{p=($0=="[package]")} p && /^version[[:space:]]*=/{gsub(/.*=[[:space:]]*"|".*/,""); print; exit}' Cargo.toml)"
[ -n "$version" ] || die "no version in the [package] table of Cargo.toml"
name="flock-$version"
archive="dist/$name-x86_64-linux-gnu.tar.gz"

[ -x .venv/bin/cargo-zigbuild ] || die ".venv/bin/cargo-zigbuild is missing: run scripts/dist-deps.sh"
export PATH="$root/.venv/bin:$PATH"   # cargo-zigbuild finds zig as `python3 -m ziglang`

# bindgen (the redis-module crate's build script) parses redismodule.h with libclang.
# cargo-zigbuild hands it zig's libc headers in BINDGEN_EXTRA_CLANG_ARGS_<target>, but zig
# prints those paths relative to the current directory when its lib/ is below it (here:
# .venv/...), and the build script runs in the crate's own directory, where they resolve to
# nothing ('sys/types.h' file not found). So pass the same header folders as absolute paths;
# bindgen reads the hyphenated name first, and cargo-zigbuild appends its own value after ours.
zig_lib="$(cd / && python3 -m ziglang env | sed -n 's/^ *\.lib_dir = "\(.*\)",$/\1/p')"
[ -d "$zig_lib/libc/include" ] || die "zig's lib directory not found (python3 -m ziglang env): '$zig_lib'"
probe="$(mktemp -d)"
trap 'rm -rf "$probe"' EXIT
: >"$probe/t.c"
isystem="$(cd "$probe" && python3 -m ziglang cc -### -target x86_64-linux-gnu.$GLIBC_FLOOR -c t.c -o t.o 2>&1 |
  tr ' ' '\n' | tr -d '"' | awk 'prev=="-isystem"{print} {prev=$0}')"
[ -n "$isystem" ] || die "zig cc -### named no -isystem folders"
bindgen_args="-nostdinc -D__GLIBC_MINOR__=${GLIBC_FLOOR#2.}"
while read -r dir; do
  abs="$(cd "$probe" && realpath -e "$dir")" || die "zig's header folder $dir does not exist"
  bindgen_args+=" -isystem $abs"
done <<<"$isystem"

echo "dist: cargo zigbuild --release --target $TRIPLE.$GLIBC_FLOOR ($name: the module and redis-flock)"
start=$(date +%s)
env "BINDGEN_EXTRA_CLANG_ARGS_$TRIPLE=$bindgen_args" \
  cargo zigbuild --release --locked --target "$TRIPLE.$GLIBC_FLOOR" \
  -p redis-flock --lib -p flock-client --bin redis-flock
echo "dist: built in $(( $(date +%s) - start ))s"
so="target/$TRIPLE/release/libredis_flock.so"
tool="target/$TRIPLE/release/redis-flock"
[ -f "$so" ] || die "$so was not built"
[ -x "$tool" ] || die "$tool was not built"

# glibc_floor FILE: prints the newest GLIBC_x.y version any dynamic symbol of FILE needs, and
# fails when that is newer than $GLIBC_FLOOR.
glibc_floor() {
  local file="$1" highest
  highest="$(objdump -T "$file" | grep -o 'GLIBC_[0-9][0-9.]*' | sed 's/GLIBC_//' | sort -uV | tail -n 1)"
  [ -n "$highest" ] || die "objdump -T $file names no GLIBC_ version"
  if [ "$(printf '%s\n%s\n' "$highest" "$GLIBC_FLOOR" | sort -V | tail -n 1)" != "$GLIBC_FLOOR" ]; then
    objdump -T "$file" | awk '/GLIBC_/' | sort -k5 -V | tail -n 20 >&2
    die "$file needs GLIBC_$highest, newer than $GLIBC_FLOOR"
  fi
  echo "$highest"
}
highest="$(glibc_floor "$so")"
tool_highest="$(glibc_floor "$tool")"
# (grep reads all of objdump's output: with pipefail, `grep -q` stopping early would make
# objdump's SIGPIPE fail the check.)
objdump -T "$so" | grep 'RedisModule_OnLoad' >/dev/null || die "$so exports no RedisModule_OnLoad"
echo "dist: $so needs at most GLIBC_$highest"
echo "dist: $tool needs at most GLIBC_$tool_highest"

rm -rf "dist/$name" "$archive" "$archive.sha256"
mkdir -p "dist/$name"
stage="dist/$name"
cp "$so" "$stage/libredis_flock.so"
strip --strip-debug "$stage/libredis_flock.so"
install -m 0755 "$tool" "$stage/redis-flock"
strip --strip-debug "$stage/redis-flock"
"$stage/redis-flock" --version >/dev/null || die "$stage/redis-flock --version failed"
sed 's#^loadmodule /path/to/libredis_flock\.so#loadmodule /usr/local/lib/flock/libredis_flock.so#' \
  redis.conf.example >"$stage/redis.conf.example"
cp LICENSE CHANGELOG.md "$stage/"
cat >"$stage/INSTALL" <<EOF
flock $version: fenced locks for Redis (a loadable module), x86_64 Linux

  libredis_flock.so   the module, for the server
  redis-flock         the command-line tool: runs a command under a lock, looks at locks (step 5)

Needs: x86_64 Linux with glibc $GLIBC_FLOOR or newer (RHEL/CentOS 7 and later, Amazon Linux 2,
Ubuntu 18.04+, Debian 9+), for both files, and Redis 7.0 or newer or Valkey 8.1 or 9.1. Not for
musl (Alpine).

1. Check the files. Compare the archive's checksum with the one published next to it
   (flock-$version-x86_64-linux-gnu.tar.gz.sha256), then, after unpacking, every file:

     sha256sum -c flock-$version-x86_64-linux-gnu.tar.gz.sha256
     tar xzf flock-$version-x86_64-linux-gnu.tar.gz
     cd flock-$version && sha256sum -c SHA256SUMS

   Each line must end in OK.

2. Put the module where the server can read it, for example:

     sudo install -D -m 0644 libredis_flock.so /usr/local/lib/flock/libredis_flock.so

   The file must be readable by the user the server runs as (redis, valkey).

3. Load it at startup: add this line to redis.conf (valkey.conf) and restart the server
   (redis.conf.example here is a complete configuration for a lock service):

     loadmodule /usr/local/lib/flock/libredis_flock.so

   Settings go after the path, with or without the flock. prefix:

     loadmodule /usr/local/lib/flock/libredis_flock.so max-ttl-ms 60000 lock-delay-ms 1000

   Or load it into a running server (it is gone after a restart unless the config has it;
   Redis 7 and Valkey refuse MODULE LOAD unless the server runs with
   enable-module-command yes, or local for connections from the same machine):

     redis-cli MODULE LOAD /usr/local/lib/flock/libredis_flock.so
     redis-cli MODULE LOADEX /usr/local/lib/flock/libredis_flock.so CONFIG flock.max-ttl-ms 60000

   The settings: flock.max-ttl-ms, flock.max-waiters, flock.lock-delay-ms, flock.max-holders,
   flock.promotion-margin-ms, flock.stats-max-classes, flock.max-watchers (redis.conf.example
   gives each one's default and range); CONFIG GET flock.* shows them, CONFIG SET changes them.

4. Try it:

     redis-cli FLOCK.ACQUIRE mylock me 60000      -> a token, e.g. (integer) 1796023244718520
     redis-cli FLOCK.CHECK mylock <token>         -> the lease's remaining ms, e.g. (integer) 59599
     redis-cli FLOCK.RELEASE mylock me            -> (integer) 1

If the server does not start, its log names the reason: a bad setting names the argument; a
server older than Redis 7.0 names the missing module API function.

5. The command-line tool, redis-flock, on any machine that should take locks from a shell, a
   script or cron (it needs no Redis installation, only the server's address):

     ./redis-flock --help
     sudo install -m 0755 redis-flock /usr/local/bin/redis-flock

   redis-flock run KEY -- COMMAND ARGS... runs COMMAND only once it holds the lock KEY, with
   FLOCK_KEY, FLOCK_OWNER and FLOCK_TOKEN in its environment, renews the lease while COMMAND
   runs, stops COMMAND (SIGTERM, then SIGKILL after --grace) if the lock is lost, and releases
   the lock when COMMAND exits. --url redis://host:port (or REDIS_URL) names the server,
   default redis://127.0.0.1:6379:

     REDIS_URL=redis://127.0.0.1:6379 redis-flock run report:nightly --ttl 60000 -- ./nightly-report

   Its exit status is COMMAND's own when COMMAND ran with the lock held throughout; 75 when the
   lock was not granted (COMMAND never started; --wait MS waits in line for it); 3 when the
   lock was lost while COMMAND ran; 64 for bad arguments; 69 when the server cannot be reached
   or has no flock module. redis-flock info KEY, holders KEY, waiters KEY, watch KEY and stats
   look at locks, one tab-separated record a line. redis-flock run --help lists every option.
EOF
(cd "$stage" && sha256sum libredis_flock.so redis-flock redis.conf.example LICENSE CHANGELOG.md INSTALL >SHA256SUMS)

# A reproducible archive: fixed order, owner and times (the commit's), gzip without a timestamp.
epoch="$(git log -1 --format=%ct 2>/dev/null || date +%s)"
tar --sort=name --owner=0 --group=0 --numeric-owner --mtime="@$epoch" \
  -C dist -cf - "$name" | gzip -9n >"$archive"
rm -rf "$stage"
(cd dist && sha256sum "$(basename "$archive")" >"$(basename "$archive").sha256")
echo "dist: $archive ($(stat -c %s "$archive") bytes), module needs GLIBC_$highest at most, redis-flock GLIBC_$tool_highest"
