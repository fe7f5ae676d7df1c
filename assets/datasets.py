"""Assets that turn graded trajectories into training sets: DPO, ActGuide and SFT rows, the exported
Hugging Face dataset folder, and its publication on the Hub; with the checks that must hold first."""

import os
from datetime import timedelta
from pathlib import Path
from typing import Iterator

import dagster as dg
import polars as pl

from assets.partitions import after_new_batch
from assets.resources import Credentials, HandholdSettings
from pipeline.rollouts.costs import cost_markdown, cost_totals, pairs_by_origin, stored_cost_rows
from pipeline.datasets import read_dataset, update_datasets
from pipeline.datasets.manifest import read_manifest
from pipeline.datasets.card import HISTOGRAM_FILE, CardInfo, pass_rates
from pipeline.datasets.config import DPO_FORMS
from pipeline.datasets.export import export_dataset, split_by_task
from pipeline.datasets.guided import manifest_checks, rows_referring_to_guidance
from pipeline.datasets.formats import row_text
from pipeline.datasets.splits import split_groups
from pipeline.datasets.publish import publish_dataset
from pipeline.datasets.release import Provenance, code_version, cut_release, evaluation_numbers, settings_sha256
from pipeline.datasets.secrets import scan_tables
from pipeline.tasks.certificate import uncertified, with_certified
from pipeline.tasks.flakiness import left_out, quarantined, read_rechecks, task_table
from pipeline.core.pictures import bar_chart_png, markdown_image
from pipeline.rollouts.round_report import lineage, lineage_rows
from pipeline.core.vocab import DATASET_KINDS

PREVIEW_ROWS = 5
EXPORT_FRESHNESS = timedelta(hours=30)  # a nightly export older than this missed a night (and some slack)
CHECKOUT = Path(__file__).resolve().parents[1]  # the handhold checkout, whose commit names the code of a release


def _trajectories(settings: HandholdSettings) -> pl.DataFrame:
    """Every stored unguided and guided attempt of every batch (the compacted files)."""
    files = settings.layout().trajectory_files()
    return pl.concat([pl.read_parquet(f) for f in files], how="diagonal_relaxed") if files else pl.DataFrame()


def _left_out(settings: HandholdSettings) -> dict[str, str]:
    """The tasks no dataset row comes from, with why (quarantined, flakier than the datasets allow, or without a
    certificate: a release takes only certified tasks, pipeline/tasks/certificate.py)."""
    config = settings.resolved()
    return {**uncertified(settings.layout().read_tasks(), config.synth.certify_runs),
            **left_out(read_rechecks(settings.layout().rechecks()), config.quarantine.readmit,
                       config.datasets.max_disagreement_rate)}


def _preview(frame: pl.DataFrame) -> dg.MetadataValue:
    """The first rows' identifying columns, as a Markdown table."""
    columns = [c for c in ("instance_id", "split", "chosen_source", "K", "k_star", "source", "prompt_tokens")
               if c in frame.columns]
    if not columns or not frame.height:
        return dg.MetadataValue.md("(no rows)")
    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    lines += ["| " + " | ".join(str(v) for v in row) + " |" for row in frame.select(columns).head(PREVIEW_ROWS).rows()]
    return dg.MetadataValue.md("\n".join(lines))


@dg.multi_asset(
    specs=[dg.AssetSpec(f"{kind}_dataset", group_name="datasets", kinds={"parquet"}, deps=["guided_rollouts"],
                        automation_condition=after_new_batch(), description=desc) for kind, desc in [
        ("dpo", "DPO pairs in TRL's conversational preference format: the unguided prompt, a guided or unguided "
                "success as chosen, an unguided failure as rejected."),
        ("actguide", "ActGuide groups: unguided and guided prompt, reference actions, K and k*, every attempt."),
        ("sft", "Successful attempts as messages on the unguided prompt, for SFTTrainer.")]],
    can_subset=False)
