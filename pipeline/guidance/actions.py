"""Action guidance in ActGuide-RL's form: reference actions, the hint, and the minimal prefix search.

A reference trajectory is a list of tool calls `[{"name", "args"}]`, no reasoning. A prefix of
k of them is shown in the task prompt; the binary search finds the smallest k that makes the
task solvable (any probe reward > δ), spending at most `max_steps` steps of `probes` attempts.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterable

from pipeline.guidance.expert import expert_actions
from pipeline.core.records import Task, Trajectory
from pipeline.core.vocab import HINT_HEADER

# ActGuide's own wording (append-hint mode), kept verbatim, typo included, so that prompts
# match those its models were trained with.
HINT_INTRO = ("Follow the partial action trajectory hint to take acttions, note that the trajectory may not "
              "complete and you still need do some extra tool calls to finish the task.")


def hint_lines(actions: list[dict], k: int) -> str:
    """The first k actions, one `{i}. {name}: {json args}` line each; `None` when k is 0."""
    if k <= 0 or not actions:
        return "None"
    return "\n".join(f"{i}. {a['name']}: {json.dumps(a['args'], ensure_ascii=False)}"
                     for i, a in enumerate(actions[:k], 1))


def action_hint(actions: list[dict], k: int) -> str:
    """The text appended to the task prompt for a k-action prefix."""
    return f"{HINT_INTRO}\n{HINT_HEADER}\n{hint_lines(actions, k)}"


def actions_of(traj: Trajectory) -> list[dict]:
    """The tool calls of a trajectory after its prompt, as reference actions."""
    return call_actions(call for message in traj.messages[len(traj.prompt):]
                        for call in message.get("tool_calls") or [])


def call_actions(calls: Iterable[dict]) -> list[dict]:
    """OpenAI tool calls as reference actions {"name", "args"}; a call whose arguments are no JSON is skipped."""
    actions = []
    for call in calls:
        try:
            args = json.loads(call["function"]["arguments"])
        except (json.JSONDecodeError, TypeError):
            continue
        actions.append({"name": call["function"]["name"], "args": args})
    return actions


def load_action_file(path: str | Path) -> dict[str, list[dict]]:
    """Imported action logs: JSONL rows {"instance_id", "actions": [{"name", "args"}]} (or a JSON string)."""
    out: dict[str, list[dict]] = {}
    for number, line in enumerate(Path(path).read_text().splitlines(), 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
            actions = row["actions"] if isinstance(row["actions"], list) else json.loads(row["actions"])
            if not all(isinstance(a, dict) and "name" in a and "args" in a for a in actions):
                raise ValueError("each action needs 'name' and 'args'")
            out[row["instance_id"]] = actions
        except (KeyError, ValueError, TypeError) as exc:
            raise ValueError(f"{path}:{number}: bad action log row ({exc}); expected "
                             '{"instance_id": ..., "actions": [{"name": ..., "args": {...}}]}') from exc
    return out


@dataclass(frozen=True)
class Reference:
    """A task's reference actions and where they came from."""

    instance_id: str
    actions: tuple[dict, ...]
    """[{"name", "args"}], no reasoning."""
    source: str
    """One of REFERENCE_SOURCES; '' when the task has none."""
    rollout_id: str = ""
    """The stored success the actions are the tool calls of (source 'trajectory'); '' otherwise."""
    reason: str = ""
    """Why the task has no reference ('' when it has one)."""


REFERENCE_SOURCES = ("trajectory", "file", "expert")
"""In the order they are tried: a stored success of the task (any batch, policy, guidance), an imported action
log, the script written from the gold patch (pipeline/guidance/expert.py)."""


def reference_of(traj: Trajectory) -> Reference:
    """A resolved trajectory as a reference: its own tool calls."""
    return Reference(traj.instance_id, tuple(actions_of(traj)), "trajectory", traj.rollout_id)


def reference_actions(task: Task, successes: Iterable[Reference], imported: dict[str, list[dict]],
                      source: str = "auto") -> Reference:
    """The task's reference: its shortest stored success (ties by rollout id), else its imported log, else the
    expert script; `source` other than 'auto' allows only 'trajectories', 'file' or 'expert'."""
    ordered = sorted((r for r in successes if r.instance_id == task.instance_id and r.actions),
                     key=lambda r: (len(r.actions), r.rollout_id))
    if source in ("auto", "trajectories") and ordered:
        return ordered[0]
    if source in ("auto", "file") and imported.get(task.instance_id):
        return Reference(task.instance_id, tuple(imported[task.instance_id]), "file")
    if source in ("auto", "expert") and task.patch:
        return Reference(task.instance_id, tuple(expert_actions(task)), "expert")
    return Reference(task.instance_id, (), "", reason=f"no reference actions (guidance.action_source={source!r}: "
                                                      "no stored success, action file row or gold patch)")


@dataclass(frozen=True)
class SearchResult:
    """Outcome of a prefix search for one task."""

    K: int
    """Length of the reference trajectory."""
    k_star: int
    """Smallest prefix with a successful probe; K when none succeeded."""
    found: bool
    """Some probe succeeded."""
    steps: int
    probes: int


Probe = Callable[[int, int], bool]  # (k, probe index) -> success


def min_guidance_prefix(K: int, probe: Probe, probes_per_step: int = 2, max_steps: int = 5) -> SearchResult:
    """ActGuide's binary search over k in [0, K]: lo=0, hi=K; success at mid → hi=mid, else lo=mid+1."""
    lo, hi, steps, spent, found = 0, K, 0, 0, False
    while lo < hi and steps < max_steps:
        mid = (lo + hi) // 2
        steps += 1
        ok = False
        for i in range(probes_per_step):
            spent += 1
            if probe(mid, i):
                ok = True
                break  # any success decides the step
        if ok:
            hi, found = mid, True
        else:
            lo = mid + 1
    return SearchResult(K, hi, found, steps, spent)  # hi only ever moves to a success: else it is K


def linear_prefix(K: int, probe: Probe, probes_per_step: int = 2) -> SearchResult:
    """The baseline: k = 1, 2, ... until a probe succeeds (or K)."""
    spent = 0
    for k in range(1, K + 1):
        for i in range(probes_per_step):
            spent += 1
            if probe(k, i):
                return SearchResult(K, k, True, k, spent)
    return SearchResult(K, K, False, K, spent)


def search_steps_bound(K: int) -> int:
    """⌈log2(K+1)⌉: the most steps the binary search needs to pin k* down."""
    return math.ceil(math.log2(K + 1))
