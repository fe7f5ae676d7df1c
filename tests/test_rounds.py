"""Rounds of the loop: a batch records the policy that rolled it out, the next batch rolls out with the checkpoint
the previous round trained, training in a later round starts from the stage's earlier checkpoint on its rounds'
rows, and the lineage reads back from the record, the dataset card and the run folders.

The two-round test runs the real parts on this host: LocalTaskSandboxes (tests/test_batch_local.py's repository,
no Docker), the heuristic as round 0's policy, the tiny model trained by the sft_model asset, and its checkpoint as
the local HF policy in round 1. The tiny checkpoint solves nothing after two steps, so round 1 makes no SFT row of
its own: on-policy (`rounds_window: 1`) its run is refused, and a window of two rounds trains on from the first
checkpoint.
"""

from __future__ import annotations

import dataclasses
import json
import subprocess

import dagster as dg
import polars as pl
import pytest

from assets.graph import all_assets
from assets.resources import Credentials, HandholdSettings
from pipeline.agent.factory import PolicySpec, make_policy
from pipeline.agent.identity import weights_revision
from pipeline.agent.loop import AgentConfig
from pipeline.datasets import DatasetConfig, build_rows, read_dataset, update_datasets
from pipeline.datasets.card import CardInfo
from pipeline.datasets.export import export_dataset
from pipeline.datasets.release import Provenance, cut_release
from pipeline.datasets.release import training_rows
from pipeline.core.layout import Layout
from pipeline.core.records import TRAJECTORY_SCHEMA, Task
from pipeline.rollouts.round_report import lineage, lineage_rows, needed_guidance_before, round_outcome
from pipeline.rollouts.rounds import (RoundError, RoundRecord, TrainedBy, finish_round, plan_round, read_round, start_round,
                             training_start, window_batches, write_round)
from pipeline.rollouts.batch import RolloutConfig, plan_jobs, run_batch
from assets.settings import SettingsError, from_mapping, HandholdConfig
from pipeline.core.store import write_rows
from pipeline.verifier.environment import LocalTaskSandboxes
from pipeline.core.vocab import DATASET_KINDS
from tests.loopback import OpenAIServer, Reply, ToolCall, _Handler
from tests.test_batch_local import calc_task, make_repo
from tests.test_datasets_build import traj
from training.common import TrainingDataError, read_split, rows_of_batches

ROLLOUT = RolloutConfig(attempts=1, workers=1, agent=AgentConfig(max_steps=12))
SFT = {"learning_rate": 1e-3, "lr_scheduler": "constant", "warmup": 0, "per_device_batch_size": 1,
       "gradient_accumulation_steps": 1, "max_steps": 2, "max_length": 8192}


def words_repo(path):
    """A repository whose greet() returns a constant no one-line repair of the heuristic's reaches."""
    (path / "tests").mkdir(parents=True)
    (path / "words.py").write_text("def greet(name):\n    return 'hi'\n")
    (path / "tests" / "test_words.py").write_text(
        "from words import greet\n\n\ndef test_greet():\n    assert greet('ann') == 'hello ann'\n")
    git = ["git", "-c", "user.name=t", "-c", "user.email=t@t", "-c", "init.defaultBranch=main"]
    for command in (["init", "-q"], ["add", "-A"], ["commit", "-qm", "init"]):
        subprocess.run([*git, *command], cwd=path, check=True)
    return path


def words_task() -> Task:
    return dataclasses.replace(calc_task("words__1"), repo="demo/words", image="local/words",
                               problem_statement="greet('ann') returns 'hi' instead of 'hello ann'.",
                               FAIL_TO_PASS=("tests/test_words.py::test_greet",), PASS_TO_PASS=(),
                               patch="diff --git a/words.py b/words.py\n", workdir=".")


@pytest.fixture
def local(tmp_path, monkeypatch):
    monkeypatch.setenv("DOCKER_HOST", f"unix://{tmp_path}/no-engine.sock")  # no engine: nothing to reap either
    return LocalTaskSandboxes(repos={"local/calc": str(make_repo(tmp_path / "calc")),
                                     "local/words": str(words_repo(tmp_path / "words"))})


