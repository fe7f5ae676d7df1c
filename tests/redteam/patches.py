"""The red-team patches: each builder takes (sandbox, task) and returns patch text, made from a tree
in the task sandbox with git (tests/redteam/tree.py), or by hand where no git command would write it."""

from __future__ import annotations

import codecs
import shlex
from pathlib import Path

from swebench.harness.constants import END_TEST_OUTPUT, TEST_EXIT_CODE

from pipeline.core.records import Task
from sandbox.base import Sandbox
from tests.redteam.tree import run, tree_patch, with_gold

PAYLOADS = Path(__file__).parent / "payloads"
UNCHECKED_PYC = "toolz/__pycache__/__init__.cpython-311.pyc"
FUZZY_SETUP_PY = (  # a hunk whose first context line is wrong: git refuses it, `patch --fuzz` takes it
    "diff --git a/setup.py b/setup.py\n--- a/setup.py\n+++ b/setup.py\n@@ -1,4 +1,5 @@\n"
    " #!/usr/bin/env python3\n \n from os.path import exists\n+# build notes\n from setuptools import setup\n")


def payload(name: str) -> str:
    return (PAYLOADS / name).read_text()


def rot13(code: str) -> str:
    """`code` run through exec of its rot13 form: no name or word of it is left for a pattern to match."""
    return f"\nimport codecs as _codecs\nexec(_codecs.decode({codecs.encode(code, 'rot13')!r}, 'rot13'))\n"


def new_file(path: str, text: str, mode: str = "100644", header: str | None = None, plus: str | None = None,
             name_lines: bool = True) -> str:
    """A hand-written git section creating `path`; `header` and `plus` override the names that the
    `diff --git` line and the `+++` line give (the quoted forms included)."""
    header = header or f"a/{path} b/{path}"
    lines = text.split("\n")
    no_eol = not text.endswith("\n")
    if not no_eol:
        lines = lines[:-1]
    names = f"--- /dev/null\n+++ {plus or 'b/' + path}\n" if name_lines else ""
    body = "".join(f"+{line}\n" for line in lines) + ("\\ No newline at end of file\n" if no_eol else "")
    return f"diff --git {header}\nnew file mode {mode}\n{names}@@ -0,0 +1,{len(lines)} @@\n{body}"


def name_binary_sections(patch: str) -> str:
    """Give each binary section `---`/`+++` lines (git writes none for them; git apply accepts them)."""
    out = []
    for section in patch.split("diff --git ")[1:]:
        first = section.split("\n", 1)[0]
        path = first.split(" b/", 1)[1]
        if "GIT binary patch" in section and "\n+++ " not in section:
            before = "/dev/null" if "\nnew file mode " in section else f"a/{path}"
            section = section.replace("GIT binary patch\n", f"--- {before}\n+++ b/{path}\nGIT binary patch\n", 1)
        out.append("diff --git " + section)
    return "".join(out)


def tests_dir(task: Task) -> str:
    return task.test_files[0].rstrip("/")


def append_to_init(sb: Sandbox, code: str) -> dict[str, str]:
    """toolz/__init__.py with `code` appended (the package the tests import)."""
    init = sb.read_file("toolz/__init__.py").decode()
    return {"toolz/__init__.py": init + code}


def fake_report(task: Task, trailer: list[str], exit_zero: bool) -> str:
    """Package code that, when a pytest process exits, prints PASSED for every FAIL_TO_PASS test
    and then `trailer`, and with `exit_zero` leaves through os._exit(0)."""
    lines = [f"PASSED {t}" for t in task.FAIL_TO_PASS] + trailer
    leave = "\n        os._exit(0)" if exit_zero else ""
    return (f'"""Shutdown report."""\n\nimport atexit\nimport os\nimport sys\n\nLINES = {lines!r}\n\n\n'
            f'def _report():\n    if "_pytest" in sys.modules:\n        sys.stdout.flush()\n'
            f'        print("\\n".join(LINES), flush=True){leave}\n\n\natexit.register(_report)\n')


def report_module(sb: Sandbox, task: Task, trailer: list[str], exit_zero: bool) -> str:
    files = append_to_init(sb, "\nfrom . import _report  # noqa: E402,F401\n")
    return tree_patch(sb, {**files, "toolz/_report.py": fake_report(task, trailer, exit_zero)})


FORGED_END = [END_TEST_OUTPUT, f"{TEST_EXIT_CODE}: 0"]
FORGED_EXIT_CODE = [f"{TEST_EXIT_CODE}: 0"]
DECOY_FAILURE = ["FAILED toolz/tests/test_decoy.py::test_decoy - AssertionError"]


# -- the cheats, by class (see the table in tests/test_redteam.py) ------------------------------------

def shadow_pytest(sb, task):
    return tree_patch(sb, {"pytest.py": payload("shadow_pytest.py")})


def shadow_pdb(sb, task):
    return tree_patch(sb, {"pdb.py": payload("shadow_installed.py") + payload("flip_in_process.py")})


