"""Sandboxes: a work tree and a persistent shell, in a Docker container or a temp dir."""

from sandbox.base import CommandResult, Sandbox, SandboxError, SandboxSpec
from sandbox.docker_sandbox import DockerSandbox
from sandbox.local_sandbox import LocalSandbox
from sandbox.reaper import reap

__all__ = ["CommandResult", "Sandbox", "SandboxError", "SandboxSpec", "DockerSandbox", "LocalSandbox", "reap"]
