"""Training throughput of both stages with the tiny offline model, on the CPU (or the GPU when there is one).

Prints, for DPO and for ActGuide, tokens per second next to a baseline measured in the same run: plain
next-token training (one forward, cross-entropy, backward, AdamW step) over the same token sequences in
the same batch size, i.e. the floor any objective on these tokens costs. For ActGuide it also prints the
share of its time spent in the two forward passes (the behaviour pass on the guided prompt, once at the
start, and the policy pass on the unguided prompt, every step).

    python benchmarks/training_throughput.py [--groups 24] [--steps 6] [--precision fp32] [--dir /tmp/x]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402
from transformers import AutoModelForCausalLM, AutoTokenizer  # noqa: E402

from pipeline.datasets import DatasetConfig, build_rows  # noqa: E402
from pipeline.datasets.card import CardInfo  # noqa: E402
from pipeline.datasets.export import export_dataset  # noqa: E402
from pipeline.core.records import Action  # noqa: E402
from tests.test_datasets_build import traj  # noqa: E402
from training.actguide import train_actguide  # noqa: E402
from training.actguide_examples import prepare_examples  # noqa: E402
from training.common import read_split  # noqa: E402
from training.config import ActGuideTrainingConfig, DPOTrainingConfig  # noqa: E402
from training.dpo import train_dpo  # noqa: E402
from training.tiny_model import build_tiny_model  # noqa: E402

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
ACTIONS = (Action("bash", '{"command": "grep -rn add pkg"}'), Action("submit", "{}"))


def attempts(groups: int) -> list:
    """Per task: two failed unguided attempts of 3-6 steps, one unguided success, and two action-guided
    attempts (one resolved): DPO pairs and ActGuide groups with signal."""
    out = []
    for g in range(groups):
        iid = f"task{g}"
        out += [traj(f"{iid}u{i}", iid=iid, sample=i, steps=3 + (g + i) % 4) for i in range(2)]
        out += [traj(f"{iid}u2", iid=iid, sample=2, reward=1.0, steps=2 + g % 3)]
        out += [traj(f"{iid}a{i}", iid=iid, kind="action", reward=float(i), sample=i, steps=2 + i,
                     guidance_actions=ACTIONS, guidance_k=1, group_id=f"g{g}") for i in range(2)]
    return out


def plain_steps(model_dir: str, sequences: list[list[int]], batch_size: int, steps: int, pad_id: int) -> float:
    """Tokens per second of plain next-token training over `sequences`, `steps` batches after one untimed
    warm-up batch."""
    model = AutoModelForCausalLM.from_pretrained(model_dir).to(DEVICE)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    tokens, start = 0, time.monotonic()
    for step in range(-1, steps):
        if step == 0:
            tokens, start = 0, time.monotonic()
        batch = [sequences[(max(step, 0) * batch_size + i) % len(sequences)] for i in range(batch_size)]
        width = max(map(len, batch))
        ids = torch.tensor([s + [pad_id] * (width - len(s)) for s in batch], device=DEVICE)
        attention = torch.tensor([[1] * len(s) + [0] * (width - len(s)) for s in batch], device=DEVICE)
        labels = ids.masked_fill(attention == 0, -100)
        loss = model(input_ids=ids, attention_mask=attention, labels=labels).loss
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        tokens += int(attention.sum())
    return tokens / (time.monotonic() - start)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--groups", type=int, default=24)
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--precision", default="fp32", choices=["fp32", "bf16-mixed", "bf16", "fp16"])
    parser.add_argument("--dir", default=None)
    args = parser.parse_args()
    torch.set_num_threads(max(1, torch.get_num_threads()))
    root = Path(args.dir or tempfile.mkdtemp(prefix="handhold-train-bench-"))
    config = DatasetConfig(pairs_per_task=2, test_fraction=0.0)
    rows = build_rows(attempts(args.groups), config)
    folder = root / "hf"
    export_dataset(folder, {"dpo": rows.dpo, "actguide": rows.actguide}, CardInfo("bench", run_id="bench"))
    model = str(build_tiny_model(root / "tiny"))
    tokenizer = AutoTokenizer.from_pretrained(model)
    pad = tokenizer.pad_token_id

    dpo = train_dpo(DPOTrainingConfig(learning_rate=1e-4, lr_scheduler="constant", warmup=0,
                                      per_device_batch_size=args.batch, gradient_accumulation_steps=1,
                                      max_steps=args.steps, max_length=8192, precision=args.precision),
                    model, folder, root / "dpo").summary
    # The same token sequences a DPO batch holds: prompt + chosen, prompt + rejected
    dpo_rows = read_split(folder, "dpo")
    sequences = []
    for row in dpo_rows:
        for side in ("chosen", "rejected"):
            sequences.append(tokenizer.apply_chat_template(row["prompt"] + row[side], tokenize=True,
                                                           return_dict=True)["input_ids"])
    dpo_plain = plain_steps(model, sequences, 2 * args.batch, args.steps, pad)

    ag_config = ActGuideTrainingConfig(learning_rate=1e-4, batch_size=args.batch, max_steps=args.steps,
                                       kl_weight=0.001, max_length=8192, precision=args.precision)
    ag = train_actguide(ag_config, model, folder, root / "actguide").summary
    examples, _ = prepare_examples(read_split(folder, "actguide"), tokenizer, ag_config)
    ag_plain = plain_steps(model, [s.prompt_ids + s.response_ids for e in examples for s in e.segments], args.batch,
                           args.steps, pad)

    phases = ag["seconds_by_phase"]
    total = sum(phases.values())
    where = torch.cuda.get_device_name() if DEVICE == "cuda" else f"{torch.get_num_threads()} CPU threads"
    print(f"data: {dpo_rows.num_rows} DPO rows, {len(examples)} ActGuide trajectories; {args.steps} steps of "
          f"batch {args.batch}, {args.precision}; {where} (the baseline in fp32)")
    print(f"DPO       {dpo['tokens_per_second']:>9.0f} tokens/s   plain LM on the same sequences "
          f"{dpo_plain:>9.0f} tokens/s   ratio {dpo['tokens_per_second'] / dpo_plain:.2f}")
    print(f"ActGuide  {ag['tokens_per_second']:>9.0f} tokens/s   plain LM on the same sequences "
          f"{ag_plain:>9.0f} tokens/s   ratio {ag['tokens_per_second'] / ag_plain:.2f}")
    print(f"ActGuide time: behaviour forward (once) {phases['behaviour_forward']:.2f} s, policy forward "
          f"{phases['policy_forward']:.2f} s, backward + update {phases['backward_and_update']:.2f} s; "
          f"the two forward passes are {(phases['behaviour_forward'] + phases['policy_forward']) / total:.0%} of it")


if __name__ == "__main__":
    main()
