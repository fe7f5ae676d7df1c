"""Assets that train the policy on the exported datasets (DPO, ActGuide) and evaluate it without guidance.

Each training asset runs its stage in process, or (`training.launcher: pipes`) as a Dagster Pipes
subprocess (`accelerate launch ... -m training.run <stage>`), and reads the run folder back either
way: checkpoint, per-step metrics, the loss curve.
"""

import json
import shlex
import sys
from pathlib import Path

import dagster as dg

from assets.resources import Credentials, HandholdSettings, retried_on_infra
from pipeline.pictures import markdown_image
from pipeline.records import TASK_SCHEMA, Task
from pipeline.settings import to_mapping
from pipeline.store import read_records
from training.common import read_run, starting_model

STAGES = ("dpo", "actguide")
HEADLINE = ("steps", "rows", "rows_trained", "trajectories", "guided_trajectories", "groups", "first_loss",
            "final_loss", "final_reward_margin", "final_reward_accuracy", "tokens_per_second", "forward_share",
            "seconds", "adapter")


def launch_command(text: str) -> list[str]:
    """The configured launch command as argv; a leading 'python' is this interpreter."""
    argv = shlex.split(text)
    return [sys.executable, *argv[1:]] if argv and argv[0] == "python" else argv


def run_dir(settings: HandholdSettings, context, stage: str) -> Path:
    return settings.path("models", stage, settings.batch_name(context))


def train_stage(context: dg.AssetExecutionContext, settings: HandholdSettings, stage: str) -> dg.MaterializeResult:
    """Train `stage` on the exported dataset folder, in process or through Pipes; report the run folder."""
    config = settings.resolved().training
    stage_config = getattr(config, stage)
    if not stage_config.enabled:
        return dg.MaterializeResult(metadata={"skipped": f"training.{stage}.enabled is false"})
    model = starting_model(config.model, settings.path())
    dataset, out = settings.path("datasets", "hf"), run_dir(settings, context, stage)
    reported: dict = {}
    if config.launcher == "pipes":
        spec = out.with_name(f"{out.name}.spec.json")
        spec.write_text(json.dumps({"settings": to_mapping(stage_config), "model": model, "dataset": str(dataset),
                                    "out": str(out)}))
        command = launch_command(config.launch_command) + ["training.run", stage, "--spec", str(spec)]
        context.log.info(f"launching {shlex.join(command)}")
        invocation = dg.PipesSubprocessClient(cwd=str(Path(__file__).resolve().parents[1])).run(
            command=command, context=context)
        reported = dict(invocation.get_materialize_result().metadata or {})
    else:
        from training.run import trainer

        trainer(stage)(stage_config, model, dataset, out,
                       report=lambda row: context.log.info(f"{stage} step " + json.dumps(row)))
    summary, metrics = read_run(out)
    last = metrics[-5:]
    columns = sorted({k for row in last for k in row if isinstance(row[k], float)})
    table = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    table += ["| " + " | ".join(f"{row.get(c, float('nan')):.4g}" for c in columns) + " |" for row in last]
    return dg.MaterializeResult(metadata={
        **reported, **{k: summary[k] for k in HEADLINE if summary.get(k) is not None},
        "checkpoint": dg.MetadataValue.path(str(out / "checkpoint")), "starting_model": model,
        "launcher": config.launcher, "metrics": dg.MetadataValue.path(str(out / "metrics.jsonl")),
        "last_steps": dg.MetadataValue.md("\n".join(table)),
        "loss_curve": dg.MetadataValue.md(markdown_image((out / "loss.png").read_bytes(), "loss"))})


@dg.asset(group_name="training", kinds={"pytorch"}, deps=["dataset_export"])
def dpo_model(context: dg.AssetExecutionContext, settings: HandholdSettings) -> dg.MaterializeResult:
    """The starting policy trained by offline DPO (TRL) on the `dpo` train split, tool observations masked."""
    return train_stage(context, settings, "dpo")


