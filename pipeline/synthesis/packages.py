"""Real packages as environments: fetch the sdist, make it a repository, build its image.

A package entry is `name==version`, or `name` for the latest sdist on the index, optionally
followed by overrides: `attrs==25.3.0 test_paths=tests source_globs='src/attr/*.py'
test_requirements='hypothesis pympler' test_command='python -m pytest -rA tests'` (lists are
space-separated; quote with shell rules). The Python API also takes the mapping form
`{"name": ..., "version": ..., "test_paths": [...], ...}`. What an entry leaves out is
discovered from the unpacked sdist (pipeline/synthesis/discover.py) and the build backend
(pipeline/synthesis/backend.py).

The image holds the pristine source at `/testbed` (no .git, no sdist, no wheel, no pip
cache, no bytecode, no build tree: nothing `pipeline/tasks/copies.py` lists) installed in editable
mode with its dependencies and test requirements, all from wheels built on the host so nothing in
the container needs the network.
"""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import hashlib
import json
import logging
import re
import shlex
import shutil
import subprocess
import tarfile
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping

from pipeline.synthesis.backend import BackendError, editable_requirements, installed_backend, run_pip
from pipeline.synthesis.discover import DISCOVERY_VERSION, PYTEST, discover

log = logging.getLogger(__name__)

WORKDIR = "/testbed"
OVERRIDES = ("test_paths", "source_globs", "test_requirements", "test_command")


@dataclass(frozen=True)
class PackageSpec:
    """A PyPI package version, where its sources and tests are and how they run; None: discovered."""

    name: str
    version: str
    """Empty: the latest sdist on the index (resolved to a concrete version before use)."""
    test_paths: tuple[str, ...] | None = None
    """Test folders or files, relative to the sdist root."""
    source_globs: tuple[str, ...] | None = None
    """Globs of the source files bugs are injected into (tests are always excluded)."""
    test_requirements: tuple[str, ...] | None = None
    """What the tests need besides the package, as pip requirements."""
    pytest_args: tuple[str, ...] | None = None
    """pytest arguments besides the test paths (import mode, an addopts without unusable plugins)."""
    test_command: str = ""
    """The whole test command, replacing the pytest one (its output must be pytest's `-rA` report)."""
    build_requirements: tuple[str, ...] | None = None
    """What `pip install --no-build-isolation -e` needs installed first."""

    @property
    def key(self) -> str:
        return f"{self.name}-{self.version or 'latest'}"


def _builtin(name: str, version: str, tests: str, sources: str) -> PackageSpec:
    return PackageSpec(name, version, (tests,), (sources,), (PYTEST,), ())


DEFAULT_PACKAGES = (
    _builtin("toolz", "1.0.0", "toolz/tests", "toolz/*.py"),
    _builtin("tabulate", "0.9.0", "test", "tabulate/*.py"),
    _builtin("boltons", "25.0.0", "tests", "boltons/*.py"),
)


class PackageError(RuntimeError):
    """A package cannot become an environment; `stage` says where, the message why and what to change."""

    def __init__(self, message: str, stage: str = "package"):
        super().__init__(message)
        self.stage = stage


def parse_entry(entry: str | Mapping) -> PackageSpec:
    """The spec of one `packages` entry (string or mapping form); a bad entry raises ValueError saying why."""
    if isinstance(entry, Mapping):
        fields = dict(entry)
        name = str(fields.pop("name", ""))
        version = str(fields.pop("version", "") or "")
    else:
        try:
            head, *rest = shlex.split(str(entry))
        except ValueError as exc:
            raise ValueError(f"package entry {entry!r}: {exc}") from exc
        name, _, version = head.partition("==")
        if any("=" not in part for part in rest):
            raise ValueError(f"package entry {entry!r}: expected `name==version` or `name`, then key=value overrides")
        fields = dict(part.partition("=")[::2] for part in rest)
    if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]*", name) or not re.fullmatch(r"[A-Za-z0-9.!+_-]*", version):
        raise ValueError(f"package entry {entry!r}: expected `name==version` or `name`, then key=value overrides")
    unknown = sorted(set(fields) - set(OVERRIDES))
    if unknown:
        raise ValueError(f"package entry {entry!r}: unknown override {unknown[0]!r}; choose from {list(OVERRIDES)}")
    builtin = next((p for p in DEFAULT_PACKAGES if p.name == name and version in ("", p.version)), None)
    if builtin and not fields:
        return builtin
    lists = {k: tuple(v.split() if isinstance(v, str) else map(str, v)) for k, v in fields.items() if k != "test_command"}
    if "test_requirements" in lists and not any(re.match(r"pytest($|[\s<>=!~;\[])", r) for r in lists["test_requirements"]):
        lists["test_requirements"] = (PYTEST, *lists["test_requirements"])
    return PackageSpec(name, version, **lists, test_command=str(fields.get("test_command", "")))


