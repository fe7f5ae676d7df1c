"""Shell commands for a git work tree: its diff against a base commit and its reset."""

from __future__ import annotations

import shlex

# The agent may write .git/config: no program it names there (an fsmonitor, hooks) runs, or answers for the tree.
GIT = "git -c safe.directory='*' -c core.quotepath=off -c core.fsmonitor=false -c core.hooksPath=/dev/null"
# Build and cache files a run leaves behind are never part of a patch.
NOT_PATCH = ":(exclude,glob)**/__pycache__/** :(exclude,glob)**/*.pyc :(exclude,glob)**/*.egg-info/** " \
            ":(exclude,glob)**/.pytest_cache/**"


def head_command(workdir: str) -> str:
    return f"cd {shlex.quote(workdir)} && {GIT} rev-parse HEAD 2>/dev/null"


def diff_command(workdir: str, base: str | None) -> str:
    """`git diff` against base, new files included, exact whatever the files' timestamps.

    The diff goes through a throwaway index read from the base tree, which holds no stat data:
    git hashes every file instead of trusting a size and an mtime that an edit may have kept.
    The agent's own index, config and hooks play no part (no external diff, no textconv).
    """
    spec = " ".join(shlex.quote(p) for p in NOT_PATCH.split())
    base = shlex.quote(base or "HEAD")
    return (
        f"cd {shlex.quote(workdir)} && idx=$(mktemp -u) && "
        f"GIT_INDEX_FILE=\"$idx\" {GIT} read-tree {base} && "
        f"GIT_INDEX_FILE=\"$idx\" {GIT} add -A -- . {spec} >/dev/null 2>&1 && "
        f"GIT_INDEX_FILE=\"$idx\" {GIT} diff --cached --binary --no-ext-diff --no-textconv --no-color "
        f"--src-prefix=a/ --dst-prefix=b/ {base}; rc=$?; rm -f \"$idx\"; exit $rc"
    )


def reset_command(workdir: str, base: str | None) -> str:
    """Tracked files back to base, untracked (not ignored) files removed; build outputs kept."""
    return f"cd {shlex.quote(workdir)} && {checkout_command(shlex.quote(base or 'HEAD'))} && {GIT} clean -fdq"


def checkout_command(base: str, git: str = GIT) -> str:
    """Shell, run in the work tree, that makes every tracked file exactly as at `base` (a quoted commit).

    The index is rebuilt from the base tree without stat data (`read-tree` without `-m` never reads
    the index it replaces: the agent's flags, stat data and extensions go with it) and refreshed,
    which compares every file's contents (a same-size edit in the second of the checkout included)
    and records the stat of those that match; the hard reset then rewrites only the files that
    differ, so the files it keeps keep their timestamps (and the bytecode compiled from them stays
    valid). The refresh skips the preload, a threaded stat of every file that cannot spare a single
    content comparison in an index without stat data.
    """
    refresh = f"{git} -c core.preloadIndex=false update-index -q --refresh >/dev/null"
    return f"{git} read-tree {base} && {{ {refresh}; {git} reset -q --hard {base}; }}"
