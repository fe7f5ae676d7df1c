"""The import graph stays a drawing without circles (docs/architecture.md), and the verifier stays below
everything that grades."""

from __future__ import annotations

import importlib.util
from pathlib import Path

SCRIPT = Path(__file__).resolve().parent.parent / "scripts" / "import_graph.py"


def import_graph():
    spec = importlib.util.spec_from_file_location("import_graph", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_no_module_imports_itself_through_others():
    g = import_graph()
    edges = g.graph()
    assert len(edges) > 100
    assert edges["pipeline.rollouts.batch"] >= {"pipeline.verifier.grading", "pipeline.core.records"}
    assert g.cycles(edges) == []


def test_no_package_imports_itself_through_others():
    g = import_graph()
    packages: dict[str, set[str]] = {}
    for a, b in g.package_edges(g.graph()):
        packages.setdefault(a, set()).add(b)
    assert packages["pipeline.rollouts"] >= {"pipeline.verifier", "pipeline.guidance", "pipeline.core"}
    assert g.cycles(packages) == []


def test_the_verifier_imports_only_records_and_the_sandbox():
    edges = import_graph().graph()
    verifier = {m: targets for m, targets in edges.items() if m.startswith("pipeline.verifier")}
    assert "pipeline.verifier.grading" in verifier
    outside = {t for targets in verifier.values() for t in targets
               if not t.startswith(("pipeline.verifier", "sandbox.")) and t != "pipeline.core.records"}
    assert outside == set()


def test_a_cycle_is_found():
    g = import_graph()
    assert g.cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]



def test_the_length_list_is_longest_first_and_only_over_the_limit():
    g = import_graph()
    listed = g.long_modules(250)
    assert listed == sorted(listed, reverse=True)
    assert listed and all(lines > 250 for lines, _ in listed)
    assert ("pipeline.core.records" in {name for _, name in listed}) == (len(
        g.modules()["pipeline.core.records"].read_text().splitlines()) > 250)


def test_the_pipeline_makes_docker_sandboxes_in_one_place():
    """Task sandboxes, prepared images and synthesis's working sandboxes all come from
    pipeline.verifier.environment (so they share its limits and backend); nothing else calls DockerSandbox."""
    import ast
    g = import_graph()
    makers = set()
    for name, path in g.modules().items():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call) and getattr(node.func, "id", getattr(node.func, "attr", "")) == "DockerSandbox":
                makers.add(name)
    assert makers == {"pipeline.verifier.environment"}
