"""`training.launcher: k8s`: the ActGuide stage trained in a pod through dagster-k8s's PipesK8sClient, against a
loopback Kubernetes API (tests/fake_kube.py) whose pods are local processes; the image is not pulled, the
command runs with this interpreter as the real pod runs the image's."""

from __future__ import annotations

import socket
import sys
from pathlib import Path

import dagster as dg
import pytest

from assets.resources import Credentials, HandholdSettings
from assets.training import actguide_model
from pipeline.datasets import DatasetConfig, build_rows
from pipeline.datasets.card import CardInfo
from pipeline.datasets.export import export_dataset
from assets.settings import HandholdConfig, SettingsError, from_mapping
from tests.fake_kube import FakeKube, write_kubeconfig
from tests.test_training import actguide_attempts
from training.common import read_run
from training.launch import PROJECT

IMAGE = "registry.example.com/handhold:cuda"
FAILING = f"{sys.executable} -c \"import sys; print('no CUDA device here', file=sys.stderr); sys.exit(3)\""


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> Path:
    """A data folder holding an exported dataset with actguide rows; the tiny model is built there on first use."""
    data = tmp_path_factory.mktemp("data")
    rows = build_rows(actguide_attempts(), DatasetConfig(test_fraction=0.0)).actguide
    export_dataset(data / "datasets" / "hf", {"actguide": rows}, CardInfo("test", run_id="b1"))
    return data


@pytest.fixture
def kube(monkeypatch):
    monkeypatch.setenv("NO_PROXY", "127.0.0.1")  # the loopback API, never through a proxy
    with FakeKube() as kube:
        yield kube


def materialize(data: Path, instance: dg.DagsterInstance | None = None, launch_command: str | None = None,
                **k8s) -> dg.ExecuteInProcessResult:
    """actguide_model with launcher k8s (`k8s`: the training.k8s settings): two optimizer steps on the tiny model,
    the pod polled every 0.1 s."""
    settings = HandholdSettings(data_dir=str(data), batch="b1", training={
        "launcher": "k8s", "launch_command": launch_command or f"{sys.executable} -m",
        "k8s": {"image": IMAGE, "poll_seconds": 0.1, **k8s},
        "actguide": {"learning_rate": 1e-3, "batch_size": 8, "max_steps": 2,
                     "behaviour_logprobs": "recompute"}})  # hand-made attempts: no sampled ids
    return dg.materialize([actguide_model], instance=instance or dg.DagsterInstance.ephemeral(), raise_on_error=False,
                          resources={"settings": settings, "credentials": Credentials()})


def failure_text(result: dg.ExecuteInProcessResult) -> str:
    """What the UI shows of a failed step: the Failure's description."""
    [event] = result.get_step_failure_events()
    return event.step_failure_data.user_failure_data.description


def test_a_k8s_launch_trains_in_a_pod_that_reports_to_the_asset(data, kube, tmp_path):
    instance = dg.DagsterInstance.ephemeral()
    result = materialize(data, instance, kubeconfig=str(kube.write_kubeconfig(tmp_path / "kubeconfig")),
                         namespace="training", gpus=2, data_claim="handhold-data")
    assert result.success
    meta = result.get_asset_materialization_events()[0].step_materialization_data.materialization.metadata
    assert meta["launcher"].value == "k8s" and meta["stage"].value == "actguide"  # stage: reported by the pod
    assert meta["steps"].value == 2 and meta["checkpoint"].value.endswith("models/actguide/b1/checkpoint")
    logs = [entry.user_message for entry in instance.all_logs(result.run_id)]
    assert sum("actguide step {" in message for message in logs) == 2  # each step, through the pod's log
    summary, metrics = read_run(data / "models" / "actguide" / "b1")
    assert summary["steps"] == 2 == len(metrics)
    assert (data / "models" / "actguide" / "b1" / "checkpoint" / "model.safetensors").exists()

    [pod] = kube.created
    container, name = pod["spec"]["containers"][0], pod["metadata"]["name"]
    assert container["image"] == IMAGE and container["workingDir"] == str(PROJECT)
    spec = str(data.resolve() / "models" / "actguide" / "b1.spec.json")
    assert container["command"] == [sys.executable, "-m", "training.run", "actguide", "--spec", spec]
    assert container["resources"] == {"limits": {"nvidia.com/gpu": "2"}}
    assert container["volumeMounts"] == [{"name": "data", "mountPath": str(data.resolve())}]
    assert pod["spec"]["volumes"] == [{"name": "data", "persistentVolumeClaim": {"claimName": "handhold-data"}}]
    assert pod["spec"]["restartPolicy"] == "Never"
    assert {"DAGSTER_PIPES_CONTEXT", "DAGSTER_PIPES_MESSAGES"} <= {e["name"] for e in container["env"]}
    assert ("POST", "/api/v1/namespaces/training/pods") in kube.requests
    assert kube.deleted == [("training", name)] and not kube.pods  # deleted once it ended
    assert kube.unknown == []