def training_datasets(context: dg.AssetExecutionContext, settings: HandholdSettings) -> Iterator[dg.MaterializeResult]:
    """Build every batch's rows that are missing or stale (incremental), then report each dataset."""
    config = settings.resolved().datasets
    layout = settings.layout()
    tasks = layout.read_tasks()
    gold = {t.instance_id: t.patch for t in tasks}
    out, gone = layout.dataset_rows(), _left_out(settings)
    report = update_datasets(layout.root, out, config, gold, split_groups(tasks), gone)
    for skipped in report.skipped_files:
        context.log.warning(f"skipped {skipped}")
    for kind in DATASET_KINDS:
        rows = read_dataset(out, kind)
        split = rows.group_by("split").len().sort("split").rows() if rows.height else []
        yield dg.MaterializeResult(asset_key=f"{kind}_dataset", metadata={
            "path": str(out / kind), "rows": rows.height, "splits": {s: n for s, n in split},
            "tasks": rows["instance_id"].n_unique() if rows.height else 0,
            "tasks_left_out": len(gone), "left_out": dg.MetadataValue.md(
                "\n".join(f"- {task}: {why}" for task, why in sorted(gone.items())) or "(none)"),
            "batches_built": report.built, "batches_reused": report.reused, "token_counter": report.token_counter,
            "dropped": {k: v for k, v in report.dropped.items() if k.startswith(f"{kind}.") or "." not in k},
            **({"groups": report.groups} if kind == "actguide" else {}),  # mixed, rescued, zero_advantage
            **({"divergence": {"rows": report.rows.get("dpo_divergence", 0),  # the pairs cut at divergence
                               "prefix_pairs": report.dropped.get("dpo_divergence.prefix_pair", 0)}}
               if kind == "dpo" else {}),
            **({"guidance_checks": report.checks} if kind != "actguide" else {}),  # per '<check>.<guidance kind>'
            "preview": _preview(rows)})


@dg.asset_check(asset="dpo_dataset", blocking=True, description="No DPO row holds any guidance text.")
def dpo_rows_hold_no_guidance(settings: HandholdSettings) -> dg.AssetCheckResult:
    rows, trajectories = read_dataset(settings.layout().dataset_rows(), "dpo"), _trajectories(settings)
    texts = [t for t in trajectories["guidance_text"].unique().to_list() if t] if trajectories.height else []
    leaks: list[int] = []
    if rows.height:
        text = rows.select(pl.concat_str([row_text(pl.col(c)) for c in ("prompt", "chosen", "rejected")]
                                         + [pl.col("tools")], separator="\x1e").alias("text"))["text"]
        for t in texts:
            leaks += [i for i, hit in enumerate(text.str.contains(t, literal=True).to_list()) if hit]
    return dg.AssetCheckResult(passed=not leaks, metadata={"rows": rows.height, "guidance_texts": len(texts),
                                                             "leaking_rows": sorted(set(leaks))[:20]})


@dg.asset_check(asset="dpo_dataset", blocking=True,
                description="No chosen DPO or SFT completion of a guided attempt refers to its guidance.")
def chosen_rows_never_refer_to_guidance(settings: HandholdSettings) -> dg.AssetCheckResult:
    out, trajectories = settings.layout().dataset_rows(), _trajectories(settings)
    found = {kind: rows_referring_to_guidance(read_dataset(out, kind), trajectories) for kind in ("dpo", "sft")}
    return dg.AssetCheckResult(passed=not any(found.values()), metadata={
        f"{kind}_referring_rollouts": ids[:20] for kind, ids in found.items()})


@dg.asset_check(asset="dpo_dataset", blocking=True, description="No row comes from an attempt with an infra error.")
def no_infra_error_attempts(settings: HandholdSettings) -> dg.AssetCheckResult:
    trajectories = _trajectories(settings)
    bad = set(trajectories.filter(pl.col("infra_error") != "")["rollout_id"].to_list()) if trajectories.height else set()
    out, used = settings.layout().dataset_rows(), set()
    dpo, sft = read_dataset(out, "dpo"), read_dataset(out, "sft")
    used |= set(dpo["chosen_rollout_id"].to_list()) | set(dpo["rejected_rollout_id"].to_list())
    used |= set(sft["rollout_id"].to_list())
    return dg.AssetCheckResult(passed=not (bad & used), metadata={"infra_attempts": len(bad),
                                                                  "used": sorted(bad & used)[:20]})


