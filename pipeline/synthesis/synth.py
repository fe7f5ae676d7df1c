"""Tasks synthesized offline by injecting bugs into real packages (the built-in default).

Per package version: one environment image; its pristine suite run `baseline_runs` times (a
test that does not pass every time is never PASS_TO_PASS); AST bug candidates validated in
sandboxes (tests that passed before and fail now are FAIL_TO_PASS, those still passing
PASS_TO_PASS; the same failures on every one of `validation_runs` runs, the last of them the
verifier's grade of the empty patch, and the gold patch resolving on every run); each kept task's gold and empty
patches graded in `certify_runs` fresh containers, one in a shuffled test order (its certificate,
pipeline/tasks/certificate.py); candidates tried for at most `package_budget` seconds a package
(pipeline/synthesis/budget.py); every stage counted and timed (pipeline/tasks/stage_clock.py), every package
that yields nothing says why. Sandboxes run
the suite from the bytecode the environment image holds (env_image.compile_tree); one traced run of the
pristine suite maps each function to the tests that run it (callmap.py), so a bug runs only the test files
that can see it, and one that no test runs costs no run; the weak-test probe runs the files of the
FAIL_TO_PASS tests; the verifier's first gold grade and the empty patch's run the whole suite, its repeat gold
grades the bug's test files (`narrowed_task`). Besides AST mutations: rewrites by the teacher LLM (`rewrite`) and
bugs of one module combined (`combine`); every kept task carries a difficulty record in its provenance,
summarised in the report.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import math
import threading
import time
import zlib
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import docker

from pipeline.agent.policy import Policy
from pipeline.core.records import TASK_SCHEMA, RejectedTask, Task
from pipeline.core.store import write_rows
from pipeline.synthesis import combine as combined
from pipeline.synthesis.budget import budget_note, over_budget
from pipeline.synthesis.bug_runs import try_candidate
from pipeline.synthesis.callmap import traced_run
from pipeline.synthesis.difficulty import difficulty, task_difficulty
from pipeline.synthesis.env_image import build_environment_image
from pipeline.synthesis.issue_writer import written_statement
from pipeline.synthesis.candidates import BugCandidate, collect_candidates
from pipeline.synthesis.packages import (WORKDIR, PackageError, PackageSpec, fetch_source, package_lock, package_specs,
                                         resolve, test_command)
from pipeline.synthesis.patches import bug_patch, gold_patch
from pipeline.synthesis.rewrite import rewrite_candidates
from pipeline.synthesis.statements import failure_messages_from_log
from pipeline.synthesis.subjects import api_index
from pipeline.synthesis.suite import LOG_PARSER, Baseline, baseline, runnable, with_test_files
from pipeline.synthesis.synth_config import SynthConfig, SynthReport
from pipeline.synthesis.task_cache import cache_file, cached_tasks
from pipeline.tasks.copies import hidden_copies
from pipeline.tasks.validate import FLAKY, FLAKY_BUG, check_tasks
from pipeline.verifier.rules import GradeRules
from pipeline.verifier.environment import environment_sandbox
from sandbox.base import Sandbox, SandboxSpec

log = logging.getLogger(__name__)


def make_task(spec: PackageSpec, image: str, cand: BugCandidate, f2p: list[str], base: Baseline,
              text: str, config: SynthConfig, writer: Policy | None = None,
              parts: list[BugCandidate] = ()) -> Task:
    """The task of a bug that broke `f2p` on every run; `parts`: the bugs a combined one holds."""
    p2p, gold = sorted(base.passed - set(f2p)), gold_patch(cand)
    seed = zlib.crc32(f"{config.seed}:{cand.candidate_id}".encode())  # each task its own template and wording
    statement = written_statement(writer, spec.name, f2p, failure_messages_from_log(text), gold, seed,
                                  base.api.subjects(f2p) if base.api else [])
    kinds = [p.kind for p in parts] or [cand.kind]
    provenance = {"package": spec.name, "version": spec.version, "file": cand.file, "function": cand.function,
                  "kind": cand.kind, "lineno": cand.lineno, "candidate_id": cand.candidate_id,
                  "difficulty": difficulty(gold, f2p, kinds)}
    if parts:
        provenance["parts"] = [p.candidate_id for p in parts]
    return Task(
        instance_id=f"{spec.name}__{spec.version}__{cand.kind}__{cand.candidate_id[:10]}",
        repo=f"pypi/{spec.name}", base_commit="", patch=gold, test_patch="",
        problem_statement=statement, FAIL_TO_PASS=tuple(f2p), PASS_TO_PASS=tuple(p2p), image=image,
        workdir=WORKDIR, test_cmd=test_command(spec), log_parser=LOG_PARSER, source="synth",
        version=spec.version, created_at=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        setup_patch=bug_patch(cand), test_files=spec.test_paths, provenance=json.dumps(provenance),
    )


def synthesize_package(spec: PackageSpec, image: str, cache: Path, config: SynthConfig,
                       report: SynthReport, client: docker.DockerClient, writer: Policy | None = None,
                       rewriter: Policy | None = None, limits: SandboxSpec | None = None
                       ) -> list[tuple[Task, Task | None]]:
    """Candidate tasks of one package, in its environment image (not yet checked by the verifier), each with
    its gold patch's repeat grade (`narrowed_task`). `limits`: the sandboxes' (the grades' own, GradeRules.sandbox,
    so a test that cannot pass under them is not taken as passing)."""
    with report.clock.stage("candidates"):
        root = fetch_source(spec, cache)
        candidates, stats = collect_candidates(root, include=list(spec.source_globs), seed=config.seed,
                                               max_per_function=config.max_per_function,
                                               limit=config.candidates_per_package)
        candidates = _rewrites(spec, root, config, report, rewriter) + candidates  # few and costly: tried first
    for kind, n in stats.generated.items():
        report.count(spec.key, kind, "generated", n)
    for kind, n in stats.compiled.items():
        report.count(spec.key, kind, "compiled", n)
    with report.clock.stage("sandbox_start", config.workers):
        sandboxes = [environment_sandbox(image, WORKDIR, limits, client=client) for _ in range(config.workers)]
    try:
        with report.clock.stage("collect"):
            spec = runnable(sandboxes[0], spec, config)
        with report.clock.stage("baseline", config.baseline_runs):
            base = baseline(sandboxes[0], spec, config)
        with report.clock.stage("callmap"):
            base = dataclasses.replace(base, callmap=traced_run(sandboxes[0], spec, config.suite_timeout),
                                       api=api_index(root, spec.source_globs or ()))
        report.note(spec.key, "call_map_functions", len(base.callmap.by_site) if base.callmap else 0)
        report.note(spec.key, "tests_found", base.total)
        report.note(spec.key, "stable_passing", len(base.passed))
        report.note(spec.key, "flaky_tests", len(base.flaky))
        if not candidates:
            raise PackageError(f"{spec.key}: no bug candidates in {list(spec.source_globs or ())}; set "
                               "source_globs=<globs> in the package entry", "candidates")
        deadline = time.monotonic() + (config.package_budget or math.inf)  # the budget counts from here
        kept = _validate_candidates(spec, image, candidates, base, sandboxes, config, report, writer,
                                    want=config.tasks_per_package, deadline=deadline)
        if config.combine:
            begun = time.monotonic()
            kept += _combined(spec, image, kept, base, sandboxes, config, report, writer, deadline)
            report.note(spec.key, "combine_seconds", round(time.monotonic() - begun, 1))  # verifier not included
    finally:
        with report.clock.stage("sandbox_close", len(sandboxes)):
            for sb in sandboxes:
                sb.close()
    return [(task, narrowed) for task, _, narrowed in kept]


def _rewrites(spec, root, config, report, rewriter) -> list[BugCandidate]:
    """The teacher's rewrites as candidates; each rejected one counted under `rejected_<reason>`."""
    if not config.rewrite or not config.rewrites_per_package:
        return []
    if rewriter is None:
        report.rejects.append(RejectedTask(spec.key, "rewrite", "rewrite needs an LLM teacher: set guidance.teacher "
                                           "to an LLM (not rule), or synth.rewrite to false"))
        return []
    made, rejected = rewrite_candidates(root, list(spec.source_globs), rewriter, spec.name, config.seed,
                                        config.rewrites_per_package)
    report.count(spec.key, "rewrite", "generated", len(made) + len(rejected))
    report.count(spec.key, "rewrite", "compiled", len(made))
    for r in rejected:
        report.count(spec.key, "rewrite", f"rejected_{r.reason}")
        report.rejects.append(RejectedTask(f"{spec.key}:{r.file}:{r.function}", "rewrite", f"{r.reason}: {r.detail}"))
    return made


