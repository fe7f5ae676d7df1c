"""Assets that train the policy on the exported datasets (DPO, ActGuide) and evaluate it without guidance.

Each training asset runs its stage in process, as a Dagster Pipes subprocess (`training.launcher: pipes`,
`accelerate launch ... -m training.run <stage>`) or in a Kubernetes pod through Pipes (`k8s`), and reads the
run folder back in every case: checkpoint, per-step metrics, the loss curve.
"""

import json
import os
import re
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
from training.config import TrainingConfig

PROJECT = Path(__file__).resolve().parents[1]  # the checkout: `training.run` is importable from here
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


def write_spec(stage_config, model: str, dataset: Path, out: Path) -> Path:
    """The JSON file `training.run --spec` reads (settings, model, dataset, out), next to the run folder."""
    spec = out.with_name(f"{out.name}.spec.json")
    spec.write_text(json.dumps({"settings": to_mapping(stage_config), "model": model, "dataset": str(dataset),
                                "out": str(out)}))
    return spec


def pod_spec(config: TrainingConfig, data: Path) -> dict:
    """The pod's spec around the Pipes container: its GPUs, the data claim mounted at `data` (the path the step
    sees), and the project's folder as working directory."""
    container: dict = {"working_dir": str(PROJECT)}
    if config.k8s_gpus > 0:
        container["resources"] = {"limits": {"nvidia.com/gpu": config.k8s_gpus}}
    spec: dict = {"containers": [container]}
    if config.k8s_data_claim:
        container["volume_mounts"] = [{"name": "data", "mount_path": str(data)}]
        spec["volumes"] = [{"name": "data", "persistent_volume_claim": {"claim_name": config.k8s_data_claim}}]
    return spec


def kubeconfig_namespace(config: TrainingConfig) -> str | None:
    """The namespace of the kubeconfig context the client uses; None in a pod on in-cluster config (the client
    then takes the pod's own) or when the context names none."""
    import kubernetes

    if not (config.k8s_kubeconfig or config.k8s_context) and os.environ.get("KUBERNETES_SERVICE_HOST"):
        return None
    contexts, current = kubernetes.config.list_kube_config_contexts(config.k8s_kubeconfig or None)
    chosen = next((c for c in contexts if c["name"] == config.k8s_context), None) if config.k8s_context else current
    if chosen is None:
        raise kubernetes.config.ConfigException(f"no context {config.k8s_context!r} in the kubeconfig")
    return chosen.get("context", {}).get("namespace")


def run_in_pod(context, config: TrainingConfig, stage: str, spec: Path, data: Path) -> dict:
    """Run `training.run <stage>` in a Kubernetes pod through Pipes; the metadata it reported. A failure of
    the cluster or the pod raises a dg.Failure naming the pod or the API and what to change."""
    import kubernetes
    import urllib3
    from dagster_k8s import PipesK8sClient
    from dagster_k8s.client import DagsterK8sError

    command = shlex.split(config.launch_command) + ["training.run", stage, "--spec", str(spec)]
    client = PipesK8sClient(kubeconfig_file=config.k8s_kubeconfig or None, kube_context=config.k8s_context or None,
                            poll_interval=config.k8s_poll_seconds)
    namespace = config.k8s_namespace
    try:
        namespace = namespace or kubeconfig_namespace(config)
        context.log.info(f"launching {shlex.join(command)} in a pod of image {config.k8s_image}, namespace "
                         f"{namespace or 'the client picks'}")
        invocation = client.run(context=context, namespace=namespace, image=config.k8s_image, command=command,
                                base_pod_spec=pod_spec(config, data))
    except DagsterK8sError as error:
        raise pod_failure(context, config, error) from error
    except kubernetes.config.ConfigException as error:
        raise dg.Failure(f"no usable Kubernetes config for the training pod: {error}; set training.k8s_kubeconfig "
                         "(and training.k8s_context) to the cluster's, or run the step in a pod") from error
    except kubernetes.client.ApiException as error:
        raise dg.Failure(f"the Kubernetes API at {api_host()} refused a request for the training pod: "
                         f"{error.status} {error.reason} {(error.body or '')[:500]}; check that namespace "
                         f"{namespace!r} exists and that the step may create, list, delete pods and read their "
                         "logs there") from error
    except (urllib3.exceptions.HTTPError, OSError) as error:
        raise dg.Failure(f"the Kubernetes API at {api_host()} did not answer ({error}); check that the cluster "
                         "is up, or point training.k8s_kubeconfig / training.k8s_context at one that is") from error
    return dict(invocation.get_materialize_result().metadata or {})


