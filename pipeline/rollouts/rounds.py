"""Rounds of the loop: which policy rolled a batch out, what made that policy, and what it now solves alone.

A batch's round record (`Layout.round_record`, JSON beside its unguided attempts) is written when its unguided
rollouts start and read by every later stage of the batch, so a resumed batch keeps its policy. Round 0 is the
policy the settings name. With `policy.from_stage` set, a batch rolls out with the latest checkpoint that stage
made in an earlier batch (by batch name: the training run folder of the newest earlier batch holding a
`checkpoint/`), in process (kind hf, sampled at `policy.temperature`) or served (kind openai: the server must
list the model `<stage>-<batch>`); its round is that run's round + 1. The record says which run made the
checkpoint, from which model, on which dataset release.

What the loop achieved (the record's `outcome`, the rollouts' metadata): of this batch's tasks that needed
guidance in an earlier batch (an unguided group none of whose attempts succeeded), the share the batch's policy
now solves without guidance (an attempt with reward above delta).
"""

from __future__ import annotations

import dataclasses
import json
import os
import time
from dataclasses import dataclass, field
from pathlib import Path

from pipeline.agent.factory import PolicySpec
from pipeline.agent.identity import weights_revision
from pipeline.core.config_tree import SettingsError, from_mapping
from pipeline.core.layout import Layout

ROUND_VERSION = "1"


class RoundError(ValueError):
    """A batch cannot roll out with the policy its round names (a server not serving the checkpoint, ...)."""


@dataclass(frozen=True)
class TrainedBy:
    """The training run that made a round's checkpoint; every field empty for the policy the settings name."""

    stage: str = ""
    batch: str = ""
    """The batch the run's folder is named by (layout.training_run)."""
    round: int = -1
    """The round of that batch: the policy whose rows the run trained on."""
    checkpoint: str = ""
    starting_model: str = ""
    """What the run started from (its config.json)."""
    dataset_release: str = ""
    dataset_sha256: str = ""
    """The exported rows it read (its dataset.json)."""


@dataclass(frozen=True)
class RoundOutcome:
    """What the round's policy solved without guidance, written when its unguided rollouts finished."""

    measured: bool = False
    needed_guidance: tuple[str, ...] = ()
    """The batch's tasks with a failed unguided group in an earlier batch."""
    solved: tuple[str, ...] = ()
    """Of those, the ones an unguided attempt of this batch solved."""

    @property
    def share(self) -> float | None:
        return len(self.solved) / len(self.needed_guidance) if self.needed_guidance else None


@dataclass(frozen=True)
class RoundRecord:
    """Which policy rolled a batch out (round.json)."""

    batch: str
    round: int
    kind: str
    """The policy kind it ran as: the settings' (round 0), hf (a checkpoint in process) or openai (served)."""
    model: str = ""
    """The checkpoint's path (hf), the name the server serves it under (openai), or the settings' model."""
    revision: str = ""
    """The weights' digest (identity.weights_revision) of the checkpoint or local model; '' for none on disk."""
    served_at: str = ""
    temperature: float = 1.0
    from_stage: str = ""
    """policy.from_stage when the batch started."""
    trained_by: TrainedBy = field(default_factory=TrainedBy)
    outcome: RoundOutcome = field(default_factory=RoundOutcome)
    created: str = ""
    schema_version: str = ROUND_VERSION


def read_round(layout: Layout, batch: str) -> RoundRecord | None:
    """The batch's round record; None before its unguided rollouts started."""
    path = layout.round_record(batch)
    if not path.exists():
        return None
    data = json.loads(path.read_text())
    if data.get("schema_version") != ROUND_VERSION:
        raise RoundError(f"{path} is round record version {data.get('schema_version')!r}, this code reads "
                         f"{ROUND_VERSION!r}: move it aside and rematerialize unguided_rollouts for batch {batch}")
    try:
        return from_mapping(RoundRecord, data, str(path))
    except SettingsError as exc:
        raise RoundError(f"{exc}; move it aside and rematerialize unguided_rollouts for batch {batch}") from exc


def write_round(layout: Layout, record: RoundRecord) -> Path:
    """Store the record (written to a temporary name, then renamed)."""
    path = layout.round_record(record.batch)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps(dataclasses.asdict(record), indent=2) + "\n")
    os.replace(tmp, path)
    return path


def round_of(layout: Layout, batch: str) -> int:
    """The batch's round (0 without a record: the settings' policy)."""
    record = read_round(layout, batch)
    return record.round if record else 0


def latest_checkpoint(layout: Layout, stage: str, batch: str) -> str:
    """The newest batch named before `batch` whose `stage` run left a checkpoint; '' when none did."""
    earlier = [b for b in layout.checkpoint_batches(stage) if b < batch]
    return earlier[-1] if earlier else ""


def trained_by(layout: Layout, stage: str, batch: str) -> TrainedBy:
    """What the run folder of `stage` in `batch` says made its checkpoint."""
    folder = layout.training_run(stage, batch)
    used = _json(folder / "config.json")
    read = _json(folder / "dataset.json")
    start = used.get("round", {})
    return TrainedBy(stage=stage, batch=batch, round=int(start.get("round", round_of(layout, batch))),
                     checkpoint=str(folder / "checkpoint"), starting_model=str(used.get("starting_model", "")),
                     dataset_release=str(read.get("dataset_release", "")),
                     dataset_sha256=str(read.get("dataset_sha256", "")))


def _json(path: Path) -> dict:
    return json.loads(path.read_text()) if path.exists() else {}


def served_name(stage: str, batch: str) -> str:
    """The model name a server must list for the checkpoint `stage` made in `batch`."""
    return f"{stage}-{batch}"


