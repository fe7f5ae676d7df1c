"""The asset graph and the resources each deployment binds it to (assets.definitions and assets.scaling
build their Definitions from these)."""

from __future__ import annotations

import dagster as dg

from assets.datasets import dataset_export, hub_publication, training_datasets
from assets.environments import environment_images, sandbox_base_image, task_sources, tasks
from assets.guidance import guidance, guided_rollouts
from assets.resources import Credentials, HandholdSettings, config_model
from assets.rollouts import unguided_rollouts
from assets.training import actguide_model, dpo_model, policy_evaluation, sft_model
from pipeline.agent.factory import PolicySpec
from pipeline.rollouts.rescue import GuidanceConfig

all_assets = [sandbox_base_image, task_sources, environment_images, tasks, unguided_rollouts, guidance,
              guided_rollouts, training_datasets, dataset_export, hub_publication, sft_model, dpo_model, actguide_model,
              policy_evaluation]

# What the prod deployment reads from its environment, and what each variable holds.
PROD_ENV = {
    "DOCKER_HOST": "the Docker engine sandboxes run on (read by the Docker SDK)",
    "HANDHOLD_POLICY_BASE_URL": "the OpenAI-compatible server of the policy, e.g. http://vllm:8000/v1",
    "HANDHOLD_POLICY_MODEL": "the model name the policy server serves",
    "HANDHOLD_POLICY_API_KEY": "the policy server's key",
    "HANDHOLD_TEACHER_MODEL": "the Anthropic model of the teacher",
    "ANTHROPIC_API_KEY": "the teacher's Anthropic key",
    "HF_TOKEN": "the Hugging Face Hub token datasets are published with",
}


def resources(deployment: str) -> dict:
    """The resources of a deployment: 'local' (heuristic policy, rule teacher, local engine) or 'prod'."""
    if deployment == "local":
        return {"settings": HandholdSettings(), "credentials": Credentials()}
    if deployment != "prod":
        raise ValueError(f"unknown deployment {deployment!r}; choose 'local' or 'prod'")
    policy = config_model(PolicySpec)(kind="openai", model=dg.EnvVar("HANDHOLD_POLICY_MODEL"),
                                      base_url=dg.EnvVar("HANDHOLD_POLICY_BASE_URL"))
    guidance = config_model(GuidanceConfig)(teacher="anthropic", teacher_model=dg.EnvVar("HANDHOLD_TEACHER_MODEL"))
    return {"settings": HandholdSettings(policy=policy, guidance=guidance),
            "credentials": Credentials(policy_api_key=dg.EnvVar("HANDHOLD_POLICY_API_KEY"),
                                       teacher_api_key=dg.EnvVar("ANTHROPIC_API_KEY"),
                                       hub_token=dg.EnvVar("HF_TOKEN"))}


def missing_prod_env(environ: dict) -> list[str]:
    """The prod deployment's variables that `environ` lacks, each with what it should hold."""
    return [f"{name} ({what})" for name, what in PROD_ENV.items() if not environ.get(name)]
