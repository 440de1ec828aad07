# One-command entry points. Every target builds its own virtualenv in .venv on first use.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: test test-fast screenshots typecheck serve bench bench-quick lint clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	PYTHONWARNINGS="ignore:Editable installation" $(PY) -m pip install --quiet -e '.[test]'
	touch $(STAMP)

## make test: lint, type check, then the whole default test suite (torture long modes: LOGSTORE_LONG=1)
test: $(STAMP)
	$(PY) -m ruff check logstore server tools bench tests
	$(PY) -m mypy
	$(PY) -m pytest -q

## make test-fast: the inner loop - no torture, no server, no slow tests (~1/4 of the time)
test-fast: $(STAMP)
	$(PY) -m ruff check logstore server tools bench tests
	$(PY) -m pytest -q -m "not torture and not server and not slow"

## make screenshots: redraw docs/ui/*.png (docs/UI.md) with the browser test; a plain test run leaves them
screenshots: $(STAMP)
	LOGSTORE_SCREENSHOTS=1 $(PY) -m pytest -q tests/test_server_ui_browser.py -k screenshots

## make typecheck: mypy (strict on logstore/core and server/; settings in pyproject.toml)
typecheck: $(STAMP)
	$(PY) -m mypy

## make serve: start the MCP server on ./data (creates a 'local' site on first run).
## make serve PORT=9000 DATA_DIR=/srv/logstore: other port / data dir (or LOGSTORE_PORT, LOGSTORE_DATA_DIR).
## Ctrl-C stops it; exit status 130 (interrupted) is a normal stop, not an error for make.
serve: $(STAMP)
	@trap 'true' INT; \
	$(VENV)/bin/logstore serve $(if $(PORT),--port '$(PORT)') $(if $(DATA_DIR),--data-dir '$(DATA_DIR)'); \
	status=$$?; [ $$status -eq 130 ] || exit $$status

## make bench: the full benchmark table (bench-quick: about a minute)
bench: $(STAMP)
	$(PY) -m bench

bench-quick: $(STAMP)
	$(PY) -m bench --quick

lint: $(STAMP)
	$(PY) -m ruff check logstore server tools bench tests
	$(PY) -m ruff format --check logstore server tools bench tests

clean:
	rm -rf $(VENV) .pytest_cache .hypothesis