def _split_overlap(settings: HandholdSettings) -> dict[str, list[str]]:
    out = settings.layout().dataset_rows()
    overlap = {}
    for kind in DATASET_KINDS:
        rows = read_dataset(out, kind)
        both = rows.group_by("instance_id").agg(pl.col("split").n_unique().alias("n")).filter(pl.col("n") > 1)
        overlap[kind] = both["instance_id"].to_list()
    return overlap


@dg.asset_check(asset="dpo_dataset", blocking=True, description="Train and test share no task, in any dataset.")
def splits_are_disjoint_by_task(settings: HandholdSettings) -> dg.AssetCheckResult:
    overlap = _split_overlap(settings)
    return dg.AssetCheckResult(passed=not any(overlap.values()), metadata={k: v[:20] for k, v in overlap.items()})


def _export_tables(settings: HandholdSettings) -> dict[str, pl.DataFrame]:
    """The exported tables: the datasets' rows, the attempts of the tasks they draw on, and every task with
    its re-validation record (`recheck_*` columns to filter on) and quarantine reason."""
    out, layout, gone = settings.layout().dataset_rows(), settings.layout(), list(_left_out(settings))
    tables = {kind: read_dataset(out, kind) for kind in DATASET_KINDS}
    for config in {DPO_FORMS[form] for form in settings.resolved().datasets.dpo_pair_at} - set(tables):
        tables[config] = read_dataset(out, config)  # the DPO forms asked for besides `dpo`
    trajectories = _trajectories(settings)
    tables["trajectories"] = trajectories.filter(~pl.col("instance_id").is_in(gone)) if trajectories.height \
        else trajectories
    tables["tasks"] = with_certified(task_table(pl.from_arrow(layout.tasks_table()), read_rechecks(layout.rechecks()),
                                                settings.resolved().quarantine.readmit),
                                     settings.resolved().synth.certify_runs)
    return tables


@dg.asset(group_name="datasets", kinds={"huggingface"}, deps=[f"{k}_dataset" for k in DATASET_KINDS],
          automation_condition=after_new_batch(), freshness_policy=dg.FreshnessPolicy.time_window(
              fail_window=EXPORT_FRESHNESS, warn_window=EXPORT_FRESHNESS - timedelta(hours=6)))
