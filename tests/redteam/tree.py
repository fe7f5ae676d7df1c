"""A task sandbox as a workbench: patches built from its tree with git, the tree scrubbed back to
its snapshot between uses, and the plain SWE-bench harness run in it."""

from __future__ import annotations

import shlex

from swebench.harness.constants import END_TEST_OUTPUT, START_TEST_OUTPUT, TEST_EXIT_CODE

from pipeline.core.records import Task
from sandbox.base import Sandbox

GIT = "git -c safe.directory='*' -c core.quotepath=off"


def run(sb: Sandbox, command: str) -> str:
    result = sb.run(f"cd {shlex.quote(sb.workdir)} && {command}", timeout=120)
    assert result.exit_code == 0, f"`{command}` failed in the sandbox: {result.output[-1500:]}"
    return result.output


def tree_patch(sb: Sandbox, files: dict[str, str | bytes] | None = None, commands: str = "",
               force: tuple[str, ...] = ()) -> str:
    """The patch of the tree after writing `files` and running `commands`: `sandbox.diff()`, or when
    git-ignored paths are `force`d in, the same `git diff --binary` through a throwaway index."""
    for path, data in (files or {}).items():
        sb.write_file(path, data)
    if commands:
        run(sb, commands)
    if force:
        paths = " ".join(shlex.quote(p) for p in force)
        # against the base tree plus the forced paths as the snapshot has them (the image's bytecode): a
        # file the tree already holds is changed by the patch, as it would have to be in every container
        patch = run(sb, f"idx=$(mktemp -u) && GIT_INDEX_FILE=$idx {GIT} read-tree {sb.base_commit} && "
                        f"before=$(mktemp -d) && tar -xf {sb.scratch}/ignored.tar -C $before && "
                        f"for f in {paths}; do if [ -e \"$before/$f\" ]; then "
                        f"blob=$({GIT} hash-object -w \"$before/$f\") && "
                        f"GIT_INDEX_FILE=$idx {GIT} update-index --add --cacheinfo 100644,$blob,\"$f\"; fi; done && "
                        f"pre=$(GIT_INDEX_FILE=$idx {GIT} write-tree) && rm -rf $before && "
                        f"GIT_INDEX_FILE=$idx {GIT} add -A . && GIT_INDEX_FILE=$idx {GIT} add -f -- {paths} && "
                        f"GIT_INDEX_FILE=$idx {GIT} diff --cached --binary $pre; rm -f $idx")
    else:
        patch = sb.diff()
    scrub(sb)
    return patch


def with_gold(sb: Sandbox, task: Task) -> list[str]:
    """Apply the gold patch in the tree (not reset); the paths it changed."""
    sb.write_file(f"{sb.scratch}/gold.patch", task.patch)
    run(sb, f"{GIT} apply {sb.scratch}/gold.patch")
    return run(sb, f"{GIT} diff --name-only").split()


def snapshot(sb: Sandbox) -> None:
    """Record what a clean tree holds besides git's files: ignored files (names and contents), .git/config."""
    run(sb, f"cp .git/config {sb.scratch}/git-config && {GIT} ls-files -z -o -i --exclude-standard "
            f"| sort -z > {sb.scratch}/ignored && tar -cf {sb.scratch}/ignored.tar --null -T {sb.scratch}/ignored")


def scrub(sb: Sandbox) -> None:
    """Back to the snapshot: sandbox.reset(), then new ignored files, changed ones (bytecode), hooks and git
    config undone."""
    sb.reset()
    run(sb, f"{GIT} ls-files -z -o -i --exclude-standard | sort -z | comm -z -23 - {sb.scratch}/ignored "
            f"| xargs -0r rm -f -- && tar -xf {sb.scratch}/ignored.tar && cp {sb.scratch}/git-config .git/config && "
            "find .git/hooks -type f ! -name '*.sample' -delete && "
            f"test -z \"$({GIT} status --porcelain)\" && "
            f"{GIT} ls-files -z -o -i --exclude-standard | sort -z | cmp -s - {sb.scratch}/ignored")


def harness_script(sb: Sandbox, task: Task, patch_path: str, log_path: str) -> str:
    """SWE-bench's own harness, no more: the whole patch applied (git apply, else patch --fuzz), the
    test files checked out at base, the tests run between its markers with their exit code."""
    files = " ".join(shlex.quote(f) for f in task.test_files)
    return (f"cd {shlex.quote(sb.workdir)} && {{ git apply --whitespace=nowarn {patch_path} || "
            f"patch --batch --fuzz=5 -p1 -i {patch_path}; }} >/dev/null 2>&1; "
            f"git checkout -q {sb.base_commit} -- {files}; {{ echo '{START_TEST_OUTPUT}'; "
            f"{task.test_cmd} 2>&1; rc=$?; echo '{END_TEST_OUTPUT}'; echo '{TEST_EXIT_CODE}: '$rc; }} > {log_path}")
