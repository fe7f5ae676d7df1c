"""DPO + ActGuide + SFT build time, peak memory and bytes written, on synthetic trajectories (tens of
messages, kilobytes of tool output, per-token log-probs), against the I/O floor measured in the same run:
reading the used columns of the inputs and writing the same output tables with the same settings, which
no build of these rows can avoid. The build runs at two sizes (--trajectories and a quarter of it) in
the same run, each in its own process, so each peak RSS is its own; CPU seconds (all threads, user and
system) say what it costs whatever else the machine runs. At the smaller size the streamed shards are
compared table for table with a build of each batch read whole (`build_rows` at once).

Tasks are numbered with a fixed width, so a batch's files list them in name order, the order rows are
made in: the build then holds one run of tasks at a time (`pipeline.datasets.files`).

    python benchmarks/datasets_build.py [--trajectories 200000] [--batches 10] [--dir /tmp/x]
Targets: the build takes at most 1.25x the I/O floor; its peak RSS at the two sizes within 10% of each other.
"""

from __future__ import annotations

import argparse
import json
import random
import re
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import numpy as np  # noqa: E402
import polars as pl  # noqa: E402
import pyarrow as pa  # noqa: E402
import pyarrow.parquet as pq  # noqa: E402

from pipeline.core.records import TRAJECTORY_SCHEMA  # noqa: E402
from pipeline.core.vocab import GUIDANCE_KINDS  # noqa: E402

TOOLS = json.dumps([{"type": "function", "function": {"name": n, "description": "x" * 300,
                                                      "parameters": {"type": "object"}}} for n in ("bash", "edit")])


