"""The exported dataset's card (README.md): its YAML header, which `datasets` reads to find each config's
split files, and what it tells a reader: rows, pass and recovery rates, the guidance checks, the k*/K
histogram, the sources with their licences, and how to load it."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Mapping

import numpy as np
import polars as pl
import pyarrow as pa
from huggingface_hub import DatasetCardData

from pipeline.rollouts.costs import costs_card_section
from pipeline.datasets.divergence import divergence_card_section
from pipeline.datasets.guided import GROUPS_LOST
from pipeline.datasets.provenance import SourcePackage, resolve_sources
from pipeline.guidance.reference_sources import CHOSEN_COLUMNS, reference_sources_section
from pipeline.core.pictures import draw_text, png
from pipeline.tasks.certificate import CERTIFICATE_COLUMNS, certificate_summary
from pipeline.tasks.flakiness import QuarantinedTask, quarantine_markdown
from pipeline.core.vocab import NO_GUIDANCE_KIND

HISTOGRAM_FILE = "k_star_histogram.png"
RATE_COLUMNS = ("guidance_kind", "resolved", "instance_id", "infra_error")  # of the trajectories table


@dataclass(frozen=True)
class CardInfo:
    """What the dataset card says besides what the tables themselves tell."""

    pretty_name: str
    run_id: str
    """The pipeline run (batch) the rows come from."""
    description: str = ""
    repo_id: str = ""
    """Hub repo the folder will be published to, for the loading snippet; '' shows a placeholder."""
    licence: str = "other"
    """Licence of the dataset itself (Hub licence id); each source's own licence is listed too."""
    sources: tuple[SourcePackage, ...] = ()
    """Empty: derived from the tasks' provenance (package and version, or upstream dataset)."""
    checks: Mapping[str, int] = field(default_factory=dict)
    """Guided successes per '<check>.<guidance kind>' (the datasets build report's `checks`): prose referring
    to guidance dropped or rewritten, ungrounded left out or kept, hints holding gold lines."""
    costs: tuple[Mapping[str, object], ...] = ()
    """What the rows cost, per origin (pipeline/rollouts/costs.py cost_rows, DPO pairs counted); empty: no section."""
    quarantine: tuple[QuarantinedTask, ...] = ()
    """The tasks set aside for unsound behaviour over time (pipeline/tasks/flakiness.py): no row comes from them."""
    certify_runs: int = 0
    """synth.certify_runs: the containers a certified task was graded in (pipeline/tasks/certificate.py); 0: the
    card has no certificate section."""


def shard_path(config: str, split: str) -> str:
    """Where a split's single shard lives in the folder."""
    return f"data/{config}/{split}-00000-of-00001.parquet"


def card_header(card: CardInfo, rows: dict[str, dict[str, int]], sizes: dict[str, dict[str, int]]) -> DatasetCardData:
    """The YAML header: one `configs:` entry per config with its splits' files (the first is default), and
    `dataset_info` with each split's rows and bytes. `datasets` keys its cache of a local folder on this
    header, so the sizes make a rewritten folder load afresh instead of from yesterday's cache, and it checks
    the row counts on load."""
    configs = [{"config_name": config,
                "data_files": [{"split": s, "path": shard_path(config, s).replace("-00000-of-00001", "-*")}
                               for s in by_split]}
               for config, by_split in rows.items()]
    configs[0]["default"] = True
    info = [{"config_name": config, "splits": [{"name": s, "num_bytes": sizes[config][s], "num_examples": n}
                                               for s, n in by_split.items()],
             "download_size": sum(sizes[config].values()), "dataset_size": sum(sizes[config].values())}
            for config, by_split in rows.items()]
    return DatasetCardData(pretty_name=card.pretty_name, license=card.licence, configs=configs, dataset_info=info,
                           tags=["software-engineering", "agents", "swe-bench", "dpo"])


