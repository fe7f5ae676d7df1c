"""Sandboxes: a work tree and a persistent shell, in a Docker container or a temp dir."""

from sandbox.base import CommandResult, Sandbox, SandboxError
from sandbox.docker_sandbox import DockerSandbox, DockerSandboxConfig, reap
from sandbox.local_sandbox import LocalSandbox

__all__ = ["CommandResult", "Sandbox", "SandboxError", "DockerSandbox", "DockerSandboxConfig", "LocalSandbox", "reap"]
