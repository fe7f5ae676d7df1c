"""Many attempts at once: how a batch keeps a model server busy, at W attempts in flight.

For each W, W x --rounds attempts of the demo's tasks run through `run_batch` (the rollout code path: its
workers, the warm sandbox pool, DockerSandboxes, the grader) with `workers=W`. The policy is the OpenAI client
against a loopback server in a subprocess that answers every turn after --delay seconds with the next tool call
of the task's expert script (pipeline/guidance/expert.py: locate the file, view, apply the gold fix, run the
tests, submit), so each attempt does real sandbox work and its grade runs the tests on a real fix. That script
is 5 turns where a real attempt takes 20-100, so --turns pads it (default 20) with the read-only calls an agent
makes while it explores (listings, views, greps), all before the edit: the fix, and so the grade, stay the same.

    python benchmarks/concurrency.py [--widths 4,8,16,32,64] [--delay 2] [--rounds 4] [--turns 20]
(not under `nice`: niced, the pipeline's threads weigh a tenth of a container's test run, as they never do in use.)
Needs the demo's tasks and images (`make demo`). Per W it prints attempts per minute, over the whole batch and
steady (W / the mean time a middle attempt holds its worker, the first and last W left out: what W busy workers
sustain; the mean hold of all attempts and of the middle ones beside it), next to the ideal for the
delay (W / (turns x delay + work), work: the script's commands and the grader's test run, measured alone first;
--turns 0: the bare 5-turn script), where an attempt's wall time went (model, tools, grade), the pipeline's own
CPU per attempt (this process, plus the containers' CPU less that work) and its share of an attempt's wall time,
take and container-start latency, memory per live sandbox, and infra errors, lost attempts and containers left.
Targets (2 cores): W=32 >= 0.9 of the ideal (steady), no infra error, lost attempt or container left, own time <= 5%
of an attempt's wall time; W=64 completes.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import itertools
import math
import os
import posixpath
import random
import re
import resource
import shlex
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import pyarrow.parquet as pq

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.concurrency_meters import (Metered, Sampler, container_cpu, engine_cpu, machine_cpu,  # noqa: E402
                                          process_cpu)
from pipeline.agent.loop import AgentConfig, unguided_prompt  # noqa: E402
from pipeline.agent.openai_policy import OpenAIPolicy, OpenAIPolicyConfig  # noqa: E402
from pipeline.agent.tools import execute  # noqa: E402
from pipeline.guidance.expert import expert_actions, patch_edits  # noqa: E402
from pipeline.core.records import Task  # noqa: E402
from pipeline.rollouts import batch as batch_module  # noqa: E402
from pipeline.rollouts.batch import RolloutConfig, plan_jobs, run_batch  # noqa: E402
from pipeline.rollouts.sandbox_pool import PoolConfig, percentile  # noqa: E402
from pipeline.verifier.environment import task_sandbox  # noqa: E402
from sandbox.images import LABEL, docker_client  # noqa: E402


def prompt_key(text: str) -> str:
    """How the server knows the task of a request: its first user message, hashed."""
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def exploring(task: Task) -> list[dict]:
    """Read-only calls an agent makes before it edits: the repository's layout, each edited file's folder,
    outline, head and the lines around each hunk, a grep for the hunk's longest name and the tests that
    import the module. Small outputs (40 lines, 20 matches): a real exploration turn, not a dump."""
    edits = patch_edits(task.patch)

    def bash(command: str) -> dict:
        return {"name": "bash", "args": {"command": f"cd {shlex.quote(task.workdir)} && {command}"}}

    def view(path: str, lines: list[int] | None = None) -> dict:
        return {"name": "edit", "args": {"command": "view", "path": path, **({"view_range": lines} if lines else {})}}

    calls = [view(".")]
    for path in dict.fromkeys(e[0] for e in edits):
        stem, quoted = shlex.quote(posixpath.basename(path).removesuffix(".py")), shlex.quote(path)
        calls += [bash(f"ls -la {shlex.quote(posixpath.dirname(path) or '.')}"),
                  bash(f"grep -n -E '^\\s*(def|class) ' {quoted} | head -n 40"), view(path, [1, 40]),
                  bash(f"grep -rln {stem} --include='test*.py' . | head -n 20")]
    for path, start, old, _ in edits:
        calls.append(view(path, [max(1, start - 40), start + 40]))
        if names := re.findall(r"[A-Za-z_]\w{3,}", old):
            calls.append(bash(f"grep -rn -w {shlex.quote(max(names, key=len))} --include='*.py' . | head -n 20"))
    return calls


def padded_actions(task: Task, turns: int) -> list[dict]:
    """The task's expert script, padded to `turns` calls with `exploring`'s (repeated as needed: agents look
    again) between locating the file and viewing the edit site; the bare script where it has `turns` or more."""
    actions = expert_actions(task)
    if turns <= len(actions):
        return actions
    at = next(i for i, a in enumerate(actions) if a["name"] == "edit")  # the first view of an edit site
    return [*actions[:at], *itertools.islice(itertools.cycle(exploring(task)), turns - len(actions)),
            *actions[at:]]


def test_turn(task: Task, turns: int) -> int:
    """The index of the script's turn that runs the tests (the agent's own test run)."""
    return next(i for i, a in enumerate(padded_actions(task, turns)) if task.test_cmd in a["args"].get("command", ""))


def scripts(tasks: list[Task], agent: AgentConfig, turns: int) -> dict[str, list[dict]]:
    """Each task's script (`padded_actions`), keyed by the prompt the policy sends for it."""
    return {prompt_key(unguided_prompt(t, agent)[1]["content"]): padded_actions(t, turns) for t in tasks}


