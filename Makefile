# One-command entry points. Every target builds its own virtualenv in .venv on first use.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: test serve bench bench-quick lint clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[test]'
	touch $(STAMP)

## make test: lint, then the whole default test suite (torture long modes: LOGSTORE_LONG=1)
test: $(STAMP)
	$(PY) -m ruff check logstore server tools bench tests
	$(PY) -m pytest -q

## make serve: start the MCP server on ./data (creates a 'local' site on first run)
serve: $(STAMP)
	$(VENV)/bin/logstore serve

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
