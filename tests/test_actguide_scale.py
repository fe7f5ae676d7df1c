"""What lets ActGuide train at real sizes must not change what it computes: micro-batches of segments sized in
tokens, log-probs from the hidden states a chunk of positions at a time, the too-long refusal before any forward,
two processes splitting each batch (two real processes on the CPU over gloo), trackers, and the throughput.

Run as a script (`torchrun --nproc_per_node 2 tests/test_actguide_scale.py MODEL FOLDER OUT`), it is one of the two
processes: the first step's loss and gradients of the whole batch, then a one-step run of `train_actguide`.
"""

from __future__ import annotations

import json
import os
import socket
import struct
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
SETTINGS = dict(batch_size=8, clip=0.2, kl_weight=0.5, dual_clip=3.0, learning_rate=1e-3,
                behaviour_logprobs="recompute", micro_batch_tokens=400, logprob_chunk_tokens=5)


def moved(model, seed: int = 3) -> None:
    """Move the model off the starting one by seeded noise, so ratios, clips and the KL all differ from step 0's."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.05 * torch.randn(p.shape, generator=g))


def config_of(**changes):
    from training.config import ActGuideTrainingConfig

    return ActGuideTrainingConfig(**{**SETTINGS, **changes})


def folder_examples(model_path: str, folder: str) -> list:
    """The Examples of the folder's actguide rows, as every process of a run makes them."""
    from transformers import AutoTokenizer

    from training.actguide_examples import prepare_examples
    from training.common import read_split

    tokenizer = AutoTokenizer.from_pretrained(model_path)
    return prepare_examples(read_split(folder, "actguide"), tokenizer, config_of())[0]


def first_step(model_path: str, examples: list, prepare=None, **changes):
    """The first step's metrics and every parameter's gradient of a fresh trainer, the model (given to `prepare`
    first) moved after its behaviour pass; and the trainer."""
    from transformers import AutoTokenizer

    from training.actguide import ActGuideTrainer
    from training.common import load_model

    model = load_model(model_path, "fp32")
    if prepare:
        prepare(model)
    trainer = ActGuideTrainer(model, AutoTokenizer.from_pretrained(model_path), examples, config_of(**changes))
    moved(model)
    row = trainer.gradients(trainer.batches[0])
    return row, {name: p.grad.clone() for name, p in model.named_parameters()}, trainer


def split_turns(model_path: str) -> list:
    """Two Examples whose second turn was sampled in a context that does not continue the first (as under a template
    that re-renders earlier turns): two segments each, from stored ids."""
    from transformers import AutoTokenizer

    from tests.test_actguide_objective import IDENTITY, PROMPT, context_ids, member
    from training.actguide_examples import prepare_examples
    from training.tiny_model import IM_END

    tokenizer = AutoTokenizer.from_pretrained(model_path)
    context, end = context_ids(tokenizer, PROMPT), tokenizer.convert_tokens_to_ids(IM_END)

    def two_turns(rid: str, reward: float, first: list[int], second: list[int]) -> dict:
        m = member(tokenizer, rid, "unguided", reward, first, [-1.0] * len(first))
        return {**m, "completion": m["completion"] * 2, "prompt_token_ids": [context, context + [11, 12, 13]],
                "token_ids": [first, second], "logprobs": [[-1.0] * len(first), [-1.0] * len(second)]}

    row = {"tools": "[]", "prompt": PROMPT, "guided_prompt": PROMPT, "group_id": "s",
           "trajectories": [two_turns("s0", 1.0, [120, 121, end], [130, end]),
                            two_turns("s1", 0.0, [140, end], [150, 151, 152, end])]}
    examples, _ = prepare_examples([row], tokenizer, config_of(), IDENTITY)
    assert [len(e.segments) for e in examples] == [2, 2]
    return examples


