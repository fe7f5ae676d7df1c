"""Invariants a user assumes of every stored batch, checked on the data itself.

- A trajectory with an empty patch has no passing final test run (else a correct fix was lost).
- The whole reference trajectory of a task, replayed as is, resolves it (else k = K cannot work).
- A stored reward equals the grade of the stored patch, re-graded now (for a sample).
"""

from __future__ import annotations

import json
import random
import re
from dataclasses import asdict, dataclass, field

from pipeline.agent.tools import execute
from pipeline.core.records import GuidancePlan, Task, Trajectory
from pipeline.tasks.flakiness import RewardMismatch
from pipeline.verifier.environment import SandboxFactory, task_sandbox
from pipeline.verifier.grading import Grade, grade
from pipeline.verifier.rules import GradeRules

# pytest's closing line: "==== 3 passed, 1 skipped in 0.40s ====", under -q "1 failed in 0.10s", or with its
# timing filtered out (the heuristic's steady test runs) "1 failed, 3 passed"
SUMMARY = re.compile(r"^=*\s*((?:\d+ \w+(?:, )?)+?)(?: in [\d.]+s\b.*|\s*=*\s*)$", re.M)
EDITS = ("create", "str_replace", "insert")


def final_test_run(traj: Trajectory, task: Task) -> tuple[str, bool] | None:
    """(command, whether every test passed) of the last bash call that ran tests to pytest's summary line;
    None if none did. The summary decides, not the exit code a pipe may hide."""
    calls = {}
    last = None
    for message in traj.messages:
        for call in message.get("tool_calls") or []:
            if call["function"]["name"] == "bash":
                calls[call["id"]] = json.loads(call["function"]["arguments"] or "{}").get("command", "")
        command = calls.get(message.get("tool_call_id") or "", "")
        if message["role"] == "tool" and command and ("pytest" in command or task.test_cmd in command):
            summaries = SUMMARY.findall(message.get("content") or "")
            if summaries:
                counts = summaries[-1]
                last = (command, "passed" in counts and not re.search(r"\b(failed|errors?)\b", counts))
    return last


def lost_patches(trajectories: list[Trajectory], tasks: dict[str, Task]) -> list[str]:
    """Rollout ids whose patch is empty although their final run of the failing tests passed."""
    lost = []
    for t in trajectories:
        run = final_test_run(t, tasks[t.instance_id]) if t.instance_id in tasks and not t.patch.strip() else None
        if run and run[1]:
            lost.append(t.rollout_id)
    return lost


def replay(task: Task, actions: list[dict], rules: GradeRules, sandboxes: SandboxFactory = task_sandbox) -> Grade:
    """Run reference actions as they are, no policy, then grade the tree they leave."""
    with sandboxes(task, rules.sandbox) as sandbox:
        for action in actions:
            if action["name"] == "submit":
                break
            execute(sandbox, action["name"], dict(action["args"]), timeout=120)
        patch = sandbox.diff()
    # Graded in a fresh sandbox: what the actions left outside the diff (caches, ignored files) must not count.
    return grade(task, patch, rules, sandboxes=sandboxes)


@dataclass
class RegradeReport:
    """Stored rewards compared with a fresh grade of the stored patches."""

    checked: list[str] = field(default_factory=list)
    mismatches: list[RewardMismatch] = field(default_factory=list)
    infra: list[str] = field(default_factory=list)
    """Rollout ids whose re-grade hit an infrastructure fault (no verdict)."""


def regrade_sample(trajectories: list[Trajectory], tasks: dict[str, Task], rules: GradeRules, sample: int = 4,
                   seed: int = 0, sandboxes: SandboxFactory = task_sandbox) -> RegradeReport:
    """Re-grade up to `sample` stored attempts, about half of them resolved ones, picked at random, under the
    `rules` they were graded by."""
    graded = [t for t in trajectories if not t.infra_error and t.instance_id in tasks]
    rng = random.Random(seed)
    solved = [t for t in graded if t.resolved]
    others = [t for t in graded if not t.resolved]
    rng.shuffle(solved)
    rng.shuffle(others)
    half = (sample + 1) // 2
    picked = (solved[:half] + others + solved[half:])[:sample]
    report = RegradeReport()
    for t in picked:
        now = grade(tasks[t.instance_id], t.patch, rules, sandboxes=sandboxes, reuse_empty=False)  # a real re-grade
        if now.fault == "infra":
            report.infra.append(t.rollout_id)
            continue
        report.checked.append(t.rollout_id)
        if now.reward != t.reward:
            report.mismatches.append(RewardMismatch(t.rollout_id, t.reward, now.reward, now.reason))
    return report


