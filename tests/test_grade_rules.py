"""The re-grade behind `rewards_reproduce` follows the run's grade rules: timeout and sandbox limits."""

from __future__ import annotations

import contextlib
import dataclasses
from types import SimpleNamespace

from pipeline.rollouts.batch import RolloutConfig
from pipeline.rollouts.invariants import regrade_sample
from pipeline.verifier.environment import LocalTaskSandboxes
from pipeline.verifier.grading import grade
from sandbox.base import SandboxSpec
from tests.test_batch_local import GOLD, calc_task, slow_repo


def stored(task, patch: str, reward: float):
    return SimpleNamespace(rollout_id="r", instance_id=task.instance_id, patch=patch, reward=reward,
                           resolved=reward == 1.0, infra_error="")


def test_a_regrade_is_made_under_the_rules_the_grade_was(tmp_path):
    repo = slow_repo(tmp_path / "calc", 3)
    local, seen = LocalTaskSandboxes({"local/calc": str(repo)}), []

    @contextlib.contextmanager
    def sandboxes(task, spec):
        seen.append(spec)
        with local(task, spec) as sandbox:
            yield sandbox

    task, default = calc_task(), RolloutConfig().grade_rules()
    tight = dataclasses.replace(RolloutConfig(test_timeout=1.0, sandbox=SandboxSpec(memory="1g", pids=64)).grade_rules())
    first = grade(task, GOLD, tight, sandboxes=sandboxes)
    assert first.reason == "tests_timed_out" and first.reward == 0.0 and seen == [tight.sandbox]
    report = regrade_sample([stored(task, GOLD, first.reward)], {task.instance_id: task}, tight, sandboxes=sandboxes)
    assert report.checked == ["r"] and report.mismatches == []  # the same rules: the stored reward reproduces
    assert seen[-1] == SandboxSpec(memory="1g", pids=64)  # the re-grade's sandbox has the run's limits
    other = regrade_sample([stored(task, GOLD, first.reward)], {task.instance_id: task}, default, sandboxes=sandboxes)
    assert [m.reason for m in other.mismatches] == ["resolved"]  # other rules, another verdict
    assert seen[-1] == SandboxSpec()


def test_synthesized_tasks_are_cached_per_rules_and_the_defaults_keep_earlier_caches(tmp_path):
    from pipeline.synthesis.packages import PackageSpec
    from pipeline.synthesis.synth_config import SynthConfig
    from pipeline.synthesis.task_cache import cache_file
    from pipeline.verifier.rules import GradeRules

    spec, config = PackageSpec("toolz", "1.0.0"), SynthConfig()
    earlier = cache_file(spec, "img", config, tmp_path, None, None)  # as called before rules joined the key
    assert cache_file(spec, "img", config, tmp_path, None, None, RolloutConfig().grade_rules()) == earlier
    tight = RolloutConfig(test_timeout=20, sandbox=SandboxSpec(memory="1g")).grade_rules()
    assert cache_file(spec, "img", config, tmp_path, None, None, tight) != earlier
    assert GradeRules() == RolloutConfig().grade_rules()  # the settings' defaults are the rules' own
