"""Copies of a package's source that must not reach a task's container: the code a bug replaces would be there.

A synthesized task's image holds the pristine source and the bug is applied when its sandbox starts, so any
second copy of that source the agent can read (a build tree, a wheel or sdist, a backup file, bytecode)
holds the answer. `hidden_copies` lists them in an unpacked sdist; the environment image is built without
them (pipeline/synthesis/env_image.py) and the synthesis report lists what was left out.
"""

from __future__ import annotations

import fnmatch
import tarfile
import zipfile
from pathlib import Path

# What setuptools and distutils put under build/: whole copies of the package (lib*), of its wheel (bdist.*)
# and of its compiled objects (temp.*, scripts-*). A `build/` that is itself a source package is kept.
BUILD_OUTPUTS = ("lib", "lib.*", "bdist.*", "temp.*", "scripts-*", "__editable__*")
DIST_FILES = ("*.whl", "*.egg", "*.tar.gz", "*.tgz", "*.zip", "*.tar.bz2", "*.tar.xz")
# Editors' and patch(1)'s leftovers: a file before its last edit.
BACKUPS = ("*.orig", "*.rej", "*.bak", "*~", "*.swp", ".#*")
BYTECODE = ("*.pyc", "*.pyo")
# Tool folders that hold installed (non-editable) copies of the package or built eggs.
TOOL_DIRS = {"__pycache__", ".eggs", ".tox", ".nox"}
ARCHIVES = ("*.whl", "*.egg", "*.zip", "*.tar.gz", "*.tgz", "*.tar.bz2", "*.tar.xz", "*.tar")


def hidden_copies(root: Path, source_globs: tuple[str, ...]) -> list[str]:
    """Paths (relative to `root`, sorted) of build trees, dists, backups, bytecode, tool folders and archives
    holding the package's sources: what the image leaves out. Nothing under .git is listed (never copied)."""
    sources = {p.relative_to(root).as_posix() for g in source_globs for p in root.glob(g) if p.is_file()}
    out: list[str] = []
    for path in sorted(root.rglob("*")):
        rel = path.relative_to(root)
        if rel.parts[0] == ".git" or any(p in out for p in _parents(rel)):
            continue
        if _is_copy(root, rel, path, sources):
            out.append(rel.as_posix())
    return out


def _parents(rel: Path) -> list[str]:
    return [Path(*rel.parts[:i]).as_posix() for i in range(1, len(rel.parts))]


def _is_copy(root: Path, rel: Path, path: Path, sources: set[str]) -> bool:
    name = rel.name
    if path.is_dir():
        if name in TOOL_DIRS or name.endswith(".egg"):
            return True
        top_build = len(rel.parts) == 2 and rel.parts[0] == "build" and not (root / "build" / "__init__.py").exists()
        return top_build and _matches(name, BUILD_OUTPUTS) or rel.as_posix() == "dist"
    if _matches(name, BACKUPS + BYTECODE):
        return True
    if rel.parts[0] == "dist" and _matches(name, DIST_FILES) or _matches(name, ("*.whl", "*.egg")):
        return True
    return _matches(name, ARCHIVES) and _archive_holds(path, sources)


def copy_by_name(rel: str) -> bool:
    """Whether a path of a source tree is, by its name alone, a build output, dist, backup, bytecode or tool
    folder (or lies in one); archives need their contents looked at (`hidden_copies`)."""
    parts = Path(rel).parts
    if any(p in TOOL_DIRS or p.endswith(".egg") for p in parts) or parts[:1] == ("dist",):
        return True
    if len(parts) > 2 and parts[0] == "build" and _matches(parts[1], BUILD_OUTPUTS):
        return True
    return _matches(parts[-1], BACKUPS + BYTECODE + ("*.whl",))


def _matches(name: str, patterns: tuple[str, ...]) -> bool:
    return any(fnmatch.fnmatchcase(name, p) for p in patterns)


def _archive_holds(path: Path, sources: set[str]) -> bool:
    """Whether an archive (a test fixture, say) has a member ending in one of the package's source paths."""
    try:
        if zipfile.is_zipfile(path):
            with zipfile.ZipFile(path) as z:
                names = z.namelist()
        else:
            with tarfile.open(path) as tar:
                names = tar.getnames()
    except (OSError, tarfile.TarError, zipfile.BadZipFile, EOFError):
        return False  # not an archive this can read: the answer search still looks inside what it can
    return any(n == s or n.endswith("/" + s) for n in names for s in sources)
