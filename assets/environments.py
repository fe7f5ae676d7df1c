"""Assets that make the SWE environments: base image, sources, environment images, tasks."""

import dataclasses
import hashlib
import json
import os
from concurrent.futures import ThreadPoolExecutor

import dagster as dg

from assets.checks import ANSWER_CHECK, TASK_CHECK, answer_check, task_check
from assets.resources import Credentials, HandholdSettings
from pipeline.core.records import REJECT_SCHEMA, TASK_SCHEMA, TASK_SCHEMA_VERSION, Task
from pipeline.rollouts.rescue import teacher_client
from pipeline.sources.swebench_rows import load_tasks
from pipeline.core.store import write_rows
from pipeline.synthesis.env_image import build_environment_image
from pipeline.synthesis.packages import PackageError, fetch_source, package_lock, package_specs
from pipeline.synthesis.synth import synthesize
from pipeline.tasks.certificate import task_rows, uncertified
from pipeline.tasks.decontam import decontaminate
from pipeline.tasks.flakiness import quarantine_markdown, quarantined, read_rechecks
from pipeline.tasks.validate import check_tasks
from sandbox.images import docker_client, ensure_base_image


@dg.asset(group_name="environments", kinds={"docker"})
def sandbox_base_image(settings: HandholdSettings) -> dg.MaterializeResult:
    """The image every sandbox and environment image starts from (pulled, or built from Debian)."""
    client = docker_client()
    tag = ensure_base_image(settings.resolved().base_image, client=client)
    image = client.images.get(tag)
    return dg.MaterializeResult(metadata={
        "tag": tag, "image_id": image.short_id, "size_mb": round(image.attrs["Size"] / 1e6, 1),
    })


def each_package(context, settings: HandholdSettings, make) -> tuple[dict, dict]:
    """`make(spec)` for every configured package, one per core at once (downloads, wheel and image builds are
    mostly one process each): what each made, and why each that failed did (logged; the `tasks` asset records
    these packages in rejects.parquet and keeps the others' tasks). Both in the configured order."""
    cache, specs = settings.layout().cache(), package_specs(settings.resolved().synth.packages)

    def one(spec) -> tuple[str | None, str | None]:
        try:
            with package_lock(cache, spec.name):
                return make(spec), None
        except PackageError as error:
            context.log.warning(f"package {spec.key} set aside at {error.stage}: {str(error)[:500]}")
            return None, f"{error.stage}: {error}"

    with ThreadPoolExecutor(max(min(len(specs), os.cpu_count() or 1), 1)) as pool:
        results = list(pool.map(one, specs))
    made = {spec.key: out for spec, (out, why) in zip(specs, results) if why is None}
    failed = {spec.key: why for spec, (_, why) in zip(specs, results) if why is not None}
    return made, failed


@dg.asset(group_name="environments", kinds={"python"})
def task_sources(context: dg.AssetExecutionContext, settings: HandholdSettings) -> dg.MaterializeResult:
    """Package sources (sdists as git repos) and, when configured, SWE-bench-format dataset rows."""
    layout, config = settings.layout(), settings.resolved()
    cache = layout.cache()
    roots, failed = each_package(context, settings, lambda spec: str(fetch_source(spec, cache)))
    sources = config.sources
    rows, rejects = (load_tasks(sources.dataset, split=sources.dataset_split, limit=sources.dataset_limit or None,
                                decontaminate=sources.decontaminate, eval_benchmarks=sources.eval_benchmarks)
                     if sources.dataset else ([], []))
    write_rows(layout.dataset_tasks(), [t.to_row() for t in rows], TASK_SCHEMA)
    write_rows(layout.dataset_rejects(), [dataclasses.asdict(r) for r in rejects], REJECT_SCHEMA)
    return dg.MaterializeResult(metadata={
        "packages": roots, "packages_failed": failed, "dataset": sources.dataset or "(none)",
        "dataset_rows": len(rows), "dataset_rejects": len(rejects),
    })


@dg.asset(group_name="environments", kinds={"docker"}, deps=[sandbox_base_image, task_sources])
def environment_images(context: dg.AssetExecutionContext, settings: HandholdSettings) -> dg.MaterializeResult:
    """One image per package version, its package installed editable with test dependencies."""
    client, cache, config = docker_client(), settings.layout().cache(), settings.resolved()
    tags, failed = each_package(context, settings,
                                lambda spec: build_environment_image(spec, config.base_image.tag, cache, client))
    return dg.MaterializeResult(metadata={"images": tags, "count": len(tags), "packages_failed": failed})


