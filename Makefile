# Two commands on a fresh machine: `make run` and `make test` (see README.md).
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
CONFIG ?= config/lakefeed.yaml

.PHONY: run test setup lint bench

run: $(VENV)/.installed
	$(BIN)/python -c "from lakefeed.ops.spark import check_java; check_java()"
	$(BIN)/lakefeed run --config $(CONFIG)

test: $(VENV)/.installed
	$(BIN)/python -c "from lakefeed.ops.spark import check_java; check_java()"
	$(BIN)/ruff check daemon connectors tests bench
	$(BIN)/python -m pytest

setup: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -c "import sys; assert sys.version_info >= (3, 11), 'lakefeed needs Python 3.11+'"
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[test]'
	touch $@

bench: $(VENV)/.installed
	$(BIN)/python bench/ingest_files.py
