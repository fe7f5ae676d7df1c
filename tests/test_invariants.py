"""The batch invariants: lost patches found in the messages, the whole reference replayed, rewards re-graded."""

from __future__ import annotations

import dataclasses
import json
from types import SimpleNamespace

from pipeline.guidance.expert import expert_actions
from pipeline.rollouts.invariants import final_test_run, lost_patches, regrade_sample, replay
from pipeline.tasks.flakiness import RewardMismatch
from pipeline.core.records import Task
from pipeline.rollouts.batch import RolloutConfig

RULES = RolloutConfig().grade_rules()

TASK = Task("t", "r", "base", "", "", "issue", ("pkg/tests/test_a.py::test_a",), ("pkg/tests/test_a.py::test_b",),
            "img", "/testbed", "python -m pytest -rA pkg/tests", "parse_log_pytest", "synth")


def bash(call_id: str, command: str, output: str) -> list[dict]:
    call = {"id": call_id, "type": "function", "function": {"name": "bash", "arguments": json.dumps({"command": command})}}
    return [{"role": "assistant", "content": "", "tool_calls": [call]},
            {"role": "tool", "tool_call_id": call_id, "content": output}]


def attempt(rollout_id: str, patch: str, *steps: list[dict]) -> SimpleNamespace:
    messages = [{"role": "user", "content": "fix it"}] + [m for step in steps for m in step]
    return SimpleNamespace(rollout_id=rollout_id, instance_id="t", patch=patch, messages=tuple(messages))


def test_final_test_run_is_the_last_test_run_to_its_summary():
    traj = attempt("r", "", bash("1", "python -m pytest -rA pkg/tests", "exit code: 1\n=== 1 failed, 1 passed in 0.2s ==="),
                   bash("2", "ls", "exit code: 0\npkg"),
                   bash("3", "cd /testbed && python -m pytest pkg/tests/test_a.py -q", "exit code: 0\n2 passed in 0.1s"),
                   bash("4", "ls", "exit code: 0\n"))
    assert final_test_run(traj, TASK) == ("cd /testbed && python -m pytest pkg/tests/test_a.py -q", True)
    later = attempt("r", "", *[bash(str(i), c, o) for i, (c, o) in enumerate([
        ("pytest pkg/tests/test_a.py::test_a", "exit code: 0\n1 passed in 0.1s"),
        ("pytest -x -q | tail", "exit code: 0\n1 failed, 9 passed in 0.3s")])])
    assert final_test_run(later, TASK) == ("pytest -x -q | tail", False)
    piped = attempt("r", "", bash("1", "python -m pytest -q pkg/tests/test_a.py | tail -n 5",
                                  "exit code: 0\nE NameError\n1 failed, 1 passed in 0.10s"))
    assert final_test_run(piped, TASK) == ("python -m pytest -q pkg/tests/test_a.py | tail -n 5", False)
    passing = bash("1", "python -m pytest -q | sed", "exit code: 0\n..\n2 passed\n")
    assert final_test_run(attempt("r", "", passing), TASK) == ("python -m pytest -q | sed", True)
    failing = bash("2", "python -m pytest -q | sed", "exit code: 1\nF.\n1 failed, 1 passed")
    assert final_test_run(attempt("r", "", passing, failing), TASK) == ("python -m pytest -q | sed", False)
    assert final_test_run(attempt("r", "", bash("1", "ls", "exit code: 0\n")), TASK) is None
    unfinished = attempt("r", "", bash("1", "python -m pytest pkg/tests", "exit code: 0\ncollecting ..."))
    assert final_test_run(unfinished, TASK) is None


def test_lost_patches_are_empty_patches_after_a_passing_run():
    passed = bash("1", "python -m pytest -rA pkg/tests", "exit code: 0\n===== 2 passed, 1 skipped in 0.31s =====")
    failed = bash("1", "python -m pytest -rA pkg/tests", "exit code: 1\n===== 1 failed, 1 passed in 0.31s =====")
    trajectories = [attempt("lost", "", passed), attempt("kept", "diff --git a/x b/x\n", passed),
                    attempt("failed", "", failed), attempt("silent", "")]
    assert lost_patches(trajectories, {"t": TASK}) == ["lost"]


def test_the_whole_reference_resolves_and_stored_rewards_reproduce(toolz_task):
    verdict = replay(toolz_task, expert_actions(toolz_task), rules=RULES)
    assert (verdict.resolved, verdict.reason) == (True, "resolved")
    empty_edit = [a for a in expert_actions(toolz_task) if a["args"].get("command") != "str_replace"]
    assert replay(toolz_task, empty_edit, rules=RULES).reason == "tests_failed"

    def stored(rid: str, patch: str, reward: float):
        return SimpleNamespace(rollout_id=rid, instance_id=toolz_task.instance_id, patch=patch, reward=reward,
                               resolved=reward == 1.0, infra_error="")

    tasks = {toolz_task.instance_id: toolz_task}
    report = regrade_sample([stored("gold", toolz_task.patch, 1.0), stored("wrong", "", 1.0)], tasks, sample=2, rules=RULES)
    assert report.checked == ["gold", "wrong"] and report.infra == []
    assert report.mismatches == [RewardMismatch("wrong", 1.0, 0.0, "tests_failed")]
    assert dataclasses.is_dataclass(report)


def test_probes_holding_the_reference_edit_must_resolve():
    from pipeline.rollouts.invariants import edit_prefix_failures, last_edit
    from pipeline.core.records import Action

    actions = tuple(Action.of(a) for a in [
        {"name": "bash", "args": {"command": "grep -rn x ."}},
        {"name": "edit", "args": {"command": "view", "path": "a.py"}},
        {"name": "edit", "args": {"command": "str_replace", "path": "a.py", "old_str": "a", "new_str": "b"}},
        {"name": "bash", "args": {"command": "pytest"}}, {"name": "submit", "args": {}}])
    assert last_edit(actions) == 3

    def probe(k: int, resolved: bool, infra: str = "") -> SimpleNamespace:
        return SimpleNamespace(instance_id="t", guidance_actions=actions, guidance_k=k, sample_index=0,
                               resolved=resolved, infra_error=infra)

    probes = [probe(2, False), probe(3, True), probe(4, False), probe(5, False, "sandbox: gone")]
    assert edit_prefix_failures(probes) == (2, ["t k=4 #0"])
