"""Shell commands for a git work tree: its diff against a base commit and its reset."""

from __future__ import annotations

import shlex

GIT = "git -c safe.directory='*' -c core.quotepath=off"
# Build and cache files a run leaves behind are never part of a patch.
NOT_PATCH = ":(exclude,glob)**/__pycache__/** :(exclude,glob)**/*.pyc :(exclude,glob)**/*.egg-info/** " \
            ":(exclude,glob)**/.pytest_cache/**"


def head_command(workdir: str) -> str:
    return f"cd {shlex.quote(workdir)} && {GIT} rev-parse HEAD 2>/dev/null"


def diff_command(workdir: str, base: str | None) -> str:
    """`git diff` against base, new files included, through a throwaway index (the agent's stays)."""
    spec = " ".join(shlex.quote(p) for p in NOT_PATCH.split())
    return (
        f"cd {shlex.quote(workdir)} && idx=$(mktemp) && cp .git/index \"$idx\" 2>/dev/null; "
        f"GIT_INDEX_FILE=\"$idx\" {GIT} add -A -- . {spec} >/dev/null 2>&1; "
        f"GIT_INDEX_FILE=\"$idx\" {GIT} diff --cached --binary {shlex.quote(base or 'HEAD')}; "
        "rc=$?; rm -f \"$idx\"; exit $rc"
    )


def reset_command(workdir: str, base: str | None) -> str:
    """Tracked files back to base, untracked (not ignored) files removed; build outputs kept."""
    return (
        f"cd {shlex.quote(workdir)} && {GIT} reset -q --hard {shlex.quote(base or 'HEAD')} "
        f"&& {GIT} clean -fdq"
    )
