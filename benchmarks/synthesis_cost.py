"""Seconds per kept task of bug synthesis (`tasks`), this tree against a baseline git ref, same run.

Each side synthesizes the same packages into its own fresh cache folder, in its own process (the
baseline from a temporary git worktree of `--baseline`), after preparing their environments there
as the `environment_images` asset does before `tasks` (not counted), with the same checks (3 baseline runs,
3 runs with each bug, 3 gold grades, the weak-test probe). Prints, per side, the tasks kept,
seconds per kept task, tasks per hour and the wall-time breakdown by stage, then the ratio.

    python benchmarks/synthesis_cost.py [--packages toolz,tabulate,boltons] [--baseline REF]
        [--tasks 8] [--candidates 60] [--order together|baseline-first|now-first]
`together` (the default) runs both sides at once, so both meet the same load on a shared machine
(whichever finishes first leaves the other a quieter tail: the baseline, being slower, gains by it).
Target (issue #20): seconds per kept task at most 0.5x the baseline's on the three default packages.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
VERIFIER = ("verify_setup", "gold_grades", "empty_grade", "reset")  # the same grades on both sides
BASELINE = "0d8f3d4"  # main before synthesis was made cheaper (its stage breakdown already in place)
WORKER = """
import json, sys, time
from pathlib import Path
sys.path.insert(0, sys.argv[1])
if (Path(sys.argv[1]) / "pipeline/synthesis").is_dir():
    from pipeline.synthesis.env_image import build_environment_image
    from pipeline.synthesis.packages import package_specs
    from pipeline.synthesis.synth import SynthConfig, synthesize
else:  # a tree from before pipeline/synthesis/ (the baseline): the editable install would lend it this tree's
    from pipeline.tasks.packages import build_environment_image, package_specs
    from pipeline.tasks.synth import SynthConfig, synthesize
try:  # a tree whose grades take their rules as one value (GradeRules)
    from pipeline.rollouts.batch import RolloutConfig
    RULES = {"rules": RolloutConfig().grade_rules()}
except (ModuleNotFoundError, AttributeError):
    RULES = {}
from sandbox.images import docker_client, ensure_base_image
client, cache = docker_client(), Path(sys.argv[2])
config = SynthConfig(packages=tuple(sys.argv[3].split(",")), tasks_per_package=int(sys.argv[4]),
                     candidates_per_package=int(sys.argv[5]))
base, start = ensure_base_image(client=client), time.monotonic()
for spec in package_specs(config.packages):  # what the environment_images asset does before `tasks`
    build_environment_image(spec, base, cache, client)
environments = time.monotonic() - start
tasks, report = synthesize(config, base, cache, client, **RULES)
print(json.dumps({**report.as_json(), "environment_seconds": round(environments, 1)}))
"""


def started(tree: Path, cache: Path, args) -> subprocess.Popen:
    """`tree`'s synthesis of the packages into the fresh folder `cache`, started in its own process."""
    return subprocess.Popen([sys.executable, "-c", WORKER, str(tree), str(cache), args.packages, str(args.tasks),
                             str(args.candidates)], cwd=tree, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)


def report_of(tree: Path, process: subprocess.Popen) -> dict:
    out, err = process.communicate()
    if process.returncode != 0:
        raise SystemExit(f"synthesis in {tree} failed:\n{err[-3000:]}")
    return json.loads(out.strip().splitlines()[-1])


def kept(report: dict) -> int:
    return sum(c.get("kept", 0) for c in report["per_package"].values())


def show(name: str, report: dict) -> float:
    """Print one side's figures; returns its seconds per kept task."""
    n, seconds = kept(report), report["seconds"]
    per_task = seconds / n if n else float("inf")
    tested = sum(c.get("tested", 0) for c in report["per_package"].values())
    print(f"\n{name}: {n} tasks kept of {tested} candidates tested in {seconds:.1f} s: {per_task:.2f} s per kept "
          f"task, {3600 * n / seconds:.0f} tasks per hour (environments first: {report['environment_seconds']} s, "
          "as the environment_images asset before `tasks`, not counted)")
    runs = report.get("stage_runs", {})
    for stage, s in report.get("breakdown", {}).items():
        print(f"  {stage:14} {s:8.1f} s {100 * s / seconds:5.1f}%  {runs.get(stage, '')}")
    return per_task


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--packages", default="toolz", help="comma-separated package entries")
    parser.add_argument("--baseline", default=BASELINE, help="git ref of the synthesis to compare against")
    parser.add_argument("--tasks", type=int, default=8, help="tasks_per_package")
    parser.add_argument("--candidates", type=int, default=60, help="candidates_per_package")
    parser.add_argument("--order", choices=("together", "baseline-first", "now-first"), default="together")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="handhold-synth-bench-") as tmp:
        baseline = Path(tmp) / "baseline"
        subprocess.run(["git", "worktree", "add", "-q", "--detach", str(baseline), args.baseline], cwd=ROOT, check=True)
        try:
            sides = [("baseline", baseline), ("now", ROOT)]
            if args.order == "now-first":
                sides.reverse()
            start, reports = time.perf_counter(), {}
            if args.order == "together":
                running = {name: (tree, started(tree, Path(tmp) / f"cache-{name}", args)) for name, tree in sides}
                reports = {name: report_of(tree, process) for name, (tree, process) in running.items()}
            for name, tree in sides if args.order != "together" else ():
                reports[name] = report_of(tree, started(tree, Path(tmp) / f"cache-{name}", args))
            seconds = time.perf_counter() - start
        finally:
            subprocess.run(["git", "worktree", "remove", "--force", str(baseline)], cwd=ROOT, check=False)
    old = show(f"baseline ({args.baseline})", reports["baseline"])
    new = show("now", reports["now"])
    print(f"\nseconds per kept task: now / baseline = {new / old:.2f} (target <= 0.50); packages {args.packages}; "
          f"{seconds:.0f} s in all")
    load = verifier_seconds(reports["baseline"]) / verifier_seconds(reports["now"])
    print(f"the verifier's grades are the same work on both sides, yet took {1 / load:.2f}x the baseline's time "
          f"now: on a shared machine the load differed; scaled by it, now / baseline = {load * new / old:.2f}")


def verifier_seconds(report: dict) -> float:
    return sum(report.get("breakdown", {}).get(stage, 0.0) for stage in VERIFIER) or float("nan")


if __name__ == "__main__":
    main()
