"""Bug candidates from AST mutations: every kind, minimal edits, patches that `git apply` takes."""

from __future__ import annotations

import ast
import subprocess
from pathlib import Path

import pytest

from pipeline.synthesis.candidates import MUTATION_KINDS, BugCandidate, collect_candidates, generate_candidates
from pipeline.synthesis.patches import bug_patch, gold_patch

SAMPLE = '''\
"""A small toolz-like module used to exercise the mutators."""

import functools

# Sentinel for "no default given".
no_default = object()


def partition(n, seq, pad=no_default):
    """Partition seq into tuples of length n."""
    result = []
    chunk = []
    for item in seq:
        chunk.append(item)  # keep order
        if len(chunk) == n:
            result.append(tuple(chunk))
            chunk = []
    if chunk and pad is not no_default:
        chunk.extend([pad] * (n - len(chunk)))
        result.append(tuple(chunk))
    return result


def sliding_window(n, seq):
    """Windows of n consecutive items."""
    items = list(seq)
    windows = []
    for i in range(len(items) - n + 1):
        windows.append(tuple(items[i:i + n]))
    return windows


def clamp(value, low, high):
    if value < low:
        return low
    elif value > high:
        return high
    return value


def mean_gap(values, strict=True):
    total = 0
    count = 0
    for a, b in zip(values, values[1:]):
        total += b - a
        count += 1
    if count == 0 or not strict:
        return 0.0
    return total / count


class Counter:
    """Counts hashable items."""

    def __init__(self, items=()):
        self.counts = {}
        self.total = 0
        for item in items:
            self.add(item)

    @functools.lru_cache(maxsize=None)  # decorators stay untouched
    def describe(self, verbose=False):
        label = "verbose" if verbose else "short"
        if verbose:
            text = f"{self.total} items"
        else:
            text = str(self.total)
        return label + ": " + text

    def add(self, item, times=1):
        while times > 0:
            self.counts[item] = self.counts.get(item, 0) + 1
            self.total = self.total + 1
            times -= 1
        return self.counts[item]

    def most_common(self, k=None):
        ranked = sorted(self.counts.items(), key=lambda kv: -kv[1])
        if k is None:
            return ranked
        return ranked[:k]

    def __repr__(self):
        name = type(self).__name__
        body = ", ".join(f"{k!r}: {v}" for k, v in self.counts.items())
        return f"{name}({{{body}}})"
'''
# Expression kinds on SAMPLE touch one line each: the splice keeps the rest of the line as written.
ONE_LINE_KINDS = {"flip_comparison", "change_constant", "off_by_one", "swap_operands", "negate_condition",
                  "break_boolean", "drop_return_value", "change_operator"}
TEST_FILES = {"toolz/test_itertoolz.py": SAMPLE, "toolz/conftest.py": SAMPLE, "tests/test_core.py": SAMPLE,
              "toolz/core_test.py": SAMPLE}


def make_repo(root: Path, text: str = SAMPLE, name: str = "toolz/itertoolz.py") -> Path:
    """A repository with the sample module and test files that must never be mutated."""
    for relative, content in {name: text, **TEST_FILES}.items():
        (root / relative).parent.mkdir(parents=True, exist_ok=True)
        (root / relative).write_bytes(content.encode())
    return root


def function_lines(source: str, qualname: str) -> tuple[int, int]:
    """1-based (def line, end line) of a function or method."""
    for node in ast.parse(source).body:
        members = node.body if isinstance(node, ast.ClassDef) else []
        methods = [(f"{node.name}.{getattr(m, 'name', '')}", m) for m in members]
        for name, func in [(getattr(node, "name", ""), node), *methods]:
            if isinstance(func, ast.FunctionDef) and name == qualname:
                return func.lineno, func.end_lineno
    raise LookupError(qualname)


