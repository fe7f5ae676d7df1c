"""One source of settings: the pipeline's dataclasses, the Dagster resource, YAML files and deployments."""


import dataclasses
import os
import subprocess
import sys
from pathlib import Path

import dagster as dg
import pytest

from assets.definitions import definitions
from assets.graph import PROD_ENV
from assets.resources import Credentials, HandholdSettings, make_policy, plain
from assets.settings import (HandholdConfig, SettingsError, default_of, documented_yaml, field_docs, field_types,
                               load_config, to_mapping)

ROOT = Path(__file__).resolve().parent.parent
KEY = "sk-test-4c1d9e-never-shown"


def walk(cls: type, prefix: str = ""):
    """(dotted name, dataclass field, owning class) of every leaf setting under `cls`."""
    hints = field_types(cls)
    for f in dataclasses.fields(cls):
        name = f"{prefix}{f.name}"
        if dataclasses.is_dataclass(hints[f.name]):
            yield from walk(hints[f.name], name + ".")
        else:
            yield name, f, cls


def resource_field(dotted: str):
    model = HandholdSettings
    *sections, leaf = dotted.split(".")
    for section in sections:
        model = model.model_fields[section].default_factory
    return model.model_fields[leaf]


def test_every_setting_is_documented_and_reachable_with_the_same_default_and_doc():
    leaves = list(walk(HandholdConfig))
    assert len(leaves) > 60
    for name, f, owner in leaves:
        doc = field_docs(owner).get(f.name, "")
        assert doc, f"{owner.__name__}.{f.name} has no documentation"
        launchpad = resource_field(name)
        default = default_of(f)
        assert launchpad.default == (list(default) if isinstance(default, tuple) else default), name
        assert launchpad.description == doc, name
    assert plain(HandholdSettings()) == to_mapping(HandholdConfig())
    assert HandholdSettings().resolved() == HandholdConfig()


def test_yaml_files_load_and_the_default_file_is_complete():
    default = load_config(ROOT / "configs" / "default.yaml")
    assert (default.rollout.attempts, default.rollout.agent.max_steps, default.policy.kind) == (2, 40, "heuristic")
    text = (ROOT / "configs" / "default.yaml").read_text()
    assert text.split("\n", 1)[1] == documented_yaml(default).split("\n", 1)[1]  # every field, documented
    vllm = load_config(ROOT / "configs" / "vllm-anthropic.yaml")  # no server runs: nothing is contacted
    assert (vllm.policy.kind, vllm.guidance.teacher, vllm.rollout.attempts) == ("openai", "anthropic", 8)
    job = definitions("local").resolve_job_def("main")
    run_config = {"resources": {"settings": {"config": to_mapping(vllm)}}}
    assert dg.validate_run_config(job, run_config)["resources"]["settings"]["config"]["policy"]["kind"] == "openai"


@pytest.mark.parametrize("text, message", [
    ("rollout:\n  atempts: 3\n", "unknown setting 'rollout.atempts'; RolloutConfig has attempts"),
    ("rollout:\n  attempts: three\n", "rollout.attempts must be int, got str 'three'"),
    ("policy:\n  kind: gpt\n", "policy.kind is 'gpt'; choose one of 'heuristic', 'openai', 'anthropic', 'hf'"),
    ("synth:\n  packages: toolz\n", "synth.packages must be a list, got str 'toolz'"),
    ("rollout: 4\n", "rollout must be a mapping of settings, got int"),
    ("resources:\n  settings: {}\n", "run config without resources.settings.config"),
    ("a: [\n", "not valid YAML"),
])
def test_a_bad_file_names_the_key_and_the_file(tmp_path, text, message):
    path = tmp_path / "exp.yaml"
    path.write_text(text)
    with pytest.raises(SettingsError) as error:
        load_config(path)
    assert str(error.value).startswith(str(path)) and message in str(error.value)


def test_prod_loads_with_its_environment_and_names_what_is_missing():
    env = {**os.environ, **{name: "x" for name in PROD_ENV}}
    env["DOCKER_HOST"] = "unix:///nowhere.sock"
    done = subprocess.run([sys.executable, "-c", "import assets.prod as p; print(sorted(p.defs.resources))"],
                          cwd=ROOT, env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "['credentials', 'settings']"
    del env["ANTHROPIC_API_KEY"], env["HANDHOLD_POLICY_MODEL"]
    done = subprocess.run([sys.executable, "-c", "import assets.prod"], cwd=ROOT, env=env, capture_output=True,
                          text=True)
    assert done.returncode != 0
    assert ("needs these environment variables: HANDHOLD_POLICY_MODEL (the model name the policy server serves); "
            "ANTHROPIC_API_KEY (the teacher's Anthropic key)") in done.stderr


def test_keys_never_reach_the_run_config_the_logs_or_a_stored_row(monkeypatch, tmp_path):
    for name in PROD_ENV:
        monkeypatch.setenv(name, KEY if name.endswith("_KEY") else "http://127.0.0.1:9/v1")

    @dg.asset
    def policy_row(context: dg.AssetExecutionContext, settings: HandholdSettings, credentials: Credentials):
        policy = make_policy(settings, credentials)  # built, never called: no server is needed
        assert policy._client.api_key == KEY  # the key reached the client, from the deployment's EnvVar
        context.log.info(f"policy {policy.name} settings {policy.settings()}")
        return repr(policy.settings())

    instance = dg.DagsterInstance.ephemeral()
    result = dg.materialize([policy_row], resources=definitions("prod").resources, instance=instance)
    assert result.success and KEY not in result.output_for_node("policy_row")
    run = instance.get_run_by_id(result.run_id)
    logs = " ".join(str(e.user_message) + str(e.dagster_event) for e in instance.all_logs(result.run_id))
    assert KEY not in str(run.run_config) and KEY not in logs
    assert "HANDHOLD_POLICY_API_KEY" in repr(definitions("prod").resources["credentials"].policy_api_key)