def api_host() -> str:
    """The API server address the kubernetes client loaded."""
    import kubernetes

    return kubernetes.client.Configuration.get_default_copy().host


IMAGE_FIX = "check that training.k8s_image exists and the cluster may pull it (imagePullSecrets)"
COMMAND_FIX = "the container could not run: check that training.launch_command works in the image"
POD_FIXES = {  # a word of the client's error: what to change
    "ErrImagePull": IMAGE_FIX, "ImagePullBackOff": IMAGE_FIX,
    "CrashLoopBackOff": COMMAND_FIX, "RunContainerError": COMMAND_FIX,
    "exited with errors": "its process exited with an error: read its last log lines below and fix the stage's "
                          "settings, training.launch_command or the image",
    "Timed out": "it did not finish in time: look at `kubectl describe pod` for why",
}


def pod_failure(context, config: TrainingConfig, error: Exception) -> dg.Failure:
    """A dg.Failure for a pod that failed, naming the pod, the client's reason and what to change."""
    from dagster_k8s.pipes import get_pod_name

    text = str(error)
    prefix = get_pod_name(context.run.run_id, context.op_execution_context.op.name)[:-10]  # but its random digits
    found = re.search(re.escape(prefix) + r"\d{10}", text)
    pod = found.group(0) if found else f"{prefix}*"
    fix = next((fix for key, fix in POD_FIXES.items() if key in text), "see the pod's debug information below")
    return dg.Failure(description=f"training pod {pod} (image {config.k8s_image}) failed: {fix}.\n\n{text[-6000:]}",
                      metadata={"pod": pod, "image": config.k8s_image})


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
        spec = write_spec(stage_config, model, dataset, out)
        command = launch_command(config.launch_command) + ["training.run", stage, "--spec", str(spec)]
        context.log.info(f"launching {shlex.join(command)}")
        invocation = dg.PipesSubprocessClient(cwd=str(PROJECT)).run(command=command, context=context)
        reported = dict(invocation.get_materialize_result().metadata or {})
    elif config.launcher == "k8s":
        spec = write_spec(stage_config, model, dataset, out)
        reported = run_in_pod(context, config, stage, spec, settings.path())
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
    through the same Docker sandboxes and grader as every rollout; each model's identity beside its numbers."""
    from pipeline.evaluation import (INTERVAL, evaluate, evaluation_rollouts, held_out_tasks, model_identity,
                                     per_task_table, results_table, task_batch)

    config = settings.resolved()
    evaluation = config.training.evaluation
    if not evaluation.enabled:
        return dg.MaterializeResult(metadata={"skipped": "training.evaluation.enabled is false"})
    rollout = evaluation_rollouts(config.rollout, evaluation)  # refuses several greedy attempts before any run
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
    batch = settings.batch_name(context)
    results = []
    for label, path in models.items():
        policy = evaluation_policy(label, path, evaluation, credentials)
        result = evaluate(label, policy, held_out, rollout, settings.path("evaluation", batch, label), batch,
                          progress=context.log.info)
        identity = model_identity(path)  # after the run: a Hub model is in the cache by now
        served = {"served_at": evaluation.base_url} if evaluation.base_url else {}  # what it serves is its word
        results.append({"model": label, "identity": {**identity, **served}, **result})
    report = {"tasks": task_batch(held_out), "test_fraction": config.datasets.test_fraction,
              "attempts_per_task": evaluation.attempts, "temperature": evaluation.temperature,
              "interval": INTERVAL, "results": results}
    out = settings.path("evaluation", batch, "pass_at_1.json")
    out.write_text(json.dumps(report, indent=2))
    return dg.MaterializeResult(metadata={
        "held_out_tasks": len(held_out), "tasks_sha256": report["tasks"]["sha256"],
        "attempts_per_task": evaluation.attempts, "interval": INTERVAL,
        **{f"pass@1/{r['model']}": r["pass@1"] for r in results},
        "results": dg.MetadataValue.md(results_table(results)),
        "per_task": dg.MetadataValue.md(per_task_table(results)), "path": dg.MetadataValue.path(str(out))})

