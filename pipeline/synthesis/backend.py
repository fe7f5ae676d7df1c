"""What building an sdist in editable mode needs, as its build backend itself says.

The backend named in `[build-system]` is installed on the host and asked through the
PEP 517/660 hooks (`get_requires_for_build_editable`, `build_editable`), the way pip asks it:
hatchling answers `editables` where it needs it, setuptools `wheel`. A setuptools older than 64
has no editable hook, so setuptools and wheel pins are raised to what PEP 660 needs.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import tomllib
from pathlib import Path

LEGACY_BACKEND = "setuptools.build_meta:__legacy__"
MARK = "HANDHOLD-BACKEND "
# What pip logs of an sdist whose metadata does not match the version its file name says (it then discards it)
INCONSISTENT = ("but installing version", "has inconsistent")
HOOK = f"""
import importlib, json, sys
mod, _, attr = sys.argv[1].partition(":")
backend = importlib.import_module(mod)
for part in filter(None, attr.split(".")):
    backend = getattr(backend, part)
hook = getattr(backend, "get_requires_for_build_editable", None)
print({MARK!r} + json.dumps({{"editable": hasattr(backend, "build_editable"), "requires": list(hook() if hook else [])}}))
"""


class BackendError(RuntimeError):
    """The build backend cannot be installed or asked (the message says which command to rerun)."""


def build_system(root: Path) -> tuple[list[str], str, list[str]]:
    """(requires, backend, backend-path) of the sdist's [build-system], with PEP 517's defaults."""
    table: dict = {}
    if (root / "pyproject.toml").is_file():
        try:
            table = tomllib.loads((root / "pyproject.toml").read_text(errors="replace")).get("build-system", {})
        except tomllib.TOMLDecodeError as exc:  # pip cannot build it either: the package is set aside
            raise BackendError(f"its pyproject.toml is not valid TOML ({exc}), so no build backend can be read "
                               f"from it ({root / 'pyproject.toml'}); pin another version of the package") from exc
    requires = table.get("requires") or ["setuptools>=40.8.0", "wheel"]
    return list(requires), table.get("build-backend") or LEGACY_BACKEND, list(table.get("backend-path") or [])


def raised_pins(requires: list[str]) -> list[str]:
    """`requires` with setuptools and wheel free of upper pins and setuptools at least 64 (PEP 660
    editables); their lower bounds stay (a base image may hold an older setuptools that pip keeps)."""
    out = []
    for req in requires:
        match = re.match(r"\s*(setuptools|wheel)(?=$|[\s\[<>=!~;,])\s*(\[[^\]]*\])?\s*([^;]*)", req, re.IGNORECASE)
        if not match:
            out.append(req)
            continue
        name = match.group(1).lower()
        lower = [c.strip() for c in match.group(3).split(",") if c.strip().startswith((">", "!="))]
        out.append(",".join([f"{name}>=64"] * (name == "setuptools") + lower) if name == "setuptools" or lower
                   else name)
    return list(dict.fromkeys(out))


def _pinned(requires: list[str], target: Path) -> list[str]:
    """`requires` pinned to the versions installed in `target`: the image gets the backend that was asked
    (a base image's older setuptools would otherwise satisfy `setuptools>=64` and lack bdist_wheel)."""
    installed = {}
    for info in target.glob("*.dist-info"):
        name, _, version = info.name.removesuffix(".dist-info").rpartition("-")
        installed[re.sub(r"[-_.]+", "-", name).lower()] = version
    out = []
    for req in requires:
        match = re.match(r"\s*([A-Za-z0-9][A-Za-z0-9._-]*)\s*(\[[^\]]*\])?", req)
        version = installed.get(re.sub(r"[-_.]+", "-", match.group(1)).lower()) if match and ";" not in req else None
        out.append(f"{match.group(1)}{match.group(2) or ''}=={version}" if version else req)
    return out


def backend_requires(root: Path) -> tuple[list[str], str, list[str]]:
    """`build_system` with setuptools named where the backend is setuptools', and pins raised for PEP 660."""
    requires, backend, backend_path = build_system(root)
    if backend.startswith("setuptools.") and not any(re.match(r"\s*setuptools(?=$|[\s\[<>=!~;,])", r) for r in requires):
        requires = [*requires, "setuptools"]
    return raised_pins(requires), backend, backend_path


def backend_target(requires: list[str], cache: Path) -> Path:
    """A folder holding these build requirements, installed once per set of them in the cache (packages that
    ask the same share it); written aside and renamed, so runs sharing the cache never see half of one."""
    target = cache / "backend" / hashlib.sha256(repr(sorted(requires)).encode()).hexdigest()[:12]
    if (target / ".complete").exists():
        return target
    aside = target.with_name(f"{target.name}.{os.getpid()}")
    pip = [sys.executable, "-m", "pip", "install", "-q", "--disable-pip-version-check", "--no-compile",
           "--target", str(aside), *requires]
    done = subprocess.run(pip, capture_output=True, text=True)
    if done.returncode != 0:
        shutil.rmtree(aside, ignore_errors=True)
        raise BackendError(f"installing the build backend failed: `{' '.join(pip)}`: {done.stderr.strip()[-800:]}")
    (aside / ".complete").touch()
    try:
        aside.rename(target)
    except OSError:  # another run installed the same set first
        shutil.rmtree(aside, ignore_errors=True)
    return target


def installed_backend(root: Path, cache: Path) -> Path | None:
    """`backend_target` of the sdist's build requirements; None when they do not install (an isolated build
    then says why)."""
    try:
        return backend_target(backend_requires(root)[0], cache)
    except BackendError:
        return None


def run_pip(args: tuple[str, ...], backend: Path | None = None, out: Path | None = None) -> subprocess.CompletedProcess:
    """pip; given the folder `installed_backend` installed the package's build requirements in (`backend`), first
    without build isolation, that folder on PYTHONPATH: an isolated build installs the backend anew each time
    (~5 CPU s). A failure, or metadata that disagreed with its file's version, is made again isolated, `out`
    emptied first: a dependency's sdist may need plugins the package's backend lacks, and its metadata is then
    wrong (tabulate's says 0.0.0 without setuptools_scm, and pip discards it for an older tabulate, no error)."""
    cmd = [sys.executable, "-m", "pip", *args, "--disable-pip-version-check"]
    if backend is not None:
        with tempfile.NamedTemporaryFile("r", prefix="handhold-pip-", suffix=".log") as log:  # pip's verbose log
            done = subprocess.run([*cmd, "--no-build-isolation", "--log", log.name], capture_output=True, text=True,
                                  env={**os.environ, "PYTHONPATH": str(backend)})
            said = log.read()
        if done.returncode == 0 and not any(m in said for m in INCONSISTENT):
            return done
        if out is not None:
            shutil.rmtree(out, ignore_errors=True)
            out.mkdir(parents=True)
    return subprocess.run(cmd, capture_output=True, text=True)


def editable_requirements(root: Path, cache: Path) -> list[str]:
    """Everything `pip install --no-build-isolation -e root` needs installed first; cached per sdist."""
    requires, backend, backend_path = backend_requires(root)
    key = hashlib.sha256(repr((requires, backend, backend_path, root.name)).encode()).hexdigest()[:12]
    answer = cache / "backend" / f"{root.name}-{key}.json"
    if answer.exists():
        return json.loads(answer.read_text())
    target = backend_target(requires, cache)
    path = os.pathsep.join([str(target), *(str(root / p) for p in backend_path)])
    # No bytecode written: the backend runs in the source tree, which the image is made from as shipped
    done = subprocess.run([sys.executable, "-c", HOOK, backend], cwd=root, capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": path, "PYTHONDONTWRITEBYTECODE": "1"}, timeout=300)
    lines = [line for line in done.stdout.splitlines() if line.startswith(MARK)]
    if done.returncode != 0 or not lines:
        raise BackendError(f"the build backend {backend} does not answer get_requires_for_build_editable "
                           f"(rerun: cd {root} && PYTHONPATH={path} python -c '<hook>' {backend}): "
                           f"{(done.stderr or done.stdout).strip()[-800:]}")
    reply = json.loads(lines[-1].removeprefix(MARK))
    if not reply["editable"]:
        raise BackendError(f"the build backend {backend} ({' '.join(requires)}) has no build_editable hook "
                           "(PEP 660): it cannot install the package in editable mode; set a newer backend "
                           "version in the package entry's build requirements")
    # flit answers the project's own dependencies, each under an `extra == ...` marker: not for the build
    out = list(dict.fromkeys([*_pinned(requires, target), *(r for r in reply["requires"] if "extra ==" not in r)]))
    answer.write_text(json.dumps(out))
    return out