def worker(model_path: str, folder: str, out: str) -> None:
    """One of the launched processes: the first step's numbers (rank 0 saves them), then a one-step run."""
    from accelerate import PartialState

    from training.actguide import train_actguide

    PartialState()  # joins the process group torchrun described (gloo on the CPU)
    row, grads, trainer = first_step(model_path, folder_examples(model_path, folder))
    shares = {"rank": trainer.rank, "world": trainer.world, "share": trainer.share(trainer.batches[0])}
    result = train_actguide(config_of(max_steps=1), model_path, folder, Path(out) / "run")
    (Path(out) / f"rank{trainer.rank}.json").write_text(json.dumps({**shares, "returned": repr(result)}))
    if trainer.rank == 0:
        torch.save((row, grads), Path(out) / "first_step.pt")


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    """Exported actguide rows: t3's unguided group (one success of three), t4's guided attempts in place of its
    failed unguided ones; 5 trajectories, 1 to 3 turns each."""
    from pipeline.datasets import DatasetConfig, build_rows
    from pipeline.datasets.card import CardInfo
    from pipeline.datasets.export import export_dataset
    from pipeline.core.records import Action
    from tests.test_datasets_build import traj

    actions = (Action("bash", '{"command": "grep -n add pkg"}'), Action("submit", "{}"))
    attempts = ([traj("t3u0", iid="t3", sample=0, steps=2), traj("t3u1", iid="t3", reward=1.0, sample=1),
                 traj("t3u2", iid="t3", sample=2, steps=3)]
                + [traj(f"t4u{i}", iid="t4", sample=i, steps=2) for i in range(2)]
                + [traj(f"t4a{i}", iid="t4", kind="action", reward=float(i), sample=i, steps=1 + i,
                        guidance_actions=actions, guidance_k=1, group_id="g2") for i in range(2)])
    out = tmp_path_factory.mktemp("export") / "hf"
    rows = build_rows(attempts, DatasetConfig(pairs_per_task=50, test_fraction=0.0)).actguide
    export_dataset(out, {"actguide": rows}, CardInfo("test", run_id="b1"))
    return str(out)


@pytest.fixture(scope="module")
def tiny(tiny_model):
    return str(tiny_model)


def test_chunked_log_probs_equal_the_full_log_softmax(tiny):
    """Rows of different lengths, padded together, a masked-out token in one: every chunk size gives the log-probs
    and the gradient of the model's own full-vocabulary logits."""
    from training.common import load_model
    from training.logprobs import sampled_logps

    model = load_model(tiny, "fp32")
    rows = [([5, 17, 300], [41, 42, 43, 44, 45], [1, 1, 0, 1, 1]), ([9, 8], [100, 200, 7], [1, 1, 1])]
    want = []
    for prefix, response, mask in rows:
        ids = torch.tensor([prefix + response])
        logps = torch.log_softmax(model(ids).logits[0, :-1].float(), -1).gather(-1, ids[0, 1:, None])[:, 0]
        want.append(logps[len(prefix) - 1:][torch.tensor(mask, dtype=torch.bool)])
    weights = torch.arange(1, 8, dtype=torch.float32)  # a different weight per token, so a swapped one shows
    torch.cat(want).mul(weights).sum().backward()
    full_grads = [p.grad.clone() for p in model.parameters()]
    for chunk in (1, 3, 1000):
        model.zero_grad()
        got = sampled_logps(model, rows, pad_id=0, chunk=chunk)
        assert [len(g) for g in got] == [4, 3]
        assert all(torch.allclose(g, w, atol=1e-5) for g, w in zip(got, want)), chunk
        torch.cat(got).mul(weights).sum().backward()
        assert all(torch.allclose(p.grad, g, atol=1e-5) for p, g in zip(model.parameters(), full_grads)), chunk


def test_micro_batches_give_the_whole_batchs_loss_and_gradient(tiny, folder):
    """One step over 7 trajectories (9 segments) in one micro-batch and in several: the same loss and gradients
    (each micro-batch's sum divided by the whole batch's tokens)."""
    examples = folder_examples(tiny, folder) + split_turns(tiny)
    whole, whole_grads, big = first_step(tiny, examples, micro_batch_tokens=100_000)
    longest = max(len(s.prompt_ids) + len(s.response_ids) for e in examples for s in e.segments)
    parts, part_grads, small = first_step(tiny, examples, micro_batch_tokens=longest)
    batch = big.batches[0]
    assert len(batch) == len(examples) == 7 and sum(len(e.segments) for e in examples) == 9
    assert len(big._micro_batches(batch, guided=False)) == 1 and len(small._micro_batches(batch, guided=False)) > 2
    assert parts["loss"] == pytest.approx(whole["loss"], rel=1e-5) and parts["policy_tokens"] == whole["policy_tokens"]
    assert parts["clip_fraction"] == whole["clip_fraction"] > 0 and parts["kl"] == pytest.approx(whole["kl"], rel=1e-5)
    for name, grad in whole_grads.items():
        assert torch.allclose(part_grads[name], grad, rtol=1e-4, atol=1e-7), name


