"""A stored trajectory is built from three typed parts: the job's columns, the attempt's and the grade's; the
parts name every Trajectory column once, with the Trajectory's types, and their defaults are what a trajectory
without an attempt or a grade stores."""

from __future__ import annotations

import dataclasses
import typing
from types import SimpleNamespace

from pipeline.core.records import Trajectory
from pipeline.datasets.pairs import HEAVY, USED, HeavyColumns, LightColumns
from pipeline.rollouts.batch import NO_GUIDANCE, Job, to_trajectory
from pipeline.rollouts.trajectory_columns import LOG_TAIL, AttemptColumns, GradeColumns, columns
from pipeline.verifier.grading import Grade

JOB_COLUMNS = {"rollout_id", "group_id", "batch", "instance_id", "sample_index", "seed", "policy", "policy_settings",
               "guidance_kind", "guidance_text", "guidance_actions", "guidance_k", "teacher", "exit_status",
               "infra_error", "error", "infra_retries", "created_at"}


def annotations(cls) -> dict[str, str]:
    return {f.name: str(f.type) for f in dataclasses.fields(cls)}


def test_the_parts_name_every_trajectory_column_once_with_its_type():
    attempt, grade = annotations(AttemptColumns), annotations(GradeColumns)
    stored = annotations(Trajectory)
    assert not attempt.keys() & grade.keys() and not (attempt.keys() | grade.keys()) & JOB_COLUMNS
    assert attempt.keys() | grade.keys() | JOB_COLUMNS == stored.keys()
    assert {name: stored[name] for name in attempt} == attempt
    assert {name: stored[name] for name in grade} == grade


class Named:
    name = "p"

    def settings(self) -> dict:
        return {}


def test_a_trajectory_without_an_attempt_stores_the_parts_defaults():
    task = SimpleNamespace(instance_id="t1")
    traj = to_trajectory(Job(task, 0, 0, NO_GUIDANCE, "g", "r"), Named(), "b", None, None, "sandbox: gone", 1)
    assert {name: getattr(traj, name) for name in columns(AttemptColumns())} == columns(AttemptColumns())
    assert {name: getattr(traj, name) for name in columns(GradeColumns())} == columns(GradeColumns())
    assert (traj.exit_status, traj.infra_error, traj.infra_retries) == ("sandbox_error", "sandbox: gone", 1)


def test_an_infra_fault_pays_nothing_whatever_the_grade_said():
    paid = Grade(True, "none", "resolved", "{}", "x" * (LOG_TAIL + 5), duration=2.5)
    assert (GradeColumns.of(paid, "").reward, GradeColumns.of(paid, "").resolved) == (1.0, True)
    faulted = GradeColumns.of(paid, "grader: docker gone")
    assert (faulted.reward, faulted.resolved, faulted.grade_reason) == (0.0, False, "resolved")
    assert len(faulted.test_log) == LOG_TAIL and faulted.grade_time == 2.5


def test_columns_keeps_the_values_as_they_are():
    assert typing.get_type_hints(columns)["return"] == dict[str, typing.Any]
    part = AttemptColumns(steps=(object(),))
    assert columns(part)["steps"] is part.steps


def test_the_columns_the_dataset_builders_read_are_trajectory_columns_with_its_types():
    stored = annotations(Trajectory)
    for part in (LightColumns, HeavyColumns):
        assert {name: stored[name] for name in annotations(part)} == annotations(part)
    assert USED[-len(HEAVY):] == HEAVY == list(annotations(HeavyColumns))
    assert len(set(USED)) == len(USED)