class Text:
    """Random slices of a buffer of pseudo-words: distinct, word-like, compressible like real text."""

    def __init__(self, rng: random.Random, size: int = 8_000_000):
        words = ["".join(rng.choices("abcdefghijklmnopqrstuvwxyz_./()", k=rng.randint(2, 9))) for _ in range(6000)]
        self.buf = " ".join(rng.choices(words + ["\n"] * 600, k=size // 5))
        self.rng = rng

    def __call__(self, low: int, high: int) -> str:
        n = self.rng.randint(low, high)
        start = self.rng.randrange(len(self.buf) - n)
        return self.buf[start:start + n]


def message(role: str, content: str | None, calls: list | None = None, call_id: str | None = None) -> dict:
    return {"role": role, "content": content, "tool_calls": json.dumps(calls) if calls else None,
            "tool_call_id": call_id}


def attempt(text: Text, rng: random.Random, task: dict, batch: str, kind: str, sample: int, reward: float) -> dict:
    """One stored trajectory: 5-20 tool calls, tool outputs of 0.2-4 KB; a few successes write the gold hunk
    out (left out of the datasets), a few guided attempts echo their hint in a tool output (left out too)."""
    hint = task["hints"][kind] if kind != "none" else ""
    unguided = [message("system", task["system"]), message("user", task["issue"])]
    prompt = unguided if not hint else [unguided[0], message("user", task["issue"] + "\n\n" + hint)]
    completion, turns = [], []
    for i in range(rng.randint(5, 20)):
        args = json.dumps({"command": text(30, 200)})
        completion += [message("assistant", text(40, 400), [{"id": f"call_{i}", "type": "function", "function": {
            "name": "bash", "arguments": args}}]), message("tool", text(200, 4000), call_id=f"call_{i}")]
        turns.append((len(completion[-2]["content"]) + len(args)) // 4)  # tokens of the turn, as log-probs
    if reward > 0 and rng.random() < 0.02:
        completion[0]["content"] = "Applying this:\n" + task["hunk"]
    if hint and rng.random() < 0.01:
        completion[1]["content"] = "notes.txt: " + hint
    gold = reward > 0 and rng.random() < 0.1  # a fix equal to the gold patch: kept
    rid = f"{batch}-{task['id']}-{kind}-{sample}"
    return {
        "rollout_id": rid, "group_id": f"{batch}|{task['id']}|{kind}", "batch": batch, "instance_id": task["id"],
        "sample_index": sample, "seed": sample, "policy": "bench", "policy_settings": "{}", "guidance_kind": kind,
        "guidance_text": hint, "guidance_actions": task["actions"] if kind == "action" else [],
        "guidance_k": rng.randint(1, 5) if kind == "action" else -1, "teacher": "", "prompt": prompt,
        "unguided_prompt": unguided, "messages": prompt + completion + [message("assistant", "done")],
        "tools": TOOLS, "steps": [], "logprobs": turns,
        "patch": ("index 1111111..2222222 100644\n" + task["gold"]) if gold else text(200, 1500),
        "reward": reward, "resolved": reward > 0, "grade_reason": "", "report": "{}", "test_log": text(500, 3000),
        "dropped_files": [], "enforcement": [], "suspicious": [], "exit_status": "submitted",
        "infra_error": "sandbox_error: lost" if rng.random() < 0.01 else "", "error": "", "infra_retries": 0,
        "format_errors": 0, "total_tokens": 0, "wall_time": 1.0, "grade_time": 1.0,
        "quotes_guidance": bool(hint) and rng.random() < 0.02, "created_at": "", "policy_model": "bench",
        "policy_revision": "", "chat_template_hash": "", "temperature": 1.0, "top_p": 1.0, "top_k": 0}


def with_logprobs(rows: list[dict], rng: np.random.Generator) -> pa.Table:
    """The rows as a table whose logprobs column holds one float32 per token of each assistant turn."""
    turns = [r.pop("logprobs") for r in rows]
    table = pa.Table.from_pylist([{**r, "logprobs": None} for r in rows], schema=TRAJECTORY_SCHEMA)
    inner = np.concatenate([[0], np.cumsum([n for t in turns for n in t])])
    outer = np.concatenate([[0], np.cumsum([len(t) for t in turns])])
    values = pa.array(-rng.exponential(1.0, int(inner[-1])).astype(np.float32))
    column = pa.ListArray.from_arrays(outer, pa.ListArray.from_arrays(inner, values))
    return table.set_column(table.schema.get_field_index("logprobs"), TRAJECTORY_SCHEMA.field("logprobs"),
                            column.cast(TRAJECTORY_SCHEMA.field("logprobs").type))


def generate(data: Path, total: int, batches: int, seed: int = 0) -> dict[str, str]:
    """Batches of 4 unguided attempts per task; the 60% of tasks that fail all get 8 guided ones."""
    rng, nrng = random.Random(seed), np.random.default_rng(seed)
    text, gold, made, system = Text(rng), {}, 0, Text(rng)(1200, 1800)
    hints = Text(rng, 2_000_000)  # its own words: a hint is in no prompt or completion
    for b in range(batches):
        batch, rows = f"2026-12-{b + 1:02d}", {"unguided": [], "guided": []}
        while made < total * (b + 1) // batches:
            body, name = text(150, 600).rstrip(), f"pkg/m{len(gold)}.py"
            task = {"id": f"repo__{len(gold):07d}", "system": system, "issue": text(500, 2000),
                    "gold": f"diff --git a/{name} b/{name}\n--- a/{name}\n+++ b/{name}\n"
                            f"@@ -1,4 +1,4 @@ def f():\n{body}\n",
                    "hunk": f"@@ -1,4 +1,4 @@\n{body}",
                    "actions": [{"name": "bash", "args": json.dumps({"command": text(20, 80)})} for _ in range(5)],
                    "hints": {kind: hints(300, 900) for kind in GUIDANCE_KINDS}}
            gold[task["id"]] = task["gold"]
            solved = rng.random() < 0.4
            for i in range(4):
                rows["unguided"].append(attempt(text, rng, task, batch, "none", i, float(solved and rng.random() < 0.6)))
            if not solved:
                for kind in GUIDANCE_KINDS:
                    rows["guided"] += [attempt(text, rng, task, batch, kind, i, float(rng.random() < 0.5)) for i in range(2)]
            made += 4 + (0 if solved else 8)
        for origin, chunk in rows.items():
            path = data / "trajectories" / origin / batch / "trajectories.parquet"
            path.parent.mkdir(parents=True, exist_ok=True)
            pq.write_table(with_logprobs(chunk, nrng), path, compression="zstd")
    return gold


def stream_build(data: Path, out: Path, gold: dict[str, str]) -> None:
    from pipeline.datasets import DatasetConfig, update_datasets

    report = update_datasets(data, out, DatasetConfig(), gold)
    print(json.dumps({"rows": report.rows, "dropped": report.dropped}), file=sys.stderr)


def whole_build(data: Path, out: Path, gold: dict[str, str]) -> None:
    """Each batch read whole and built at once (no runs, no streaming), written as the build writes."""
    from pipeline.datasets.build import SCHEMAS, SEEN_KEYS, build_rows, rows_table
    from pipeline.datasets.config import DatasetConfig
    from pipeline.datasets.files import read_trajectories, write_rows_table
    from pipeline.core.layout import Layout

    config, seen = DatasetConfig(), {}
    for batch in Layout(data).batch_names():
        built = build_rows(read_trajectories(Layout(data).batch_files(batch))[0], config, gold, seen)
        for kind, schema in SCHEMAS.items():
            (out / kind).mkdir(parents=True, exist_ok=True)
            write_rows_table(rows_table(getattr(built, kind), schema), out / kind / f"{batch}.parquet")
        seen = {kind: pl.concat([seen[kind], getattr(built, kind).select(keys)]) if kind in seen
                else getattr(built, kind).select(keys) for kind, keys in SEEN_KEYS.items()}


def clock() -> tuple[float, float]:
    """(wall, CPU) seconds: CPU of every thread of this process, user and system."""
    used = resource.getrusage(resource.RUSAGE_SELF)
    return time.perf_counter(), used.ru_utime + used.ru_stime


def since(start: tuple[float, float]) -> tuple[float, float]:
    return tuple(now - then for now, then in zip(clock(), start))


def io_floor(data: Path, out: Path) -> tuple[float, float]:
    """(wall, CPU) seconds any build spends on I/O: reading the inputs' used columns and writing the same
    output tables (those in `out`, read beforehand, untimed) with the settings the shards are written with."""
    from pipeline.datasets.files import read_trajectories, write_rows_table
    from pipeline.core.layout import Layout

    start = clock()
    for batch in Layout(data).batch_names():
        read_trajectories(Layout(data).batch_files(batch))
    spent = since(start)
    for path in sorted(out.rglob("*.parquet")):
        table = pq.read_table(path)
        start = clock()
        write_rows_table(table, out.parent / "io-floor.parquet")
        spent = tuple(a + b for a, b in zip(spent, since(start)))
    return spent


def child(phase: str, data: Path, out: Path) -> None:
    """One build in this process; prints its wall time, CPU time and peak RSS as JSON."""
    gold = json.loads((data / "gold.json").read_text())
    start = clock()
    if phase == "io":
        seconds, cpu = io_floor(data, out)  # (its peak RSS is that of a whole batch's used columns)
    else:
        {"build": stream_build, "whole": whole_build}[phase](data, out, gold)
        seconds, cpu = since(start)
    print(json.dumps({"seconds": seconds, "cpu_seconds": cpu, "peak_bytes": peak_rss()}))


def peak_rss() -> int:
    """Bytes of this process's peak RSS since it started (VmHWM; ru_maxrss would carry over the parent's peak
    at fork, here the generator's)."""
    status = Path("/proc/self/status").read_text()
    return int(re.search(r"^VmHWM:\s+(\d+) kB", status, re.M).group(1)) * 1024


def measured(phase: str, data: Path, out: Path) -> dict:
    done = subprocess.run([sys.executable, __file__, "--child", phase, "--dir", str(data), "--out", str(out)],
                          capture_output=True, text=True, check=True)
    if done.stderr.strip():
        print(done.stderr.strip()[-2000:])
    return json.loads(done.stdout.strip().splitlines()[-1])


def same_rows(a: Path, b: Path) -> bool:
    """Both outputs hold the same shards with equal tables (types, order and values)."""
    from pipeline.datasets.build import SCHEMAS

    for kind in SCHEMAS:
        names = sorted(p.name for p in (a / kind).glob("*.parquet"))
        if names != sorted(p.name for p in (b / kind).glob("*.parquet")):
            return False
        for name in names:
            if not pq.read_table(a / kind / name).equals(pq.read_table(b / kind / name)):
                print(f"differs: {kind}/{name}")
                return False
    return True


def written(out: Path, kind: str) -> tuple[int, int]:
    """(bytes, rows) of one kind's shards."""
    paths = list((out / kind).glob("*.parquet"))
    return sum(p.stat().st_size for p in paths), sum(pq.ParquetFile(p).metadata.num_rows for p in paths)


def generated(root: Path, total: int, batches: int) -> Path:
    data, start = root / f"data-{total}", time.perf_counter()
    gold = generate(data, total, batches)
    (data / "gold.json").write_text(json.dumps(gold))
    size = sum(p.stat().st_size for p in data.rglob("*.parquet"))
    print(f"generated {total} trajectories in {batches} batches ({size / 2**20:.0f} MiB of Parquet) in "
          f"{time.perf_counter() - start:.0f} s")
    return data


def line(name: str, m: dict) -> str:
    return (f"{name:28s} {m['seconds']:8.1f} s   CPU {m['cpu_seconds']:6.1f} s   "
            f"peak RSS {m['peak_bytes'] / 2**30:5.2f} GiB")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--trajectories", type=int, default=200_000)
    parser.add_argument("--batches", type=int, default=10)
    parser.add_argument("--dir", default="", help="working folder (default: a new temporary one, removed after)")
    parser.add_argument("--child", choices=["build", "whole", "io"], help=argparse.SUPPRESS)
    parser.add_argument("--out", default="", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        return child(args.child, Path(args.dir), Path(args.out))
    big, small = args.trajectories, args.trajectories // 4
    with tempfile.TemporaryDirectory(dir=args.dir or None) as tmp:
        root = Path(tmp)
        data = {n: generated(root, n, args.batches) for n in (small, big)}
        build = {n: measured("build", data[n], root / f"build-{n}") for n in (small, big)}
        floors = {n: measured("io", data[n], root / f"build-{n}") for n in (small, big)}
        floor = floors[big]
        whole = measured("whole", data[small], root / f"whole-{small}")
        for name, m in [(f"build, {big}", build[big]), (f"I/O floor, {big}", floor), (f"build, {small}", build[small]),
                        (f"I/O floor, {small}", floors[small]), (f"whole-batch build, {small}", whole)]:
            print(line(name, m))
        ratio = build[big]["seconds"] / floor["seconds"]
        peaks = [build[n]["peak_bytes"] for n in (small, big)]
        growth = max(peaks) / min(peaks) - 1
        print(f"build / I/O floor at {big}: {ratio:.2f}x (target <= 1.25x: {'met' if ratio <= 1.25 else 'NOT met'}); "
              f"CPU {build[big]['cpu_seconds'] / floor['cpu_seconds']:.2f}x")
        print(f"peak RSS {peaks[0] / 2**30:.2f} GiB at {small}, {peaks[1] / 2**30:.2f} GiB at {big}: {growth:+.1%} "
              f"(target within 10%: {'met' if growth <= 0.10 else 'NOT met'}); the I/O floor's own: "
              f"{floors[big]['peak_bytes'] / floors[small]['peak_bytes'] - 1:+.1%}")
        out = root / f"build-{big}"
        sizes = {kind: written(out, kind) for kind in ("dpo", "actguide", "sft")}
        total = sum(b for b, _ in sizes.values())
        print(f"bytes written per trajectory: {total / big:,.0f} (" + ", ".join(
            f"{kind} {b / big:,.0f}" for kind, (b, _) in sizes.items()) + f"); per DPO row "
            f"{sizes['dpo'][0] / max(sizes['dpo'][1], 1):,.0f}")
        print(f"streamed shards equal the whole-batch build at {small}: "
              f"{same_rows(root / f'build-{small}', root / f'whole-{small}')}")


if __name__ == "__main__":
    main()
