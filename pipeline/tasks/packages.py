"""Real packages as environments: fetch the sdist, make it a repository, build its image.

The image holds the pristine source at `/testbed` (no .git, no sdist, no wheel, no pip
cache, no bytecode) installed in editable mode with its test dependencies, all from
wheels built on the host so nothing in the container needs the network.
"""

from __future__ import annotations

import hashlib
import logging
import shlex
import shutil
import subprocess
import sys
import tarfile
import tomllib
from dataclasses import dataclass
from pathlib import Path

import docker

from sandbox.images import LABEL, SANDBOX_USER, build_from_dockerfile, image_exists

log = logging.getLogger(__name__)

WORKDIR = "/testbed"


@dataclass(frozen=True)
class PackageSpec:
    """A PyPI package at a pinned version, and where its sources and tests are."""

    name: str
    version: str
    test_paths: tuple[str, ...]
    """Test folders or files, relative to the sdist root."""
    source_globs: tuple[str, ...]
    """Globs of the source files bugs are injected into (tests are always excluded)."""
    test_requirements: tuple[str, ...] = ("pytest>=8,<9",)
    """What the tests need besides the package, as pip requirements."""

    @property
    def key(self) -> str:
        return f"{self.name}-{self.version}"


DEFAULT_PACKAGES = (
    PackageSpec("toolz", "1.0.0", ("toolz/tests",), ("toolz/*.py",)),
    PackageSpec("tabulate", "0.9.0", ("test",), ("tabulate/*.py",)),
    PackageSpec("boltons", "25.0.0", ("tests",), ("boltons/*.py",)),
)


def package_specs(names: tuple[str, ...]) -> tuple[PackageSpec, ...]:
    """The built-in pinned specs of these package names; an unknown name says which ones exist."""
    known = {p.name: p for p in DEFAULT_PACKAGES}
    unknown = [n for n in names if n not in known]
    if unknown:
        raise ValueError(f"synth.packages has unknown names {unknown}; choose from {sorted(known)}")
    return tuple(known[n] for n in names)


class PackageError(RuntimeError):
    """A package cannot become an environment (no sdist, no tests, does not install)."""


def _pip(*args: str, cwd: Path | None = None) -> None:
    done = subprocess.run([sys.executable, "-m", "pip", *args, "--disable-pip-version-check", "-q"],
                          cwd=cwd, capture_output=True, text=True)
    if done.returncode != 0:
        raise PackageError(f"pip {' '.join(args[:3])}... failed: {done.stderr.strip()[-1500:]}")


def fetch_source(spec: PackageSpec, cache: Path) -> Path:
    """Download and unpack the sdist into `cache/src/<name>-<version>`, a git repo; cached."""
    root = cache / "src" / spec.key
    if (root / ".git").is_dir():
        _check_tests(spec, root)
        return root
    sdists = cache / "sdist"
    sdists.mkdir(parents=True, exist_ok=True)
    archive = next(sdists.glob(f"{spec.name}-{spec.version}.tar.gz"), None)
    if archive is None:
        _pip("download", "--no-deps", "--no-binary", ":all:", f"{spec.name}=={spec.version}", "-d", str(sdists))
        archive = next(sdists.glob(f"{spec.name}-{spec.version}.tar.gz"), None)
    if archive is None:
        raise PackageError(f"{spec.key}: no .tar.gz source distribution on the index")
    tmp = cache / "src" / f".{spec.key}.unpack"
    shutil.rmtree(tmp, ignore_errors=True)
    with tarfile.open(archive) as tar:
        tar.extractall(tmp, filter="data")
    tops = list(tmp.iterdir())
    if len(tops) != 1:
        raise PackageError(f"{spec.key}: the sdist does not unpack into one folder ({len(tops)} entries)")
    top = tops[0]
    _check_tests(spec, top)
    _git_init(top)
    shutil.rmtree(root, ignore_errors=True)
    top.rename(root)
    shutil.rmtree(tmp, ignore_errors=True)
    return root


