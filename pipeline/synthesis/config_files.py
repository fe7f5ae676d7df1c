"""Reading a package's configuration files leniently (TOML, INI, requirement lines: a malformed one reads as
empty), and merging requirement lists without tooling, duplicates or old pins."""

from __future__ import annotations

import configparser
import re
import tomllib
from pathlib import Path

# Requirements that lint, type-check, document, measure coverage or parallelize: never needed to run a test.
TOOLING = re.compile(r"^(mypy|black|ruff|flake8.*|pylint|isort|sphinx.*|pre-commit|tox|nox|twine|build|coverage|"
                     r"pytest-cov|codecov|check-manifest|pyright|types-.*|furo|myst-.*|docutils|pytest-xdist|"
                     r"pytest-mypy.*|pytest-flake8|pytest-black|pytest-ruff|pytest-isort|pytest-codspeed|"
                     r"ipython|ipdb|pip|wheel|setuptools|bump.*|towncrier|readme-renderer|jaraco\.packaging|"
                     r"rst\.linker|pytest-checkdocs|pytest-enabler|pytest-sugar|pytest-randomly)$")


def merge_requirements(*groups: list[str]) -> list[str]:
    """Requirements without tooling or duplicates, loosened to name, extras and markers: old pins predate
    Python 3.11 and pytest 8 (the project's pytest pin is the only version kept)."""
    out: dict[str, str] = {}
    for group in groups:
        for req in group:
            req = req.split(" #", 1)[0].strip()
            key = "" if "://" in req or req.startswith(("git+", "hg+")) else requirement_name(req)
            if not key or key in out or TOOLING.match(key):
                continue
            match = re.match(r"^([A-Za-z0-9][A-Za-z0-9._-]*)(\[[^\]]*\])?", req)
            marker = req.split(";", 1)[1].strip() if ";" in req else ""
            out[key] = match.group(1) + (match.group(2) or "") + (f"; {marker}" if marker else "")
    return list(out.values())


def requirement_name(req: str) -> str:
    match = re.match(r"^\s*([A-Za-z0-9][A-Za-z0-9._-]*)", req)
    return re.sub(r"[-_.]+", "-", match.group(1)).lower() if match else ""


def config_lines(text: str) -> list[str]:
    return [s for s in (line.split("#", 1)[0].strip() for line in text.splitlines()) if s]


def read_toml(path: Path) -> dict:
    try:
        return tomllib.loads(path.read_text(errors="replace"))
    except tomllib.TOMLDecodeError:
        return {}


def read_ini(path: Path) -> configparser.RawConfigParser:
    parser = configparser.RawConfigParser(strict=False)
    try:
        parser.read_string(path.read_text(errors="replace"))
    except configparser.Error:
        pass
    return parser