def git(cwd: Path, *args: str, stdin: str | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(["git", *args], cwd=cwd, input=stdin, capture_output=True, text=True, check=True)


def all_candidates(root: Path) -> list[BugCandidate]:
    return generate_candidates(root, include=["toolz/**/*.py", "tests/*.py"], max_per_function=1000)


@pytest.mark.parametrize("kind", MUTATION_KINDS)
def test_every_kind_makes_a_compiling_candidate(tmp_path, kind):
    candidates = generate_candidates(make_repo(tmp_path), include=["toolz/**/*.py"], kinds={kind}, max_per_function=100)
    assert candidates
    for candidate in candidates:
        assert candidate.kind == kind
        assert candidate.mutated_source != candidate.original_source
        compile(candidate.mutated_source, candidate.file, "exec")


def test_only_the_mutated_function_changes(tmp_path):
    for candidate in all_candidates(make_repo(tmp_path)):
        start, end = function_lines(candidate.original_source, candidate.function)
        before = candidate.original_source.splitlines()
        after = candidate.mutated_source.splitlines()
        tail = len(before) - end
        assert after[: start - 1] == before[: start - 1], candidate.description
        assert after[len(after) - tail :] == before[end:], candidate.description
        assert start <= candidate.lineno <= end


def test_expression_kinds_change_one_line(tmp_path):
    for candidate in all_candidates(make_repo(tmp_path)):
        if candidate.kind in ONE_LINE_KINDS:
            changed = [line for line in bug_patch(candidate).splitlines()[3:] if line.startswith(("+", "-"))]
            assert len(changed) == 2, bug_patch(candidate)


def test_test_files_are_never_mutated(tmp_path):
    files = {candidate.file for candidate in all_candidates(make_repo(tmp_path))}
    assert files == {"toolz/itertoolz.py"}


def test_skips_short_functions_and_protocol_dunders(tmp_path):
    functions = {candidate.function for candidate in all_candidates(make_repo(tmp_path))}
    assert "Counter.__init__" in functions
    assert "Counter.__repr__" not in functions
    assert "clamp" in functions


@pytest.mark.parametrize(
    "text",
    [SAMPLE, SAMPLE.replace("\n", "\r\n"), SAMPLE.rstrip("\n"), SAMPLE.replace("    ", "\t")],
    ids=["lf", "crlf", "no-final-newline", "tabs"],
)
def test_patches_apply_with_git(tmp_path, text):
    repo = make_repo(tmp_path / "repo", text)
    git(repo, "init", "-q")
    path = repo / "toolz/itertoolz.py"
    candidates, stats = collect_candidates(repo, include=["toolz/*.py"], max_per_function=1000)
    assert {c.kind for c in candidates} == set(MUTATION_KINDS)
    assert sum(stats.compiled.values()) == len(candidates)
    for candidate in {c.kind: c for c in candidates}.values():  # one of each kind keeps git calls few
        assert candidate.original_source == text
        git(repo, "apply", "-", stdin=bug_patch(candidate))
        assert path.read_bytes().decode() == candidate.mutated_source, candidate.description
        git(repo, "apply", "-", stdin=gold_patch(candidate))
        assert path.read_bytes().decode() == text, candidate.description


def test_gold_patch_headers(tmp_path):
    candidate = all_candidates(make_repo(tmp_path))[0]
    assert gold_patch(candidate).splitlines()[:3] == [
        "diff --git a/toolz/itertoolz.py b/toolz/itertoolz.py",
        "--- a/toolz/itertoolz.py",
        "+++ b/toolz/itertoolz.py",
    ]


def test_deterministic_under_a_seed(tmp_path):
    root = make_repo(tmp_path)
    first = generate_candidates(root, include=["toolz/*.py"], seed=7, limit=15)
    again = generate_candidates(root, include=["toolz/*.py"], seed=7, limit=15)
    other = generate_candidates(root, include=["toolz/*.py"], seed=8, limit=15)
    assert first == again
    assert [c.candidate_id for c in first] != [c.candidate_id for c in other]
    assert len({c.candidate_id for c in all_candidates(root)}) == len(all_candidates(root))


def test_round_robin_covers_every_kind_first(tmp_path):
    candidates = generate_candidates(make_repo(tmp_path), include=["toolz/*.py"], limit=len(MUTATION_KINDS))
    assert sorted(c.kind for c in candidates) == sorted(MUTATION_KINDS)


def test_max_per_function(tmp_path):
    candidates = generate_candidates(make_repo(tmp_path), include=["toolz/*.py"], max_per_function=2)
    per_function: dict[str, int] = {}
    for candidate in candidates:
        per_function[candidate.function] = per_function.get(candidate.function, 0) + 1
    assert max(per_function.values()) == 2
    assert len(per_function) >= 7


def test_decorated_method_keeps_its_decorator(tmp_path):
    candidates = generate_candidates(make_repo(tmp_path), include=["toolz/*.py"], max_per_function=100)
    described = [c for c in candidates if c.function == "Counter.describe"]
    assert described
    for candidate in described:
        assert "    @functools.lru_cache(maxsize=None)  # decorators stay untouched\n" in candidate.mutated_source


def test_unknown_kind_is_refused(tmp_path):
    with pytest.raises(ValueError, match="unknown mutation kinds"):
        generate_candidates(make_repo(tmp_path), include=["toolz/*.py"], kinds={"flip_everything"})
