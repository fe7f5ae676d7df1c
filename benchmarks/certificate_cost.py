"""What the certificate adds to synthesis (`tasks`): the same packages synthesized with `certify_runs` 1 (one
container per task: the grades tasks had before certificates) and 3 (the default), same process, same tree.

Each side synthesizes into its own copy of a cache folder (sdists, wheels and build backends copied, no tasks), so
nothing is downloaded and no task is read from a cache. Prepared task images (one per task, made by the first
validation of it) would favour whichever side runs second, so the sides alternate twice and the second round,
where both find them made, is compared. Prints seconds, seconds per kept task and the verifier's stages per
side, then the ratio.

    python benchmarks/certificate_cost.py [--packages toolz,tabulate,boltons] [--cache data/cache] [--tasks 8]
"""

from __future__ import annotations

import argparse
import shutil
import tempfile
from pathlib import Path

from pipeline.rollouts.batch import RolloutConfig
from pipeline.synthesis.synth import SynthConfig, synthesize
from sandbox.images import docker_client, ensure_base_image

VERIFIER = ("verify_setup", "certify_setup", "gold_grades", "empty_grade", "sandbox_close")


def one_side(runs: int, args, base: str, client, folder: Path) -> dict:
    cache = folder / f"cache-{runs}"
    shutil.rmtree(cache, ignore_errors=True)
    shutil.copytree(args.cache, cache, ignore=shutil.ignore_patterns("tasks", "locks"))
    config = SynthConfig(packages=tuple(args.packages.split(",")), tasks_per_package=args.tasks, certify_runs=runs)
    tasks, report = synthesize(config, base, cache, client, rules=RolloutConfig().grade_rules())
    stats = report.as_json()
    return {"tasks": len(tasks), "seconds": stats["seconds"], "breakdown": stats["breakdown"],
            "certified": sum(t.certificate_gold_resolved == t.certificate_containers == t.certificate_empty_failed
                             for t in tasks)}


def show(runs: int, side: dict) -> None:
    verify = sum(side["breakdown"].get(s, 0.0) for s in VERIFIER)
    print(f"certify_runs {runs}: {side['tasks']} tasks ({side['certified']} certified) in {side['seconds']:.1f} s, "
          f"{side['seconds'] / max(side['tasks'], 1):.2f} s per task; verifier {verify:.1f} s: "
          + ", ".join(f"{s} {side['breakdown'].get(s, 0.0):.1f}" for s in VERIFIER))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--packages", default="toolz,tabulate,boltons")
    parser.add_argument("--cache", default="data/cache", help="a cache folder holding the packages' sources")
    parser.add_argument("--tasks", type=int, default=8, help="tasks_per_package")
    args = parser.parse_args()
    client = docker_client()
    base = ensure_base_image(client=client)
    with tempfile.TemporaryDirectory(prefix="handhold-certificate-bench-") as tmp:
        rounds = [{runs: one_side(runs, args, base, client, Path(tmp)) for runs in (1, 3)} for _ in range(2)]
    for i, sides in enumerate(rounds):
        print(f"round {i + 1}{' (compared: prepared images made by round 1)' if i else ''}:")
        for runs, side in sides.items():
            show(runs, side)
    one, three = rounds[1][1], rounds[1][3]
    print(f"seconds per kept task: certify_runs 3 / certify_runs 1 = "
          f"{(three['seconds'] / max(three['tasks'], 1)) / (one['seconds'] / max(one['tasks'], 1)):.2f}; "
          f"synthesis seconds {three['seconds'] - one['seconds']:+.1f}; packages {args.packages}")


if __name__ == "__main__":
    main()
