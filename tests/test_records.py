"""Every persisted record round-trips through real Parquet files, and readers refuse another contract."""

from __future__ import annotations

import dataclasses

import datasets
import polars as pl
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from pipeline.core.records import ACTION_SCHEMA, MESSAGE_SCHEMA, STEP_SCHEMA, Action, Message, Step
from pipeline.core.records import (GUIDANCE_PLAN_SCHEMA, GUIDANCE_SCHEMA, REJECT_SCHEMA, TASK_SCHEMA, TRAJECTORY_SCHEMA,
                              Guidance, GuidancePlan, RejectedTask, Task, Trajectory)
from pipeline.rollouts.batch import RolloutConfig, run_batch
from pipeline.core.schema import from_row, record_schema, to_row
from pipeline.core.store import RecordContractError, read_records, write_rows

CALL = {"id": "call_1", "type": "function", "function": {"name": "bash", "arguments": '{"command": "ls"}'}}
PROMPT = ({"role": "system", "content": "You fix bugs."}, {"role": "user", "content": "Fix `add` — ünïcode."})
MESSAGES = PROMPT + ({"role": "assistant", "content": None, "tool_calls": [CALL], "reasoning_content": "ls first"},
                     {"role": "tool", "tool_call_id": "call_1", "content": "exit code: 0\nsrc"})
ACTIONS = (Action("bash", '{"command": "ls"}'), Action("submit", "{}"))

TASK = Task(instance_id="pkg__1", repo="pkg", base_commit="abc", patch="--- a\n+++ b\n", test_patch="",
            problem_statement="add is wrong", FAIL_TO_PASS=("tests/test_a.py::test_add",),
            PASS_TO_PASS=("tests/test_a.py::test_sub", "tests/test_a.py::test_mul"), image="img", workdir="/testbed",
            test_cmd="pytest", log_parser="parse_log_pytest", source="synth", test_files=("tests/test_a.py",),
            certificate_containers=3, certificate_gold_resolved=3, certificate_empty_failed=3,
            certificate_orders=("file/suite", "shuffled-7/suite", "file/suite"), certificate_gold_seconds=1.5,
            certificate_empty_seconds=1.75)
TRAJECTORY = Trajectory(
    rollout_id="r1", group_id="g1", batch="b", instance_id="pkg__1", sample_index=1, seed=7, policy="heuristic",
    policy_settings='{"kind": "heuristic"}', guidance_kind="action", guidance_text="hint", guidance_actions=ACTIONS,
    guidance_k=1, teacher="reference", prompt=PROMPT, unguided_prompt=PROMPT[:1], messages=MESSAGES,
    tools='[{"type": "function"}]', steps=(Step(0.5, 0.25, 10, 3, "bash", False), Step(0.125, 0.0, 12, 1, "", True)),
    logprobs=((-0.5, -1.25), None), patch="diff --git a/x b/x\n", reward=1.0, resolved=True, grade_reason="resolved",
    report='{"FAIL_TO_PASS": {}}', test_log="PASSED", dropped_files=("tests/conftest.py",),
    enforcement=("restored tests/test_a.py",), suspicious=("os._exit in pkg/a.py",), exit_status="submitted",
    infra_error="", error="", infra_retries=1, format_errors=2, total_tokens=26, wall_time=3.5, grade_time=1.5,
    quotes_guidance=False, created_at="2026-11-30T00:00:00Z", prompt_token_ids=((5, 6, 7), None),
    token_ids=((8, 9), None), policy_model="hf:tiny", policy_revision="sha256:ab", chat_template_hash="cd",
    temperature=0.7, top_p=0.95, top_k=20)

RECORDS = [
    (TASK, TASK_SCHEMA),
    (RejectedTask("pkg__2", "validate", "gold patch does not resolve it"), REJECT_SCHEMA),
    (Message("assistant", None, '[{"id": "call_1"}]', None), MESSAGE_SCHEMA),
    (ACTIONS[0], ACTION_SCHEMA),
    (Step(0.5, 0.25, 10, 3, "bash", False), STEP_SCHEMA),
    (Guidance("action", "hint", ACTIONS, 1, "reference"), GUIDANCE_SCHEMA),
    (GuidancePlan("pkg__1", "plan", "Look at add.", "rule", files=("pkg/a.py",), functions=("add",), leaked=True,
                  accepted=False, reason="guidance copies the gold patch", actions=ACTIONS, K=2, k_star=1),
     GUIDANCE_PLAN_SCHEMA),
    (TRAJECTORY, TRAJECTORY_SCHEMA),
    (dataclasses.replace(TRAJECTORY, logprobs=None, prompt_token_ids=None, token_ids=None, steps=(),
                         guidance_actions=(), exit_status="crashed",
                         infra_error="crashed: RuntimeError: boom", error="Traceback ...\nRuntimeError: boom"),
     TRAJECTORY_SCHEMA),
]


@pytest.mark.parametrize("record,schema", RECORDS, ids=lambda x: type(x).__name__)
def test_records_round_trip_and_load_everywhere(record, schema, tmp_path):
    assert [f.name for f in dataclasses.fields(record)] == schema.names
    path = write_rows(tmp_path / "r.parquet", [to_row(record), to_row(record)], schema)
    assert [from_row(type(record), row) for row in read_records(path, schema)] == [record, record]
    assert pq.read_schema(path).remove_metadata() == schema.remove_metadata()
    assert pq.read_table(path).num_rows == 2
    assert pl.read_parquet(path).columns == schema.names
    loaded = datasets.load_dataset("parquet", data_files=str(path), split="train", cache_dir=str(tmp_path / "hf"))
    assert loaded.num_rows == 2 and loaded.column_names == schema.names


