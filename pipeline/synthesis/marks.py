"""Plugins a package's tests need for the marks they use, even where the plugin is tooling otherwise.

Without its plugin a mark is unknown: an error under `--strict-markers`, and under a `filterwarnings = error`
configuration too (python-dateutil's conftest adds pytest-cov's `no_cover` to every xfail test, and with
pytest-cov left out as tooling no test of it ran). A mark the project registers itself needs nothing.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from pathlib import Path

MARK_PLUGINS = {"no_cover": "pytest-cov", "benchmark": "pytest-benchmark", "asyncio": "pytest-asyncio",
                "timeout": "pytest-timeout", "xdist_group": "pytest-xdist", "order": "pytest-order",
                "repeat": "pytest-repeat", "dependency": "pytest-dependency", "trio": "pytest-trio",
                "httpx_mock": "pytest-httpx", "vcr": "pytest-recording", "freeze_time": "pytest-freezer"}
USED = re.compile(r"\bmark\.(\w+)")
REGISTERED = re.compile(r"""addinivalue_line\(\s*["']markers["']\s*,\s*["'](\w+)""")


def marked_plugins(files: Iterable[Path], ini_markers: str) -> list[str]:
    """The distributions of the plugin marks the files use that neither the ini's `markers` (any word of it:
    a list may come joined by spaces) nor a conftest registers, sorted."""
    used: set[str] = set()
    registered = set(re.findall(r"\w+", ini_markers))
    for file in files:
        text = file.read_text(errors="replace")
        used |= set(USED.findall(text))
        registered |= set(REGISTERED.findall(text))
    return sorted({MARK_PLUGINS[mark] for mark in used - registered if mark in MARK_PLUGINS})
