"""Every setting of a run, in one tree of the pipeline's own config dataclasses.

`HandholdConfig` composes the components' configs (the only place a setting is declared,
with its default and its one-line doc); an experiment is a YAML file of the same shape
(`configs/default.yaml` documents every field). The Dagster layer derives its resource
from these classes; `handhold demo --config` and the launchpad take the same YAML.
"""

from __future__ import annotations

import ast
import dataclasses
import functools
import inspect
import textwrap
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import yaml

from pipeline.agent.factory import PolicySpec
from pipeline.datasets.build import DatasetConfig
from pipeline.datasets.publish import PublishConfig
from pipeline.guidance.rescue import GuidanceConfig
from pipeline.rollouts import RolloutConfig
from pipeline.tasks.synth import SynthConfig
from sandbox.images import BaseImageConfig
from training.config import TrainingConfig


@dataclass(frozen=True)
class SourcesConfig:
    """Where tasks come from besides synthesis."""

    dataset: str = ""
    """A SWE-bench-format dataset (Hub name or local JSON/JSONL/Parquet) loaded next to the synthesized tasks."""
    dataset_split: str = "test"
    """Split of `dataset` to load."""
    dataset_limit: int = 0
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
    batch: str = ""
    """Batch partition name; empty: the UTC date the run was created, so a rerun the same day resumes."""
    rollout_tasks: int = 6
    """Tasks the rollout stages run on, the first ones of `tasks`, repositories interleaved (0: all)."""
    recheck_tasks: int = 2
    """Stored tasks the blocking tasks_validate check re-validates in fresh sandboxes each run (0: none)."""
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


class SettingsError(ValueError):
    """A settings file or mapping that does not fit HandholdConfig: names the key, the file and the fix."""


@functools.cache
def field_docs(cls: type) -> dict[str, str]:
    """The docstring under each field of a dataclass (its one-line documentation)."""
    tree = ast.parse(textwrap.dedent(inspect.getsource(cls)))
    body = tree.body[0].body
    docs = {}
    for node, after in zip(body, body[1:]):
        if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) and isinstance(after, ast.Expr) \
                and isinstance(after.value, ast.Constant) and isinstance(after.value.value, str):
            docs[node.target.id] = " ".join(after.value.value.split())
    return docs


def field_types(cls: type) -> dict[str, Any]:
    """Resolved type hints of a dataclass's fields."""
    module = inspect.getmodule(cls)
    return typing.get_type_hints(cls, vars(module) if module else None)


def default_of(f: dataclasses.Field) -> Any:
    return f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default


def from_mapping(cls: type, data: Any, where: str, prefix: str = "") -> Any:
    """A `cls` from a nested mapping; an unknown key or a wrong type raises SettingsError naming both."""
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise SettingsError(f"{where}: {prefix or 'the top level'} must be a mapping of settings, "
                            f"got {type(data).__name__}")
    fields = {f.name: f for f in dataclasses.fields(cls)}
    unknown = sorted(set(data) - set(fields))
    if unknown:
        key = f"{prefix}.{unknown[0]}" if prefix else unknown[0]
        raise SettingsError(f"{where}: unknown setting {key!r}; {cls.__name__} has {', '.join(fields)}")
    types_ = field_types(cls)
    values = {name: _value(types_[name], value, where, f"{prefix}.{name}" if prefix else name)
              for name, value in data.items()}
    try:
        return cls(**values)
    except (TypeError, ValueError) as exc:
        raise SettingsError(f"{where}: {prefix or cls.__name__}: {exc}") from exc


def _value(kind: Any, value: Any, where: str, key: str) -> Any:
    if dataclasses.is_dataclass(kind):
        return from_mapping(kind, value, where, key)
    origin, args = typing.get_origin(kind), typing.get_args(kind)
    if origin is Literal:
        if value not in args:
            raise SettingsError(f"{where}: {key} is {value!r}; choose one of {', '.join(map(repr, args))}")
        return value
    if origin is tuple:
        if not isinstance(value, (list, tuple)):
            raise SettingsError(f"{where}: {key} must be a list, got {type(value).__name__} {value!r:.60}")
        return tuple(_value(args[0], item, where, f"{key}[{i}]") for i, item in enumerate(value))
    if origin in (typing.Union, types.UnionType):
        raise SettingsError(f"{where}: {key} is not a setting (it has no single type)")
    ok = isinstance(value, kind) and not (kind is int and isinstance(value, bool))
    if kind is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if not ok:
        raise SettingsError(f"{where}: {key} must be {kind.__name__}, got {type(value).__name__} {value!r:.60}")
    return value


def to_mapping(config: Any) -> dict:
    """A config as nested plain data (tuples as lists): what YAML and Dagster run config hold."""
    out = {}
    for f in dataclasses.fields(config):
        value = getattr(config, f.name)
        if dataclasses.is_dataclass(value):
            value = to_mapping(value)
        elif isinstance(value, tuple):
            value = list(value)
        out[f.name] = value
    return out


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


def json_copy(data: Any) -> Any:
    """A deep copy of plain nested data."""
    if isinstance(data, dict):
        return {k: json_copy(v) for k, v in data.items()}
    return [json_copy(v) for v in data] if isinstance(data, list) else data


def documented_yaml(config: HandholdConfig | None = None, title: str = "handhold settings") -> str:
    """Run config YAML of a config (what the launchpad and `handhold demo --config` take), every field
    with its documentation as a comment above it."""
    lines = [f"# {title}: every field, its value and what it does.",
             "# `handhold demo --config FILE`, or paste into the Dagster launchpad.",
             "resources:", "  settings:", "    config:"]
    _document(config or HandholdConfig(), 3, lines)
    return "\n".join(lines) + "\n"


def _document(config: Any, depth: int, lines: list[str]) -> None:
    docs, pad = field_docs(type(config)), "  " * depth
    for f in dataclasses.fields(config):
        value = getattr(config, f.name)
        if depth == 3 and not lines[-1].endswith("config:") and lines[-1] != "":
            lines.append("")
        lines.append(f"{pad}# {docs.get(f.name, '')}")
        if dataclasses.is_dataclass(value):
            lines.append(f"{pad}{f.name}:")
            _document(value, depth + 1, lines)
        else:
            plain = list(value) if isinstance(value, tuple) else value
            dumped = yaml.safe_dump({f.name: plain}, default_flow_style=True, width=1000).strip()
            lines.append(pad + dumped.removeprefix("{").removesuffix("}"))
