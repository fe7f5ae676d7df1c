"""Package entries from settings, discovery on hand-made sdist trees, and the flake filters run for real."""

from __future__ import annotations

import dataclasses
import re
import subprocess
import sys
from pathlib import Path

import pytest

from pipeline.core.records import Task
from assets.settings import HandholdConfig, SettingsError, from_mapping, load_config, to_mapping
from pipeline.synthesis.backend import (backend_target, editable_requirements, installed_backend, raised_pins,
                                        run_pip)
from pipeline.synthesis.discover import PYTEST, discover
from pipeline.synthesis.candidates import BugCandidate
from pipeline.synthesis.packages import DEFAULT_PACKAGES, PackageError, PackageSpec, package_specs, parse_entry
from pipeline.synthesis.packages import test_command as command_of
from pipeline.sources.harness_specs import parser_registry
from pipeline.synthesis.suite import LOG_PARSER
from pipeline.synthesis.synth import SynthConfig, SynthReport, baseline, narrowed_task, try_candidate
from pipeline.tasks.validate import FLAKY, FLAKY_BUG, check_task
from pipeline.verifier.environment import LocalTaskSandboxes
from sandbox.local_sandbox import LocalSandbox
from pipeline.rollouts.batch import RolloutConfig

RULES = RolloutConfig().grade_rules()


def tree(root: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)
    return root


# --- entries -----------------------------------------------------------------------------------------------

def test_builtin_names_keep_their_pins_and_commands():
    assert package_specs(("toolz", "tabulate", "boltons")) == DEFAULT_PACKAGES
    assert parse_entry("toolz==1.0.0") is DEFAULT_PACKAGES[0]
    assert command_of(DEFAULT_PACKAGES[0]) == ("python -m pytest -rA --tb=short -p no:cacheprovider "
                                               "-p no:unraisableexception toolz/tests")


@pytest.mark.parametrize("entry, expected", [
    ("attrs==25.3.0", PackageSpec("attrs", "25.3.0")),
    ("semver", PackageSpec("semver", "")),
    ("toolz==0.12.0", PackageSpec("toolz", "0.12.0")),  # another version of a built-in: discovered
    ("parse==1.20.2 test_paths=tests source_globs='parse.py' test_requirements='hypothesis pytest-mock' "
     "test_command='python -m pytest -rA tests'",
     PackageSpec("parse", "1.20.2", ("tests",), ("parse.py",), (PYTEST, "hypothesis", "pytest-mock"),
                 test_command="python -m pytest -rA tests")),
    ({"name": "idna", "version": "3.10", "test_paths": ["tests"], "test_requirements": ["pytest<9"]},
     PackageSpec("idna", "3.10", ("tests",), test_requirements=("pytest<9",))),
])
def test_entries_parse_into_specs(entry, expected):
    assert parse_entry(entry) == expected


@pytest.mark.parametrize("entry, message", [
    ("attrs==25 test_path=tests", "unknown override 'test_path'; choose from ['test_paths'"),
    ("not a/name", "expected `name==version` or `name`"),
    ("attrs test_command='unclosed", "No closing quotation"),
])
def test_bad_entries_say_what_is_wrong(entry, message):
    with pytest.raises(ValueError, match=message.replace("[", r"\[")):
        parse_entry(entry)


def test_entries_round_trip_through_yaml_settings(tmp_path):
    path = tmp_path / "exp.yaml"
    path.write_text("synth:\n  packages:\n    - toolz\n    - attrs==25.3.0\n"
                    "    - \"parse test_paths=tests test_requirements='hypothesis'\"\n")
    config = load_config(path)
    assert config.synth.packages == ("toolz", "attrs==25.3.0", "parse test_paths=tests test_requirements='hypothesis'")
    assert from_mapping(HandholdConfig, to_mapping(config), "again") == config
    assert package_specs(config.synth.packages)[2].test_paths == ("tests",)
    path.write_text("synth:\n  packages: ['attrs bogus=1']\n")
    with pytest.raises(SettingsError, match="synth: package entry 'attrs bogus=1': unknown override 'bogus'"):
        load_config(path)


