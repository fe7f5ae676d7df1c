"""Rescue failed groups: teacher guidance and minimal action prefixes, then guided groups.

Only tasks whose unguided group's best reward is at most δ get guidance (minimal
intervention). Every probe of the prefix search is stored as a trajectory too.
"""

from __future__ import annotations

import dataclasses
import logging
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal, Sequence

from pipeline.agent.policy import Policy
from pipeline.guidance.actions import Reference, action_hint, linear_prefix, load_action_file, min_guidance_prefix, \
    reference_actions, reference_of
from pipeline.guidance.reference_sources import capped_references
from pipeline.guidance.references import hint_leaks_gold
from pipeline.guidance.teacher import LLMTeacher, RuleTeacher, Teacher, flag_leaks
# Guidance and GuidancePlan live in pipeline.core.records; they stay importable from here.
from pipeline.core.layout import probe_batch
from pipeline.core.records import Guidance, GuidancePlan, Task, Trajectory
from pipeline.rollouts.batch import Job, RolloutConfig, plan_jobs, rollout_id, run_batch
from pipeline.core.config_tree import check_ranges
from pipeline.core.setting_ranges import Count, Fraction
from pipeline.verifier.environment import SandboxFactory, task_sandbox
from pipeline.core.vocab import GUIDANCE_KINDS, RLVR_KINDS, GuidanceKind

log = logging.getLogger(__name__)

@dataclass(frozen=True)
class GuidanceConfig:
    """Which guidance failed tasks get, and how the action prefix is searched."""

    kinds: tuple[GuidanceKind, ...] = GUIDANCE_KINDS
    """Guidance kinds to try: any of 'plan', 'environment_feedback', 'environment_interaction', 'combined' (the three in one prompt), 'hindsight', 'action'."""
    delta: Fraction = 0.0
    """A task gets guidance only when its unguided group's best reward is at most this."""
    probes_per_step: Count = 2
    """Probe attempts per binary-search step (ActGuide: 2); any success decides the step."""
    max_search_steps: Count = 5
    """Most binary-search steps per task (ActGuide: 5)."""
    compare_linear: bool = True
    """Also run the linear search from k = 1 (probes of equal k are reused) to report the probe ratio."""
    action_source: Literal["auto", "trajectories", "expert", "file"] = "auto"
    """Where reference actions come from; 'auto': the task's shortest success in any stored batch (any policy, guided or not), then the file, then the gold-patch script."""
    max_expert_share: Fraction = 1.0
    """Most share of a batch's action plans whose reference is the script written from the gold patch (its edit IS the fix); 0 forbids it. A task left without a reference gets a rejected plan."""
    action_file: str = ""
    """JSONL of imported action logs: {"instance_id", "actions": [{"name", "args"}]}."""
    teacher: Literal["rule", "anthropic", "openai"] = "rule"
    """'rule' (offline, from the gold patch), or an LLM teacher."""
    teacher_model: str = ""
    """Model of the LLM teacher (e.g. a Claude model, or a model on a vLLM server)."""
    teacher_base_url: str = ""
    """Server of the LLM teacher; empty: the client's default."""
    teacher_api_key_env: str = ""
    """Environment variable holding the teacher's API key; empty: the client's usual one."""
    teacher_sees_gold: bool = True
    """Show the teacher the gold patch (told never to quote it)."""
    reject_leaks: bool = True
    """Reject guidance that contains a line of the gold patch verbatim (else keep it, flagged)."""
    cascade: bool = False
    """Guided groups one family at a time in `kinds` order (list the cheapest first), each only on the groups the ones before left failed; False: every family on every failed group (head to head)."""

    def __post_init__(self) -> None:
        unknown = set(self.kinds) - set(GUIDANCE_KINDS)
        if unknown:
            raise ValueError(f"GuidanceConfig.kinds: unknown {sorted(unknown)}; choose from {list(GUIDANCE_KINDS)}")
        check_ranges(self)


def succeeded(traj: Trajectory, delta: float) -> bool:
    """An attempt counts as a success: reward above δ, and no infra fault. A group with none failed (and gets
    guidance); a probe that is one decides its search step."""
    return traj.reward > delta and not traj.infra_error


def failed_groups(trajectories: list[Trajectory], delta: float) -> dict[str, list[Trajectory]]:
    """Unguided groups (over attempts that were not infra faults) none of whose attempts `succeeded`: best reward
    at most δ."""
    groups: dict[str, list[Trajectory]] = {}
    for t in trajectories:
        if not t.infra_error:
            groups.setdefault(t.instance_id, []).append(t)
    return {k: v for k, v in groups.items() if not any(succeeded(t, delta) for t in v)}


def teacher_client(config: GuidanceConfig, api_key: str | None = None) -> Policy | None:
    """The LLM client the teacher settings name (built only when called), or None for the rule-based teacher."""
    if config.teacher == "rule":
        return None
    from pipeline.agent.factory import PolicySpec, make_policy

    return make_policy(PolicySpec(kind=config.teacher, model=config.teacher_model, base_url=config.teacher_base_url,
                                  temperature=0.0, api_key_env=config.teacher_api_key_env), api_key=api_key)


