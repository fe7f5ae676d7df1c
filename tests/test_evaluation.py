"""pass@1 over held-out tasks, its interval over tasks, the greedy-sampling rule and model identities, against
values worked out by hand."""

from __future__ import annotations

import dataclasses
import hashlib
import json

import pytest

from pipeline.rollouts.costs import CostConfig
from pipeline.datasets.splits import split_group, task_split
from training.evaluation import (INTERVAL, check_sampling, evaluation_cost, evaluation_rollouts, model_identity,
                                 pass_at_1, per_task_table, results_table, score, t_quantile, task_batch,
                                 trained_tasks, wilson_interval)
from pipeline.rollouts.batch import RolloutConfig
from tests.test_datasets_build import traj
from tests.test_splits import synth_tasks
from training.config import EvaluationConfig


@pytest.fixture(scope="module")
def tasks(tmp_path_factory):
    return synth_tasks(tmp_path_factory.mktemp("calc"))[:5]


def attempts(task, resolved: int, failed: int, infra: int = 0) -> list:
    """`resolved` resolved, `failed` unresolved and `infra` infrastructure-error attempts at `task`."""
    iid, out = task.instance_id, []
    for i, (reward, error) in enumerate([(1.0, "")] * resolved + [(0.0, "")] * failed + [(0.0, "sandbox")] * infra):
        out.append(traj(f"{iid}-{i}", iid=iid, reward=reward, sample=i, infra_error=error))
    return out


@pytest.mark.parametrize("df,t", [(1, 12.7062), (2, 4.3027), (3, 3.1824), (4, 2.7764), (5, 2.5706), (7, 2.3646),
                                  (9, 2.2622), (10, 2.2281), (29, 2.0452), (30, 2.0423)])  # the printed t table
def test_t_quantile_matches_the_table(df, t):
    assert round(t_quantile(0.95, df), 4) == t


def test_three_tasks_of_four_attempts(tasks):
    # 2/4, 0/4, 4/4: scores 0.5, 0, 1 -> mean 0.5; s = 0.5, s/sqrt(3) = 0.2887, t(2) = 4.3027: 0.5 +- 1.242,
    # clipped to [0, 1]. (Wilson over 12 attempts would say [0.254, 0.746].)
    trajectories = attempts(tasks[0], 2, 2) + attempts(tasks[1], 0, 4) + attempts(tasks[2], 4, 0)
    result = score(tasks[:3], trajectories)
    assert (result["pass@1"], result["ci95_low"], result["ci95_high"]) == (0.5, 0.0, 1.0)
    assert (result["tasks"], result["tasks_scored"], result["attempts"], result["graded"], result["resolved"],
            result["infra_errors"], result["interval"]) == (3, 3, 12, 12, 6, 0, INTERVAL)
    # each task's own Wilson interval over its 4 attempts: 2/4 -> 0.5 +- 1.96 sqrt(1/16 + 3.8415/64) / 1.9604
    assert [(t["score"], t["ci95_low"], t["ci95_high"]) for t in result["per_task"]] == [
        (0.5, 0.15, 0.85), (0.0, 0.0, 0.4899), (1.0, 0.5101, 1.0)]


def test_pass_at_1_is_the_mean_of_task_scores_and_the_interval_is_over_tasks(tasks):
    # Scores 1/4, 1/2, 3/4, 2/2 (2 infra errors), 1/4: mean 2.75 / 5 = 0.55 (pooled attempts would say
    # 8/16 = 0.5). Deviations -0.3, -0.05, 0.2, 0.45, -0.3: s^2 = 0.425 / 4 = 0.10625, s / sqrt(5) = 0.14577;
    # t(4) = 2.77645: half-width 0.40474 -> [0.1453, 0.9547]. (z instead of t: [0.2643, 0.8357]; n instead of
    # n - 1: [0.1880, 0.9120]; Wilson over 16 attempts: [0.2799, 0.7201].)
    trajectories = (attempts(tasks[0], 1, 3) + attempts(tasks[1], 1, 1) + attempts(tasks[2], 3, 1)
                    + attempts(tasks[3], 2, 0, infra=2) + attempts(tasks[4], 1, 3))
    result = score(tasks, trajectories)
    assert (result["pass@1"], result["ci95_low"], result["ci95_high"]) == (0.55, 0.1453, 0.9547)
    assert (result["attempts"], result["graded"], result["resolved"], result["infra_errors"]) == (18, 16, 8, 2)
    assert [(t["attempts"], t["graded"], t["resolved"]) for t in result["per_task"]] == [
        (4, 4, 1), (2, 2, 1), (4, 4, 3), (4, 2, 2), (4, 4, 1)]


def test_a_task_with_no_graded_attempt_is_left_out_and_counted(tasks):
    # 1/3 and 0/2 scored; the third lost every attempt to infrastructure: mean 1/6 over 2 tasks, clipped to [0, 1]
    trajectories = attempts(tasks[0], 1, 2) + attempts(tasks[1], 0, 2) + attempts(tasks[2], 0, 0, infra=2)
    result = score(tasks[:3], trajectories)
    assert (result["pass@1"], result["tasks"], result["tasks_scored"], result["infra_errors"]) == (0.1667, 3, 2, 2)
    assert result["per_task"][0]["score"] == 0.3333
    assert result["per_task"][2] == {"instance_id": tasks[2].instance_id, "attempts": 2, "graded": 0, "resolved": 0,
                                     "score": None, "ci95_low": 0.0, "ci95_high": 1.0}