def serve(spec_path: str) -> None:
    """The model server (run in a subprocess, so that its CPU is not the pipeline's): the next scripted tool
    call of the request's task, after the delay; prints its base_url, stops when stdin closes."""
    from tests.loopback import OpenAIServer, Reply, ToolCall

    spec = json.loads(Path(spec_path).read_text())
    table, delay, jitter = spec["scripts"], spec["delay"], spec.get("jitter", 0.0)
    rng = random.Random(0)  # one sequence for all requests: attempts of one task do not wait alike

    def reply(body: dict) -> Reply:
        actions = table[prompt_key(body["messages"][1]["content"])]
        step = sum(m["role"] == "assistant" for m in body["messages"])
        action = actions[min(step, len(actions) - 1)]
        # a fixed delay keeps attempts started together in step: their test runs all land on the cores at once
        return Reply(tool_calls=(ToolCall(action["name"], action["args"]),),
                     delay=delay * (1 + rng.uniform(-jitter, jitter)))

    server = OpenAIServer(reply)
    with server as base_url:
        print(base_url, flush=True)
        sys.stdin.read()


@dataclass
class Work:
    """What an attempt of a task must cost whatever the pipeline: its scripted tool calls and one test run."""

    turns: int
    seconds: float
    """Wall time of the tool calls and the test run, alone on the machine."""
    cpu: float | None
    """CPU seconds they take inside the container; None where the cgroup cannot be read."""


def measure_work(task: Task, config: RolloutConfig, turns: int) -> Work:
    """Run the task's script and the test command in one sandbox, alone, timing each in its container."""
    script = padded_actions(task, turns)
    with task_sandbox(task, config.sandbox) as sandbox:
        seconds, cpu = 0.0, 0.0
        for action in [*script, {"name": "bash", "args": {"command": task.test_cmd}}]:
            before, start = container_cpu(sandbox.container.id), time.perf_counter()
            execute(sandbox, action["name"], action["args"], timeout=config.test_timeout)
            seconds += time.perf_counter() - start
            after = container_cpu(sandbox.container.id)
            cpu = None if cpu is None or before is None else cpu + after - before
    return Work(len(script), seconds, cpu)


def package(instance_id: str) -> str:
    """The package a demo task was synthesized from (its id's first part), which `Work` is measured per."""
    return instance_id.split("__")[0]


