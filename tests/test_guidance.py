"""Guidance: the prefix search, the hint, the leakage filter, LLM teachers over HTTP, Agent-RLVR's three parts
combined in one guidance, and the real loop."""

from __future__ import annotations

import dataclasses
import json

import pytest

from pipeline.agent.anthropic_policy import AnthropicPolicy, AnthropicPolicyConfig
from pipeline.agent.heuristic import HeuristicPolicy, guided_targets
from pipeline.agent.loop import AgentConfig
from pipeline.agent.openai_policy import OpenAIPolicy, OpenAIPolicyConfig
from pipeline.guidance.actions import action_hint, linear_prefix, min_guidance_prefix, search_steps_bound
from pipeline.guidance.teacher import LLMTeacher, RuleTeacher, TeacherError, TeacherGuidance
from pipeline.guidance.teacher_guidance import combined_guidance
from pipeline.rollouts.rescue import GuidanceConfig, action_plans, failed_groups, guided_guidance, guided_jobs, \
    recovery, teacher_plans
from pipeline.rollouts.batch import RolloutConfig, plan_jobs, run_batch
from pipeline.core.store import read_batch
from pipeline.verifier.environment import LocalTaskSandboxes
from tests.loopback import AnthropicServer, OpenAIServer, Reply, tokens
from tests.test_batch_local import CONFIG, HintFollower, calc_task, make_repo
from tests.test_datasets_build import traj


def oracle(t: int, calls: list):
    def probe(k: int, i: int) -> bool:
        calls.append((k, i))
        return k >= t
    return probe


@pytest.mark.parametrize("K", [1, 2, 3, 5, 8, 13, 31])
def test_binary_search_finds_threshold_within_log_steps(K):
    for t in range(K + 1):
        calls: list = []
        result = min_guidance_prefix(K, oracle(t, calls), probes_per_step=2, max_steps=10)
        assert result.k_star == t and result.found == (t < K)  # k* = K is the fallback, never probed
        assert result.steps <= search_steps_bound(K)
        assert result.probes == len(calls)


def test_binary_search_without_success_gives_full_trajectory():
    calls: list = []
    result = min_guidance_prefix(6, oracle(99, calls), probes_per_step=2, max_steps=5)
    assert result.k_star == 6 and not result.found
    assert result.probes == len(calls) == 2 * result.steps


def test_binary_search_respects_budget():
    calls: list = []
    result = min_guidance_prefix(1000, oracle(3, calls), probes_per_step=2, max_steps=4)
    assert calls == [(500, 0), (250, 0), (125, 0), (62, 0)]  # each step's first probe succeeds
    assert (result.steps, result.probes, result.k_star, result.found) == (4, 4, 62, True)


def test_linear_search_counts_probes():
    calls: list = []
    result = linear_prefix(10, oracle(4, calls), probes_per_step=2)
    assert result.k_star == 4 and result.probes == 7  # k=1..3 fail twice, k=4 succeeds first time


def test_hint_format():
    actions = [{"name": "bash", "args": {"command": "ls"}}, {"name": "submit", "args": {}}]
    assert action_hint(actions, 0).endswith("Reference action trajectory hint:\nNone")
    assert action_hint(actions, 1).endswith('Reference action trajectory hint:\n1. bash: {"command": "ls"}')
    assert "2. submit: {}" in action_hint(actions, 2)


class CopyingTeacher:
    """Writes a plan that pastes the fix (and so combined guidance holding it): what the leakage filter must catch."""

    name = "copier"

    def teach(self, task, failed):
        added = next(l[1:] for l in task.patch.splitlines() if l.startswith("+") and not l.startswith("+++"))
        parts = [TeacherGuidance("plan", f"Change the line to:\n{added}", teacher=self.name),
                 TeacherGuidance("environment_feedback", "Look at the function the test calls.", teacher=self.name),
                 TeacherGuidance("environment_interaction", "View a range, not the file.", teacher=self.name)]
        return [*parts, combined_guidance(parts)]


@pytest.mark.parametrize("reject", [True, False])
def test_leakage_filter(toolz_task, reject):
    config = GuidanceConfig(kinds=("plan", "environment_feedback", "combined"), reject_leaks=reject)
    plans = teacher_plans({toolz_task.instance_id: toolz_task}, {toolz_task.instance_id: [None]},
                          CopyingTeacher(), config)
    plan, feedback, combined = plans
    assert plan.leaked and plan.accepted is not reject
    assert not feedback.leaked and feedback.accepted
    assert combined.kind == "combined" and combined.leaked and combined.accepted is not reject  # its plan leaks