def package_specs(entries: tuple[str | Mapping, ...]) -> tuple[PackageSpec, ...]:
    """The specs of these `packages` entries (built-in names keep their pins; the rest is discovered)."""
    return tuple(parse_entry(e) for e in entries)


def _pip(stage: str, key: str, *args: str, fix: str, backend: Path | None = None, out: Path | None = None) -> str:
    done = run_pip(args, backend, out)
    if done.returncode != 0:
        raise PackageError(f"{key}: `pip {shlex.join(args)}` failed; {fix}. pip said: "
                           f"{done.stderr.strip()[-1200:]}", stage)
    return done.stdout


def normalized_name(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _sdist(spec: PackageSpec, sdists: Path) -> Path | None:
    """The downloaded sdist of this spec's name and version (names compared PEP 503-normalized)."""
    for path in sorted(sdists.iterdir()) if sdists.is_dir() else []:
        stem = re.sub(r"\.(tar\.gz|zip)$", "", path.name)
        name, _, version = stem.rpartition("-")
        if stem != path.name and normalized_name(name) == normalized_name(spec.name) and version == spec.version:
            return path
    return None


def resolve_version(spec: PackageSpec, cache: Path) -> PackageSpec:
    """The spec at a concrete version: `name` alone means the newest sdist on the index (downloaded)."""
    if spec.version:
        return spec
    sdists = cache / "sdist"
    sdists.mkdir(parents=True, exist_ok=True)
    out = _pip("fetch", spec.key, "download", "--no-deps", "--no-binary", ":all:", spec.name, "-d", str(sdists),
               fix="check the name on PyPI, or pin `name==version` of a release that has an sdist")
    saved = re.findall(r"(?:Saved|File was already downloaded)\s+(\S+)", out)
    if not saved:
        raise PackageError(f"{spec.key}: pip downloaded no sdist ({out.strip()[-300:]})", "fetch")
    stem = re.sub(r"\.(tar\.gz|zip)$", "", Path(saved[-1]).name)
    return dataclasses.replace(spec, version=stem.rpartition("-")[2])


@contextlib.contextmanager
def package_lock(cache: Path, name: str):
    """Held while this process fetches, builds or synthesizes package `name` in `cache`: runs sharing a cache
    (the cache_dir setting) wait for each other instead of unpacking or synthesizing into the same files."""
    path = cache / "locks" / f"{name}.lock"
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)  # released when the file closes, or when the process dies
        yield


def fetch_source(spec: PackageSpec, cache: Path) -> Path:
    """Download and unpack the sdist into `cache/src/<name>-<version>`, a git repo; cached."""
    spec = resolve_version(spec, cache)
    root = cache / "src" / spec.key
    if not (root / ".git").is_dir():
        _unpack(spec, cache, root)
    if spec.test_paths is not None:
        _check_tests(spec, root)
    return root


def _unpack(spec: PackageSpec, cache: Path, root: Path) -> None:
    sdists = cache / "sdist"
    sdists.mkdir(parents=True, exist_ok=True)
    if _sdist(spec, sdists) is None:
        _pip("fetch", spec.key, "download", "--no-deps", "--no-binary", ":all:", f"{spec.name}=={spec.version}",
             "-d", str(sdists), fix="check the name and version on PyPI (the release needs an sdist)")
    archive = _sdist(spec, sdists)
    if archive is None:
        raise PackageError(f"{spec.key}: no .tar.gz or .zip source distribution on the index", "fetch")
    tmp = cache / "src" / f".{spec.key}.unpack"
    shutil.rmtree(tmp, ignore_errors=True)
    if archive.suffix == ".zip":
        with zipfile.ZipFile(archive) as z:
            z.extractall(tmp)
    else:
        with tarfile.open(archive) as tar:
            tar.extractall(tmp, filter="data")
    tops = list(tmp.iterdir())
    if len(tops) != 1:
        raise PackageError(f"{spec.key}: the sdist does not unpack into one folder ({len(tops)} entries)", "fetch")
    _git_init(tops[0])
    shutil.rmtree(root, ignore_errors=True)
    tops[0].rename(root)
    shutil.rmtree(tmp, ignore_errors=True)


def _check_tests(spec: PackageSpec, root: Path) -> None:
    missing = [p for p in spec.test_paths or () if not (root / p).exists()]
    if missing or not spec.test_paths:
        raise PackageError(f"{spec.key}: the sdist has no tests at {missing or 'any usual place'}; set "
                           f"test_paths=<folders> in the package entry to where they are, or pick a package "
                           f"whose sdist ships its tests (look: tar tzf <sdist> | grep test)", "discover")


