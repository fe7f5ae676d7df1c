"""Assets that train the policy on the exported datasets (SFT, DPO, ActGuide) and evaluate it without guidance.

Each training asset launches its stage as `training.launcher` says (training/launch.py: in process, a Dagster
Pipes subprocess or a Kubernetes pod) and reads the run folder back in every case: checkpoint, per-step
metrics, the loss curve.
"""

import json
from datetime import timedelta
from pathlib import Path

import dagster as dg

from assets.partitions import after_new_batch
from assets.resources import Credentials, HandholdSettings, retried_on_infra
from pipeline.agent.factory import PolicySpec, make_policy
from pipeline.agent.server_check import check_server
from pipeline.rollouts.costs import CostConfig
from pipeline.datasets.release import dataset_identity
from pipeline.core.pictures import markdown_image
from pipeline.rollouts.rounds import TrainingStart, training_start
from training.common import add_to_config, read_run, starting_model
from training.launch import launch

STAGES = ("sft", "dpo", "actguide")
EVALUATION_FRESHNESS = timedelta(hours=36)  # the nightly evaluation, after training, may finish later than the export
HEADLINE = ("steps", "rows", "rows_trained", "rows_dropped", "rows_cut_before_last_edit", "trajectories",
            "guided_trajectories", "groups", "first_loss", "final_loss", "final_token_accuracy", "final_reward_margin",
            "final_reward_accuracy", "rows_truncated", "tokens_per_second", "tokens_per_second_excludes",
            "forward_share", "seconds", "adapter")


def run_dir(settings: HandholdSettings, context, stage: str) -> Path:
    return settings.layout().training_run(stage, settings.batch_name(context))


def train_stage(context: dg.AssetExecutionContext, settings: HandholdSettings, stage: str) -> dg.MaterializeResult:
    """Train `stage` on the exported dataset folder, in process or through Pipes, from where its round starts and on
    its rounds' rows (pipeline/rollouts/rounds.py); report the run folder."""
    config = settings.resolved().training
    stage_config = getattr(config, stage)
    if not stage_config.enabled:
        return dg.MaterializeResult(metadata={"skipped": f"training.{stage}.enabled is false"})
    layout, batch = settings.layout(), settings.batch_name(context)
    start = training_start(layout, stage, batch, starting_model(config.model, layout), config.restart_from_base,
                           config.rounds_window)
    dataset, out = layout.export(), run_dir(settings, context, stage)
    read = dataset_identity(dataset)  # before training: the folder the run reads, whatever a later night writes
    reported = launch(context, config, stage, start.model, dataset, out, layout.root, start.batches)
    (out / "dataset.json").write_text(json.dumps(read, indent=2))  # the run folder is emptied when it starts
    add_to_config(out, start.as_config())  # where it started, in which round, on which batches' rows
    summary, metrics = read_run(out)
    last = metrics[-5:]
    columns = sorted({k for row in last for k in row if isinstance(row[k], float)})
    table = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    table += ["| " + " | ".join(f"{row.get(c, float('nan')):.4g}" for c in columns) + " |" for row in last]
    return dg.MaterializeResult(metadata={
        **reported, **{k: summary[k] for k in HEADLINE if summary.get(k) is not None}, **read,
        "checkpoint": dg.MetadataValue.path(str(out / "checkpoint")), **round_metadata(start),
        "launcher": config.launcher, "metrics": dg.MetadataValue.path(str(out / "metrics.jsonl")),
        "last_steps": dg.MetadataValue.md("\n".join(table)),
        "loss_curve": dg.MetadataValue.md(markdown_image((out / "loss.png").read_bytes(), "loss"))})


def round_metadata(start: TrainingStart) -> dict:
    """Where the run started (a checkpoint of an earlier round, or training.model), its round and its rows."""
    made = start.made_by
    return {"starting_model": start.model, "round": start.round, "reference_model": start.model,
            "starting_model_from": f"{made.stage} in batch {made.batch} (round {made.round})" if made.stage
            else "training.model", "rounds_window": start.rounds_window,
            "rows_of_batches": ", ".join(start.batches) if start.batches is not None else "every batch"}


@dg.asset(group_name="training", kinds={"pytorch"}, deps=["dataset_export"], automation_condition=after_new_batch())
def sft_model(context: dg.AssetExecutionContext, settings: HandholdSettings) -> dg.MaterializeResult:
    """The starting policy fine-tuned (TRL's SFTTrainer) on the `sft` train split, loss on the assistant's tokens."""
    return train_stage(context, settings, "sft")


@dg.asset(group_name="training", kinds={"pytorch"}, deps=["dataset_export"], automation_condition=after_new_batch())
def dpo_model(context: dg.AssetExecutionContext, settings: HandholdSettings) -> dg.MaterializeResult:
    """The starting policy trained by offline DPO (TRL) on the `dpo` train split, tool observations masked."""
    return train_stage(context, settings, "dpo")


@dg.asset(group_name="training", kinds={"pytorch"}, deps=["dataset_export"], automation_condition=after_new_batch())
def actguide_model(context: dg.AssetExecutionContext, settings: HandholdSettings) -> dg.MaterializeResult:
    """The starting policy trained by ActGuide's mixed-policy objective on the `actguide` train split."""
    return train_stage(context, settings, "actguide")