def make_teacher(config: GuidanceConfig, api_key: str | None = None) -> Teacher:
    client = teacher_client(config, api_key)
    return RuleTeacher() if client is None else LLMTeacher(client, show_gold=config.teacher_sees_gold)


def teacher_plans(tasks: dict[str, Task], failed: dict[str, list[Trajectory]], teacher: Teacher,
                  config: GuidanceConfig) -> list[GuidancePlan]:
    """Teacher guidance of the configured kinds for each failed task: Agent-RLVR's from its first failed attempt,
    hindsight from the whole group; leaks flagged (and rejected)."""
    plans = []
    for iid, group in failed.items():
        asks = [(kinds, ask) for kinds, ask in ((RLVR_KINDS, lambda: teacher.teach(tasks[iid], group[0])),
                                                (("hindsight",), lambda: [teacher.hindsight(tasks[iid], group)]))
                if set(kinds) & set(config.kinds)]
        for kinds, ask in asks:
            try:
                items = [g for g in flag_leaks(ask(), tasks[iid]) if g.kind in config.kinds]
            except Exception as exc:  # a teacher's failure (API, parse, odd patch) is that task's, not the batch's
                log.warning("teacher failed on %s: %s", iid, exc)
                wanted = [k for k in kinds if k in config.kinds]
                spent = {"teacher_tokens_in": getattr(exc, "tokens_in", 0),
                         "teacher_tokens_out": getattr(exc, "tokens_out", 0), "teacher_call_share": len(wanted)}
                plans += [GuidancePlan(iid, k, "", teacher.name, accepted=False, reason=str(exc), **spent)
                          for k in wanted]
                continue
            for g in items:
                rejected = g.leaked and config.reject_leaks
                plans.append(GuidancePlan(iid, g.kind, g.prompt_text(), g.teacher, files=tuple(g.files),
                                          functions=tuple(g.functions), leaked=g.leaked, accepted=not rejected,
                                          reason="guidance copies the gold patch" if rejected else "",
                                          teacher_tokens_in=g.tokens_in, teacher_tokens_out=g.tokens_out,
                                          teacher_call_share=len(items)))
    return plans


def action_plans(tasks: dict[str, Task], failed: dict[str, list[Trajectory]], successes: list[Trajectory],
                 policy: Policy, rollout: RolloutConfig, config: GuidanceConfig, probe_dir: Path,
                 batch: str, sandboxes: SandboxFactory = task_sandbox,
                 stored: Sequence[Reference] = ()) -> list[GuidancePlan]:
    """The minimal action prefix of each failed task, searched with stored probe attempts; the reference is the
    task's shortest success among `successes` and `stored` (other batches': `stored_references`), else the action
    file's row, else the gold-patch script (at most `max_expert_share` of the plans).

    A task left without a reference, or whose search raises (its reference actions, a probe), gets a rejected
    plan saying why; the other tasks' searches go on.
    """
    references = batch_references(tasks, list(failed), [*map(reference_of, filter(_resolved, successes)), *stored],
                                  config)

    def search(ref: Reference) -> GuidancePlan:
        if not ref.actions:
            return GuidancePlan(ref.instance_id, "action", "", "", accepted=False, reason=ref.reason)
        try:
            return _action_plan(tasks[ref.instance_id], ref, policy, rollout, config, probe_dir / ref.instance_id,
                                batch, sandboxes)
        except Exception as exc:  # the per-task boundary: one task's search must not fail the others
            log.exception("action search failed on %s", ref.instance_id)
            return GuidancePlan(ref.instance_id, "action", "", "", accepted=False,
                                reason=f"action search failed: {type(exc).__name__}: {exc}")

    with ThreadPoolExecutor(max(1, rollout.workers)) as pool:
        return list(pool.map(search, references))


def _resolved(traj: Trajectory) -> bool:
    return traj.resolved and not traj.infra_error


def batch_references(tasks: dict[str, Task], failed: list[str], successes: Sequence[Reference],
                     config: GuidanceConfig) -> list[Reference]:
    """Each failed task's reference (`reference_actions`), the gold-patch script capped by `max_expert_share`."""
    imported = load_action_file(config.action_file) if config.action_file else {}
    references = []
    for iid in failed:
        try:
            references.append(reference_actions(tasks[iid], successes, imported, config.action_source))
        except Exception as exc:  # the per-task boundary, as for the search
            log.exception("reference actions failed on %s", iid)
            references.append(Reference(iid, (), "", reason=f"action search failed: {type(exc).__name__}: {exc}"))
    return capped_references(references, config.max_expert_share)


