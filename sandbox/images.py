"""The sandbox base image: pulled where a registry answers, else built from Debian packages."""

from __future__ import annotations

import fcntl
import logging
import os
import re
import shutil
import subprocess
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

import docker
import docker.errors

from sandbox.base import SandboxError

log = logging.getLogger(__name__)

BASE_IMAGE_TAG = "handhold/base:bookworm-py3"
SANDBOX_USER = "agent"  # non-root user every handhold image carries (uid 1000)
LABEL = "org.handhold"  # label key on every image and container handhold makes


@dataclass(frozen=True)
class BaseImageConfig:
    pull_candidates: tuple[str, ...] = ("python:3.11-slim",)
    """Images tried first; the first one present or pullable is used as the base."""
    tag: str = BASE_IMAGE_TAG
    """Tag given to the base image (built or derived from a pulled one)."""
    suite: str = "bookworm"
    """Debian suite for mmdebstrap (or debootstrap) when nothing can be pulled (bookworm ships Python 3.11)."""
    mirror: str = "http://deb.debian.org/debian"
    """Debian mirror the root filesystem is downloaded from."""
    packages: tuple[str, ...] = field(
        default=("python3", "python3-venv", "python3-pip", "git", "procps", "patch", "ca-certificates")
    )
    """Debian packages installed in a base built from Debian packages."""


def docker_client() -> docker.DockerClient:
    """A client for the engine DOCKER_HOST names (or the local socket), with a clear error."""
    try:
        client = docker.from_env(timeout=300)
        client.ping()
    except Exception as exc:  # the SDK raises several kinds; all mean "no engine"
        raise SandboxError(
            f"No Docker engine answers ({exc}). Start one (`make docker` does it on Debian as root) "
            "or set DOCKER_HOST to a running engine."
        ) from exc
    return client


def image_exists(client: docker.DockerClient, tag: str) -> bool:
    try:
        client.images.get(tag)
        return True
    except docker.errors.ImageNotFound:
        return False


def ensure_base_image(config: BaseImageConfig | None = None, client: docker.DockerClient | None = None) -> str:
    """Return the base image tag, building it once if it is missing; idempotent."""
    config = config or BaseImageConfig()
    client = client or docker_client()
    if image_exists(client, config.tag):
        return config.tag
    # One build at a time per user on this machine: a second caller (another `handhold` command, the suite's
    # other worker) waits for the first one's build and finds the image made.
    name = re.sub(r"[^A-Za-z0-9.-]+", "-", config.tag)
    lock = Path(tempfile.gettempdir()) / f"handhold-{os.getuid()}-{name}.lock"
    with open(lock, "a") as held:
        fcntl.flock(held, fcntl.LOCK_EX)  # released when the file closes, or when the process dies
        if not image_exists(client, config.tag):
            _build_base_image(client, config)
    return config.tag


def _build_base_image(client: docker.DockerClient, config: BaseImageConfig) -> None:
    for candidate in config.pull_candidates:
        pulled = _present_or_pulled(client, candidate)
        if pulled:
            log.info("deriving %s from %s", config.tag, candidate)
            _add_user_layer(client, candidate, config.tag, venv_python="python3", install_tools=True)
            return
    log.info("no base image could be pulled; building %s from Debian packages", config.tag)
    _bootstrap_image(client, config)


def _present_or_pulled(client: docker.DockerClient, name: str) -> bool:
    if image_exists(client, name):
        return True
    try:
        client.images.pull(name)
        return True
    except docker.errors.APIError as exc:
        log.info("cannot pull %s: %s", name, exc.explanation or exc)
        return False


def _add_user_layer(client: docker.DockerClient, source: str, tag: str, venv_python: str,
                    install_tools: bool = False) -> None:
    """Add the sandbox user and a writable /opt/venv to an image (and git, patch, procps to a pulled one)."""
    tools = ("RUN command -v git >/dev/null && command -v patch >/dev/null && command -v pkill >/dev/null || "
             "(apt-get update && apt-get install -y --no-install-recommends git patch procps "
             "&& rm -rf /var/lib/apt/lists/*)\n") if install_tools else ""
    dockerfile = f"""
FROM {source}
{tools}RUN (id -u {SANDBOX_USER} >/dev/null 2>&1 || useradd -m -u 1000 -s /bin/bash {SANDBOX_USER}) \\
 && {venv_python} -m venv /opt/venv && chown -R {SANDBOX_USER} /opt/venv
ENV PATH=/opt/venv/bin:$PATH PYTHONDONTWRITEBYTECODE=1 PIP_NO_INDEX=1 PIP_DISABLE_PIP_VERSION_CHECK=1
LABEL {LABEL}=base
"""
    build_from_dockerfile(client, dockerfile, tag, files={}, network=install_tools)


def build_from_dockerfile(
    client: docker.DockerClient, dockerfile: str, tag: str, files: dict[str, str], network: bool = False
) -> None:
    """Build an image from a Dockerfile text and a context of host paths (name in context -> path)."""
    with tempfile.TemporaryDirectory(prefix="handhold-ctx-") as ctx:
        with open(os.path.join(ctx, "Dockerfile"), "w") as f:
            f.write(dockerfile)
        for name, path in files.items():
            dest = os.path.join(ctx, name)
            if os.path.isdir(path):
                shutil.copytree(path, dest, symlinks=True)
            else:
                shutil.copy2(path, dest)
        try:
            client.images.build(path=ctx, tag=tag, rm=True, forcerm=True,
                                network_mode="default" if network else "none")
        except docker.errors.BuildError as exc:
            tail = "".join(str(c.get("stream", c.get("error", ""))) for c in exc.build_log)[-3000:]
            raise RuntimeError(f"building image {tag} failed: {exc.msg}\n{tail}") from exc


def _bootstrap_image(client: docker.DockerClient, config: BaseImageConfig) -> None:
    """Build the Debian root filesystem with mmdebstrap (one apt download, dpkg in one go: 41-55 s on a 2-core
    machine) or, where only it is installed, debootstrap (~78 s), and import it with the sandbox user added."""
    include = f"--include={','.join(config.packages)}"
    raw_tag = config.tag + "-rootfs"
    repository, tag = raw_tag.rsplit(":", 1)
    with tempfile.TemporaryDirectory(prefix="handhold-rootfs-") as work:
        tar = os.path.join(work, "rootfs.tar")
        if shutil.which("mmdebstrap"):  # writes the tarball itself, apt's lists and downloads left out
            subprocess.run(["mmdebstrap", "--quiet", "--variant=minbase", include, config.suite, tar, config.mirror],
                           check=True, stdout=subprocess.DEVNULL)
        elif shutil.which("debootstrap"):
            root = os.path.join(work, "root")
            subprocess.run(["debootstrap", "--variant=minbase", include, config.suite, root, config.mirror],
                           check=True, stdout=subprocess.DEVNULL)
            for cache in ("var/cache/apt/archives", "var/lib/apt/lists"):
                shutil.rmtree(os.path.join(root, cache), ignore_errors=True)
            subprocess.run(["tar", "-C", root, "-cf", tar, "."], check=True)
        else:
            raise RuntimeError(
                "No base image can be pulled and neither mmdebstrap nor debootstrap is installed: install one "
                f"(`apt-get install mmdebstrap`) or make one of {', '.join(config.pull_candidates)} available "
                "to the engine."
            )
        client.api.import_image_from_file(tar, repository=repository, tag=tag)
    _add_user_layer(client, raw_tag, config.tag, venv_python="python3")


def main() -> None:
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    print(ensure_base_image())


if __name__ == "__main__":
    main()
