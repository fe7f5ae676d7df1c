"""The project's import graph: which module imports which (any import, at the top or inside a function).

    python scripts/import_graph.py            # cycles between modules, then the package drawing (Mermaid)
    python scripts/import_graph.py --modules  # every module edge
    python scripts/import_graph.py --long 400 # modules over 400 lines, longest first

docs/architecture.md holds the drawing; tests/test_architecture.py keeps the graph free of cycles. The length list
is a hint to read a long module for a second concept, never a rule: a module is one concept, whatever its length.
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("pipeline", "assets", "sandbox", "training")


def modules() -> dict[str, Path]:
    """Dotted name -> file, for every module of the project's packages."""
    out = {}
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            parts = path.relative_to(ROOT).with_suffix("").parts
            out[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return out


def imports(path: Path, name: str, known: set[str]) -> set[str]:
    """The project modules `path` imports (`from pkg import mod` counts as pkg.mod when that is a module)."""
    found = set()
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join(package.split(".")[: len(package.split(".")) - node.level + 1] + ([base] if base else []))
            found |= {f"{base}.{a.name}" if f"{base}.{a.name}" in known else base for a in node.names}
    return {_owner(m, known) for m in found if _owner(m, known)} - {name}


def _owner(name: str, known: set[str]) -> str | None:
    while name and name not in known:
        name = name.rpartition(".")[0]
    return name or None


def graph() -> dict[str, set[str]]:
    mods = modules()
    return {name: imports(path, name, set(mods)) for name, path in mods.items()}


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan), each sorted."""
    index, low, stack, on, out, counter = {}, {}, [], set(), [], [0]

    def visit(v: str) -> None:
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in edges.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            part = []
            while True:
                w = stack.pop()
                on.discard(w)
                part.append(w)
                if w == v:
                    break
            if len(part) > 1:
                out.append(sorted(part))

    sys.setrecursionlimit(10_000)
    for v in sorted(edges):
        if v not in index:
            visit(v)
    return sorted(out)


def package_of(module: str) -> str:
    """The drawing's unit: a subpackage of pipeline (pipeline.tasks), else the top package or module."""
    parts = module.split(".")
    return ".".join(parts[:2]) if parts[0] == "pipeline" and len(parts) > 2 else parts[0] if parts[0] != "pipeline" \
        else module


def package_edges(edges: dict[str, set[str]]) -> set[tuple[str, str]]:
    return {(package_of(a), package_of(b)) for a, targets in edges.items() for b in targets
            if package_of(a) != package_of(b)}


def mermaid(edges: dict[str, set[str]]) -> str:
    lines = ["graph TD"] + [f"  {a.replace('.', '_')}[{a}] --> {b.replace('.', '_')}[{b}]"
                            for a, b in sorted(package_edges(edges))]
    return "\n".join(lines)


def long_modules(limit: int) -> list[tuple[int, str]]:
    """(lines, module) for every module over `limit` lines, longest first."""
    sizes = ((len(path.read_text().splitlines()), name) for name, path in modules().items())
    return sorted((s for s in sizes if s[0] > limit), reverse=True)


def main() -> None:
    if "--long" in sys.argv:
        at = sys.argv.index("--long") + 1
        limit = int(sys.argv[at]) if at < len(sys.argv) else 400
        for lines, name in long_modules(limit):
            print(f"{lines:5d}  {name}")
        return
    edges = graph()
    if "--modules" in sys.argv:
        for a in sorted(edges):
            for b in sorted(edges[a]):
                print(f"{a} -> {b}")
        return
    found = cycles(edges)
    print(f"{len(found)} module cycle(s)" + "".join(f"\n  {' <-> '.join(c)}" for c in found))
    print(mermaid(edges))


if __name__ == "__main__":
    main()
