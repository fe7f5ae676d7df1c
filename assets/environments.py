"""Assets that make the SWE environments: the sandbox base image first."""

from __future__ import annotations

import dagster as dg

from assets.resources import HandholdSettings
from sandbox.images import BaseImageConfig, docker_client, ensure_base_image


@dg.asset(group_name="environments", kinds={"docker"})
def sandbox_base_image(settings: HandholdSettings) -> dg.MaterializeResult:
    """The image every sandbox and environment image starts from (pulled, or built from Debian)."""
    client = docker_client()
    tag = ensure_base_image(BaseImageConfig(tag=settings.base_image), client=client)
    image = client.images.get(tag)
    return dg.MaterializeResult(metadata={
        "tag": tag, "image_id": image.short_id, "size_mb": round(image.attrs["Size"] / 1e6, 1),
    })