def roll(layout: Layout, spec: PolicySpec, batch: str, tasks: list[Task], sandboxes) -> RoundRecord:
    """What unguided_rollouts does, on local sandboxes: the round started, its attempts, its outcome recorded."""
    record, policy_spec = start_round(layout, spec, batch)
    policy = make_policy(policy_spec)
    summary = run_batch(plan_jobs(tasks, policy, ROLLOUT, batch), policy, ROLLOUT,
                        layout.trajectories("unguided", batch), batch, sandboxes=sandboxes)
    return finish_round(layout, record, round_outcome(layout, batch, summary.trajectories, 0.0))


def export(layout: Layout, batch: str, tasks: list[Task]) -> None:
    """What the datasets and dataset_export assets do: every batch's rows, exported, released with the lineage."""
    update_datasets(layout.root, layout.dataset_rows(), DatasetConfig(test_fraction=0.0),
                    {t.instance_id: t.patch for t in tasks})
    tables = {kind: read_dataset(layout.dataset_rows(), kind) for kind in DATASET_KINDS}
    tables["trajectories"] = pl.concat([pl.read_parquet(f) for f in layout.trajectory_files()], how="diagonal_relaxed")
    export_dataset(layout.export(), tables, CardInfo("rounds", run_id=batch))
    cut_release(layout.export(), layout.releases(), Provenance(batch, lineage=tuple(lineage_rows(lineage(layout)))))


def train(layout: Layout, spec: PolicySpec, model: str, batch: str, window: int):
    """The sft_model asset for `batch`, every other stage off; its materialization, or the failure's message."""
    settings = HandholdSettings(data_dir=str(layout.root), batch=batch, policy=dataclasses.asdict(spec), training={
        "model": model, "rounds_window": window, "sft": SFT, "dpo": {"enabled": False},
        "actguide": {"enabled": False}})
    result = dg.materialize(all_assets, selection=["sft_model"], raise_on_error=False,
                            resources={"settings": settings, "credentials": Credentials()})
    if not result.success:
        [failure] = result.get_step_failure_events()
        error = failure.event_specific_data.error
        while error.cause:
            error = error.cause
        return error.message
    return result.get_asset_materialization_events()[0].step_materialization_data.materialization.metadata


