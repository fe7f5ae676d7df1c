"""pytest's output as the harness reads it, run for real on generated packages (no Docker: this venv's pytest):
colour, report plugins, -q/-v, --tb styles, xdist and odd parametrized ids, each read against pytest's own JUnit
report of the same run; then grades of such a package, a synthesized task's and a public row's."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from pipeline.core.records import Task
from pipeline.sources.harness_specs import parser_registry
from pipeline.synthesis.packages import PackageSpec
from pipeline.synthesis.packages import test_command as command_of
from pipeline.synthesis.suite import LOG_PARSER, baseline, run_suite
from pipeline.synthesis.synth_config import SynthConfig
from pipeline.verifier.environment import LocalTaskSandboxes
from pipeline.verifier.grading import grade
from pipeline.verifier.junit import dotted, junit_outcomes
from pipeline.verifier.pytest_log import summary_statuses
from sandbox.local_sandbox import LocalSandbox
from pipeline.rollouts.batch import RolloutConfig

RULES = RolloutConfig().grade_rules()

IDS = '''import pytest


@pytest.mark.parametrize("s", ["a b", "a  b", "[CMD] [ARGS]", "(307 tests)", "x - y", "\\u00e9 \\u00fc", "line\\nbreak",
                               "tab\\there", "]", "[", "\\u00a0nb"])
def test_ids(s):
    assert s != "x - y"


@pytest.mark.parametrize("v", [1, 2], ids=["explicit id", "new\\nline"])
def test_explicit(v):
    print("PASSED (307 tests)")  # pyparsing's examples print such lines; -rA shows them under PASSES
    print("FAILED tests/test_ids.py::test_plain - printed, not a verdict")
    assert v == 1


def test_plain():
    print("PASSED: [1,3]")


def test_long_message():
    assert "first line\\nsecond - line" == "PASSED tests/test_ids.py::test_long_message"


@pytest.mark.xfail(reason="known - bug")
def test_xfail():
    assert 0


@pytest.mark.skip(reason="a skipped case of the generated package, for the SKIPPED summary line")
def test_skip():
    pass


@pytest.fixture
def broken():
    raise RuntimeError("setup - boom")


def test_error(broken):
    pass


class TestK:
    @pytest.mark.parametrize("p", ["k 1", "k [2]"])
    def test_m(self, p):
        pass
'''
# A stand-in for pytest-pretty (same module name): it drops the short summary, so no log parser reads a verdict
PRETTY = ('import pytest\n\n\n@pytest.hookimpl(trylast=True)\ndef pytest_configure(config):\n'
          '    config.pluginmanager.getplugin("terminalreporter").reportchars = ""\n')
# A plugin whose own summary section, printed before pytest's, holds verdict-like lines
CHATTY = ('def pytest_terminal_summary(terminalreporter):\n    terminalreporter.write_sep("=", "chatty")\n'
          '    terminalreporter.write_line("PASSED (307 tests)")\n'
          '    terminalreporter.write_line("FAILED tests/test_ids.py::test_plain - fake")\n')
UNESCAPED = "disable_test_id_escaping_and_forfeit_all_rights_to_community_support = true\n"
CASES = {  # name: (ini addopts, other ini lines, environment of the run)
    "plain": ("", "", ""),
    "colour": ("--color=yes", "", ""),
    "forced colour": ("--color=auto", "", "FORCE_COLOR=1"),
    "quiet": ("-qq", "", ""),
    "verbose": ("-vv", "", ""),
    "tb line": ("--tb=line", "", ""),
    "tb native": ("--tb=native", "", ""),
    "tb no": ("--tb=no", "", ""),
    "xdist": ("-n 2", "", "PYTEST_DISABLE_PLUGIN_AUTOLOAD="),  # autoloaded, as in an image
    "chatty plugin": ("-p chatty", "", ""),
    "report plugin": ("-p pytest_pretty", "", ""),
    "unescaped ids": ("", UNESCAPED, ""),
    "ci messages": ("", "", "CI=true"),
}
OUTCOME = {"PASSED": "passed", "FAILED": "failed", "ERROR": "error", "XFAIL": "skipped", "SKIPPED": "skipped"}


def package(root: Path, addopts: str, ini: str = "") -> Path:
    """A package whose pytest settings say `addopts`, with the tests and plugins above, committed."""
    files = {"tests/test_ids.py": IDS, "pytest_pretty.py": PRETTY, "chatty.py": CHATTY,
             "pytest.ini": f"[pytest]\naddopts = {addopts}\npythonpath = .\n{ini}"}
    for name, text in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)
    git = ["git", "-c", "user.name=t", "-c", "user.email=t@t", "-c", "init.defaultBranch=main"]
    for command in (["init", "-q"], ["add", "-A"], ["commit", "-qm", "init"]):
        subprocess.run([*git, *command], cwd=root, check=True)
    return root


def against_junit(statuses: dict[str, str], report: bytes) -> None:
    """Every outcome the parser read is the JUnit report's, and every test of the report is read but folded skips
    (pytest's summary gives them a location, not an id)."""
    junit = junit_outcomes(report)
    read = {dotted(test): OUTCOME[status] for test, status in statuses.items()}
    assert len(read) == len(statuses)  # no two ids read the same
    assert read == {test: outcome for test, outcome in junit.items() if test in read or outcome != "skipped"}


def check_ids(statuses: dict[str, str], unescaped: bool) -> None:
    """The ids that a whitespace split or a printed line would get wrong, read whole, and nothing printed read."""
    newline = "\n" if unescaped else "\\n"
    assert statuses["tests/test_ids.py::test_ids[x - y]"] == "FAILED"
    assert statuses["tests/test_ids.py::test_ids[(307 tests)]"] == "PASSED"
    assert statuses["tests/test_ids.py::TestK::test_m[k [2]]"] == "PASSED"
    assert statuses[f"tests/test_ids.py::test_explicit[new{newline}line]"] == "FAILED"
    assert statuses[f"tests/test_ids.py::test_ids[line{newline}break]"] == "PASSED"
    assert statuses["tests/test_ids.py::test_ids[[]"] == statuses["tests/test_ids.py::test_ids[]]"] == "PASSED"
    assert statuses["tests/test_ids.py::test_plain"] == "PASSED" and statuses["tests/test_ids.py::test_error"] == "ERROR"
    assert statuses["tests/test_ids.py::test_long_message"] == "FAILED"
    assert statuses["tests/test_ids.py::test_xfail"] == "XFAIL"
    assert not any(t.startswith(("(307", "[1,3]")) for t in statuses) and len(statuses) == 19


@pytest.mark.parametrize("case", list(CASES))
def test_the_parser_reads_what_junit_says_as_the_package_asks(case, tmp_path):
    """The package's own command, nothing neutralised: the parser reads every id and outcome JUnit reports,
    except where a plugin removes the summary (the harness's runs block it: the next test)."""
    addopts, ini, env = CASES[case]
    root = package(tmp_path / "pkg", addopts, ini)
    done = subprocess.run(f"{env} {sys.executable} -m pytest -rA --tb=short -p no:cacheprovider tests "
                          f"--junitxml={tmp_path}/junit.xml", shell=True, cwd=root, capture_output=True, text=True)
    statuses = summary_statuses(done.stdout)
    if case == "report plugin":
        assert statuses == {} and "short test summary info" not in done.stdout
        return
    if "color" in addopts or "COLOR" in env:
        # swebench's parser reads none of pytest's coloured lines, only what the tests printed (issue #53)
        assert "\x1b[" in done.stdout and parser_registry()["parse_log_pytest"](done.stdout, None) == {
            "(307": "PASSED", "[1,3]": "PASSED:", "tests/test_ids.py::test_plain": "FAILED"}
    against_junit(statuses, (tmp_path / "junit.xml").read_bytes())
    check_ids(statuses, unescaped=bool(ini))


@pytest.mark.parametrize("case", list(CASES))
def test_the_harness_runs_read_what_junit_says(case, tmp_path):
    """The synthesis suite's run (the harness's neutralising settings, its parser) against the same run's JUnit."""
    addopts, ini, env = CASES[case]
    root = package(tmp_path / "pkg", addopts, ini)
    spec = PackageSpec("pkg", "1", ("tests",), test_command=f"{env} python -m pytest -rA --tb=short -p no:cacheprovider "
                       f"tests --junitxml={tmp_path}/junit.xml")
    with LocalSandbox(root, timeout=120) as sandbox:
        statuses, text, timed_out = run_suite(sandbox, spec, 120)
    assert not timed_out and "\x1b[" not in text
    against_junit(statuses, (tmp_path / "junit.xml").read_bytes())
    check_ids(statuses, unescaped=bool(ini))


BUGGY = "def title(s):\n    return s.upper()  # bug\n"
FIXED = "def title(s):\n    return s.title()\n"
GOLD = ("diff --git a/slug.py b/slug.py\n--- a/slug.py\n+++ b/slug.py\n@@ -1,2 +1,2 @@\n def title(s):\n"
        "-    return s.upper()  # bug\n+    return s.title()\n")
TITLE_TESTS = '''import pytest

from slug import title


@pytest.mark.parametrize("s, want", [("ab c", "Ab C"), ("[x] - yz", "[X] - Yz")])
def test_title(s, want):
    print("PASSED (307 tests)")
    assert title(s) == want


@pytest.mark.parametrize("s", ["a b", "(307 tests)"])
def test_same_length(s):
    assert len(title(s)) == len(s)
'''


def slug_repo(root: Path, source: str) -> Path:
    """python-slugify's settings (colour) and pytest-xdist's, a bug that fails tests with spaced ids."""
    for name, text in {"slug.py": source, "tests/test_slug.py": TITLE_TESTS,
                       "pyproject.toml": '[tool.pytest.ini_options]\naddopts = "--color=yes -n 2"\npythonpath = ["."]\n'
                       }.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)
    git = ["git", "-c", "user.name=t", "-c", "user.email=t@t", "-c", "init.defaultBranch=main"]
    for command in (["init", "-q"], ["add", "-A"], ["commit", "-qm", "init"]):
        subprocess.run([*git, *command], cwd=root, check=True)
    return root