def _combined(spec, image, kept, base, sandboxes, config, report, writer, deadline: float
              ) -> list[tuple[Task, BugCandidate, Task | None]]:
    """Up to `combine` tasks each merging 2-3 kept bugs of one module, validated as a whole."""
    f2p = {cand.candidate_id: task.FAIL_TO_PASS for task, cand, _ in kept}
    groups = combined.combinations_to_try([cand for _, cand, _ in kept], config.seed)
    report.count(spec.key, combined.KIND, "generated", len(groups))
    report.count(spec.key, combined.KIND, "compiled", len(groups))
    parts = {cand.candidate_id: group for cand, group in groups}
    expect = {cand.candidate_id: sorted({t for p in group for t in f2p[p.candidate_id]}) for cand, group in groups}
    return _validate_candidates(spec, image, [cand for cand, _ in groups], base, sandboxes, config, report, writer,
                                want=config.combine, parts=parts, expect=expect, deadline=deadline)


def _validate_candidates(spec, image, candidates, base, sandboxes, config, report, writer, want: int,
                         parts: dict | None = None, expect: dict | None = None, deadline: float = math.inf
                         ) -> list[tuple[Task, BugCandidate, Task | None]]:
    """The first `want` candidates in candidate order that make a task, each with its `narrowed_task`: tried on
    the sandboxes in parallel, none handed out once `want` are found or once `deadline` (time.monotonic) has
    passed (`over_budget`). Every candidate before the last one handed out has been tried, so which are kept
    does not depend on which sandbox finished first."""
    kept: list[tuple[int, Task, BugCandidate, Task | None]] = []
    pending = list(enumerate(candidates))
    lock = threading.Lock()

    def next_candidate() -> tuple[int, BugCandidate] | None:
        with lock:
            return pending.pop(0) if pending and len(kept) < want and time.monotonic() < deadline else None

    def worker(sandbox: Sandbox) -> None:
        while (item := next_candidate()) is not None:
            i, cand = item
            found = try_candidate(sandbox, spec, cand, base, config, report,
                                  expect=(expect or {}).get(cand.candidate_id))
            if found:
                task = make_task(spec, image, cand, found[0], base, found[1], config, writer,
                                 parts=(parts or {}).get(cand.candidate_id, []))
                with lock:
                    kept.append((i, task, cand, narrowed_task(task, spec, found[2])))

    with report.clock.parallel(len(sandboxes)), ThreadPoolExecutor(len(sandboxes)) as pool:
        for future in [pool.submit(worker, sb) for sb in sandboxes]:
            future.result()
    if pending and len(kept) < want:
        over_budget(spec, len(pending), len(kept), config, report)
    return [(task, cand, narrowed) for _, task, cand, narrowed in sorted(kept, key=lambda k: k[0])[:want]]


