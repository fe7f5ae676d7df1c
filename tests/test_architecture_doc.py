"""docs/architecture.md's drawing is the code's: scripts/draw_architecture.py draws it from the imports, and a
drawing that differs from what it draws now fails here."""

from __future__ import annotations

import importlib.util
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def draw_architecture():
    spec = importlib.util.spec_from_file_location("draw_architecture", ROOT / "scripts" / "draw_architecture.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_drawing_in_the_docs_is_the_code():
    d = draw_architecture()
    edges, packages = d.code_graph()
    drawn = d.block_of((ROOT / "docs" / "architecture.md").read_text())
    assert drawn == d.draw(edges, packages), \
        "docs/architecture.md's drawing differs from the imports of the code: run scripts/draw_architecture.py"


def test_the_packages_form_a_line_with_no_arrow_back():
    d = draw_architecture()
    edges, packages = d.code_graph()
    arrows = d.box_edges(edges, d.boxes(edges, packages))
    assert d.upward(arrows) == {}, "an import goes up the line: python scripts/draw_architecture.py --check-layers"


# A hand-made project on the line t -> p -> s: p holds two subpackages (p.a, p.b) and modules of its own.
LINE = ("t", "p", "s")
PACKAGES = {"t", "p", "p.a", "p.b", "s"}
EDGES = {
    "t": set(), "t.train": {"p.core2"}, "t.run": {"p.app"},
    "p": set(), "p.a": set(), "p.b": set(), "s": set(), "s.base": set(),
    "p.core": {"s.base"},            # reaches only what lies below p: lower
    "p.core2": {"p.core"},           # through another lower module: lower
    "p.a.x": {"p.core"},
    "p.b.y": {"p.mid"},
    "p.mid": {"p.a.x"},              # imports a subpackage and one imports it: a box of its own
    "p.app": {"p.b.y", "p.core"},    # imports a subpackage, none reaches it: upper
    "p.hook": {"t.train"},           # reaches no subpackage but imports above p: not lower, so upper
    "s.leak": {"p.core2"},           # s imports p: against the line
}


def test_a_package_of_subpackages_is_drawn_as_them_and_its_modules_in_two_groups():
    box = draw_architecture().boxes(EDGES, PACKAGES, LINE)
    assert {m for m, b in box.items() if b == "p/*.py (lower)"} == {"p", "p.core", "p.core2"}
    assert {m for m, b in box.items() if b == "p/*.py (upper)"} == {"p.app", "p.hook"}
    assert box["p.mid"] == "p.mid" and box["p.a.x"] == box["p.a"] == "p.a" and box["p.b.y"] == "p.b"
    assert box["t.train"] == "t" and box["s.leak"] == box["s.base"] == "s"


def test_a_package_of_nothing_but_subpackages_is_drawn_with_no_groups():
    d = draw_architecture()
    edges = {"p": set(), "p.a": set(), "p.a.x": {"p.b.y"}, "p.b": set(), "p.b.y": {"s.base"},
             "s": set(), "s.base": set()}
    box = d.boxes(edges, {"p", "p.a", "p.b", "s"}, ("p", "s"))
    assert box["p"] == "p" and box["p.a.x"] == "p.a" and box["p.b.y"] == "p.b"
    block = d.draw(edges, {"p", "p.a", "p.b", "s"}, ("p", "s"))
    assert "(lower)" not in block and "(upper)" not in block and '    p["p"]' not in block
    assert "```\n\nDrawn: 2 of the 2 arrows" in block
    # an __init__.py that imports something stays in the picture, inside its package
    edges["p"] = {"p.a.x"}
    assert '    p["p"]' in d.draw(edges, {"p", "p.a", "p.b", "s"}, ("p", "s"))


def test_a_package_with_one_subpackage_is_one_box():
    box = draw_architecture().boxes({"q": set(), "q.a": set(), "q.a.x": {"q.m"}, "q.m": set()}, {"q", "q.a"}, ("q",))
    assert set(box.values()) == {"q"}


def test_the_arrows_against_the_line_are_found():
    d = draw_architecture()
    arrows = d.box_edges(EDGES, d.boxes(EDGES, PACKAGES, LINE))
    assert arrows[("p/*.py (upper)", "t")] == [("p.hook", "t.train")]
    assert set(d.upward(arrows, LINE)) == {("p/*.py (upper)", "t"), ("s", "p/*.py (lower)")}
    assert d.upward({("x", "p.a"): [("x.m", "p.a.y")]}, LINE) == {("x", "p.a"): [("x.m", "p.a.y")]}  # x: off the line


def test_an_arrow_a_path_already_draws_is_left_out_of_the_picture_not_the_list():
    d = draw_architecture()
    arrows = {("a", "b"): [], ("b", "c"): [], ("a", "c"): [], ("c", "a"): []}
    assert d.implied(arrows, against={("c", "a"): []}) == {("a", "c")}
    assert d.implied(arrows, against={}) == {("a", "c")}  # b -> c -> a -> b is a circle: each of its arrows stays
    block = d.draw(EDGES, PACKAGES, LINE)
    assert "  t --> p_py_lower" not in block and "- `t` → `p/*.py (lower)`: t.train → p.core2" in block
    assert "  s -.-> p_py_lower" in block and "Against the line (2):" in block