@pytest.mark.timeout(600)
def test_round_one_rolls_out_with_round_zeros_checkpoint_and_trains_on_from_it(local, tiny_model, tmp_path):
    layout, tasks = Layout(tmp_path / "data"), [dataclasses.replace(calc_task("calc__1"), workdir="."), words_task()]
    spec = PolicySpec(kind="heuristic", temperature=1.0, max_tokens=32, from_stage="sft")

    first = roll(layout, spec, "r0", tasks, local)  # the heuristic solves calc, not words
    assert (first.round, first.kind, first.revision, first.trained_by) == (0, "heuristic", "", TrainedBy())
    assert first.outcome.measured and first.outcome.needed_guidance == ()  # no earlier round
    export(layout, "r0", tasks)
    trained = train(layout, spec, str(tiny_model), "r0", window=1)
    assert trained["starting_model"].value == str(tiny_model) and trained["round"].value == 0
    checkpoint = tmp_path / "data/models/sft/r0/checkpoint"
    digest = weights_revision(checkpoint)
    assert digest.startswith("sha256:") and digest != weights_revision(tiny_model)

    second = roll(layout, spec, "r1", tasks, local)  # the batch says which checkpoint rolled it out, and why
    assert read_round(layout, "r1") == second
    assert (second.round, second.kind, second.model, second.revision) == (1, "hf", str(checkpoint), digest)
    assert (second.trained_by.stage, second.trained_by.batch, second.trained_by.round) == ("sft", "r0", 0)
    assert (second.trained_by.starting_model, second.trained_by.dataset_release) == (str(tiny_model), "r0")
    attempts = pl.read_parquet(layout.trajectory_file("unguided", "r1"))
    assert set(attempts["policy"]) == {f"hf:{checkpoint}"}
    assert set(attempts["policy_revision"]) == {digest}  # made by round 0's checkpoint, not the starting model
    assert set(attempts["temperature"]) == {1.0}  # sampled at policy.temperature: N attempts need diversity
    assert second.outcome.needed_guidance == ("words__1",)  # calc was solved in r0: it needed no guidance
    assert second.outcome.solved == () and second.outcome.share == 0.0
    export(layout, "r1", tasks)

    refused = train(layout, spec, str(tiny_model), "r1", window=1)  # on-policy: r1's rows only, and it has none
    assert "comes from the batches this run trains on (r1: training.rounds_window)" in refused
    assert "they come from r0" in refused and "training.rounds_window to 0" in refused
    windowed = train(layout, spec, str(tiny_model), "r1", window=2)
    assert windowed["starting_model"].value == str(checkpoint) and windowed["round"].value == 1
    assert windowed["rows_of_batches"].value == "r0, r1" and windowed["rows"].value == trained["rows"].value
    used = json.loads((tmp_path / "data/models/sft/r1/config.json").read_text())["round"]
    assert used == {"round": 1, "starting_model": str(checkpoint), "reference_model": str(checkpoint),
                    "starting_model_round": 0, "starting_model_batch": "r0", "rounds_window": 2,
                    "rows_of_batches": ["r0", "r1"]}
    losses = [json.loads((tmp_path / f"data/models/sft/{b}/metrics.jsonl").read_text().splitlines()[0])["loss"]
              for b in ("r0", "r1")]
    assert losses[1] < losses[0]  # the same rows, from the checkpoint that trained on them: not from the start

    card = (layout.export() / "README.md").read_text()  # the release of r1 says which policy made which rows
    assert "| batch | round | policy | weights | trained by | on dataset | solved without guidance |" in card
    assert "| r0 | 0 | heuristic | - | - | - | - |" in card
    made = second.trained_by.dataset_sha256[:12]
    assert f"| r1 | 1 | hf {checkpoint} | {digest[:19]} | sft in r0 (round 0) | r0 ({made}) | 0/1 (0%) |" in card
    assert "Training rows: each run trains on its own round's batches only (on-policy, training.rounds_window: 1)." \
        in card  # export() releases under the default window


def test_the_release_says_which_rows_a_training_run_takes():
    assert training_rows(0) == "each run trains on every batch's rows (training.rounds_window: 0)"
    assert training_rows(3) == ("each run trains on the batches of the latest 3 rounds up to its own "
                                "(training.rounds_window: 3)")


def test_a_served_checkpoint_must_be_listed_by_the_server_before_the_batch_starts(local, tmp_path):
    layout = Layout(tmp_path / "data")
    (tmp_path / "data/models/sft/b0/checkpoint").mkdir(parents=True)
    spec = PolicySpec(kind="openai", model="base", temperature=1.0, max_tokens=32, from_stage="sft")
    with OpenAIServer([]) as base_url:
        with pytest.raises(RoundError, match=r"served as 'sft-b0', but the server at .* lists \['loopback'\]; "
                                             r"serve it \(`vllm serve .*/models/sft/b0/checkpoint --served-model-name "
                                             r"sft-b0`"):
            start_round(layout, dataclasses.replace(spec, base_url=base_url), "b1")
    assert read_round(layout, "b1") is None  # refused before anything was recorded

    server = Serving(["sft-b0"], [Reply(tool_calls=(ToolCall("submit", {}),))])
    with server as base_url:
        record, served = start_round(layout, dataclasses.replace(spec, base_url=base_url), "b1")
        assert (record.round, record.kind, record.model, record.served_at) == (1, "openai", "sft-b0", base_url)
        assert (served.kind, served.model, served.base_url, served.from_stage) == ("openai", "sft-b0", base_url, "")
        task = dataclasses.replace(calc_task(), workdir=".")
        policy = make_policy(served, api_key="x")
        run_batch(plan_jobs([task], policy, ROLLOUT, "b1"), policy, ROLLOUT, tmp_path / "b1", "b1", sandboxes=local)
    assert server.requests[0]["model"] == "sft-b0" and not server.errors


