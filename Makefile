# The two commands: `make demo` and `make test`. Each sets up what it needs, idempotently.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
export DAGSTER_HOME ?= $(CURDIR)/.dagster_home

.PHONY: demo test bytecode docker base-image install dev bench chromium redis test-tools

# The demo writes the bytecode of what it imports, as the suite does (WRITE_BYTECODE below), and the training
# stack's is written beforehand in the background, at the lowest priority, while the graph's first steps run: a
# fresh clone has none, and the first training step compiled torch, transformers and TRL in memory on the demo's
# path (their import: 23.5 CPU s without bytecode, 8.1 with it).
TRAINING_IMPORTS := import training.dpo, training.sft, training.actguide, training.masking, training.tiny_model, \
  peft; from trl import SFTTrainer, SFTConfig, DPOTrainer; from transformers import AutoModelForCausalLM, \
  AutoTokenizer, LlamaForCausalLM, GenerationConfig, TrainerCallback, get_scheduler

demo:
	@$(MAKE) --no-print-directory -j2 base-image
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

# A fresh machine's set-up, its independent parts at once (`make -j`): the venv, then the bytecode the suite's
# collection compiles (`pytest --collect-only`), while Debian's packages are installed, the engine starts and the
# base image is built. One after the other these took 177 s of a fresh machine's 902 s `make test` (docker.io 34 s,
# the base image 81, chromium 32, redis-server 8, the venv 19), and the workers' collection, compiling it all twice
# at once, another 53 s; at once, 97-119 s and 17-26 s. They keep both cores busy (building the base image in the
# background while the suite started gained nothing: 837 s against 784, one run each), but for the end of the
# base image's build, its longest chain: the bytecode and chromium's install run at a lower priority beside it.
test:
	@$(MAKE) --no-print-directory -j4 base-image test-tools bytecode
	$(WRITE_BYTECODE) HANDHOLD_REQUIRE_DOCKER=1 \
	  $(PY) -m pytest -q -n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder

bytecode: install
	@$(WRITE_BYTECODE) nice -n 10 $(PY) -m pytest --collect-only -q -p no:cacheprovider >/dev/null 2>&1 || true

# The Dagster UI: the code location `handhold` ([tool.dagster] in pyproject.toml), the instance in DAGSTER_HOME
# (its dagster.yaml caps the sandboxes pool: HANDHOLD_SANDBOX_POOL_LIMIT=N make dev).
dev: base-image
	@$(PY) -c "from assets.instance import ensure_dagster_home; ensure_dagster_home()"
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

# Debian's chromium, which tests/test_ui.py drives headless, and redis-server, the Celery broker
# tests/test_celery.py starts on loopback: installed as root on Debian when missing, in one apt transaction after
# the engine's (apt takes one at a time).
test-tools: docker
	@nice -n 10 bash scripts/ensure_packages.sh "make test" "chromium|chromium-browser=chromium" redis-server=redis-server

chromium:
	@bash scripts/ensure_packages.sh "tests/test_ui.py" "chromium|chromium-browser=chromium"

redis:
	@bash scripts/ensure_packages.sh "tests/test_celery.py" redis-server=redis-server

base-image: install docker
	@$(VENV)/bin/handhold base-image
