# Ringside: `make run` starts the platform, `make test` runs the whole suite.
PYTHON ?= $(shell for p in python3.13 python3.12 python3.11 python3; do command -v $$p >/dev/null 2>&1 && echo $$p && break; done)
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-$(shell cat pyproject.toml | cksum | cut -d' ' -f1)

.PHONY: install run test bench e2e lint clean

install: $(STAMP)

$(STAMP): pyproject.toml
	@$(PYTHON) -c 'import sys; sys.exit(0 if sys.version_info >= (3, 11) else "Ringside needs Python 3.11 or newer; found " + sys.version.split()[0])'
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -e '.[test]'
	@rm -f $(VENV)/.installed-*
	@touch $@

run: install
	$(BIN)/python manage.py serve

test: install
	@test -x /usr/bin/chromium || test -x /usr/bin/chromium-browser || $(BIN)/python -m playwright install chromium
	$(BIN)/python -m pytest

e2e: install
	$(BIN)/python -m pytest tests/e2e

bench: install
	@mkdir -p bench/results
	@for b in moe_layer moe_model collectives paro checkpoint timing_overhead; do \
	  test -f bench/$$b.py || continue; \
	  echo "== bench/$$b.py"; \
	  $(BIN)/python -m bench.$$b | tee bench/results/$$b.json || exit 1; \
	done

lint: install
	$(BIN)/ruff check engine platform bench tests

clean:
	rm -rf $(VENV) var runs test-results bench/results
