"""The shell the grader runs as root in a sandbox, in two round trips (see sandbox/privileged.py).

1. `list_script`: the tree put back to what `prepare` left, the environment probed (once per
   image), and git's own reading of the patch: does it apply, which paths it touches. (In a fresh
   sandbox of a probed image, git reads the patch in the session instead: pipeline/verifier/grading.py.)
2. `apply_script`, `test_script` (in the folders `private_folders` and `report_folder` name): the patch
   applied with every protected path put back, the test files restored, then the tests run as the sandbox
   user with their output, exit code, JUnit report and the guard plugin's signed records captured by root.
"""

from __future__ import annotations

import secrets
import shlex

from pipeline.core.records import Task
from pipeline.verifier.environment import pristine
from pipeline.verifier.pytest_log import PY_COLORS, SUMMARY_PARSER, neutral_addopts, report_plugins
from sandbox.base import Sandbox
from sandbox.worktree import checkout_command

CONDA = "/opt/miniconda3/bin/activate"  # SWE-bench images keep the repo's environment there
LOG_CAP = 50_000_000  # bytes of test output kept
GIT = "git -c safe.directory='*' -c core.hooksPath=/dev/null -c core.fsmonitor=false -c core.quotepath=off"
GUARD = "handhold_guard"  # the pytest plugin (pipeline/verifier/pytest_guard.py) that signs each test's real outcome
# Descriptors the test run inherits: a pipe holding the guard's key (drained when the plugin loads, so no
# process that still holds it can read the key again), and the guard's record file.
GUARD_FDS = "7 8"
# What root wrote in the work tree (the patch, the test files) goes to the sandbox user, whose tests write bytecode
# and caches there. Only what the user does not own (the image's group stays): on the image's overlay a chown copies
# a file up even when nothing changes (`chown -R` of a toolz tree, 98 files: 72-120 ms, against ~6 ms for this), and
# a SWE-bench tree holds thousands. Symbolic links themselves, never what they point to (as `chown -R` does).
NOT_THE_USERS = "! -user {uid}"
# The effective patch (what the tree holds against the base when the tests start) is read by `git add -A` into a copy
# of the work tree's own index, modification time kept: git rereads only the files whose stat data moved (a toolz
# tree: 11 ms, against 185 ms hashing every file into an index without stat data). That index is git's alone: the
# one `prepare` wrote, or the one a put-back rebuilt by comparing every file's contents (sandbox/worktree.py), and
# nothing before this step sets a file's times back but the restore of a protected path's own bytes. A write since
# moves its ctime, which no one can set, or leaves it racily clean against the copy's kept time (compared by
# contents); these settings hold git to all of it, whatever a config in the image says.
TRUST_STAT = "-c core.trustctime=true -c core.checkStat=default -c core.ignoreStat=false"
# Run from / so that nothing in the work tree counts: the environment's pytest plugins (by module)
# and every importable top-level module name. Python 3.6 and later (SWE-bench images run old ones).
PROBE = r"""
import sys, pkgutil
try:
    from importlib.metadata import entry_points
    eps = entry_points()
    eps = eps.select(group="pytest11") if hasattr(eps, "select") else eps.get("pytest11", [])
    plugins = {e.value.split(":")[0].strip() for e in eps}
except Exception:
    try:
        import pkg_resources
        plugins = {e.module_name for e in pkg_resources.iter_entry_points("pytest11")}
    except Exception:
        plugins = set()
print(" ".join(sorted(plugins)))
print(" ".join(sorted(set(sys.builtin_module_names) | {m[1] for m in pkgutil.iter_modules()})))
"""


def guard_dir(sandbox: Sandbox) -> str:
    """Where the guard plugin lives in a sandbox: root's, readable by the sandbox user."""
    return sandbox.private.rstrip("/") + "-guard"


