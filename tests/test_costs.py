"""What attempts and guidance cost (pipeline/rollouts/costs.py), the cascade and what it saved (pipeline/rollouts/cascade.py), the
teacher's tokens as its server reports them, and where the costs are shown (card, evaluation, the demo's
report); on batches worked out by hand: each price and each stored figure changes the answer."""

from __future__ import annotations

import dataclasses
import json

import pytest

from pipeline.agent.anthropic_policy import AnthropicPolicy, AnthropicPolicyConfig
from pipeline.agent.openai_policy import OpenAIPolicy, OpenAIPolicyConfig
from pipeline.rollouts.cascade import cascade_savings, guided_batch, run_cascade, savings_markdown
from assets.cli import head_to_head_report
from pipeline.rollouts.costs import CostConfig, cost_markdown, cost_rows, cost_totals, costs_card_section, pairs_by_origin
from pipeline.datasets.card import CardInfo, render_card
from training.evaluation import evaluation_cost, results_table, score
from pipeline.rollouts.families import family_rows, head_to_head, head_to_head_markdown
from pipeline.guidance.teacher import LLMTeacher, RuleTeacher
from pipeline.core.records import Step
from pipeline.core.records import Guidance, GuidancePlan
from pipeline.rollouts.rescue import GuidanceConfig, teacher_plans
from pipeline.verifier.environment import LocalTaskSandboxes
from tests.loopback import AnthropicServer, OpenAIServer, Reply, tokens
from tests.test_batch_local import CONFIG, PLAN, HintFollower, calc_task, make_repo
from tests.test_datasets_build import traj

PRICES = CostConfig(policy_input_per_million=2.0, policy_output_per_million=10.0, sandbox_per_hour=36.0,
                    teacher_input_per_million=3.0, teacher_output_per_million=15.0)


def step(tokens_in: int, tokens_out: int, tool_seconds: float) -> Step:
    return Step(policy_latency=0.1, tool_time=tool_seconds, prompt_tokens=tokens_in, completion_tokens=tokens_out,
                tool="bash", error=False)


def attempt(rid: str, iid: str, kind: str = "none", reward: float = 0.0, steps: tuple[Step, ...] = (), **fields):
    """A stored trajectory (tests/test_datasets_build.py's) with these per-step records."""
    return dataclasses.replace(traj(rid, iid, kind, reward, **fields), steps=steps)


def taught(iid: str, kind: str, tokens_in: int, tokens_out: int, share: int, accepted: bool = True) -> GuidancePlan:
    return GuidancePlan(iid, kind, "hint", "llm:teacher", accepted=accepted, teacher_tokens_in=tokens_in,
                        teacher_tokens_out=tokens_out, teacher_call_share=share)


ATTEMPTS = [
    attempt("u1", "t1", steps=(step(100, 10, 2.0), step(200, 20, 1.0)), grade_time=1.5, wall_time=10.0),
    attempt("u2", "t2", reward=1.0, steps=(step(50, 5, 0.5),), grade_time=1.0, wall_time=4.0),
    attempt("a1", "t1", "action", 1.0, steps=(step(1000, 100, 1.0),), grade_time=2.0, wall_time=6.0),
    attempt("g1", "t1", "plan", steps=(), grade_time=0.0, wall_time=2.0, infra_error="container died"),
    attempt("g2", "t1", "plan", 1.0, steps=(step(500, 50, 2.0),), grade_time=1.0, wall_time=5.0),
]
PROBES = [attempt("p1", "t3", "action", 1.0, steps=(step(400, 40, 0.5),), grade_time=1.0, wall_time=3.0)]
# One call wrote t1's three Agent-RLVR kinds (3000 in, 600 out: 0.009 + 0.009 = 0.018, a third each); t3's plan
# was set aside for a leak, its share paid all the same; t1's hindsight came from a call of its own.
PLANS = [taught("t1", "plan", 3000, 600, 3), taught("t3", "plan", 3000, 600, 3, accepted=False),
         taught("t1", "hindsight", 1000, 200, 1), GuidancePlan("t1", "action", "hint", "trajectory", K=2, k_star=1)]
