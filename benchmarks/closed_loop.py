"""The closed loop, measured: does a model trained on the pipeline's rows solve the tasks it trained on?

    PYTHONPATH=. python benchmarks/closed_loop.py --steps 110 --learning-rate 5e-3 --out /tmp/closed-loop

Synthesizes toolz tasks (cached under --out), rolls the heuristic out --rollouts times per task with one seed,
builds and exports the SFT rows of its successes, fine-tunes the tiny offline model on them (training/sft.py),
then runs the starting and the trained model as the local HF policy, greedy and unguided, on the tasks it
trained on, through the same sandboxes and grader. Prints the training's steps, seconds and losses, and each
model's pass@1 on those tasks; with --show, the trained model's replies.
"""

from __future__ import annotations

import argparse
import json
import pickle
import time
from pathlib import Path


def tasks_and_rows(out: Path, rollouts: int):
    """The synthesized tasks (cached) and the export folder of the heuristic's successes: `rollouts` batches of
    one attempt per task, all with the same seed (the same actions and, the heuristic's test runs being steady,
    the same observations)."""
    import docker

    from pipeline.agent.heuristic import HeuristicPolicy
    from pipeline.agent.loop import AgentConfig
    from pipeline.datasets import DatasetConfig, build_rows
    from pipeline.datasets.card import CardInfo
    from pipeline.datasets.export import export_dataset
    from pipeline.rollouts.batch import RolloutConfig, plan_jobs, run_batch
    from pipeline.synthesis.packages import DEFAULT_PACKAGES
    from pipeline.synthesis.synth import SynthConfig, synthesize
    from sandbox.images import ensure_base_image

    saved = out / "tasks.pickle"
    if saved.exists():
        tasks = pickle.loads(saved.read_bytes())
    else:
        client = docker.from_env(timeout=300)
        (out / "cache").mkdir(parents=True, exist_ok=True)
        tasks, _ = synthesize(SynthConfig(packages=(DEFAULT_PACKAGES[0].name,), tasks_per_package=3,
                                          candidates_per_package=30), ensure_base_image(client=client),
                              out / "cache", client, rules=RolloutConfig().grade_rules())
        saved.write_bytes(pickle.dumps(tasks))
    policy = HeuristicPolicy()
    config = RolloutConfig(attempts=1, workers=2, agent=AgentConfig(max_steps=30))
    attempts = [t for i in range(rollouts)
                for t in run_batch(plan_jobs(tasks, policy, config, f"heuristic-{i}"), policy, config,
                                   out / f"heuristic-{i}", f"heuristic-{i}").trajectories]
    rows = build_rows(attempts, DatasetConfig(test_fraction=0.0)).sft
    export_dataset(out / "hf", {"sft": rows}, CardInfo("closed-loop", run_id="heuristic"))
    solved = set(rows["instance_id"])
    return [t for t in tasks if t.instance_id in solved], out / "hf"


def main() -> None:
    from pipeline.agent.factory import PolicySpec, make_policy
    from pipeline.agent.loop import AgentConfig
    from training.evaluation import evaluate
    from pipeline.rollouts.batch import RolloutConfig
    from training.config import SFTTrainingConfig
    from training.sft import train_sft
    from training.tiny_model import build_tiny_model

    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=110)
    parser.add_argument("--learning-rate", type=float, default=5e-3)
    parser.add_argument("--rollouts", type=int, default=1, help="heuristic batches trained on (same seed)")
    parser.add_argument("--out", type=Path, default=Path("/tmp/closed-loop"))
    parser.add_argument("--show", action="store_true", help="print the trained model's replies")
    args = parser.parse_args()
    trained_on, folder = tasks_and_rows(args.out, args.rollouts)
    print(f"{len(trained_on)} tasks solved by the heuristic, trained on: {[t.instance_id for t in trained_on]}")
    tiny = str(build_tiny_model(args.out / "tiny"))
    config = SFTTrainingConfig(learning_rate=args.learning_rate, lr_scheduler="constant", warmup=0,
                               per_device_batch_size=1, gradient_accumulation_steps=1,
                               max_steps=args.steps, max_length=16384)
    result = train_sft(config, tiny, folder, args.out / "sft")
    s = result.summary
    history = [json.loads(line) for line in (result.run_dir / "metrics.jsonl").read_text().splitlines()]
    learnt = [m["step"] for m in history if m.get("mean_token_accuracy") == 1.0]
    print(f"sft: {s['steps']} steps in {s['seconds']} s, loss {s['first_loss']:.3f} -> {s['final_loss']:.4f}, "
          f"token accuracy {s['final_token_accuracy']:.4f} (first 1.0 at step {learnt[0] if learnt else '-'})")
    rollout = RolloutConfig(attempts=1, workers=1, agent=AgentConfig(max_steps=30))
    for label, path in (("starting", tiny), ("sft", str(result.checkpoint))):
        policy = make_policy(PolicySpec(kind="hf", model=path, temperature=0.0, max_tokens=512))
        start = time.monotonic()
        scored = evaluate(label, policy, trained_on, rollout, args.out / f"eval-{label}-{args.steps}",
                          f"eval-{args.steps}", progress=lambda _: None)
        print(f"{label}: pass@1 {scored['pass@1']} on the {len(trained_on)} trained tasks "
              f"({time.monotonic() - start:.0f} s)")
        if args.show and label == "sft":
            import polars as pl

            for row in pl.read_parquet(scored["path"]).iter_rows(named=True):
                print(row["instance_id"], row["exit_status"], row["resolved"])
                for m in row["messages"][2:]:
                    print("  ", m["role"], repr((m["content"] or "")[:100]), str(m["tool_calls"] or "")[:160])


if __name__ == "__main__":
    main()
