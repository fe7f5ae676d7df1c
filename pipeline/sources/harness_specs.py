"""What SWE-bench's harness runs for an instance, how it reads the log, and each dataset's images.

The command is the spec's `test_cmd` for (repo, version) followed by the test directives
of the instance's test_patch, as swebench's `make_eval_script_list_py` builds it. swebench
5 dropped MAP_REPO_VERSION_TO_SPECS (its rows carry their own `eval_script`, read first);
for rows without one, `data/swebench_test_cmds.txt` holds the Python repos' test_cmd per
version, generated from the swebench 4.1.0 wheel by `python -m pipeline.sources.harness_specs
WHEEL` (the last release that ships the table; it cannot be installed beside swebench 5).
"""

from __future__ import annotations

import functools
import hashlib
import importlib
import pkgutil
import re
import sys
import zipfile
from importlib.resources import files
from pathlib import Path
from typing import Any

SPECS_FILE = "data/swebench_test_cmds.txt"
SPECS_SOURCE = "swebench==4.1.0 swebench/harness/constants/python.py MAP_REPO_VERSION_TO_SPECS_PY"
# the harness's own pattern (swebench 4.1.0 test_spec/python.py get_test_directives)
_DIFF_TARGET = re.compile(r"diff --git a/.* b/(.*)")

# SWE-Gym's 11 repositories (SWE-Gym paper, arXiv 2412.21139, table 1; the same keys as
# MAP_REPO_VERSION_TO_SPECS_SWEGYM in SWE-Gym's fork of the harness, SWE-Gym/SWE-Bench-Fork)
SWE_GYM_REPOS = frozenset({
    "getmoto/moto", "python/mypy", "pandas-dev/pandas", "iterative/dvc", "pydantic/pydantic", "dask/dask",
    "conan-io/conan", "Project-MONAI/MONAI", "facebookresearch/hydra", "bokeh/bokeh", "modin-project/modin",
})
SWE_GYM_NAMESPACE = "xingyaoww"


def swebench_image(instance_id: str, namespace: str = "swebench") -> str:
    """The image SWE-bench publishes for an instance (`__` spelt `_1776_`), as swebench derives it."""
    from swebench.task.checks import expected_image

    return expected_image(instance_id, namespace)


def swe_gym_image(instance_id: str, namespace: str = SWE_GYM_NAMESPACE) -> str:
    """The image OpenHands publishes for a SWE-Gym instance: `__` spelt `_s_`, lower case."""
    # All-Hands-AI/OpenHands, evaluation/benchmarks/swe_bench/run_infer.py, get_instance_docker_image:
    # ('docker.io/xingyaoww/' + 'sweb.eval.x86_64.' + instance_id.replace('__', '_s_')).lower()
    return f"{namespace}/sweb.eval.x86_64.{instance_id.replace('__', '_s_')}:latest".lower()


@functools.cache
def spec_test_cmds() -> dict[tuple[str, str], str]:
    """(repo, version) -> the harness's test_cmd, from the table shipped with the project."""
    text = files("pipeline.sources").joinpath(SPECS_FILE).read_text(encoding="utf-8")
    rows = (line.split("\t") for line in text.splitlines() if line and not line.startswith("#"))
    return {(repo, version): cmd for repo, version, cmd in rows}


@functools.cache
def spec_repos() -> frozenset[str]:
    """Repositories swebench's harness has a spec for (at some version)."""
    return frozenset(repo for repo, _ in spec_test_cmds())


def harness_directives(repo: str, test_patch: str) -> list[str]:
    """What the harness appends to test_cmd: the test_patch's files minus data files; Django's as module labels."""
    from swebench.harness.constants import NON_TEST_EXTS  # imported here: see `parser_registry`

    directives = [d for d in _DIFF_TARGET.findall(test_patch) if not d.endswith(tuple(NON_TEST_EXTS))]
    if repo == "django/django":  # runtests.py takes dotted labels relative to tests/
        directives = [d.removesuffix(".py").removeprefix("tests/").replace("/", ".") for d in directives]
    return directives


def harness_test_cmd(repo: str, version: str, test_patch: str) -> str | None:
    """The test command SWE-bench's harness runs for the instance, or None when it has no spec for (repo, version)."""
    base = spec_test_cmds().get((repo, version))
    return None if base is None else " ".join([base, *harness_directives(repo, test_patch)])