ANSWER = json.dumps({"plan": "1. Look at `toolz/itertoolz.py`.", "environment_feedback": "You edited the test.",
                     "environment_interaction": "Use view_range.", "files": ["toolz/itertoolz.py"],
                     "functions": ["merge_sorted"]})


@pytest.mark.parametrize("protocol", ["openai", "anthropic"])
def test_llm_teachers_over_http(protocol, toolz_task, synth_run, monkeypatch, tmp_path):
    monkeypatch.setenv("ANTHROPIC_API_KEY", "k")
    failed = _one_failed_trajectory(toolz_task, tmp_path)
    server_cls = OpenAIServer if protocol == "openai" else AnthropicServer
    server = server_cls([Reply(text=f"Here you go:\n{ANSWER}"), Reply(text="no json here"),
                         Reply(text=f"```json\n{HINDSIGHT}\n```"), Reply(text='{"plan": "wrong kind"}')])
    with server as url:
        client = OpenAIPolicy(OpenAIPolicyConfig(model="teacher", base_url=url, max_retries=0)) \
            if protocol == "openai" else AnthropicPolicy(AnthropicPolicyConfig(model="teacher", base_url=url,
                                                                              max_retries=0))
        teacher = LLMTeacher(client, show_gold=True)
        items = teacher.teach(toolz_task, failed)
        assert [g.kind for g in items] == ["plan", "environment_feedback", "environment_interaction", "combined"]
        assert items[3].text == ("Plan:\n1. Look at `toolz/itertoolz.py`.\n\nEnvironment feedback:\nYou edited the "
                                 "test.\n\nEnvironment interaction:\nUse view_range.")
        assert items[0].files == ("toolz/itertoolz.py",) and items[0].teacher == f"llm:{client.name}"
        with pytest.raises(TeacherError, match=toolz_task.instance_id):
            teacher.teach(toolz_task, failed)
        hint = teacher.hindsight(toolz_task, [failed, failed])
        assert (hint.kind, hint.files, hint.functions) == ("hindsight", ("toolz/itertoolz.py",), ("merge_sorted",))
        assert hint.text.startswith("Both attempts edited the test") and hint.teacher == f"llm:{client.name}"
        with pytest.raises(TeacherError, match="hindsight"):
            teacher.hindsight(toolz_task, [failed])
    sent = [json.dumps(r) for r in server.requests]
    statement_start = json.dumps(toolz_task.problem_statement[:40])[1:-1]  # as the request body encodes it
    assert "Never write the code of the fix" in sent[0] and statement_start in sent[0]
    assert "Every attempt failed" in sent[2] and "### Attempt 2" in sent[2] and "### Attempt 3" not in sent[2]
    assert "The reference fix" in sent[2]  # the teacher sees the gold patch; the hint must not quote it


HINDSIGHT = json.dumps({"hindsight": "Both attempts edited the test file; the failure is in `merge_sorted`.",
                        "files": ["toolz/itertoolz.py"], "functions": ["merge_sorted"]})


def _one_failed_trajectory(task, tmp_path, max_steps: int = 3, attempts: int = 1):
    policy = HeuristicPolicy()
    config = RolloutConfig(attempts=attempts, workers=1, agent=AgentConfig(max_steps=max_steps))
    trajs = run_batch(plan_jobs([task], policy, config, "t"), policy, config, tmp_path / "t", "t").trajectories
    return trajs[0] if attempts == 1 else trajs


def test_rule_hindsight_names_the_shared_mistake_and_the_place_never_the_fix(toolz_task, tmp_path):
    """Two attempts cut after their first action (running the suite): neither edited anything nor ran the
    failing test by name; the hint says both, and where to look."""
    group = _one_failed_trajectory(toolz_task, tmp_path, max_steps=1, attempts=2)
    assert [t.patch for t in group] == ["", ""] and not any(t.resolved for t in group)
    hint = RuleTeacher().hindsight(toolz_task, group)
    provenance = json.loads(toolz_task.provenance)
    function = provenance["function"].split(".")[-1]
    assert hint.kind == "hindsight" and hint.files == (provenance["file"],) and hint.functions == (function,)
    assert hint.text.startswith("None of the 2 attempts changed the repository")
    assert f"No attempt ran the failing test `{toolz_task.FAIL_TO_PASS[0]}`" in hint.text
    assert f"`{provenance['file']}` (`{function}`)" in hint.text
    assert not any(l[1:].strip() in hint.text for l in toolz_task.patch.splitlines()
                   if l.startswith("+") and not l.startswith("+++") and len(l[1:].strip()) > 5)
    plans = teacher_plans({toolz_task.instance_id: toolz_task}, {toolz_task.instance_id: group}, RuleTeacher(),
                          GuidanceConfig(kinds=("hindsight",)))
    assert [(p.kind, p.accepted, p.leaked) for p in plans] == [("hindsight", True, False)]
    assert plans[0].text == hint.prompt_text()

    # Attempts that edited another file: the hint names the right place first, where a reader (and the heuristic,
    # which follows the first file a hint names) starts
    elsewhere = "diff --git a/toolz/other.py b/toolz/other.py\n--- a/toolz/other.py\n+++ b/toolz/other.py\n"
    hint = RuleTeacher().hindsight(toolz_task, [dataclasses.replace(t, patch=elsewhere) for t in group])
    assert hint.text.startswith(f"The failure comes from `{provenance['file']}` (`{function}`), which none of the 2 "
                                "attempts changed: they all edited `toolz/other.py` instead.")
    assert guided_targets(hint.prompt_text())[0].path == provenance["file"]