def narrowed_task(task: Task, spec: PackageSpec, files: tuple[str, ...] | None) -> Task | None:
    """The task cut to the test files its bug ran (the call map's): what the verifier's repeat grades of the
    gold patch run. The first gold grade and the empty patch's run the whole suite; the tests outside these
    files never see the bug or its fix, and the baseline's runs already held them to passing every time.
    None when the bug ran the whole suite."""
    if files is None or spec.test_command:
        return None
    return dataclasses.replace(task, test_cmd=test_command(with_test_files(spec, files)),
                               PASS_TO_PASS=tuple(t for t in task.PASS_TO_PASS if t.split("::")[0] in files))


def synthesize(config: SynthConfig, base_image: str, cache: Path, client: docker.DockerClient, *,
               rules: GradeRules, specs: tuple[PackageSpec, ...] | None = None,
               statement_writer: Policy | None = None,
               rewriter: Policy | None = None) -> tuple[list[Task], SynthReport]:
    """Validated tasks from every package (`specs`, else the configured names); a package that fails is
    reported (a RejectedTask naming package, stage and reason), not fatal. `statement_writer`: the teacher
    LLM that writes problem statements (None: templates); `rules`: what validation grades under; `rewriter`: the one that rewrites functions when
    `config.rewrite` is on (None: the statement writer)."""
    rewriter = rewriter or statement_writer
    start, report, tasks = time.monotonic(), SynthReport(), []
    for spec in specs if specs is not None else package_specs(config.packages):
        begun = time.monotonic()
        try:
            with package_lock(cache, spec.name):
                with report.clock.stage("image"):
                    spec = resolve(spec, cache)
                found = _package_tasks(spec, base_image, cache, config, rules, report, client, statement_writer,
                                       rewriter)
            report.difficulty += [(spec.key, json.loads(t.provenance)["kind"], task_difficulty(t)) for t in found]
            tasks += found
        except PackageError as exc:
            log.warning("skipping %s at %s: %s", spec.key, exc.stage, exc)
            report.rejects.append(RejectedTask(spec.key, exc.stage, str(exc)))
        report.note(spec.key, "seconds", round(time.monotonic() - begun, 1))
    report.seconds = time.monotonic() - start
    return tasks, report