PAIRS = pairs_by_origin(["unguided", "guided:plan", "guided:plan", "guided:action", "guided:action",
                         "guided:action"])


def test_costs_per_origin_count_tokens_seconds_teacher_and_money_per_task_and_pair():
    rows = {r["origin"]: r for r in cost_rows(ATTEMPTS, PRICES, PROBES, PLANS, PAIRS)}
    assert list(rows) == ["unguided", "plan", "hindsight", "action"] and PAIRS == {"unguided": 1, "plan": 2,
                                                                                    "action": 3}
    # u1: (300 x 2 + 30 x 10) / 1e6 + (3.0 + 1.5) s x 0.01 = 0.0459; u2: (100 + 50) / 1e6 + 1.5 x 0.01 = 0.01515
    assert rows["unguided"] == {"origin": "unguided", "attempts": 2, "tokens_in": 350, "tokens_out": 35,
                                "sandbox_s": 3.5, "grading_s": 2.5, "wall_s": 14.0, "teacher_tokens_in": 0,
                                "teacher_tokens_out": 0, "teacher_cost": 0, "cost": 0.06105, "tasks_resolved": 1,
                                "cost_per_resolved_task": 0.06105, "dpo_pairs": 1, "cost_per_dpo_pair": 0.06105}
    # g2: 0.001 + 0.0005 + 3 s x 0.01 = 0.0315 (g1, lost to the infrastructure, spent nothing); teacher: two
    # thirds of 0.018; 0.0435 for one task and two pairs
    assert rows["plan"] == {"origin": "plan", "attempts": 2, "tokens_in": 500, "tokens_out": 50, "sandbox_s": 2.0,
                            "grading_s": 1.0, "wall_s": 7.0, "teacher_tokens_in": 2000.0, "teacher_tokens_out": 400.0,
                            "teacher_cost": 0.012, "cost": 0.0435, "tasks_resolved": 1,
                            "cost_per_resolved_task": 0.0435, "dpo_pairs": 2, "cost_per_dpo_pair": 0.02175}
    # no guided attempt ran: the teacher's call alone, 0.003 + 0.003, and nothing to divide it by
    assert rows["hindsight"]["attempts"] == 0 and rows["hindsight"]["cost"] == 0.006
    assert (rows["hindsight"]["cost_per_resolved_task"], rows["hindsight"]["dpo_pairs"]) == (None, 0)
    # a1: 0.003 + 0.03; the probe: 0.0012 + 0.015, its success no task the family resolved; three pairs
    assert rows["action"] == {"origin": "action", "attempts": 2, "tokens_in": 1400, "tokens_out": 140,
                              "sandbox_s": 1.5, "grading_s": 3.0, "wall_s": 9.0, "teacher_tokens_in": 0,
                              "teacher_tokens_out": 0, "teacher_cost": 0, "cost": 0.0492, "tasks_resolved": 1,
                              "cost_per_resolved_task": 0.0492, "dpo_pairs": 3, "cost_per_dpo_pair": 0.0164}
    totals = cost_totals(list(rows.values()))
    assert (totals["attempts"], totals["cost"], totals["dpo_pairs"], totals["cost_per_dpo_pair"]) == (
        6, 0.15975, 6, 0.026625)


def test_free_prices_cost_nothing_and_the_table_lists_every_origin():
    rows = cost_rows(ATTEMPTS, CostConfig(), PROBES, PLANS)
    assert [r["cost"] for r in rows] == [0, 0, 0, 0] and [r["tokens_in"] for r in rows] == [350, 500, 0, 1400]
    lines = cost_markdown(rows).splitlines()
    assert lines[0].startswith("| origin | attempts | tokens_in |") and len(lines) == 6
    assert lines[2] == "| unguided | 2 | 350 | 35 | 3.5 | 2.5 | 14.0 | 0 | 0 | 0 | 0.0 | 1 | 0.0 | - | - |"