def render_card(card: CardInfo, splits: dict[str, dict[str, pa.Table]], rows: dict[str, dict[str, int]],
                histogram: pl.DataFrame | None, sizes: dict[str, dict[str, int]], plans: pl.DataFrame | None = None
                ) -> str:
    """The whole README.md: header, description, counts, rates, histogram, reference sources (given the guidance
    plans, with a `batch` column to join DPO rows to their plan exactly), sources, loading."""
    trajectories = _concat(splits.get("trajectories", {}), RATE_COLUMNS)
    tasks = _concat(splits.get("tasks", {}), ("provenance",))
    certified = _concat(splits.get("tasks", {}), CERTIFICATE_COLUMNS)
    sections = [
        f"---\n{card_header(card, rows, sizes).to_yaml()}\n---\n",
        f"# {card.pretty_name}\n\n{card.description or 'Training data for software-engineering agents.'}\n\n"
        f"Built by the handhold pipeline, run `{card.run_id}`.",
        "## Rows\n\n" + markdown_table(["config", "split", "rows"],
                                [[c, s, n] for c, by_split in rows.items() for s, n in by_split.items()]),
        divergence_card_section(splits),
        _rates_section(trajectories),
        _guidance_checks_section(card.checks, splits),
        costs_card_section(card.costs),
        _histogram_section(histogram),
        reference_sources_section(plans, _concat(splits.get("dpo", {}), CHOSEN_COLUMNS)),
        _quarantine_section(card.quarantine),
        certificate_section(certificate_summary(certified), card.certify_runs) if card.certify_runs else "",
        "## Sources\n\n" + markdown_table(["source", "version", "licence", "url"], [
            [s.name, s.version, s.licence, s.url] for s in resolve_sources(card.sources, tasks)]),
        _loading_section(card.repo_id, list(rows)),
    ]
    return "\n\n".join(s for s in sections if s) + "\n"


def _concat(by_split: dict[str, pa.Table], columns: tuple[str, ...]) -> pl.DataFrame | None:
    """All splits of a config, only `columns` (so heavy nested columns stay in Arrow); None without them."""
    tables = [t.select(list(columns)) for t in by_split.values() if t.num_rows and set(columns) <= set(t.column_names)]
    return pl.from_arrow(pa.concat_tables(tables, promote_options="permissive")) if tables else None


