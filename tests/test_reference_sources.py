"""Where action guidance's reference trajectories come from: a stored success of the task in another batch before
the action file and the gold-patch script, the script capped by a setting, and the per-source table."""

from __future__ import annotations

import json

import polars as pl
import pytest

from pipeline.agent.policy import AssistantTurn, Usage
from pipeline.datasets.card import CardInfo, render_card
from pipeline.datasets.export import split_tables
from pipeline.guidance.actions import Reference, reference_actions
from pipeline.guidance.reference_sources import capped_references, plan_frame, source_table, stored_references
from pipeline.core.layout import Layout
from pipeline.core.records import GuidancePlan
from pipeline.rollouts.rescue import GuidanceConfig, action_plans
from pipeline.rollouts.batch import plan_jobs, run_batch
from tests.test_batch_local import BUG, CONFIG, FIX, PLAN, HintFollower, calc_task, sandboxes  # noqa: F401

EDIT = {"command": "str_replace", "path": "calc.py", "old_str": BUG, "new_str": FIX}


class Wanderer(HintFollower):
    """Lists the files, fixes add(), submits: resolves every calc task unguided, in three tool calls."""

    name = "wanderer"

    def act(self, messages, tools, *, seed=None) -> AssistantTurn:
        script = [("bash", {"command": "ls"}), ("edit", EDIT), ("submit", {})]
        name, args = script[sum(m["role"] == "assistant" for m in messages)]
        call = {"id": f"call_{len(messages)}", "type": "function",
                "function": {"name": name, "arguments": json.dumps(args)}}
        return AssistantTurn({"role": "assistant", "content": None, "tool_calls": [call]}, Usage(10, 2))


def stored(layout, origin, batch, policy, tasks, guidance=None, sandboxes=None):
    """Run and store a batch's attempts where the pipeline keeps them; the trajectories."""
    jobs = plan_jobs(tasks, policy, CONFIG, batch, guidance)
    return run_batch(jobs, policy, CONFIG, layout.trajectories(origin, batch), batch, sandboxes=sandboxes).trajectories


def test_a_success_in_another_batch_is_the_reference_before_the_file_and_the_script(sandboxes, tmp_path):
    layout, task = Layout(tmp_path / "data"), calc_task()
    wandered = stored(layout, "unguided", "a0", Wanderer(), [task, calc_task("calc__2")], sandboxes=sandboxes)
    (idle,) = stored(layout, "unguided", "b1", HintFollower(), [task], sandboxes=sandboxes)
    (guided,) = stored(layout, "guided", "b1", HintFollower(), [task], {task.instance_id: PLAN}, sandboxes)
    (current,) = stored(layout, "guided", "b2", HintFollower(), [task], {task.instance_id: PLAN}, sandboxes)
    assert [t.resolved for t in wandered] + [idle.resolved, guided.resolved] == [True, True, False, True]

    found = stored_references(layout, [task.instance_id], "b2")  # not the batch being rescued, not another task
    assert sorted(r.rollout_id for r in found) == sorted([wandered[0].rollout_id, guided.rollout_id])
    assert current.rollout_id in {r.rollout_id for r in stored_references(layout, [task.instance_id], "b1")}

    action_file = tmp_path / "actions.jsonl"
    action_file.write_text(json.dumps({"instance_id": task.instance_id, "actions": [{"name": "submit", "args": {}}]}))
    config = GuidanceConfig(kinds=("action",), action_file=str(action_file), compare_linear=False)
    (plan,) = action_plans({task.instance_id: task}, {task.instance_id: [idle]}, [idle], HintFollower(), CONFIG,
                           config, layout.trajectories("probes", "b2"), "b2", sandboxes=sandboxes, stored=found)
    # The shortest success (the guided one: edit, submit; not the wanderer's ls, edit, submit) is the reference.
    assert (plan.accepted, plan.action_source, plan.teacher, plan.reference_rollout) == (
        True, "trajectory", "trajectory", guided.rollout_id)
    assert [(a.name, json.loads(a.args)) for a in plan.actions] == [("edit", EDIT), ("submit", {})]
    # k=1 shows the edit (the follower copies it, and it is the gold line); k=0 shows nothing.
    assert (plan.K, plan.k_star, plan.found, plan.leaked) == (2, 1, True, True)


@pytest.mark.parametrize("successes,imported,source", [
    ([Reference("calc__1", ({"name": "submit", "args": {}},), "trajectory", "r1")], {"calc__1": [{"name": "x",
                                                                                                "args": {}}]},
     "trajectory"),
    ([Reference("calc__2", ({"name": "submit", "args": {}},), "trajectory", "r2")], {"calc__1": [{"name": "x",
                                                                                                "args": {}}]},
     "file"),
    ([], {}, "expert"),
])
def test_references_are_tried_in_order_trajectory_file_expert(successes, imported, source):
    ref = reference_actions(calc_task(), successes, imported)
    assert (ref.source, ref.rollout_id) == (source, "r1" if source == "trajectory" else "")