def test_the_head_to_head_joins_each_family_with_its_costs():
    plans = [dataclasses.replace(p, accepted=True) for p in PLANS]
    rows = head_to_head(family_rows(plans, ATTEMPTS), cost_rows(ATTEMPTS, PRICES, PROBES, plans))
    assert [r["origin"] for r in rows] == ["unguided", "plan", "hindsight", "action"]
    assert rows[1] == {"origin": "plan", "groups_tried": 2, "groups_rescued": 1, "attempts": 2, "pass_rate": 1.0,
                       "policy_tokens": 550, "teacher_tokens": 2400.0, "cost": 0.0435,
                       "cost_per_resolved_task": 0.0435}
    lines = head_to_head_markdown(rows).splitlines()
    assert lines[2] == "| unguided | - | - | 2 | - | 385 | 0 | 0.06105 | 0.06105 |"


ANSWER = json.dumps({"plan": "1. Look at `calc.py`, in `add`.", "environment_feedback": "You edited nothing.",
                     "environment_interaction": "Use view_range.", "files": ["calc.py"], "functions": ["add"]})
HINDSIGHT = json.dumps({"hindsight": "Both attempts left `calc.py` untouched.", "files": ["calc.py"],
                        "functions": ["add"]})


@pytest.mark.parametrize("protocol", ["openai", "anthropic"])
def test_each_guidance_record_carries_the_tokens_its_teacher_server_reported(protocol, monkeypatch):
    monkeypatch.setenv("ANTHROPIC_API_KEY", "k")
    tasks = {iid: calc_task(iid) for iid in ("calc__1", "calc__2")}
    failed = {iid: [traj(f"{iid}-0", iid), traj(f"{iid}-1", iid, sample=1)] for iid in tasks}
    replies = [ANSWER, HINDSIGHT, "no json here", HINDSIGHT]  # calc__1's kinds and hindsight, then calc__2's
    server = (OpenAIServer if protocol == "openai" else AnthropicServer)([Reply(text=r) for r in replies])
    config = GuidanceConfig(kinds=("plan", "environment_interaction", "hindsight"))
    with server as url:
        client = OpenAIPolicy(OpenAIPolicyConfig(model="teacher", base_url=url, max_retries=0)) \
            if protocol == "openai" else AnthropicPolicy(AnthropicPolicyConfig(model="teacher", base_url=url,
                                                                              max_retries=0))
        plans = teacher_plans(tasks, failed, LLMTeacher(client), config)
    # what the server counted: its made-up tokenization of each request's messages and of each answer
    spent = [(len(tokens(json.dumps([r.get("system", ""), r["messages"]]))), len(tokens(a)))
             for r, a in zip(server.requests, replies)]
    assert len(server.requests) == 4 and all(n > 100 for n, _ in spent)
    got = [(p.instance_id, p.kind, p.accepted, (p.teacher_tokens_in, p.teacher_tokens_out), p.teacher_call_share)
           for p in plans]
    assert got == [("calc__1", "plan", True, spent[0], 2), ("calc__1", "environment_interaction", True, spent[0], 2),
                   ("calc__1", "hindsight", True, spent[1], 1),
                   ("calc__2", "plan", False, spent[2], 2),  # unusable, but paid for
                   ("calc__2", "environment_interaction", False, spent[2], 2),
                   ("calc__2", "hindsight", True, spent[3], 1)]
    rows = {r["origin"]: r for r in cost_rows([], PRICES, plans=plans)}
    want = (spent[0][0] * 3 + spent[0][1] * 15 + spent[2][0] * 3 + spent[2][1] * 15) / 2 / 1e6
    assert rows["plan"]["teacher_cost"] == pytest.approx(want, abs=1e-6) and rows["plan"]["teacher_tokens_in"] == round(
        (spent[0][0] + spent[2][0]) / 2, 1)