def eval_script_test_cmd(eval_script: str) -> str | None:
    """The lines a swebench 5 row's eval_script runs between its test-output markers, or None without them."""
    from swebench.harness.constants import END_TEST_OUTPUT, START_TEST_OUTPUT

    lines = eval_script.splitlines()
    starts = [i for i, line in enumerate(lines) if START_TEST_OUTPUT in line]
    ends = [i for i, line in enumerate(lines) if END_TEST_OUTPUT in line]
    if not starts or not ends or ends[0] <= starts[0] + 1:
        return None
    return "\n".join(lines[starts[0] + 1:ends[0]]).strip() or None


def resolve_log_parser(name: str) -> str | None:
    """The PARSER_REGISTRY key for `name` ('pytest' is short for 'parse_log_pytest'), else None."""
    registry = parser_registry()
    return next((key for key in (name, f"parse_log_{name}") if key in registry), None)


@functools.cache
def parser_registry() -> dict[str, Any]:
    """swebench's PARSER_REGISTRY: log parser name -> function, with the summary parser of synthesized tasks
    (pipeline/verifier/pytest_log.py) registered beside swebench's own."""
    # Imported here: `swebench.harness` imports its docker, datasets (pandas) and modal modules, seconds of CPU in
    # every process that loads the pipeline (a Dagster code server, the daemon) and never reads a log
    from swebench.harness.log_parsers import PARSER_REGISTRY

    from pipeline.verifier.pytest_log import register

    register()
    return PARSER_REGISTRY


@functools.cache
def repo_parsers() -> dict[str, str]:
    """repo -> parser name, from swebench's per-language MAP_REPO_TO_PARSER_* tables."""
    from swebench.harness import log_parsers

    registry = parser_registry()
    # aliases (parse_log_scikit = parse_log_pytest_v2) share one function: use its own name
    names = {id(fn): fn.__name__ if fn.__name__ in registry else name for name, fn in registry.items()}
    found = pkgutil.iter_modules(log_parsers.__path__, f"{log_parsers.__name__}.")
    modules = [importlib.import_module(m.name) for m in found]
    tables = [t for m in modules for attr, t in vars(m).items() if attr.startswith("MAP_REPO_TO_PARSER")]
    # a parser swebench maps but never registered keeps its own name, so its rows are rejected
    return {repo: names.get(id(fn), fn.__name__) for table in tables for repo, fn in table.items()}


def spec_table_from_wheel(wheel: Path) -> list[tuple[str, str, str]]:
    """(repo, version, test_cmd) rows of a swebench 4.x wheel's Python specs that name a command."""
    with zipfile.ZipFile(wheel) as archive:
        source = archive.read("swebench/harness/constants/python.py").decode()
    namespace: dict = {}
    exec(compile(source, f"{wheel}!python.py", "exec"), namespace)  # a module of literals, no imports
    specs = namespace["MAP_REPO_VERSION_TO_SPECS_PY"]
    # humaneval is a seq2seq stand-in, not a repository; dbt-core's specs name no test_cmd
    return sorted((repo, version, spec["test_cmd"]) for repo, versions in specs.items()
                  if repo != "swe-bench/humaneval" for version, spec in versions.items()
                  if isinstance(spec.get("test_cmd"), str))


def write_spec_table(wheel: Path, out: Path) -> int:
    """Write the table `spec_test_cmds` reads; returns the number of (repo, version) rows."""
    rows = spec_table_from_wheel(wheel)
    digest = hashlib.sha256(wheel.read_bytes()).hexdigest()
    header = [f"# generated from {SPECS_SOURCE} ({wheel.name}, sha256 {digest})",
              "# by `python -m pipeline.sources.harness_specs WHEEL`; do not edit by hand",
              "# repo<TAB>version<TAB>test_cmd"]
    out.write_text("\n".join(header + ["\t".join(row) for row in rows]) + "\n", encoding="utf-8")
    return len(rows)


if __name__ == "__main__":
    target = Path(__file__).parent / SPECS_FILE
    print(f"{write_spec_table(Path(sys.argv[1]), target)} specs written to {target}")
