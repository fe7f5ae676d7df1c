"""A sandbox whose container died (`docker kill`, an OOM of its init) is given up at once, not retried for half a
minute, and its attempt is stored as an infrastructure fault. Against a real Docker engine."""

from __future__ import annotations

import contextlib
import json
import threading
import time

import pytest

from pipeline.agent.loop import AgentConfig
from pipeline.agent.policy import AssistantTurn, Usage
from pipeline.rollouts.batch import INFRA_EXITS, RolloutConfig, plan_jobs, run_job
from sandbox import DockerSandbox
from sandbox.base import SandboxError
from tests.test_batch_local import calc_task

GIVE_UP = 2.0  # seconds from the kill to the SandboxError: the bound (it was 27 s of retries)


class Killer:
    """Kills a container `after` seconds from now, noting when it began to (the bound is measured from there)."""

    def __init__(self, container, after: float = 1.0):
        self.container, self.at = container, None
        threading.Timer(after, self._kill).start()

    def _kill(self) -> None:
        self.at = time.monotonic()
        self.container.kill()


def test_a_container_killed_mid_command_is_given_up_at_once(base_image):
    with DockerSandbox(base_image, workdir="/tmp") as sandbox:
        killer = Killer(sandbox.container)
        with pytest.raises(SandboxError, match=r"container \w+ is exited.*; the sandbox is gone"):
            sandbox.run("sleep 30")
        assert killer.at is not None and time.monotonic() - killer.at < GIVE_UP
        # Every later call fails as fast, without asking the engine again: the diff after a lost attempt too.
        started = time.monotonic()
        for call in (lambda: sandbox.run("true"), sandbox.diff, lambda: sandbox.run_privileged("true", 10)):
            with pytest.raises(SandboxError, match="the sandbox is gone"):
                call()
        assert time.monotonic() - started < 0.1


class SleepsWhileItsContainerIsKilled:
    """A policy that asks for `sleep 30` and kills the container it runs in a second into it."""

    name, native_tools = "sleeper", True

    def __init__(self, sandboxes: "Recorded"):
        self.sandboxes, self.killer = sandboxes, None

    def settings(self) -> dict:
        return {"kind": "scripted"}

    def act(self, messages, tools, *, seed=None) -> AssistantTurn:
        self.killer = Killer(self.sandboxes.sandbox.container)
        call = {"id": "call_1", "type": "function", "function": {"name": "bash",
                                                                 "arguments": json.dumps({"command": "sleep 30"})}}
        return AssistantTurn({"role": "assistant", "content": None, "tool_calls": [call]}, Usage(10, 2))


class Recorded:
    """A SandboxFactory of plain DockerSandboxes of the base image that keeps the one it made last."""

    def __init__(self, image: str):
        self.image, self.sandbox = image, None

    @contextlib.contextmanager
    def __call__(self, task, config=None):
        with DockerSandbox(self.image, workdir="/tmp", config=config) as self.sandbox:
            yield self.sandbox


def test_an_attempt_whose_container_dies_is_stored_as_an_infra_fault(base_image):
    sandboxes = Recorded(base_image)
    policy = SleepsWhileItsContainerIsKilled(sandboxes)
    config = RolloutConfig(attempts=1, workers=1, infra_retries=0, agent=AgentConfig(max_steps=5))
    (job,) = plan_jobs([calc_task()], policy, config, "dead")
    traj = run_job(job, policy, config, "dead", sandboxes=sandboxes)
    assert policy.killer.at is not None and time.monotonic() - policy.killer.at < GIVE_UP  # the worker is free again
    assert traj.exit_status == "sandbox_error" and traj.exit_status in INFRA_EXITS
    assert traj.infra_error.startswith("sandbox_error: container ") and "is exited" in traj.infra_error
    assert (traj.reward, traj.resolved, traj.grade_reason, traj.patch) == (0.0, False, "", "")  # never graded


@pytest.mark.docker
def test_a_live_shell_survives_the_http_responses_that_started_it(base_image):
    """docker-py's exec socket stayed owned by its HTTP response, held in a reference cycle: when the garbage
    collector (or anything else) closed that response, it closed the live shell's socket ("shell lost ([Errno 9]
    Bad file descriptor)", seen at 32 attempts at once). The shell's socket is now its own."""
    import gc

    import urllib3

    with DockerSandbox(base_image, workdir="/tmp") as sandbox:
        assert sandbox.run("echo one").output.strip() == "one"
        responses = [o for o in gc.get_objects() if isinstance(o, urllib3.response.HTTPResponse)]
        for response in responses:
            response.close()  # what collecting them does
        del responses
        result = sandbox.run("echo two")
        assert (result.output.strip(), result.shell_restarted) == ("two", False)
        assert sandbox.run_privileged("echo three", timeout=30).output.strip() == "three"  # an exec of its own too