def markdown_table(headers: list[str], rows: list[list[object]]) -> str:
    """A Markdown table; floats as percentages."""
    def cell(v: object) -> str:
        return f"{v:.1%}" if isinstance(v, float) else str(v).replace("|", "\\|")
    lines = ["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
    return "\n".join(lines + ["| " + " | ".join(cell(v) for v in row) + " |" for row in rows])


def _rates_section(trajectories: pl.DataFrame | None) -> str:
    if trajectories is None:
        return "## Pass rates\n\nNo graded trajectories in this export."
    passes, recovery = pass_rates(trajectories), recovery_rates(trajectories)
    return ("## Pass rates\n\nBy guidance kind, over attempts without an infrastructure error.\n\n"
            + markdown_table(passes.columns, passes.rows()) + "\n\n## Recovery rates\n\n"
            "Of the tasks no unguided attempt resolved, the share some attempt under each guidance kind "
            "resolved (among those tried under it).\n\n" + markdown_table(recovery.columns, recovery.rows()))


CHECK_COLUMNS = {"references_dropped": "referring prose: dropped", "references_rewritten": "referring prose: rewritten",
                 "ungrounded_left_out": "ungrounded: left out", "ungrounded_kept": "ungrounded: kept",
                 "hint_has_gold": "hint held gold lines"}
GOLD_HINT_COLUMNS = {"dpo": "chosen_hint_has_gold", "sft": "hint_has_gold"}  # a chosen row's hint held gold lines


def gold_hint_shares(splits: dict[str, dict[str, pa.Table]]) -> dict[str, tuple[int, int]]:
    """Per config (dpo, sft): (chosen rows whose hint held a line of the gold patch, chosen rows)."""
    shares = {}
    for config, column in GOLD_HINT_COLUMNS.items():
        frame = _concat(splits.get(config, {}), (column,))
        if frame is not None:
            shares[config] = (int(frame[column].fill_null(False).sum()), frame.height)
    return shares


def _guidance_checks_section(checks: Mapping[str, int], splits: dict[str, dict[str, pa.Table]]) -> str:
    """Per guidance kind, the guided successes each check caught; the share of chosen rows from gold hints."""
    kinds = sorted({key.split(".", 1)[1] for key in checks if "." in key})
    present = [c for c in CHECK_COLUMNS if any(f"{c}.{k}" in checks for k in kinds)]
    lines = ["## Guidance checks", "A chosen completion or ActGuide member is trained under the unguided prompt. "
             "Guided successes whose prose refers to the guidance, that edited a file no tool output had shown "
             "(ungrounded), or whose hint held a line of the gold patch, by guidance kind:"]
    lines.append(markdown_table(["guidance kind"] + [CHECK_COLUMNS[c] for c in present],
                        [[k] + [checks.get(f"{c}.{k}", 0) for c in present] for k in kinds]) if kinds
                 else "No guided success was checked.")
    if GROUPS_LOST in checks:
        lines.append(f"Rescued ActGuide groups whose every guided success failed these checks (no row): "
                     f"{checks[GROUPS_LOST]}.")
    for config, (gold, total) in gold_hint_shares(splits).items():
        share = f"{gold / total:.1%}" if total else "n/a"
        lines.append(f"Chosen rows of `{config}` from a hint holding gold lines: {gold} of {total} ({share}).")
    contributed = contributions(splits)
    if contributed:
        lines.append("What each family contributed: DPO pairs and SFT rows by where the chosen attempt came from.")
        lines.append(markdown_table(["chosen from", "dpo pairs", "sft rows"],
                            [[source, n.get("dpo", 0), n.get("sft", 0)] for source, n in sorted(contributed.items())]))
    return "\n\n".join(lines)


def contributions(splits: dict[str, dict[str, pa.Table]]) -> dict[str, dict[str, int]]:
    """Per chosen attempt's origin ('unguided', 'guided:<kind>'): DPO pairs and SFT rows, every split."""
    counts: dict[str, dict[str, int]] = {}
    for config, column in (("dpo", "chosen_source"), ("sft", "source")):
        frame = _concat(splits.get(config, {}), (column,))
        for source, n in frame.group_by(column).len().rows() if frame is not None else ():
            counts.setdefault(source, {})[config] = n
    return counts


def _quarantine_section(entries: tuple[QuarantinedTask, ...]) -> str:
    return ("## Quarantined tasks\n\nTasks whose gold patch stopped resolving, whose empty patch started passing, or "
            "whose grades disagreed across runs when re-validated; no row comes from them (the `tasks` table keeps "
            "each task's `recheck_runs` and `recheck_disagreements`).\n\n" + quarantine_markdown(entries))


def certificate_section(summary: Mapping, certify_runs: int) -> str:
    """The share of tasks certified and why the others were left out (`certificate_summary`)."""
    head = (f"## Certified tasks\n\nA task is certified when its gold patch resolved it in each of {certify_runs} "
            "fresh containers and the empty patch in none, one of them running the tests in a shuffled order "
            f"(synth.certify_runs: {certify_runs}); rows come only from certified tasks, and the `tasks` table keeps "
            "each task's certificate (`certificate_*` columns).")
    if not summary:
        return head + "\n\nNo tasks table in this export."
    n, ok = summary["tasks"], summary["certified"]
    lines = [head, f"Certified: {ok} of {n} tasks ({ok / n:.1%})."]
    if summary["left_out"]:
        lines.append("Left out, by why:\n\n" + markdown_table(["why (N: a number)", "tasks"],
                                                             [[w, k] for w, k in summary["left_out"].items()]))
        lines.append(markdown_table(["task", "why"], [list(row) for row in summary["examples"]]))
    return "\n\n".join(lines)


def _histogram_section(histogram: pl.DataFrame | None) -> str:
    if histogram is None:
        return ""
    found = histogram.filter(pl.col("bin") != "not found")
    return (f"## Minimal guidance prefix k*/K\n\n![k*/K histogram]({HISTOGRAM_FILE})\n\n"
            "Share k*/K of the K reference actions a guided attempt needed to succeed, over accepted plans "
            "with K > 0.\n\n" + markdown_table(["k*/K", "plans"], found.rows())
            + f"\n\nPlans where no prefix succeeded: {histogram.filter(pl.col('bin') == 'not found')['plans'].sum()}.")


def pass_rates(trajectories: pl.DataFrame) -> pl.DataFrame:
    """Per guidance kind: attempts, resolved, pass rate, tasks, tasks resolved; infra errors left out."""
    valid = trajectories.filter(pl.col("infra_error").fill_null("") == "")
    return valid.group_by("guidance_kind").agg(
        pl.len().alias("attempts"), pl.col("resolved").sum().alias("resolved"),
        pl.col("resolved").mean().alias("pass_rate"), pl.col("instance_id").n_unique().alias("tasks"),
        pl.col("instance_id").filter(pl.col("resolved")).n_unique().alias("tasks_resolved"),
    ).sort("guidance_kind")


def recovery_rates(trajectories: pl.DataFrame) -> pl.DataFrame:
    """Per guidance kind (and 'any'): tasks failed unguided and tried under it, how many it resolved."""
    valid = trajectories.filter(pl.col("infra_error").fill_null("") == "")
    per_task = valid.group_by("guidance_kind", "instance_id").agg(pl.col("resolved").any())
    failed = per_task.filter((pl.col("guidance_kind") == NO_GUIDANCE_KIND) & ~pl.col("resolved")).select("instance_id")
    guided = per_task.filter(pl.col("guidance_kind") != NO_GUIDANCE_KIND).join(failed, on="instance_id")
    any_kind = guided.group_by("instance_id").agg(pl.col("resolved").any(), guidance_kind=pl.lit("any"))
    return pl.concat([guided, any_kind.select(guided.columns)]).group_by("guidance_kind").agg(
        pl.len().alias("failed_unguided"), pl.col("resolved").sum().alias("recovered"),
        pl.col("resolved").mean().alias("recovery_rate"),
    ).sort(pl.col("guidance_kind") == "any", "guidance_kind")


BINS = 10  # k*/K histogram bins of width 1/BINS, the last one closed


def k_star_histogram(plans: pl.DataFrame) -> pl.DataFrame:
    """Plans (K > 0, accepted) per k*/K bin, labelled '0.0-0.1'..., plus a 'not found' row; columns bin, plans."""
    valid = plans.filter(pl.col("K") > 0)
    if "accepted" in plans.columns:
        valid = valid.filter(pl.col("accepted"))
    found = valid.filter(pl.col("k_star") >= 0)
    index = (found["k_star"] / found["K"] * BINS).floor().clip(0, BINS - 1).cast(pl.Int64).to_list()
    counts = [index.count(i) for i in range(BINS)]
    labels = [f"{i / BINS:.1f}-{(i + 1) / BINS:.1f}" for i in range(BINS)]
    return pl.DataFrame({"bin": labels + ["not found"], "plans": counts + [valid.height - found.height]})


def render_histogram_png(histogram: pl.DataFrame) -> bytes:
    """A bar chart of the found bins as PNG bytes, drawn with numpy and zlib (no plotting library)."""
    counts = histogram.filter(pl.col("bin") != "not found")["plans"].to_list()
    width, height, left, bottom, top = 600, 300, 30, 40, 30  # pixels
    image = np.full((height, width, 3), 255, np.uint8)  # (rows, columns, RGB)
    slot, peak, base = (width - left - 10) // len(counts), max(max(counts), 1), height - bottom
    image[base:base + 2, left - 4:width - 10] = 0
    for i, n in enumerate(counts):
        x, bar = left + i * slot, round((base - top) * n / peak)
        image[base - bar:base, x + 4:x + slot - 4] = (66, 110, 180)
        draw_text(image, x + 6, base - bar - 14, str(n))
        draw_text(image, x + 6, base + 8, f"{i / len(counts):.1f}")
    draw_text(image, width // 2 - 16, height - 14, "k*/K")
    return png(image)


def _loading_section(repo_id: str, configs: list[str]) -> str:
    repo = repo_id or "<owner>/<name>"
    lines = [f'{c} = load_dataset("{repo}", "{c}")' for c in configs]
    return ("## Loading\n\n```python\nfrom datasets import load_dataset\n\n" + "\n".join(lines) + "\n```\n\n"
            "A local copy of this folder loads the same way: `load_dataset(\"path/to/folder\", \"dpo\")`.")

