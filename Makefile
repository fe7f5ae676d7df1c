# The two commands: `make demo` and `make test`. Each sets up what it needs, idempotently.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
export DAGSTER_HOME ?= $(CURDIR)/.dagster_home

.PHONY: demo test docker base-image install dev bench chromium redis

demo: base-image
	$(VENV)/bin/handhold demo

# The suite's workers (pytest-xdist), a test file each at a time, the slowest files first (tests/conftest.py):
# most tests wait on containers, not the CPU.
TEST_WORKERS ?= 3
# The commands that start many Python processes (the suite, `dagster dev`) let Python write the bytecode of what it
# imports: where PYTHONDONTWRITEBYTECODE is set (as on this machine) no import writes it, and every process compiled
# torch, transformers and dagster from source again (collecting the suite: 39 -> 15 CPU s once written; loading the
# definitions 5.7 -> 3.0). Written on first import, only what is imported (8,400 of the venv's 24,800 modules):
# compiling the whole venv up front cost 106 CPU s, and the demo, one process, compiles what it imports in memory.
WRITE_BYTECODE := env -u PYTHONDONTWRITEBYTECODE

test: base-image chromium redis
	$(WRITE_BYTECODE) HANDHOLD_REQUIRE_DOCKER=1 \
	  $(PY) -m pytest -q -n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder

# The Dagster UI: the code location `handhold` ([tool.dagster] in pyproject.toml), the instance in DAGSTER_HOME
# (its dagster.yaml caps the sandboxes pool: HANDHOLD_SANDBOX_POOL_LIMIT=N make dev).
dev: base-image
	@$(PY) -c "from pipeline.instance import ensure_dagster_home; ensure_dagster_home()"
	$(WRITE_BYTECODE) $(VENV)/bin/dagster dev

bench: base-image
	$(PY) benchmarks/sandbox_exec.py

install: $(STAMP)

$(STAMP): pyproject.toml constraints.txt
	@$(PYTHON) -c 'import sys; assert sys.version_info >= (3, 11), "handhold needs Python >= 3.11"'
	bash scripts/install_venv.sh $(PYTHON) $(VENV)
	touch $(STAMP)

docker:
	@bash scripts/ensure_docker.sh

# Debian's chromium, which tests/test_ui.py drives headless: installed as root on Debian when missing.
chromium:
	@command -v chromium >/dev/null || command -v chromium-browser >/dev/null || { \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
	    echo "Installing chromium from Debian's packages (the UI test drives it)..."; \
	    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null; \
	  else \
	    echo "tests/test_ui.py needs Chromium: install it (Debian: apt-get install chromium), then run this again." >&2; \
	    exit 1; \
	  fi; }

# Debian's redis-server, the Celery broker tests/test_celery.py starts on loopback: installed as root on Debian when missing.
redis:
	@command -v redis-server >/dev/null || { \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
	    echo "Installing redis-server from Debian's packages (the Celery test's broker)..."; \
	    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq redis-server >/dev/null; \
	  else \
	    echo "tests/test_celery.py needs redis-server: install it (Debian: apt-get install redis-server), then run this again." >&2; \
	    exit 1; \
	  fi; }

base-image: install docker
	@$(VENV)/bin/handhold base-image
