"""Grading time of the gold patch, per package: this tree's verifier against a baseline git ref's,
both measured in the same run on the same tasks. Prints medians and the ratio now / baseline.

    python benchmarks/grading_overhead.py [--baseline b9bd71e] [--runs 5] [--cache data/cache]
Target: the defended verifier is at most 1.2x the baseline (no more than 20% slower).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TIMER = """
import json, sys, time
# Only the given tree's modules: the venv's editable install would answer for those the tree lacks
sys.meta_path = [f for f in sys.meta_path if not getattr(f, "__module__", "").startswith("__editable__")]
sys.path.insert(0, sys.argv[1])
from pipeline.core.records import Task
from pipeline.core.store import read_rows
try:
    from pipeline.verifier.grading import grade
except ModuleNotFoundError:  # a tree from before pipeline/verifier/ (the default baseline)
    from pipeline.grading import grade
try:  # a tree whose grades take their rules as one value (GradeRules)
    from pipeline.rollouts.batch import RolloutConfig
    RULES = (RolloutConfig().grade_rules(),)
except (ModuleNotFoundError, AttributeError):
    RULES = ()
out = {}
for row in read_rows(sys.argv[2]):
    task, times = Task.from_row(row), []
    for _ in range(int(sys.argv[3])):
        start = time.perf_counter()
        verdict = grade(task, task.patch, *RULES)
        assert verdict.resolved, (task.instance_id, verdict.reason)
        times.append(time.perf_counter() - start)
    out[task.instance_id] = times
print(json.dumps(out))
"""


def one_task_per_package(cache: Path) -> list:
    """A validated task of each built-in package (synthesized once; cached under `cache`)."""
    sys.path.insert(0, str(ROOT))
    from pipeline.synthesis.packages import DEFAULT_PACKAGES
    from pipeline.rollouts.batch import RolloutConfig
    from pipeline.synthesis.synth import SynthConfig, synthesize
    from sandbox.images import docker_client, ensure_base_image

    client = docker_client()
    base = ensure_base_image(client=client)
    tasks = []
    for spec in DEFAULT_PACKAGES:
        found, _ = synthesize(SynthConfig(packages=(spec.name,), tasks_per_package=1, candidates_per_package=20),
                              base, cache, client, rules=RolloutConfig().grade_rules())
        tasks += found[:1]
    return tasks


def timed(tree: Path, task_file: Path, runs: int) -> dict[str, list[float]]:
    done = subprocess.run([sys.executable, "-c", TIMER, str(tree), str(task_file), str(runs)], cwd=tree,
                          capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"grading with the tree at {tree} failed (exit {done.returncode}):\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--baseline", default="b9bd71e", help="git ref of the verifier to compare against")
    parser.add_argument("--runs", type=int, default=5, help="gradings per task and verifier")
    parser.add_argument("--cache", default=str(ROOT / "data" / "cache"), help="synthesis cache folder")
    args = parser.parse_args()
    from pipeline.core.records import TASK_SCHEMA
    from pipeline.core.store import write_rows

    tasks = one_task_per_package(Path(args.cache))
    with tempfile.TemporaryDirectory(prefix="handhold-bench-") as tmp:
        task_file = write_rows(Path(tmp) / "tasks.parquet", [t.to_row() for t in tasks], TASK_SCHEMA)
        baseline = Path(tmp) / "baseline"
        subprocess.run(["git", "worktree", "add", "-q", "--detach", str(baseline), args.baseline], cwd=ROOT, check=True)
        try:
            start = time.perf_counter()
            old = timed(baseline, task_file, args.runs)
            new = timed(ROOT, task_file, args.runs)
            seconds = time.perf_counter() - start
        finally:
            subprocess.run(["git", "worktree", "remove", "--force", str(baseline)], cwd=ROOT, check=False)
    print(f"{'task':60} {'baseline s':>10} {'now s':>8} {'ratio':>6}")
    ratios = []
    for task in tasks:
        b, n = statistics.median(old[task.instance_id]), statistics.median(new[task.instance_id])
        ratios.append(n / b)
        print(f"{task.instance_id:60} {b:10.3f} {n:8.3f} {n / b:6.2f}")
    print(f"worst ratio {max(ratios):.2f} (target <= 1.20); {args.runs} runs each; {seconds:.0f} s in all")


if __name__ == "__main__":
    main()