def test_rule_teacher_names_the_place_without_the_fix(toolz_task, tmp_path):
    failed = _one_failed_trajectory(toolz_task, tmp_path)
    items = RuleTeacher().teach(toolz_task, failed)
    assert [g.kind for g in items] == ["plan", "environment_feedback", "environment_interaction", "combined"]
    path = json.loads(toolz_task.provenance)["file"]
    for g in items:
        assert path in g.text and not g.leaked
        assert not any(l[1:].strip() in g.text for l in toolz_task.patch.splitlines()
                       if l.startswith("+") and not l.startswith("+++") and len(l[1:].strip()) > 5)


CALC_ANSWER = {"plan": "1. Look at `calc.py`, in `add`.", "environment_feedback": "You edited nothing.",
               "environment_interaction": "Run `python -m pytest -q tests/test_calc.py::test_add` alone.",
               "files": ["calc.py"], "functions": ["add"]}


@pytest.mark.parametrize("teacher", ["rule", "openai"])
def test_combined_guidance_holds_the_three_parts_of_one_teacher_answer(teacher):
    """The rule teacher, and an LLM teacher over a loopback OpenAI server, write the combined guidance from the
    parts of their one answer: each under its heading in Agent-RLVR's order, with no call of its own."""
    task = calc_task()
    failed = traj("r0", task.instance_id)
    if teacher == "rule":
        items, spent = RuleTeacher().teach(task, failed), (0, 0)
    else:
        server = OpenAIServer([Reply(text=json.dumps(CALC_ANSWER)), Reply(text="a second call would get this")])
        with server as url:
            items = LLMTeacher(OpenAIPolicy(OpenAIPolicyConfig(model="teacher", base_url=url, max_retries=0))
                               ).teach(task, failed)
        (request,) = server.requests  # one call wrote all four
        spent = (len(tokens(json.dumps(["", request["messages"]]))), len(tokens(json.dumps(CALC_ANSWER))))
    assert [g.kind for g in items] == ["plan", "environment_feedback", "environment_interaction", "combined"]
    plan, feedback, interaction, combined = items
    if teacher == "rule":
        assert plan.text.startswith("1. Where to look: `calc.py`, around line 2.") and combined.functions == ()
    else:
        parts = ("plan", "environment_feedback", "environment_interaction")
        assert [plan.text, feedback.text, interaction.text] == [CALC_ANSWER[k] for k in parts]
        assert combined.functions == ("add",)
    assert combined.text == (f"Plan:\n{plan.text}\n\nEnvironment feedback:\n{feedback.text}\n\n"
                             f"Environment interaction:\n{interaction.text}")
    header = "Guidance (plan, environment feedback and environment interaction):\n"
    assert combined.prompt_text() == header + combined.text
    assert combined.files == ("calc.py",) and combined.teacher == plan.teacher and not combined.leaked
    assert [(g.tokens_in, g.tokens_out) for g in items] == [spent] * 4  # the call's count, shared in costs.py
    with pytest.raises(TeacherError, match="missing environment_interaction"):
        combined_guidance([plan, feedback])


