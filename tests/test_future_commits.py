"""A dataset image's clone may hold commits made after the task's base commit (issue 23, section 2A): the
task sandbox holds exactly what the base commit reaches, on real containers."""

from __future__ import annotations

import time

import pytest

from pipeline.core.records import Task
from pipeline.verifier.environment import prepare, task_sandbox
from sandbox.base import SandboxError
from sandbox.docker_sandbox import DockerSandbox
from sandbox.history import pruned_image
from sandbox.images import build_from_dockerfile

FIX = "FUTURE_FIX_5e1c7d"  # only the later commits hold this text
GIT = "git -c user.name=t -c user.email=t@t"
# Every place a clone can keep a later commit: a branch, an annotated tag, a remote-tracking ref, a note on
# the base commit, a stash, the reflog (committed then reset away), ORIG_HEAD, FETCH_HEAD, COMMIT_EDITMSG,
# a dangling commit, a kept pack, packed refs, and an alternate object store.
REPO = " && ".join([
    "mkdir /testbed /alt && cd /testbed && git init -q -b main",
    "printf 'def f(a, b):\\n    return a - b\\n' > calc.py", f"{GIT} add calc.py", f"{GIT} commit -qm bug",
    "git rev-parse HEAD > /head",
    f"git checkout -qb future && printf 'def f(a, b):\\n    return a + b  # {FIX}\\n' > calc.py",
    f"{GIT} commit -qam 'fix {FIX}' && {GIT} tag -a v2 -m 'release {FIX}'",
    f"{GIT} notes add -m 'see {FIX}' $(cat /head)",
    "git update-ref refs/remotes/origin/main future && git remote add origin https://example.invalid/calc",
    "git repack -a -d -q && touch $(ls .git/objects/pack/pack-*.pack | sed 's/pack$/keep/')",
    "git checkout -q main && git pack-refs --all",
    f"printf 'x = \"{FIX} stash\"\\n' >> calc.py && {GIT} stash -q",
    f"printf 'x = \"{FIX} reflog\"\\n' >> calc.py && {GIT} commit -qam 'reflog {FIX}' && git reset -q --hard HEAD~1",
    f"printf 'y = \"{FIX} dangling\"\\n' > d.py && blob=$(git hash-object -w d.py) && rm d.py",
    f"{GIT} commit-tree $(printf '100644 blob %s\\td.py\\n' $blob | git mktree) -m 'dangling {FIX}' > /dev/null",
    "echo \"$(git rev-parse future)\t\tbranch 'main' of https://example.invalid/calc\" > .git/FETCH_HEAD",
    f"git init -q --bare /alt/store.git && printf 'z = \"{FIX} alternate\"\\n' | git --git-dir=/alt/store.git "
    "hash-object -w --stdin && echo /alt/store.git/objects > .git/objects/info/alternates",
    "chown -R 1000 /testbed",
])
# every way an agent reads git, each printing the fix's text where git still holds it
PROBES = ("git log --all -p", "git reflog --all", "git stash list -p", "git tag -n", "git notes show HEAD",
          "git branch -a --format='%(refname) %(contents)'", "git show ORIG_HEAD FETCH_HEAD",
          "git fsck --unreachable --no-reflogs --no-progress | cut -d' ' -f3 | xargs -r git show",
          "git cat-file --batch-all-objects --batch", "grep -ra FIX .git".replace("FIX", FIX))


@pytest.fixture(scope="module")
def future_task(base_image, docker_client, tmp_path_factory) -> Task:
    tag = "handhold/test-future-commits:1"
    build_from_dockerfile(docker_client, f"FROM {base_image}\nUSER root\nRUN {REPO}\nUSER agent\n", tag, files={})
    head = docker_client.containers.run(tag, ["cat", "/head"], remove=True).decode().strip()
    return Task(instance_id="future__1", repo="demo/calc", base_commit=head, patch="", test_patch="",
                problem_statement="f subtracts", FAIL_TO_PASS=(), PASS_TO_PASS=(), image=tag, workdir="/testbed",
                test_cmd="true", log_parser="parse_log_pytest", source="dataset", setup_patch="", test_files=())


def _reached(sandbox) -> dict[str, int]:
    """How many times each probe, run as the agent, prints the fix's text."""
    return {probe: sandbox.run(f"{{ {probe}; }} 2>&1 | grep -c {FIX}").output.strip() for probe in PROBES}


def _objects(sandbox) -> tuple[list[str], list[str]]:
    listed = sandbox.run("git cat-file --batch-all-objects --batch-check='%(objectname)' | sort").output.split()
    reached = sandbox.run(f"git rev-list --objects {sandbox.base_commit} | cut -d' ' -f1 | sort").output.split()
    return listed, reached


def _exactly_the_base(sandbox, task: Task) -> None:
    assert all(count == "0" for count in _reached(sandbox).values()), _reached(sandbox)
    listed, reached = _objects(sandbox)
    assert listed == reached and len(reached) == 3  # commit, tree, calc.py
    root = sandbox.run_privileged(f"grep -rac {FIX} {task.workdir}/.git | grep -v ':0$'; "
                                  f"git -c safe.directory='*' -C {task.workdir} count-objects -v", timeout=60).output
    assert FIX not in root and "size-pack" in root, root
    assert sandbox.run("git rev-parse HEAD; git symbolic-ref HEAD; git status --porcelain; git remote").output.split() \
        == [task.base_commit, "refs/heads/main"]
    edit = sandbox.run(f"echo '# mine' >> calc.py && {GIT} commit -qam mine && git reset -q --hard HEAD~1")
    assert edit.exit_code == 0, edit.output  # the agent still owns its repository


def test_the_image_as_built_holds_the_fix_everywhere(future_task):
    """The fixture can fail the tests below: every probe finds the fix in the raw image."""
    with DockerSandbox(future_task.image, workdir="/testbed") as raw:
        reached = _reached(raw)
        listed, base = _objects(raw)
    assert all(int(count) >= 1 for count in reached.values()), reached
    assert len(listed) > len(base)


def test_the_task_sandbox_reaches_only_the_base_commit(future_task, docker_client):
    """Pruned once per image (a derived image); an attempt only reads the marker."""
    begun = time.monotonic()
    tag = pruned_image(docker_client, future_task.image, future_task.workdir, future_task.base_commit)
    built = time.monotonic() - begun
    begun = time.monotonic()
    assert pruned_image(docker_client, future_task.image, future_task.workdir, future_task.base_commit) == tag
    assert time.monotonic() - begun < 1.0  # the second call finds the image
    with task_sandbox(future_task) as sb:
        assert sb.image == tag and sb.environment == future_task.image
        _exactly_the_base(sb, future_task)
    print(f"pruned image built in {built:.1f} s")


def test_prepare_prunes_an_image_nobody_pruned(future_task):
    """A sandbox started from the raw image (another factory, a pool) is pruned by prepare itself."""
    with DockerSandbox(future_task.image, workdir="/testbed", base_commit=future_task.base_commit) as sb:
        prepare(sb, future_task)
        _exactly_the_base(sb, future_task)


def test_an_image_whose_head_is_past_the_base_commit_is_refused(future_task, docker_client):
    later = docker_client.containers.run(future_task.image, ["git", "-C", "/testbed", "rev-parse", "future"],
                                         remove=True).decode().strip()
    with pytest.raises(SandboxError, match="not the base commit"):
        pruned_image(docker_client, future_task.image, future_task.workdir, later)
