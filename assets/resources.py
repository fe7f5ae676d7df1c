"""Resources shared by the assets: where outputs go and which tasks are made."""

from __future__ import annotations

from datetime import datetime, timezone
from pathlib import Path

import dagster as dg


class HandholdSettings(dg.ConfigurableResource):
    """Run-wide settings; every field can be set per run in the Dagster launchpad."""

    data_dir: str = "data"
    """Folder all Parquet files and datasets are written under (relative to the working dir)."""
    base_image: str = "handhold/base:bookworm-py3"
    """Tag of the sandbox base image that environment images are built on."""
    packages: list[str] = ["toolz", "tabulate", "boltons"]
    """Built-in packages to synthesize tasks from (names in pipeline.tasks.packages.DEFAULT_PACKAGES)."""
    tasks_per_package: int = 8
    """Synthesized tasks kept per package."""
    dataset: str = ""
    """Optional SWE-bench-format dataset (Hub name or local JSON/JSONL/Parquet) loaded next to them."""
    dataset_split: str = "test"
    """Split of `dataset` to load."""
    dataset_limit: int = 0
    """Most rows of `dataset` loaded (0: all)."""
    workers: int = 2
    """Sandboxes run at once by any stage."""
    rollout_tasks: int = 6
    """Tasks the rollout stages run on, the first ones of `tasks` (0: all of them)."""
    attempts: int = 2
    """Attempts per task in a rollout group (N)."""
    max_steps: int = 40
    """Most model calls per attempt."""
    policy_kind: str = "heuristic"
    """'heuristic' (offline baseline), 'openai' (any OpenAI-compatible server: vLLM, SGLang...), 'anthropic', 'hf'."""
    policy_model: str = ""
    """Model name on the server, or a local model directory for 'hf'."""
    policy_base_url: str = ""
    """Server URL for 'openai' (e.g. http://127.0.0.1:8000/v1) or 'anthropic'; empty: the client's default."""
    policy_api_key_env: str = ""
    """Name of the environment variable holding the API key (the key itself is never configured here)."""
    guidance_kinds: list[str] = ["plan", "environment_feedback", "environment_interaction", "action"]
    """Guidance tried on failed tasks: teacher kinds (Agent-RLVR) and/or 'action' (ActGuide-RL)."""
    delta: float = 0.0
    """Only tasks whose unguided best reward is at most this get guidance."""
    probes_per_step: int = 2
    """Probe attempts per step of the action-prefix binary search."""
    max_search_steps: int = 5
    """Most steps of the action-prefix binary search."""
    compare_linear: bool = True
    """Also run the linear prefix search from k = 1, to report the probe ratio."""
    teacher: str = "rule"
    """'rule' (offline, from the gold patch), 'anthropic' or 'openai'."""
    teacher_model: str = ""
    """Model of the LLM teacher."""
    teacher_base_url: str = ""
    """Server of the LLM teacher; empty: the client's default."""
    teacher_api_key_env: str = ""
    """Environment variable holding the teacher's API key."""
    teacher_sees_gold: bool = True
    """Show the teacher the gold patch (it is told never to quote it)."""
    action_file: str = ""
    """Optional JSONL of imported reference action logs."""
    batch: str = ""
    """Batch partition name; empty: today's date (UTC), so a rerun the same day resumes."""

    def path(self, *parts: str) -> Path:
        out = Path(self.data_dir).resolve().joinpath(*parts)
        out.parent.mkdir(parents=True, exist_ok=True)
        return out

    def policy(self):
        from pipeline.agent.factory import PolicySpec, make_policy

        return make_policy(PolicySpec(kind=self.policy_kind, model=self.policy_model,  # type: ignore[arg-type]
                                      base_url=self.policy_base_url, api_key_env=self.policy_api_key_env))

    def rollout_config(self):
        from pipeline.agent.loop import AgentConfig
        from pipeline.rollouts import RolloutConfig

        return RolloutConfig(attempts=self.attempts, workers=self.workers,
                             agent=AgentConfig(max_steps=self.max_steps))

    def guidance_config(self):
        from pipeline.guidance.rescue import GuidanceConfig

        return GuidanceConfig(kinds=tuple(self.guidance_kinds), delta=self.delta,
                              probes_per_step=self.probes_per_step, max_search_steps=self.max_search_steps,
                              compare_linear=self.compare_linear, teacher=self.teacher,  # type: ignore[arg-type]
                              teacher_model=self.teacher_model, teacher_base_url=self.teacher_base_url,
                              teacher_api_key_env=self.teacher_api_key_env, teacher_sees_gold=self.teacher_sees_gold,
                              action_file=self.action_file)

    def batch_name(self, context) -> str:
        """`batch`, or the UTC date the run was created (the same for every asset of a run)."""
        if self.batch:
            return self.batch
        record = context.instance.get_run_record_by_id(context.run_id)
        created = record.create_timestamp if record else datetime.now(timezone.utc)
        return created.strftime("%Y-%m-%d")

    def synth_config(self):
        from pipeline.guidance.rescue import teacher_client
        from pipeline.tasks.packages import DEFAULT_PACKAGES
        from pipeline.tasks.synth import SynthConfig

        known = {p.name: p for p in DEFAULT_PACKAGES}
        unknown = [name for name in self.packages if name not in known]
        if unknown:
            raise ValueError(f"settings.packages has unknown names {unknown}; choose from {sorted(known)}")
        return SynthConfig(packages=tuple(known[n] for n in self.packages),
                           tasks_per_package=self.tasks_per_package, workers=self.workers,
                           statement_writer=teacher_client(self.guidance_config()))