def _check_tests(spec: PackageSpec, root: Path) -> None:
    missing = [p for p in spec.test_paths if not (root / p).exists()]
    if missing:
        raise PackageError(f"{spec.key}: the sdist has no tests at {missing}; set test_paths to where they are")


def _git_init(root: Path) -> None:
    cmds = [["git", "init", "-q"], ["git", "add", "-A"],
            ["git", "-c", "user.name=handhold", "-c", "user.email=handhold@localhost",
             "commit", "-q", "-m", "pristine sdist"]]
    for cmd in cmds:
        subprocess.run(cmd, cwd=root, check=True, capture_output=True)


def build_requirements(root: Path) -> list[str]:
    """The [build-system] requires of the sdist (setuptools and wheel when it has none)."""
    pyproject = root / "pyproject.toml"
    if pyproject.exists():
        requires = tomllib.loads(pyproject.read_text()).get("build-system", {}).get("requires")
        if requires:
            return list(requires)
    return ["setuptools", "wheel"]


def _wheels(spec: PackageSpec, root: Path, cache: Path) -> Path:
    """Wheels of the build and test requirements, downloaded or built on the host; cached."""
    wheels = cache / "wheels" / spec.key
    if (wheels / ".complete").exists():
        return wheels
    wheels.mkdir(parents=True, exist_ok=True)
    _pip("wheel", "-w", str(wheels), *build_requirements(root), *spec.test_requirements)
    (wheels / ".complete").touch()
    return wheels


def image_tag(spec: PackageSpec, base_image_id: str) -> str:
    digest = hashlib.sha256(repr((spec, base_image_id)).encode()).hexdigest()[:10]
    return f"handhold/env-{spec.name}:{spec.version}-{digest}"


def dockerfile(base: str, spec: PackageSpec, build_requires: list[str]) -> str:
    reqs = " ".join(shlex.quote(r) for r in [*build_requires, *spec.test_requirements])
    return f"""FROM {base}
USER root
COPY wheels /tmp/wheels
COPY src {WORKDIR}
RUN pip install -q --no-index --find-links /tmp/wheels {reqs} \\
 && pip install -q --no-index --find-links /tmp/wheels --no-build-isolation --no-deps -e {WORKDIR} \\
 && rm -rf /tmp/wheels /root/.cache /home/{SANDBOX_USER}/.cache \\
 && find {WORKDIR} -name __pycache__ -prune -exec rm -rf {{}} + \\
 && chown -R {SANDBOX_USER} {WORKDIR}
WORKDIR {WORKDIR}
USER {SANDBOX_USER}
LABEL {LABEL}=environment {LABEL}.package={spec.name} {LABEL}.version={spec.version}
"""


def build_environment_image(spec: PackageSpec, base_image: str, cache: Path, client: docker.DockerClient) -> str:
    """The environment image of one package version; built once, then reused."""
    base_id = client.images.get(base_image).id
    tag = image_tag(spec, base_id)
    if image_exists(client, tag):
        return tag
    root = fetch_source(spec, cache)
    wheels = _wheels(spec, root, cache)
    src = cache / "ctx" / spec.key
    shutil.rmtree(src, ignore_errors=True)
    shutil.copytree(root, src, ignore=shutil.ignore_patterns(".git", "__pycache__", "*.pyc"))
    try:
        build_from_dockerfile(client, dockerfile(base_image, spec, build_requirements(root)), tag,
                              files={"wheels": str(wheels), "src": str(src)})
    except RuntimeError as exc:
        raise PackageError(f"{spec.key}: the environment image does not build: {exc}") from exc
    finally:
        shutil.rmtree(src, ignore_errors=True)
    log.info("built %s", tag)
    return tag


def test_command(spec: PackageSpec) -> str:
    """The pytest command the tasks of this package use (output parsed by swebench's pytest parser)."""
    return "python -m pytest -rA --tb=short -p no:cacheprovider " + " ".join(shlex.quote(p) for p in spec.test_paths)