def test_action_and_guidance_records_take_plain_dicts():
    action = {"name": "edit", "args": {"path": "a.py", "new_str": "ü"}}
    assert Action.of(action) == Action("edit", '{"path": "a.py", "new_str": "ü"}')
    assert Action.of(action).as_dict() == action
    assert Guidance("action", "h", (action,), 1).actions == (Action.of(action),)
    assert GuidancePlan("i", "action", "h", "", actions=[action]).actions == (Action.of(action),)
    assert Message.from_openai(MESSAGES[2]).to_openai() == MESSAGES[2]
    assert Message.from_openai(MESSAGES[3]) == Message("tool", "exit code: 0\nsrc", None, "call_1")


def older(schema: pa.Schema, version: str, record: str | None = None) -> pa.Schema:
    meta = {k.decode(): v.decode() for k, v in schema.metadata.items()}
    return record_schema(list(schema), version, record or meta["record"])


def test_an_older_version_names_the_asset_to_rematerialize(tmp_path):
    path = tmp_path / "data/trajectories/unguided/2026-11-30/trajectories.parquet"
    write_rows(path, [TRAJECTORY.to_row()], older(TRAJECTORY_SCHEMA, "1"))
    with pytest.raises(RecordContractError) as info:
        read_records(path, TRAJECTORY_SCHEMA, produced_by="unguided_rollouts", batch="2026-11-30")
    assert str(info.value) == (f"{path} holds Trajectory schema 1, this version reads 4: "
                               "rematerialize unguided_rollouts for batch 2026-11-30")


def test_another_record_kind_names_the_asset_to_rematerialize(tmp_path):
    path = tmp_path / "data/guidance/b/guidance.parquet"
    write_rows(path, [TRAJECTORY.to_row()], TRAJECTORY_SCHEMA)
    with pytest.raises(RecordContractError) as info:
        read_records(path, GUIDANCE_PLAN_SCHEMA, produced_by="guidance", batch="b")
    assert str(info.value) == (f"{path} holds Trajectory schema 4, this version reads GuidancePlan schema 4 there: "
                               "rematerialize guidance for batch b")


def test_other_columns_under_the_same_version_and_foreign_files_are_refused(tmp_path):
    path = write_rows(tmp_path / "tasks.parquet", [{"item": "x", "stage": "s", "reason": "r"}],
                      older(REJECT_SCHEMA, TASK_SCHEMA.metadata[b"schema_version"].decode(), "Task"))
    with pytest.raises(RecordContractError) as info:
        read_records(path, TASK_SCHEMA, produced_by="tasks")
    assert str(info.value).startswith(f"{path} holds Task schema 2 with other columns than this version's (missing "
                                      "['FAIL_TO_PASS', ")
    assert str(info.value).endswith("unexpected ['item', 'reason', 'stage']): the schema changed without a version "
                                    "bump: rematerialize tasks")
    foreign = tmp_path / "foreign.parquet"
    pl.DataFrame({"instance_id": ["x"]}).write_parquet(foreign)
    with pytest.raises(RecordContractError, match="holds unnamed records schema \\(unversioned\\), this version reads "
                                                  "Task schema 2 there: rewrite it with this version$"):
        read_records(foreign, TASK_SCHEMA)


def test_a_missing_file_names_the_asset_that_makes_it(tmp_path):
    path = tmp_path / "data/tasks/tasks.parquet"
    with pytest.raises(FileNotFoundError) as info:
        read_records(path, TASK_SCHEMA, produced_by="tasks")
    assert str(info.value) == f"{path} does not exist: materialize tasks"


def test_a_batch_stored_under_an_older_contract_is_set_aside_and_rerun(tmp_path):
    out = tmp_path / "u"
    write_rows(out / "trajectories.parquet", [TRAJECTORY.to_row()], older(TRAJECTORY_SCHEMA, "1"))
    said: list[str] = []
    summary = run_batch([], None, RolloutConfig(), out, "u", progress=said.append)  # type: ignore[arg-type]
    (aside,) = out.glob("stale-*")
    assert [p.name for p in aside.iterdir()] == ["trajectories.parquet"]
    assert said == [f"{out / 'trajectories.parquet'} holds Trajectory schema 1, this version reads 4: rewrite it "
                    f"with this version; moved its stored attempts to {aside} and running the whole batch"]
    assert summary.trajectories == [] and read_records(out / "trajectories.parquet", TRAJECTORY_SCHEMA) == []


def test_a_schema_is_derived_from_its_dataclass():
    from dataclasses import dataclass

    import pyarrow as pa
    import pytest

    from pipeline.core.records import Action
    from pipeline.core.schema import fields_of

    @dataclass(frozen=True)
    class Row:
        name: str
        count: int
        note: str | None
        tags: tuple[str, ...]
        actions: tuple[Action, ...]
        blob: tuple[dict, ...] = ()

    fields = fields_of(Row, stored_as={"blob": pa.string()})
    assert [(f.name, f.type, f.nullable) for f in fields] == [
        ("name", pa.string(), False), ("count", pa.int64(), False), ("note", pa.string(), True),
        ("tags", pa.list_(pa.string()), False), ("actions", pa.list_(pa.struct(fields_of(Action))), False),
        ("blob", pa.string(), False)]
    with pytest.raises(TypeError, match=r"Row.blob: .* give the column's type in stored_as"):
        fields_of(Row)