def _git_init(root: Path) -> None:
    cmds = [["git", "init", "-q"], ["git", "add", "-A"],
            ["git", "-c", "user.name=handhold", "-c", "user.email=handhold@localhost",
             "commit", "-q", "--allow-empty", "-m", "pristine sdist"]]
    for cmd in cmds:
        subprocess.run(cmd, cwd=root, check=True, capture_output=True)


def resolve(spec: PackageSpec, cache: Path) -> PackageSpec:
    """The spec with every field concrete: version, discovered tests and requirements, build needs, and
    test requirements that build as wheels (imports-only guesses that do not are dropped); cached."""
    spec = resolve_version(spec, cache)
    if None not in (spec.test_paths, spec.source_globs, spec.test_requirements, spec.pytest_args,
                    spec.build_requirements):
        return spec
    key = hashlib.sha256(repr((spec, DISCOVERY_VERSION)).encode()).hexdigest()[:12]
    saved = cache / "specs" / f"{spec.key}-{key}.json"
    if saved.exists():
        return _from_json(json.loads(saved.read_text()))
    root = fetch_source(spec, cache)
    found = discover(root, spec.name)
    spec = dataclasses.replace(
        spec, test_paths=spec.test_paths if spec.test_paths is not None else found.test_paths,
        source_globs=spec.source_globs if spec.source_globs is not None else found.source_globs,
        pytest_args=spec.pytest_args if spec.pytest_args is not None else found.pytest_args)
    _check_tests(spec, root)
    if spec.build_requirements is None:
        try:
            spec = dataclasses.replace(spec, build_requirements=tuple(editable_requirements(root, cache)))
        except BackendError as exc:
            raise PackageError(f"{spec.key}: {exc}", "build") from exc
    if spec.test_requirements is None:
        declared = tuple(r for r in found.test_requirements if r not in found.guessed)
        try:
            spec = dataclasses.replace(spec, test_requirements=found.test_requirements)
            dependency_wheels(spec, root, cache)
        except PackageError:
            if not found.guessed:
                raise
            log.info("%s: without %s, which the tests import but do not declare", spec.key, found.guessed)
            spec = dataclasses.replace(spec, test_requirements=declared)
    dependency_wheels(spec, root, cache)
    if not spec.source_globs:
        raise PackageError(f"{spec.key}: no package folder or module found to inject bugs into; set "
                           "source_globs=<globs> in the package entry", "discover")
    log.info("%s: %s", spec.key, "; ".join(found.found))
    saved.parent.mkdir(parents=True, exist_ok=True)
    saved.write_text(json.dumps(dataclasses.asdict(spec)))
    return spec


def _from_json(data: dict) -> PackageSpec:
    return PackageSpec(**{k: tuple(v) if isinstance(v, list) else v for k, v in data.items()})


def dependency_wheels(spec: PackageSpec, root: Path, cache: Path) -> Path:
    """Wheels of the package's dependencies, build and test requirements, from the index or built on
    the host; cached."""
    reqs = [*(spec.build_requirements or ()), *(spec.test_requirements or ())]
    wheels = cache / "wheels" / f"{spec.key}-{hashlib.sha256(repr(reqs).encode()).hexdigest()[:10]}"
    if (wheels / ".complete").exists():
        return wheels
    wheels.mkdir(parents=True, exist_ok=True)
    backend = installed_backend(root, cache)
    # pip builds a local folder in place: on `root` itself, setuptools would leave build/lib (a copy of the
    # pristine source) in the tree the image is made from
    with tempfile.TemporaryDirectory(prefix="handhold-wheel-") as tmp:
        copy = Path(tmp) / root.name
        shutil.copytree(root, copy, ignore=shutil.ignore_patterns(".git"))
        _pip("wheels", spec.key, "wheel", "-q", "-w", str(wheels), *reqs, str(copy), backend=backend, out=wheels,
             fix="set test_requirements=<requirements> in the package entry to ones that install")
    (wheels / ".complete").touch()
    return wheels


def test_command(spec: PackageSpec) -> str:
    """The pytest command the tasks of this package use (output parsed by swebench's pytest parser). Without
    pytest's unraisable-exception plugin, whose five `gc.collect()` at exit were a tenth of a toolz run (1.1 s):
    it only turns exceptions raised in `__del__` into warnings, and every run of a task (validation, grading)
    uses this same command."""
    if spec.test_command:
        return spec.test_command
    return "python -m pytest -rA --tb=short -p no:cacheprovider -p no:unraisableexception " + \
        " ".join(shlex.quote(p) for p in [*(spec.pytest_args or ()), *(spec.test_paths or ())])
