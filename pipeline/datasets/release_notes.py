"""A release's record (`release.json`) and the section of its card that says what changed since the release
before it (pipeline/datasets/release.py makes both)."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

from pipeline.datasets.card import markdown_table

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