# --- discovery ---------------------------------------------------------------------------------------------

def test_pyproject_testpaths_cov_addopts_and_test_extra(tmp_path):
    root = tree(tmp_path, {
        "pyproject.toml": """
[build-system]
requires = ["hatchling"]
build-backend = "hatchling.build"
[project]
name = "demo"
optional-dependencies = {test = ["hypothesis>=6,<7", "pytest==6.2.5", "pytest-cov", "mypy"], docs = ["sphinx"]}
[tool.pytest.ini_options]
testpaths = ["tests"]
addopts = "--cov=demo --cov-report term-missing -n auto -p xdist --strict-markers --timeout=30"
""",
        "src/demo/__init__.py": "", "src/demo/core.py": "", "tests/test_core.py": "import demo\n",
        "docs/conf.py": ""})
    found = discover(root, "demo")
    assert found.test_paths == ("tests",)
    assert found.source_globs == ("src/demo/**/*.py",)
    # pytest pinned by the project, plugins the kept options need, the test extra loosened; no coverage, linters
    assert found.test_requirements == (PYTEST, "pytest-timeout", "hypothesis")
    assert found.pytest_args == ("-o", "addopts=--strict-markers --timeout=30")
    assert "addopts without --cov=demo --cov-report term-missing -n auto -p xdist" in found.found


def test_setup_cfg_tox_and_requirements_files(tmp_path):
    root = tree(tmp_path, {
        "setup.cfg": "[tool:pytest]\naddopts = -ra\n[options.extras_require]\ntesting =\n    freezegun\n",
        "setup.py": "from setuptools import setup\nsetup()\n",
        "tox.ini": "[testenv]\ndeps =\n    py38: mock\n    -rrequirements/base.txt\n    {[base]deps}\n"
                   "extras = testing\n",
        "requirements/base.txt": "six==1.10  # old pin\n",
        "requirements-test.txt": "-r requirements/base.txt\npytest-mock>=3\ngit+https://example.org/x.git\n",
        "mypkg/__init__.py": "", "mypkg/tests/test_a.py": "import yaml\ntry:\n    import numpy\nexcept ImportError:\n"
                                                           "    numpy = None\n",
        "conftest.py": "import pytest\n"})
    found = discover(root, "mypkg")
    assert found.test_paths == ("mypkg/tests",)
    assert found.source_globs == ("mypkg/**/*.py",)
    assert found.test_requirements == (PYTEST, "freezegun", "mock", "six", "pytest-mock", "PyYAML")
    assert found.guessed == ("PyYAML",)  # imported at module level; numpy only inside try
    assert found.pytest_args == ()
    assert {"pytest configuration in setup.cfg", "extra 'testing'", "tox.ini [testenv] deps",
            "requirements-test.txt"} <= set(found.found)


def test_the_packages_own_extras_are_replaced_by_what_they_list(tmp_path):
    # attrs' layout: pip cannot pair `attrs[tests-mypy]` with the local copy and fails on every release
    root = tree(tmp_path, {
        "pyproject.toml": """
[project]
name = "Demo_Pkg"
[project.optional-dependencies]
tests = ["demo-pkg[tests-no-zope]", "zope.interface"]
tests-mypy = ["mypy>=1.11", "pytest-mypy-plugins; python_version >= '3.10'"]
tests_no_zope = ["Demo.Pkg[tests-mypy,tests]", "hypothesis", "pympler"]
[dependency-groups]
test = ["demo-pkg[tests-mypy]", "freezegun"]
""",
        "demo_pkg/__init__.py": "", "tests/test_a.py": "import demo_pkg\n"})
    found = discover(root, "demo-pkg")
    assert found.test_requirements == (PYTEST, "hypothesis", "pympler", "zope.interface", "freezegun")
    assert {"extra 'tests'", "dependency group 'test'"} <= set(found.found)


