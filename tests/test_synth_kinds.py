"""The bug kinds beyond AST mutations: teacher rewrites (against a loopback OpenAI-protocol server with
scripted replies), combined bugs of one module, and the difficulty record of every task."""

from __future__ import annotations

import dataclasses
import json
import re

import pytest

from pipeline.synthesis.combine import combinations_to_try, combined_candidate, merged_source
from pipeline.synthesis.difficulty import difficulty, patch_size
from pipeline.synthesis.candidates import collect_candidates, functions
from pipeline.synthesis.patches import gold_patch
from pipeline.synthesis.rewrite import Target, rewritten_source
from pipeline.synthesis.synth import SynthConfig, SynthReport, synthesize

from tests.conftest import TOOLZ
from pipeline.rollouts.batch import RolloutConfig

RULES = RolloutConfig().grade_rules()

MODULE = '''\
"""A module with a method to rewrite."""


class Box:
    @staticmethod
    def clamp(value, low=0, high=10):
        """Value kept within [low, high].

        Both ends included.
        """
        if value < low:
            return low
        if value > high:
            return high
        return value


def after():
    return 1
'''
CLAMP = '''\
@staticmethod
def clamp(value, low=0, high=10):
    """Value kept within [low, high].

    Both ends included.
    """
'''
GOOD = CLAMP + "    if value <= low:\n        return low\n    if value > high:\n        return high\n    return value\n"


def _target() -> Target:
    import ast

    name, _, func = next(f for f in functions(ast.parse(MODULE)) if f[0] == "Box.clamp")
    return Target("box.py", name, MODULE, func)


def test_a_good_rewrite_is_spliced_in_place_keeping_indentation_and_decorators():
    source, reason, _ = rewritten_source(_target(), GOOD)
    assert reason == ""
    assert source == MODULE.replace("        if value < low:", "        if value <= low:")


@pytest.mark.parametrize("code, reason", [
    (GOOD.replace("if value <= low:", "if value <= low"), "does_not_compile"),
    (CLAMP + "    return max(low, min(value, high))\nx = 1\n", "not_one_function"),
    (GOOD.replace("high=10", "high=11"), "signature_changed"),
    (GOOD.replace("def clamp(value", "def clamp(val"), "signature_changed"),
    (GOOD.replace("Both ends included.", "Both ends excluded."), "docstring_changed"),
    (CLAMP + "    if value < low:  # same\n        return low\n\n    if (value > high):\n        return high\n"
     "    return value\n", "unchanged"),
    (GOOD.replace("@staticmethod\n", "").replace("<=", "<"), "unchanged"),  # decorators may be left out
    (GOOD.replace("    return value\n", "    return awaitable\n    await x\n"), "does_not_compile"),
])
def test_bad_rewrites_are_rejected_with_their_reason(code, reason):
    assert rewritten_source(_target(), code)[:2] == (None, reason)


SAMPLE = '''\
def span(values, pad=0):
    low = min(values)
    high = max(values)
    if low < 0:
        low = 0
    width = high - low
    return width + pad
'''


def test_bugs_on_disjoint_lines_combine_and_overlapping_ones_do_not(tmp_path):
    (tmp_path / "m.py").write_text(SAMPLE)
    cands, _ = collect_candidates(tmp_path, include=["*.py"], max_per_function=20)
    pick = {(c.lineno, c.kind): c for c in cands}
    first, far = pick[2, "remove_assignment"], pick[7, "change_operator"]
    both = combined_candidate([first, far])
    assert both is not None and both.kind == "combined"
    assert both.mutated_source == SAMPLE.replace("    low = min(values)\n", "").replace("+ pad", "- pad")
    assert patch_size(gold_patch(both)) == (3, 1)
    same_line = [c for c in cands if c.lineno == 4][:2]
    assert len(same_line) == 2 and merged_source(same_line) is None
    assert merged_source([first, pick[3, "remove_assignment"]]) is None  # adjacent lines: the hunks would touch
    groups = combinations_to_try([first, far, *same_line], seed=0)
    assert groups and all(
        not {c.candidate_id for c in same_line} <= {c.candidate_id for c in parts} for _, parts in groups)


HAND_PATCH = '''\
diff --git a/pkg/a.py b/pkg/a.py
--- a/pkg/a.py
+++ b/pkg/a.py
@@ -1,3 +1,3 @@
 x = 1
-y = 2
+y = 3
 z = 4
diff --git a/pkg/b.py b/pkg/b.py
--- a/pkg/b.py
+++ b/pkg/b.py
@@ -1,2 +1,4 @@
 a = 1
+b = 2
+c = 3
 d = 4
'''


def test_difficulty_of_a_hand_made_task_and_its_summary():
    assert patch_size(HAND_PATCH) == (4, 2)
    record = difficulty(HAND_PATCH, ["t::a", "t::b", "t::c"], ["rewrite", "compare_flip"])
    assert record == {"lines_changed": 4, "files_changed": 2, "fail_to_pass": 3,
                      "kinds": ["compare_flip", "rewrite"]}
    report = SynthReport(difficulty=[("p-1", "combined", record),
                                     ("p-1", "rewrite", difficulty(HAND_PATCH[:HAND_PATCH.index("diff", 9)],
                                                                   ["t::a"], ["rewrite"]))])
    summary = report.as_json()["difficulty"]
    assert summary["all"] == {"tasks": 2, "mean_lines_changed": 3.0, "mean_fail_to_pass": 2.0,
                              "lines_changed": {"2": 1, "4": 1}, "files_changed": {"1": 1, "2": 1},
                              "fail_to_pass": {"1": 1, "3": 1}, "bugs_per_task": {"1": 1, "2": 1}}
    assert summary["per_kind"]["rewrite"]["mean_lines_changed"] == 2.0
    assert summary["per_package"]["p-1"]["tasks"] == 2