@dataclass(frozen=True)
class BatchInvariants:
    """The invariants of one stored batch: the attempts whose correct fix was lost, and the re-grade."""

    lost_patch_ids: tuple[str, ...]
    regrade: RegradeReport

    def metadata(self) -> dict:
        """As asset metadata: counts and the first 20 offending rows."""
        return {"lost_patches": len(self.lost_patch_ids), "lost_patch_ids": list(self.lost_patch_ids[:20]),
                "regraded": len(self.regrade.checked), "regrade_mismatches": len(self.regrade.mismatches),
                "regrade_mismatch_rows": [asdict(m) for m in self.regrade.mismatches[:20]],
                "regrade_infra": len(self.regrade.infra)}


def batch_invariants(trajectories: list[Trajectory], tasks: dict[str, Task], rules: GradeRules, sample: int = 4,
                     sandboxes: SandboxFactory = task_sandbox) -> BatchInvariants:
    """The invariants of one stored batch."""
    return BatchInvariants(tuple(lost_patches(trajectories, tasks)),
                           regrade_sample(trajectories, tasks, rules, sample, sandboxes=sandboxes))


def last_edit(actions) -> int:
    """1-based position of the last file edit among reference actions (0 when none edits a file)."""
    at = 0
    for i, action in enumerate(actions, 1):
        args = json.loads(action.args) if isinstance(action.args, str) else action.args
        if action.name == "edit" and args.get("command") in EDITS:
            at = i
    return at


def edit_prefix_failures(probes: list[Trajectory]) -> tuple[int, list[str]]:
    """(probes shown a prefix holding the reference's last edit, '<instance> k=<k> #<i>' of those not resolved)."""
    shown, failed = 0, []
    for t in probes:
        edit = last_edit(t.guidance_actions)
        if t.infra_error or not edit or t.guidance_k < edit:
            continue
        shown += 1
        if not t.resolved:
            failed.append(f"{t.instance_id} k={t.guidance_k} #{t.sample_index}")
    return shown, failed


@dataclass(frozen=True)
class ReferenceChecks:
    """Gold-derived references replayed whole, and the probes shown a prefix holding the reference's last edit."""

    replays: int
    replay_failures: tuple[str, ...]
    """'<instance>: <grade reason>' for each whole reference that did not resolve its task."""
    edit_prefix_probes: int
    edit_prefix_failures: tuple[str, ...]
    """'<instance> k=<k> #<i>' for each such probe not resolved."""

    def metadata(self) -> dict:
        """As asset metadata: counts and the first 20 failures."""
        return {"reference_replays": self.replays, "reference_replay_failures": len(self.replay_failures),
                "reference_replay_failure_rows": list(self.replay_failures[:20]),
                "edit_prefix_probes": self.edit_prefix_probes,
                "edit_prefix_failures": len(self.edit_prefix_failures),
                "edit_prefix_failure_rows": list(self.edit_prefix_failures[:20])}


def reference_checks(plans: list[GuidancePlan], probes: list[Trajectory], tasks: dict[str, Task],
                     rules: GradeRules, sandboxes: SandboxFactory = task_sandbox) -> ReferenceChecks:
    """Replay every gold-derived reference whole; count the edit-holding probes that failed."""
    replays, failures = 0, []
    for plan in plans:
        if plan.kind == "action" and plan.action_source == "expert" and plan.instance_id in tasks:
            replays += 1
            verdict = replay(tasks[plan.instance_id], [a.as_dict() for a in plan.actions], rules, sandboxes)
            if not verdict.resolved:
                failures.append(f"{plan.instance_id}: {verdict.reason}")
    shown, failed = edit_prefix_failures(probes)
    return ReferenceChecks(replays, tuple(failures), shown, tuple(failed))
