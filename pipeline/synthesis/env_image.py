"""The environment image of one package version: the pristine source (without the copies of it an sdist
ships), its dependencies installed from wheels built on the host, the package installed editable, and the
tree compiled once (`compile_tree`). Named by what it holds, so it is built once and then reused."""

from __future__ import annotations

import hashlib
import logging
import shlex
import shutil
from pathlib import Path

import docker

from pipeline.synthesis.packages import (WORKDIR, PackageError, PackageSpec, dependency_wheels, fetch_source,
                                         normalized_name, resolve, test_command)
from pipeline.tasks.copies import BUILD_OUTPUTS, hidden_copies
from sandbox.images import LABEL, SANDBOX_USER, build_from_dockerfile, image_exists

log = logging.getLogger(__name__)

IMAGE_RULES = 2  # raised when what the image leaves out changes: images built before are rebuilt


def image_tag(spec: PackageSpec, base_image_id: str) -> str:
    """Named by what the image holds: the Dockerfile (version, requirements, install) and the base image."""
    digest = hashlib.sha256(repr((dockerfile("", spec), base_image_id, IMAGE_RULES)).encode()).hexdigest()[:10]
    return f"handhold/env-{normalized_name(spec.name)}:{spec.version}-{digest}"


def dockerfile(base: str, spec: PackageSpec) -> str:
    reqs = " ".join(shlex.quote(r) for r in [*(spec.build_requirements or ()), *(spec.test_requirements or ())])
    built = " ".join(f"build/{p}" for p in BUILD_OUTPUTS)  # what an editable install may build in the tree
    return f"""FROM {base}
USER root
COPY wheels /tmp/wheels
COPY src {WORKDIR}
RUN pip install -q --no-index --find-links /tmp/wheels {reqs} \\
 && pip install -q --no-index --find-links /tmp/wheels --no-build-isolation --use-pep517 -e {WORKDIR} \\
 && rm -rf /tmp/wheels /root/.cache /home/{SANDBOX_USER}/.cache \\
 && find {WORKDIR} -name __pycache__ -prune -exec rm -rf {{}} + \\
 && (cd {WORKDIR} && test -e build/__init__.py || rm -rf {built}; rmdir build 2>/dev/null; true) \\
 && (cd {WORKDIR} && {compile_tree(spec)}) \\
 && chown -R {SANDBOX_USER} {WORKDIR}
WORKDIR {WORKDIR}
USER {SANDBOX_USER}
LABEL {LABEL}=environment {LABEL}.package={spec.name} {LABEL}.version={spec.version}
"""


def compile_tree(spec: PackageSpec) -> str:
    """Shell that compiles the tree once, so runs of the tests skip it: the source as hash-checked bytecode
    (an edited file is told apart by its contents, never by a clock) and, with one collection, pytest's
    assertion-rewritten test modules. Sandboxes keep PYTHONDONTWRITEBYTECODE, so an edit's bytecode is
    never written; a task's sandbox removes the bytecode of the files its bug touches
    (pipeline/verifier/environment.py)."""
    collect = "" if spec.test_command else f"; PYTHONDONTWRITEBYTECODE= {test_command(spec)} --collect-only -q"
    return f"{{ python -m compileall -q -j 0 --invalidation-mode checked-hash .{collect}; }} >/dev/null 2>&1; true"


def build_environment_image(spec: PackageSpec, base_image: str, cache: Path, client: docker.DockerClient) -> str:
    """The environment image of one package version; built once, then reused."""
    spec = resolve(spec, cache)
    tag = image_tag(spec, client.images.get(base_image).id)
    if image_exists(client, tag):
        return tag
    root = fetch_source(spec, cache)
    wheels = dependency_wheels(spec, root, cache)
    src = cache / "ctx" / spec.key
    shutil.rmtree(src, ignore_errors=True)
    shutil.copytree(root, src, ignore=_leaving_out(root, hidden_copies(root, spec.source_globs or ())))
    try:
        build_from_dockerfile(client, dockerfile(base_image, spec), tag, files={"wheels": str(wheels), "src": str(src)})
    except RuntimeError as exc:
        raise PackageError(f"{spec.key}: the environment image does not build; reproduce with `docker build` "
                           f"of the Dockerfile below in a folder holding wheels/ (a copy of {wheels}) and src/ (a "
                           f"copy of {root}); set test_requirements=... in the package entry if a requirement "
                           f"is at fault: {exc}\n{dockerfile(base_image, spec)}", "image") from exc
    finally:
        shutil.rmtree(src, ignore_errors=True)
    log.info("built %s", tag)
    return tag


def _leaving_out(root: Path, rel_paths: list[str]):
    """A copytree `ignore` that skips .git and these paths of `root`."""
    skip = {str(root / r) for r in rel_paths}

    def ignore(folder: str, names: list[str]) -> set[str]:
        return {n for n in names if n == ".git" and Path(folder) == root or f"{folder}/{n}" in skip}
    return ignore