def test_the_rule_teacher_spends_no_tokens():
    task = calc_task()
    plans = teacher_plans({task.instance_id: task}, {task.instance_id: [traj("r0", task.instance_id)]},
                          RuleTeacher(), GuidanceConfig())
    assert {p.kind for p in plans} == {"plan", "environment_feedback", "environment_interaction", "combined",
                                       "hindsight"}
    assert all((p.teacher_tokens_in, p.teacher_tokens_out) == (0, 0) for p in plans)
    assert {r["origin"]: r["teacher_cost"] for r in cost_rows([], PRICES, plans=plans)} == {
        "plan": 0, "environment_feedback": 0, "environment_interaction": 0, "combined": 0, "hindsight": 0}


# One call (4000 in, 800 out: 0.012 + 0.012 = 0.024) wrote t1's three parts and so its combined guidance: four
# records, a quarter each (0.006). c1 resolved t1: 0.002 + 0.001 + 3 s x 0.01 = 0.033; c2 failed: 0.001 + 0.0005
# + 2 s x 0.01 = 0.0215; p1 failed: 0.0004 + 0.0002 + 2 s x 0.01 = 0.0206.
COMBINED_PLANS = [taught("t1", kind, 4000, 800, 4)
                  for kind in ("plan", "environment_feedback", "environment_interaction", "combined")]
COMBINED_ATTEMPTS = [attempt("c1", "t1", "combined", 1.0, steps=(step(1000, 100, 2.0),), grade_time=1.0),
                     attempt("c2", "t1", "combined", steps=(step(500, 50, 1.0),), grade_time=1.0),
                     attempt("p1", "t1", "plan", steps=(step(200, 20, 1.0),), grade_time=1.0)]


def test_combined_guidance_has_its_own_cost_row_and_a_share_of_the_call_that_wrote_its_parts():
    rows = {r["origin"]: r for r in cost_rows(COMBINED_ATTEMPTS, PRICES, plans=COMBINED_PLANS,
                                              pairs=pairs_by_origin(["guided:combined"]))}
    assert list(rows) == ["plan", "environment_feedback", "environment_interaction", "combined"]
    assert rows["combined"] == {"origin": "combined", "attempts": 2, "tokens_in": 1500, "tokens_out": 150,
                                "sandbox_s": 3.0, "grading_s": 2.0, "wall_s": 2.0, "teacher_tokens_in": 1000.0,
                                "teacher_tokens_out": 200.0, "teacher_cost": 0.006, "cost": 0.0605,
                                "tasks_resolved": 1, "cost_per_resolved_task": 0.0605, "dpo_pairs": 1,
                                "cost_per_dpo_pair": 0.0605}
    assert (rows["plan"]["cost"], rows["plan"]["cost_per_resolved_task"]) == (0.0266, None)
    assert sum(r["teacher_cost"] for r in rows.values()) == pytest.approx(0.024)  # the call, paid once
    table = head_to_head(family_rows(COMBINED_PLANS, COMBINED_ATTEMPTS),
                         cost_rows(COMBINED_ATTEMPTS, PRICES, plans=COMBINED_PLANS))
    assert "| combined | 1 | 1 | 2 | 0.5 | 1650 | 1200.0 | 0.0605 | 0.0605 |" in head_to_head_markdown(table)
    assert "| plan | 1 | 0 | 1 | 0.0 | 220 | 1200.0 | 0.0266 | - |" in head_to_head_markdown(table)


@pytest.mark.parametrize("kinds, share", [(("plan", "environment_feedback", "environment_interaction", "combined"), 4),
                                          (("combined",), 1)])
