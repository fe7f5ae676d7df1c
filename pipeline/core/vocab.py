"""The words the pipeline shares, each declared once: a Literal type (what settings validate against and
what the code is typed with) and its values in order."""

from __future__ import annotations

from typing import Literal, get_args

RlvrPart = Literal["plan", "environment_feedback", "environment_interaction"]
"""Agent-RLVR's three parts of guidance, written from one failed attempt: a plan, feedback on the environment,
hints on interacting with it."""
RlvrKind = Literal[RlvrPart, "combined"]
"""Agent-RLVR's guidance kinds: each part on its own, then the three in one prompt (the seed's ablation found
them best together; written from the same teacher answer, never a second call)."""
TeacherKind = Literal[RlvrKind, "hindsight"]
"""Guidance a teacher writes: Agent-RLVR's kinds, then hindsight (what the group's failed attempts got wrong)."""
GuidanceKind = Literal[TeacherKind, "action"]
"""Every guidance kind: the teacher's, then a prefix of reference actions (ActGuide-RL)."""
DatasetKind = Literal["dpo", "actguide", "sft"]
"""The datasets built from trajectories, each a config of the exported dataset."""

RLVR_PARTS: tuple[RlvrPart, ...] = get_args(RlvrPart)
RLVR_KINDS: tuple[RlvrKind, ...] = get_args(RlvrKind)
TEACHER_KINDS: tuple[TeacherKind, ...] = get_args(TeacherKind)
GUIDANCE_KINDS: tuple[GuidanceKind, ...] = get_args(GuidanceKind)
DATASET_KINDS: tuple[DatasetKind, ...] = get_args(DatasetKind)
NO_GUIDANCE_KIND = "none"
"""The guidance_kind of an attempt made without guidance."""
CRASHED = "crashed"
"""The exit status of an attempt the harness raised in (a policy, grader or harness bug)."""
HINT_HEADER = "Reference action trajectory hint:"
"""The line that opens the reference actions in an action-guided prompt (the heuristic policy reads them)."""
