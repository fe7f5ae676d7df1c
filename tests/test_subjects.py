"""Problem statements name what the failing tests exercise by the package's real names, read from its source."""

from __future__ import annotations

from pathlib import Path

from pipeline.synthesis.subjects import api_index


def tree(root: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)
    return root


PACKAGE = {
    "src/shapes/__init__.py": "from ._version import VersionInfo\nfrom .grid import *\nfrom json import dumps\n",
    "src/shapes/_version.py": "class VersionInfo:\n    pass\n",
    "src/shapes/grid.py": "__all__ = ['partition', 'partition_all', 'MinIDMap']\ndef partition(x):\n    pass\ndef partition_all(x):\n    pass\n"
                          "class MinIDMap:\n    pass\ndef strip(x):\n    pass\ndef _hidden():\n    pass\n",
    "src/shapes/render.py": "def render(table):\n    pass\nclass Table:\n    pass\n",
    "src/shapes/broken.py": "def oops(:\n",
    "src/shapes/tests/test_helpers.py": "def render_all(x):\n    pass\n",
    "tests/test_grid.py": (
        "import json\nimport pytest\nfrom shapes import render as r\nfrom shapes.render import Table\n"
        "def test_partition_all():\n    pass\n"
        "def test_min_id_map_weakref():\n    pass\n"
        "def test_pipe_headerless():\n    assert r.render([]) == ''\n"
        "def test_methods_of_anything():\n    ' x '.strip()\n    json.dumps({})\n"
        "def test_handed_over():\n    render_all(1)\n    check(Table)\n"
        "class TestVersionInfo:\n    @pytest.mark.parametrize('x', [1])\n    def test_from_string(self, x):\n"
        "        pass\n"),
}


def test_subjects_are_the_packages_own_names_at_the_path_users_import_them_from(tmp_path):
    index = api_index(tree(tmp_path, PACKAGE), ["src/shapes/**/*.py"])
    subject = index.subject
    assert subject("tests/test_grid.py::test_partition_all") == "shapes.partition_all"  # `from .grid import *`
    assert subject("tests/test_grid.py::test_min_id_map_weakref") == "shapes.MinIDMap"  # camel case, shortened
    assert index.names["strip"] == "shapes.grid.strip"  # not in grid's __all__: not star-imported
    assert subject("tests/test_grid.py::TestVersionInfo::test_from_string[1]") == "shapes.VersionInfo"  # exported
    assert subject("tests/test_grid.py::test_pipe_headerless") == "shapes.render.render"  # what its body calls
    assert subject("tests/test_grid.py::test_handed_over") == "shapes.render.Table"  # a class it hands over
    # a method of a string and a function of another module are no names of the package
    assert subject("tests/test_grid.py::test_methods_of_anything") is None
    assert subject("tests/test_gone.py::test_nothing_here") is None
    assert "shapes.grid._hidden" not in index.names.values() and "dumps" not in index.names


def test_a_case_of_a_tested_name_is_that_name():
    index = api_index(Path("/nonexistent"), [])
    assert index.subjects(["tests/test_x.py::test_a"]) == []
    index.names.update({"partition": "t.partition", "partitionall": "t.partition_all"})
    tests = ["tests/test_x.py::test_partition_all", "tests/test_x.py::test_partition", "tests/test_x.py::test_partition"]
    assert index.subjects(tests) == ["t.partition"]
