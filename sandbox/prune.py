"""Removing the images handhold derives from task images, which nothing else removes.

A task's prepared image (`handhold/prepared:<key>`, pipeline/verifier/environment.py) and an image keeping only
what a base commit reaches (`handhold/only-reachable:<key>`, sandbox/history.py) are made on first need, from an
image that stays, in under a second; every new task or rebuilt image adds one (1-2.5 MB of its own each).
`handhold prune-images` removes those no container uses: a later sandbox makes its own again.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from datetime import datetime

import docker
import docker.errors

from sandbox.images import LABEL, docker_client

DERIVED = ("handhold/prepared", "handhold/only-reachable")


@dataclass
class Pruned:
    """What a prune removed (tags), the bytes only they held, and what it kept because a container uses it."""

    removed: list[str] = field(default_factory=list)
    freed_bytes: int = 0
    in_use: list[str] = field(default_factory=list)

    def report(self) -> str:
        lines = [f"removed {tag}" for tag in self.removed] + [f"kept {tag}: a container uses it" for tag in self.in_use]
        return "\n".join(lines + [f"{len(self.removed)} derived images removed, {self.freed_bytes / 2**20:.1f} MiB "
                                   "freed"])


def prune_derived_images(client: docker.DockerClient | None = None, older_than_s: float = 0.0,
                         task: str | None = None) -> Pruned:
    """Remove the derived images made more than `older_than_s` seconds ago that no container (running or
    stopped) uses; with `task`, only that task's prepared images."""
    client = client or docker_client()
    own = {i["Id"]: i["Size"] - max(i.get("SharedSize", 0), 0) for i in client.df().get("Images") or []}
    pruned, now = Pruned(), time.time()
    filters = {"label": f"{LABEL}.task={task}"} if task else None
    for repository in DERIVED[:1] if task else DERIVED:  # only prepared images carry their task's label
        for image in client.images.list(name=repository, filters=filters):
            made = datetime.fromisoformat(image.attrs["Created"].replace("Z", "+00:00")).timestamp()
            if now - made < older_than_s:
                continue
            for tag in [t for t in image.tags if t.startswith(repository + ":")]:
                try:
                    client.images.remove(tag)
                except docker.errors.ImageNotFound:
                    continue  # removed meanwhile
                except docker.errors.APIError as exc:
                    if exc.status_code != 409:
                        raise
                    pruned.in_use.append(tag)  # a container was made from it
                    continue
                pruned.removed.append(tag)
                pruned.freed_bytes += own.get(image.id, 0)
    return pruned
