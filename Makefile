# Two commands on a fresh machine: `make run` and `make test` (see README.md).
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
CONFIG ?= config/lakefeed.yaml
# Spark's jars from Maven Central, resolved once into the venv (daemon/ops/jars.py); no start resolves them again.
# With them, a SPARK_HOME of compiled Python (daemon/ops/spark_home.py) and the driver's class archive.
JARS := $(VENV)/spark-jars/.ready-home
# The tests' Apache Kafka broker (tests/kafka_broker.py), resolved at set-up too: the suite reaches only 127.0.0.1.
TEST_JARS := $(VENV)/spark-jars/.ready-test-broker
# The runners' stand-in (daemon/ops/stand_in.c), built when there is a C compiler; without one, the fork server's
# launchers stand in themselves (daemon/ops/fork_launcher.py), 3 MiB more for each streaming source.
STAND_IN := $(BIN)/lakefeed-stand-in

.PHONY: run test test-requirements test-setup setup bench

run: $(VENV)/.installed $(JARS) $(STAND_IN)
	$(BIN)/python -c "from lakefeed.ops.spark import check_java; check_java()"
	$(BIN)/lakefeed run --config $(CONFIG)

# The set-up's steps that wait on the network (Maven Central) run side by side: the broker's jars beside Spark's.
test: test-requirements
	@$(MAKE) --no-print-directory --jobs=3 --output-sync=target test-setup
	$(BIN)/python -c "from lakefeed.ops.spark import check_java; check_java()"
	$(BIN)/ruff check daemon connectors tests bench
	$(BIN)/python -m pytest -n 2 --dist loadfile --no-loadscope-reorder

# Before anything is installed: the suite needs Java for Spark, and also drives Chromium (the status page
# test), systemd-analyze (the unit file tests; Debian's `systemd` package, systemd need not run), Rust's cargo
# (it builds tests/arrow_digest_ref, the reference of the ODF logical hash, from crates.io) and a C compiler (the
# stand-in's tests). All that is missing is named at once, with the apt-get line (README: Requirements). `make run`
# needs only Java.
test-requirements:
	@missing=""; why=""; \
	if ! command -v java >/dev/null 2>&1 && [ ! -x "$${JAVA_HOME:-/nonexistent}/bin/java" ]; then \
	  missing="$$missing openjdk-17-jre-headless"; why="$$why\n  java (17 or newer): Spark"; fi; \
	if ! command -v chromium >/dev/null 2>&1; then \
	  missing="$$missing chromium"; why="$$why\n  chromium: the status page test, in headless Chromium"; fi; \
	if ! command -v systemd-analyze >/dev/null 2>&1; then \
	  missing="$$missing systemd"; why="$$why\n  systemd-analyze (package systemd): the unit file tests"; fi; \
	if ! command -v $(CC) >/dev/null 2>&1; then \
	  missing="$$missing gcc"; why="$$why\n  $(CC) (package gcc): builds the runners' stand-in, daemon/ops/stand_in.c"; fi; \
	if ! command -v cargo >/dev/null 2>&1; then \
	  why="$$why\n  cargo (a current Rust, https://rustup.rs): builds the arrow-digest reference of the ODF hash tests"; fi; \
	if [ -n "$$why" ]; then \
	  printf 'make test: the test suite needs programs that are missing:%b\n' "$$why" >&2; \
	  [ -z "$$missing" ] || printf 'Install them (Debian): sudo apt-get install%s\n' "$$missing" >&2; \
	  exit 1; \
	fi

setup: $(VENV)/.installed $(JARS) $(STAND_IN)

test-setup: $(VENV)/.installed $(JARS) $(STAND_IN) $(TEST_JARS)

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -c "import sys; assert sys.version_info >= (3, 11), 'lakefeed needs Python 3.11+'"
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --disable-pip-version-check uv
	$(BIN)/uv pip install --quiet --compile-bytecode --python $(BIN)/python -e '.[test]'
	touch $@

$(JARS): $(VENV)/.installed
	$(BIN)/lakefeed jars fetch
	touch $@

$(STAND_IN): daemon/ops/stand_in.c $(VENV)/.installed
	@if command -v $(CC) >/dev/null 2>&1; then \
	  echo "$(CC) -O2 -Wall -Wextra -o $@ $<"; $(CC) -O2 -Wall -Wextra -o $@ $<; \
	else \
	  echo "make: no C compiler ($(CC)): the runners' launchers stand in themselves (3 MiB more each)" >&2; fi

$(TEST_JARS): $(VENV)/.installed
	$(BIN)/python -m tests.kafka_broker
	touch $@

bench: $(VENV)/.installed
	$(BIN)/python bench/ingest_files.py