def run_width(tasks: list[Task], work: dict[str, Work], width: int, rounds: int, delay: float, base_url: str,
              out: Path, pool_size: int | None = None, agent: AgentConfig = AgentConfig(),
              grade_workers: int = 0, server_pid: int | None = None, turns: int = 20) -> dict:
    """One batch of width x rounds attempts, `width` at once; its figures."""
    config = RolloutConfig(attempts=math.ceil(width * rounds / len(tasks)), workers=width, agent=agent,
                           grade_workers=grade_workers,
                           pool=PoolConfig(size=pool_size if pool_size is not None else max(2, width // 4)))
    policy = OpenAIPolicy(OpenAIPolicyConfig(model="scripted", base_url=base_url, max_retries=2))
    jobs = plan_jobs(tasks, policy, config, f"w{width}")
    jobs = sorted(jobs, key=lambda j: j.sample_index)[:width * rounds]  # round robin over the tasks
    metered = Metered(task_sandbox)
    before, engine, machine = resource.getrusage(resource.RUSAGE_SELF), engine_cpu(), machine_cpu()
    server = process_cpu(server_pid) if server_pid else None
    calls: list[tuple[float, float, int]] = []  # (start, seconds, thread) of each attempt's agent half
    with Sampler(metered) as sampler, timed(batch_module, "attempt_job", calls):
        folder = Path(tempfile.mkdtemp(prefix=f"w{width}-", dir=out))  # a width asked twice runs twice
        summary = run_batch(jobs, policy, config, folder, f"w{width}", progress=lambda _: None, sandboxes=metered)
    after, engine, machine = resource.getrusage(resource.RUSAGE_SELF), engine_cpu() - engine, machine_cpu() - machine
    server = process_cpu(server_pid) - server if server_pid else None
    trajs = summary.trajectories
    held = holds(calls)
    test_turns = {t.instance_id: test_turn(t, turns) for t in tasks}  # each task's script, padded once
    n = len(jobs)
    own_process = (after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime) - sampler.cpu
    by_task = [work[package(t.instance_id)] for t in trajs]
    containers = metered.cpu_total()
    work_cpu = sum(w.cpu for w in by_task) if all(w.cpu is not None for w in by_task) else None
    container_own = (containers - work_cpu) if containers is not None and work_cpu is not None else None
    own = own_process + (container_own or 0.0)
    walls = [t.wall_time + t.grade_time for t in trajs]
    ideal = width / statistics.mean(w.turns * delay + w.seconds for w in by_task) * 60
    ceiling = os.cpu_count() * 60 / work_cpu * n if work_cpu else None  # the work alone fills every core
    client = docker_client()
    left = client.containers.list(all=True, filters={"label": f"{LABEL}.pid={os.getpid()}"})
    client.close()
    return {
        "width": width, "turns": statistics.mean(len(t.steps) for t in trajs), "attempts": n,
        "seconds": summary.seconds,
        "per_minute": n / summary.seconds * 60, "steady": steady_rate(held, width), "ideal": ideal,
        "hold_s": statistics.mean(s for _, s in held), "hold_middle_s": statistics.mean(middle(held, width)),
        "ceiling": ceiling,
        "own_cpu": own / n, "process_cpu": own_process / n,
        "container_cpu": None if container_own is None else container_own / n,
        "share": own / n / statistics.mean(walls), "engine_cpu": engine / n, "wall": statistics.mean(walls),
        "server_cpu": None if server is None else server / n, "machine_cpu": machine / n,
        "busy": machine / summary.seconds,
        "model_s": statistics.mean(sum(s.policy_latency for s in t.steps) for t in trajs),
        "tools_s": statistics.mean(sum(s.tool_time for s in t.steps) for t in trajs),
        "test_turn_s": statistics.mean([t.steps[test_turns[t.instance_id]].tool_time for t in trajs
                                        if len(t.steps) > test_turns[t.instance_id]] or [0.0]),  # cut short: none
        "grade_s": statistics.mean(t.grade_time for t in trajs),
        "outside_s": statistics.mean(s for _, s in held) - statistics.mean(t.wall_time for t in trajs),
        "take_p50": summary.pool["pool_take_median_ms"] / 1000,
        "take_p99": summary.pool["pool_take_p99_ms"] / 1000,
        "start_p50": percentile(metered.starts, 50), "start_p99": percentile(metered.starts, 99),
        "mem_mib": sampler.memory_per_sandbox / 2**20, "live_peak": sampler.live_peak,
        "threads_peak": sampler.threads_peak, "fds_peak": sampler.fds_peak,
        "infra": sum(bool(t.infra_error) for t in trajs),
        "lost": n - sum(t.resolved for t in trajs),
        "why_lost": sorted(why_lost(t) for t in trajs if not t.resolved),
        "left": len(left), "warm": summary.pool["pool_warm_takes"], "cold": summary.pool["pool_cold_takes"],
    }


@contextlib.contextmanager
def timed(module, name: str, spans: list[tuple[float, float, int]]):
    """Within the block, each call of `module.name` appends its (start, wall seconds, thread) to `spans`."""
    original = getattr(module, name)

    def wrapper(*args, **kwargs):
        start = time.perf_counter()
        try:
            return original(*args, **kwargs)
        finally:
            spans.append((start, time.perf_counter() - start, threading.get_ident()))

    setattr(module, name, wrapper)
    try:
        yield
    finally:
        setattr(module, name, original)


def holds(calls: list[tuple[float, float, int]]) -> list[tuple[float, float]]:
    """(start, seconds) of each attempt's hold on its worker: from its start to its worker's next attempt's (what
    the worker did in between counts: handing the patch to a grader, or waiting while the grades are behind), its
    own length for a worker's last attempt."""
    by_thread: dict[int, list[tuple[float, float]]] = {}
    for start, seconds, thread in sorted(calls):
        by_thread.setdefault(thread, []).append((start, seconds))
    held = []
    for spans in by_thread.values():
        ends = [start for start, _ in spans[1:]] + [spans[-1][0] + spans[-1][1]]
        held += [(start, end - start) for (start, _), end in zip(spans, ends)]
    return sorted(held)


def middle(spans: list[tuple[float, float]], width: int) -> list[float]:
    """The seconds of the batch's middle attempts: in start order, all but the first and the last `width` (all
    when that leaves none). The first wave starts W sandboxes and W conversations at once, whose test runs then
    land together; the last runs on a machine that empties as its workers finish. Around the middle ones every
    worker is busy, as around all but a few thousandths of a nightly batch's attempts."""
    ordered = [seconds for _, seconds in sorted(spans)]
    return ordered[width:len(ordered) - width] or ordered


def steady_rate(spans: list[tuple[float, float]], width: int) -> float | None:
    """Attempts a minute that `width` busy workers sustain: width / the mean seconds a middle attempt (`middle`)
    holds its worker (`holds`: its sandbox take, its agent loop and its hand-off to a grader; the grade
    runs on a grader thread): Little's law."""
    return width / statistics.mean(middle(spans, width)) * 60 if spans else None


def why_lost(t) -> str:
    """An unresolved attempt's exit status, grade reason or infra error, error, and the tests that failed."""
    report = json.loads(t.report or "{}")
    failed = [name for kind in ("FAIL_TO_PASS", "PASS_TO_PASS") for name in report.get(kind, {}).get("failure", [])]
    return (f"{t.instance_id} #{t.sample_index}: {t.exit_status}, {t.grade_reason or t.infra_error}"
            f"{' ' + t.error[:300] if t.error else ''}{f'; failed: {failed[:5]}' if failed else ''}")


def measure(tasks: list[Task], widths: list[int], delay: float, rounds: int, pool_size: int | None = None,
            report=print, turns: int = 20, jitter: float = 0.0, grade_workers: int = 0) -> list[dict]:
    """The whole benchmark: the work measured alone, then a batch per width against the scripted server."""
    agent = AgentConfig(max_steps=max(AgentConfig.max_steps, turns))  # a long script must reach its submit
    config = RolloutConfig(agent=agent)
    firsts = {package(t.instance_id): t for t in reversed(tasks)}
    work = {repo: measure_work(t, config, turns) for repo, t in firsts.items()}
    for repo, w in work.items():
        report(f"work alone, {repo}: {w.turns} turns, {w.seconds:.2f} s of commands and tests, "
               f"{'n/a' if w.cpu is None else f'{w.cpu:.2f}'} CPU s")
    with tempfile.TemporaryDirectory() as tmp:
        spec = Path(tmp) / "spec.json"
        spec.write_text(json.dumps({"delay": delay, "jitter": jitter, "scripts": scripts(tasks, agent, turns)}))
        server = subprocess.Popen([sys.executable, __file__, "--serve", str(spec)], stdin=subprocess.PIPE,
                                  stdout=subprocess.PIPE, text=True)
        try:
            base_url = server.stdout.readline().strip()
            rows = []
            for width in widths:
                rows.append(run_width(tasks, work, width, rounds, delay, base_url, Path(tmp), pool_size,
                                      agent, grade_workers, server.pid, turns))
                report(line(rows[-1]))
                for why in rows[-1]["why_lost"]:
                    report(f"  not resolved: {why}")
        finally:
            server.stdin.close()
            server.wait(timeout=30)
    return rows


HEADER = ("W", "turns", "att/min", "steady att/min", "ideal", "ratio", "steady ratio", "hold s (all / middle)",
          "CPU ceiling", "own CPU s",
          "proc s", "cont s", "own/wall", "engine s", "server s", "machine s", "busy cores", "wall s", "model s",
          "tools s", "of it the test turn s", "grade s", "hold outside the loop s", "take p50 ms",
          "take p99 ms", "start p50 s", "start p99 s", "MiB/sbx", "live", "threads", "fds", "infra", "lost", "left",
          "warm/cold takes")


def line(r: dict) -> str:
    """One width's figures, in HEADER's order."""
    steady = r["steady"]
    values = (r["width"], r["turns"], r["per_minute"], steady, r["ideal"], r["per_minute"] / r["ideal"],
              None if steady is None else steady / r["ideal"], f"{r['hold_s']:.1f} / {r['hold_middle_s']:.1f}",
              r["ceiling"],
              r["own_cpu"], r["process_cpu"], r["container_cpu"], r["share"], r["engine_cpu"],
              r["server_cpu"], r["machine_cpu"], r["busy"], r["wall"],
              r["model_s"], r["tools_s"], r["test_turn_s"], r["grade_s"], r["outside_s"],
              r["take_p50"] * 1000, r["take_p99"] * 1000,
              r["start_p50"], r["start_p99"], r["mem_mib"],
              r["live_peak"], r["threads_peak"], r["fds_peak"], r["infra"], r["lost"], r["left"],
              f"{r['warm']}/{r['cold']}")
    return " | ".join("n/a" if v is None else f"{v}" if isinstance(v, (int, str)) else f"{v:.3f}" for v in values)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tasks", default="data/tasks/tasks.parquet")
    parser.add_argument("--widths", default="4,8,16,32,64")
    parser.add_argument("--delay", type=float, default=2.0, help="seconds the server takes per turn")
    parser.add_argument("--jitter", type=float, default=0.0,
                        help="each turn's delay drawn from delay x [1 - jitter, 1 + jitter] (mean: the delay)")
    parser.add_argument("--rounds", type=int, default=4, help="attempts per worker in each batch")
    parser.add_argument("--turns", type=int, default=20,
                        help="turns an attempt takes: the 5-turn expert script padded with read-only calls "
                             "(real attempts take 20-100); 0 or fewer than the script: the bare script")
    parser.add_argument("--pool-size", type=int, default=None, help="the warm pool's size (default W/4, >= 2)")
    parser.add_argument("--grade-workers", type=int, default=0,
                        help="rollout.grade_workers: grades at once beside the attempts (0, the default: one per core)")
    parser.add_argument("--serve", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve:
        return serve(args.serve)
    # read as rows, not through the stored contract: a task of an older schema lacks only columns that the
    # validation adds (Task.from_row gives them their defaults), none of which a rollout reads
    tasks = [Task.from_row(r) for r in pq.read_table(args.tasks).to_pylist()]
    if not 0 <= args.jitter < 1:
        parser.error(f"--jitter {args.jitter}: a turn's delay would reach 0 or below; give a value in [0, 1)")
    print(f"{len(tasks)} tasks; delay {args.delay} s a turn (+-{args.jitter:.0%}); "
          f"{args.turns or 'bare script'} turns; "
          f"{args.rounds} attempts per worker; {args.grade_workers or os.cpu_count()} grades at once; "
          f"{os.cpu_count()} cores")
    print(" | ".join(HEADER))
    measure(tasks, [int(w) for w in args.widths.split(",")], args.delay, args.rounds, args.pool_size,
            turns=args.turns, jitter=args.jitter, grade_workers=args.grade_workers)


if __name__ == "__main__":
    main()