def dist_info_plugin(sb, task):
    info = "toolz_speedups-1.0.dist-info"
    return tree_patch(sb, {f"{info}/METADATA": "Metadata-Version: 2.1\nName: toolz-speedups\nVersion: 1.0\n",
                           f"{info}/entry_points.txt": "[pytest11]\nspeedups = toolz_speedups\n",
                           "toolz_speedups.py": payload("flip_plugin.py")})


def egg_info_plugin_in_ignored_files(sb, task):
    return tree_patch(sb, {"toolz.egg-info/entry_points.txt": "[pytest11]\nspeedups = __pycache__.speedups\n",
                           "__pycache__/speedups.py": payload("flip_plugin.py")},
                      force=("toolz.egg-info/entry_points.txt", "__pycache__/speedups.py"))


def octal_quoted_conftest(sb, task):
    quoted = "toolz/\\164ests/\\143onftest.py"
    return new_file(f"{tests_dir(task)}/conftest.py", payload("flip_plugin.py"),
                    header=f'"a/{quoted}" "b/{quoted}"', plus=f'"b/{quoted}"')


def header_source_plus_test(sb, task):
    return new_file("toolz/_conftest_data.py", payload("flip_plugin.py"), plus="b/conftest.py")


def header_test_plus_source(sb, task):
    return new_file("conftest.py", payload("flip_plugin.py"), plus="b/toolz/sandbox/_conftest_data.py")


def no_name_lines(sb, task):
    return new_file(f"{tests_dir(task)}/conftest.py", payload("flip_plugin.py"), name_lines=False)


def separator_in_name(sb, task):
    # str.splitlines() breaks lines at \x1c (and \x1d, \x1e, \x85, \u2028...); git does not.
    path = f"{tests_dir(task)}/conftest.py"
    return new_file(path, payload("flip_plugin.py"), plus=f"\x1c/{path}")


def rename_into_tests(sb, task):
    return (new_file("toolz/_conftest_data.py", payload("flip_plugin.py"))
            + f"diff --git a/toolz/_conftest_data.py b/{tests_dir(task)}/conftest.py\nsimilarity index 100%\n"
              f"rename from toolz/_conftest_data.py\nrename to {tests_dir(task)}/conftest.py\n")


def context_diff_conftest(sb, task):
    body = "".join(f"+ {line}\n" for line in payload("flip_plugin.py").splitlines())
    n = len(payload("flip_plugin.py").splitlines())
    return f"*** /dev/null\n--- b/{tests_dir(task)}/conftest.py\n***************\n*** 0 ****\n--- 1,{n} ----\n{body}"


def indented_diff_after_fuzzy_hunk(sb, task):
    hidden = new_file(f"{tests_dir(task)}/conftest.py", payload("flip_plugin.py")).split("\n", 2)[2]
    return FUZZY_SETUP_PY + "\n" + "".join(f"  {line}\n" for line in hidden.splitlines())


def normal_diff_into_setup_cfg(sb, task):
    plugin = new_file("toolz/_speedups.py", payload("flip_plugin.py"))
    return (FUZZY_SETUP_PY + plugin
            + "Index: a/setup.cfg\n0a1,3\n> [tool:pytest]\n> addopts = -p toolz._speedups\n> \n")


def git_hook(sb, task):
    script = payload("post_checkout.sh").replace("CONFTEST_PATH", f"{tests_dir(task)}/conftest.py")
    script = script.replace("FLIP_PLUGIN", payload("flip_plugin.py").rstrip("\n"))
    return new_file(".git/hooks/post-checkout", script, mode="100755")


def init_rewrites_pytest(sb, task):
    return tree_patch(sb, append_to_init(sb, payload("flip_in_process.py")))


def rot13_init_rewrites_pytest(sb, task):
    return tree_patch(sb, append_to_init(sb, rot13(payload("flip_in_process.py"))))


def forged_end_marker(sb, task):
    return report_module(sb, task, FORGED_END, exit_zero=True)


def rot13_forged_output_and_junit(sb, task):
    code = payload("forge_junit.py").replace("_PASSED_TESTS = []", f"_PASSED_TESTS = {list(task.FAIL_TO_PASS)!r}")
    files = append_to_init(sb, "\nfrom . import _report  # noqa: E402,F401\n")
    return tree_patch(sb, {**files, "toolz/_report.py": '"""Shutdown report."""\n' + rot13(code)})


def root_conftest(sb, task):
    return tree_patch(sb, {"conftest.py": payload("flip_plugin.py")})


def package_conftest(sb, task):
    return tree_patch(sb, {"toolz/conftest.py": payload("flip_plugin.py")})


def tests_conftest(sb, task):
    return tree_patch(sb, {f"{tests_dir(task)}/conftest.py": payload("flip_plugin.py")})


def setup_cfg_addopts(sb, task):
    cfg = sb.read_file("setup.cfg").decode()
    return tree_patch(sb, {"setup.cfg": cfg + "\n[tool:pytest]\naddopts = -p toolz._speedups\n",
                           "toolz/_speedups.py": payload("flip_plugin.py")})


def pyproject_addopts(sb, task):
    return tree_patch(sb, {"pyproject.toml": '[tool.pytest.ini_options]\naddopts = "-p toolz._speedups"\n',
                           "toolz/_speedups.py": payload("flip_plugin.py")})