def test_plugins_of_the_marks_the_tests_use_are_installed_even_where_they_are_tooling(tmp_path):
    # python-dateutil's layout: pytest-cov's `no_cover` added by a conftest under `filterwarnings = error`
    root = tree(tmp_path, {
        "pyproject.toml": "[tool.pytest.ini_options]\nfilterwarnings = ['error']\n"
                          "markers = ['benchmark: our own, not the plugin']\n",
        "dateish/__init__.py": "",
        "tests/conftest.py": "import pytest\n\ndef pytest_configure(config):\n"
                             "    config.addinivalue_line('markers', 'order: ours too')\n\n"
                             "def pytest_collection_modifyitems(items):\n    for item in items:\n"
                             "        item.add_marker(pytest.mark.no_cover)\n",
        "tests/test_a.py": "import pytest\n\n@pytest.mark.benchmark\n@pytest.mark.order(1)\n"
                           "@pytest.mark.xdist_group('g')\ndef test_a():\n    pass\n"})
    found = discover(root, "dateish")
    assert found.test_requirements == (PYTEST, "pytest-cov", "pytest-xdist")  # not the marks registered
    assert "plugins of the marks the tests use: pytest-cov, pytest-xdist" in found.found


def test_top_level_test_module_and_single_module_package(tmp_path):
    root = tree(tmp_path, {"six.py": "", "test_six.py": "import six\n", "setup.py": "", "documentation/x.txt": ""})
    found = discover(root, "six")
    assert (found.test_paths, found.source_globs) == (("test_six.py",), ("six.py",))


def test_no_tests_found(tmp_path):
    root = tree(tmp_path, {"pkg/__init__.py": "", "setup.py": ""})
    assert discover(root, "pkg").test_paths == ()


def test_setuptools_pins_are_raised_for_editables():
    assert raised_pins(["setuptools>=77,<80", "wheel==0.30", "setuptools_scm[toml]>=6"]) == \
        ["setuptools>=64,>=77", "wheel", "setuptools_scm[toml]>=6"]
    assert raised_pins(["setuptools==40.8.0", "cython"]) == ["setuptools>=64", "cython"]


def test_hatchling_backend_asked_for_its_editable_needs(tmp_path):
    """The real backend, installed on this host from the index, answers what its editable build needs:
    hatchling's is `editables` (which pip's --no-build-isolation install does not bring by itself)."""
    pyproject = ('[build-system]\nrequires = ["hatchling"]\nbuild-backend = "hatchling.build"\n'
                 '[project]\nname = "demo"\nversion = "1.0"\n')
    plain = tree(tmp_path / "plain", {"pyproject.toml": pyproject, "demo/__init__.py": ""})
    exact = tree(tmp_path / "exact", {"pyproject.toml": pyproject + "[tool.hatch.build]\ndev-mode-exact = true\n",
                                      "demo/__init__.py": ""})
    for root in (plain, exact):
        needs = editable_requirements(root, tmp_path / "cache")
        assert [re.split(r"[=~]", r)[0] for r in needs] == ["hatchling", "editables"]
        assert re.fullmatch(r"hatchling==[\d.]+", needs[0])  # pinned to the version that was asked
    assert len(list((tmp_path / "cache/backend").glob("*/.complete"))) == 1  # one install for the same needs

    # pip builds the wheel with the backend installed for the package, else isolated (hatchling is not in this venv)
    quick = run_pip(("wheel", "-q", "--no-deps", "-w", str(tmp_path / "quick"), str(plain)),
                    installed_backend(plain, tmp_path / "cache"))
    isolated = run_pip(("wheel", "-q", "--no-deps", "-w", str(tmp_path / "isolated"), str(plain)))
    assert quick.returncode == isolated.returncode == 0, quick.stderr + isolated.stderr
    assert "--no-build-isolation" in quick.args and "--no-build-isolation" not in isolated.args
    for built in ("quick", "isolated"):  # the tag is the backend version's to choose (py3, or py2.py3)
        assert [re.sub(r"-py.*", "", p.name) for p in (tmp_path / built).iterdir()] == ["demo-1.0"], built


