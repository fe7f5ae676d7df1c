"""Every numeric setting declares its range next to it (pipeline/core/setting_ranges.py), and a value outside it stops
a run before anything runs: `handhold` exits 2 naming the setting, the value and the range; a YAML file, the
launchpad's run config and the settings resource raise the same SettingsError."""

from __future__ import annotations

import dataclasses
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated

import dagster as dg
import pytest
import yaml
from annotated_types import Ge, Gt, Interval, Lt

from assets.definitions import definitions
from assets.resources import HandholdSettings
from assets.cli import main, root_error
from pipeline.core.config_tree import field_types, from_mapping
from pipeline.core.setting_ranges import Also, Count, Range, StepLimit, out_of_range, range_of
from assets.settings import HandholdConfig, SettingsError, default_of, load_config

ROOT = Path(__file__).resolve().parent.parent
CHEAP = ["--select", "task_sources", "--set", "synth.packages=[]"]  # were a bad value let through: a cheap real run


def numbers_without_a_range(cls: type, prefix: str = "") -> list[str]:
    """Dotted names of the int and float settings (or tuples of them) under `cls` that declare no Range."""
    plain, annotated, found = field_types(cls), field_types(cls, extras=True), []
    for f in dataclasses.fields(cls):
        kind = plain[f.name]
        if dataclasses.is_dataclass(kind):
            found += numbers_without_a_range(kind, f"{prefix}{f.name}.")
        elif (getattr(kind, "__args__", (kind,))[0] if getattr(kind, "__origin__", None) is tuple else kind) \
                in (int, float) and range_of(annotated[f.name]) is None:
            found.append(f"{prefix}{f.name}")
    return found


def ranged_defaults(cls: type, prefix: str = ""):
    """(dotted name, default, annotated type) of every setting under `cls` that declares a range."""
    hints = field_types(cls, extras=True)
    for f in dataclasses.fields(cls):
        if dataclasses.is_dataclass(hints[f.name]):
            yield from ranged_defaults(hints[f.name], f"{prefix}{f.name}.")
        elif range_of(hints[f.name]):
            yield f"{prefix}{f.name}", default_of(f), hints[f.name]


def test_every_number_setting_declares_a_range_its_default_is_in():
    assert numbers_without_a_range(HandholdConfig) == [], \
        "declare each with a type from pipeline/core/setting_ranges.py (Count, CountOrZero, Fraction, Seconds, ...)"
    ranged = list(ranged_defaults(HandholdConfig))
    assert len(ranged) > 90
    assert [name for name, default, kind in ranged for value in ([default] if not isinstance(default, tuple)
            else default) if out_of_range(value, kind)] == []


def test_a_number_without_a_range_is_found():
    @dataclass(frozen=True)
    class Section:
        ranged: Count = 1
        bare: int = 1
        shares: tuple[float, ...] = ()
        name: str = ""
        on: bool = True

    assert numbers_without_a_range(Section) == ["bare", "shares"]


@pytest.mark.parametrize("allowed, text, inside, outside", [
    (Range(1), "at least 1", [1, 7], [0, -1]),
    (Range(0), "at least 0", [0, 3], [-1]),
    (Range(0, 1), "from 0 to 1", [0, 0.5, 1], [-0.01, 1.01]),
    (Range(0, low_open=True), "above 0", [1e-9, 300], [0, -5]),
    (Range(0, 1, low_open=True), "above 0 and at most 1", [0.2, 1], [0, 1.5]),
    (Range(1, also=(-1,)), "-1, or at least 1", [-1, 1, 9], [0, -2]),
    (Range(1, low_open=True, also=(0,)), "0, or above 1", [0, 1.5, 3], [1, 0.5, -1]),
    (Range(0, 2, high_open=True), "at least 0 and below 2", [0, 1.99], [2, -0.1]),
])
def test_a_range_reads_as_it_checks(allowed, text, inside, outside):
    assert str(allowed) == text
    assert [v for v in inside if not allowed.allows(v)] == []
    assert [v for v in outside + [float("nan"), float("inf")] if allowed.allows(v)] == []


@pytest.mark.parametrize("kind, expected", [
    (Count, Range(1)),
    (StepLimit, Range(1, also=(-1,))),
    (Annotated[float, Interval(gt=0, le=1)], Range(0, 1, low_open=True)),
    (Annotated[float, Gt(1), Also(0)], Range(1, low_open=True, also=(0,))),
    (Annotated[float, Ge(0), Lt(2)], Range(0, 2, high_open=True)),
    (tuple[Count, ...], Range(1)),
    (int, None),
])
def test_the_markers_of_a_type_make_its_range(kind, expected):
    assert range_of(kind) == expected