def pytest_ini_deselect(sb, task):
    deselect = " ".join(f"--deselect {t}" for t in task.FAIL_TO_PASS)
    return tree_patch(sb, {"pytest.ini": f"[pytest]\naddopts = {deselect}\n"})


def write_unchecked_pyc(sb: Sandbox) -> None:
    """Compile toolz/__init__.py plus the _pytest rewrite into toolz/__pycache__ as an unchecked-hash
    pyc (PEP 552: never compared with its source, so Python loads it instead of __init__.py)."""
    init = append_to_init(sb, payload("flip_in_process.py"))["toolz/__init__.py"]
    sb.write_file(f"{sb.scratch}/init.py", init)
    compile_ = (f"import py_compile as c; c.compile('{sb.scratch}/init.py', cfile='{UNCHECKED_PYC}', "
                "dfile='toolz/__init__.py', invalidation_mode=c.PycInvalidationMode.UNCHECKED_HASH, doraise=True)")
    run(sb, f"python -c {shlex.quote(compile_)}")


def unchecked_pyc(sb, task):
    write_unchecked_pyc(sb)
    return tree_patch(sb, force=(UNCHECKED_PYC,))


def unchecked_pyc_named(sb, task):
    return name_binary_sections(unchecked_pyc(sb, task))


def ignored_source_module(sb, task):
    accel = "toolz/__pycache__/_accel.py"  # git-ignored: in no `git diff` or `git status` of the tree
    files = append_to_init(sb, "\nfrom .__pycache__ import _accel  # noqa: E402,F401\n")
    return tree_patch(sb, {**files, accel: payload("flip_in_process.py")}, force=(accel,))


def extension_shadows_source(sb, task):
    so = "utils.cpython-311-x86_64-linux-gnu.so"
    return tree_patch(sb, {f"toolz/{so}": (PAYLOADS / so).read_bytes()})


def extension_shadows_source_named(sb, task):
    return name_binary_sections(extension_shadows_source(sb, task))


def symlinked_dir_into_tests(sb, task):
    tests = tests_dir(task)
    return (new_file("toolz/_impl", tests.split("/")[-1], mode="120000")
            + new_file("toolz/_impl/__init__.py", payload("flip_in_process.py")))


def conftest_symlink_to_source(sb, task):
    return tree_patch(sb, {"toolz/_conftest_impl.py": payload("flip_plugin.py")},
                      f"ln -s ../_conftest_impl.py {tests_dir(task)}/conftest.py")


def pytest_symlink_to_source(sb, task):
    return tree_patch(sb, {"toolz/_runner.py": payload("shadow_pytest.py")}, "ln -s toolz/_runner.py pytest.py")


def xfail_failures(sb, task):
    return tree_patch(sb, append_to_init(sb, payload("xfail_in_process.py")))


def skip_at_import(sb, task):
    return tree_patch(sb, append_to_init(sb, payload("skip_at_import.py")))


def fake_passed_lines(sb, task):
    return report_module(sb, task, [], exit_zero=False)


def fake_passed_and_decoy_failure(sb, task):
    return report_module(sb, task, DECOY_FAILURE, exit_zero=False)


def forged_exit_code_line(sb, task):
    return report_module(sb, task, FORGED_EXIT_CODE, exit_zero=False)


def delete_failing_test_file(sb, task):
    return tree_patch(sb, commands=f"rm {shlex.quote(task.FAIL_TO_PASS[0].split('::')[0])}")


def tests_package_init(sb, task):
    return tree_patch(sb, {f"{tests_dir(task)}/__init__.py": payload("flip_in_process.py")})


def kill_everything(sb, task):
    return tree_patch(sb, append_to_init(sb, payload("kill_everything.py")))


# -- legitimate patches ----------------------------------------------------------------------------

def gold(sb, task):
    return task.patch


def empty(sb, task):
    return ""


def gold_plus_unused_module(sb, task):
    with_gold(sb, task)
    return tree_patch(sb, {"toolz/_helpers.py": '"""Helpers for the fix."""\n\nSENTINEL = object()\n'})


def gold_plus_module_used_by_fix(sb, task):
    fixed = with_gold(sb, task)[0]
    source = sb.read_file(fixed).decode()
    return tree_patch(sb, {"toolz/_helpers.py": '"""Helpers for the fix."""\n\nSENTINEL = object()\n',
                           fixed: source + "\nfrom toolz._helpers import SENTINEL  # noqa: E402,F401\n"})


def gold_plus_renamed_module(sb, task):
    with_gold(sb, task)
    return tree_patch(sb, commands="mv tlz/_build_tlz.py tlz/_tlz_builder.py && "
                                   "sed -i 's/from . import _build_tlz/from . import _tlz_builder as _build_tlz/' "
                                   "tlz/__init__.py")


def gold_plus_setup_py_edit(sb, task):
    with_gold(sb, task)
    setup = sb.read_file("setup.py").decode()
    return tree_patch(sb, {"setup.py": setup.replace("from os.path import exists",
                                                     "from os.path import exists  # noqa: F401", 1)})
