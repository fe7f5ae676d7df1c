"""Nothing the agent can read holds the code a task's bug replaced (issue 19, section 0), on real containers."""

from __future__ import annotations

import io
import tarfile
import time

import pytest

from pipeline.core.records import Task
from pipeline.synthesis.packages import PackageSpec
from pipeline.synthesis.synth import SynthConfig, synthesize
from pipeline.tasks.answer_search import originals, search_sandbox, windows
from pipeline.verifier.environment import task_sandbox
from sandbox.docker_sandbox import DockerSandbox
from sandbox.images import build_from_dockerfile

from tests.conftest import TOOLZ
from pipeline.rollouts.batch import RolloutConfig

RULES = RolloutConfig().grade_rules()

CALC = "".join(f"def f{i}(a, b):\n    total = a * {i}\n    total = total + b\n    return total\n\n\n" for i in range(6))
CALC_BUG = CALC.replace("total = total + b", "total = total - b", 1)
CALC_TESTS = "".join(f"from shipsbuild.calc import f{i}\n\n\ndef test_f{i}():\n    assert f{i}(2, 3) == {2 * i + 3}\n\n\n"
                     for i in range(6))


def test_windows_are_the_original_lines_around_the_change():
    gold = ("diff --git a/calc.py b/calc.py\n--- a/calc.py\n+++ b/calc.py\n@@ -1,4 +1,4 @@\n def f0(a, b):\n"
            "     total = a * 0\n-    total = total - b\n+    total = total + b\n     return total\n")
    assert windows(gold, {"calc.py": CALC_BUG}) == [["def f0(a, b):", "total = a * 0", "total = total + b",
                                                    "return total"]]
    assert originals(gold, {"calc.py": CALC_BUG}) == {"calc.py": CALC}
    assert windows(gold, {"calc.py": CALC}) == []  # the buggy file already holds it: no evidence


def test_toolz_tasks_leave_no_copy_of_the_original(synth_run):
    """setuptools built toolz's wheel in the cached source, and the image copied that build/lib (committed in
    every task); now the wheel is built from a copy and nothing the search looks at holds the original."""
    tasks, report, _, cache = synth_run
    assert not (cache / "src" / TOOLZ.key / "build").exists()
    assert report.removed[TOOLZ.key] == []  # the sdist ships no copy; nothing else made one
    for task in tasks[:2]:
        with task_sandbox(task) as sb:
            begun = time.monotonic()
            found, stats = search_sandbox(sb, task)
            seconds = time.monotonic() - begun
            tracked = sb.run("git ls-files | grep -c '^build/'; ls -d build dist 2>&1").output
        assert found == [], found
        assert "0\n" in tracked and "No such file" in tracked
        assert stats["agent"]["files"] > 1000 and stats["root"]["files"] >= stats["agent"]["files"]
        assert stats["agent"]["code_prints"] >= 1 and stats["agent"]["private_files_read"] == 0
        print(f"{task.instance_id}: searched in {seconds:.1f} s, {stats}")


def test_the_search_finds_planted_copies(toolz_task):
    """A copy only root can read, bytecode of the original without its source, a tarball holding it, and
    a loose git object no ref reaches: each found, with who can read it."""
    file = next(line[6:] for line in toolz_task.patch.splitlines() if line.startswith("+++ b/"))
    with task_sandbox(toolz_task) as sb:
        original = originals(toolz_task.patch, {file: sb.read_file(file).decode()})[file]
        sb.run_privileged(f"install -d -m 0755 /opt/plant && head -c {len(original.encode())} > /opt/plant/root_only.py"
                          " && chmod 600 /opt/plant/root_only.py", timeout=30, stdin=original.encode())
        sb.write_file("/tmp/plant/orig_mod.py", original)
        assert sb.run("cd /tmp/plant && python -m py_compile orig_mod.py && rm orig_mod.py && "
                      "mv __pycache__/*.pyc ./compiled.pyc && rmdir __pycache__").exit_code == 0
        sb.write_file("/tmp/plant/src.tar.gz", _tarball({"pkg/module.py": original}))
        sb.write_file("/tmp/plant/blob", original)
        blob = sb.run("cd /testbed && git hash-object -w /tmp/plant/blob && rm /tmp/plant/blob").output.split()[-1]
        found, _ = search_sandbox(sb, toolz_task)
    where = {(f.user, f.path, f.how) for f in found}
    assert where == {
        ("root", "/opt/plant/root_only.py", "file"),
        ("agent", "/tmp/plant/compiled.pyc", "bytecode"), ("root", "/tmp/plant/compiled.pyc", "bytecode"),
        ("agent", "/tmp/plant/src.tar.gz!pkg/module.py", "archive member"),
        ("root", "/tmp/plant/src.tar.gz!pkg/module.py", "archive member"),
        ("agent", f"/testbed/.git:{blob}", "git blob object"), ("root", f"/testbed/.git:{blob}", "git blob object"),
    }, where


def _tarball(files: dict[str, str | bytes]) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        for name, text in files.items():
            data = text.encode() if isinstance(text, str) else text
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