@pytest.fixture
def home(tmp_path, monkeypatch):
    monkeypatch.setenv("DAGSTER_HOME", str(tmp_path / "home"))
    return tmp_path / "home"


@pytest.mark.parametrize("pair, message", [
    ("rollout.attempts=-1", "rollout.attempts is -1; it must be at least 1"),
    ("rollout.attempts=0", "rollout.attempts is 0; it must be at least 1"),
    ("synth.min_pass_rate=1.5", "synth.min_pass_rate is 1.5; it must be from 0 to 1"),
    ("rollout.test_timeout=0", "rollout.test_timeout is 0.0; it must be above 0"),
    ("rollout.agent.max_wall_time=.inf", "rollout.agent.max_wall_time is inf; it must be a finite number, above 0"),
    ("training.actguide.max_steps=0", "training.actguide.max_steps is 0; it must be -1, or at least 1"),
    ("training.actguide.dual_clip=0.5", "training.actguide.dual_clip is 0.5; it must be 0, or above 1"),
    ("guidance.max_expert_share=2", "guidance.max_expert_share is 2.0; it must be from 0 to 1"),
    ("rollout.attempts=2.5", "rollout.attempts must be int, got float 2.5"),
])
def test_a_value_out_of_range_exits_2_before_anything_runs(home, tmp_path, capsys, pair, message):
    assert main(["run", *CHEAP, "--set", f"data_dir={tmp_path / 'data'}", "--set", pair]) == 2
    assert f"handhold: settings with --set: {message}\n" in capsys.readouterr().err
    assert not home.exists() and not (tmp_path / "data").exists()


def test_the_installed_command_exits_2_on_zero_attempts(home, tmp_path):
    done = subprocess.run([str(Path(sys.executable).parent / "handhold"), "run", *CHEAP, "--set",
                           f"data_dir={tmp_path / 'data'}", "--set", "rollout.attempts=-1"],
                          capture_output=True, text=True)
    assert done.returncode == 2, done.stdout + done.stderr
    assert "rollout.attempts is -1; it must be at least 1" in done.stderr and done.stdout == ""


@pytest.mark.parametrize("pair", ["rollout.attempts=1", "rollout_tasks=0", "synth.min_pass_rate=1", "guidance.delta=0",
                                  "training.actguide.max_steps=-1", "training.actguide.dual_clip=0",
                                  "rollout.pool.size=0", "training.dpo.learning_rate=5e-7"])
def test_the_edges_and_the_sentinels_are_accepted(home, capsys, pair):
    assert main(["config", "--set", pair]) == 0
    key, value = pair.split("=")
    node = yaml.safe_load(capsys.readouterr().out)["resources"]["settings"]["config"]
    for part in key.split("."):
        node = node[part]
    assert node == float(value)


def test_a_yaml_file_is_checked_and_reads_exponents_as_numbers(tmp_path):
    path = tmp_path / "exp.yaml"
    path.write_text("training:\n  dpo:\n    learning_rate: 5e-7\n")  # YAML 1.1 reads 5e-7 as a string
    assert load_config(path).training.dpo.learning_rate == 5e-7
    path.write_text("rollout:\n  agent:\n    command_timeout: -3\n")
    with pytest.raises(SettingsError) as error:
        load_config(path)
    assert str(error.value) == f"{path}: rollout.agent.command_timeout is -3.0; it must be above 0"
    path.write_text("training:\n  dpo:\n    learning_rate: 5e-x\n")
    with pytest.raises(SettingsError, match="training.dpo.learning_rate must be float, got str '5e-x'"):
        load_config(path)


def test_the_settings_resource_and_a_launchpad_run_raise_the_same_error(tmp_path):
    with pytest.raises(SettingsError, match="^the settings resource: rollout.attempts is -1; it must be at least 1$"):
        HandholdSettings(rollout={"attempts": -1}).resolved()
    assert from_mapping(HandholdConfig, {"rollout": {"attempts": 1}}, "x").rollout.attempts == 1

    job = definitions("local").resolve_job_def("main")
    settings = {"data_dir": str(tmp_path / "data"), "synth": {"packages": []}, "datasets": {"test_fraction": 1.5}}
    result = job.execute_in_process(run_config={"resources": {"settings": {"config": settings}}},
                                    instance=dg.DagsterInstance.ephemeral(), raise_on_error=False,
                                    asset_selection=[dg.AssetKey("task_sources")])
    [failure] = result.get_step_failure_events()
    error = root_error(failure)
    assert error.cls_name == "SettingsError"
    assert error.message.strip().endswith("datasets.test_fraction is 1.5; it must be from 0 to 1")
    assert not (tmp_path / "data" / "sources").exists()
