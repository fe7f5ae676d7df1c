"""Shared fixtures. Docker tests fail (never skip) when HANDHOLD_REQUIRE_DOCKER=1, as in CI."""

from __future__ import annotations

import os

import pytest


@pytest.fixture(scope="session")
def docker_client():
    """A client for a live engine; skips on a laptop without Docker, fails where it is required."""
    import docker

    try:
        client = docker.from_env(timeout=300)
        client.ping()
    except Exception as exc:
        if os.environ.get("HANDHOLD_REQUIRE_DOCKER") == "1":
            pytest.fail(f"Docker engine required (HANDHOLD_REQUIRE_DOCKER=1) but none answers: {exc}")
        pytest.skip(f"no Docker engine answers: {exc}")
    return client


@pytest.fixture(scope="session")
def base_image(docker_client) -> str:
    from sandbox.images import ensure_base_image

    return ensure_base_image(client=docker_client)
