"""docs/architecture.md's drawing of the packages, drawn from the code's imports.

    python scripts/draw_architecture.py                 # redraw the block between the markers of docs/architecture.md
    python scripts/draw_architecture.py --print         # print the block instead
    python scripts/draw_architecture.py --check-layers  # list the imports against LINE; exit 1 when there are any

A box is a top-level package (a folder at the repository's root holding __init__.py). A package holding two or more
subpackages (pipeline) is drawn as those subpackages and, if it has modules of its own beside its __init__.py, those
in at most two groups: `(lower)`, the modules whose imports reach nothing but each other and the packages below it on
LINE, and `(upper)`, the rest that no subpackage reaches; a module in neither is a box of its own. A package whose
only own module is its __init__.py (pipeline now) has no groups: its __init__.py is a box named after the package,
drawn only when an arrow touches it. An arrow points from the importer to what it imports; every import counts, at
the top of a module or inside a function (read by scripts/import_graph.py).
tests/test_architecture_doc.py fails when the block differs from what this script draws.
"""

from __future__ import annotations

import argparse
import importlib.util
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DOC = ROOT / "docs" / "architecture.md"
BEGIN = "<!-- drawn by scripts/draw_architecture.py from the imports: edit the code, not this block -->"
END = "<!-- end of the drawn block -->"
# The intended order of the top-level packages, top to bottom: each may import only those after it.
LINE = ("assets", "training", "pipeline", "sandbox")
WITNESSES = 2  # module imports named per edge in the edge list