def test_combined_guidance_asks_the_llm_teacher_nothing_more(kinds, share):
    """Combined guidance with its parts: one call, split four ways; combined alone: the same one call, all its own."""
    task = calc_task()
    server = OpenAIServer([Reply(text=ANSWER), Reply(text=ANSWER)])
    with server as url:
        plans = teacher_plans({task.instance_id: task}, {task.instance_id: [traj("r0", task.instance_id)]},
                              LLMTeacher(OpenAIPolicy(OpenAIPolicyConfig(model="teacher", base_url=url,
                                                                         max_retries=0))),
                              GuidanceConfig(kinds=kinds))
    (request,) = server.requests
    spent = (len(tokens(json.dumps(["", request["messages"]]))), len(tokens(ANSWER)))
    call = (spent[0] * 3 + spent[1] * 15) / 1e6
    assert [(p.kind, p.accepted, (p.teacher_tokens_in, p.teacher_tokens_out), p.teacher_call_share)
            for p in plans] == [(k, True, spent, share) for k in kinds]
    rows = {r["origin"]: r for r in cost_rows([], PRICES, plans=plans)}
    assert rows["combined"]["teacher_cost"] == pytest.approx(call / share, abs=1e-6)
    assert sum(r["teacher_cost"] for r in rows.values()) == pytest.approx(call, abs=1e-6)


# The cascade on four failed groups, families in the order plan, environment_feedback, hindsight, action; two
# attempts per guided group. Outcomes: plan rescues t1 (t2's one success was an infrastructure fault: no rescue),
# hindsight fails t3, action rescues t2 and fails t3. environment_feedback had guidance for t1 only.
GUIDANCE = {"t1": ["plan", "environment_feedback", "hindsight", "action"], "t2": ["plan", "action"],
            "t3": ["hindsight", "action"], "t4": ["plan"]}
RESCUES = {("t1", "plan"), ("t2", "action")}
SPEND = {"plan": (100, 10, 1.0), "hindsight": (200, 20, 2.0), "action": (300, 30, 1.0)}


def guided_group(todo: dict[str, list[Guidance]], calls: list) -> list:
    """Two graded attempts per (group, guidance): the scripted outcomes, each attempt one step of SPEND."""
    calls.append({iid: [g.kind for g in items] for iid, items in todo.items()})
    out = []
    for iid, items in todo.items():
        for g in items:
            tokens_in, tokens_out, seconds = SPEND[g.kind]
            if (iid, g.kind) == ("t3", "action"):
                tokens_in, tokens_out, seconds = 500, 50, 3.0
            for i in range(2):
                fault = "engine gone" if (iid, g.kind, i) == ("t2", "plan", 0) else ""
                won = (iid, g.kind) in RESCUES or bool(fault)
                out.append(attempt(f"{g.kind}-{iid}-{i}", iid, g.kind, float(won),
                                   (step(tokens_in, tokens_out, seconds),), grade_time=1.0, infra_error=fault))
    return out


