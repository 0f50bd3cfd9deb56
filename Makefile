# Two commands on a fresh machine with Python 3.11+ and pip:
#   make demo   - the weekly run on this machine (real Airflow components), progress bar, report
#   make test   - the Debian packages it needs (.ci/system-packages), lint, type-check and the test suite
#                 (starts its own PostgreSQL); make test-long: the long tier; make test-install: the
#                 install tier (the wheel in a fresh Airflow, and the lowest supported versions)
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed-$(shell cat pyproject.toml .ci/constraints.txt Makefile | cksum | cut -d' ' -f1)

.PHONY: demo test test-long test-install system-packages install lint bench bytecode

# --compile-bytecode: the packages' bytecode is written once at install, as pip does by default and
# as a deployment's image has it. uv does not by default, and where PYTHONDONTWRITEBYTECODE is set
# nothing writes it later: every Airflow process would compile what it imports from source (the
# Kubernetes provider's clients alone cost a phase task ~2 CPU-s at each start; docs/performance.md).
$(STAMP): pyproject.toml .ci/constraints.txt Makefile
	python3 -m venv $(VENV)
	$(VENV)/bin/pip install -q --disable-pip-version-check uv
	$(VENV)/bin/uv pip install -q --compile-bytecode --python $(PY) -c .ci/constraints.txt -e ".[test]"
	rm -f $(VENV)/.installed-* && touch $@

install: $(STAMP)

# avsim itself is installed editable: its bytecode, and the DAG and plugin files', brought up to date
# (only what changed is compiled).
bytecode: $(STAMP)
	$(PY) -m compileall -q provider/avsim dags plugins

demo: bytecode
	$(VENV)/bin/avsim demo $(ARGS)

lint: $(STAMP)
	$(VENV)/bin/ruff check provider tests dags plugins bench
	$(VENV)/bin/mypy

# Installs what is missing when run as root with apt; otherwise stops at once, naming the packages.
system-packages:
	@.ci/system-packages

test: system-packages lint bytecode
	$(PY) -m pytest -m "not long and not install" $(ARGS)

test-long: system-packages bytecode
	$(PY) -m pytest -m long $(ARGS)

# Builds venvs: the wheel installed into a fresh Airflow as docs/install.md says, and the lowest
# supported set (.ci/constraints-lowest.txt), each running a 10-case week on the real scheduler.
test-install: system-packages bytecode
	$(PY) -m pytest -m install $(ARGS)

bench: bytecode
	$(PY) bench/parse_time.py