def test_a_failing_pod_fails_the_asset_naming_the_pod_and_its_last_lines(data, kube, tmp_path):
    """No namespace set: the kubeconfig context's; no GPU, no claim: neither in the pod."""
    result = materialize(data, kubeconfig=str(kube.write_kubeconfig(tmp_path / "kubeconfig", namespace="ci")),
                         launch_command=FAILING, gpus=0)
    assert not result.success
    [pod] = kube.created
    name, container = pod["metadata"]["name"], pod["spec"]["containers"][0]
    text = failure_text(result)
    assert text.startswith(f"training pod {name} (image {IMAGE}) failed: its process exited with an error")
    assert "no CUDA device here" in text  # the pod's last log lines
    assert "resources" not in container and "volumeMounts" not in container and "volumes" not in pod["spec"]
    assert kube.deleted == [("ci", name)] and kube.unknown == []


def test_an_image_that_cannot_be_pulled_fails_the_asset_naming_the_image(data, monkeypatch, tmp_path):
    monkeypatch.setenv("NO_PROXY", "127.0.0.1")
    with FakeKube(pull_fails=(IMAGE,)) as kube:
        result = materialize(data, kubeconfig=str(kube.write_kubeconfig(tmp_path / "kubeconfig")))
    assert not result.success
    [pod] = kube.created
    text = failure_text(result)
    assert text.startswith(f"training pod {pod['metadata']['name']} (image {IMAGE}) failed: check that "
                           "training.k8s.image exists")
    assert "ErrImagePull" in text and f'Failed to pull image "{IMAGE}"' in text  # the Warning event
    assert kube.deleted == [("default", pod["metadata"]["name"])] and kube.unknown == []


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.parametrize("context, message", [
    ("", "the Kubernetes API at http://127.0.0.1:{port} did not answer"),
    ("staging", "no usable Kubernetes config for the training pod: no context 'staging' in the kubeconfig"),
])
def test_an_unreachable_cluster_fails_the_asset_saying_what_to_set(data, tmp_path, monkeypatch, context, message):
    monkeypatch.setenv("NO_PROXY", "127.0.0.1")
    port = closed_port()
    kubeconfig = write_kubeconfig(tmp_path / "kubeconfig", f"http://127.0.0.1:{port}", "token")
    result = materialize(data, kubeconfig=str(kubeconfig), context=context)
    assert not result.success
    text = failure_text(result)
    assert message.format(port=port) in text and "training.k8s.kubeconfig" in text


def test_launcher_k8s_without_an_image_is_a_settings_error(data):
    with pytest.raises(SettingsError, match=r"exp\.yaml: training: training\.launcher is k8s but training\."
                                            r"k8s\.image is empty; set training\.k8s\.image to an image"):
        from_mapping(HandholdConfig, {"training": {"launcher": "k8s"}}, "exp.yaml")
    result = materialize(data, image="")
    assert not result.success
    [event] = result.get_step_failure_events()
    assert "training.k8s.image is empty" in event.step_failure_data.error.to_string()