def test_bf16_mixed_keeps_fp32_weights_and_computes_in_bf16(tiny, folder):
    """'auto' on a GPU: the weights (and so AdamW's state and update) stay fp32, the forward runs under bf16
    autocast; the step's loss is the fp32 one up to bf16's rounding, not the same number."""
    from training.common import load_model

    examples = folder_examples(tiny, folder)
    full, full_grads, _ = first_step(tiny, examples)
    mixed, mixed_grads, trainer = first_step(tiny, examples, precision="bf16-mixed")
    assert load_model(tiny, "bf16-mixed").dtype == torch.float32
    assert all(g.dtype == torch.float32 for g in mixed_grads.values())
    assert mixed["loss"] == pytest.approx(full["loss"], rel=0.05, abs=0.02) and mixed["loss"] != full["loss"]
    dot = sum((full_grads[n] * mixed_grads[n]).sum() for n in full_grads)
    norms = (sum((g ** 2).sum() for g in full_grads.values()) * sum((g ** 2).sum() for g in mixed_grads.values())) ** 0.5
    assert dot / norms > 0.9  # the same direction


def test_checkpointing_recomputes_each_layer_in_the_backward_and_changes_no_gradient(tiny, folder):
    from training.common import enable_checkpointing

    examples = folder_examples(tiny, folder)
    runs = {}
    for on in (False, True):
        calls = []

        def count_training_calls(model):
            if on:
                enable_checkpointing(model)
            # inside the layer (transformers checkpoints a layer's forward, its own hooks stay outside), before the
            # call (the recompute stops early, once the last tensor the backward needs is made, inside the MLP)
            mlp = model.base_model.layers[0].mlp
            mlp.register_forward_pre_hook(lambda m, _: calls.append(1) if m.training else None)

        row, grads, trainer = first_step(tiny, examples, prepare=count_training_calls)
        runs[on] = row, grads, len(calls), len(trainer._micro_batches(trainer.batches[0], guided=False))
    (row, grads, calls, micro), (row_on, grads_on, calls_on, micro_on) = runs[False], runs[True]
    assert micro == micro_on > 1 and calls == micro and calls_on == 2 * micro  # each forward again in the backward
    assert row_on["loss"] == pytest.approx(row["loss"], rel=1e-6)
    assert all(torch.allclose(grads_on[name], grad, rtol=1e-5, atol=1e-8) for name, grad in grads.items())


def test_a_segment_longer_than_a_micro_batch_is_refused_before_any_forward(tiny, folder):
    from transformers import AutoTokenizer

    from training.actguide import ActGuideTrainer
    from training.common import TrainingDataError, load_model

    tokenizer, examples = AutoTokenizer.from_pretrained(tiny), folder_examples(tiny, folder)
    lengths = {e.rollout_id: max(len(s.sampled_prompt_ids) + len(s.response_ids) for s in e.segments)
               for e in examples}
    longest = max(lengths, key=lengths.get)
    model = load_model(tiny, "fp32")
    forwards = []
    model.register_forward_hook(lambda *args: forwards.append(1))
    model.base_model.register_forward_hook(lambda *args: forwards.append(1))
    with pytest.raises(TrainingDataError) as refused:
        ActGuideTrainer(model, tokenizer, examples, config_of(micro_batch_tokens=lengths[longest] - 1))
    assert str(refused.value).startswith(f"trajectory {longest}: a segment of {lengths[longest]} tokens")
    assert "raise training.actguide.micro_batch_tokens" in str(refused.value)
    assert "set training.actguide.max_length" in str(refused.value) and forwards == []
    ActGuideTrainer(model, tokenizer, examples, config_of(micro_batch_tokens=lengths[longest]))  # fits: no error


