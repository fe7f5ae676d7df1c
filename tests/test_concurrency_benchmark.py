"""benchmarks/concurrency.py's code path, small: W=4 attempts at once against its scripted loopback server
(0.1 s a turn, the expert script padded to 12 turns), so the benchmark cannot rot. The figures themselves are the benchmark's to print
(docs/benchmarks.md), never asserted here; what is asserted is that every attempt ran the real rollout path
to a resolved grade, and that the meters read something."""

from __future__ import annotations

import gc
import os
import threading

import pytest

from benchmarks.concurrency import (exploring, holds, measure, padded_actions, prompt_key, scripts, steady_rate,
                                    timed)
from pipeline.agent.loop import AgentConfig, unguided_prompt
from pipeline.agent.tools import execute
from pipeline.guidance.expert import expert_actions
from pipeline.rollouts.sandbox_pool import batch_order
from pipeline.verifier.environment import task_sandbox
from sandbox.docker_sandbox import DockerSandbox


def test_scripts_are_keyed_by_the_prompt_the_policy_sends(synth_run):
    tasks = synth_run[0]
    table = scripts(tasks, AgentConfig(), 20)
    assert len(table) == len(tasks)  # distinct prompts: the server tells the tasks apart
    for task in tasks:
        key = prompt_key(unguided_prompt(task, AgentConfig())[1]["content"])
        assert table[key] == padded_actions(task, 20)
        assert table[key][-1]["name"] == "submit"


def test_a_padded_script_has_the_turns_asked_and_the_same_fix(synth_run):
    """Padding goes between locating the file and viewing the edit site: the script starts as the expert's,
    ends with its view, edit, test run and submit, and everything between is a read-only call."""
    for task in synth_run[0]:
        expert = expert_actions(task)
        assert padded_actions(task, 0) == padded_actions(task, len(expert)) == padded_actions(task, 3) == expert
        edit = next(i for i, a in enumerate(expert) if a["name"] == "edit")
        for turns in (len(expert) + 1, 20, 60):
            padded = padded_actions(task, turns)
            assert len(padded) == turns
            assert padded[:edit] == expert[:edit] and padded[turns - len(expert) + edit:] == expert[edit:]
            for action in padded[edit:turns - len(expert) + edit]:
                assert action in exploring(task)
                assert action["name"] == "bash" or action["args"]["command"] == "view", action


@pytest.mark.docker
def test_the_padding_calls_run_cleanly_and_change_nothing(synth_run):
    """Each exploring call of a task runs without a tool error and exits 0 in the task's own sandbox, and the
    repository has no diff after them: the padded attempt still edits, and is graded on, the gold fix alone."""
    task = synth_run[0][0]
    with task_sandbox(task) as sandbox:
        for action in exploring(task):
            result = execute(sandbox, action["name"], action["args"])
            assert not result.error, (action, result.output)
            assert action["name"] == "edit" or result.output.startswith("exit code: 0\n"), (action, result.output)
        assert sandbox.diff() == ""


def test_the_pool_expects_requests_in_the_order_a_batch_makes_them():
    """W workers take the first W jobs' agent sandboxes at once; then each worker's grade and its next job's agent
    alternate. Each job's request comes exactly twice (its agent's and its grade's)."""
    assert batch_order(["j0", "j1", "j2", "j3", "j4"], 2) == ["j0", "j1", "j0", "j2", "j1", "j3", "j2", "j4", "j3",
                                                               "j4"]
    assert batch_order(["j0", "j1"], 8) == ["j0", "j1", "j0", "j1"]
    assert batch_order(["j0", "j1", "j2"], 1) == ["j0", "j0", "j1", "j1", "j2", "j2"]  # one worker: job order
    assert batch_order([], 4) == []


@pytest.mark.docker
def test_four_attempts_at_once_all_resolve_and_leave_nothing(synth_run):
    lines: list[str] = []
    rows = measure(synth_run[0], [4], delay=0.1, rounds=3, report=lines.append, turns=12)
    (row,) = rows
    assert row["width"] == 4 and row["attempts"] == 12
    assert row["turns"] == 12 and "12 turns" in lines[0]  # every attempt went through the padded script
    assert (row["infra"], row["lost"], row["left"]) == (0, 0, 0), lines
    assert row["per_minute"] > 0 and row["ideal"] > 0 and row["steady"] > 0
    assert row["warm"] + row["cold"] == 24  # one agent and one grading sandbox per attempt, through the pool
    assert len(lines) == 2  # the work line of the one repository, then the row
    assert row["process_cpu"] > 0 and row["start_p50"] > 0 and row["threads_peak"] >= 4


@pytest.mark.docker
def test_a_closed_sandbox_holds_no_file_descriptor(base_image):
    """A sandbox's own Docker client is closed with it: its pooled connections (~8 descriptors a sandbox) were left to
    the garbage collector, and at 32 attempts at once the benchmark's process held 1,153, past the usual soft limit."""
    DockerSandbox(base_image, workdir="/tmp").close()  # the image and its user probed: later ones make no more
    gc.collect()
    gc.disable()  # what is released must be released by close(), not by a collection
    try:
        before = len(os.listdir("/proc/self/fd"))
        sandboxes = [DockerSandbox(base_image, workdir="/tmp") for _ in range(3)]
        for sandbox in sandboxes:
            assert sandbox.run("true").exit_code == 0
        assert len(os.listdir("/proc/self/fd")) > before
        held = len(os.listdir("/proc/self/fd")) - before
        for sandbox in sandboxes:
            sandbox.close()
        # Left until a collection: each session's exec socket, whose file object docker-py keeps (one a sandbox)
        assert len(os.listdir("/proc/self/fd")) - before <= len(sandboxes) < held
    finally:
        gc.enable()
    gc.collect()
    assert len(os.listdir("/proc/self/fd")) == before


def test_the_steady_rate_is_the_workers_over_the_time_a_middle_attempt_holds_one():
    # four workers, 45 s a middle attempt: 5.33 a minute; the first wave (started first) and the last are left out
    spans = [(0.0, 60.0), (0.1, 60.0), (0.2, 60.0), (0.3, 60.0), (60, 40.0), (60.1, 50.0),
             (100, 30.0), (101, 30.0), (102, 30.0), (103, 30.0)]
    assert steady_rate(spans, 4) == 4 / 45.0 * 60
    assert steady_rate([(0.0, 40.0), (0.1, 50.0)], 4) == 4 / 45.0 * 60  # no middle: every attempt
    assert steady_rate([], 4) is None


def test_timed_counts_each_call_and_puts_the_function_back():
    import types
    module, seconds = types.SimpleNamespace(f=lambda x: x + 1), []
    original = module.f
    with timed(module, "f", seconds):
        assert module.f(1) == 2 and module.f(2) == 3
    assert len(seconds) == 2 and module.f is original
    assert all(start > 0 and took >= 0 and thread == threading.get_ident() for start, took, thread in seconds)


def test_a_hold_lasts_until_its_workers_next_attempt_starts():
    # worker 1 waited 2 s after its first attempt (its grades behind) and 13 s after its second; a last attempt
    # holds its worker for its own length
    calls = [(12.0, 5.0, 1), (0.0, 10.0, 1), (0.5, 3.0, 2), (30.0, 4.0, 1)]
    assert holds(calls) == [(0.0, 12.0), (0.5, 3.0), (12.0, 18.0), (30.0, 4.0)]
    assert holds([]) == []