def _scripted_teacher(body: dict):
    """Request 1: a rewrite that does not compile; 2: one that changes only layout; then a real bug (the
    first `if` negated), which keeps signature and docstring."""
    from tests.loopback import Reply

    prompt = body["messages"][-1]["content"]
    source = re.search(r"```python\n(.*?)```", prompt, re.DOTALL).group(1)
    _scripted_teacher.calls += 1
    if _scripted_teacher.calls == 1:
        return Reply(text=f"```python\n{source.rstrip()}(\n```")
    if _scripted_teacher.calls == 2:
        return Reply(text=f"Here it is:\n```python\n{source.rstrip()}  # tidied\n```")
    return Reply(text="```python\n" + re.sub(r"^(\s*)if (.*):\s*$", r"\1if not (\2):", source, count=1,
                                            flags=re.M) + "```")


@pytest.fixture(scope="module")
def kinds_run(base_image, docker_client, synth_cache):
    from pipeline.agent.openai_policy import OpenAIPolicy, OpenAIPolicyConfig
    from tests.loopback import OpenAIServer

    _scripted_teacher.calls = 0
    spec = dataclasses.replace(TOOLZ, source_globs=("toolz/itertoolz.py",))
    config = SynthConfig(packages=(TOOLZ.name,), tasks_per_package=4, candidates_per_package=16,
                         rewrite=True, rewrites_per_package=6, combine=1)
    server = OpenAIServer(_scripted_teacher)
    with server as url:
        teacher = OpenAIPolicy(OpenAIPolicyConfig(model="teacher", base_url=url, max_retries=0))
        tasks, report = synthesize(config, base_image, synth_cache, docker_client, specs=(spec,),
                                   rewriter=teacher, rules=RULES)
    return tasks, report, server


def test_rewrites_validate_and_bad_ones_are_counted(kinds_run):
    tasks, report, server = kinds_run
    rewrite = report.per_kind["rewrite"]
    assert len(server.requests) == 6 and not server.errors
    # the first `if` negated changes functions that have one; the others come back unchanged
    assert rewrite["generated"] == 6 and rewrite["compiled"] >= 2
    assert rewrite["rejected_does_not_compile"] == 1 and rewrite["rejected_unchanged"] == 5 - rewrite["compiled"]
    assert {r.reason.split(":")[0] for r in report.rejects if r.stage == "rewrite"} == {"does_not_compile",
                                                                                        "unchanged"}
    rewritten = [t for t in tasks if json.loads(t.provenance)["kind"] == "rewrite"]
    assert rewritten and rewrite["kept"] == len(rewritten), report.as_json()
    for task in rewritten:
        assert len(task.base_commit) == 40 and 1 <= len(task.FAIL_TO_PASS) <= 10
        assert re.search(r"^\+\s+if not \(", task.setup_patch, re.M)
        assert re.search(r"^-\s+if not \(", task.patch, re.M)


def test_combined_task_validates_with_the_union_of_its_parts(kinds_run):
    tasks, report, _ = kinds_run
    by_candidate = {json.loads(t.provenance)["candidate_id"]: t for t in tasks}
    combined = [t for t in tasks if json.loads(t.provenance)["kind"] == "combined"]
    assert len(combined) == 1, report.as_json()
    task = combined[0]
    parts = [by_candidate[c] for c in json.loads(task.provenance)["parts"]]
    assert len(parts) in (2, 3) and len({json.loads(p.provenance)["file"] for p in parts}) == 1
    assert set(task.FAIL_TO_PASS) == {t for p in parts for t in p.FAIL_TO_PASS}
    assert not set(task.PASS_TO_PASS) & set(task.FAIL_TO_PASS)
    assert set(task.PASS_TO_PASS) == set.intersection(*(set(p.PASS_TO_PASS) for p in parts)) - set(task.FAIL_TO_PASS)
    record = json.loads(task.provenance)["difficulty"]
    assert record["kinds"] == sorted(json.loads(p.provenance)["kind"] for p in parts)
    assert record["fail_to_pass"] == len(task.FAIL_TO_PASS) and record["files_changed"] == 1
    assert record["lines_changed"] == sum(json.loads(p.provenance)["difficulty"]["lines_changed"] for p in parts)
    assert len({t.instance_id for t in tasks}) == len(tasks)


def test_every_task_has_its_difficulty_summarised(kinds_run):
    tasks, report, _ = kinds_run
    for task in tasks:
        record = json.loads(task.provenance)["difficulty"]
        assert record["fail_to_pass"] == len(task.FAIL_TO_PASS) and record["files_changed"] == 1
        one_line = json.loads(task.provenance)["kind"] == "remove_assignment"  # its gold patch only adds the line
        assert record["lines_changed"] == patch_size(task.patch)[0] >= (1 if one_line else 2)
    summary = report.as_json()["difficulty"]
    assert summary["per_package"][TOOLZ.key]["tasks"] == len(tasks)
    assert summary["per_kind"]["combined"]["bugs_per_task"] in ({"2": 1}, {"3": 1})
