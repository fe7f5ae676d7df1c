"""The loop closes: the tiny model, fine-tuned on the SFT rows of the heuristic's successes on synthesized toolz
tasks, run as the local HF policy (greedy, unguided, native tool calls) in Docker sandboxes and graded by the
real grader, resolves the tasks it trained on; the starting model does not. A mismatch anywhere between the
rows and the policy (chat template, tool-call format, masking, tokenizer, decoding, end of turn) fails it.

Measured on the 2-core machine (benchmarks/closed_loop.py): the heuristic resolves one of the three synthesized
tasks, a 4.4k-token trajectory of 10 turns. On one row, teacher-forced token accuracy at a constant learning rate
reaches 1.0 near step 96 at 3e-3 and between steps 73 and 88 at 5e-3; 1e-2 and 3e-2 learn slower (0.76 and 0.39
at steps 60 and 40). The model memorizes the observations' bytes too, so greedy decoding strays at the first one
that differs from its row's: the heuristic's test runs therefore print nothing that changes from run to run
(pytest's timing, object addresses; pipeline/agent/heuristic.py), and its rollouts of one seed are identical
byte for byte. Trained on one such rollout for 110 steps (144 s on a loaded machine), the checkpoint resolves the
task; training stops once the token accuracy held 1.0 for 5 steps (first 1.0 at step 77 in a run of the
benchmark: 81 steps, not 110). A step is 0.7 s on an idle machine (TRL's head scoring only the 1.3k labelled
positions: training/common.py; 1.2 s scoring all 4.4k), several times that on a loaded one. Those figures are
the two-layer tiny model's; with one layer (training/tiny_model.py) a step costs about half and the accuracy
first holds 1.0 a few steps later (at step 93 at 5e-3: 97 steps in 57 s, against 84 in 93 s with two layers
on the same machine), so the cap is 130.
DPO is not closed here: the heuristic resolves the task in every unguided attempt, so it has no rejected side, and
a preference loss from a random model does not reach greedy reproduction of a whole trajectory.
"""

from __future__ import annotations

import subprocess

import pytest

from pipeline.agent.factory import PolicySpec, make_policy
from pipeline.agent.heuristic import STEADY, HeuristicPolicy
from pipeline.agent.loop import AgentConfig
from pipeline.datasets import DatasetConfig, build_rows
from pipeline.datasets.card import CardInfo
from pipeline.datasets.export import export_dataset
from training.evaluation import evaluate
from pipeline.rollouts.batch import RolloutConfig, plan_jobs, run_batch
from training.config import SFTTrainingConfig
from training.sft import train_sft

# One row a step: token accuracy first 1.0 near step 93 (one layer); it stops once it held 1.0 for 5 steps
STEPS, LEARNING_RATE, PATIENCE = 130, 5e-3, 5
ROLLOUT = RolloutConfig(attempts=1, workers=2, agent=AgentConfig(max_steps=30))


def test_the_heuristic_test_runs_print_nothing_that_changes_from_run_to_run():
    output = ("F.\n___ test_compose ___\n    assert compose(f) is <function f at 0x7f3a12bc9d30>\n"
              "FAILED toolz/tests/test_functoolz.py::test_compose - AssertionError\n"
              "1 failed, 41 passed in 0.74s\n3 passed in 65.12s (0:01:05)\n")
    steady = subprocess.run(["bash", "-c", f"(set -o pipefail; printf %s \"$OUT\"; exit 1) | {STEADY}"],
                            env={"OUT": output, "PATH": "/usr/bin:/bin"}, capture_output=True, text=True)
    assert steady.stdout == ("F.\n___ test_compose ___\n    assert compose(f) is <function f at 0x?>\n"
                             "FAILED toolz/tests/test_functoolz.py::test_compose - AssertionError\n"
                             "1 failed, 41 passed\n3 passed\n")


@pytest.mark.timeout(1800)  # ~4 min alone; the suite's 900 s guard is too tight beside the other slow files
def test_the_trained_tiny_model_resolves_the_tasks_it_trained_on_and_the_starting_model_does_not(synth_run, tiny_model,
                                                                                                   tmp_path):
    tasks = synth_run[0]
    heuristic = HeuristicPolicy()
    attempts = run_batch(plan_jobs(tasks, heuristic, ROLLOUT, "heuristic"), heuristic, ROLLOUT,
                         tmp_path / "heuristic", "heuristic").trajectories
    rows = build_rows(attempts, DatasetConfig(test_fraction=0.0)).sft
    assert rows.height >= 1, "the heuristic resolved none of the synthesized tasks: nothing to train on"
    export_dataset(tmp_path / "hf", {"sft": rows}, CardInfo("closed-loop", run_id="heuristic"))
    trained_on = [t for t in tasks if t.instance_id in set(rows["instance_id"])]
    tiny = str(tiny_model)
    config = SFTTrainingConfig(learning_rate=LEARNING_RATE, lr_scheduler="constant", warmup=0,
                               per_device_batch_size=1, gradient_accumulation_steps=1, max_steps=STEPS,
                               max_length=16384, stop_at_token_accuracy=1.0, stop_patience=PATIENCE)
    result = train_sft(config, tiny, tmp_path / "hf", tmp_path / "sft")
    learnt = result.summary["final_token_accuracy"]  # teacher-forced: below 1.0 greedy decoding strays
    scores = {}
    for label, path in (("starting", tiny), ("sft", str(result.checkpoint))):
        policy = make_policy(PolicySpec(kind="hf", model=path, temperature=0.0, max_tokens=512))
        scores[label] = evaluate(label, policy, trained_on, ROLLOUT, tmp_path / f"eval-{label}", "closed-loop",
                                 progress=lambda _: None)
    assert scores["starting"]["resolved"] == 0
    assert scores["sft"]["resolved"] == len(trained_on) and scores["sft"]["infra_errors"] == 0, (
        f"trained {result.summary['steps']} steps to token accuracy {learnt}: {scores['sft']}")
