"""Bug candidates: procedural AST mutations of a package's functions (SWE-smith style).

Each candidate changes one site in one function; only that function's lines differ from
the original file. The gold patch is the reverse of the mutation.
"""

from __future__ import annotations

import ast
import copy
import hashlib
import random
from collections import Counter, defaultdict
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from itertools import zip_longest
from pathlib import Path, PurePosixPath
from typing import TypeVar

from pipeline.synthesis.mutation_kinds import MUTATION_KINDS, MUTATORS_BY_KIND, NodePath, node_at, replace_at, walk_body
from pipeline.synthesis.pyparse import parse_python
from pipeline.synthesis.splice import FuncNode, normal_dump, source_lines, splice

ALLOWED_DUNDERS = frozenset(
    {"__init__", "__call__", "__getitem__", "__setitem__", "__contains__", "__iter__", "__next__"}
)
MIN_STATEMENTS = 3
TEST_DIRS = frozenset({"test", "tests", "testing"})

T = TypeVar("T")


@dataclass(frozen=True)
class BugCandidate:
    """One mutation of one function, with the whole file before and after."""

    file: str
    """Path relative to the repository root, POSIX separators."""
    function: str
    """Qualified name, e.g. 'Class.method'."""
    kind: str
    """A mutation kind from `MUTATION_KINDS`."""
    lineno: int
    """1-based line of the mutated node in the original file."""
    original_source: str
    mutated_source: str
    description: str
    """Internal and short: what changed where. Never shown to the agent."""
    candidate_id: str
    """Stable: a hash of file, function, kind, line and site index."""


@dataclass
class CandidateStats:
    """Per-kind counts of mutations generated and of those whose file still compiles."""

    generated: Counter[str] = field(default_factory=Counter)
    compiled: Counter[str] = field(default_factory=Counter)
    files: int = 0
    functions: int = 0
    """Functions eligible for mutation (enough statements, not a skipped dunder)."""
    unreadable_files: list[str] = field(default_factory=list)
    """Files that are not UTF-8 or do not parse."""


@dataclass(frozen=True)
class _Site:
    file: str
    function: str
    func_path: NodePath
    kind: str
    path: NodePath
    """From the function node down to the mutated node."""
    index: int
    """Position among the function's sites of this kind."""
    lineno: int


@dataclass(frozen=True)
class _Module:
    text: str
    lines: list[str]
    tree: ast.Module
    original_dumps: dict[NodePath, str] = field(default_factory=dict)
    """normal_dump of each function, by path, filled as sites are mutated."""


def is_test_file(relative: PurePosixPath) -> bool:
    """Whether a source file is a test or lives in a test or hidden directory."""
    name = relative.name
    dirs = relative.parts[:-1]
    return (
        name.startswith("test_") or name.endswith("_test.py") or name == "conftest.py"
        or any(part in TEST_DIRS or part.startswith(".") for part in dirs)
    )


def source_files(repo_root: Path, include: Iterable[str]) -> list[str]:
    """Non-test .py files matching the include globs, relative to repo_root, sorted."""
    found = set()
    for pattern in include:
        for path in repo_root.glob(pattern):
            relative = PurePosixPath(path.relative_to(repo_root).as_posix())
            if path.suffix == ".py" and path.is_file() and not is_test_file(relative):
                found.add(str(relative))
    return sorted(found)


def functions(tree: ast.Module) -> Iterator[tuple[str, NodePath, FuncNode]]:
    """(qualified name, path, node) of module functions and methods, nested classes included."""
    yield from _functions(tree, (), "")


def _functions(node: ast.AST, path: NodePath, prefix: str) -> Iterator[tuple[str, NodePath, FuncNode]]:
    for name in ("body", "orelse", "finalbody", "handlers"):
        for i, child in enumerate(getattr(node, name, [])):
            child_path = path + ((name, i),)
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                yield prefix + child.name, child_path, child
            elif isinstance(child, ast.ClassDef):
                yield from _functions(child, child_path, f"{prefix}{child.name}.")
            elif isinstance(child, (ast.If, ast.Try, ast.With, ast.ExceptHandler)):
                yield from _functions(child, child_path, prefix)


def eligible(func: FuncNode) -> bool:
    """Whether a function is worth mutating: enough statements, not a protocol dunder."""
    name = func.name
    if name.startswith("__") and name.endswith("__") and name not in ALLOWED_DUNDERS:
        return False
    statements = sum(isinstance(node, ast.stmt) for node in ast.walk(func)) - 1
    has_docstring = ast.get_docstring(func, clean=False) is not None
    return statements - has_docstring >= MIN_STATEMENTS


def _function_sites(file: str, qualname: str, func_path: NodePath, func: FuncNode, kinds: Iterable[str]) -> list[_Site]:
    """Every (kind, node) in the function's body that a mutation applies to, in source order."""
    nodes = list(walk_body(func))
    sites = []
    for kind in kinds:
        applies = MUTATORS_BY_KIND[kind].applies
        matches = [(path, node) for path, node, parent, name in nodes if applies(node, parent, name)]
        sites += [
            _Site(file, qualname, func_path, kind, path, index, node.lineno)
            for index, (path, node) in enumerate(matches)
        ]
    return sites


def _round_robin(groups: list[list[T]]) -> list[T]:
    missing = object()
    return [item for layer in zip_longest(*groups, fillvalue=missing) for item in layer if item is not missing]


def _grouped(items: list[_Site], key: Callable[[_Site], object]) -> list[list[_Site]]:
    groups: dict[object, list[_Site]] = defaultdict(list)
    for item in items:
        groups[key(item)].append(item)
    return list(groups.values())