def test_the_cascade_runs_each_family_only_on_groups_still_failed_and_measures_what_it_saved():
    guidance = {iid: [Guidance(k, f"{k} hint for {iid}") for k in kinds] for iid, kinds in GUIDANCE.items()}
    calls: list = []
    run = run_cascade(guidance, ("plan", "environment_feedback", "hindsight", "action"),
                      lambda todo: guided_group(todo, calls))
    assert calls == [{"t1": ["plan"], "t2": ["plan"], "t4": ["plan"]}, {"t3": ["hindsight"]},
                     {"t2": ["action"], "t3": ["action"]}]  # environment_feedback: nothing left to run
    assert run.ran == {"plan": ["t1", "t2", "t4"], "environment_feedback": [], "hindsight": ["t3"],
                       "action": ["t2", "t3"]}
    assert run.skipped == {"plan": [], "environment_feedback": ["t1"], "hindsight": ["t1"], "action": ["t1"]}
    rows = {r["family"]: r for r in cascade_savings(run, PRICES)}
    # hindsight ran on one group: 2 attempts of 220 tokens, 2 + 1 s, 0.0004 + 0.0002 + 0.03 each; one skipped
    assert rows["hindsight"] == {"family": "hindsight", "groups_run": 1, "groups_skipped": 1, "attempts_saved": 2.0,
                                 "tokens_saved": 440.0, "sandbox_s_saved": 6.0, "cost_saved": 0.0612}
    # action ran on two: t2 2 x (0.0006 + 0.0003 + 0.02), t3 2 x (0.001 + 0.0005 + 0.04): 0.1248 for 4 attempts,
    # 1760 tokens and 12 s, half of it per group, one group skipped
    assert rows["action"] == {"family": "action", "groups_run": 2, "groups_skipped": 1, "attempts_saved": 2.0,
                              "tokens_saved": 880.0, "sandbox_s_saved": 6.0, "cost_saved": 0.0624}
    assert rows["plan"]["cost_saved"] == 0 and rows["environment_feedback"]["cost_saved"] is None
    assert savings_markdown(list(rows.values())).splitlines()[-1] == (
        "Saved against every family on every failed group: 4 guided attempts, 1320 policy tokens, 0.1236 in money "
        "(guided attempts only; guidance was written for every group); unmeasured: environment_feedback ran on no "
        "group.")
    # the families table counts a family as tried only where the cascade ran it
    plans = [GuidancePlan(iid, k, "hint", "rule") for iid, kinds in GUIDANCE.items() for k in kinds]
    tried = {r["family"]: (r["groups_tried"], r["groups_rescued"])
             for r in family_rows(plans, run.trajectories, run.ran)}
    assert tried == {"plan": (3, 1), "environment_feedback": (0, 0), "hindsight": (1, 0), "action": (2, 1)}


@pytest.fixture
def sandboxes(tmp_path) -> LocalTaskSandboxes:
    return LocalTaskSandboxes(repos={"local/calc": str(make_repo(tmp_path / "calc"))})


@pytest.mark.parametrize("cascade", [False, True])
def test_guided_groups_head_to_head_or_as_a_cascade_in_real_local_sandboxes(cascade, sandboxes, tmp_path,
                                                                            monkeypatch):
    """Two failed tasks; the plan (and calc__2's hindsight) show the fix, the feedback does not. Head to head,
    every family runs on every group; the cascade spares calc__1 the feedback: its plan rescued it."""
    monkeypatch.setenv("DOCKER_HOST", f"unix://{tmp_path}/no-engine.sock")  # no engine: nothing to reap either
    tasks = {iid: calc_task(iid) for iid in ("calc__1", "calc__2")}
    plans = [GuidancePlan("calc__1", "plan", PLAN.text, "rule"),
             GuidancePlan("calc__1", "environment_feedback", "Look at calc.py.", "rule"),
             GuidancePlan("calc__2", "environment_feedback", "Look at calc.py.", "rule"),
             GuidancePlan("calc__2", "hindsight", PLAN.text.replace("plan", "hindsight"), "rule")]
    config = GuidanceConfig(cascade=cascade)
    summary, run = guided_batch(tasks, plans, HintFollower(), CONFIG, config, tmp_path / "guided", "b1",
                                progress=lambda line: None, sandboxes=sandboxes)
    done = sorted((t.instance_id, t.guidance_kind, t.resolved) for t in summary.trajectories)
    rescued = [("calc__1", "plan", True), ("calc__2", "environment_feedback", False), ("calc__2", "hindsight", True)]
    assert done == (rescued if cascade else sorted([*rescued, ("calc__1", "environment_feedback", False)]))
    assert summary.ran == len(done) and (run is None) is not cascade
    if cascade:
        assert run.skipped == {"plan": [], "environment_feedback": ["calc__1"], "hindsight": []}
        (feedback,) = [r for r in cascade_savings(run, PRICES) if r["family"] == "environment_feedback"]
        assert (feedback["groups_run"], feedback["groups_skipped"], feedback["attempts_saved"]) == (1, 1, 1.0)


