"""Releases of the exported dataset: each night's export, when its rows differ from the last release's, is
kept as a folder named by its batch (`<releases>/<name>/`, loadable with `load_dataset(folder, config)`)
and published under a Hub tag of the same name, so any release still loads as it was.

A release's `release.json` names it, the release before it, a digest of its rows, and what made it (code
version, settings digest); its card says what changed since the previous release: rows added and removed
per config and split, tasks added or quarantined, guidance families, the evaluation's numbers where known,
and the share of its tasks certified (pipeline/tasks/certificate.py): a release takes rows of certified tasks only.

Rows are compared by content: each row's digest is the SHA-256 of its JSON, so a row rewritten identically
is the same row, and an export whose rows all equal the last release's is no new release.
"""

from __future__ import annotations

import hashlib
import json
import logging
import re
import shutil
import subprocess
import uuid
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone
from importlib import metadata
from pathlib import Path
from typing import Iterable, Mapping

import polars as pl
import pyarrow as pa
import pyarrow.parquet as pq

from pipeline.datasets.card import contributions, markdown_table
from pipeline.tasks.certificate import CERTIFICATE_COLUMNS, certificate_summary

log = logging.getLogger(__name__)

INDEX = "releases.jsonl"  # under the releases folder: one line per release, oldest first
DIGESTS = ".row_digests.json"  # in a release's folder: its rows' digests, so the next release need not read them
# again (hidden: not uploaded, not a dataset file)
NAME = re.compile(r"^[\w][\w.\-]*$")  # a folder name and a Hub tag name
ROW_CONFIGS = ("dpo", "actguide", "sft", "trajectories")  # configs whose rows come from a task's attempts
SHARD = re.compile(r"^data/(\w+)/(\w+)-\d+-of-\d+\.parquet$")


RELEASE_FILE = "release.json"


@dataclass(frozen=True)
class RowChange:
    """How a config's split changed since the previous release."""

    config: str
    split: str
    rows: int
    added: int
    removed: int


@dataclass(frozen=True)
class Release:
    """A release as its `release.json` records it."""

    name: str
    """The tag on the Hub and the folder's name: the batch the rows were built from."""
    batch: str
    """The batch it was cut from (a re-run of a batch with other rows names its release `<batch>.2`)."""
    content_sha256: str
    """Of the rows (each config's and split's row digests, sorted): equal for equal rows."""
    previous: str = ""
    """The release before this one; '' for the first."""
    rows: dict[str, dict[str, int]] = field(default_factory=dict)
    """config -> split -> rows."""
    changes: tuple[RowChange, ...] = ()
    """Per config and split of this release or the previous one."""
    tasks_added: tuple[str, ...] = ()
    """Tasks some row comes from now and none did in the previous release."""
    quarantined: tuple[str, ...] = ()
    """Every task quarantined when it was made."""
    newly_quarantined: tuple[str, ...] = ()
    """Quarantined now and not when the previous release was made."""
    families: dict[str, dict[str, int]] = field(default_factory=dict)
    """Chosen attempt's origin ('unguided', 'guided:<kind>') -> config (dpo, sft) -> rows."""
    evaluation: dict[str, object] = field(default_factory=dict)
    """The latest evaluation's numbers ('batch', 'pass@1/<model>'); empty when none had run."""
    certificates: dict[str, object] = field(default_factory=dict)
    """Of the tasks table: 'tasks', 'certified' and 'left_out' (why -> tasks; pipeline/tasks/certificate.py);
    empty when its tasks carried no certificate column (a release before certificates)."""
    lineage: tuple[dict[str, str], ...] = ()
    """Each batch's round: which policy rolled it out, the training run and dataset that made it, what it solved
    without guidance (column -> text, pipeline.rollouts.round_report.lineage_rows); empty before rounds were recorded."""
    rounds_window: int = 1
    """training.rounds_window when it was made: the rounds whose rows a training run trains on (1: its own,
    on-policy; 0: every batch's)."""
    code_version: str = ""
    """'git <commit>' of the handhold checkout ('+dirty' with changes), else 'handhold <package version>'."""
    settings_sha256: str = ""
    """Of the settings it was made with."""
    created: str = ""
    """When, UTC, ISO 8601."""

    @classmethod
    def read(cls, folder: Path) -> Release:
        raw = json.loads((Path(folder) / RELEASE_FILE).read_text())
        raw["changes"] = tuple(RowChange(**c) for c in raw.get("changes", ()))
        return cls(**{k: tuple(v) if isinstance(v, list) else v for k, v in raw.items()})


