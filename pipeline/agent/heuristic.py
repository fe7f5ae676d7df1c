"""HeuristicPolicy: the offline baseline that needs no model.

It uses only the tools any policy has: runs the tests, reads the failure, opens the code it
points at (or the function named like the failing test), tries a bounded number of
single-line repairs near it (the inverse of common bugs: a flipped comparison, a constant
off by one, `and`/`or`, a stray `not`, ...; pipeline/agent/repairs.py), re-runs the failing test, and submits. It
follows guidance when given: a reference action prefix is replayed first, and files,
functions and lines a teacher names are searched first. An honest baseline: it solves
what those repairs can reach and nothing else.

The policy keeps no state between calls: each turn replays a deterministic program over the
observations so far, so one instance serves any number of concurrent attempts.
"""

from __future__ import annotations

import json
import random
import re
from dataclasses import asdict, dataclass
from typing import Generator

from pipeline.agent.policy import AssistantTurn, PolicyIdentity, Usage
from pipeline.agent.repairs import code_lines, line_repairs
from pipeline.core.vocab import HINT_HEADER

# The heuristic's test runs print nothing that changes from run to run (pytest's timing, object addresses, hash
# order): two rollouts of one seed see the same bytes, so a model trained on its trajectories meets the observations
# it was trained on when it repeats the actions. pipefail: the tool reports pytest's exit code, not the filters'.
STEADY = r"sed -E 's/^([0-9]+ [a-z].*) in [0-9.]+s( \([0-9:]+\))?$/\1/; s/0x[0-9a-f]{6,}/0x?/g'"


def pytest_command(args: str, lines: int) -> str:
    """A test run, without pytest's unraisable-exception plugin: its five gc.collect() at exit were a quarter of
    a one-test toolz run."""
    return (f"(set -o pipefail; PYTHONHASHSEED=0 python -m pytest {args} -p no:cacheprovider "
            f"-p no:unraisableexception 2>&1 | {STEADY} | tail -n {lines})")


SUITE = pytest_command("-x -q --tb=short", 80)
IDENTITY = PolicyIdentity("", temperature=0.0, top_p=1.0, top_k=0)
"""No model ('' as Trajectory.policy_model says); a deterministic program, stored as greedy (temperature 0)."""
TOOL_WORDS = {"bash", "edit", "view", "view_range", "create", "str_replace", "insert", "submit", "old_str"}
@dataclass(frozen=True)
class HeuristicConfig:
    """Bounds of the heuristic's search."""

    max_repairs: int = 6
    """Single-line repairs tried per attempt (each costs an edit and a test run)."""
    window: int = 6
    """Lines either side of the failure point searched for repairs."""
    max_targets: int = 3
    """Code locations (traceback frames, functions named like the test) opened per attempt."""
    function_lines: int = 60
    """Lines of a function searched when the failure points at the function, not a line."""


@dataclass(frozen=True)
class Action:
    name: str
    arguments: dict
    thought: str


@dataclass(frozen=True)
class Target:
    path: str
    line: int = 0
    """Line the failure points at (0: find `function` first)."""
    function: str = ""
    whole_function: bool = False
    """Search the whole function starting at `line`, not just the lines around it."""


class HeuristicPolicy:
    """A scripted, seedable baseline policy; labelled 'heuristic' wherever its trajectories appear."""

    name = "heuristic"
    native_tools = True

    def __init__(self, config: HeuristicConfig | None = None):
        self.config = config or HeuristicConfig()

    def settings(self) -> dict:
        return {"kind": "heuristic", **asdict(self.config)}

    def act(self, messages: list[dict], tools: list[dict], *, seed: int | None = None) -> AssistantTurn:
        turn = sum(1 for m in messages if m["role"] == "assistant")
        attempt_seed = 0 if seed is None else (seed - turn) % 2**31  # undoes the loop's per-step seed
        prompt = next(m["content"] for m in messages if m["role"] == "user")
        observations = [m.get("content") or "" for m in messages if m["role"] == "tool"]
        action = replay(program(prompt, random.Random(attempt_seed), self.config), observations)
        call = {"id": f"call_{turn}", "type": "function",
                "function": {"name": action.name, "arguments": json.dumps(action.arguments)}}
        return AssistantTurn(message={"role": "assistant", "content": action.thought, "tool_calls": [call]},
                             usage=Usage(0, 0), finish_reason="tool_calls", identity=IDENTITY)


