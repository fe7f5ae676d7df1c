"""How a training stage is launched: in the asset's process, as a Dagster Pipes subprocess
(`accelerate launch ... -m training.run <stage>`), or in a Kubernetes pod through Pipes (PipesK8sClient).
Every launcher leaves the same run folder (training/common.py reads it back)."""

from __future__ import annotations

import json
import os
import re
import shlex
import sys
from pathlib import Path

import dagster as dg

from pipeline.core.config_tree import to_mapping
from training.config import TrainingConfig

PROJECT = Path(__file__).resolve().parents[1]  # the checkout: `training.run` is importable from here


def launch(context, config: TrainingConfig, stage: str, model: str, dataset: Path, out: Path, data: Path,
           batches: tuple[str, ...] | None = None) -> dict:
    """Train `stage` of `config` from `model` on the exported `dataset` folder's rows of `batches` (None: every
    batch's) into the run folder `out`, as `config.launcher` says; the metadata a Pipes launch reported ({} in
    process). `data`: data_dir, which a pod mounts where the step sees it."""
    stage_config = getattr(config, stage)
    if config.launcher == "in_process":
        from training.common import rows_of_batches
        from training.run import trainer

        with rows_of_batches(batches):
            trainer(stage)(stage_config, model, dataset, out, report_to=config.report_to,
                           report=lambda row: context.log.info(f"{stage} step " + json.dumps(row)))
        return {}
    spec = write_spec(stage_config, model, dataset, out, config.report_to, batches)
    if config.launcher == "k8s":
        return run_in_pod(context, config, stage, spec, data)
    command = launch_command(config.launch_command) + ["training.run", stage, "--spec", str(spec)]
    context.log.info(f"launching {shlex.join(command)}")
    invocation = dg.PipesSubprocessClient(cwd=str(PROJECT)).run(command=command, context=context)
    return dict(invocation.get_materialize_result().metadata or {})


def launch_command(text: str) -> list[str]:
    """The configured launch command as argv; a leading 'python' is this interpreter."""
    argv = shlex.split(text)
    return [sys.executable, *argv[1:]] if argv and argv[0] == "python" else argv


def write_spec(stage_config, model: str, dataset: Path, out: Path, report_to: tuple[str, ...] = (),
               batches: tuple[str, ...] | None = None) -> Path:
    """The JSON file `training.run --spec` reads (settings, model, dataset, out, report_to, the batches whose rows
    it trains on: null for every batch's), next to the run folder."""
    spec = out.with_name(f"{out.name}.spec.json")
    spec.write_text(json.dumps({"settings": to_mapping(stage_config), "model": model, "dataset": str(dataset),
                                "out": str(out), "report_to": list(report_to),
                                "batches": None if batches is None else list(batches)}))
    return spec


def pod_spec(config: TrainingConfig, data: Path) -> dict:
    """The pod's spec around the Pipes container: its GPUs, the data claim mounted at `data` (the path the step
    sees), and the project's folder as working directory."""
    container: dict = {"working_dir": str(PROJECT)}
    if config.k8s.gpus > 0:
        container["resources"] = {"limits": {"nvidia.com/gpu": config.k8s.gpus}}
    spec: dict = {"containers": [container]}
    if config.k8s.data_claim:
        container["volume_mounts"] = [{"name": "data", "mount_path": str(data)}]
        spec["volumes"] = [{"name": "data", "persistent_volume_claim": {"claim_name": config.k8s.data_claim}}]
    return spec


def kubeconfig_namespace(config: TrainingConfig) -> str | None:
    """The namespace of the kubeconfig context the client uses; None in a pod on in-cluster config (the client
    then takes the pod's own) or when the context names none."""
    import kubernetes

    if not (config.k8s.kubeconfig or config.k8s.context) and os.environ.get("KUBERNETES_SERVICE_HOST"):
        return None
    contexts, current = kubernetes.config.list_kube_config_contexts(config.k8s.kubeconfig or None)
    chosen = next((c for c in contexts if c["name"] == config.k8s.context), None) if config.k8s.context else current
    if chosen is None:
        raise kubernetes.config.ConfigException(f"no context {config.k8s.context!r} in the kubeconfig")
    return chosen.get("context", {}).get("namespace")


def run_in_pod(context, config: TrainingConfig, stage: str, spec: Path, data: Path) -> dict:
    """Run `training.run <stage>` in a Kubernetes pod through Pipes; the metadata it reported. A failure of
    the cluster or the pod raises a dg.Failure naming the pod or the API and what to change."""
    import kubernetes
    import urllib3
    from dagster_k8s import PipesK8sClient
    from dagster_k8s.client import DagsterK8sError

    command = shlex.split(config.launch_command) + ["training.run", stage, "--spec", str(spec)]
    client = PipesK8sClient(kubeconfig_file=config.k8s.kubeconfig or None, kube_context=config.k8s.context or None,
                            poll_interval=config.k8s.poll_seconds)
    namespace = config.k8s.namespace
    try:
        namespace = namespace or kubeconfig_namespace(config)
        context.log.info(f"launching {shlex.join(command)} in a pod of image {config.k8s.image}, namespace "
                         f"{namespace or 'the client picks'}")
        invocation = client.run(context=context, namespace=namespace, image=config.k8s.image, command=command,
                                base_pod_spec=pod_spec(config, data))
    except DagsterK8sError as error:
        raise pod_failure(context, config, error) from error
    except kubernetes.config.ConfigException as error:
        raise dg.Failure(f"no usable Kubernetes config for the training pod: {error}; set training.k8s.kubeconfig "
                         "(and training.k8s.context) to the cluster's, or run the step in a pod") from error
    except kubernetes.client.ApiException as error:
        raise dg.Failure(f"the Kubernetes API at {api_host()} refused a request for the training pod: "
                         f"{error.status} {error.reason} {(error.body or '')[:500]}; check that namespace "
                         f"{namespace!r} exists and that the step may create, list, delete pods and read their "
                         "logs there") from error
    except (urllib3.exceptions.HTTPError, OSError) as error:
        raise dg.Failure(f"the Kubernetes API at {api_host()} did not answer ({error}); check that the cluster "
                         "is up, or point training.k8s.kubeconfig / training.k8s.context at one that is") from error
    return dict(invocation.get_materialize_result().metadata or {})


def api_host() -> str:
    """The API server address the kubernetes client loaded."""
    import kubernetes

    return kubernetes.client.Configuration.get_default_copy().host


IMAGE_FIX = "check that training.k8s.image exists and the cluster may pull it (imagePullSecrets)"
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
    return dg.Failure(description=f"training pod {pod} (image {config.k8s.image}) failed: {fix}.\n\n{text[-6000:]}",
                      metadata={"pod": pod, "image": config.k8s.image})