def list_script(sandbox: Sandbox, private: str, python: str | None, patch: bool, restore: bool = True) -> str:
    """Pristine tree (`restore`: a sandbox used since `prepare`); the probe (when `python` is given) to probe;
    git's verdict and paths for the patch."""
    wd = shlex.quote(sandbox.workdir)
    probe = (f"(cd / && {{ [ -f {CONDA} ] && . {CONDA} testbed; {python} -c {shlex.quote(PROBE)} || "
             f"python3 -c {shlex.quote(PROBE)}; }}) > {private}/probe || exit 1") if python else ""
    listing = (f"cd {wd} && {GIT} ls-files -z > {private}/tracked || exit 1\n"
               f"if {GIT} apply --check {private}/candidate.patch >/dev/null 2>&1; then\n"
               f"  {GIT} apply --numstat -z {private}/candidate.patch > {private}/numstat || exit 1\n"
               f"else echo refused > {private}/refused; fi") if patch else ""
    return f"""{pristine_tree(sandbox) if restore else ""}
{probe}
{listing}"""


def private_folders(sandbox: Sandbox, private: str) -> dict[str, tuple[int, int, int]]:
    """The folders a grade's inputs go in, as the exchange makes them (path -> mode, uid, gid): the grade's own
    root's alone, the guard plugin's root's and readable by the sandbox user."""
    return {sandbox.private: (0o700, 0, 0), private: (0o700, 0, 0), guard_dir(sandbox): (0o755, 0, 0)}


def report_folder(sandbox: Sandbox) -> tuple[str, tuple[int, int, int]]:
    """A new folder for the test run's JUnit report, the sandbox user's alone: (path, (mode, uid, gid))."""
    uid, gid = (sandbox.run_as.split() + ["0", "0"])[:2]
    return f"/tmp/.handhold-report-{secrets.token_hex(8)}", (0o700, int(uid), int(gid))


def pristine_tree(sandbox: Sandbox) -> str:
    """Shell that makes a sandbox used before (an agent's leftovers, a grade) what `prepare` left: no process
    of the sandbox user, the base commit, no untracked file, ignored files and .git/config as they were."""
    keep, base = pristine(sandbox), shlex.quote(sandbox.base_commit or "HEAD")
    kill = f"pkill -KILL -U {sandbox.run_as.split()[0]}; " if sandbox.run_as else ""
    return (f"if [ -f {keep}/ignored.tar ]; then {kill}cd {shlex.quote(sandbox.workdir)} && "
            f"cp {keep}/git-config .git/config && {checkout_command(base, GIT)} && "
            f"{GIT} clean -fdq && {GIT} ls-files -z -o -i --exclude-standard | sort -z | "
            f"comm -z -23 - <(sort -z {keep}/ignored) | xargs -0r rm -rf -- && tar -xpf {keep}/ignored.tar "
            "|| exit 1; fi")


def apply_script(sandbox: Sandbox, private: str) -> str:
    """Add the touched paths git ignores to the protected ones, back up those that exist, apply, remove every
    protected path, restore the backup. `refused` is written when git will not apply the patch."""
    return f"""cd {shlex.quote(sandbox.workdir)} || exit 1
{GIT} check-ignore -z --stdin < {private}/touched > {private}/ignored
cat {private}/ignored >> {private}/protect
: > {private}/existing
while IFS= read -r -d '' f; do
  if [ -e "$f" ] || [ -L "$f" ]; then printf '%s\\0' "$f" >> {private}/existing; fi
done < {private}/protect
if [ -s {private}/existing ]; then tar -cf {private}/backup.tar --null -T {private}/existing || exit 1; fi
{GIT} apply --whitespace=nowarn {private}/candidate.patch || {{ echo refused > {private}/refused; exit 0; }}
while IFS= read -r -d '' f; do
  rm -f -- "$f"; d=$(dirname -- "$f"); [ "$d" = . ] || rmdir -p --ignore-fail-on-non-empty -- "$d" 2>/dev/null
done < {private}/protect
if [ -s {private}/existing ]; then tar -xpf {private}/backup.tar || exit 1; fi
"""


def _now_us(var: str) -> str:
    """Shell setting `var` to the time in microseconds: bash's own clock (5.0 and later, no process), else `date`."""
    return f"t=${{EPOCHREALTIME/[.,]/}}; {var}=${{t:-$(( $(date +%s%N) / 1000 ))}}"