@dg.asset(group_name="training", kinds={"pytorch"}, deps=["dataset_export"])
def actguide_model(context: dg.AssetExecutionContext, settings: HandholdSettings) -> dg.MaterializeResult:
    """The starting policy trained by ActGuide's mixed-policy objective on the `actguide` train split."""
    return train_stage(context, settings, "actguide")


def evaluation_policy(label: str, path: str, evaluation, credentials: Credentials):
    """The model as a policy: served under `label` at `evaluation.base_url`, or loaded in process."""
    if evaluation.base_url:
        from pipeline.agent.openai_policy import OpenAIPolicy, OpenAIPolicyConfig

        return OpenAIPolicy(OpenAIPolicyConfig(model=label, base_url=evaluation.base_url,
                                               temperature=evaluation.temperature,
                                               max_tokens=evaluation.max_new_tokens), api_key=credentials.key("policy"))
    import torch

    from pipeline.agent.hf_policy import LocalHFPolicy, LocalHFPolicyConfig

    return LocalHFPolicy(LocalHFPolicyConfig(model_path=path, temperature=evaluation.temperature,
                                             max_new_tokens=evaluation.max_new_tokens,
                                             device="cuda" if torch.cuda.is_available() else "cpu"))


@dg.asset(group_name="evaluation", kinds={"docker", "parquet"}, deps=["dpo_model", "actguide_model"],
          pool="sandboxes")
@retried_on_infra
def policy_evaluation(context: dg.AssetExecutionContext, settings: HandholdSettings,
                      credentials: Credentials) -> dg.MaterializeResult:
    """Unguided pass@1 of each trained checkpoint next to the starting model, on the held-out test tasks,
    through the same Docker sandboxes and grader as every rollout."""
    from pipeline.evaluation import evaluate, evaluation_rollouts, held_out_tasks

    config = settings.resolved()
    evaluation = config.training.evaluation
    if not evaluation.enabled:
        return dg.MaterializeResult(metadata={"skipped": "training.evaluation.enabled is false"})
    tasks = [Task.from_row(r) for r in read_records(settings.path("tasks", "tasks.parquet"), TASK_SCHEMA,
                                                   produced_by="tasks")]
    held_out = held_out_tasks(tasks, config.datasets.test_fraction, evaluation.tasks)
    if not held_out:
        reason = (f"none of {len(tasks)} tasks is in the test split (datasets.test_fraction="
                  f"{config.datasets.test_fraction}): nothing to evaluate on; raise it or add tasks")
        context.log.warning(reason)
        return dg.MaterializeResult(metadata={"skipped": reason, "held_out_tasks": 0})
    models = {"starting": starting_model(config.training.model, settings.path())}
    for stage in STAGES:
        checkpoint = run_dir(settings, context, stage) / "checkpoint"
        if getattr(config.training, stage).enabled and checkpoint.exists():
            models[stage] = str(checkpoint)
    batch, rollout = settings.batch_name(context), evaluation_rollouts(config.rollout, evaluation)
    results = []
    for label, path in models.items():
        policy = evaluation_policy(label, path, evaluation, credentials)
        results.append(evaluate(label, policy, held_out, rollout, settings.path("evaluation", batch, label), batch,
                                progress=context.log.info))
    settings.path("evaluation", batch, "pass_at_1.json").write_text(json.dumps(results, indent=2))
    columns = ["model", "tasks", "attempts", "resolved", "pass@1", "ci95_low", "ci95_high", "infra_errors"]
    table = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    table += ["| " + " | ".join(str(r[c]) for c in columns) + " |" for r in results]
    return dg.MaterializeResult(metadata={
        "held_out_tasks": len(held_out), "attempts_per_task": evaluation.attempts,
        **{f"pass@1/{r['model']}": r["pass@1"] for r in results},
        "results": dg.MetadataValue.md("\n".join(table)),
        "path": dg.MetadataValue.path(str(settings.path("evaluation", batch, "pass_at_1.json")))})