@pytest.fixture(scope="module")
def dangling_repo(base_image, docker_client, tmp_path_factory) -> Task:
    """An image whose repository holds the fix in a commit the task's commit does not reach (committed, then
    reset away: only the reflog points at it), packed, plus a stash and a tag holding it."""
    tag = "handhold/test-dangling:1"
    git = "git -c user.name=t -c user.email=t@t"
    ctx = tmp_path_factory.mktemp("dangling")
    (ctx / "bug.py").write_text(CALC_BUG)
    (ctx / "fix.py").write_text(CALC)
    script = " && ".join([
        "mkdir /testbed && cd /testbed && git init -q", "cp /ctx/bug.py calc.py",
        f"{git} add calc.py && {git} commit -qm bug", "cp /ctx/fix.py calc.py",
        f"{git} commit -qam fix && {git} tag v2 && {git} reset -q --hard HEAD~1",
        f"cp /ctx/fix.py calc.py && {git} stash -q", "git repack -a -d -q", "rm -rf /ctx",
        "git rev-parse HEAD > /head", "chown -R 1000 /testbed"])
    build_from_dockerfile(docker_client, f"FROM {base_image}\nUSER root\nCOPY ctx /ctx\nRUN {script}\nUSER agent\n",
                          tag, files={"ctx": str(ctx)})
    head = docker_client.containers.run(tag, ["cat", "/head"], remove=True).decode().strip()
    gold = ("diff --git a/calc.py b/calc.py\n--- a/calc.py\n+++ b/calc.py\n@@ -1,4 +1,4 @@\n def f0(a, b):\n"
            "     total = a * 0\n-    total = total - b\n+    total = total + b\n     return total\n")
    return Task(instance_id="dangling__1", repo="demo/calc", base_commit=head, patch=gold, test_patch="",
                problem_statement="f0 subtracts", FAIL_TO_PASS=(), PASS_TO_PASS=(), image=tag, workdir="/testbed",
                test_cmd="true", log_parser="parse_log_pytest", source="dataset", setup_patch="", test_files=())


def test_a_dangling_commit_is_found_before_cleanup_and_gone_after(dangling_repo):
    with DockerSandbox(dangling_repo.image, workdir="/testbed") as raw:  # the image as it is, no prepare
        before, _ = search_sandbox(raw, dangling_repo)
    assert {f.user for f in before} == {"agent", "root"}
    assert all(f.path.startswith("/testbed/.git") and "git" in f.how for f in before), before
    with task_sandbox(dangling_repo) as sb:
        after, _ = search_sandbox(sb, dangling_repo)
        assert sb.run("git rev-parse HEAD").output.strip() == dangling_repo.base_commit
        assert sb.run("git for-each-ref; git stash list; git reflog").output.strip() == \
            sb.run("git for-each-ref").output.strip()  # the branch only: no tag, stash or reflog
    assert after == []


def test_an_sdist_shipping_build_lib_and_backups_yields_an_image_without_them(synth_run, base_image, docker_client):
    """A package whose sdist ships build/lib, dist/ and a .orig backup (all copies of its source): the image
    leaves them out, the report lists them, and a synthesized task's container holds no copy."""
    cache = synth_run[3]
    files = {"setup.py": b"from setuptools import setup\nsetup(name='shipsbuild', version='1.0', "
                         b"packages=['shipsbuild'])\n",
             "shipsbuild/__init__.py": b"", "shipsbuild/calc.py": CALC.encode(), "tests/test_calc.py": CALC_TESTS.encode(),
             "build/lib/shipsbuild/calc.py": CALC.encode(), "shipsbuild/calc.py.orig": CALC.encode(),
             "dist/shipsbuild-1.0.tar.gz": _tarball({"shipsbuild-1.0/shipsbuild/calc.py": CALC})}
    (cache / "sdist").mkdir(parents=True, exist_ok=True)
    (cache / "sdist" / "shipsbuild-1.0.tar.gz").write_bytes(_tarball({f"shipsbuild-1.0/{k}": v for k, v in files.items()}))
    spec = PackageSpec("shipsbuild", "1.0", ("tests",), ("shipsbuild/calc.py",))
    config = SynthConfig(packages=(), tasks_per_package=1, candidates_per_package=12, baseline_runs=1,
                         validation_runs=1, workers=1)
    tasks, report = synthesize(config, base_image, cache, docker_client, specs=(spec,), rules=RULES)
    assert tasks, report.as_json()
    assert report.removed["shipsbuild-1.0"] == ["build/lib", "dist", "shipsbuild/calc.py.orig"]
    assert report.as_json()["per_package"]["shipsbuild-1.0"]["copies_removed"] == 3
    with task_sandbox(tasks[0]) as sb:
        found, _ = search_sandbox(sb, tasks[0])
    assert found == [], found



def test_the_bytecode_of_every_file_a_bug_touches_is_removed_renamed_and_deleted_ones_included():
    from pipeline.verifier.environment import no_bytecode

    patch = ("diff --git a/pkg/core.py b/pkg/core.py\n--- a/pkg/core.py\n+++ b/pkg/core.py\n@@ -1 +1 @@\n-a\n+b\n"
             "diff --git a/pkg/old.py b/pkg/new.py\nrename from pkg/old.py\nrename to pkg/new.py\n"
             "--- a/pkg/old.py\n+++ b/pkg/new.py\n@@ -1 +1 @@\n-x\n+y\n"
             "diff --git a/gone.py b/gone.py\ndeleted file mode 100644\n--- a/gone.py\n+++ /dev/null\n@@ -1 +0,0 @@\n-z\n"
             "diff --git a/data.txt b/data.txt\n--- a/data.txt\n+++ b/data.txt\n@@ -1 +1 @@\n-1\n+2\n")
    removed = no_bytecode(patch).split()
    assert removed[:2] == ["rm", "-f"] and "data" not in " ".join(removed)
    for name in ("pkg/core", "pkg/old", "pkg/new", "gone"):
        folder, _, stem = name.rpartition("/")
        assert f"{folder + '/' if folder else ''}__pycache__/{stem}.*.pyc" in removed and f"{name}.pyc" in removed
    assert no_bytecode("") == "true"
