# flock: fenced locks for Redis. `make help` lists the targets.
PORT ?= 6379
REDIS_SERVER ?= redis-server
MODULE := $(CURDIR)/target/release/libredis_flock.so
RUN_DIR := $(CURDIR)/.run
export REDIS_SERVER

.PHONY: help deps build run test unit-test integration-test bench clean

help:
	@echo "make run     install what is missing, build, start redis-server with flock on port $(PORT) (PORT=... to change)"
	@echo "make test    install what is missing, build, run unit and integration tests (REDIS_SERVER=... for another server)"
	@echo "make build   build the module: $(MODULE)"
	@echo "make bench   build, then benchmark flock against SET NX PX and Lua locks; writes docs/BENCHMARKS.md (QUICK=1: under a minute)"
	@echo "make clean   remove build output"

deps:
	@bash scripts/deps.sh

build: deps
	cargo build --release

run: build
	@mkdir -p $(RUN_DIR)
	@sed 's#^loadmodule .*libredis_flock\.so#loadmodule $(MODULE)#' redis.conf.example > $(RUN_DIR)/redis.conf
	@echo "Starting $(REDIS_SERVER) on 127.0.0.1:$(PORT) with flock; try: redis-cli -p $(PORT) FLOCK.ACQUIRE lk me 30000"
	$(REDIS_SERVER) $(RUN_DIR)/redis.conf --port $(PORT) --dir $(RUN_DIR)

unit-test: deps
	cargo test --release --lib

integration-test: build
	FLOCK_MODULE=$(MODULE) cargo test --release --test '*' -- --test-threads=4

test: unit-test integration-test

# QUICK=1: smaller counts, shorter runs, report in target/bench-quick/ instead of docs/.
bench: build
	FLOCK_MODULE=$(MODULE) cargo bench --bench flock $(if $(filter 1 yes true,$(QUICK)),-- --quick)

clean:
	cargo clean
	rm -rf $(RUN_DIR)