def release_section(release: Release, repo_id: str = "") -> str:
    """What changed since the previous release, what made this one, and how to load it by its tag."""
    after = f"since release `{release.previous}`" if release.previous else "(the first release: every row is new)"
    lines = [f"## Release `{release.name}`",
             f"Built from batch `{release.batch}` by code {release.code_version or 'unknown'}, settings sha256 "
             f"`{release.settings_sha256 or 'unknown'}`; rows sha256 `{release.content_sha256}`.",
             f"Rows added and removed {after}, by content:",
             markdown_table(["config", "split", "rows", "added", "removed"],
                            [[c.config, c.split, c.rows, c.added, c.removed] for c in release.changes]),
             f"Tasks added: {_names(release.tasks_added)}.",
             f"Tasks quarantined {'since the previous release' if release.previous else 'now'}: "
             f"{_names(release.newly_quarantined)}; quarantined in all: {len(release.quarantined)}.",
             certified_line(release.certificates)]
    if release.families:
        lines.append(markdown_table(["chosen from (guidance family)", "dpo pairs", "sft rows"],
                                    [[k, v.get("dpo", 0), v.get("sft", 0)]
                                     for k, v in sorted(release.families.items())]))
    if release.lineage:
        lines.append("Rounds: the policy that rolled each batch out, the training run and data that made it, and of "
                     "the tasks that needed guidance in an earlier round the ones it solved without:")
        lines.append(markdown_table(list(release.lineage[0]), [list(row.values()) for row in release.lineage]))
        lines.append(f"Training rows: {training_rows(release.rounds_window)}.")
    numbers = {k: v for k, v in release.evaluation.items() if k != "batch"}
    lines.append(markdown_table(["evaluation (batch " + str(release.evaluation.get("batch", "?")) + ")", "value"],
                                [[k, v] for k, v in sorted(numbers.items())]) if numbers
                 else "Evaluation: none had run when this release was made.")
    lines.append(f'Load this release unchanged by later ones: `load_dataset("{repo_id or "<owner>/<name>"}", "dpo", '
                 f'revision="{release.name}")`.')
    return "\n\n".join(lines)


def certified_line(certificates: dict) -> str:
    """The release's share of certified tasks and why the others were left out, in a sentence."""
    if not certificates:
        return "Certificates: its tasks table carries none."
    n, ok = certificates["tasks"], certificates["certified"]
    why = "; ".join(f"{k} tasks: {w}" for w, k in certificates.get("left_out", {}).items())
    return (f"Tasks certified (gold patch resolved in every fresh container, empty patch in none): {ok} of {n} "
            f"({ok / n:.1%}); rows come only from these" + (f". Left out: {why}." if why else "."))


def training_rows(window: int) -> str:
    """What a training run trains on under `training.rounds_window`, in words."""
    if window == 1:
        return "each run trains on its own round's batches only (on-policy, training.rounds_window: 1)"
    if window == 0:
        return "each run trains on every batch's rows (training.rounds_window: 0)"
    return f"each run trains on the batches of the latest {window} rounds up to its own (training.rounds_window: {window})"


def _names(tasks: tuple[str, ...], shown: int = 20) -> str:
    if not tasks:
        return "none"
    more = f" and {len(tasks) - shown} more" if len(tasks) > shown else ""
    return f"{len(tasks)} (" + ", ".join(f"`{t}`" for t in tasks[:shown]) + more + ")"


