# Ringside: `make run` starts the platform, `make test` runs the whole suite.
PYTHON ?= $(shell for p in python3.11 python3.12 python3.13 python3; do $$p -c 'import sys; sys.exit(sys.version_info < (3, 11))' >/dev/null 2>&1 && echo $$p && break; done)
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-$(shell cat pyproject.toml bench/references.txt | cksum | cut -d' ' -f1)

.PHONY: install bytecode run test bench e2e lint clean

# uv installs in seconds what takes pip minutes. It reads no pip configuration, so this
# machine's (`pip config list`: a wheel folder, extra indexes, constraints) is passed on, and
# like pip it takes the best version among all the indexes. It compiles the bytecode as it
# installs: where PYTHONDONTWRITEBYTECODE is set (CI's machine sets it) no process would write
# it, and each one (an engine's launcher and its ranks, an evaluation, a worker) compiled all of
# torch again: seconds of CPU each, half of a short run's.
UV_PIP = $(BIN)/uv pip install -q --compile-bytecode --python $(BIN)/python \
	--index-strategy unsafe-best-match \
	$(shell $(BIN)/python -m pip config list 2>/dev/null | \
	  sed -nE "s/^[^.]*\.(find-links|extra-index-url|index-url|constraint)='(.*)'$$/\1 \2/p" | \
	  while read -r name values; do for v in $$values; do printf -- '--%s %s ' $$name $$v; done; done)

install: $(STAMP)

$(STAMP): pyproject.toml bench/references.txt
	@test -n "$(PYTHON)" || { echo "Ringside needs Python 3.11 or newer on PATH" >&2; exit 1; }
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip uv
	$(UV_PIP) -e '.[test]'
	$(UV_PIP) --no-deps -r bench/references.txt
	@rm -f $(VENV)/.installed-*
	@touch $@

# Ringside's own modules, compiled as the installed ones are (they change between runs)
bytecode: install
	@$(BIN)/python -m compileall -q engine platform bench tests

run: bytecode
	$(BIN)/python manage.py serve

test: bytecode
	@test -x /usr/bin/chromium || test -x /usr/bin/chromium-browser || $(BIN)/python -m playwright install chromium
	$(BIN)/python -m pytest -n 2

e2e: bytecode
	$(BIN)/python -m pytest tests/e2e

# Each benchmark prints one JSON document (kept in bench/results/); `collectives` and `paro`
# build an emulated cluster with network namespaces, so they need root.
BENCHES := moe_layer moe_model loss_memory collectives paro checkpoint timing_overhead \
           api_latency worker_loss ingest_rate ws_fanout step_to_browser host_loss multi_host \
           straggler large_run data sinks slurm false_alarms

bench: bytecode
	@mkdir -p bench/results
	$(BIN)/python -m pytest -m bench -q
	@for b in $(BENCHES); do \
	  echo "== bench/$$b.py"; \
	  $(BIN)/python -m bench.$$b > bench/results/$$b.json || exit 1; \
	  cat bench/results/$$b.json; \
	done

lint: install
	$(BIN)/ruff check engine platform bench tests

clean:
	rm -rf $(VENV) var runs test-results bench/results
