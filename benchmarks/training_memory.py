"""Peak memory of one optimizer step of each training stage at a real vocabulary, next to plain training.

A model of Qwen2.5-0.5B's width (hidden 896, MLP 4864, 14 heads, 2 KV heads, vocabulary 151,936, tied
embeddings) but a few layers, so it runs on a CPU; the tiny offline tokenizer writes the rows (its ids are a
subset of the vocabulary). Every stage runs its own code (`train_sft`, `train_dpo`, `train_actguide`) for one
optimizer step at its default batch on an exported dataset folder whose conversations are about `--tokens`
long, each in a fresh process. The baseline is plain next-token training over the same conversations, one
per forward with gradients accumulated over the batch (the model's own loss: full-vocabulary logits).

Peak memory: on a GPU, torch's peak allocated bytes; on a CPU, the process's peak resident size minus its
size once torch and transformers are imported (so weights, optimizer state and activations all count), with glibc's
heap reuse off for blocks of 128 KiB and more (MALLOC_MMAP_THRESHOLD_ in each child's environment: every tensor is
its own mapping, returned when freed). Otherwise freed tensors stay resident in a fragmented heap and the figure is
the allocator's history more than the step's: the same step read 3.4 and 4.8 GiB in two runs. With it the resident
size follows what the step holds, as torch's allocated bytes do on a GPU.
Goals (issue #49): ActGuide at batch 8 within 1.2x SFT's peak; ActGuide's peak grows by under 10% from
batch 1 to batch 8.

    python benchmarks/training_memory.py [--tokens 4096 8192] [--layers 2] [--dir /tmp/x] [--stages sft actguide8]
                                                 # --dir: reuses the model and rows built there before
    python benchmarks/training_memory.py --shape 0.5b --tokens 16384      # on a GPU: the real depth
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

# hidden, intermediate, heads, kv heads, layers
SHAPES = {"0.5b": (896, 4864, 14, 2, 24), "1.5b": (1536, 8960, 12, 2, 28)}
VOCABULARY = 151_936
TASKS = 4  # each: two unguided failures, one unguided and one guided success -> 8 DPO pairs, 8 SFT rows, 12 ActGuide
# the table's rows (--stages): its name, the stage, the batch
STAGES = {"plain": ("plain LM (batch 8)", "plain", 8), "sft": ("SFT (default)", "sft", 8),
          "dpo": ("DPO (default)", "dpo", 8), "actguide1": ("ActGuide batch 1", "actguide", 1),
          "actguide8": ("ActGuide batch 8", "actguide", 8)}
# glibc: allocations of this many bytes or more get their own mapping, unmapped when freed (see the docstring)
MMAP_THRESHOLD = str(128 * 1024)


def build_model(folder: Path, shape: str, layers: int, tokens: int) -> Path:
    """The tiny tokenizer next to a random Qwen2 of `shape`'s width, `layers` deep (0: the shape's own)."""
    from transformers import AutoTokenizer, Qwen2Config, Qwen2ForCausalLM

    from training.tiny_model import build_tiny_model

    tiny = build_tiny_model(folder / "tiny")
    tokenizer = AutoTokenizer.from_pretrained(tiny)
    hidden, intermediate, heads, kv, depth = SHAPES[shape]
    config = Qwen2Config(vocab_size=VOCABULARY, hidden_size=hidden, intermediate_size=intermediate,
                         num_hidden_layers=layers or depth, num_attention_heads=heads, num_key_value_heads=kv,
                         max_position_embeddings=max(32768, 2 * tokens), tie_word_embeddings=True,
                         eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id)
    out = folder / f"model-{shape}-{layers}"
    Qwen2ForCausalLM(config).save_pretrained(out)
    tokenizer.save_pretrained(out)
    return out


def conversation(tag: str, steps: int, text: str) -> tuple[dict, ...]:
    """`steps` tool calls whose outputs are slices of `text`, one edit among them, then a closing message."""
    out: list[dict] = []
    width = len(text) // max(steps, 1)
    for i in range(steps):
        command = "sed -i s/-/+/ pkg/add.py" if i == steps - 1 else f"cat pkg/part{i}.py  # {tag}"
        call = {"id": f"call_{i}", "type": "function",
                "function": {"name": "bash", "arguments": json.dumps({"command": command})}}
        out += [{"role": "assistant", "content": f"Step {i} of {tag}: reading on.", "tool_calls": [call]},
                {"role": "tool", "content": text[i * width:(i + 1) * width], "tool_call_id": f"call_{i}"}]
    return tuple(out + [{"role": "assistant", "content": f"Done ({tag})."}])


def corpus() -> str:
    from training.tiny_model import repo_text_files

    return "\n".join(p.read_text(errors="replace") for p in repo_text_files()[:200])


def export_rows(folder: Path, model: Path, tokens: int) -> Path:
    """A dataset folder whose conversations are about `tokens` long under the model's tokenizer."""
    from transformers import AutoTokenizer

    from pipeline.datasets import DatasetConfig, build_rows
    from pipeline.datasets.card import CardInfo
    from pipeline.datasets.export import export_dataset
    from tests.test_datasets_build import traj

    tokenizer = AutoTokenizer.from_pretrained(model)
    text, steps = corpus(), max(4, tokens // 512)  # a turn of ~512 tokens, as an agent's reads run
    chars = tokens * 3  # first guess, corrected from the rendered length below
    for _ in range(3):
        probe = traj("probe", messages=traj("probe").prompt + conversation("probe", steps, text[:chars]))
        length = len(tokenizer.apply_chat_template(list(probe.messages), tokenize=True, return_dict=True)["input_ids"])
        chars = int(chars * tokens / length)
    made = []
    for t in range(TASKS):
        iid = f"task{t}"
        for rid, kind, reward, sample in ((f"{iid}u0", "none", 0.0, 0), (f"{iid}u1", "none", 0.0, 1),
                                          (f"{iid}u2", "none", 1.0, 2), (f"{iid}g0", "plan", 1.0, 0)):
            base = traj(rid, iid=iid, kind=kind, reward=reward, sample=sample)
            body = text[(t * 4 + sample) * 97:][:chars]
            made.append(replace(base, messages=base.prompt + conversation(rid, steps, body)))
    rows = build_rows(made, DatasetConfig(pairs_per_task=2, test_fraction=0.0, max_prompt_tokens=0,
                                          max_completion_tokens=0))
    out = folder / f"rows-{tokens}"
    export_dataset(out, {"dpo": rows.dpo, "sft": rows.sft, "actguide": rows.actguide}, CardInfo("bench", run_id="b"))
    return out


def measure(stage: str, model: str, dataset: str, out: str, batch: int, max_length: int) -> dict:
    """Run in a fresh process: one optimizer step of `stage`; its peak memory in GiB and its seconds."""
    import torch

    import training.actguide  # noqa: F401  imported before the baseline is read: their import is not the step's
    import training.dpo  # noqa: F401
    import training.sft  # noqa: F401

    on_gpu = torch.cuda.is_available()
    base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    start = time.monotonic()
    if stage == "plain":
        plain_step(model, dataset, batch)
    else:
        from training.config import ActGuideTrainingConfig, DPOTrainingConfig, SFTTrainingConfig

        if stage == "actguide":
            from training.actguide import train_actguide

            config = ActGuideTrainingConfig(batch_size=batch, max_steps=1, max_length=max_length)
            train_actguide(config, model, dataset, out)
        elif stage == "sft":
            from training.sft import train_sft

            train_sft(SFTTrainingConfig(max_steps=1, max_length=max_length), model, dataset, out)
        else:
            from training.dpo import train_dpo

            train_dpo(DPOTrainingConfig(max_steps=1, max_length=max_length), model, dataset, out)
    seconds = time.monotonic() - start
    if on_gpu:
        peak = torch.cuda.max_memory_allocated() / 2**30
    else:
        peak = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - base) / 2**20  # ru_maxrss is in KiB
    return {"peak_gib": round(peak, 2), "seconds": round(seconds, 1)}