def add_release_section(readme: Path, release: Release, repo_id: str = "") -> None:
    """Put the release section into a written card, before its `## Rows`."""
    text = readme.read_text()
    if "\n## Rows\n" not in text:
        raise ValueError(f"{readme} has no '## Rows' section: it is not a card export_dataset wrote; export again")
    head, rest = text.split("\n## Rows\n", 1)
    readme.write_text(f"{head}\n{release_section(release, repo_id)}\n\n## Rows\n{rest}")


@dataclass(frozen=True)
class Provenance:
    """What made a release, besides its rows."""

    batch: str
    """The batch the rows were built from: the release's name."""
    quarantined: tuple[str, ...] = ()
    """Every task quarantined now."""
    evaluation: Mapping[str, object] = field(default_factory=dict)
    """`evaluation_numbers` of the latest evaluation report."""
    code_version: str = ""
    """`code_version` of the checkout that made it."""
    settings_sha256: str = ""
    """`settings_sha256` of the settings it was made with."""
    repo_id: str = ""
    """The Hub repo it will be published to, for the card's loading line; '' shows a placeholder."""
    lineage: tuple[Mapping[str, str], ...] = ()
    """Each batch's round (pipeline.rollouts.round_report.lineage_rows): the policy that rolled it out, the training run and
    dataset that made that policy, what it solved without guidance."""
    rounds_window: int = 1
    """training.rounds_window: the rounds whose rows a training run trains on."""


@dataclass(frozen=True)
class ReleaseResult:
    """The release an export is now, and whether it was made by this export."""

    release: Release
    folder: Path
    """The release's own folder under the releases folder."""
    new: bool
    """False: the export's rows equal the last release's, and that release stands."""

    def describe(self) -> str:
        if self.new:
            return f"release {self.release.name} at {self.folder} (after {self.release.previous or 'none'})"
        return f"rows identical to release {self.release.name}: no new release ({self.folder})"


def row_digests(folder: Path) -> dict[str, dict[str, list[str]]]:
    """config -> split -> the sorted digests of its rows, read from the folder's Parquet shards."""
    digests: dict[str, dict[str, list[str]]] = {}
    for path in sorted(Path(folder).glob("data/*/*.parquet")):
        match = SHARD.match(path.relative_to(folder).as_posix())
        if match is None:
            raise ValueError(f"{path} is not a shard an export writes (data/<config>/<split>-00000-of-00001.parquet); "
                             "remove it from the folder")
        rows = pq.read_table(path).to_pylist()
        found = digests.setdefault(match.group(1), {}).setdefault(match.group(2), [])
        found += [hashlib.sha256(json.dumps(r, sort_keys=True, default=str).encode()).hexdigest() for r in rows]
    return {c: {s: sorted(d) for s, d in by_split.items()} for c, by_split in digests.items()}


def _stored_digests(folder: Path) -> dict[str, dict[str, list[str]]]:
    """`row_digests` of a release folder, as stored when it was cut (read from its rows when it holds none)."""
    stored = Path(folder) / DIGESTS
    return json.loads(stored.read_text()) if stored.exists() else row_digests(folder)