def restore_tests_command(files: tuple[str, ...], base: str) -> str:
    """Shell putting the test files that `base` (quoted) holds back as they are there, index and tree: one checkout
    of all, else (git refuses them all when one is not at base, as a file the test patch adds) one by one."""
    if not files:
        return ""
    quoted = " ".join(shlex.quote(f) for f in files)
    one_by_one = f"{GIT} cat-file -e {base}:\"$f\" 2>/dev/null && {GIT} checkout -q {base} -- \"$f\""
    return f"{GIT} checkout -q {base} -- {quoted} 2>/dev/null || for f in {quoted}; do {one_by_one}; done"


def test_script(task: Task, sandbox: Sandbox, private: str, plugins: list[str], timeout: float,
                pytest_run: bool, report_dir: str) -> str:
    """Restore the tests, record the tree they see, run them as the sandbox user, their JUnit report in `report_dir`
    (report_folder); root keeps what they did."""
    base = shlex.quote(sandbox.base_commit or "HEAD")
    uid, gid, home, name = (sandbox.run_as.split() + ["", "", "", ""])[:4]
    drop = (f"env HOME={shlex.quote(home)} USER={name} LOGNAME={name} setpriv --reuid={uid} --regid={gid} "
            "--init-groups --") if uid else ""
    addopts = " ".join([*(f"-p {p}" for p in [*report_plugins(plugins), GUARD]),
                        *neutral_addopts(summary=task.log_parser == SUMMARY_PARSER),
                        f"--junitxml={report_dir}/junit.xml"])
    test_patch = (f"{GIT} apply --whitespace=nowarn {private}/test.patch || "
                  "{ echo 'the task test_patch does not apply'; exit 9; }") if task.test_patch else ""
    return f"""cd {shlex.quote(sandbox.workdir)} || exit 1
[ -f {CONDA} ] && . {CONDA} testbed
{restore_tests_command(task.test_files, base)}
{test_patch}
{f"find . {NOT_THE_USERS.format(uid=uid)} -exec chown -h {uid}:{gid} -- {{}} +" if uid else ""}
idx={private}/index.copy; own=.git/index; [ -d .git ] || own=$({GIT} rev-parse --git-path index)
{{ cp -p "$own" $idx 2>/dev/null || GIT_INDEX_FILE=$idx {GIT} read-tree {base}; }} \
  && GIT_INDEX_FILE=$idx {GIT} {TRUST_STAT} add -A . >/dev/null 2>&1
GIT_INDEX_FILE=$idx {GIT} diff --cached --no-ext-diff --no-textconv {base} > {private}/effective.patch
unset PYTEST_PLUGINS
{"export PYTEST_DISABLE_PLUGIN_AUTOLOAD=1 PYTEST_ADDOPTS=" + shlex.quote(addopts) if pytest_run else
 'export PYTEST_ADDOPTS="${PYTEST_ADDOPTS:+$PYTEST_ADDOPTS }--color=no"'}
export {PY_COLORS}
export HANDHOLD_GUARD_FDS={shlex.quote(GUARD_FDS)} PYTHONPATH={guard_dir(sandbox)}${{PYTHONPATH:+:$PYTHONPATH}}
: > {private}/guard.log
{_now_us('start')}
timeout -k 5 {max(int(timeout), 1)} {drop} bash -c {shlex.quote(task.test_cmd)} < /dev/null 7< <(cat {private}/guard.key) 8>> {private}/guard.log 2>&1 | head -c {LOG_CAP} > {private}/log
rc=${{PIPESTATUS[0]}}
{f"pkill -KILL -U {uid}; pkill -KILL -U {uid}" if uid else "true"}
{_now_us('end')}; echo "$rc $(( (end - start) / 1000 ))" > {private}/rc
f={report_dir}/junit.xml
[ -f "$f" ] && [ ! -L "$f" ] && head -c {LOG_CAP} "$f" > {private}/junit.xml
rm -rf {report_dir} $idx
"""
