"""A repository that holds its base commit's history and nothing else: no later commit to read the fix in.

An image of a public dataset row is a clone: other branches, tags, stashes, reflogs, notes, remotes,
ORIG_HEAD/FETCH_HEAD, packed refs, kept packs, alternates and dangling objects may hold commits made after
the task's base commit. `only_reachable_command` rebuilds the object store from what the base commit
reaches, so `git cat-file --batch-all-objects` lists exactly `git rev-list --objects <base>` afterwards;
`pruned_image` does it once per image, so an attempt only reads a marker.
"""

from __future__ import annotations

import hashlib
import shlex

import docker
import docker.errors

from sandbox.base import SandboxError
from sandbox.images import LABEL, build_from_dockerfile, image_exists

MARKER = ".git/handhold-only-reachable"  # holds the base commit the store was rebuilt from
GIT = "git -c safe.directory='*' -c core.hooksPath=/dev/null"
# What a work tree's .git keeps: HEAD, its config (remotes dropped), the index, excludes and attributes,
# hooks and submodules' repositories. Anything else (logs, worktrees, rebase state, COMMIT_EDITMSG,
# FETCH_HEAD and every other *_HEAD, lost-found, rr-cache, grafts) is removed.
KEEP = ("HEAD", "config", "description", "index", "info", "hooks", "modules", "objects", "refs", "shallow")
KEEP_INFO = ("exclude", "attributes", "sparse-checkout")


def only_reachable_command(workdir: str, base: str) -> str:
    """Shell, run as a user who owns the repository, leaving only the objects `base` reaches and one branch
    (HEAD's, at base) or a detached HEAD; fails when HEAD is not base (the tree would not be the task's)."""
    keep = " ".join(f"! -name {name}" for name in KEEP)
    keep_info = " ".join(f"! -name {name}" for name in KEEP_INFO)
    return (
        f"(cd {shlex.quote(workdir)} && base=$({GIT} rev-parse --verify {shlex.quote(base)}^{{commit}}) && "
        f"head=$({GIT} rev-parse --verify HEAD) && if [ \"$head\" != \"$base\" ]; then "
        f"echo \"HEAD is $head, not the base commit $base\" >&2; exit 3; fi && "
        f"branch=$({GIT} symbolic-ref -q HEAD || true) && "
        f"for remote in $({GIT} remote); do {GIT} config --remove-section \"remote.$remote\"; done && "
        # the new pack holds what base reaches, read through every store (alternates and kept packs included)
        f"new=$(mktemp -d) && echo \"$base\" | {GIT} pack-objects -q --revs --delta-base-offset \"$new/pack\" "
        f">/dev/null && "
        f"find .git -mindepth 1 -maxdepth 1 {keep} -exec rm -rf {{}} + && "
        f"mkdir -p .git/info && find .git/info -mindepth 1 -maxdepth 1 {keep_info} -exec rm -rf {{}} + && "
        f"rm -rf .git/refs .git/objects && mkdir -p .git/refs/heads .git/refs/tags .git/objects/pack "
        f".git/objects/info && mv \"$new\"/pack-* .git/objects/pack/ && rmdir \"$new\" && "
        f"if [ -n \"$branch\" ]; then {GIT} -c core.logAllRefUpdates=false update-ref \"$branch\" \"$base\"; else {GIT} -c core.logAllRefUpdates=false update-ref --no-deref HEAD \"$base\"; fi && "
        # the index may name blobs of staged changes that are gone now: rebuild it from base, keep the files
        f"{GIT} read-tree \"$base\" && {{ {GIT} update-index -q --refresh >/dev/null || true; }} && "
        f"echo \"$base\" > {MARKER})"
    )


def already_pruned_command(workdir: str, base: str) -> str:
    """Shell that succeeds when the image's repository was rebuilt for `base` (by `pruned_image`)."""
    return f"(cd {shlex.quote(workdir)} && test \"$(cat {MARKER} 2>/dev/null)\" = {shlex.quote(base)})"


def pruned_image(client: docker.DockerClient, image: str, workdir: str, base: str) -> str:
    """The tag of `image` with its repository at `workdir` holding only what `base` reaches, built once."""
    try:
        source = client.images.get(image)
    except docker.errors.ImageNotFound:
        source = client.images.pull(image)  # SWE-bench images are pulled, not built
    key = hashlib.sha256(f"{source.id}\n{workdir}\n{base}".encode()).hexdigest()[:16]
    tag = f"handhold/only-reachable:{key}"
    if image_exists(client, tag):
        return tag
    user = source.attrs.get("Config", {}).get("User") or "root"
    # run as root, then the repository's owner owns what the rebuild wrote (the agent commits and resets there)
    script = (f"{only_reachable_command(workdir, base)} && "
              f"chown -R \"$(stat -c %u:%g {shlex.quote(workdir)})\" {shlex.quote(workdir)}/.git")
    dockerfile = (f"FROM {source.id}\nUSER root\nRUN sh -c {shlex.quote(script)}\nUSER {user}\n"
                  f"LABEL {LABEL}.only-reachable={base}\n")
    try:
        build_from_dockerfile(client, dockerfile, tag, files={})
    except RuntimeError as exc:
        raise SandboxError(f"image {image}: keeping only what the base commit {base} reaches in {workdir} "
                           f"failed; is {base} the commit the image's HEAD is at?\n{exc}") from exc
    return tag
