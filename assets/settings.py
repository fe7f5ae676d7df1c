"""Every setting of a run, in one tree of the pipeline's own config dataclasses.

`HandholdConfig` composes the components' configs (the only place a setting is declared,
with its default and its one-line doc); an experiment is a YAML file of the same shape
(`configs/default.yaml` documents every field). The Dagster layer derives its resource
from these classes; `handhold demo --config` and the launchpad take the same YAML.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import yaml

from pipeline.agent.factory import PolicySpec
from pipeline.core.config_tree import (SettingsError, default_of, field_docs, field_ranges, field_types,  # noqa: F401
                                  from_mapping, json_copy, to_mapping)
from pipeline.rollouts.costs import CostConfig
from pipeline.datasets.config import DatasetConfig
from pipeline.datasets.publish import PublishConfig
from pipeline.rollouts.rescue import GuidanceConfig
from pipeline.rollouts.batch import RolloutConfig
from pipeline.core.setting_ranges import CountOrZero
from pipeline.synthesis.synth import SynthConfig
from pipeline.tasks.flakiness import QuarantineConfig
from sandbox.images import BaseImageConfig
from training.config import TrainingConfig


@dataclass(frozen=True)
class SourcesConfig:
    """Where tasks come from besides synthesis."""

    dataset: str = ""
    """A SWE-bench-format dataset (Hub name or local JSON/JSONL/Parquet) loaded next to the synthesized tasks."""
    dataset_split: str = "test"
    """Split of `dataset` to load."""
    dataset_limit: CountOrZero = 0
    """Most rows of `dataset` loaded (0: all)."""
    decontaminate: Literal["off", "flag", "exclude"] = "flag"
    """Tasks from a repository an `eval_benchmarks` benchmark draws on: kept, flagged (provenance 'eval_overlap'), or set aside."""
    eval_benchmarks: tuple[str, ...] = ("swe-bench-verified",)
    """Benchmarks the trained policy is evaluated on: shipped lists ('swe-bench-verified') or files of owner/name lines."""


@dataclass(frozen=True)
class HandholdConfig:
    """One run of the pipeline, every stage's settings included."""

    data_dir: str = "data"
    """Folder all Parquet files and datasets are written under (relative to the working dir)."""
    cache_dir: str = ""
    """Folder of downloaded sdists, unpacked sources and synthesized tasks (per package and settings), shareable by
    several data folders and runs at once (each package is locked while it is made); '': <data_dir>/cache."""
    batch: str = ""
    """Batch partition name; empty: the UTC date the run was created, so a rerun the same day resumes."""
    rollout_tasks: CountOrZero = 6
    """Tasks the rollout stages run on, the first ones of `tasks`, repositories interleaved (0: all)."""
    recheck_tasks: CountOrZero = 2
    """Stored tasks the blocking tasks_validate check re-validates in fresh sandboxes each run (0: none)."""
    quarantine: QuarantineConfig = field(default_factory=QuarantineConfig)
    """How often the re-validated tasks are graded, and which quarantined tasks are taken back."""
    base_image: BaseImageConfig = field(default_factory=BaseImageConfig)
    """The sandbox base image every environment image is built on."""
    sources: SourcesConfig = field(default_factory=SourcesConfig)
    """Public SWE-bench-format datasets to load tasks from."""
    synth: SynthConfig = field(default_factory=SynthConfig)
    """Tasks synthesized by injecting bugs into packages."""
    policy: PolicySpec = field(default_factory=PolicySpec)
    """The policy that attempts the tasks."""
    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    """Batches of attempts: group size, concurrency, retries, agent and sandbox limits, grading."""
    guidance: GuidanceConfig = field(default_factory=GuidanceConfig)
    """Which guidance failed tasks get, the teacher, and the action-prefix search."""
    datasets: DatasetConfig = field(default_factory=DatasetConfig)
    """How graded attempts become DPO pairs, ActGuide groups and SFT examples, and the train/test split."""
    publish: PublishConfig = field(default_factory=PublishConfig)
    """Where the exported dataset folder is published on the Hugging Face Hub (the token comes from HF_TOKEN)."""
    training: TrainingConfig = field(default_factory=TrainingConfig)
    """The starting policy, DPO and ActGuide training, and the unguided evaluation of what they train."""
    costs: CostConfig = field(default_factory=CostConfig)
    """Prices of the policy's tokens and of sandbox time, for what each attempt and guidance family cost."""


def read_settings(path: str | Path) -> dict:
    """The settings mapping of a YAML experiment file, in either of its two shapes: the settings tree
    itself, or Dagster run config (`resources: settings: config: ...`, what the launchpad takes)."""
    path = Path(path)
    try:
        data = yaml.safe_load(path.read_text()) or {}
    except FileNotFoundError as exc:
        raise SettingsError(f"{path}: no such settings file") from exc
    except yaml.YAMLError as exc:
        raise SettingsError(f"{path}: not valid YAML: {exc}") from exc
    if isinstance(data, dict) and set(data) == {"resources"}:
        try:
            data = data["resources"]["settings"]["config"] or {}
        except (KeyError, TypeError) as exc:
            raise SettingsError(f"{path}: run config without resources.settings.config") from exc
    return data


def load_config(path: str | Path) -> HandholdConfig:
    """HandholdConfig from a YAML experiment file; fields it leaves out keep their defaults."""
    return from_mapping(HandholdConfig, read_settings(path), str(path))


def with_overrides(data: dict, pairs: list[str], where: str = "--set") -> dict:
    """`data` with `dotted.key=value` pairs applied (values read as YAML), checked against HandholdConfig."""
    out = json_copy(data)
    for pair in pairs:
        key, sep, raw = pair.partition("=")
        if not sep or not key.strip():
            raise SettingsError(f"{where} {pair!r}: expected key=value, e.g. rollout.attempts=4")
        node, parts = out, key.strip().split(".")
        for part in parts[:-1]:
            node = node.setdefault(part, {})
            if not isinstance(node, dict):
                raise SettingsError(f"{where} {pair!r}: {part} is not a section")
        node[parts[-1]] = yaml.safe_load(raw)
    from_mapping(HandholdConfig, out, where)
    return out


def documented_yaml(config: HandholdConfig | None = None, title: str = "handhold settings") -> str:
    """Run config YAML of a config (what the launchpad and `handhold demo --config` take), every field
    with its documentation, and a number's range, as a comment above it."""
    lines = [f"# {title}: every field, its value and what it does.",
             "# `handhold demo --config FILE`, or paste into the Dagster launchpad.",
             "resources:", "  settings:", "    config:"]
    _document(config or HandholdConfig(), 3, lines)
    return "\n".join(lines) + "\n"


def _document(config: Any, depth: int, lines: list[str]) -> None:
    docs, ranges, pad = field_docs(type(config)), field_ranges(type(config)), "  " * depth
    for f in dataclasses.fields(config):
        value = getattr(config, f.name)
        if depth == 3 and not lines[-1].endswith("config:") and lines[-1] != "":
            lines.append("")
        allowed = f" [{ranges[f.name]}]" if ranges[f.name] else ""
        lines.append(f"{pad}# {docs.get(f.name, '')}{allowed}")
        if dataclasses.is_dataclass(value):
            lines.append(f"{pad}{f.name}:")
            _document(value, depth + 1, lines)
        else:
            plain = list(value) if isinstance(value, tuple) else value
            dumped = yaml.safe_dump({f.name: plain}, default_flow_style=True, width=1000).strip()
            lines.append(pad + dumped.removeprefix("{").removesuffix("}"))
