"""DPO, ActGuide and SFT rows from hand-made trajectory tables, written as real Parquet and read back."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
from pathlib import Path

import datasets
import polars as pl
import pyarrow.parquet as pq
import pytest

from pipeline.datasets import (ACTGUIDE_SCHEMA, DPO_SCHEMA, SCHEMAS, SFT_SCHEMA, BadTrajectoryFile, DatasetConfig,
                               GuidanceLeakError, arguments_as_objects, build_rows, dataset_files, read_dataset,
                               task_split, update_datasets)
from pipeline.agent.identity import sampling_refusal
from pipeline.datasets import build
from pipeline.datasets.files import read_trajectories
from pipeline.datasets.formats import CALLS, DPO_DIVERGENCE_SCHEMA, mentions, row_text
from pipeline.datasets.splits import content_hashes
from pipeline.core.layout import Layout, probe_batch
from pipeline.core.records import Action
from pipeline.core.records import TRAJECTORY_SCHEMA, TRAJECTORY_SCHEMA_VERSION, Trajectory
from pipeline.core.schema import record_schema
from pipeline.core.store import write_rows

SYSTEM = {"role": "system", "content": "You fix bugs in a sandbox."}
ISSUE = "add() returns the wrong sum."
TOOLS = json.dumps([{"type": "function", "function": {"name": "bash", "parameters": {"type": "object"}}}])
HINT = "Look at pkg/add.py: the operator in add() is wrong."
GOLD = ("diff --git a/pkg/add.py b/pkg/add.py\n--- a/pkg/add.py\n+++ b/pkg/add.py\n@@ -1,2 +1,2 @@\n"
        "-    a - b\n+    a + b\n")


def completion(tag: str, steps: int = 1) -> tuple[dict, ...]:
    """`steps` tool calls and their outputs, then a closing message; `tag` makes it distinct."""
    out: list[dict] = []
    for i in range(steps):
        call = {"id": f"call_{i}", "type": "function",
                "function": {"name": "bash", "arguments": json.dumps({"command": f"echo {tag} {i}"})}}
        out += [{"role": "assistant", "content": f"step {i} of {tag}", "tool_calls": [call]},
                {"role": "tool", "content": f"{tag} {i}", "tool_call_id": f"call_{i}"}]
    return tuple(out + [{"role": "assistant", "content": f"done {tag}"}])


def traj(rid: str, iid: str = "t1", kind: str = "none", reward: float = 0.0, sample: int = 0, batch: str = "b1",
         tag: str | None = None, steps: int = 1, hint: str = HINT, **fields) -> Trajectory:
    """A stored trajectory with defaults everywhere; guided ones get `hint` appended to the user turn."""
    issue = {"role": "user", "content": f"{ISSUE} ({iid})"}
    guided = {"role": "user", "content": f"{issue['content']}\n\n{hint}"} if kind != "none" else issue
    prompt = (SYSTEM, guided)
    values = dict(
        rollout_id=rid, group_id=f"{batch}|{iid}|{kind}", batch=batch, instance_id=iid, sample_index=sample,
        seed=sample,
        policy="scripted", policy_settings="{}", guidance_kind=kind, guidance_text=hint if kind != "none" else "",
        guidance_actions=(), guidance_k=-1, teacher="", prompt=prompt, unguided_prompt=(SYSTEM, issue),
        messages=prompt + completion(tag or rid, steps), tools=TOOLS, steps=(), logprobs=None, patch=f"patch {rid}",
        reward=reward, resolved=reward > 0, grade_reason="", report="{}", test_log="", dropped_files=(),
        enforcement=(), suspicious=(), exit_status="submitted", infra_error="", error="", infra_retries=0,
        format_errors=0, total_tokens=0, wall_time=1.0, grade_time=1.0, quotes_guidance=False, created_at="")
    values.update(fields)
    return Trajectory(**values)


def pairs(rows) -> list[tuple]:
    return [(r["instance_id"], r["chosen_rollout_id"], r["rejected_rollout_id"], r["chosen_source"])
            for r in rows.dpo.iter_rows(named=True)]


def strings(value):
    """Every string inside a row (nested lists and dicts included)."""
    if isinstance(value, str):
        yield value
    elif isinstance(value, dict):
        for v in value.values():
            yield from strings(v)
    elif isinstance(value, list):
        for v in value:
            yield from strings(v)


TASK_T1 = [traj("u0", sample=0), traj("u1", sample=1, steps=3), traj("u2", reward=1.0, sample=2),
           traj("g0", kind="plan", reward=1.0), traj("g1", kind="plan", sample=1),
           traj("a0", kind="action", reward=1.0)]
OTHERS = [traj("v0", iid="t2"), traj("v1", iid="t2", sample=1),  # only failures: no pair
          traj("w0", iid="t3", kind="plan", reward=1.0)]  # a success without unguided failures: no pair


@pytest.mark.parametrize("config,expected,over_cap", [
    (DatasetConfig(), [("t1", "u2", "u0", "unguided"), ("t1", "g0", "u1", "guided:plan"),
                       ("t1", "a0", "u0", "guided:action"), ("t1", "u2", "u1", "unguided")], 2),
    (DatasetConfig(pairs_per_task=1), [("t1", "u2", "u0", "unguided")], 5),
    (DatasetConfig(rejected="shortest"), [("t1", "u2", "u0", "unguided"), ("t1", "g0", "u0", "guided:plan"),
                                          ("t1", "a0", "u0", "guided:action")], 0),
    (DatasetConfig(chosen_sources="guided_only"), [("t1", "g0", "u0", "guided:plan"),
                                                   ("t1", "a0", "u1", "guided:action"),
                                                   ("t1", "g0", "u1", "guided:plan"),
                                                   ("t1", "a0", "u0", "guided:action")], 0),
    (DatasetConfig(chosen_sources="unguided_only"), [("t1", "u2", "u0", "unguided"),
                                                     ("t1", "u2", "u1", "unguided")], 0),
], ids=["default", "one-pair", "shortest", "guided-only", "unguided-only"])
def test_pairing_rules_give_exactly_these_pairs_in_this_order(config, expected, over_cap):
    rows = build_rows(TASK_T1 + OTHERS, config)
    assert pairs(rows) == expected
    assert rows.dropped["dpo.over_pairs_per_task"] == over_cap


def test_a_dpo_row_is_trl_conversational_with_the_unguided_prompt_and_structured_tool_calls():
    from trl.data_utils import is_conversational

    rows = build_rows(TASK_T1, DatasetConfig())
    row = rows.dpo.filter(pl.col("chosen_rollout_id") == "g0").row(0, named=True)
    assert is_conversational(row) and is_conversational(rows.sft.row(0, named=True))
    bare = {"tool_calls": None, "tool_call_id": None, "reasoning_content": None}  # every message has each key
    issue = {"role": "user", "content": f"{ISSUE} (t1)", **bare}
    assert row["prompt"] == [{**SYSTEM, **bare}, issue]
    assert row["chosen"] == [
        {"role": "assistant", "content": "step 0 of g0", "tool_call_id": None, "reasoning_content": None,
         "tool_calls": [{"id": "call_0", "type": "function",
                         "function": {"name": "bash", "arguments": '{"command": "echo g0 0"}'}}]},
        {"role": "tool", "content": "g0 0", **bare, "tool_call_id": "call_0"},
        {"role": "assistant", "content": "done g0", **bare}]
    assert [m["role"] for m in row["rejected"]] == ["assistant", "tool"] * 3 + ["assistant"]
    assert (row["tools"], row["split"], row["batch"]) == (TOOLS, task_split("t1", 0.1), "b1")
    # the heuristic: ceil(characters / 4) + 4 per message, over contents and the stored tool-call JSON
    assert row["prompt_tokens"] == (len(SYSTEM["content"]) + len(issue["content"]) + 3) // 4 + 2 * 4
    stored_calls = json.dumps(row["chosen"][0]["tool_calls"])
    chars = len("step 0 of g0") + len(stored_calls) + len("g0 0") + len("done g0")
    assert row["chosen_tokens"] == (chars + 3) // 4 + 3 * 4


def test_qwen25_template_renders_the_tool_calls_once_arguments_are_objects():
    from transformers.utils.chat_template_utils import render_jinja_template
    import trl

    template = (Path(trl.__file__).parent / "chat_templates" / "qwen2_5.jinja").read_text()
    row = build_rows(TASK_T1, DatasetConfig()).dpo.row(0, named=True)
    (as_string,), _ = render_jinja_template([row["prompt"] + row["chosen"]], chat_template=template)
    (as_object,), _ = render_jinja_template([arguments_as_objects(row["prompt"] + row["chosen"])],
                                            chat_template=template, tools=json.loads(row["tools"]))
    assert '"arguments": "{\\"command\\": \\"echo u2 0\\"}"' in as_string  # why rows need the helper for Qwen2.5
    assert '{"name": "bash", "arguments": {"command": "echo u2 0"}}' in as_object


def test_guidance_text_never_reaches_a_row_and_echoes_are_left_out():
    echo = traj("g2", kind="plan", reward=1.0, sample=2, tag=f"copying: {HINT}")
    rows = build_rows(TASK_T1 + [echo], DatasetConfig(pairs_per_task=20))
    assert rows.dropped["echoes_guidance"] == 1
    assert rows.dpo.height == 6 and rows.sft.height == 3
    for frame in (rows.dpo, rows.sft):
        for row in frame.iter_rows(named=True):
            assert not [s for s in strings(row) if HINT in s]
    leaky = traj("g3", kind="plan", reward=1.0, unguided_prompt=(SYSTEM, {"role": "user", "content": HINT}))
    with pytest.raises(GuidanceLeakError, match="trajectory g3 \\(t1, batch b1\\): its unguided_prompt holds its "
                                                "guidance text"):
        build_rows(TASK_T1 + [leaky], DatasetConfig())


def test_infra_errors_and_quoted_guidance_are_never_used():
    bad = [traj("x0", sample=5, infra_error="sandbox_error: engine gone"),
           traj("x1", kind="plan", reward=1.0, sample=5, quotes_guidance=True),
           traj("x2", kind="action", reward=1.0, sample=5, infra_error="crashed: RuntimeError: boom")]
    rows = build_rows(TASK_T1 + bad, DatasetConfig(pairs_per_task=50))
    used = set(rows.dpo["chosen_rollout_id"]) | set(rows.dpo["rejected_rollout_id"]) | set(rows.sft["rollout_id"])
    used |= {m["rollout_id"] for ts in rows.actguide["trajectories"].to_list() for m in ts}
    assert used == {"u0", "u1", "u2", "g0", "a0"}
    assert (rows.dropped["infra_error"], rows.dropped["quotes_guidance"]) == (2, 1)


def test_rows_handing_over_the_gold_diff_are_left_out_and_gold_equal_fixes_kept():
    git_style = (GOLD.replace("--- a/", "index 1234abc..5678def 100644\n--- a/", 1)
                 .replace("@@ -1,2 +1,2 @@", "@@ -1,2 +1,2 @@ def add(a, b):"))
    hunks = GOLD[GOLD.index("@@ "):]
    said = {"role": "assistant", "content": f"Applying this:\n{hunks}"}
    told = traj("g5", kind="plan", reward=1.0, sample=5)
    attempts = TASK_T1 + [
        dataclasses.replace(told, messages=told.messages[:2] + (said,) + told.messages[2:]),  # writes the gold diff out
        traj("g6", kind="plan", reward=1.0, sample=6, patch=git_style),  # a correct fix equal to the gold patch
        traj("u7", reward=1.0, sample=7, patch="a different fix"),
        traj("u8", reward=1.0, sample=8, unguided_prompt=(SYSTEM, {"role": "user", "content": f"{ISSUE}\n{hunks}"}))]
    others = {f"t{i}": GOLD.replace("a - b", f"a - {i}") for i in range(2, 50)}  # a build passes every task's gold
    rows = build_rows(attempts, DatasetConfig(pairs_per_task=50), gold={"t1": GOLD, **others})
    assert rows.dropped["gold_patch"] == 2
    assert set(rows.dpo["chosen_rollout_id"]) == set(rows.sft["rollout_id"]) == {"u2", "u7", "g0", "g6", "a0"}


def test_identical_completions_and_repeated_rollouts_are_deduplicated():
    twins = [traj("u5", sample=5, tag="u0"), traj("g7", kind="plan", reward=1.0, sample=7, tag="g0"),
             traj("g8", kind="environment_feedback", reward=1.0, sample=8, tag="u1", steps=3), TASK_T1[0]]
    rows = build_rows(TASK_T1 + twins, DatasetConfig(pairs_per_task=50))
    assert rows.dropped["duplicate_rollout"] == 1 and rows.dropped["duplicate_completion"] == 2
    assert rows.dropped["dpo.identical_pair"] == 1  # g8 succeeded with what u1 failed with
    keys = list(zip(rows.dpo["chosen_rollout_id"], rows.dpo["rejected_rollout_id"]))
    assert len(keys) == len(set(keys)) == 7
    assert rows.dpo.select("chosen_hash", "rejected_hash").is_unique().all()
    assert "u5" not in rows.dpo["rejected_rollout_id"] and "g7" not in rows.sft["rollout_id"]


STORED = pl.List(pl.Struct({"role": pl.String, "content": pl.String, "tool_calls": pl.String,
                             "tool_call_id": pl.String}))
CHAT = pl.List(pl.Struct({"role": pl.String, "content": pl.String, "tool_calls": CALLS, "tool_call_id": pl.String}))


def stored(role: str, content: str | None = None, calls: str | None = None, call_id: str | None = None) -> dict:
    return {"role": role, "content": content, "tool_calls": calls, "tool_call_id": call_id}


@pytest.mark.parametrize("rows_at_once", [1, 4, 1000])
def test_a_completion_hash_is_the_sha256_of_its_canonical_text(rows_at_once):
    call = json.dumps([{"id": "c", "type": "function", "function": {"name": "bash", "arguments": "{}"}}])
    rows = [[stored("system", "s"), stored("user", "u"), stored("assistant", "a", call),
             stored("tool", "out", None, "c")], [], None, [stored("user", "u")], [stored("user"), stored("assistant", "")],
            [stored("system", "x"), None, stored("assistant", "y")]]
    texts = [f"assistant\x1fa\x1f{call}\x1f\x1etool\x1fout\x1f\x1fc", "", "", "", "assistant\x1f\x1f\x1f",
             "assistant\x1fy\x1f\x1f"]  # the completion after `first` messages; a null message is skipped
    hashes = content_hashes(pl.Series(rows, dtype=STORED), pl.Series([2, 0, 0, 5, 1, 1]), rows_at_once)
    assert hashes.to_list() == [hashlib.sha256(t.encode()).hexdigest() for t in texts]
    assert content_hashes(pl.Series(rows[:2], dtype=STORED), pl.Series([None, 0])).to_list() == [
        None, hashlib.sha256(b"").hexdigest()]


def test_a_text_is_found_in_any_field_of_a_chat_but_never_across_two():
    def said(content, *calls):
        return {"role": "assistant", "content": content, "tool_call_id": None, "tool_calls": [
            {"id": "1", "type": "function", "function": {"name": n, "arguments": a}} for n, a in calls] or None}

    chats = pl.Series([[said("look at add.py")], [said(None, ("bash", '{"cmd": "cat add.py"}'))],
                       [said("add"), said(".py")], [said("add", ("x", ".py"))], [said(None, (None, "add.py"))], []],
                      dtype=CHAT)
    assert mentions(pl.Series(["add.py"] * 6), chats).to_list() == [True, True, False, False, False, False]
    # a needle holding a separator is looked for in the text `row_text` writes, separators and all
    assert mentions(pl.Series(["add\x1f\x1e.py"] * 6), chats).to_list() == [False, False, True, False, False, False]
    assert mentions(pl.Series(["add.py"] * 6), chats).to_list() == chats.to_frame("m").select(
        row_text(pl.col("m")).str.contains("add.py", literal=True)).to_series().to_list()
    assert mentions(pl.Series(["cat add", "nothing"]), chats[:2], chats[1:3]).to_list() == [True, False]


def test_same_input_gives_the_same_rows_in_the_same_order():
    attempts = TASK_T1 + OTHERS
    first = build_rows(attempts, DatasetConfig(rejected="random", seed=3))
    again = build_rows(list(reversed(attempts)), DatasetConfig(rejected="random", seed=3))
    for kind in SCHEMAS:
        assert getattr(first, kind).equals(getattr(again, kind))
    assert first.dpo["rejected_rollout_id"].n_unique() == 1


def test_actguide_rows_hold_the_whole_group_with_log_probs_and_both_prompts():
    actions = (Action("bash", '{"command": "grep -n add pkg"}'), Action("edit", '{"path": "pkg/add.py"}'),
               Action("submit", "{}"))
    guided = [traj(f"a{i}", kind="action", reward=float(i), sample=i, guidance_actions=actions, guidance_k=1,
                   group_id="ga", logprobs=((-0.5, -0.25), None), temperature=1.0, top_p=1.0 - i / 10, top_k=0)
              for i in range(2)]
    probe = traj("p0", kind="action", reward=1.0, batch="b1-probes", guidance_actions=actions, guidance_k=2)
    rows = build_rows(TASK_T1[:2] + guided + [probe], DatasetConfig())  # u0, u1 failed: a rescued group
    (row,) = rows.actguide.iter_rows(named=True)
    assert row["prompt"][1]["content"] == f"{ISSUE} (t1)" and row["guided_prompt"][1]["content"].endswith(HINT)
    assert json.loads(row["actions"]) == [a.as_dict() for a in actions] and (row["K"], row["k_star"]) == (3, 1)
    assert [(m["rollout_id"], m["sampled_under"], m["reward"]) for m in row["trajectories"]] == [
        ("u0", "unguided", 0.0), ("u1", "unguided", 0.0), ("a0", "guided", 0.0), ("a1", "guided", 1.0)]
    assert row["group_kind"] == "rescued" and rows.groups == {"mixed": 0, "rescued": 1, "zero_advantage": 0}
    assert row["trajectories"][3]["logprobs"] == [[-0.5, -0.25], None] and row["trajectories"][0]["logprobs"] is None
    assert (row["group_id"], row["batch"]) == ("ga", "b1")
    assert "p0" in rows.sft["rollout_id"]  # probes are guided successes, never group members
    settings = [(m["temperature"], m["top_p"], m["top_k"]) for m in row["trajectories"]]
    assert settings == [(-1.0, -1.0, -1), (-1.0, -1.0, -1), (1.0, 1.0, 0), (1.0, 0.9, 0)]
    assert [bool(sampling_refusal(m)) for m in row["trajectories"]] == [True, True, False, True]


def test_probe_successes_pass_the_guidance_checks_before_they_become_chosen_rows():
    """Probes (stored under the probe batch) are chosen and SFT rows, never ActGuide members: the checks apply."""
    actions = (Action("submit", "{}"),)
    said = completion("p0") + ({"role": "assistant", "content": "Following the reference action. I submit."},)
    probes = [traj(f"p{i}", kind="action", reward=1.0, sample=i, batch=probe_batch("b1"), guidance_actions=actions,
                   guidance_k=1, **({"messages": (SYSTEM, {"role": "user", "content": f"{ISSUE} (t1)\n\n{HINT}"})
                                                  + said} if i == 0 else {})) for i in range(2)]
    rows = build_rows([traj("u0")] + probes, DatasetConfig())
    assert rows.sft["rollout_id"].to_list() == ["p1"] and pairs(rows) == [("t1", "p1", "u0", "guided:action")]
    assert rows.dropped["refers_to_guidance"] == rows.checks["references_dropped.action"] == 1
    assert rows.actguide.height == 0  # no unguided success, but probes are no group: no rescued group either
    rewritten = build_rows([traj("u0")] + probes, DatasetConfig(guidance_references="rewrite"))
    row = rewritten.sft.filter(pl.col("rollout_id") == "p0").row(0, named=True)
    assert row["messages"][-1]["content"] == "I submit." and json.loads(row["rewrites"])[0]["removed"] == 1


def test_a_rewritten_actguide_member_keeps_no_log_probs_of_the_text_it_no_longer_is():
    actions = (Action("submit", "{}"),)
    said = completion("a0") + ({"role": "assistant", "content": "Following the reference action. I submit."},)
    fixed = traj("a0", kind="action", reward=1.0, guidance_actions=actions, guidance_k=1,
                 messages=(SYSTEM, {"role": "user", "content": f"{ISSUE} (t1)\n\n{HINT}"}) + said,
                 logprobs=((-0.5,), (-0.25,), (-0.125,)), prompt_token_ids=((1,), (2,), (3,)),
                 token_ids=((4,), (5,), (6,)))
    rows = build_rows([traj("u0"), fixed], DatasetConfig(guidance_references="rewrite"))
    (member,) = [m for m in rows.actguide["trajectories"][0] if m["sampled_under"] == "guided"]
    assert member["completion"][-1]["content"] == "I submit." and json.loads(member["rewrites"])[0]["removed"] == 1
    assert (member["logprobs"], member["prompt_token_ids"], member["token_ids"]) == (None, None, None)
    dropped = build_rows([traj("u0"), fixed], DatasetConfig())
    assert dropped.actguide.height == 0 and dropped.dropped["actguide.rescued_lost_to_guidance_checks"] == 1


def test_length_limits_drop_and_count():
    rows = build_rows(TASK_T1, DatasetConfig(max_completion_tokens=60))
    assert rows.dropped["too_long"] == 1  # u1: three steps
    assert "u1" not in rows.dpo["rejected_rollout_id"]


@pytest.mark.parametrize("limits,too_long", [
    ({"max_completion_tokens": 127}, 0), ({"max_completion_tokens": 126}, 1),  # u1 counts 127, the rest 46
    ({"max_prompt_tokens": 23}, 0), ({"max_prompt_tokens": 22}, 6),  # every unguided prompt counts 23
])
def test_a_limit_keeps_what_counts_exactly_that_many_tokens(limits, too_long):
    assert build_rows(TASK_T1, DatasetConfig(**limits)).dropped["too_long"] == too_long


def test_a_task_whose_unguided_attempts_were_all_infra_errors_is_rescued_by_a_mixed_guided_group():
    actions = (Action("submit", "{}"),)
    lost = [traj(f"x{i}", sample=i, infra_error="sandbox_error: engine gone") for i in range(2)]
    guided = [traj(f"a{i}", kind="action", reward=float(i), sample=i, guidance_actions=actions, guidance_k=1,
                   group_id="ga") for i in range(2)]
    rows = build_rows(lost + guided, DatasetConfig())
    assert [(m["rollout_id"], m["sampled_under"]) for m in rows.actguide["trajectories"][0]] == [
        ("a0", "guided"), ("a1", "guided")]
    assert rows.groups == {"mixed": 0, "rescued": 1, "zero_advantage": 0}
    solved = build_rows(lost + [dataclasses.replace(g, reward=1.0, resolved=True) for g in guided], DatasetConfig())
    assert solved.actguide.height == 0 and solved.groups == {"mixed": 0, "rescued": 0, "zero_advantage": 1}


def test_a_tokenizer_counts_instead_of_the_heuristic(tmp_path):
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {"[UNK]": 0, **{w: i + 1 for i, w in enumerate("step 0 of u2 done".split())}}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="[UNK]").save_pretrained(tmp_path)
    rows = build_rows(TASK_T1[:3], DatasetConfig(tokenizer=str(tmp_path)))
    tool_calls = json.dumps([{"id": "call_0", "type": "function",
                              "function": {"name": "bash", "arguments": '{"command": "echo u2 0"}'}}])
    # words of "step 0 of u2" and of its tool calls, of "u2 0", of "done u2"
    assert rows.sft["completion_tokens"].to_list() == [4 + len(tool_calls.split()) + 2 + 2]


def test_splits_are_stable_disjoint_and_near_the_fraction():
    ids = [f"repo__{i}" for i in range(4000)]
    splits = [task_split(i, 0.1) for i in ids]
    assert 0.08 < splits.count("test") / len(ids) < 0.12
    assert task_split("repo__0", 0.0) == "train" and task_split("repo__0", 1.0) == "test"
    assert [task_split(i, 0.1) for i in ids[:50]] == splits[:50]
    assert (task_split("repo__7", 0.5), task_split("repo__8", 0.5)) == ("test", "train")  # pinned: never moves
    attempts = [traj(f"{i}-{s}", iid=f"repo__{i}", reward=float(s == 0), sample=s) for i in range(60) for s in range(2)]
    rows = build_rows(attempts, DatasetConfig(test_fraction=0.3))
    by_task = rows.dpo.group_by("instance_id").agg(pl.col("split").n_unique())
    assert by_task["split"].to_list() == [1] * 60
    train = set(rows.dpo.filter(pl.col("split") == "train")["instance_id"])
    test = set(rows.dpo.filter(pl.col("split") == "test")["instance_id"])
    assert train and test and not train & test
    again = build_rows(list(reversed(attempts)) + [traj("n", iid="new")], DatasetConfig(test_fraction=0.3))
    assert dict(again.dpo.select("instance_id", "split").iter_rows()) == dict(rows.dpo.select(
        "instance_id", "split").iter_rows())


def store_batch(data: Path, batch: str, attempts: list[Trajectory]) -> None:
    for origin, kind in [("unguided", True), ("guided", False)]:
        chosen = [dataclasses.replace(t, batch=batch) for t in attempts if (t.guidance_kind == "none") == kind]
        write_rows(data / "trajectories" / origin / batch / "trajectories.parquet", [t.to_row() for t in chosen],
                   TRAJECTORY_SCHEMA)


def test_an_update_dedups_against_the_keys_of_its_own_tasks_only(tmp_path):
    data, out = tmp_path / "data", tmp_path / "out"
    store_batch(data, "b1", TASK_T1 + [traj("r9", iid="t9"), traj("s9", iid="t9", kind="plan", reward=1.0)])
    update_datasets(data, out, DatasetConfig())
    built = {kind: pl.read_parquet(out / kind / "b1.parquet", columns=keys) for kind, keys in build.SEEN_KEYS.items()}
    assert {kind: set(frame["instance_id"]) for kind, frame in built.items()} == dict.fromkeys(built, {"t1", "t9"})
    keys = build._Keys(out)
    keys.add("b1")
    seen = keys.of(pl.Series(["t9", "t5"]))
    assert {kind: frame.rows() for kind, frame in seen.items()} == {
        kind: frame.filter(pl.col("instance_id") == "t9").rows() for kind, frame in built.items()}


def test_an_update_builds_only_new_batches_and_equals_a_build_from_scratch(tmp_path):
    data, out = tmp_path / "data", tmp_path / "out"
    store_batch(data, "b1", TASK_T1)
    first = update_datasets(data, out, DatasetConfig())
    assert (first.built, first.reused) == (["b1"], [])
    stamps = {k: os.stat(out / k / "b1.parquet").st_mtime_ns for k in SCHEMAS}
    # b2 repeats one pair of b1 word for word (other rollout ids): it is not made twice
    store_batch(data, "b2", [traj("r0", tag="u1", steps=3), traj("s0", kind="plan", reward=1.0, tag="g0"),
                             traj("r1", iid="t4"), traj("s1", iid="t4", kind="plan", reward=1.0)])
    second = update_datasets(data, out, DatasetConfig())
    assert (second.built, second.reused) == (["b2"], ["b1"])
    assert {k: os.stat(out / k / "b1.parquet").st_mtime_ns for k in SCHEMAS} == stamps
    assert second.dropped["dpo.seen_before"] == 1 and second.dropped["sft.seen_before"] == 1
    assert update_datasets(data, out, DatasetConfig()).built == []
    scratch = update_datasets(data, tmp_path / "scratch", DatasetConfig())
    assert scratch.built == ["b1", "b2"] and scratch.rows == second.rows
    for kind in SCHEMAS:
        assert read_dataset(out, kind).equals(read_dataset(tmp_path / "scratch", kind))
    assert update_datasets(data, out, DatasetConfig(pairs_per_task=1)).built == ["b1", "b2"]  # new settings


def test_a_batch_built_a_few_tasks_at_a_time_equals_one_build(tmp_path, monkeypatch):
    attempts = TASK_T1 + OTHERS + [traj(f"{i}-{s}", iid=f"repo__{i}", reward=float(s == 0), sample=s)
                                   for i in range(20) for s in range(3)]
    store_batch(tmp_path / "data", "b1", attempts)
    monkeypatch.setattr(build, "CHUNK", 4)  # many runs of about 4 trajectories
    frame, _ = read_trajectories(Layout(tmp_path / "data").batch_files("b1"))
    assert len(build.task_chunks(frame)) > 10
    report = update_datasets(tmp_path / "data", tmp_path / "out", DatasetConfig())
    whole = build_rows(frame, DatasetConfig())
    for kind, schema in SCHEMAS.items():
        expected = pl.from_arrow(build.rows_table(getattr(whole, kind), schema))
        assert read_dataset(tmp_path / "out", kind).equals(expected)
    assert report.dropped == whole.dropped and report.rows["dpo"] == whole.dpo.height == 44


def test_shards_have_the_explicit_schemas_and_load_everywhere(tmp_path):
    store_batch(tmp_path / "data", "b1", TASK_T1 + [traj("a9", kind="action", reward=1.0, sample=9,
                                                         guidance_actions=(Action("submit", "{}"),), guidance_k=1)])
    update_datasets(tmp_path / "data", tmp_path / "out", DatasetConfig())
    for kind, schema in [("dpo", DPO_SCHEMA), ("sft", SFT_SCHEMA), ("actguide", ACTGUIDE_SCHEMA)]:
        (path,) = dataset_files(tmp_path / "out", kind)
        assert pq.read_schema(path) == schema and pq.read_schema(path).metadata == schema.metadata
        assert pl.read_parquet(path).height == pq.read_table(path).num_rows > 0
        loaded = datasets.load_dataset("parquet", data_files=path, split="train", cache_dir=str(tmp_path / "hf"))
        assert loaded.column_names == schema.names and loaded.num_rows == pq.read_table(path).num_rows


def test_the_divergence_shard_has_its_schema_and_choosing_the_exported_forms_rebuilds_nothing(tmp_path):
    data, out = tmp_path / "data", tmp_path / "out"
    store_batch(data, "b1", TASK_T1)
    update_datasets(data, out, DatasetConfig())
    (path,) = dataset_files(out, "dpo_divergence")
    assert pq.read_schema(path) == DPO_DIVERGENCE_SCHEMA
    assert pq.read_schema(path).metadata == DPO_DIVERGENCE_SCHEMA.metadata
    cut, start = read_dataset(out, "dpo_divergence"), read_dataset(out, "dpo")
    # TASK_T1's attempts part at their first turn: every pair is its start pair, nothing shared
    assert cut.drop("shared_turns", "shared_messages").equals(start) and set(cut["shared_messages"]) == {0}
    again = update_datasets(data, out, DatasetConfig(dpo_pair_at=("start", "divergence")))
    assert (again.built, again.reused) == ([], ["b1"])  # what the export holds changes no row


def corrupt_pages(path: Path) -> None:
    """A file whose footer is intact and whose data pages are garbage."""
    write_rows(path, [traj(f"z{i}").to_row() for i in range(50)], TRAJECTORY_SCHEMA)
    data = bytearray(path.read_bytes())
    assert len(data) - pq.ParquetFile(path).metadata.serialized_size > 3000
    data[8:3000] = bytes(b ^ 0x5A for b in data[8:3000])
    path.write_bytes(bytes(data))


V = TRAJECTORY_SCHEMA_VERSION
BAD_FILES = {
    "unknown version": (f"holds Trajectory schema 99, this version reads {V}; rerun the rollouts",
                        lambda p: write_rows(p, [traj("z").to_row()], record_schema(list(TRAJECTORY_SCHEMA), "99",
                                                                                    "Trajectory"))),
    "missing columns": (f"holds Trajectory schema {V} with other columns than this version's (missing ['messages'], "
                        "unexpected []): the schema changed without a version bump; rerun",
                        lambda p: write_rows(p, [{k: v for k, v in traj("z").to_row().items() if k != "messages"}],
                                             record_schema([f for f in TRAJECTORY_SCHEMA if f.name != "messages"],
                                                           V, "Trajectory"))),
    "not parquet": (": not a readable Parquet file (", lambda p: p.write_bytes(b"PAR1 this is not parquet at all")),
    "corrupt pages": (": corrupt Parquet data (", lambda p: corrupt_pages(p)),
    "foreign": (f"holds unnamed records schema (unversioned), this version reads Trajectory schema {V} there",
                lambda p: pl.DataFrame({"instance_id": ["t1"]}).write_parquet(p)),
}


@pytest.mark.parametrize("case", list(BAD_FILES))
def test_a_bad_trajectory_file_is_named_or_skipped(case, tmp_path):
    data = tmp_path / "data"
    store_batch(data, "b1", TASK_T1)
    bad = data / "trajectories" / "guided" / "b1" / "shards" / "z.parquet"
    bad.parent.mkdir(parents=True)
    expected, write = BAD_FILES[case]
    write(bad)
    with pytest.raises(BadTrajectoryFile) as info:
        update_datasets(data, tmp_path / "out", DatasetConfig())
    assert str(info.value).startswith(str(bad)) and expected in str(info.value)
    assert str(info.value).endswith("datasets.skip_bad_files: true builds without it")
    report = update_datasets(data, tmp_path / "out", DatasetConfig(skip_bad_files=True))
    assert [s.path for s in report.skipped_files] == [str(bad)] and expected in report.skipped_files[0].reason
    assert report.rows["dpo"] == 4




def present(messages) -> list[dict]:
    """Chat messages without their null fields (how Trajectory records hold them)."""
    return [{k: v for k, v in m.items() if v is not None} for m in messages]


def check_rows_against_stored_attempts(data: Path) -> int:
    """On a pipeline's output: every DPO row's prompt is its chosen attempt's unguided prompt, its sides are the
    stored completions, no guidance text anywhere; returns the rows checked (the pipeline test calls it)."""
    checked = 0
    gold_path = data / "tasks" / "tasks.parquet"
    gold = dict(pl.read_parquet(gold_path).select("instance_id", "patch").iter_rows()) if gold_path.exists() else {}
    for batch in Layout(data).batch_names():
        files = Layout(data).batch_files(batch)
        frame, skipped = read_trajectories(files)
        stored = {r["rollout_id"]: Trajectory.from_row(r) for f in files for r in pq.read_table(f).to_pylist()}
        assert skipped == []
        for with_gold in (None, gold):
            rows = build_rows(frame, DatasetConfig(), gold=with_gold)
            for row in rows.dpo.iter_rows(named=True):
                chosen, rejected = stored[row["chosen_rollout_id"]], stored[row["rejected_rollout_id"]]
                assert present(row["prompt"]) == list(chosen.unguided_prompt) == list(rejected.unguided_prompt)
                assert present(row["chosen"]) == list(chosen.messages[len(chosen.prompt):])
                assert present(row["rejected"]) == list(rejected.messages[len(rejected.prompt):])
                assert not [s for s in strings(row) if chosen.guidance_text and chosen.guidance_text in s]
                assert rejected.reward <= 0 < chosen.reward and rejected.guidance_kind == "none"
                assert not (chosen.infra_error or rejected.infra_error or chosen.quotes_guidance)
                checked += 1
    return checked


def test_reasoning_the_model_returned_stays_with_its_message_in_dpo_and_sft_rows():
    thought = {"role": "assistant", "content": "done u2", "reasoning_content": "the sum is off by one"}
    solved = traj("u2", reward=1.0, sample=2)
    solved = dataclasses.replace(solved, messages=solved.messages[:-1] + (thought,))
    rows = build_rows([traj("u0"), solved], DatasetConfig())
    [chosen] = rows.dpo["chosen"].to_list()
    assert chosen[-1]["reasoning_content"] == "the sum is off by one"
    assert rows.sft["messages"].to_list()[0][-1]["reasoning_content"] == "the sum is off by one"
    assert all(m["reasoning_content"] is None for m in chosen[:-1])


def test_rows_take_the_split_of_their_tasks_split_group():
    ids = [f"t{i}" for i in range(40)]
    own = {i: task_split(i, 0.5) for i in ids}
    a, b = next((x, y) for x in ids for y in ids if own[x] == "train" and own[y] == "test")
    tasks = [traj("u0", iid=a), traj("u1", iid=a, reward=1.0, sample=1),
             traj("v0", iid=b), traj("v1", iid=b, reward=1.0, sample=1)]
    alone = build_rows(tasks, DatasetConfig(test_fraction=0.5))
    assert dict(alone.dpo.select("instance_id", "split").iter_rows()) == {a: "train", b: "test"}
    together = build_rows(tasks, DatasetConfig(test_fraction=0.5), task_groups={a: "pkg:mod.py", b: "pkg:mod.py"})
    shared = task_split("pkg:mod.py", 0.5)
    for kind in ("dpo", "sft", "actguide"):
        frame = getattr(together, kind)
        assert frame.height and set(frame["split"]) == {shared}, kind
