"""DPO + ActGuide + SFT build time and peak memory: the polars builders against a pure-Python build of
the same rows (a loop over dicts, written with pyarrow), in the same run, on the same
synthetic trajectories (tens of messages, kilobytes of tool output, per-token log-probs). Each build
runs in its own process, so each peak RSS is its own; its CPU seconds (all threads, user and system)
say what it costs whatever else the machine runs. Both outputs are compared table for table.

    python benchmarks/datasets_build.py [--trajectories 200000] [--batches 10] [--dir /tmp/x]
Targets: polars >= 10x faster than the baseline, peak memory < 4 GiB.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
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
import pyarrow as pa  # noqa: E402
import pyarrow.parquet as pq  # noqa: E402

from pipeline.records import TRAJECTORY_SCHEMA  # noqa: E402

KINDS = ("plan", "environment_feedback", "environment_interaction", "action")
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
        "quotes_guidance": bool(hint) and rng.random() < 0.02, "created_at": ""}


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
            task = {"id": f"repo__{len(gold)}", "system": system, "issue": text(500, 2000),
                    "gold": f"diff --git a/{name} b/{name}\n--- a/{name}\n+++ b/{name}\n"
                            f"@@ -1,4 +1,4 @@ def f():\n{body}\n",
                    "hunk": f"@@ -1,4 +1,4 @@\n{body}",
                    "actions": [{"name": "bash", "args": json.dumps({"command": text(20, 80)})} for _ in range(5)],
                    "hints": {kind: hints(300, 900) for kind in KINDS}}
            gold[task["id"]] = task["gold"]
            solved = rng.random() < 0.4
            for i in range(4):
                rows["unguided"].append(attempt(text, rng, task, batch, "none", i, float(solved and rng.random() < 0.6)))
            if not solved:
                for kind in KINDS:
                    rows["guided"] += [attempt(text, rng, task, batch, kind, i, float(rng.random() < 0.5)) for i in range(2)]
            made += 4 + (0 if solved else 8)
        for origin, chunk in rows.items():
            path = data / "trajectories" / origin / batch / "trajectories.parquet"
            path.parent.mkdir(parents=True, exist_ok=True)
            pq.write_table(with_logprobs(chunk, nrng), path, compression="zstd")
    return gold


# ---- the baseline: the same rows, built by a loop over dicts ----------------------------------------

def canonical(messages: list[dict]) -> str:
    return "\x1e".join("\x1f".join([m["role"], m["content"] or "", m["tool_calls"] or "", m["tool_call_id"] or ""])
                       for m in messages)


def sha(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def chat(messages: list[dict]) -> list[dict]:
    out = []
    for m in messages:
        calls = [{"id": c.get("id"), "type": c.get("type"), "function": {"name": c["function"].get("name"),
                  "arguments": c["function"].get("arguments")}} for c in json.loads(m["tool_calls"])] \
            if m["tool_calls"] is not None else None
        out.append({**m, "tool_calls": calls})
    return out


def row_text(messages: list[dict]) -> str:
    return "\x1e".join((m["content"] or "") + "\x1f" + "\x1e".join(
        c["function"]["name"] + "\x1f" + c["function"]["arguments"] for c in m["tool_calls"] or []) for m in messages)


def tokens(messages: list[dict]) -> int:
    chars = sum(len(m["content"] or "") + len(m["tool_calls"] or "") for m in messages)
    return (chars + 3) // 4 + 4 * len(messages)


def hunks(gold_patch: str) -> str:
    """The gold diff from its first hunk on, without what depends on the tool that wrote it."""
    patch = re.sub(r"(?m)^index [0-9a-f]+\.\.[0-9a-f]+.*\n", "", gold_patch)
    found = re.search(r"(?s)(@@ .*)", re.sub(r"(?m)^(@@ [^@]* @@).*$", r"\1", patch).strip())
    return found.group(1) if found else ""


def usable(rows: list[dict], gold: dict[str, str], limits: tuple[int, int]) -> list[dict]:
    """The polars `prepare`, row by row."""
    order = {"unguided": 0, "guided": 1, "probe": 2}
    out = []
    for r in {r["rollout_id"]: r for r in rows}.values():
        if r["infra_error"] or r["quotes_guidance"]:
            continue
        stored = r["messages"][len(r["prompt"]):]
        r["origin"] = "probe" if r["batch"].endswith("-probes") else "unguided" if r["guidance_kind"] == "none" \
            else "guided"
        r["base_batch"] = r["batch"].removesuffix("-probes")
        r["source"] = "unguided" if r["guidance_kind"] == "none" else "guided:" + r["guidance_kind"]
        kind = KINDS.index(r["guidance_kind"]) if r["guidance_kind"] in KINDS else len(KINDS)
        r["source_rank"] = order[r["origin"]] * 10 + kind
        r["completion"], r["prompt_chat"] = chat(stored), chat(r["unguided_prompt"])
        needle = r["guidance_text"]
        if needle and needle in row_text(r["prompt_chat"]):
            raise AssertionError(f"{r['rollout_id']}: guidance in the unguided prompt")
        if needle and (needle in row_text(r["completion"]) or needle in r["tools"]):
            continue
        r["prompt_tokens"], r["completion_tokens"] = tokens(r["unguided_prompt"]), tokens(stored)
        r["guided_prompt_tokens"] = tokens(r["prompt"])
        if r["prompt_tokens"] > limits[0] or r["completion_tokens"] > limits[1]:
            continue
        h = hunks(gold.get(r["instance_id"], "")) if r["reward"] > 0 else ""
        said = [m for m in r["completion"] if m["role"] == "assistant"]
        r["gold_leak"] = bool(h) and h in row_text(r["prompt_chat"]) + "\x1e" + row_text(said)
        r["completion_hash"] = sha(canonical(stored))
        r["prompt_key"] = sha(canonical(r["unguided_prompt"]) + "\x1d" + r["tools"])
        out.append(r)
    return out


def first_distinct(rows: list[dict]) -> dict[tuple, list[dict]]:
    """Rows grouped by task, the first of each distinct completion kept, in the given order."""
    seen, groups = set(), {}
    for r in rows:
        key = (r["base_batch"], r["instance_id"], r["completion_hash"])
        if key not in seen:
            seen.add(key)
            groups.setdefault(key[:2], []).append(r)
    return groups


def baseline_rows(rows: list[dict], gold: dict[str, str], seen: dict[str, set], config) -> dict[str, list[dict]]:
    from pipeline.datasets.splits import task_split

    rows = usable(rows, gold, (config.max_prompt_tokens, config.max_completion_tokens))
    chosen = first_distinct(sorted((r for r in rows if r["reward"] > 0 and not r["gold_leak"]), key=lambda r: (
        r["base_batch"], r["instance_id"], r["source_rank"], r["sample_index"], r["rollout_id"])))
    rejected = first_distinct(sorted((r for r in rows if r["origin"] == "unguided" and r["reward"] <= 0), key=lambda r: (
        r["base_batch"], r["instance_id"], r["sample_index"], r["rollout_id"])))
    dpo = []
    for task in sorted(set(chosen) & set(rejected)):
        cs, rs, found = chosen[task], rejected[task], []
        for i, c in enumerate(cs):
            for j, r in enumerate(rs):
                zipped = (i % len(rs) == j) if len(cs) >= len(rs) else (j % len(cs) == i)
                order = (i if len(cs) >= len(rs) else j) if zipped else max(len(cs), len(rs)) + i * len(rs) + j
                key = (task[1], c["completion_hash"], r["completion_hash"])
                if c["completion_hash"] != r["completion_hash"] and c["prompt_key"] == r["prompt_key"] \
                        and key not in seen["dpo"]:
                    found.append((order, c, r))
        for _, c, r in sorted(found, key=lambda x: x[0])[:config.pairs_per_task]:
            dpo.append({"prompt": c["prompt_chat"], "chosen": c["completion"], "rejected": r["completion"],
                        "tools": c["tools"], "instance_id": task[1], "split": task_split(task[1], config.test_fraction),
                        "batch": task[0], "chosen_source": c["source"], "chosen_rollout_id": c["rollout_id"],
                        "rejected_rollout_id": r["rollout_id"], "prompt_tokens": c["prompt_tokens"],
                        "chosen_tokens": c["completion_tokens"], "rejected_tokens": r["completion_tokens"],
                        "chosen_hash": c["completion_hash"], "rejected_hash": r["completion_hash"]})
    sft = [{"messages": c["prompt_chat"] + c["completion"], "tools": c["tools"], "instance_id": c["instance_id"],
            "split": task_split(c["instance_id"], config.test_fraction), "batch": c["base_batch"],
            "source": c["source"], "rollout_id": c["rollout_id"], "reward": c["reward"],
            "prompt_tokens": c["prompt_tokens"], "completion_tokens": c["completion_tokens"],
            "completion_hash": c["completion_hash"]}
           for task in sorted(chosen) for c in chosen[task]
           if (c["instance_id"], c["completion_hash"]) not in seen["sft"]]
    return {"dpo": dpo, "actguide": baseline_actguide(rows, config), "sft": sft}


def baseline_actguide(rows: list[dict], config) -> list[dict]:
    from pipeline.datasets.splits import task_split

    heads, members = {}, {}
    for r in sorted(rows, key=lambda r: (r["base_batch"], r["instance_id"], r["group_id"], r["sample_index"],
                                         r["rollout_id"])):
        if r["origin"] == "guided" and r["guidance_kind"] == "action":
            heads.setdefault(r["group_id"], r)
            members.setdefault(r["group_id"], []).append((1, r))
    for r in rows:
        for g, head in heads.items():
            if r["origin"] == "unguided" and (r["base_batch"], r["instance_id"]) == (head["base_batch"],
                                                                                     head["instance_id"]):
                members[g].append((0, r))
    out = []
    for g, h in sorted(heads.items(), key=lambda kv: (kv[1]["base_batch"], kv[1]["instance_id"], kv[0])):
        group = sorted(members[g], key=lambda m: (m[0], m[1]["sample_index"], m[1]["rollout_id"]))
        out.append({"prompt": h["prompt_chat"], "guided_prompt": chat(h["prompt"]), "tools": h["tools"],
                    "actions": json.dumps([{"name": a["name"], "args": json.loads(a["args"])}
                                           for a in h["guidance_actions"]], ensure_ascii=False),
                    "K": len(h["guidance_actions"]), "k_star": h["guidance_k"], "trajectories": [
                        {"rollout_id": m["rollout_id"], "sampled_under": ("unguided", "guided")[o],
                         "sample_index": m["sample_index"], "reward": m["reward"], "resolved": m["resolved"],
                         "completion": m["completion"], "completion_tokens": m["completion_tokens"],
                         "logprobs": m["logprobs"]} for o, m in group],
                    "instance_id": h["instance_id"], "split": task_split(h["instance_id"], config.test_fraction),
                    "batch": h["base_batch"], "group_id": g, "prompt_tokens": h["prompt_tokens"],
                    "guided_prompt_tokens": h["guided_prompt_tokens"]})
    return out


COLUMNS = ["rollout_id", "group_id", "batch", "instance_id", "sample_index", "guidance_kind", "guidance_text",
           "guidance_actions", "guidance_k", "prompt", "unguided_prompt", "messages", "tools", "logprobs", "reward",
           "resolved", "infra_error", "quotes_guidance"]  # the columns the rules use


def baseline(data: Path, out: Path, gold: dict[str, str]) -> None:
    """Each batch's files read whole into dicts, the rows made by the loops above, each shard written
    as the builders write theirs (same codec: same files, not only the same rows)."""
    from pipeline.datasets.build import COMPRESSION, KINDS as SCHEMAS, DatasetConfig, batch_names, trajectory_files

    config, seen = DatasetConfig(), {"dpo": set(), "sft": set()}
    for batch in batch_names(data):
        rows = [r for f in trajectory_files(data, batch) for r in pq.read_table(f, columns=COLUMNS).to_pylist()]
        built = baseline_rows(rows, gold, seen, config)
        for kind, schema in SCHEMAS.items():
            (out / kind).mkdir(parents=True, exist_ok=True)
            pq.write_table(pa.Table.from_pylist(built[kind], schema=schema), out / kind / f"{batch}.parquet",
                           compression=COMPRESSION)
        seen["dpo"] |= {(r["instance_id"], r["chosen_hash"], r["rejected_hash"]) for r in built["dpo"]}
        seen["sft"] |= {(r["instance_id"], r["completion_hash"]) for r in built["sft"]}


def polars_build(data: Path, out: Path, gold: dict[str, str]) -> None:
    from pipeline.datasets import DatasetConfig, update_datasets

    report = update_datasets(data, out, DatasetConfig(), gold)
    print(json.dumps({"rows": report.rows, "dropped": report.dropped}), file=sys.stderr)


def clock() -> tuple[float, float]:
    """(wall, CPU) seconds: CPU of every thread of this process, user and system."""
    used = resource.getrusage(resource.RUSAGE_SELF)
    return time.perf_counter(), used.ru_utime + used.ru_stime


def since(start: tuple[float, float]) -> tuple[float, float]:
    return tuple(now - then for now, then in zip(clock(), start))


def io_floor(data: Path, out: Path) -> tuple[float, float]:
    """(wall, CPU) seconds any build spends on I/O: reading the inputs' used columns and writing the same
    output tables (those in `out`, read beforehand, untimed) as the shards are written."""
    from pipeline.datasets.build import COMPRESSION, batch_names, read_trajectories, trajectory_files

    start = clock()
    for batch in batch_names(data):
        read_trajectories(trajectory_files(data, batch))
    spent = since(start)
    for path in sorted(out.rglob("*.parquet")):
        table = pq.read_table(path)
        start = clock()
        pq.write_table(table, out.parent / "io-floor.parquet", compression=COMPRESSION)
        spent = tuple(a + b for a, b in zip(spent, since(start)))
    return spent


def child(phase: str, data: Path, out: Path) -> None:
    """One build in this process; prints its wall time, CPU time and peak RSS as JSON."""
    gold = json.loads((data / "gold.json").read_text())
    start = clock()
    if phase == "io":
        seconds, cpu = io_floor(data, out)  # (its peak RSS is that of the largest output shard, read whole)
    else:
        {"polars": polars_build, "baseline": baseline}[phase](data, out, gold)
        seconds, cpu = since(start)
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # bytes (Linux reports KiB)
    print(json.dumps({"seconds": seconds, "cpu_seconds": cpu, "peak_bytes": peak}))


def measured(phase: str, data: Path, out: Path) -> dict:
    done = subprocess.run([sys.executable, __file__, "--child", phase, "--dir", str(data), "--out", str(out)],
                          capture_output=True, text=True, check=True)
    print(done.stderr.strip()[-2000:])
    return json.loads(done.stdout.strip().splitlines()[-1])


def same_rows(a: Path, b: Path) -> bool:
    """Both outputs hold the same shards with equal tables (types, order and values)."""
    from pipeline.datasets.build import KINDS as SCHEMAS

    for kind in SCHEMAS:
        names = sorted(p.name for p in (a / kind).glob("*.parquet"))
        if names != sorted(p.name for p in (b / kind).glob("*.parquet")):
            return False
        for name in names:
            if not pq.read_table(a / kind / name).equals(pq.read_table(b / kind / name)):
                print(f"differs: {kind}/{name}")
                return False
    return True


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--trajectories", type=int, default=200_000)
    parser.add_argument("--batches", type=int, default=10)
    parser.add_argument("--dir", default="", help="working folder (default: a new temporary one, removed after)")
    parser.add_argument("--child", choices=["polars", "baseline", "io"], help=argparse.SUPPRESS)
    parser.add_argument("--out", default="", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        return child(args.child, Path(args.dir), Path(args.out))
    with tempfile.TemporaryDirectory(dir=args.dir or None) as tmp:
        data = Path(tmp) / "data"
        start = time.perf_counter()
        gold = generate(data, args.trajectories, args.batches)
        (data / "gold.json").write_text(json.dumps(gold))
        size = sum(p.stat().st_size for p in data.rglob("*.parquet"))
        print(f"generated {args.trajectories} trajectories in {args.batches} batches ({size / 2**20:.0f} MiB of "
              f"Parquet) in {time.perf_counter() - start:.0f} s")
        fast = measured("polars", data, Path(tmp) / "polars")
        slow = measured("baseline", data, Path(tmp) / "baseline")
        floor = measured("io", data, Path(tmp) / "polars")
        for name, m in [("polars builders", fast), ("pure-Python baseline", slow), ("I/O alone", floor)]:
            print(f"{name:22s} {m['seconds']:8.1f} s   CPU {m['cpu_seconds']:6.1f} s   "
                  f"peak RSS {m['peak_bytes'] / 2**30:5.2f} GiB")
        print(f"speed-up {slow['seconds'] / fast['seconds']:.1f}x (target >= 10x); "
              f"polars peak {fast['peak_bytes'] / 2**30:.2f} GiB (target < 4 GiB); "
              f"same rows: {same_rows(Path(tmp) / 'polars', Path(tmp) / 'baseline')}")
        print(f"the most any build of these rows can reach on this machine ({os.cpu_count()} cores): baseline / I/O "
              f"alone = {slow['seconds'] / floor['seconds']:.1f}x")
        print(f"beyond the I/O both do: polars {fast['seconds'] - floor['seconds']:.1f} s, baseline "
              f"{slow['seconds'] - floor['seconds']:.1f} s, ratio "
              f"{(slow['seconds'] - floor['seconds']) / max(fast['seconds'] - floor['seconds'], 1e-9):.1f}x")


if __name__ == "__main__":
    main()