def replay(gen: Generator[Action, str, None], observations: list[str]) -> Action:
    """The program's next action after feeding it the observations so far."""
    action = next(gen)
    for obs in observations:
        try:
            action = gen.send(obs)
        except StopIteration:
            break
    return action


def bash(command: str, thought: str) -> Action:
    return Action("bash", {"command": command}, thought)


def program(prompt: str, rng: random.Random, cfg: HeuristicConfig) -> Generator[Action, str, None]:
    """The heuristic's whole attempt as a generator of actions, each sent its observation."""
    workdir = _workdir(prompt)
    for name, args in action_hint(prompt):
        if name == "submit":
            yield Action("submit", {}, narrate(name, args))
            return
        yield Action(name, args, narrate(name, args))
    out = yield bash(f"cd {workdir} && {SUITE}", "Run the test suite to see what fails.")
    test = failing_test(out)
    if test is None:
        yield Action("submit", {}, "The tests pass; nothing to fix.")
        return
    tried = 0
    for target in (yield from resolve_targets(prompt, out, test, workdir, cfg)):
        for old, new in (yield from repair_candidates(target, rng, cfg)):
            if tried >= cfg.max_repairs:
                break
            tried += 1
            out = yield Action("edit", {"command": "str_replace", "path": target.path, "old_str": old,
                                        "new_str": new}, "Try a one-line repair near the failure.")
            if "rror" in out.split("\n", 1)[0]:
                continue
            out = yield bash(pytest_command(f"-q '{test}'", 5),
                             "Re-run the failing test.")
            if _passed(out):
                out = yield bash(SUITE, "The test passes; run the whole suite.")
                if failing_test(out) is None:
                    yield Action("submit", {}, "All tests pass.")
                    return
            yield bash(f"git checkout -q -- '{target.path}'", "That did not fix it; undo.")
    yield Action("submit", {}, "Out of ideas; submitting what I have.")


def narrate(name: str, args: dict) -> str:
    """What the heuristic says before an action it replays: what it would say doing it unguided, never
    where the action came from (a completion is trained under the prompt without the hint)."""
    command, path = str(args.get("command", "")), str(args.get("path", ""))
    if name == "submit":
        return "Submitting the fix."
    if name == "edit" and command == "view":
        start = (args.get("view_range") or [1])[0]
        return f"Open {path} around line {start}."
    if name == "edit":
        old, new = str(args.get("old_str", "")).split("\n"), str(args.get("new_str", "")).split("\n")
        changed = sum(a != b for a, b in zip(old, new)) + abs(len(old) - len(new))
        return "Try a one-line repair near the failure." if changed == 1 else f"Repair {path}."
    if "pytest" in command:
        return "Re-run the failing test." if "::" in command else "Run the test suite to see what fails."
    if "git checkout" in command:
        return "That did not fix it; undo."
    match = re.search(r"grep\b.*?(?:def )?(\w+)\b['\"]?\s+(?:--include|\.|\|)", command)
    return f"Find the code for {match.group(1)}." if match else "Look around the repository."


def resolve_targets(prompt: str, out: str, test: str, workdir: str,
                    cfg: HeuristicConfig) -> Generator[Action, str, list[Target]]:
    """Where to look: named by guidance first, then traceback frames, then functions named like the test."""
    targets = guided_targets(prompt) + traceback_targets(out)
    names = [t.function for t in targets if t.function and not t.line]
    names += _names_from_test(test)
    found: list[Target] = [t for t in targets if t.line]
    for name in dict.fromkeys(names):
        if len(found) >= cfg.max_targets:
            break
        grep = yield bash(f"cd {workdir} && grep -rn --include='*.py' -E '^\\s*def {name}\\(' . "
                          "| grep -v -E '/tests?/|/test_' | head -n 3", f"Find the function {name}.")
        for match in re.finditer(r"^\./(\S+?\.py):(\d+):", grep, re.M):
            found.append(Target(match.group(1), int(match.group(2)), name, whole_function=True))
    return _unique(found)[: cfg.max_targets]