def test_metadata_that_disagrees_with_the_file_is_made_again_isolated(tmp_path):
    """Under a backend without setuptools_scm, tabulate 0.9.0's metadata says 0.0.0: pip, not isolated, discards
    it and builds 0.8.10, with no error. Its log says so, and the wheels are made again, isolated, in an empty
    folder."""
    backend = backend_target(["setuptools>=64", "wheel"], tmp_path / "cache")
    out = tmp_path / "wheels"
    args = ("wheel", "-q", "--no-deps", "--no-binary", ":all:", "--no-cache-dir", "-w", str(out), "tabulate<0.10")
    done = run_pip(args, backend, out)  # built from its sdist every time (pip's wheel cache would answer instead)
    assert done.returncode == 0 and "--no-build-isolation" not in done.args, done.stderr
    assert [p.name for p in out.iterdir()] == ["tabulate-0.9.0-py3-none-any.whl"]


def test_legacy_setup_py_gets_a_pep660_setuptools(tmp_path):
    root = tree(tmp_path / "legacy", {"setup.py": "from setuptools import setup\nsetup(name='x', version='1')\n"})
    needs = editable_requirements(root, tmp_path / "cache")
    assert [re.split(r"==", r)[0] for r in needs] == ["setuptools", "wheel"]
    assert int(needs[0].split("==")[1].split(".")[0]) >= 64


# --- flake filters, run for real on this host --------------------------------------------------------------

def flaky_repo(path: Path, counter: Path) -> Path:
    """A package with a stable test and one that fails on every second run (a counter outside the repo)."""
    tree(path, {
        "calc.py": "def add(a, b):\n    return a + b\n\n\ndef double(a):\n    return a * 2\n",
        "tests/test_calc.py": (
            "from pathlib import Path\nfrom calc import add, double\n\n\n"
            "def test_add():\n    assert add(2, 3) == 5\n\n\n"
            "def test_double():\n    assert double(4) == 8\n\n\n"
            f"def test_flaky():\n    p = Path({str(counter)!r})\n    n = int(p.read_text()) if p.exists() else 0\n"
            "    p.write_text(str(n + 1))\n    assert n % 2 == 0\n")})
    git = ["git", "-c", "user.name=t", "-c", "user.email=t@t"]
    for command in (["init", "-q"], ["add", "-A"], ["commit", "-qm", "init"]):
        subprocess.run([*git, *command], cwd=path, check=True)
    return path


SPEC = PackageSpec("calc", "1", ("tests",), ("calc.py",), (PYTEST,), (), build_requirements=(),
                   test_command=f"{sys.executable} -m pytest -rA -p no:cacheprovider tests")
WHOLE = dataclasses.replace(SPEC, test_command="", pytest_args=())  # the test command made from test_paths


def test_a_test_that_passes_on_some_runs_is_never_pass_to_pass(tmp_path):
    with LocalSandbox(flaky_repo(tmp_path / "calc", tmp_path / "counter"), timeout=120) as sandbox:
        base = baseline(sandbox, SPEC, SynthConfig(baseline_runs=3, min_pass_rate=0.6))
    assert base.passed == {"tests/test_calc.py::test_add", "tests/test_calc.py::test_double"}
    assert base.flaky == {"tests/test_calc.py::test_flaky"} and base.total == 3
    with LocalSandbox(flaky_repo(tmp_path / "again", tmp_path / "counter2"), timeout=120) as sandbox:
        once = baseline(sandbox, SPEC, SynthConfig(baseline_runs=1, min_pass_rate=0.6))
    assert "tests/test_calc.py::test_flaky" in once.passed  # one run cannot tell