@pytest.mark.parametrize("scores,expected", [
    ([], (None, 0.0, 1.0)),  # nothing scored
    ([0.25], (0.25, 0.0, 1.0)),  # one task: no spread to measure
    ([0.5, 0.5, 0.5], (0.5, 0.5, 0.5)),  # no spread: zero width
    ([0.0, 1.0], (0.5, 0.0, 1.0)),  # 0.5 +- 12.706 * 0.5: clipped
    ([0.5, 0.5625], (0.53125, 0.1342, 0.9283)),  # s / sqrt(2) = 0.03125, t(1) = 12.7062: +- 0.39707
    ([0.5, 0.25, 0.75, 0.5, 0.5], (0.5, 0.2805, 0.7195)),  # s^2 = 0.125 / 4, se 0.0791, t(4) 2.7764
])
def test_pass_at_1_edge_cases(scores, expected):
    mean, low, high = pass_at_1(scores)
    assert (mean, round(low, 4), round(high, 4)) == expected


def test_wilson_interval_by_hand():
    assert wilson_interval(0, 0) == (0.0, 1.0)
    assert tuple(round(x, 4) for x in wilson_interval(5, 10)) == (0.2366, 0.7634)
    assert tuple(round(x, 4) for x in wilson_interval(0, 5)) == (0.0, 0.4345)


@pytest.mark.parametrize("temperature,n,refused", [(0.0, 2, True), (0.0, 1, False), (0.7, 4, False)])
def test_several_greedy_attempts_are_refused(temperature, n, refused):
    config = EvaluationConfig(temperature=temperature, attempts=n)
    if refused:
        with pytest.raises(ValueError, match=f"training.evaluation.attempts is {n} with temperature 0"):
            evaluation_rollouts(RolloutConfig(), config)
        return
    check_sampling(config)
    rollout = evaluation_rollouts(RolloutConfig(), dataclasses.replace(config, max_steps=7))
    assert (rollout.attempts, rollout.agent.max_steps) == (n, 7)


def test_a_local_model_is_named_by_its_weights_hash(tmp_path):
    model = tmp_path / "ckpt"
    model.mkdir()
    (model / "model.safetensors").write_bytes(b"weights")
    (model / "tokenizer.json").write_text("{}")  # not a weight file: not in the hash
    expected = "sha256:" + hashlib.sha256(b"model.safetensors\0weights").hexdigest()
    assert model_identity(str(model)) == {"model": str(model), "revision": expected}
    (model / "model.safetensors").write_bytes(b"weightz")
    assert model_identity(str(model))["revision"] == "sha256:" + hashlib.sha256(b"model.safetensors\0weightz").hexdigest()
    (model / "adapter_config.json").write_text(json.dumps({"base_model_name_or_path": "org/base"}))
    assert model_identity(str(model))["base_model"] == "org/base"
    (model / "adapter_config.json").write_text("{}")
    assert model_identity(str(model))["base_model"] == ""
    snapshot = tmp_path / "hub/models--org--m/snapshots" / ("ab" * 20)
    snapshot.mkdir(parents=True)
    (snapshot / "model.safetensors").write_bytes(b"w")
    assert model_identity(str(snapshot))["revision"] == "ab" * 20
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(ValueError, match=f"model folder {empty} holds no weight files"):
        model_identity(str(empty))
    assert model_identity("no-such-org/no-such-model") == {"model": "no-such-org/no-such-model", "revision": ""}


def test_the_task_batch_and_the_tables(tasks):
    ids = [t.instance_id for t in tasks[:2]]
    assert task_batch(tasks[:2]) == {"instance_ids": ids,
                                     "sha256": hashlib.sha256(f"{ids[0]}\n{ids[1]}".encode()).hexdigest()}
    results = [{"model": m, "identity": {"model": m, "revision": r}, **score(tasks[:2], a),
                **evaluation_cost(tasks[:2], a, CostConfig())} for m, r, a in [
        ("starting", "", attempts(tasks[0], 0, 2) + attempts(tasks[1], 1, 1)),
        ("dpo", "sha256:" + "0" * 64, attempts(tasks[0], 2, 0) + attempts(tasks[1], 1, 1))]]
    results[1]["trained"] = score(tasks[2:3], attempts(tasks[2], 1, 0))  # the memorization check's column
    assert results_table(results).splitlines()[2:] == [
        "| starting | unknown | 2 | 4 | 1 | 0.25 | 0.0 | 1.0 | 0 | 0.0 | 2.0 | 0.0 | 0 | None |",  # 1 s grading each
        "| dpo | sha256:000000000000 | 2 | 4 | 3 | 0.75 | 0.0 | 1.0 | 0 | 0.0 | 2.0 | 0.0 | 1 | 1.0 |"]
    assert per_task_table(results).splitlines() == [
        "| task | starting | dpo |", "|---|---|---|",
        f"| {ids[0]} | 0/2 [0.00, 0.66] | 2/2 [0.34, 1.00] |",
        f"| {ids[1]} | 1/2 [0.09, 0.91] | 1/2 [0.09, 0.91] |"]


@pytest.mark.parametrize("fraction", [0.0, 0.5])
def test_the_memorization_sample_is_trained_on_tasks_of_the_train_split_in_order(tasks, fraction):
    trained_on = {t.instance_id for t in tasks[1:]}  # the first task has no success in the sft rows
    expected = [t for t in tasks[1:] if task_split(split_group(t), fraction) == "train"][:3]
    assert trained_tasks(tasks, fraction, trained_on, 3) == expected
    assert trained_tasks(tasks, fraction, trained_on, 0) == [] == trained_tasks(tasks, fraction, set(), 2)
    assert trained_tasks(tasks, 1.0, trained_on, 2) == []  # every task held out: none was trained on