def dataset_tasks(settings: HandholdSettings, rows: list[Task], workers: int, certify_runs: int = 1
                  ) -> tuple[list[Task], list, int]:
    """The validated tasks of every dataset source added so far, the rows this run set aside, and how many
    rows it validated. A source's rows are validated once (keyed by their content, the task schema and
    `certify_runs`) as synthesized tasks are, their certificate included (pipeline/tasks/certificate.py), and
    kept under data/tasks/sources/, so a new source adds its tasks without re-validating or dropping the others;
    a source kept before certificates still loads, its tasks uncertified, until validated again."""
    store = settings.layout().source_store()
    store.mkdir(exist_ok=True)
    rejects, validated = [], 0
    if rows:
        rules = settings.resolved().rollout.grade_rules()  # validated under other rules: validated again
        key = [TASK_SCHEMA_VERSION, certify_runs, dataclasses.asdict(rules), *(t.to_row() for t in rows)]
        digest = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:16]
        if not (store / f"{digest}.parquet").exists():
            checked, rejects = check_tasks(rows, rules, workers=workers, certify_runs=certify_runs)
            validated = len(rows)
            write_rows(store / f"{digest}.parquet", [t.to_row() for t in checked], TASK_SCHEMA)
    by_id = {}
    for path in sorted(store.glob("*.parquet"), key=lambda f: f.stat().st_mtime_ns):  # a later source wins
        by_id.update({r["instance_id"]: Task.from_row(r) for r in task_rows(path, produced_by="tasks")})
    return list(by_id.values()), rejects, validated


@dg.asset(group_name="environments", kinds={"parquet"}, deps=[environment_images],
          check_specs=[TASK_CHECK, ANSWER_CHECK])
def tasks(context: dg.AssetExecutionContext, settings: HandholdSettings,
          credentials: Credentials) -> dg.MaterializeResult:
    """Validated tasks: synthesized bugs plus dataset rows whose gold patch resolves and empty patch does not."""
    config, layout = settings.resolved(), settings.layout()
    rows = layout.read_dataset_tasks()  # before the synthesis: a missing task_sources fails in a second, not after it
    writer = teacher_client(config.guidance, credentials.key("teacher"))  # writes problem statements, if an LLM
    synthesized, report = synthesize(config.synth, config.base_image.tag, layout.cache(), docker_client(),
                                     rules=config.rollout.grade_rules(), statement_writer=writer)
    synthesized, overlapping = decontaminate(synthesized, config.sources.decontaminate, config.sources.eval_benchmarks)
    checked, dataset_rejects, validated = dataset_tasks(settings, rows, config.synth.workers, config.synth.certify_runs)
    all_tasks, rejects = synthesized + checked, report.rejects + overlapping + dataset_rejects
    path = write_rows(layout.tasks(), [t.to_row() for t in all_tasks], TASK_SCHEMA)
    write_rows(layout.task_rejects(), [dataclasses.asdict(r) for r in rejects], REJECT_SCHEMA)
    for reject in rejects:
        context.log.warning(f"set aside {reject.item} at {reject.stage}: {reject.reason[:300]}")
    stats = report.as_json()
    layout.synth_report().write_text(json.dumps(stats, indent=1))
    validation = task_check(all_tasks, config.recheck_tasks, layout.rechecks(), context.run_id, config.quarantine,
                            config.rollout.grade_rules())
    held = quarantined(read_rechecks(layout.rechecks()), config.quarantine.readmit)
    unsure = uncertified(all_tasks, config.synth.certify_runs)  # a release leaves these out
    return dg.MaterializeResult(metadata={
        "tasks_certified": len(all_tasks) - len(unsure), "uncertified": dg.MetadataValue.md(
            "\n".join(f"- {task}: {why}" for task, why in sorted(unsure.items())) or "(none)"),
        "quarantined": len(held), "quarantine": dg.MetadataValue.md(quarantine_markdown(held.values())),
        "path": str(path), "tasks": len(all_tasks), "dataset_tasks": len(checked), "dataset_rows_validated": validated,
        "rejected": len(rejects), "synth_seconds": stats["seconds"],
        "per_package": stats["per_package"], "per_kind": stats["per_kind"], "copies_removed": stats["removed"],
        "synth_seconds_per_task": stats["seconds_per_task"], "synth_tasks_per_hour": stats["tasks_per_hour"],
        "synth_breakdown": stats["breakdown"],
    }, check_results=[validation, answer_check(all_tasks, config.recheck_tasks)])