def evaluation_policy(label: str, path: str, evaluation, credentials: Credentials):
    """The model as a policy, through the one policy factory: served under `label` at `evaluation.base_url`,
    or loaded in process (on a GPU when there is one)."""
    served = bool(evaluation.base_url)
    spec = PolicySpec(kind="openai" if served else "hf", model=label if served else path,
                      base_url=evaluation.base_url, temperature=evaluation.temperature,
                      max_tokens=evaluation.max_new_tokens)
    return make_policy(spec, api_key=credentials.key("policy") if served else None)


@dg.asset(group_name="evaluation", kinds={"docker", "parquet"}, deps=["sft_model", "dpo_model", "actguide_model"],
          pool="sandboxes", automation_condition=after_new_batch(), freshness_policy=dg.FreshnessPolicy.time_window(
              fail_window=EVALUATION_FRESHNESS, warn_window=EVALUATION_FRESHNESS - timedelta(hours=6)))
@retried_on_infra
def policy_evaluation(context: dg.AssetExecutionContext, settings: HandholdSettings,
                      credentials: Credentials) -> dg.MaterializeResult:
    """Unguided pass@1 of each trained checkpoint next to the starting model, on the held-out test tasks,
    through the same Docker sandboxes and grader as every rollout; each model's identity beside its numbers."""
    from training.evaluation import (INTERVAL, evaluation_rollouts, held_out_tasks, per_task_table, results_table,
                                     task_batch, trained_tasks)

    config = settings.resolved()
    evaluation = config.training.evaluation
    if not evaluation.enabled:
        return dg.MaterializeResult(metadata={"skipped": "training.evaluation.enabled is false"})
    rollout = evaluation_rollouts(config.rollout, evaluation)  # refuses several greedy attempts before any run
    layout = settings.layout()
    tasks = layout.read_tasks()
    held_out = held_out_tasks(tasks, config.datasets.test_fraction, evaluation.tasks)
    if not held_out:
        reason = (f"none of {len(tasks)} tasks is in the test split (datasets.test_fraction="
                  f"{config.datasets.test_fraction}): nothing to evaluate on; raise it or add tasks")
        context.log.warning(reason)
        return dg.MaterializeResult(metadata={"skipped": reason, "held_out_tasks": 0})
    models = {"starting": starting_model(config.training.model, layout)}
    for stage in STAGES:
        checkpoint = run_dir(settings, context, stage) / "checkpoint"
        if getattr(config.training, stage).enabled and checkpoint.exists():
            models[stage] = str(checkpoint)
    batch = settings.batch_name(context)
    trained = trained_tasks(tasks, config.datasets.test_fraction, sft_task_ids(layout.export()), evaluation.train_tasks)
    results = [evaluate_model(context, label, path, held_out, trained, rollout, layout, batch, evaluation,
                              credentials, config.costs) for label, path in models.items()]
    read = dataset_identity(layout.export())
    report = {"dataset": read, "tasks": task_batch(held_out), "trained_tasks": task_batch(trained),
              "test_fraction": config.datasets.test_fraction,
              "attempts_per_task": evaluation.attempts, "temperature": evaluation.temperature,
              "interval": INTERVAL, "results": results}
    out = layout.pass_at_1(batch)
    out.write_text(json.dumps(report, indent=2))
    return dg.MaterializeResult(metadata={
        "held_out_tasks": len(held_out), "tasks_sha256": report["tasks"]["sha256"], **read,
        "attempts_per_task": evaluation.attempts, "interval": INTERVAL,
        "trained_tasks": len(trained), **{f"pass@1/{r['model']}": r["pass@1"] for r in results},
        **{f"trained_pass@1/{r['model']}": r["trained"]["pass@1"] for r in results if r["trained"]["tasks"]},
        **{f"cost_per_task/{r['model']}": r["cost_per_task"] for r in results},
        "results": dg.MetadataValue.md(results_table(results)),
        "per_task": dg.MetadataValue.md(per_task_table(results)), "path": dg.MetadataValue.path(str(out))})



def sft_task_ids(dataset_folder: Path) -> set[str]:
    """The tasks with a success in the exported `sft` train rows: what every stage trained on a solution of."""
    from training.common import TrainingDataError, read_split

    try:
        return set(read_split(dataset_folder, "sft", "train")["instance_id"])
    except TrainingDataError:  # no export, or no success in train: nothing to check memorization on
        return set()


def evaluate_model(context, label: str, path: str, held_out: list, trained: list, rollout, layout, batch: str,
                   evaluation, credentials: Credentials, prices: CostConfig = CostConfig()) -> dict:
    """One model's row of the report: its identity, its score on the held-out tasks, and under `trained` its
    score on the sample of tasks it trained on (the memorization check)."""
    from training.evaluation import evaluate, model_identity

    policy = evaluation_policy(label, path, evaluation, credentials)
    check_server(policy, "evaluation")  # a served checkpoint that does not answer stops the step before any attempt
    result = evaluate(label, policy, held_out, rollout, layout.evaluation(batch, label), batch,
                      progress=context.log.info, prices=prices)
    seen = (evaluate(f"{label}-on-trained", policy, trained, rollout, layout.evaluation(batch, f"{label}-on-trained"),
                     batch, progress=context.log.info) if trained else {"tasks": 0, "pass@1": None})
    identity = model_identity(path)  # after the run: a Hub model is in the cache by now
    served = {"served_at": evaluation.base_url} if evaluation.base_url else {}  # what it serves is its word
    return {"model": label, "identity": {**identity, **served}, **result,
            "trained": {k: seen.get(k) for k in ("tasks", "pass@1", "ci95_low", "ci95_high", "resolved", "per_task",
                                                 "path")}}
