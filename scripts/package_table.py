"""Tasks from packages named in settings alone: one synthesis run, then a table per package.

    .venv/bin/python scripts/package_table.py [--cache DIR] [--tasks 3] [--set synth.seed=1] [name==version ...]

Prints package, version, tests found, stable passing tests, candidates tested, tasks kept,
seconds and, for a package that yields none, the stage and reason it was set aside (the
same rows `rejects.parquet` holds).
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from pathlib import Path

from assets.settings import HandholdConfig, from_mapping, with_overrides
from pipeline.synthesis.synth import synthesize
from sandbox.images import docker_client, ensure_base_image

# Ten popular pure-Python packages whose sdists ship their tests (none of them a built-in).
PACKAGES = ["attrs", "cachetools", "humanize", "idna", "isodate", "itsdangerous", "jmespath", "more-itertools",
            "semver", "tomlkit"]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("packages", nargs="*", default=PACKAGES, help="package entries (default: the ten)")
    parser.add_argument("--cache", default="data/cache", help="cache folder (sdists, wheels, specs, tasks)")
    parser.add_argument("--tasks", type=int, default=3, help="tasks_per_package")
    parser.add_argument("--set", action="append", default=[], help="more settings, dotted.key=value")
    parser.add_argument("--json", help="also write the table as JSON lines here")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    settings = {"synth": {"packages": args.packages, "tasks_per_package": args.tasks}}
    config = from_mapping(HandholdConfig, with_overrides(settings, args.set), "package_table")
    client = docker_client()
    base = ensure_base_image(config.base_image, client=client)
    tasks, report = synthesize(config.synth, base, Path(args.cache), client, rules=config.rollout.grade_rules())
    rows = table(args.packages, tasks, report)
    print(format_table(rows))
    if args.json:
        Path(args.json).write_text("".join(json.dumps(r) + "\n" for r in rows))
    return 0 if sum(r["kept"] > 0 for r in rows) >= 0.8 * len(rows) else 1


def table(entries: list[str], tasks, report) -> list[dict]:
    """One row per package entry, in order."""
    rows = []
    for entry in entries:
        name = entry.split()[0].split("==")[0]
        key = next((k for k in report.per_package if k.rpartition("-")[0] == name), None)
        key = key or next((r.item for r in report.rejects if r.item.rpartition("-")[0] == name), f"{name}-?")
        counts = report.per_package.get(key, {})
        mine = [t for t in tasks if t.repo == f"pypi/{name}"]
        reject = next((r for r in report.rejects if r.item == key), None)
        rows.append({"package": name, "version": key.rpartition("-")[2], "tests_found": counts.get("tests_found", 0),
                     "stable_passing": counts.get("stable_passing", 0), "flaky_tests": counts.get("flaky_tests", 0),
                     "candidates": counts.get("tested", 0), "kept": len(mine), "seconds": counts.get("seconds", 0),
                     "reason": f"{reject.stage}: {reject.reason[:160]}" if reject and not mine else ""})
    return rows


def format_table(rows: list[dict]) -> str:
    cols = ["package", "version", "tests_found", "stable_passing", "flaky_tests", "candidates", "kept", "seconds",
            "reason"]
    lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    lines += ["| " + " | ".join(str(r[c]).replace("|", "/").replace("\n", " ") for c in cols) + " |" for r in rows]
    yielded = sum(r["kept"] > 0 for r in rows)
    return "\n".join(lines) + f"\n\n{yielded} of {len(rows)} packages yield tasks"


if __name__ == "__main__":
    sys.exit(main())