def plan_round(layout: Layout, configured: PolicySpec, batch: str) -> RoundRecord:
    """The round `batch` rolls out in, from the settings and the checkpoints on disk (nothing written)."""
    now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    made = latest_checkpoint(layout, configured.from_stage, batch) if configured.from_stage else ""
    if not made:
        local = configured.kind == "hf" and Path(configured.model).is_dir()
        return RoundRecord(batch, 0, configured.kind, configured.model,
                           weights_revision(configured.model) if local else "", configured.base_url,
                           configured.temperature, configured.from_stage, created=now)
    run = trained_by(layout, configured.from_stage, made)
    served = configured.kind == "openai"
    return RoundRecord(batch, run.round + 1, "openai" if served else "hf",
                       served_name(run.stage, made) if served else run.checkpoint, weights_revision(run.checkpoint),
                       configured.base_url if served else "", configured.temperature, configured.from_stage, run,
                       created=now)


def round_spec(record: RoundRecord, configured: PolicySpec) -> PolicySpec:
    """The spec the batch's policy is built from: the settings' for round 0, else the checkpoint's."""
    if not record.trained_by.stage:
        return configured
    return dataclasses.replace(configured, kind=record.kind, model=record.model, from_stage="",
                               base_url=record.served_at if record.kind == "openai" else "",
                               temperature=record.temperature)


def batch_policy(layout: Layout, configured: PolicySpec, batch: str,
                 api_key: str | None = None) -> tuple[RoundRecord, PolicySpec]:
    """The round `batch` rolls out in (its record's, else as it would start now) and its policy's spec; a served
    checkpoint is checked to be on its server first."""
    record = read_round(layout, batch) or plan_round(layout, configured, batch)
    spec = round_spec(record, configured)
    if record.trained_by.stage and spec.kind == "openai":
        check_served(spec, record, api_key)
    return record, spec


def start_round(layout: Layout, configured: PolicySpec, batch: str,
                api_key: str | None = None) -> tuple[RoundRecord, PolicySpec]:
    """`batch_policy`, the round recorded when it is new (a resumed batch keeps its own)."""
    record, spec = batch_policy(layout, configured, batch, api_key)
    if not layout.round_record(batch).exists():
        write_round(layout, record)
    return record, spec


def check_served(spec: PolicySpec, record: RoundRecord, api_key: str | None = None) -> None:
    """Refuse, saying how to serve it, unless the server at `spec.base_url` lists the checkpoint's model name."""
    import openai

    from pipeline.agent.openai_policy import NO_KEY
    from pipeline.agent.server_check import listed_models

    key = api_key or os.environ.get(spec.api_key_env or "OPENAI_API_KEY") or NO_KEY
    client = openai.OpenAI(base_url=spec.base_url or None, api_key=key)
    listed = listed_models(client, "policy", spec.model, spec.base_url)  # unanswered: ServerCheckError, not retried
    if spec.model not in listed:
        path = record.trained_by.checkpoint
        raise RoundError(
            f"batch {record.batch} (round {record.round}) rolls out with {path}, served as {spec.model!r}, but the "
            f"server at {spec.base_url} lists {listed or 'no model'}; serve it (`vllm serve {path} "
            f"--served-model-name {spec.model}`, or a LoRA adapter: `--enable-lora --lora-modules {spec.model}="
            f"{path}`), or set policy.from_stage: '' to roll out with policy.model")


def finish_round(layout: Layout, record: RoundRecord, outcome: RoundOutcome) -> RoundRecord:
    """The record with its outcome, stored."""
    done = dataclasses.replace(record, outcome=outcome)
    write_round(layout, done)
    return done


@dataclass(frozen=True)
class TrainingStart:
    """Where a stage's run in a batch starts, and whose rows it reads."""

    round: int
    """The round of the batch the run trains in."""
    model: str
    """The starting model: the stage's latest earlier checkpoint (round 1 on), else training.model; also the DPO
    reference model and the ActGuide KL anchor."""
    made_by: TrainedBy
    """The run that made `model`; empty for training.model."""
    rounds_window: int
    batches: tuple[str, ...] | None
    """The batches whose rows it trains on; None: every batch's."""

    def as_config(self) -> dict:
        """What the run folder's config.json says of it."""
        return {"round": {"round": self.round, "starting_model": self.model, "reference_model": self.model,
                          "starting_model_round": self.made_by.round if self.made_by.stage else "base",
                          "starting_model_batch": self.made_by.batch, "rounds_window": self.rounds_window,
                          "rows_of_batches": list(self.batches) if self.batches is not None else "every batch"}}


def training_start(layout: Layout, stage: str, batch: str, base: str, restart_from_base: bool,
                   rounds_window: int) -> TrainingStart:
    """The start of `stage`'s run in `batch`: from its latest checkpoint of an earlier batch when the batch is of
    round 1 or later (unless `restart_from_base`), else from `base`; on the rows of the latest `rounds_window`
    rounds' batches (0: every batch)."""
    now = round_of(layout, batch)
    made = "" if restart_from_base or now == 0 else latest_checkpoint(layout, stage, batch)
    run = trained_by(layout, stage, made) if made else TrainedBy()
    return TrainingStart(now, run.checkpoint or base, run, rounds_window, window_batches(layout, batch, rounds_window))


def window_batches(layout: Layout, batch: str, window: int) -> tuple[str, ...] | None:
    """The batches named up to `batch` whose round is one of the latest `window` up to its own; None for 0."""
    if window == 0:
        return None
    rounds = {b: round_of(layout, b) for b in {*layout.batch_names(), batch} if b <= batch}
    return tuple(sorted(b for b, r in rounds.items() if rounds[batch] - window < r <= rounds[batch]))
