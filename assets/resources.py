"""Resources shared by the assets: the run's settings and the credentials of the clients.

`HandholdSettings` is derived from `assets.settings.HandholdConfig`: every field, default,
choice (`Literal`) and doc comes from the pipeline's dataclasses, nothing is declared twice.
Clients (policy, teacher) are built only by the asset that uses them.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import typing
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Literal

import dagster as dg
from pydantic import Field, create_model

from pipeline.core.layout import Layout
from assets.settings import HandholdConfig, default_of, field_docs, field_types, from_mapping


@functools.cache
def config_model(cls: type) -> type[dg.Config]:
    """A Dagster Config class with the fields, defaults, choices and docs of a config dataclass."""
    return create_model(f"{cls.__name__}Settings", __base__=dg.Config, __doc__=cls.__doc__, **_fields(cls))


def _fields(cls: type) -> dict[str, Any]:
    docs, hints, fields = field_docs(cls), field_types(cls), {}
    for f in dataclasses.fields(cls):
        kind = hints[f.name]
        if dataclasses.is_dataclass(kind):
            model = config_model(kind)
            fields[f.name] = (model, Field(default_factory=model, description=docs.get(f.name)))
        else:
            default = default_of(f)
            fields[f.name] = (_annotation(kind), Field(list(default) if isinstance(default, tuple) else default,
                                                       description=docs.get(f.name)))
    return fields


def _annotation(kind: Any) -> Any:
    """Dagster's form of a field type: tuples become lists (of str for a tuple of Literal, which Dagster cannot
    type: the choices are checked when the settings resolve), the rest is as declared."""
    if typing.get_origin(kind) is tuple:
        item = typing.get_args(kind)[0]
        return list[str if typing.get_origin(item) is Literal else item]
    if typing.get_origin(kind) is Literal or kind in (str, int, float, bool):
        return kind
    raise TypeError(f"{kind!r} cannot be a setting: use str, int, float, bool, Literal, tuple or a config dataclass")


def plain(value: Any) -> Any:
    """Settings as nested plain data, from a Dagster Config (or resource) object."""
    if isinstance(value, (dg.Config, dg.ConfigurableResource)):
        return {name: plain(getattr(value, name)) for name in type(value).model_fields}
    return list(value) if isinstance(value, tuple) else value


class _Settings(dg.ConfigurableResource):
    """Run-wide settings; every field can be set per run in the launchpad or from a YAML file."""

    def resolved(self) -> HandholdConfig:
        """The settings as the pipeline's own config tree."""
        return from_mapping(HandholdConfig, plain(self), "the settings resource")

    def layout(self) -> Layout:
        """The data folder: every path a stage writes or reads (pipeline/core/layout.py)."""
        return Layout(Path(self.data_dir), Path(self.cache_dir) if self.cache_dir else None)

    def batch_name(self, context) -> str:
        """The run's batch partition; else `batch`; else the newest batch with stored attempts (what a run the
        automation started after a batch builds on); else the UTC date the run was created (the same for
        every asset of a run)."""
        partition = context.run.tags.get("dagster/partition")
        if partition or self.batch:
            return partition or self.batch
        newest = self.layout().newest_batch()
        if newest:
            return newest
        record = context.instance.get_run_record_by_id(context.run_id)
        created = record.create_timestamp if record else datetime.now(timezone.utc)
        return created.strftime("%Y-%m-%d")


HandholdSettings = create_model("HandholdSettings", __base__=_Settings, __doc__=_Settings.__doc__,
                                **_fields(HandholdConfig))


class Credentials(dg.ConfigurableResource):
    """Keys of the clients, set with dg.EnvVar in a deployment so that the UI shows only the variable's name.

    Empty: each client reads the environment variable its settings name (`api_key_env`).
    """

    policy_api_key: str = ""
    """Key of the policy's server."""
    teacher_api_key: str = ""
    """Key of the teacher LLM's server."""
    hub_token: str = ""
    """Hugging Face Hub token for publishing datasets."""

    def key(self, which: str) -> str | None:
        """A key, or None to let the client read its environment variable."""
        return getattr(self, f"{which}_api_key") or None


@contextlib.contextmanager
def retry_on_infra(context, retries: int = 3, first_wait: float = 30.0):
    """Re-run the step, waiting first_wait, then twice as long each time, when the Docker engine, a sandbox
    or the model server fails it; any other error fails the step at once. Work already stored is kept
    (batches resume)."""
    import docker

    from pipeline.agent.policy import PolicyError
    from sandbox.base import SandboxError

    try:
        yield
    except (docker.errors.DockerException, SandboxError, PolicyError, ConnectionError, TimeoutError) as error:
        wait = first_wait * 2 ** context.retry_number
        context.log.warning(f"infrastructure error ({type(error).__name__}: {error}); retry "
                            f"{context.retry_number + 1} of {retries} in {wait:.0f} s")
        raise dg.RetryRequested(max_retries=retries, seconds_to_wait=wait) from error


def retried_on_infra(compute):
    """An asset's compute function run under `retry_on_infra` (its first parameter is the context)."""

    @functools.wraps(compute)
    def run(context, *args, **kwargs):
        with retry_on_infra(context):
            return compute(context, *args, **kwargs)

    return run


def make_policy(settings: _Settings, credentials: Credentials, batch: str = ""):
    """The policy that rolls `batch` out: the one its round names (pipeline/rollouts/rounds.py: the settings' policy, or the
    latest checkpoint of `policy.from_stage`), built now (only the assets that run it call this); without a batch,
    the settings' policy."""
    from pipeline.agent.factory import make_policy as build
    from pipeline.rollouts.rounds import batch_policy

    config, key = settings.resolved(), credentials.key("policy")
    spec = batch_policy(settings.layout(), config.policy, batch, key)[1] if batch else config.policy
    return build(spec, api_key=key)
