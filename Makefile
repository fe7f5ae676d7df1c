# The two commands: `make demo` and `make test`. Each sets up what it needs, idempotently.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
export DAGSTER_HOME ?= $(CURDIR)/.dagster_home

.PHONY: demo test docker base-image install dev bench

demo: base-image
	$(VENV)/bin/handhold demo

test: base-image
	HANDHOLD_REQUIRE_DOCKER=1 $(PY) -m pytest -q

dev: base-image
	@$(PY) -c "from pipeline.cli import ensure_dagster_home; ensure_dagster_home()"
	$(VENV)/bin/dagster dev -m assets.definitions

bench: base-image
	$(PY) benchmarks/sandbox_exec.py

install: $(STAMP)

$(STAMP): pyproject.toml constraints.txt
	@$(PYTHON) -c 'import sys; assert sys.version_info >= (3, 11), "handhold needs Python >= 3.11"'
	test -x $(VENV)/bin/pip || { rm -rf $(VENV) && $(PYTHON) -m venv $(VENV); }
	$(PY) -m pip install -q --disable-pip-version-check -c constraints.txt -e '.[test]'
	touch $(STAMP)

docker:
	@bash scripts/ensure_docker.sh

base-image: install docker
	@$(VENV)/bin/handhold base-image