def _import_graph():
    spec = importlib.util.spec_from_file_location("import_graph", Path(__file__).with_name("import_graph.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def code_graph(root: Path = ROOT) -> tuple[dict[str, set[str]], set[str]]:
    """Every module of the top-level packages under `root` -> the project modules it imports; and which of the
    modules are packages (an __init__.py)."""
    found: dict[str, Path] = {}
    for init in sorted(root.glob("*/__init__.py")):
        if not init.parent.name.startswith("."):
            for path in sorted(init.parent.rglob("*.py")):
                parts = path.relative_to(root).with_suffix("").parts
                found[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    reader, known = _import_graph(), set(found)
    edges = {name: reader.imports(path, name, known) for name, path in found.items()}
    return edges, {name for name, path in found.items() if path.name == "__init__.py"}


def _reach(starts: set[str], edges: dict[str, set[str]]) -> set[str]:
    """The modules `starts` import, directly or through others (`starts` included)."""
    seen, todo = set(starts), list(starts)
    while todo:
        for target in edges.get(todo.pop(), ()):
            if target not in seen:
                seen.add(target)
                todo.append(target)
    return seen


def boxes(edges: dict[str, set[str]], packages: set[str], line: tuple[str, ...] = LINE) -> dict[str, str]:
    """Module -> the name of the box it is drawn in."""
    top = {m: m.split(".")[0] for m in edges}
    subpackages = {p for p in packages if p.count(".") == 1}
    split = {t for t in set(top.values()) if sum(p.startswith(f"{t}.") for p in subpackages) >= 2}
    out = {}
    for m, t in top.items():
        sub = ".".join(m.split(".")[:2])
        out[m] = t if t not in split else sub if sub in subpackages else None
    for t in split:
        own = {m for m, box in out.items() if box is None and top[m] == t}
        if own == {t}:  # nothing beside its __init__.py: no groups, the package stands for itself
            out[t] = t
            continue
        below = {m for m in edges if top[m] in line[line.index(t) + 1:]} if t in line else set()
        lower = {m for m in own if _reach({m}, edges) <= own | below}
        reached = _reach({m for m in edges if top[m] == t and out[m] is not None}, edges)
        upper = own - lower - reached
        out.update({m: f"{t}/*.py (lower)" if m in lower else f"{t}/*.py (upper)" if m in upper else m for m in own})
    return out


def box_edges(edges: dict[str, set[str]], box: dict[str, str]) -> dict[tuple[str, str], list[tuple[str, str]]]:
    """(importing box, imported box) -> the module imports that make the arrow."""
    out: dict[tuple[str, str], list[tuple[str, str]]] = {}
    for a in sorted(edges):
        for b in sorted(edges[a]):
            if box[a] != box[b]:
                out.setdefault((box[a], box[b]), []).append((a, b))
    return dict(sorted(out.items()))


def upward(arrows, line: tuple[str, ...] = LINE) -> dict[tuple[str, str], list[tuple[str, str]]]:
    """The arrows from a package to one above it on `line`, or to or from a package not on it."""
    def rank(name: str) -> int:
        top = name.split("/")[0].split(".")[0]
        return line.index(top) if top in line else -1

    return {pair: made for pair, made in arrows.items()
            if rank(pair[0]) == -1 or rank(pair[1]) == -1 or rank(pair[0]) > rank(pair[1])}


def implied(arrows, against) -> set[tuple[str, str]]:
    """The arrows along the line that a path of two or more other such arrows already draws."""
    along: dict[str, set[str]] = {}
    for a, b in arrows:
        if (a, b) not in against:
            along.setdefault(a, set()).add(b)

    def reaches(a: str, b: str) -> bool:  # without the arrow a -> b itself
        seen, todo = set(), [t for t in along[a] if t != b]
        while todo:
            n = todo.pop()
            if n == b:
                return True
            if n not in seen:
                seen.add(n)
                todo += [t for t in along.get(n, ()) if (n, t) != (a, b)]
        return False

    return {(a, b) for a, targets in along.items() for b in targets if reaches(a, b)}


def _node(name: str) -> str:
    return re.sub(r"\W+", "_", name).strip("_")


def _made_by(made: list[tuple[str, str]]) -> str:
    named = ", ".join(f"{a} → {b}" for a, b in made[:WITNESSES])
    return named + (f" (+{len(made) - WITNESSES})" if len(made) > WITNESSES else "")


def draw(edges: dict[str, set[str]], packages: set[str], line: tuple[str, ...] = LINE) -> str:
    """The block docs/architecture.md holds between its markers: the drawing, what the groups hold, the edges."""
    box = boxes(edges, packages, line)
    arrows = box_edges(edges, box)
    lines = ["```mermaid", "graph TD"]
    tops = sorted({m.split(".")[0] for m in edges}, key=lambda t: (line.index(t) if t in line else len(line), t))
    for t in tops:
        inside = sorted({b for m, b in box.items() if m.split(".")[0] == t})
        if inside != [t] and t in inside and not any(t in pair for pair in arrows):
            inside.remove(t)  # a package's bare __init__.py that nothing imports and that imports nothing
        if inside == [t]:
            lines.append(f"  {_node(t)}[{t}]")
            continue
        lines.append(f"  subgraph {_node(t)}_package[{t}]")
        lines += [f'    {_node(b)}["{b}"]' for b in inside]
        lines.append("  end")
    against = upward(arrows, line)
    left_out = implied(arrows, against)
    lines += [f"  {_node(a)} {'-.->' if (a, b) in against else '-->'} {_node(b)}" for a, b in arrows
              if (a, b) not in left_out]
    lines.append("```")
    groups = sorted({b for b in box.values() if b.endswith("(lower)") or b.endswith("(upper)")})
    lines += [""] if groups else []
    for group in groups:
        t = group.split("/")[0]
        held = sorted(m.removeprefix(f"{t}.") for m, b in box.items() if b == group and m != t)
        lines.append(f"- `{group}`: {', '.join(held)}")
    lines += ["", f"Drawn: {len(arrows) - len(left_out)} of the {len(arrows)} arrows; each of the others follows a "
              f"path of drawn ones. Dashed: against the line {' → '.join(line)}. Every arrow, with the imports that "
              "make it:", ""]
    lines += [f"- `{a}` → `{b}`: {_made_by(made)}" for (a, b), made in arrows.items()]
    lines += ["", f"Against the line ({len(against)}):", ""]
    lines += [f"- `{a}` → `{b}`: {_made_by(made)}" for (a, b), made in against.items()] or ["- none"]
    return "\n".join(lines)


def replace_block(text: str, block: str) -> str:
    """`text` with what lies between the markers replaced by `block`."""
    head, begin, rest = text.partition(BEGIN)
    _, end, tail = rest.partition(END)
    if not begin or not end:
        raise SystemExit(f"{DOC.relative_to(ROOT)} lacks the markers {BEGIN!r} and {END!r}: put them where the "
                         f"drawing goes, each on a line of its own, and run this again")
    return f"{head}{BEGIN}\n{block}\n{END}{tail}"


def block_of(text: str) -> str:
    """What lies between the markers of `text` ('' without them)."""
    return text.partition(BEGIN)[2].partition(END)[0].strip("\n")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--print", action="store_true", help="print the block instead of writing it")
    parser.add_argument("--check-layers", action="store_true",
                        help=f"list the imports against {' -> '.join(LINE)}; exit 1 when there are any")
    args = parser.parse_args(argv)
    edges, packages = code_graph()
    arrows = box_edges(edges, boxes(edges, packages))
    against = upward(arrows)
    if args.check_layers:
        for (a, b), made in against.items():
            print(f"{a} -> {b}: " + ", ".join(f"{x} -> {y}" for x, y in made))
        print(f"{len(against)} arrow(s) against the line {' -> '.join(LINE)}")
        return 1 if against else 0
    block = draw(edges, packages)
    if args.print:
        print(block)
        return 0
    DOC.write_text(replace_block(DOC.read_text(), block))
    print(f"drew {len(arrows)} arrows into {DOC.relative_to(ROOT)}; {len(against)} point against the line "
          f"{' -> '.join(LINE)} (--check-layers lists them)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