def test_a_clean_run_cut_by_the_timeout_is_reported_as_the_time_not_as_failing_tests(tmp_path):
    """Only the first clean run's timeout was read: a later one cut short (a loaded machine) left no summary, and
    the package was refused with 'only 0 of N tests pass on every one of 3 runs'."""
    repo = flaky_repo(tmp_path / "calc", tmp_path / "counter")
    tree(repo, {"tests/test_slow.py": (
        "import time\nfrom pathlib import Path\n\n\n"
        f"def test_slow_the_second_time():\n    p = Path({str(tmp_path / 'runs')!r})\n"
        "    n = int(p.read_text()) if p.exists() else 0\n    p.write_text(str(n + 1))\n"
        "    time.sleep(30 if n == 1 else 0)\n")})
    with LocalSandbox(repo, timeout=120) as sandbox:
        with pytest.raises(PackageError, match=r"took over 8 s in clean run 2 of 3 \(raise suite_timeout"):
            baseline(sandbox, SPEC, SynthConfig(baseline_runs=3, min_pass_rate=0.6, suite_timeout=8))


def test_ids_with_spaces_are_read_whole(tmp_path):
    """swebench's parser cuts each summary line at its first space (`test_name[Action Man]` and `[Action Figure]`
    are both `test_name[Action`); the synthesized tasks' parser reads each id whole, so each test keeps its own
    outcome (tests/test_pytest_outputs.py holds it to pytest's JUnit report)."""
    tree(tmp_path / "calc", {"tests/test_names.py": (
        "import pytest\n\n\n@pytest.mark.parametrize('name', ['Action Man', 'Action Figure', 'Solo Act'])\n"
        "def test_name(name):\n    assert name != 'Action Man'\n")})
    with LocalSandbox(flaky_repo(tmp_path / "calc", tmp_path / "counter"), timeout=120) as sandbox:
        base = baseline(sandbox, SPEC, SynthConfig(baseline_runs=3, min_pass_rate=0.6))
        log = sandbox.run(SPEC.test_command).output
    collapsed = "tests/test_names.py::test_name[Action"
    assert "PASSED tests/test_names.py::test_name[Action Figure]" in log
    assert "FAILED tests/test_names.py::test_name[Action Man]" in log
    assert log.index("FAILED tests/test_names.py::test_name[Action Man]") > log.index("PASSED tests/")
    assert parser_registry()["parse_log_pytest"](log, None)[collapsed] == "FAILED"
    assert parser_registry()[LOG_PARSER](log, None)["tests/test_names.py::test_name[Action Man]"] == "FAILED"
    assert collapsed not in base.passed and {"tests/test_names.py::test_name[Solo Act]",
                                             "tests/test_names.py::test_name[Action Figure]"} <= base.passed


def candidate(original: str, mutated: str) -> BugCandidate:
    return BugCandidate("calc.py", "add", "change_operator", 2, original, mutated, "test", "cand0")


def test_a_bug_is_kept_only_when_it_fails_the_same_tests_on_every_run(tmp_path):
    repo = flaky_repo(tmp_path / "calc", tmp_path / "counter")
    original = (repo / "calc.py").read_text()
    stable = candidate(original, original.replace("a + b", "a - b"))
    # breaks test_double only when a counter (outside the repo) is odd: a flaky failure under the bug
    flaky = candidate(original, original.replace(
        "    return a * 2", f"    import pathlib\n    p = pathlib.Path({str(tmp_path / 'bugcount')!r})\n"
        "    n = int(p.read_text()) if p.exists() else 0\n    p.write_text(str(n + 1))\n"
        "    return a * 2 + (n + 1) % 2"))
    config, report = SynthConfig(validation_runs=3, min_pass_rate=0.6), SynthReport()
    with LocalSandbox(repo, timeout=120) as sandbox:
        base = baseline(sandbox, SPEC, config)
        kept = try_candidate(sandbox, SPEC, stable, base, config, report)
        dropped = try_candidate(sandbox, SPEC, flaky, base, config, report)
        assert sandbox.read_file("calc.py").decode() == original  # restored after each
    assert kept[0] == ["tests/test_calc.py::test_add"]
    assert dropped is None
    counts = report.per_package[SPEC.key]
    assert (counts["tested"], counts["broke_tests"], counts["stable"], counts["flaky_with_bug"]) == (2, 2, 1, 1)