def test_two_processes_take_the_same_step_as_one(tiny, folder, tmp_path):
    """Two processes (torchrun; accelerate's state joins their group, gloo on the CPU): each scores its share of
    the batch, the gradients are summed over gloo; the loss and every gradient equal one process's over the whole
    batch. Rank 0 alone writes the run folder; the other returns None."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    with socket.socket() as free:  # a port no other test's launch holds
        free.bind(("127.0.0.1", 0))
        port = free.getsockname()[1]
    # torchrun, as `accelerate launch --num_processes 2` runs it on GPUs (on a CPU accelerate wants MPI instead)
    command = [sys.executable, "-m", "torch.distributed.run", "--nnodes", "1", "--nproc_per_node", "2",
               "--master_addr", "127.0.0.1", "--master_port", str(port), str(Path(__file__)), tiny, folder,
               str(tmp_path)]
    done = subprocess.run(command, env=env, cwd=ROOT, capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stderr[-3000:]
    ranks = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1)]
    assert [r["world"] for r in ranks] == [2, 2] and [r["rank"] for r in ranks] == [0, 1]
    row, grads, alone = first_step(tiny, folder_examples(tiny, folder))
    batch = alone.batches[0]
    assert sorted(ranks[0]["share"] + ranks[1]["share"]) == sorted(batch) and ranks[0]["share"] != batch
    two, two_grads = torch.load(tmp_path / "first_step.pt")
    assert two["loss"] == pytest.approx(row["loss"], rel=1e-5) and two["policy_tokens"] == row["policy_tokens"]
    assert two["ratio_max"] == pytest.approx(row["ratio_max"], rel=1e-5)
    assert two["clip_fraction"] == row["clip_fraction"] and two["kl"] == pytest.approx(row["kl"], rel=1e-5)
    for name, grad in grads.items():
        assert torch.allclose(two_grads[name], grad, rtol=1e-4, atol=1e-7), name
    assert ranks[0]["returned"].startswith("TrainResult(") and ranks[1]["returned"] == "None"
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["processes"] == 2 and summary["steps"] == 1
    assert len((tmp_path / "run" / "metrics.jsonl").read_text().splitlines()) == 1  # not one line per process


def tensorboard_scalars(folder: Path) -> dict[str, list[tuple[int, float]]]:
    """Every scalar in the TensorBoard event files under `folder`, by tag: (step, value), read record by record
    (TFRecord: length, its CRC, an Event, its CRC)."""
    from tensorboardX.proto import event_pb2

    scalars: dict[str, list[tuple[int, float]]] = {}
    for path in sorted(folder.rglob("events.out.tfevents.*")):
        data = path.read_bytes()
        at = 0
        while at < len(data):
            (length,) = struct.unpack("<Q", data[at:at + 8])
            event = event_pb2.Event.FromString(data[at + 12:at + 12 + length])
            at += 12 + length + 4
            for value in event.summary.value:
                scalars.setdefault(value.tag, []).append((event.step, value.simple_value))
    return scalars


def test_steps_go_to_the_trackers_and_throughput_leaves_out_the_warm_up(tiny, folder, tmp_path):
    from training.actguide import train_actguide
    from training.common import read_run

    config = config_of(batch_size=2, max_steps=3)
    result = train_actguide(config, tiny, folder, tmp_path / "run", report_to=("tensorboard",))
    summary, metrics = read_run(result.run_dir)
    scalars = tensorboard_scalars(result.run_dir / "trainer")
    assert scalars["loss"] == [(m["step"], pytest.approx(m["loss"])) for m in metrics] and len(metrics) == 3
    assert [v for _, v in scalars["dual_clip_fraction"]] == [m["dual_clip_fraction"] for m in metrics]
    later = metrics[1:]  # the first step is warm-up
    assert summary["tokens_per_second_excludes"] == "first step"
    assert summary["tokens_per_second"] == round(sum(m["tokens"] for m in later) / sum(m["seconds"] for m in later), 1)
    assert summary["tokens"] == sum(m["tokens"] for m in metrics)
    behaviour = summary["seconds_by_phase"]["behaviour_forward"]  # the whole run: behaviour pass and warm-up too
    assert summary["seconds"] == pytest.approx(behaviour + sum(m["seconds"] for m in metrics), abs=0.01)
    untracked = train_actguide(config, tiny, folder, tmp_path / "plain")
    assert not (untracked.run_dir / "trainer").exists()


if __name__ == "__main__":
    worker(*sys.argv[1:4])