def _parts_kept(spec: PackageSpec, tasks: list[Task], report: SynthReport) -> list[Task]:
    """The tasks less each combined one with a part the verifier set aside (it must merge validated bugs)."""
    ids = {json.loads(t.provenance)["candidate_id"] for t in tasks}
    out = []
    for task in tasks:
        missing = set(json.loads(task.provenance).get("parts", ())) - ids
        if missing:
            report.rejects.append(RejectedTask(task.instance_id, "combine", f"parts {sorted(missing)} were set "
                                               "aside by the verifier"))
        else:
            out.append(task)
    return out


def _package_tasks(spec, base_image, cache, config, rules, report, client, writer, rewriter) -> list[Task]:
    with report.clock.stage("image"):
        image = build_environment_image(spec, base_image, cache, client)
        report.removed[spec.key] = hidden_copies(fetch_source(spec, cache), spec.source_globs or ())
    report.note(spec.key, "copies_removed", len(report.removed[spec.key]))
    cached = cache_file(spec, image, config, cache, writer, rewriter, rules)
    found = cached_tasks(cached, config)
    if found is not None:
        report.per_package.setdefault(spec.key, Counter())["cached"] = 1
        return found
    start = time.monotonic()
    log.info("%s: synthesizing tasks in %s", spec.key, image)
    candidates = synthesize_package(spec, image, cache, config, report, client, writer, rewriter, rules.sandbox)
    begun = time.monotonic()
    kept, rejects = check_tasks([task for task, _ in candidates], rules, workers=config.workers, runs=config.validation_runs,
                                clock=report.clock, exact=True, certify_runs=config.certify_runs,
                                repeats={task.instance_id: narrowed for task, narrowed in candidates if narrowed})
    report.note(spec.key, "verify_seconds", round(time.monotonic() - begun, 1))
    kept = _parts_kept(spec, kept, report)
    report.rejects += rejects
    report.note(spec.key, "flaky_gold", sum(r.reason.startswith(FLAKY) for r in rejects))
    report.note(spec.key, "flaky_with_bug_verifier", sum(r.reason.startswith(FLAKY_BUG) for r in rejects))
    for task in kept:
        report.count(spec.key, json.loads(task.provenance)["kind"], "kept")
    counts = report.per_package[spec.key]
    if not kept:
        raise PackageError(f"{spec.key}: no task kept: {counts['tested']} candidates tested, {counts['broke_tests']} "
                           f"broke 1 to {config.max_fail_to_pass} tests ({counts['weak_tests']} under tests that "
                           f"ignore the function's result), {counts['stable']} the same way on every run, "
                           f"{len(rejects)} set aside by the verifier{budget_note(counts, config)}; raise "
                           "candidates_per_package or widen source_globs in the package entry", "synthesize")
    write_rows(cached, [t.to_row() for t in kept], TASK_SCHEMA)
    log.info("%s: %d tasks kept (%d candidates tested, %d broke tests, %d set aside by the verifier) in %.0f s",
             spec.key, len(kept), counts["tested"], counts["broke_tests"], len(rejects), time.monotonic() - start)
    return kept