def test_a_combined_attempt_sees_the_three_parts_and_its_unguided_prompt_none(tmp_path, monkeypatch):
    """Through the pipeline: the rule teacher's plans, the guided groups, real attempts in local sandboxes."""
    monkeypatch.setenv("DOCKER_HOST", f"unix://{tmp_path}/no-engine.sock")  # no engine: nothing to reap either
    task = calc_task()
    tasks, failed = {task.instance_id: task}, {task.instance_id: [traj("r0", task.instance_id)]}
    plans = teacher_plans(tasks, failed, RuleTeacher(), GuidanceConfig(kinds=("plan", "combined")))
    assert [(p.kind, p.accepted, p.leaked, p.teacher_call_share) for p in plans] == [
        ("plan", True, False, 2), ("combined", True, False, 2)]
    parts = RuleTeacher().teach(task, failed[task.instance_id][0])[:3]
    sandboxes = LocalTaskSandboxes(repos={"local/calc": str(make_repo(tmp_path / "calc"))})
    policy = HintFollower()
    guided = run_batch(guided_jobs(tasks, guided_guidance(plans), policy, CONFIG, "g"), policy, CONFIG,
                       tmp_path / "g", "g", sandboxes=sandboxes).trajectories
    by_kind = {t.guidance_kind: t for t in guided}
    assert sorted(by_kind) == ["combined", "plan"] and len(guided) == 2
    asked = by_kind["combined"].prompt[-1]["content"]
    assert by_kind["combined"].guidance_text == plans[1].text and plans[1].text in asked
    assert "Guidance (plan, environment feedback and environment interaction):\nPlan:\n" in asked
    assert asked.index(parts[0].text) < asked.index(parts[1].text) < asked.index(parts[2].text)
    unguided = "\n".join(m["content"] or "" for m in by_kind["combined"].unguided_prompt)
    assert "Guidance" not in unguided and not any(g.text in unguided for g in parts)
    alone = by_kind["plan"].prompt[-1]["content"]  # the plan family's attempt sees its part alone
    assert parts[0].text in alone and not any(g.text in alone for g in parts[1:])

def test_guidance_recovers_failed_groups(synth_run, tmp_path):
    tasks = {t.instance_id: t for t in synth_run[0]}
    policy = HeuristicPolicy()
    config = RolloutConfig(attempts=2, workers=2, agent=AgentConfig(max_steps=40))
    unguided = run_batch(plan_jobs(list(tasks.values()), policy, config, "u"), policy, config,
                         tmp_path / "u", "u").trajectories
    failed = failed_groups(unguided, delta=0.0)
    assert failed, "every toolz task was solved unguided; nothing to rescue"
    gconfig = GuidanceConfig(compare_linear=False)  # the folder then holds the binary search's probes only
    plans = teacher_plans(tasks, failed, RuleTeacher(), gconfig)
    plans += action_plans(tasks, failed, [t for t in unguided if t.resolved], policy, config, gconfig,
                          tmp_path / "probes", "g")
    action = [p for p in plans if p.kind == "action"]
    assert sorted(p.instance_id for p in action) == sorted(failed) and all(p.accepted for p in action)
    for p in action:  # the plan is what its stored probes say
        probes = read_batch(tmp_path / "probes" / p.instance_id)
        won = {t.guidance_k for t in probes if t.reward > 0}
        lost = {t.guidance_k for t in probes if t.reward == 0} - won
        assert {t.batch for t in probes} == {"g-probes"} and p.probes == len(probes)
        assert p.search_steps == len(won | lost) and p.found == bool(won)
        assert p.k_star == (min(won) if won else p.K) and all(k < p.k_star for k in lost)
        assert p.text == action_hint([a.as_dict() for a in p.actions], p.k_star)
    guided = run_batch(guided_jobs(tasks, guided_guidance(plans), policy, config, "g"), policy, config,
                       tmp_path / "g", "g").trajectories
    rates = recovery(plans, guided)
    assert rates["action"]["tasks"] == len(failed) and rates["action"]["recovered"] >= 1
    for t in guided:
        assert t.unguided_prompt != t.prompt and t.guidance_text in t.prompt[-1]["content"]
        assert t.instance_id in failed
    recovered = {t.instance_id for t in guided if t.resolved}
    assert recovered and all(not u.resolved for u in unguided if u.instance_id in recovered)


def test_quoting_the_guidance_is_flagged():
    from pipeline.guidance.references import quotes_guidance

    hint = "Guidance (plan):\n1. Where to look: `toolz/itertoolz.py`, in `merge_sorted`, around line 125."
    quoting = [{"role": "assistant", "content": "As the hint says: where to look: toolz/itertoolz.py, in merge_sorted, around line 125"}]
    own = [{"role": "assistant", "content": "I will open itertoolz and read merge_sorted first."}]
    assert quotes_guidance(tuple(quoting), hint, n=8)
    assert not quotes_guidance(tuple(own), hint, n=8)
    assert quotes_guidance(tuple(own), hint, n=1)  # the threshold is a setting