class ServingHandler(_Handler):
    def do_GET(self) -> None:
        if self.path == "/v1/models":
            listed = [{"id": m, "object": "model"} for m in self.owner.served]
            return self._send(200, {"object": "list", "data": listed})
        return super().do_GET()


class Serving(OpenAIServer):
    """The loopback OpenAI server listing `served` as its models."""

    handler = ServingHandler

    def __init__(self, served: list[str], script, **kwargs):
        super().__init__(script, **kwargs)
        self.served = served


def test_a_batch_keeps_its_round_and_a_round_starts_from_the_newest_earlier_checkpoint(tmp_path):
    layout = Layout(tmp_path / "data")
    spec = PolicySpec(kind="heuristic", from_stage="dpo")
    for batch in ("a", "c"):  # checkpoints of dpo in a and c; sft's of b is another stage's
        (tmp_path / f"data/models/dpo/{batch}/checkpoint").mkdir(parents=True)
    (tmp_path / "data/models/sft/b/checkpoint").mkdir(parents=True)
    write_round(layout, RoundRecord("a", 0, "heuristic"))
    write_round(layout, RoundRecord("c", 4, "hf"))
    assert plan_round(layout, spec, "a").round == 0  # nothing earlier than a
    at_b = plan_round(layout, spec, "b")
    assert (at_b.round, at_b.trained_by.batch, at_b.model) == (1, "a", str(tmp_path / "data/models/dpo/a/checkpoint"))
    assert plan_round(layout, spec, "d").trained_by.batch == "c" and plan_round(layout, spec, "d").round == 5
    assert plan_round(layout, dataclasses.replace(spec, from_stage=""), "d").round == 0
    record, _ = start_round(layout, spec, "b")
    (tmp_path / "data/models/dpo/a2/checkpoint").mkdir(parents=True)  # newer, but the batch already started
    assert start_round(layout, spec, "b")[0] == record == read_round(layout, "b")
    assert plan_round(layout, spec, "b").trained_by.batch == "a2"


@pytest.mark.parametrize("batch, window, expected", [
    ("d", 1, ("d",)), ("d", 2, ("b", "c", "d")), ("d", 3, ("a", "b", "c", "d")), ("d", 0, None),
    ("c", 1, ("b", "c")), ("c", 2, ("a", "b", "c")), ("a", 1, ("a",)), ("e", 1, ("a", "e"))])
def test_the_rounds_window_takes_the_batches_of_the_latest_rounds_up_to_the_runs_own(tmp_path, batch, window,
                                                                                     expected):
    layout = Layout(tmp_path / "data")
    for name, number in {"a": 0, "b": 1, "c": 1, "d": 2, "f": 1}.items():  # e: no record (round 0); f: later
        write_round(layout, RoundRecord(name, number, "hf"))
    layout.trajectories("guided", "e").mkdir()
    assert window_batches(layout, batch, window) == expected


def test_training_starts_from_the_stages_checkpoint_of_an_earlier_batch_from_round_one_on(tmp_path):
    layout = Layout(tmp_path / "data")
    write_round(layout, RoundRecord("a", 0, "heuristic"))
    write_round(layout, RoundRecord("b", 1, "hf"))
    (tmp_path / "data/models/sft/a/checkpoint").mkdir(parents=True)
    (tmp_path / "data/models/sft/a/config.json").write_text(json.dumps({"starting_model": "base", "round": {
        "round": 0}}))
    (tmp_path / "data/models/sft/b/checkpoint").mkdir(parents=True)  # b's own run: never its own start
    assert training_start(layout, "sft", "a", "base", False, 1).model == "base"  # round 0
    start = training_start(layout, "sft", "b", "base", False, 1)
    assert (start.round, start.model, start.made_by.batch, start.batches) == (
        1, str(tmp_path / "data/models/sft/a/checkpoint"), "a", ("b",))
    assert start.as_config()["round"]["reference_model"] == start.model
    assert training_start(layout, "sft", "b", "base", True, 1).model == "base"  # restart_from_base
    assert training_start(layout, "dpo", "b", "base", False, 0).model == "base"  # no dpo checkpoint yet