GOLD = "diff --git a/calc.py b/calc.py\n--- a/calc.py\n+++ b/calc.py\n@@ -1,5 +1,5 @@\n def add(a, b):\n" \
       "-    return a - b\n+    return a + b\n \n \n def double(a):\n"


def calc_task(repo: Path, tests: str) -> Task:
    (repo / "calc.py").write_text((repo / "calc.py").read_text().replace("a + b", "a - b"))
    subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qam", "bug"], cwd=repo, check=True)
    return Task(instance_id="calc__1", repo="demo/calc", base_commit="", patch=GOLD, test_patch="",
                problem_statement="add subtracts", FAIL_TO_PASS=tests.split(), PASS_TO_PASS=(),
                image="local/calc", workdir="/testbed", test_cmd="python -m pytest -rA -p no:cacheprovider tests",
                log_parser="parse_log_pytest", source="synth", setup_patch="", test_files=("tests",))


def test_gold_patch_must_resolve_on_every_run(tmp_path):
    repo = flaky_repo(tmp_path / "calc", tmp_path / "counter")
    task = calc_task(repo, "tests/test_calc.py::test_add tests/test_calc.py::test_flaky")
    sandboxes = LocalTaskSandboxes({"local/calc": str(repo)})
    once = check_task(task, sandboxes=sandboxes, runs=1, rules=RULES)  # the counter is even: the flaky test passes once
    assert isinstance(once, Task)
    thrice = check_task(task, sandboxes=sandboxes, runs=3, rules=RULES)
    assert not isinstance(thrice, Task) and thrice.stage == "validate"
    # the counter goes on from the first check (gold, then empty): runs 2, 3, 4 pass, fail, pass
    assert thrice.reason.startswith(f"{FLAKY} the gold patch resolves it on 2 of 3 runs")
    stable = check_task(dataclasses.replace(task, FAIL_TO_PASS=("tests/test_calc.py::test_add",)),
                        sandboxes=sandboxes, runs=3, rules=RULES)
    assert isinstance(stable, Task)


def test_repeat_gold_grades_run_only_the_files_the_bug_reaches_and_still_catch_a_flaky_fix(tmp_path):
    """A synthesized task's second and third gold grades run the test files its bug ran (`narrowed_task`); the
    first gold grade and the empty patch's run the whole suite."""
    repo = flaky_repo(tmp_path / "calc", tmp_path / "counter")
    ran = tmp_path / "other-ran"
    tree(repo, {"tests/test_other.py": f"def test_other():\n    with open({str(ran)!r}, 'a') as f:\n"
                                       "        f.write('x')\n"})
    git = ["git", "-c", "user.name=t", "-c", "user.email=t@t"]
    subprocess.run([*git, "add", "-A"], cwd=repo, check=True)
    subprocess.run([*git, "commit", "-qm", "other"], cwd=repo, check=True)
    task = dataclasses.replace(calc_task(repo, "tests/test_calc.py::test_add"), test_cmd=command_of(WHOLE),
                               PASS_TO_PASS=("tests/test_calc.py::test_double", "tests/test_other.py::test_other"))
    repeat = narrowed_task(task, WHOLE, ("tests/test_calc.py",))
    assert repeat.PASS_TO_PASS == ("tests/test_calc.py::test_double",)
    assert repeat.test_cmd.endswith("tests/test_calc.py")
    assert narrowed_task(task, WHOLE, None) is None and narrowed_task(task, SPEC, ("tests/test_calc.py",)) is None
    sandboxes = LocalTaskSandboxes({"local/calc": str(repo)})
    checked = check_task(task, sandboxes=sandboxes, runs=3, exact=True, repeat=repeat, rules=RULES)
    assert isinstance(checked, Task) and checked.PASS_TO_PASS == task.PASS_TO_PASS  # the stored task is whole
    assert ran.read_text() == "xx"  # the first gold grade and the empty patch's: the other file twice, not four times
    flaky = dataclasses.replace(task, FAIL_TO_PASS=("tests/test_calc.py::test_add", "tests/test_calc.py::test_flaky"))
    rejected = check_task(flaky, sandboxes=sandboxes, runs=3,
                          repeat=narrowed_task(flaky, WHOLE, ("tests/test_calc.py",)), rules=RULES)
    assert not isinstance(rejected, Task) and rejected.reason.startswith(f"{FLAKY} the gold patch resolves it on")