def content_sha256(digests: Mapping[str, Mapping[str, list[str]]]) -> str:
    text = json.dumps({c: dict(by_split) for c, by_split in sorted(digests.items())}, sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()


def row_changes(before: Mapping[str, Mapping[str, list[str]]], after: Mapping[str, Mapping[str, list[str]]]
                ) -> tuple[RowChange, ...]:
    """Per config and split of either: rows now, rows added, rows removed (by row digest)."""
    keys = sorted({(c, s) for d in (before, after) for c, by_split in d.items() for s in by_split})
    changes = []
    for config, split in keys:
        old, new = set(before.get(config, {}).get(split, ())), after.get(config, {}).get(split, [])
        changes.append(RowChange(config, split, len(new), len(set(new) - old), len(old - set(new))))
    return tuple(changes)


def releases(root: Path) -> list[Release]:
    """The releases under `root`, oldest first."""
    index = Path(root) / INDEX
    names = [json.loads(line)["name"] for line in index.read_text().splitlines() if line.strip()] \
        if index.exists() else []
    return [Release.read(Path(root) / name) for name in names]


def cut_release(export: Path, root: Path, provenance: Provenance) -> ReleaseResult:
    """Make the export folder a release: a new one under `root` when its rows differ from the last release's
    (its card then says what changed), else the export folder becomes the last release's copy again."""
    export, root = Path(export), Path(root)
    if not NAME.match(provenance.batch):
        raise ValueError(f"batch {provenance.batch!r} cannot name a release (a folder and a Hub tag): use letters, "
                         "digits, '.', '-' and '_'")
    digests = row_digests(export)
    certificates = _certified_rows_only(export, digests)
    content, known = content_sha256(digests), releases(root)
    last = known[-1] if known else None
    if last is not None and last.content_sha256 == content:
        _copy_into_place(root / last.name, export)
        log.info("the export's rows are identical to release %s: no new release", last.name)
        return ReleaseResult(last, root / last.name, new=False)
    before = _stored_digests(root / last.name) if last else {}
    tasks_before = _tasks(before, root / last.name) if last else set()
    release = Release(
        name=_free_name(provenance.batch, {r.name for r in known}), batch=provenance.batch, content_sha256=content,
        previous=last.name if last else "", rows={c: {s: len(d) for s, d in by_split.items()}
                                                  for c, by_split in digests.items()},
        changes=row_changes(before, digests),
        tasks_added=tuple(sorted(_tasks(digests, export) - tasks_before)),
        quarantined=tuple(sorted(provenance.quarantined)),
        newly_quarantined=tuple(sorted(set(provenance.quarantined) - set(last.quarantined if last else ()))),
        families=_families(export, digests), evaluation=dict(provenance.evaluation), certificates=certificates,
        lineage=tuple(dict(row) for row in provenance.lineage), rounds_window=provenance.rounds_window,
        code_version=provenance.code_version, settings_sha256=provenance.settings_sha256,
        created=datetime.now(timezone.utc).isoformat(timespec="seconds"))
    (export / RELEASE_FILE).write_text(json.dumps(asdict(release), indent=2) + "\n")
    (export / DIGESTS).write_text(json.dumps(digests))
    add_release_section(export / "README.md", release, provenance.repo_id)
    root.mkdir(parents=True, exist_ok=True)
    _copy_into_place(export, root / release.name)
    with (root / INDEX).open("a") as index:
        index.write(json.dumps({"name": release.name, "content_sha256": content}) + "\n")
    log.info("release %s: %s", release.name, ", ".join(f"{c.config}/{c.split} +{c.added} -{c.removed}"
                                                       for c in release.changes))
    return ReleaseResult(release, root / release.name, new=True)


def _certified_rows_only(folder: Path, digests: Mapping[str, Mapping[str, list[str]]]) -> dict:
    """The certificates of the export's tasks (`certificate_summary`, without examples: {} when its tasks table has
    no `certified` column); refused, naming them, when a row comes from an uncertified task."""
    tables = [pq.read_table(folder / f"data/tasks/{split}-00000-of-00001.parquet")
              for split in digests.get("tasks", {})]
    tables = [t.select(list(CERTIFICATE_COLUMNS)) for t in tables if "certified" in t.column_names]
    if not tables:
        return {}
    frame = pl.from_arrow(pa.concat_tables(tables))
    summary = certificate_summary(frame)
    unsure = set(frame.filter(~pl.col("certified"))["instance_id"].to_list())
    for config in ROW_CONFIGS:
        for split in digests.get(config, {}):
            table = pq.read_table(folder / f"data/{config}/{split}-00000-of-00001.parquet")
            found = sorted(unsure & set(table.column("instance_id").to_pylist())) if "instance_id" in \
                table.column_names else []
            if found:
                raise ValueError(f"{config}/{split} holds rows of tasks without a certificate ({', '.join(found[:10])}"
                                 f"): a release takes only certified tasks; rebuild the datasets (they leave such "
                                 "tasks out) or validate those tasks again (rematerialize tasks)")
    return {k: v for k, v in summary.items() if k != "examples"}


def _tasks(digests: Mapping[str, Mapping[str, list[str]]], folder: Path) -> set[str]:
    """The tasks some row of the folder comes from (the `tasks` table lists every task, rows or not)."""
    found = set()
    for config in ROW_CONFIGS:
        for split in digests.get(config, {}):
            table = pq.read_table(folder / f"data/{config}/{split}-00000-of-00001.parquet")
            if "instance_id" in table.column_names:
                found |= set(table.column("instance_id").to_pylist())
    return found


def _families(folder: Path, digests: Mapping[str, Mapping[str, list[str]]]) -> dict[str, dict[str, int]]:
    """DPO pairs and SFT rows per chosen attempt's origin, every split (the card's contributions)."""
    shards = {config: {split: pq.read_table(folder / f"data/{config}/{split}-00000-of-00001.parquet")
                       for split in digests.get(config, {})} for config in ("dpo", "sft")}
    return contributions(shards)


def evaluation_numbers(report: Path | None) -> dict[str, object]:
    """The batch and each model's pass@1 of an evaluation report (pass_at_1.json); {} without one."""
    if report is None or not Path(report).exists():
        return {}
    results = json.loads(Path(report).read_text()).get("results", [])
    return {"batch": Path(report).parent.name, **{f"pass@1/{r['model']}": r["pass@1"] for r in results}}


def _free_name(batch: str, taken: Iterable[str]) -> str:
    """The batch, or `<batch>.2`, `.3`... when a release of the batch exists (a re-run with other rows)."""
    taken, name, n = set(taken), batch, 1
    while name in taken:
        n += 1
        name = f"{batch}.{n}"
    return name


def _copy_into_place(source: Path, target: Path) -> None:
    """`target` replaced by a copy of `source`, renamed in whole so a reader never sees half of it."""
    staging = target.parent / f".{target.name}.staging-{uuid.uuid4().hex[:8]}"
    shutil.copytree(source, staging)
    old = target.parent / f".{target.name}.old-{uuid.uuid4().hex[:8]}"
    if target.exists():
        target.rename(old)
    staging.rename(target)
    shutil.rmtree(old, ignore_errors=True)


def code_version(checkout: Path) -> str:
    """The git commit of the handhold checkout ('+dirty' when it has changes), else the package version."""
    try:
        head = subprocess.run(["git", "-C", str(checkout), "rev-parse", "HEAD"], capture_output=True, text=True,
                              timeout=30)
        dirty = subprocess.run(["git", "-C", str(checkout), "status", "--porcelain", "--untracked-files=no"],
                               capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.SubprocessError):
        head = None
    if head is not None and head.returncode == 0:
        return f"git {head.stdout.strip()}" + ("+dirty" if dirty.stdout.strip() else "")
    try:
        return f"handhold {metadata.version('handhold')}"
    except metadata.PackageNotFoundError:
        return "unknown"


def settings_sha256(settings: object) -> str:
    """A digest of the settings (a dataclass tree), secrets never among them."""
    return hashlib.sha256(json.dumps(asdict(settings), sort_keys=True, default=str).encode()).hexdigest()


def dataset_identity(folder: Path) -> dict[str, str]:
    """Which dataset a run read: the release it is (tag) or the local build it came from, and its rows' digest."""
    folder = Path(folder)
    if (folder / RELEASE_FILE).exists():
        release = Release.read(folder)
        return {"dataset_release": release.name, "dataset_build": release.batch,
                "dataset_sha256": release.content_sha256, "dataset_path": str(folder)}
    return {"dataset_release": "", "dataset_build": "local export (no release)",
            "dataset_sha256": content_sha256(row_digests(folder)), "dataset_path": str(folder)}