def test_a_coloured_xdist_package_is_synthesized_and_graded(tmp_path, monkeypatch):
    """python-slugify's `--color=yes` (and xdist's `-n 2`): a baseline that reads every test, a task whose ids keep
    their spaces, the gold patch resolving it, the empty one not; the same package as a public row swebench's parser
    grades (ids without spaces)."""
    monkeypatch.delenv("PYTEST_DISABLE_PLUGIN_AUTOLOAD")  # xdist autoloaded, as in an image (a grade turns it off)
    spec = PackageSpec("slug", "1", ("tests",), pytest_args=())
    with LocalSandbox(slug_repo(tmp_path / "fixed", FIXED), timeout=120) as sandbox:
        base = baseline(sandbox, spec, SynthConfig(baseline_runs=2, min_pass_rate=0.9))
    with LocalSandbox(slug_repo(tmp_path / "bug", BUGGY), timeout=120) as sandbox:
        broken = run_suite(sandbox, spec, 120)[0]
    f2p = tuple(sorted(t for t in base.passed if broken.get(t) != "PASSED"))
    assert f2p == ("tests/test_slug.py::test_title[[x] - yz-[X] - Yz]", "tests/test_slug.py::test_title[ab c-Ab C]")
    assert len(base.passed) == 4 and not base.flaky
    task = Task("slug__1", "demo/slug", "", GOLD, "", "title() shouts.", f2p, tuple(sorted(base.passed - set(f2p))),
                "local/slug", "/testbed", command_of(spec), LOG_PARSER, "synth", setup_patch="")
    sandboxes = LocalTaskSandboxes(repos={"local/slug": str(tmp_path / "bug")})
    gold, empty = grade(task, GOLD, sandboxes=sandboxes, rules=RULES), grade(task, "", sandboxes=sandboxes, reuse_empty=False, rules=RULES)
    assert (gold.resolved, gold.reason) == (True, "resolved"), gold.report
    assert (empty.resolved, empty.reason) == (False, "tests_failed"), empty.report
    row = Task("slug__2", "demo/slug", "", GOLD, "", "title() shouts.", ("tests/test_slug.py::test_title[ab",),
               ("tests/test_slug.py::test_same_length[a",), "local/slug", "/testbed",
               "python -m pytest -rA --color=yes -p no:cacheprovider tests", "parse_log_pytest", "dataset",
               setup_patch="")  # colour on its command line: only the escapes stripped from the log save it
    public = grade(row, GOLD, sandboxes=sandboxes, rules=RULES)
    assert (public.resolved, public.reason) == (True, "resolved"), public.report