def test_the_empty_patch_must_fail_exactly_fail_to_pass_when_exact(tmp_path):
    """A synthesized bug's last run with the bug is the verifier's grade of the empty patch: with `exact`, a
    PASS_TO_PASS test failing there sets the task aside, as a disagreeing bug run would."""
    repo = flaky_repo(tmp_path / "calc", tmp_path / "counter")
    source = (repo / "calc.py").read_text()
    (repo / "calc.py").write_text(source.replace("a + b", "a - b").replace("a * 2", "a * 3"))  # breaks both
    git = ["git", "-c", "user.name=t", "-c", "user.email=t@t"]
    subprocess.run([*git, "commit", "-qam", "bug"], cwd=repo, check=True)
    gold = subprocess.run([*git, "diff", "HEAD", "HEAD~1"], cwd=repo, check=True, capture_output=True, text=True).stdout
    add, double = "tests/test_calc.py::test_add", "tests/test_calc.py::test_double"
    task = Task(instance_id="calc__2", repo="demo/calc", base_commit="", patch=gold, test_patch="",
                problem_statement="x", FAIL_TO_PASS=(add,), PASS_TO_PASS=(double,), image="local/calc",
                workdir="/testbed", test_cmd="python -m pytest -rA -p no:cacheprovider tests",
                log_parser="parse_log_pytest", source="synth", setup_patch="", test_files=("tests",))
    sandboxes = LocalTaskSandboxes({"local/calc": str(repo)})
    assert isinstance(check_task(task, sandboxes=sandboxes, rules=RULES), Task)  # the loose check: the empty patch fails add
    strict = check_task(task, sandboxes=sandboxes, exact=True, rules=RULES)
    assert not isinstance(strict, Task) and strict.reason.startswith(FLAKY_BUG)
    both = dataclasses.replace(task, FAIL_TO_PASS=(add, double), PASS_TO_PASS=())
    assert isinstance(check_task(both, sandboxes=sandboxes, exact=True, rules=RULES), Task)


def test_packages_are_fetched_and_built_at_once_each_failure_named_and_the_order_kept(tmp_path, monkeypatch):
    """`each_package` (task_sources, environment_images): one package per core at once; a package that fails is
    reported with its stage and the others are still made."""
    import threading

    from assets.environments import each_package
    from assets.resources import HandholdSettings
    from pipeline.synthesis.packages import PackageError

    monkeypatch.setattr("os.cpu_count", lambda: 2)
    settings = HandholdSettings(data_dir=str(tmp_path), synth={"packages": ["toolz", "tabulate", "boltons"]})
    both = threading.Barrier(2, timeout=30)  # broken unless two packages are being made at the same time
    warnings = []

    def make(spec):
        if spec.name == "tabulate":
            raise PackageError(f"{spec.key}: no sdist", "fetch")
        both.wait()
        return f"made {spec.key}"

    context = type("Context", (), {"log": type("Log", (), {"warning": staticmethod(warnings.append)})})()
    made, failed = each_package(context, settings, make)
    assert list(made) == ["toolz-1.0.0", "boltons-25.0.0"] and made["toolz-1.0.0"] == "made toolz-1.0.0"
    assert failed == {"tabulate-0.9.0": "fetch: tabulate-0.9.0: no sdist"}
    assert len(warnings) == 1 and "tabulate-0.9.0 set aside at fetch" in warnings[0]
