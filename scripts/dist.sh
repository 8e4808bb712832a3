#!/usr/bin/env bash
# Builds the release archive dist/flock-<version>-x86_64-linux-gnu.tar.gz (`make dist`):
#   flock-<version>/libredis_flock.so     the module, linked against glibc 2.17 symbols, so it
#                                         loads on any x86_64 Linux with glibc 2.17 or newer
#                                         (RHEL/CentOS 7+, Ubuntu 18.04+, Debian 9+, Amazon Linux 2)
#   flock-<version>/redis.conf.example    the repository's example configuration
#   flock-<version>/LICENSE, CHANGELOG.md
#   flock-<version>/INSTALL               how to check, install and load it
#   flock-<version>/SHA256SUMS            sha256sum of every other file in the folder
# and dist/flock-<version>-x86_64-linux-gnu.tar.gz.sha256 beside the archive.
# The build is `cargo zigbuild --target x86_64-unknown-linux-gnu.2.17` (zig as C compiler and
# linker, against zig's glibc 2.17 stubs); output in target/x86_64-unknown-linux-gnu/release/,
# apart from the everyday target/release/. scripts/deps.sh and scripts/dist-deps.sh install
# what it needs (make dist runs both). Fails if any symbol needs a glibc newer than 2.17.
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

echo "dist: cargo zigbuild --release --target $TRIPLE.$GLIBC_FLOOR ($name)"
start=$(date +%s)
env "BINDGEN_EXTRA_CLANG_ARGS_$TRIPLE=$bindgen_args" \
  cargo zigbuild --release --locked --target "$TRIPLE.$GLIBC_FLOOR" -p redis-flock --lib
echo "dist: built in $(( $(date +%s) - start ))s"
so="target/$TRIPLE/release/libredis_flock.so"
[ -f "$so" ] || die "$so was not built"

# The glibc floor: the newest GLIBC_x.y version any dynamic symbol needs.
highest="$(objdump -T "$so" | grep -o 'GLIBC_[0-9][0-9.]*' | sed 's/GLIBC_//' | sort -uV | tail -n 1)"
[ -n "$highest" ] || die "objdump -T $so names no GLIBC_ version"
if [ "$(printf '%s\n%s\n' "$highest" "$GLIBC_FLOOR" | sort -V | tail -n 1)" != "$GLIBC_FLOOR" ]; then
  objdump -T "$so" | awk -v f="$GLIBC_FLOOR" '/GLIBC_/' | sort -k5 -V | tail -n 20 >&2
  die "$so needs GLIBC_$highest, newer than $GLIBC_FLOOR"
fi
# (grep reads all of objdump's output: with pipefail, `grep -q` stopping early would make
# objdump's SIGPIPE fail the check.)
objdump -T "$so" | grep 'RedisModule_OnLoad' >/dev/null || die "$so exports no RedisModule_OnLoad"
echo "dist: $so needs at most GLIBC_$highest"

rm -rf "dist/$name" "$archive" "$archive.sha256"
mkdir -p "dist/$name"
stage="dist/$name"
cp "$so" "$stage/libredis_flock.so"
strip --strip-debug "$stage/libredis_flock.so"
sed 's#^loadmodule /path/to/libredis_flock\.so#loadmodule /usr/local/lib/flock/libredis_flock.so#' \
  redis.conf.example >"$stage/redis.conf.example"
cp LICENSE CHANGELOG.md "$stage/"
cat >"$stage/INSTALL" <<EOF
flock $version: fenced locks for Redis (a loadable module), x86_64 Linux

Needs: x86_64 Linux with glibc $GLIBC_FLOOR or newer (RHEL/CentOS 7 and later, Amazon Linux 2,
Ubuntu 18.04+, Debian 9+), and Redis 7.0 or newer or Valkey 8.1 or 9.1. Not for musl (Alpine).

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
EOF
(cd "$stage" && sha256sum libredis_flock.so redis.conf.example LICENSE CHANGELOG.md INSTALL >SHA256SUMS)

# A reproducible archive: fixed order, owner and times (the commit's), gzip without a timestamp.
epoch="$(git log -1 --format=%ct 2>/dev/null || date +%s)"
tar --sort=name --owner=0 --group=0 --numeric-owner --mtime="@$epoch" \
  -C dist -cf - "$name" | gzip -9n >"$archive"
rm -rf "$stage"
(cd dist && sha256sum "$(basename "$archive")" >"$(basename "$archive").sha256")
echo "dist: $archive ($(stat -c %s "$archive") bytes), module needs GLIBC_$highest at most"