def plain_step(model_path: str, dataset: str, batch: int) -> None:
    """One AdamW step of next-token training over `batch` SFT conversations, one per forward."""
    import torch
    from transformers import AutoTokenizer

    from training.common import load_model, read_split

    tokenizer = AutoTokenizer.from_pretrained(model_path)
    model = load_model(model_path, "auto")
    device = "cuda" if torch.cuda.is_available() else "cpu"
    model.to(device).train()
    rows = list(read_split(dataset, "sft"))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-6)
    for i in range(batch):
        messages = [{k: v for k, v in m.items() if v is not None} for m in rows[i % len(rows)]["messages"]]
        ids = torch.tensor([tokenizer.apply_chat_template(messages, tokenize=True, return_dict=True)["input_ids"]],
                           device=device)
        (model(input_ids=ids, labels=ids).loss / batch).backward()
    optimizer.step()


def child(args) -> None:
    print(json.dumps(measure(args.stage, args.model, args.dataset, args.out, args.batch, args.max_length)))


def run(stage: str, model: Path, dataset: Path, folder: Path, batch: int, max_length: int) -> dict:
    command = [sys.executable, __file__, "--child", stage, "--model", str(model), "--dataset", str(dataset),
               "--out", str(folder / f"run-{stage}-{batch}"), "--batch", str(batch), "--max-length", str(max_length)]
    done = subprocess.run(command, capture_output=True, text=True,
                          env={**os.environ, "MALLOC_MMAP_THRESHOLD_": MMAP_THRESHOLD})
    if done.returncode:
        tail = (done.stderr or done.stdout).strip().splitlines()[-3:]
        return {"error": " | ".join(tail)[-300:]}
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--tokens", type=int, nargs="+", default=[4096, 8192])
    parser.add_argument("--shape", default="0.5b", choices=sorted(SHAPES))
    parser.add_argument("--layers", type=int, default=2, help="0: the shape's own depth")
    parser.add_argument("--dir", default=None)
    parser.add_argument("--stages", nargs="+", default=list(STAGES), choices=list(STAGES),
                        help="which rows of the table to run; all by default")
    parser.add_argument("--child", default=None, help=argparse.SUPPRESS)
    for name in ("--model", "--dataset", "--out"):
        parser.add_argument(name, default="", help=argparse.SUPPRESS)
    parser.add_argument("--batch", type=int, default=8, help=argparse.SUPPRESS)
    parser.add_argument("--max-length", type=int, default=0, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        args.stage = args.child
        return child(args)
    import torch

    folder = Path(args.dir or tempfile.mkdtemp(prefix="handhold-memory-"))
    model = folder / f"model-{args.shape}-{args.layers}"
    if not (model / "config.json").exists():
        model = build_model(folder, args.shape, args.layers, max(args.tokens))
    where = torch.cuda.get_device_name() if torch.cuda.is_available() else "CPU (peak RSS over the imports)"
    print(f"{args.shape} width, {args.layers or SHAPES[args.shape][4]} layers, vocabulary {VOCABULARY:,}; {where}")
    print(f"{'tokens':>7} {'stage':<18} {'peak GiB':>9} {'x plain':>8} {'seconds':>8}")
    for tokens in args.tokens:
        dataset = folder / f"rows-{tokens}"
        if not (dataset / "README.md").exists():
            dataset = export_rows(folder, model, tokens)
        max_length = 32768  # every row whole: the memory of the row asked for, not of a cut one
        results = {}
        for name, stage, batch in (STAGES[key] for key in args.stages):
            results[name] = result = run(stage, model, dataset, folder, batch, max_length)
            if "error" in result:
                print(f"{tokens:>7} {name:<18} failed: {result['error']}")
                continue
            plain = results.get("plain LM (batch 8)", {}).get("peak_gib")
            ratio = f"{result['peak_gib'] / plain:.2f}" if plain else "-"
            print(f"{tokens:>7} {name:<18} {result['peak_gib']:>9.2f} {ratio:>8} {result['seconds']:>8.1f}")
        one, eight, sft = (results.get(n, {}).get("peak_gib") for n in ("ActGuide batch 1", "ActGuide batch 8",
                                                                          "SFT (default)"))
        if one and eight and sft:
            print(f"{tokens:>7} goals: ActGuide batch 8 / SFT {eight / sft:.2f} (goal <= 1.2); "
                  f"ActGuide batch 8 / batch 1 {eight / one:.2f} (goal < 1.10)")


if __name__ == "__main__":
    main()