def _action_plan(task: Task, ref: Reference, policy: Policy, rollout: RolloutConfig, config: GuidanceConfig,
                 out: Path, batch: str, sandboxes: SandboxFactory) -> GuidancePlan:
    actions = list(ref.actions)
    probe = _prober(task, actions, policy, rollout, out, batch, config.delta, sandboxes)
    found = min_guidance_prefix(len(actions), probe, config.probes_per_step, config.max_search_steps)
    linear = linear_prefix(len(actions), probe, config.probes_per_step) if config.compare_linear else None
    text = action_hint(actions, found.k_star)
    leaked = hint_leaks_gold(text, actions[:found.k_star], task.patch)  # kept, flagged: the expert's edits ARE gold
    return GuidancePlan(task.instance_id, "action", text, ref.source, actions=tuple(actions), leaked=leaked,
                        action_source=ref.source, reference_rollout=ref.rollout_id, K=found.K, k_star=found.k_star,
                        found=found.found, search_steps=found.steps, probes=found.probes,
                        linear_k=linear.k_star if linear else -1, linear_probes=linear.probes if linear else 0)


def probe_job(task: Task, actions: list[dict], k: int, i: int, policy: Policy, rollout: RolloutConfig,
              batch: str) -> Job:
    """Probe i of the k-action hint: its own group and a rollout_id distinct from every guided attempt's."""
    g = Guidance("action", action_hint(actions, k), tuple(actions), k, "reference")
    seed = rollout.seed + 1000 + i
    return Job(task, i, seed, g, f"{batch}|probe|{task.instance_id}|{k}",
               rollout_id(probe_batch(batch), task.instance_id, policy.name, g.key, i, seed))


def _prober(task: Task, actions: list[dict], policy: Policy, rollout: RolloutConfig, out: Path, batch: str,
            delta: float, sandboxes: SandboxFactory = task_sandbox):
    """probe(k, i): whether one attempt with a k-action hint, stored, `succeeded` (reward above `delta`, the bar
    its group failed); identical (k, i) probes are run once."""
    single = dataclasses.replace(rollout, workers=1)

    def probe(k: int, i: int) -> bool:
        job = probe_job(task, actions, k, i, policy, rollout, batch)
        (traj,) = run_batch([job], policy, single, out, probe_batch(batch), progress=log.debug,
                            sandboxes=sandboxes).trajectories
        log.info("probe %s k=%d #%d: reward %g", task.instance_id, k, i, traj.reward)
        return succeeded(traj, delta)

    return probe


def guided_guidance(plans: list[GuidancePlan]) -> dict[str, list[Guidance]]:
    """The Guidance each accepted plan gives its task's guided group."""
    out: dict[str, list[Guidance]] = {}
    for p in plans:
        if p.accepted and p.text:
            out.setdefault(p.instance_id, []).append(
                Guidance(p.kind, p.text, p.actions, p.k_star if p.kind == "action" else -1, p.teacher))
    return out


def guided_jobs(tasks: dict[str, Task], guidance: dict[str, list[Guidance]], policy: Policy,
                config: RolloutConfig, batch: str) -> list[Job]:
    """A guided group of N attempts per (task, guidance)."""
    return [job for iid, items in guidance.items() for g in items
            for job in plan_jobs([tasks[iid]], policy, config, batch, {iid: g})]


def recovery(plans: list[GuidancePlan], guided: list[Trajectory]) -> dict[str, dict]:
    """Per kind: failed tasks given guidance, those recovered (a guided success), and the rate."""
    out = {}
    for kind in sorted({p.kind for p in plans}):
        given = {p.instance_id for p in plans if p.kind == kind and p.accepted}
        recovered = {t.instance_id for t in guided if t.guidance_kind == kind and t.resolved}
        out[kind] = {"tasks": len(given), "recovered": len(recovered & given),
                     "rate": round(len(recovered & given) / len(given), 3) if given else 0.0}
    return out


@dataclass
class SearchStats:
    """Batch-level numbers of the action search."""

    plans: list[GuidancePlan] = field(default_factory=list)

    def metrics(self, guided: list[Trajectory] | None = None) -> dict:
        """Search numbers; probe counts per recovered task once the guided rollouts are in, else per task."""
        acts = [p for p in self.plans if p.kind == "action" and p.K > 0]
        if guided is None:
            rec, per = acts, "task"
        else:
            recovered = {t.instance_id for t in guided if t.guidance_kind == "action" and t.resolved}
            rec, per = [p for p in acts if p.instance_id in recovered], "recovered_task"
        ratios = [p.k_star / p.K for p in acts]
        hist: dict[str, int] = {}
        for r in ratios:
            key = f"{min(int(r * 4), 3) * 25}-{min(int(r * 4), 3) * 25 + 25}%"
            hist[key] = hist.get(key, 0) + 1
        binary = sum(p.probes for p in rec) / len(rec) if rec else 0.0
        linear = sum(p.linear_probes for p in rec) / len(rec) if rec else 0.0
        return {"action_tasks": len(acts), "mean_k_star_over_K": round(sum(ratios) / len(ratios), 3) if ratios else 0,
                "k_star_over_K_histogram": hist, f"probes_per_{per}": round(binary, 2),
                f"linear_probes_per_{per}": round(linear, 2),
                "probe_ratio_binary_over_linear": round(binary / linear, 3) if linear else 0.0}
