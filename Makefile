# The two commands: `make demo` and `make test`. Each sets up what it needs, idempotently.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
export DAGSTER_HOME ?= $(CURDIR)/.dagster_home

.PHONY: demo test docker base-image install dev bench chromium redis

# The demo writes the bytecode of what it imports, as the suite does (WRITE_BYTECODE below), and the training
# stack's is written beforehand in the background, at the lowest priority, while the graph's first steps run: a
# fresh clone has none, and the first training step compiled torch, transformers and TRL in memory on the demo's
# path (their import: 23.5 CPU s without bytecode, 8.1 with it).
TRAINING_IMPORTS := import training.dpo, training.sft, training.actguide, training.masking, training.tiny_model, \
  peft; from trl import SFTTrainer, SFTConfig, DPOTrainer; from transformers import AutoModelForCausalLM, \
  AutoTokenizer, LlamaForCausalLM, GenerationConfig, TrainerCallback, get_scheduler

demo: base-image
	@($(WRITE_BYTECODE) nice -n 19 $(PY) -c '$(TRAINING_IMPORTS)' >/dev/null 2>&1 &)
	$(WRITE_BYTECODE) $(VENV)/bin/handhold demo

# The suite's workers (pytest-xdist), a test file each at a time, the slowest files first (tests/conftest.py). The
# suite keeps both cores busy: a third worker only added contention (fresh clones at a36b1fe, one after the other:
# 2 workers 716 s and 1,270 busy CPU s, 3 workers 757 s and 1,459 CPU s; at e75e190, 3 workers then 2: 712 s and
# 1,393 CPU s, then 773 s and 1,452: the second of each pair was the slower, within the machine's hourly swings).
TEST_WORKERS ?= 2
# The suite, `dagster dev` and the demo let Python write the bytecode of what they import: where
# PYTHONDONTWRITEBYTECODE is set (as on this machine) no import writes it, and every process compiled torch,
# transformers and dagster from source again (collecting the suite: 39 -> 15 CPU s once written; loading the
# definitions 5.7 -> 3.0). Written on first import, only what is imported (8,400 of the venv's 24,800 modules):
# compiling the whole venv up front cost 106 CPU s.
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
