# Two commands on a fresh machine with Python 3.11+ and pip:
#   make demo   - the weekly run on this machine (real Airflow components), progress bar, report
#   make test   - lint, type-check and the test suite (starts its own PostgreSQL); make test-long: the long tier
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed-$(shell cat pyproject.toml .ci/constraints.txt | cksum | cut -d' ' -f1)

.PHONY: demo test test-long install lint bench

$(STAMP): pyproject.toml .ci/constraints.txt
	python3 -m venv $(VENV)
	$(VENV)/bin/pip install -q --disable-pip-version-check uv
	$(VENV)/bin/uv pip install -q --python $(PY) -c .ci/constraints.txt -e ".[test]"
	rm -f $(VENV)/.installed-* && touch $@

install: $(STAMP)

demo: $(STAMP)
	$(VENV)/bin/avsim demo $(ARGS)

lint: $(STAMP)
	$(VENV)/bin/ruff check provider tests dags plugins bench
	$(VENV)/bin/mypy

test: lint
	$(PY) -m pytest -m "not long" $(ARGS)

test-long: $(STAMP)
	$(PY) -m pytest -m long $(ARGS)

bench: $(STAMP)
	$(PY) bench/parse_time.py
