"""The packages and upstream datasets a dataset's tasks come from, with their licences, read from the tasks'
provenance (what the card's sources table lists)."""

from __future__ import annotations

import json
from dataclasses import dataclass, replace

import polars as pl


@dataclass(frozen=True)
class SourcePackage:
    """A package (or upstream dataset) the tasks come from."""

    name: str
    version: str = ""
    licence: str = ""
    """SPDX id; '' reads it from the tasks' provenance ('licence' or 'license'), else 'unknown'."""
    url: str = ""



def resolve_sources(sources: tuple[SourcePackage, ...], tasks: pl.DataFrame | None) -> list[SourcePackage]:
    """The sources (given, else named by the tasks' provenance), each with a licence or 'unknown'."""
    provenance = _provenance(tasks)
    return [replace(s, licence=s.licence or _licence_in(provenance, s))
            for s in sources or _sources_in(provenance)]


def _provenance(tasks: pl.DataFrame | None) -> list[dict]:
    if tasks is None:
        return []
    parsed = []
    for text in tasks["provenance"].drop_nulls().unique(maintain_order=True):
        try:
            value = json.loads(text)
        except json.JSONDecodeError:
            continue  # a malformed provenance names no source; the others still do
        if isinstance(value, dict):
            parsed.append(value)
    return parsed


def _sources_in(provenance: list[dict]) -> tuple[SourcePackage, ...]:
    """A synthesized task names its package and version; a dataset row names its dataset."""
    found: dict[tuple[str, str], str] = {}
    for p in provenance:
        if p.get("package"):
            name, version = str(p["package"]), str(p.get("version", ""))
            found[name, version] = f"https://pypi.org/project/{name}/{version}/"
        elif p.get("dataset"):
            found[str(p["dataset"]), ""] = f"https://huggingface.co/datasets/{p['dataset']}"
    return tuple(SourcePackage(name, version, url=url) for (name, version), url in sorted(found.items()))


def _licence_in(provenance: list[dict], source: SourcePackage) -> str:
    for p in provenance:
        same_version = not source.version or str(p.get("version", "")) == source.version
        if str(p.get("package") or p.get("dataset")) == source.name and same_version:
            if p.get("licence") or p.get("license"):
                return str(p.get("licence") or p.get("license"))
    return "unknown"
