"""Sandbox containers left behind: each is labelled with the host and process that started it, so a
container whose process is gone (killed, out of memory) is found and removed before the next batch."""

from __future__ import annotations

import logging
import os
import socket
import time
from typing import Callable

import docker
import docker.errors

from sandbox.images import LABEL, docker_client

log = logging.getLogger(__name__)

REAP_TIMEOUT = 10  # seconds to wait for a Docker engine before running without reaping


def reap_orphans(progress: Callable[[str], None] = log.info) -> list[str]:
    """Remove sandbox containers whose process on this host is gone; nothing when no Docker engine answers."""
    try:
        client = docker.from_env(timeout=REAP_TIMEOUT)
        removed = reap(client)
        client.close()
    except (docker.errors.DockerException, OSError) as exc:  # no engine
        log.info("reaped no orphaned sandboxes: %s", exc)
        return []
    if removed:
        progress(f"removed {len(removed)} sandbox containers left by dead processes: {', '.join(removed)}")
    return removed


def reap(client: docker.DockerClient | None = None, max_age: float | None = None) -> list[str]:
    """Remove handhold containers whose process on this host is gone (or older than max_age s)."""
    client = client or docker_client()
    host, removed = socket.gethostname(), []
    # sparse: the list's own labels, no inspect per container, which failed the whole pass when another run
    # removed a container between the list and its inspect
    for container in client.containers.list(all=True, sparse=True, filters={"label": f"{LABEL}=sandbox"}):
        labels = container.attrs.get("Labels") or {}
        pid, started = int(labels.get(f"{LABEL}.pid", "0")), int(labels.get(f"{LABEL}.started", "0"))
        orphan = labels.get(f"{LABEL}.host") == host and not _alive(pid)
        expired = max_age is not None and time.time() - started > max_age
        if orphan or expired:
            try:
                container.remove(force=True)
            except docker.errors.NotFound:
                continue  # another run's reaper, or its own sandbox closing, removed it first
            removed.append(container.short_id)
    return removed


def _alive(pid: int) -> bool:
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