def _sampling_order(sites: list[_Site], seed: int) -> list[_Site]:
    """Sites interleaved so kinds alternate, and within a kind files and functions alternate."""
    rng = random.Random(seed)
    per_kind = []
    for kind_sites in _grouped(sorted(sites, key=lambda s: MUTATION_KINDS.index(s.kind)), lambda s: s.kind):
        per_file = []
        for file_sites in _grouped(kind_sites, lambda s: s.file):
            per_function = _grouped(file_sites, lambda s: (s.function, s.func_path))
            for group in per_function:
                rng.shuffle(group)
            rng.shuffle(per_function)
            per_file.append(_round_robin(per_function))
        rng.shuffle(per_file)
        per_kind.append(_round_robin(per_file))
    rng.shuffle(per_kind)  # so that a small limit does not always pick the same kinds
    return _round_robin(per_kind)


def _stable_int(key: str) -> int:
    return int(hashlib.sha256(key.encode()).hexdigest()[:12], 16)


def _brief(node: ast.AST | list[ast.stmt]) -> str:
    if isinstance(node, list) and len(node) == 1 and isinstance(node[0], ast.If):
        return "(branches swapped)"
    text = "; ".join(ast.unparse(n) for n in node) if isinstance(node, list) else ast.unparse(node)
    text = text.splitlines()[0] if text else "(removed)"
    return text if len(text) <= 60 else text[:57] + "..."


def _compiles(text: str, filename: str) -> bool:
    try:
        compile(text, filename, "exec", dont_inherit=True)
    except (SyntaxError, ValueError):
        return False
    return True


def _mutate_site(site: _Site, module: _Module, stats: CandidateStats) -> BugCandidate | None:
    """The candidate for one site, or None when the mutation is a no-op or breaks the file."""
    key = f"{site.file}:{site.function}:{site.kind}:{site.lineno}:{site.index}"
    func = node_at(module.tree, site.func_path)
    mutated = copy.deepcopy(func)
    original = node_at(func, site.path)
    try:
        new = MUTATORS_BY_KIND[site.kind].mutate(node_at(mutated, site.path), _stable_int(key))
        new = replace_at(mutated, site.path, new)
        expected = normal_dump(mutated)
        if site.func_path not in module.original_dumps:
            module.original_dumps[site.func_path] = normal_dump(func)
        if expected == module.original_dumps[site.func_path]:
            return None
        stats.generated[site.kind] += 1
        text = splice(module.lines, func, mutated, site.path, original, new, expected)
        description = f"{site.kind} in {site.function} (line {site.lineno}): {_brief(original)} -> {_brief(new)}"
    except (ValueError, SyntaxError, RecursionError):  # ast.unparse gives up on some f-strings and deep nesting
        return None
    if text is None or not _compiles(text, site.file):
        return None
    stats.compiled[site.kind] += 1
    return BugCandidate(
        site.file, site.function, site.kind, site.lineno, module.text, text, description,
        hashlib.sha256(key.encode()).hexdigest()[:16],
    )


def _read_module(path: Path) -> _Module | None:
    try:
        with path.open(encoding="utf-8", newline="") as handle:
            text = handle.read()
        return _Module(text, source_lines(text), parse_python(text))
    except (UnicodeDecodeError, SyntaxError, ValueError):
        return None


def collect_candidates(
    repo_root: Path,
    *,
    include: list[str],
    kinds: set[str] | None = None,
    max_per_function: int = 3,
    seed: int = 0,
    limit: int | None = None,
) -> tuple[list[BugCandidate], CandidateStats]:
    """Bug candidates from the repository's source files, and counts of what was tried."""
    unknown = set(kinds or ()) - set(MUTATION_KINDS)
    if unknown:
        raise ValueError(f"unknown mutation kinds {sorted(unknown)}; choose from {list(MUTATION_KINDS)}")
    if max_per_function < 1:
        raise ValueError(f"max_per_function must be at least 1, got {max_per_function}")
    chosen = [kind for kind in MUTATION_KINDS if kinds is None or kind in kinds]
    stats = CandidateStats()
    modules: dict[str, _Module] = {}
    sites: list[_Site] = []
    for file in source_files(repo_root, include):
        module = _read_module(repo_root / file)
        if module is None:
            stats.unreadable_files.append(file)
            continue
        modules[file] = module
        stats.files += 1
        for qualname, func_path, func in functions(module.tree):
            if eligible(func):
                stats.functions += 1
                sites += _function_sites(file, qualname, func_path, func, chosen)
    candidates: list[BugCandidate] = []
    per_function: Counter[tuple[str, NodePath]] = Counter()
    for site in _sampling_order(sites, seed):
        if limit is not None and len(candidates) >= limit:
            break
        if per_function[site.file, site.func_path] >= max_per_function:
            continue
        candidate = _mutate_site(site, modules[site.file], stats)
        if candidate is not None:
            candidates.append(candidate)
            per_function[site.file, site.func_path] += 1
    return candidates, stats


def generate_candidates(
    repo_root: Path,
    *,
    include: list[str],
    kinds: set[str] | None = None,
    max_per_function: int = 3,
    seed: int = 0,
    limit: int | None = None,
) -> list[BugCandidate]:
    """Bug candidates from the repository's source files (see `collect_candidates` for counts)."""
    return collect_candidates(
        repo_root, include=include, kinds=kinds, max_per_function=max_per_function, seed=seed, limit=limit
    )[0]