def test_the_card_says_what_the_rows_cost():
    section = costs_card_section(tuple(cost_rows(ATTEMPTS, PRICES, PROBES, PLANS, PAIRS)))
    lines = section.splitlines()
    assert lines[0] == "## What it cost"
    assert "| plan | 2 | 500 / 50 | 2000 / 400 | 0.001 | 0.0435 | 0.0435 | 0.02175 |" in lines
    assert "| hindsight | 0 | 0 / 0 | 1000 / 200 | 0.000 | 0.006 | n/a | n/a |" in lines
    # 6 attempts; 385 + 550 + 1540 policy tokens; 3600 teacher; 7 + 6.5 s sandbox and grading; 0.15975 over 6 pairs
    assert lines[-1] == ("In all: 6 attempts, 2475 policy tokens, 3600 teacher tokens, 0.004 sandbox hours, "
                         "cost 0.15975, 0.026625 per DPO pair.")
    assert costs_card_section(()) == ""
    card = render_card(CardInfo("t", run_id="r", costs=tuple(cost_rows(ATTEMPTS, PRICES, PROBES, PLANS, PAIRS))), {},
                       {"dpo": {"train": 6}}, None, {"dpo": {"train": 1}})
    assert card.index("## Guidance checks") < card.index("## What it cost") < card.index("## Sources")
    assert section in card


def test_the_evaluation_reports_tokens_seconds_and_money_per_task():
    tasks = [calc_task("e1"), calc_task("e2")]
    attempts = [attempt("e1-0", "e1", reward=1.0, steps=(step(1000, 100, 4.0),), grade_time=2.0),
                attempt("e1-1", "e1", steps=(step(3000, 300, 8.0),), grade_time=2.0),
                attempt("e2-0", "e2", steps=(), grade_time=0.0, infra_error="engine gone")]
    cost = evaluation_cost(tasks, attempts, PRICES)
    # 4400 tokens; 16 s; (4000 x 2 + 400 x 10) / 1e6 + 16 x 0.01 = 0.172; per task: half
    assert cost == {"tokens": 4400, "sandbox_s": 16.0, "cost": 0.172, "tokens_per_task": 2200.0,
                    "sandbox_s_per_task": 8.0, "cost_per_task": 0.086}
    row = {"model": "starting", "identity": {"model": "m", "revision": ""}, **score(tasks, attempts), **cost}
    assert results_table([row]).splitlines()[2] == (
        "| starting | unknown | 1 | 3 | 1 | 0.5 | 0.0 | 1.0 | 1 | 2200.0 | 8.0 | 0.086 | 0 | None |")


def test_the_demo_ends_with_the_head_to_head_and_costs_from_the_assets_metadata():
    import dagster as dg

    costs = cost_rows(ATTEMPTS, PRICES, PROBES, PLANS, PAIRS)
    metadata = {"guided_rollouts": {"head_to_head": dg.MetadataValue.md(head_to_head_markdown(head_to_head(
                    family_rows(PLANS, ATTEMPTS), cost_rows(ATTEMPTS, PRICES, PROBES, PLANS)))),
                                    "cost": 0.15975},
                "dataset_export": {"costs": dg.MetadataValue.md(cost_markdown(costs)), "rows": 3}}
    report = head_to_head_report(metadata).splitlines()
    assert report[0] == "Guidance families head to head on the same failed groups, with costs:"
    assert report[1].startswith("| origin | groups_tried | groups_rescued |")
    assert "| plan | 1 | 1 | 2 | 1.0 | 550 | 2400.0 | 0.0435 | 0.0435 |" in report
    at = report.index("Cost per resolved task and per DPO pair, every batch:")
    assert report[at + 4] == ("| plan | 2 | 500 | 50 | 2.0 | 1.0 | 7.0 | 2000.0 | 400.0 | 0.012 | 0.0435 | 1 | "
                              "0.0435 | 2 | 0.02175 |")
    assert "What the cascade saved:" not in report and head_to_head_report({}) == ""