def dataset_export(context: dg.AssetExecutionContext, settings: HandholdSettings) -> dg.MaterializeResult:
    """A local Hugging Face dataset folder: Parquet per config and split, a dataset card, the k*/K histogram; a
    release named by the batch when its rows differ from the last release's (pipeline/datasets/release.py)."""
    config, batch = settings.resolved(), settings.batch_name(context)
    # each plan with its batch: chosen rows join their plan on (batch, task), a task may be rescued in several
    plans = [pl.read_parquet(f).with_columns(batch=pl.lit(f.parent.name)) for f in settings.layout().guidance_files()]
    folder = settings.layout().export()
    tables, moved = split_by_task(_export_tables(settings), settings.layout().read_tasks(), config.datasets.test_fraction)
    dpo = tables["dpo"]
    costs, unread = stored_cost_rows(settings.layout(), config.costs,
                                     pairs_by_origin(dpo["chosen_source"].to_list() if dpo.height else []))
    for old in unread:
        context.log.warning(f"batch {old}: guidance of an older contract, its teacher cost is left out of `costs`")
    held = quarantined(read_rechecks(settings.layout().rechecks()), config.quarantine.readmit)
    report = export_dataset(folder, tables,
                            CardInfo("handhold SWE-agent training data", run_id=batch, repo_id=config.publish.repo_id,
                                     checks=manifest_checks(read_manifest(settings.layout().dataset_rows())),
                                     costs=tuple(costs), quarantine=tuple(held.values()),
                                     certify_runs=config.synth.certify_runs),
                            plans=pl.concat(plans, how="diagonal_relaxed") if plans else None)
    release = cut_release(folder, settings.layout().releases(), Provenance(
        batch, quarantined=tuple(held), evaluation=evaluation_numbers(settings.layout().latest_pass_at_1()),
        code_version=code_version(CHECKOUT), settings_sha256=settings_sha256(config), repo_id=config.publish.repo_id,
        lineage=tuple(lineage_rows(lineage(settings.layout()))), rounds_window=config.training.rounds_window))
    context.log.info(release.describe())
    rates = pass_rates(tables["trajectories"]) if tables["trajectories"].height else pl.DataFrame()
    kinds = rates["guidance_kind"].to_list() if rates.height else []
    pictures = {"pass_rate_by_guidance_kind": dg.MetadataValue.md(
        markdown_image(bar_chart_png(rates["pass_rate"].to_list() if rates.height else []), "pass rate") + "\n\n"
        + "Bars, left to right: " + ", ".join(f"{i + 1} {kind}" for i, kind in enumerate(kinds)) + " (percent of "
        "attempts resolved, infrastructure errors left out)")}
    if (folder / HISTOGRAM_FILE).exists():
        pictures["k_star_histogram"] = dg.MetadataValue.md(markdown_image((folder / HISTOGRAM_FILE).read_bytes(),
                                                                          "k*/K"))
    return dg.MaterializeResult(metadata={
        "path": str(folder), "rows": report.rows, "files": len(report.files), "empty": list(report.empty),
        "release": release.release.name, "new_release": release.new, "release_folder": str(release.folder),
        "rows_sha256": release.release.content_sha256,
        "release_changes": {f"{c.config}/{c.split}": f"+{c.added} -{c.removed}" for c in release.release.changes},
        "rows_moved_to_task_split": moved,
        "costs": dg.MetadataValue.md(cost_markdown(costs)), "cost": cost_totals(costs)["cost"],
        "load_with": f'datasets.load_dataset("{folder}", "dpo")', **pictures})


@dg.asset_check(asset="dataset_export", blocking=True, description="Every exported row passed the secret scan.")
def export_has_no_secrets(settings: HandholdSettings) -> dg.AssetCheckResult:
    tables = {name: {"all": frame} for name, frame in _export_tables(settings).items() if frame.height}
    findings = scan_tables(tables)
    return dg.AssetCheckResult(passed=not findings, metadata={"findings": [f.describe() for f in findings[:20]],
                                                              "tables": sorted(tables)})


@dg.asset(group_name="datasets", kinds={"huggingface"}, deps=[dataset_export], automation_condition=after_new_batch())
def hub_publication(context: dg.AssetExecutionContext, settings: HandholdSettings,
                    credentials: Credentials) -> dg.MaterializeResult:
    """The release pushed to the Hub as one commit tagged with its name, or nothing when that tag is there;
    skipped, saying why, without a repo or a token."""
    config, batch = settings.resolved().publish, settings.batch_name(context)
    token = credentials.hub_token or os.environ.get("HF_TOKEN", "")
    if not config.repo_id or not (token or config.dry_run):
        why = "no publish.repo_id is set" if not config.repo_id else "no Hub token (HF_TOKEN) is set"
        context.log.info(f"publication skipped: {why}")
        return dg.MaterializeResult(metadata={"published": False, "skipped": why})
    result = publish_dataset(settings.layout().export(), config, run_id=batch, token=token)
    if result.unchanged:
        context.log.info(result.describe())
    return dg.MaterializeResult(metadata={
        "published": not result.dry_run and not result.unchanged, "unchanged": result.unchanged, "tag": result.tag,
        "repo_id": result.repo_id, "revision": result.revision,
        "private": result.private, "files": len(result.files), "bytes": result.total_bytes,
        "commit": result.commit_url or "(dry run)"})


dataset_checks = [dpo_rows_hold_no_guidance, chosen_rows_never_refer_to_guidance, no_infra_error_attempts,
                  splits_are_disjoint_by_task, export_has_no_secrets]
