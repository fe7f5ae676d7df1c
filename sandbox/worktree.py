"""Shell commands for a git work tree: its diff against a base commit and its reset."""

from __future__ import annotations

import shlex

# The agent may write .git/config: no program it names there (an fsmonitor, hooks) runs, or answers for the tree.
GIT = "git -c safe.directory='*' -c core.quotepath=off -c core.fsmonitor=false -c core.hooksPath=/dev/null"
# What git trusts a file's stat data by, whatever the agent wrote in .git/config: every field (ctime included),
# no assume-unchanged bits set, no untracked cache, split index or sparse checkout.
TRUST_STAT = ("-c core.trustctime=true -c core.checkStat=default -c core.ignoreStat=false -c core.fileMode=true "
              "-c core.untrackedCache=false -c core.splitIndex=false -c core.sparseCheckout=false")
# Build and cache files a run leaves behind are never part of a patch.
NOT_PATCH = ":(exclude,glob)**/__pycache__/** :(exclude,glob)**/*.pyc :(exclude,glob)**/*.egg-info/** " \
            ":(exclude,glob)**/.pytest_cache/**"


def head_command(workdir: str) -> str:
    return f"cd {shlex.quote(workdir)} && {GIT} rev-parse HEAD 2>/dev/null"


def diff_command(workdir: str, base: str | None, trusted_index: str | None = None) -> str:
    """`git diff` against base, new files included, exact whatever the files' timestamps.

    The diff goes through a throwaway index. Without `trusted_index` it is read from the base tree and holds
    no stat data: git hashes every file instead of trusting a size and an mtime that an edit may have kept.
    With it, a copy of an index of the base tree kept where the agent cannot write (keep_index_command), whose
    stat data git trusts as a reset does (reset_command): it hashes only the files whose stat moved since
    (toolz, ~100 files: ~6 against ~15 ms quiet). The agent's own index, config and hooks play no part (no
    external diff, no textconv).
    """
    spec = " ".join(shlex.quote(p) for p in NOT_PATCH.split())
    base = shlex.quote(base or "HEAD")
    start = (f"cp --preserve=timestamps {shlex.quote(trusted_index)} \"$idx\"" if trusted_index else
             f"GIT_INDEX_FILE=\"$idx\" {GIT} read-tree {base}")
    return (
        f"cd {shlex.quote(workdir)} && idx=$(mktemp -u) && {start} && "
        f"GIT_INDEX_FILE=\"$idx\" {GIT} {TRUST_STAT} add -A -- . {spec} >/dev/null 2>&1 && "
        f"GIT_INDEX_FILE=\"$idx\" {GIT} diff --cached --binary --no-ext-diff --no-textconv --no-color "
        f"--src-prefix=a/ --dst-prefix=b/ {base}; rc=$?; rm -f \"$idx\"; exit $rc"
    )


def reset_command(workdir: str, base: str | None, trusted_index: str | None = None) -> str:
    """Tracked files back to base, untracked (not ignored) files removed; build outputs kept.

    Without `trusted_index` every file's contents are compared (checkout_command). With it, an index an
    earlier reset wrote, kept where the agent cannot write (keep_index_command): git starts from its stat
    data and compares and rewrites only the files whose stat changed since. No edit keeps a file's ctime,
    the agent's config cannot make git look past it (TRUST_STAT), and the copy keeps the index's mtime, so
    git still compares the contents of what was written in the index's own tick (racy git). 1,000 files:
    ~35 ms against ~50-80 (benchmarks/sandbox_exec.py).
    """
    git = f"{GIT} {TRUST_STAT}"
    base = shlex.quote(base or "HEAD")
    if trusted_index is None:
        start = checkout_command(base, git)
    else:
        start = (f"cp --preserve=timestamps --remove-destination {shlex.quote(trusted_index)} .git/index && "
                 f"{git} reset -q --hard {base}")
    return f"cd {shlex.quote(workdir)} && {start} && {git} clean -fdq"


def keep_index_command(workdir: str, trusted_index: str, run_as: str) -> str:
    """Root's shell that copies the work tree's index, as a reset just wrote it, to `trusted_index`: a file
    the sandbox user can read and not write. The index is read as that user (`run_as`: "uid gid ..."), so a
    link planted in its place shows root's files to no one; the copy keeps its mtime. A folder that is not root's
    alone (the user made it first) is not written in."""
    uid, gid = run_as.split()[:2]
    as_user = f"setpriv --reuid={uid} --regid={gid} --clear-groups"
    index, new = shlex.quote(f"{workdir.rstrip('/')}/.git/index"), shlex.quote(trusted_index + ".new")
    folder = shlex.quote(trusted_index.rsplit("/", 1)[0] or "/")
    return (f"mkdir -p -m 0755 {folder} && [ \"$(stat -c %u:%a {folder})\" = 0:755 ] && "
            f"when=$({as_user} stat -c %y {index}) && {as_user} cat {index} > {new} && touch -d \"$when\" {new} "
            f"&& chmod 0644 {new} && mv -f {new} {shlex.quote(trusted_index)}")


def keep_fresh_index_command(workdir: str, trusted_index: str, base: str) -> str:
    """Root's shell that copies the index of a tree nothing has run in since it was made (no planted link, no
    folder made ahead) to `trusted_index`, mtime kept, the sandbox user's to read, when it holds exactly `base`'s
    tree: three processes, where keep_index_command takes a dozen."""
    folder = shlex.quote(trusted_index.rsplit("/", 1)[0] or "/")
    return (f"cd {shlex.quote(workdir)} && {GIT} diff-index --cached --quiet {shlex.quote(base)} -- && "
            f"install -d -m 0755 {folder} && install -p -m 0644 .git/index {shlex.quote(trusted_index)}")


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