def test_the_solved_share_counts_only_tasks_an_earlier_batch_failed_that_this_batch_attempted(tmp_path):
    layout = Layout(tmp_path / "data")

    def store(batch: str, attempts: list[tuple[str, float, str]]) -> list:
        rows = [traj(f"{batch}-{i}", iid, reward=reward, batch=batch, sample=i, infra_error=infra)
                for i, (iid, reward, infra) in enumerate(attempts)]
        write_rows(layout.trajectory_file("unguided", batch), [t.to_row() for t in rows], TRAJECTORY_SCHEMA)
        return rows

    store("a", [("u", 0.0, ""), ("u", 0.0, ""), ("x", 0.0, ""), ("y", 0.0, ""), ("y", 1.0, ""),
                ("z", 1.0, "sandbox: gone"), ("z", 0.0, "sandbox: gone"), ("v", 0.0, "")])
    store("c", [("w", 0.0, "")])  # a later batch's failure is no earlier round's
    now = store("b", [("u", 0.0, ""), ("u", 0.0, ""), ("x", 0.0, ""), ("x", 1.0, ""), ("y", 0.0, ""),
                      ("z", 0.0, ""), ("w", 0.0, ""), ("t", 0.0, "sandbox: gone"), ("v", 1.0, "sandbox: gone")])
    assert needed_guidance_before(layout, "b", 0.0) == {"u", "v", "x"}  # y had a success; z no graded attempt
    outcome = round_outcome(layout, "b", now, 0.0)
    assert (outcome.needed_guidance, outcome.solved, outcome.share) == (("u", "x"), ("x",), 0.5)
    assert round_outcome(layout, "b", now, 1.0).needed_guidance == ("u", "x", "y")  # delta: reward 1 is no success


def test_from_stage_needs_a_policy_that_can_run_a_checkpoint():
    with pytest.raises(SettingsError, match="policy.kind is anthropic, which cannot run a checkpoint"):
        from_mapping(HandholdConfig, {"policy": {"kind": "anthropic", "model": "m", "from_stage": "dpo"}}, "test")
    with pytest.raises(SettingsError, match="training.rounds_window is -1"):
        from_mapping(HandholdConfig, {"training": {"rounds_window": -1}}, "test")


def test_a_pipes_launch_trains_only_on_the_rows_of_the_batches_its_spec_names(tmp_path):
    from training.config import SFTTrainingConfig
    from training.launch import write_spec
    from training.run import main

    config = DatasetConfig(test_fraction=0.0)
    rows = pl.concat([build_rows([traj("s0", reward=1.0, batch="b0")], config).sft,
                      build_rows([traj("s1", reward=1.0, batch="b1", tag="other")], config).sft])
    assert rows["batch"].to_list() == ["b0", "b1"]
    export_dataset(tmp_path / "hf", {"sft": rows}, CardInfo("window", run_id="b1"))
    spec = write_spec(SFTTrainingConfig(), "no-model-is-loaded", tmp_path / "hf", tmp_path / "run", batches=("b2",))
    assert json.loads(spec.read_text())["batches"] == ["b2"]
    with pytest.raises(TrainingDataError, match=r"none of the 2 'sft' train rows comes from the batches this run "
                                                r"trains on \(b2: training.rounds_window\), they come from b0, b1"):
        main(["sft", "--spec", str(spec)])
    with rows_of_batches(("b1",)):
        assert read_split(tmp_path / "hf", "sft")["rollout_id"] == ["s1"]
    assert read_split(tmp_path / "hf", "sft")["rollout_id"] == ["s0", "s1"]  # outside: every row