def test_forbidding_the_script_leaves_a_task_without_other_sources_a_rejected_plan(tmp_path):
    task = calc_task()
    config = GuidanceConfig(kinds=("action",), max_expert_share=0.0)
    (plan,) = action_plans({task.instance_id: task}, {task.instance_id: []}, [], HintFollower(), CONFIG, config,
                           tmp_path / "probes", "b1")
    assert (plan.kind, plan.accepted, plan.K, plan.action_source) == ("action", False, -1, "")
    assert plan.reason == ("no reference actions: no stored success or action file row, and the gold-patch script "
                           "is capped by guidance.max_expert_share=0 (0 of 1 action plans may use it); raise it, "
                           "or give an action_file")
    assert not (tmp_path / "probes").exists()  # nothing was searched


def test_the_cap_keeps_the_script_for_the_first_tasks_only():
    refs = [Reference(iid, ({"name": "submit", "args": {}},), "expert") for iid in ("c", "a", "b")]
    refs.append(Reference("d", ({"name": "submit", "args": {}},), "trajectory", "r"))
    capped = capped_references(refs, 0.6)  # ⌊0.6 × 4 plans⌋ = 2 may use the script: a and b, by instance id
    assert [(r.instance_id, r.source) for r in capped] == [("c", ""), ("a", "expert"), ("b", "expert"),
                                                           ("d", "trajectory")]
    assert "(2 of 4 action plans may use it)" in capped[0].reason
    assert capped_references(refs, 1.0) == refs
    with pytest.raises(ValueError, match="GuidanceConfig.max_expert_share is 1.5; it must be from 0 to 1"):
        GuidanceConfig(max_expert_share=1.5)


def plan(iid, source, K=-1, k_star=-1, found=False, leaked=False, kind="action"):
    return GuidancePlan(iid, kind, "hint", source, accepted=bool(source), leaked=leaked, action_source=source, K=K,
                        k_star=k_star, found=found)


PLANS = {"b1": [plan("t1", "trajectory", 4, 1, True), plan("t2", "trajectory", 4, 4, False, leaked=True),
                plan("t3", "file", 5, 2, True, leaked=True), plan("t4", "expert", 5, 3, True, leaked=True),
                plan("t5", "expert", 5, 2, True), plan("t6", ""), plan("t7", "", kind="plan")],
         "b2": [plan("t4", "trajectory", 2, 1, True, leaked=True)]}
CHOSEN = pl.DataFrame([("b1", "t1", "guided:action", False), ("b1", "t1", "guided:action", False),
                       ("b2", "t4", "guided:action", True), ("b1", "t4", "guided:action", True),
                       ("b1", "t5", "guided:action", False), ("b1", "t3", "guided:plan", True),
                       ("b1", "t1", "unguided", False)],
                      schema=["batch", "instance_id", "chosen_source", "chosen_hint_has_gold"], orient="row")


def plan_table() -> pl.DataFrame:
    """Every batch's plans as guidance.parquet stores them, with the batch their folder names."""
    return pl.concat([plan_frame(p).with_columns(batch=pl.lit(b)) for b, p in PLANS.items()])


def test_the_per_source_table_on_hand_built_plans():
    table = source_table(plan_table(), CHOSEN)
    print("\n" + str(table))
    # trajectory: t1 (1/4), t2 not found, t4 of b2 (1/2): rescue 2/3, k*/K 0.375, gold hint 1 of the 2 found;
    # chosen: t1 twice (clean) and t4 of b2 (gold); t4 of b1 is the script's, the plan kind and unguided rows no one's
    assert table.rows() == [
        ("trajectory", 3, 2, pytest.approx(2 / 3), 0.375, 0.5, 3, pytest.approx(1 / 3)),
        ("file", 1, 1, 1.0, 0.4, 1.0, 0, None),
        ("expert", 2, 2, 1.0, 0.5, 0.5, 2, 0.5),
        ("none", 1, 0, 0.0, None, None, 0, None),
    ]
    assert table.columns == ["source", "plans", "found", "rescue_rate", "mean_k_star_over_K", "hint_gold",
                             "chosen_rows", "chosen_hint_gold"]


def test_the_card_shows_the_table_when_given_the_plans():
    splits = split_tables({"dpo": CHOSEN})
    card = render_card(CardInfo("t", run_id="r"), splits, {"dpo": {"train": 7}}, None, {"dpo": {"train": 1}},
                       plans=plan_table())
    section = card.split("## Reference sources of action guidance", 1)[1].split("\n## ", 1)[0]
    print(section)
    assert ("| trajectory | 3 | 2 | 66.7% | 37.5% | 50.0% | 3 | 33.3% |\n"
            "| file | 1 | 1 | 100.0% | 40.0% | 100.0% | 0 | – |") in section
    assert "## Reference sources" not in render_card(CardInfo("t", run_id="r"), splits, {"dpo": {"train": 7}}, None,
                                                     {"dpo": {"train": 1}})