def repair_candidates(target: Target, rng: random.Random,
                      cfg: HeuristicConfig) -> Generator[Action, str, list[tuple[str, str]]]:
    """(old, new) text pairs: nearest lines to the failure first (a whole function is one tier), shuffled."""
    in_function = target.whole_function
    start = target.line if in_function else max(1, target.line - cfg.window)
    end = target.line + (cfg.function_lines if in_function else cfg.window)
    view = yield Action("edit", {"command": "view", "path": target.path, "view_range": [start, end]},
                        f"Open {target.path} around line {target.line}.")
    lines = {int(m.group(1)): m.group(2) for m in re.finditer(r"^\s*(\d+)\t(.*)$", view, re.M)}
    by_distance: dict[int, list[tuple[str, str]]] = {}
    for number in code_lines(lines, function_start=target.line if in_function else 0):
        if number - 1 in lines and number + 1 in lines:
            context = [lines[number - 1], lines[number], lines[number + 1]]
            tier = 0 if in_function else abs(number - target.line) // 3
            for new in line_repairs(lines[number]):
                by_distance.setdefault(tier, []).append(
                    ("\n".join(context), "\n".join([context[0], new, context[2]])))
    ordered = []
    for tier in sorted(by_distance):
        group = by_distance[tier]
        rng.shuffle(group)
        ordered += group
    return ordered


def action_hint(prompt: str) -> list[tuple[str, dict]]:
    """The actions of an ActGuide 'Reference action trajectory hint:' block, in order."""
    if HINT_HEADER not in prompt:
        return []
    actions = []
    for match in re.finditer(r"^\d+\. (\w+): (\{.*\})\s*$", prompt.split(HINT_HEADER, 1)[1], re.M):
        try:
            actions.append((match.group(1), json.loads(match.group(2))))
        except json.JSONDecodeError:
            continue
    return actions


def guided_targets(prompt: str) -> list[Target]:
    """Files, functions and lines a teacher's guidance names (`path.py`, `function`, line N)."""
    if "Guidance" not in prompt:
        return []
    text = prompt.split("Guidance", 1)[1]
    paths = re.findall(r"`([\w/.-]+\.py)`", text)
    functions = [f for f in re.findall(r"`(\w+)(?:\(\))?`", text) if f not in TOOL_WORDS]
    lines = [int(n) for n in re.findall(r"\bline (\d+)", text)]
    targets = [Target(p, n) for p in paths[:1] for n in lines[:1]]
    return targets + [Target(paths[0] if paths else "", 0, f) for f in functions]


def traceback_targets(out: str) -> list[Target]:
    frames = re.findall(r"^([\w/.-]+\.py):(\d+): in (\w+)", out, re.M)
    return [Target(p, int(n), f) for p, n, f in reversed(frames) if not _is_test_path(p)]


def failing_test(out: str) -> str | None:
    match = re.search(r"^(?:FAILED|ERROR) (\S+::\S+)", out, re.M)
    return match.group(1) if match else None


def _passed(out: str) -> bool:
    return bool(re.search(r"\b\d+ passed\b", out)) and not re.search(r"\b\d+ (failed|error)", out)


def _names_from_test(test: str) -> list[str]:
    name = test.split("::")[-1].split("[")[0]
    parts = name.removeprefix("test_").split("_")
    return ["_".join(parts[:i]) for i in range(len(parts), 0, -1) if parts[:i] != [""]]


def _is_test_path(path: str) -> bool:
    return bool(re.search(r"(^|/)(tests?/|test_[^/]*$|conftest\.py$)", path))


def _unique(targets: list[Target]) -> list[Target]:
    seen, out = set(), []
    for t in targets:
        if t.path and (t.path, t.line) not in seen:
            seen.add((t.path, t.line))
            out.append(t)
    return out


def _workdir(prompt: str) -> str:
    match = re.search(r"checked out at (\S+?)\.?\s", prompt)
    return match.group(1) if match else "."
