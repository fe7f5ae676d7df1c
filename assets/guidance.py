"""Assets that rescue failed tasks: guidance (teacher hints, minimal action prefixes) and guided rollouts."""

import dagster as dg

from assets.checks import rollout_check_specs, rollout_checks
from assets.partitions import BATCHES
from assets.resources import Credentials, HandholdSettings, make_policy, retried_on_infra
from assets.rollouts import attemptable, quarantine
from pipeline.agent.server_check import check_server
from pipeline.rollouts.cascade import cascade_savings, guided_batch, savings_markdown
from pipeline.rollouts.costs import cost_markdown, cost_rows, cost_totals
from pipeline.rollouts.families import family_chart, family_markdown, family_rows, head_to_head, head_to_head_markdown
from pipeline.guidance.reference_sources import plan_frame, source_markdown, source_table, stored_references
from pipeline.rollouts.invariants import batch_invariants, reference_checks
from pipeline.core.records import GUIDANCE_PLAN_SCHEMA, Trajectory
from pipeline.rollouts.rescue import SearchStats, action_plans, failed_groups, make_teacher, recovery, teacher_plans
from pipeline.core.store import write_rows
from pipeline.tasks.flakiness import record_rechecks, rollout_records
from pipeline.core.vocab import TEACHER_KINDS


@dg.asset(group_name="guidance", kinds={"parquet", "docker"}, deps=["unguided_rollouts"], pool="sandboxes",
          partitions_def=BATCHES)
@retried_on_infra
def guidance(context: dg.AssetExecutionContext, settings: HandholdSettings,
             credentials: Credentials) -> dg.MaterializeResult:
    """Guidance for each failed group: the teacher's hints (Agent-RLVR's three kinds, hindsight) and the minimal
    action prefix."""
    config, batch, layout = settings.resolved().guidance, settings.batch_name(context), settings.layout()
    unguided, held = layout.read_trajectories("unguided", batch), quarantine(settings)
    tasks = attemptable(settings, held)  # a task this batch's own grades quarantined gets no guidance either
    failed = failed_groups([t for t in unguided if t.instance_id in tasks], config.delta)
    teacher = make_teacher(config, credentials.key("teacher"))
    policy = make_policy(settings, credentials, batch) if "action" in config.kinds else None
    if failed:  # each server asked once before the first call: one that does not answer stops the step here
        if set(config.kinds) & set(TEACHER_KINDS):
            check_server(teacher, "teacher")
        check_server(policy, "policy")
    plans = teacher_plans(tasks, failed, teacher, config)
    if policy is not None:
        plans += action_plans(tasks, failed, [t for t in unguided if t.resolved], policy,
                              settings.resolved().rollout, config, layout.trajectories("probes", batch), batch,
                              stored=stored_references(layout, failed, batch))
    path = write_rows(layout.guidance(batch), [p.to_row() for p in plans], GUIDANCE_PLAN_SCHEMA)
    for p in plans:
        if not p.accepted:
            context.log.warning(f"guidance {p.kind} for {p.instance_id} set aside: {p.reason[:300]}")
    probes = layout.read_probes(batch)
    return dg.MaterializeResult(metadata={
        **reference_checks(plans, probes, tasks, settings.resolved().rollout.grade_rules()).metadata(),
        "path": str(path), "failed_tasks": len(failed), "unguided_tasks": len({t.instance_id for t in unguided}),
        "quarantined_skipped": len(held.keys() & {t.instance_id for t in unguided}),
        "accepted": {k: sum(p.accepted for p in plans if p.kind == k) for k in config.kinds},
        "leaks_flagged": sum(p.leaked for p in plans), **SearchStats(plans).metrics(),
        "reference_sources": dg.MetadataValue.md(source_markdown(source_table(plan_frame(plans)))),
    })


@dg.asset(group_name="guidance", kinds={"parquet", "docker"}, deps=[guidance], pool="sandboxes",
          partitions_def=BATCHES, check_specs=rollout_check_specs("guided_rollouts"))
@retried_on_infra
def guided_rollouts(context: dg.AssetExecutionContext, settings: HandholdSettings,
                    credentials: Credentials) -> dg.MaterializeResult:
    """A guided group of N attempts per failed task and guidance, graded like unguided ones; the families head to
    head on the same failed groups (`families`)."""
    batch, layout, config = settings.batch_name(context), settings.layout(), settings.resolved()
    plans = layout.read_plans(batch)
    tasks = {t.instance_id: t for t in layout.read_tasks()}
    policy = make_policy(settings, credentials, batch)
    check_server(policy, "policy")  # a server that does not answer stops the step here, before anything is written
    out = layout.trajectories("guided", batch)
    summary, cascade = guided_batch(tasks, plans, policy, config.rollout, config.guidance, out, batch,
                                    progress=context.log.info)
    guided: list[Trajectory] = summary.trajectories
    invariants = batch_invariants(guided, tasks, config.rollout.grade_rules())
    graded = rollout_records(guided, invariants.regrade.mismatches, batch)  # quarantines from the next batch
    record_rechecks(layout.rechecks(), batch, "guided_rollouts", graded)
    probes = layout.read_probes(batch)
    families = family_rows(plans, guided, cascade.ran if cascade else None)
    costs = cost_rows([*layout.read_trajectories("unguided", batch), *guided], config.costs, probes, plans)
    return dg.MaterializeResult(metadata={
        "path": str(out / "trajectories.parquet"), "recovery": recovery(plans, guided),
        "graded_inconsistently": [r.instance_id for r in graded],
        "families": dg.MetadataValue.md(family_markdown(families)),
        "families_chart": dg.MetadataValue.md(family_chart(families)),
        "head_to_head": dg.MetadataValue.md(head_to_head_markdown(head_to_head(families, costs))),
        "costs": dg.MetadataValue.md(cost_markdown(costs)), "cost": cost_totals(costs)["cost"],
        **({"cascade": dg.MetadataValue.md(savings_markdown(cascade_savings(cascade, config.costs)))}
           if cascade else {}),
        "quotes_guidance": sum(t.quotes_guidance for t in guided), **SearchStats(plans).metrics(guided),
        **{f"batch_{k}": v for k, v in summary.metrics().items()}, **invariants.metadata(),
    }, check_results=rollout_checks("guided_rollouts", out / "trajectories.parquet", batch, guided, invariants,
                                    config.rollout.max_infra_error_rate))
