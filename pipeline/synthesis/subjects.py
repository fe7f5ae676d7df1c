"""The names a bug report uses for what its failing tests exercise: the package's own functions and classes, at
the path a user imports them from, found in the package's source. A test's name alone is no such name:
`tests/test_output.py::test_rst` is about `tabulate.tabulate`, not a `tabulate.output.rst` that does not exist.
"""

from __future__ import annotations

import ast
import functools
import re
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from pipeline.synthesis.pyparse import parse_python

TEST_PARTS = {"tests", "test", "testing", "conftest"}
MIN_NAME = 3  # a shorter prefix of a test's name ("get", "map") names too much


def _key(name: str) -> str:
    """`min_id_map`, `MinIDMap` and `minidmap` alike: tests are snake case, classes camel case."""
    return name.replace("_", "").lower()


@dataclass(frozen=True)
class ApiIndex:
    """A package's public top-level functions and classes, and where its tests are."""

    root: Path
    names: dict[str, str]
    """Dotted path of each name, by its `_key`: where the package's `__init__` imports it from a deeper module
    (`attr.VersionInfo`), else where it is defined (`toolz.itertoolz.groupby`)."""
    modules: frozenset[str] = frozenset()
    """The package's modules (`boltons.iterutils`): `iterutils.f(...)` in a test calls one of its functions."""

    def subjects(self, failing_tests: Iterable[str]) -> list[str]:
        """The dotted names the failing tests are about, in their order, each once; a test naming nothing of the
        package adds none."""
        out: list[str] = []
        for test in failing_tests:
            name = self.subject(test)
            if name and name not in out:
                out.append(name)
        # `partition_all` from test_partition_all is most likely a case of `partition` when that is tested too.
        return [name for name in out if not any(name.startswith(other + "_") for other in out)]

    def subject(self, test: str) -> str | None:
        """What the test's own name names (`test_partition_all` -> partition_all, then partition; the test
        class `TestVersionInfo` -> VersionInfo), else the first of the package's names its body calls."""
        path, *scopes = test.split("::")
        scopes = [re.sub(r"\[.*$", "", s) for s in scopes]
        if not scopes:
            return None
        words = [w for w in re.sub(r"^test_?|_test$", "", scopes[-1]).split("_") if w]
        tried = ["_".join(words[:n]) for n in range(len(words), 0, -1)]
        tried += [re.sub(r"^Tests?|Tests?$", "", scope) for scope in scopes[:-1]]
        tried = [n for n in tried if len(n) >= MIN_NAME] + _referenced(self.root / path, tuple(scopes), self.modules)
        for name in tried:
            if _key(name) in self.names:
                return self.names[_key(name)]
        return None


def api_index(root: Path, source_globs: Iterable[str]) -> ApiIndex:
    """The index of the package unpacked at `root`, whose sources `source_globs` match."""
    defined: list[tuple[bool, int, str, str]] = []  # (in a private module, depth, module, name)
    exported: dict[str, str] = {}  # name -> the shallowest package whose __init__ imports it by name
    starred: dict[str, str] = {}  # module -> the shallowest package whose __init__ imports * from it
    listed: dict[str, set[str]] = {}  # module -> its __all__, where it lists one
    for path in sorted({p for glob in source_globs for p in root.glob(glob) if p.suffix == ".py" and p.is_file()}):
        parts = list(path.relative_to(root).with_suffix("").parts)
        parts = parts[1:] if parts[0] == "src" and len(parts) > 1 else parts
        is_init = parts[-1] == "__init__"
        module = ".".join(parts[:-1] if is_init else parts)
        if not module or any(p in TEST_PARTS or p.startswith("test_") for p in parts):
            continue  # a package's own tests (toolz/tests/) and their helpers are nothing a user imports
        try:
            tree = parse_python(path.read_text(errors="replace"))
        except (SyntaxError, ValueError):
            continue
        for node in tree.body:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and \
                    not node.name.startswith("_"):
                defined.append((any(p.startswith("_") for p in parts), module.count("."), module, node.name))
            elif isinstance(node, ast.Assign) and any(getattr(t, "id", "") == "__all__" for t in node.targets):
                try:
                    listed[module] = set(ast.literal_eval(node.value))
                except (ValueError, TypeError, SyntaxError):
                    pass  # computed: every public name counts
            elif is_init and isinstance(node, ast.ImportFrom):
                for alias in node.names:
                    key, table = (_absolute(module, node), starred) if alias.name == "*" else (alias.name, exported)
                    if key and alias.asname in (None, alias.name) and \
                            table.get(key, module + ".x").count(".") > module.count("."):
                        table[key] = module
    names: dict[str, str] = {}
    modules = {module for _, _, module, _ in defined}
    for _, depth, module, name in sorted(defined):
        star = starred.get(module) if name in listed.get(module, {name}) else None
        where = min((w for w in (exported.get(name), star) if w), key=lambda w: w.count("."), default=module)
        names.setdefault(_key(name), f"{where if where.count('.') < depth else module}.{name}")
    return ApiIndex(root, names, frozenset(modules))


def _absolute(package: str, node: ast.ImportFrom) -> str:
    """The module `from <node.module> import *` in `package`'s __init__ reads from."""
    if not node.level:
        return node.module or ""
    base = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
    return f"{base}.{node.module}" if node.module else base


def _referenced(file: Path, scopes: tuple[str, ...], modules: frozenset[str]) -> list[str]:
    """Names the test's body calls (`f(...)`, `module.f(...)`: not `text.strip()`, a method of anything), in
    source order, then the bare names it mentions (a class handed to a helper); none if it is not found."""
    tree = _parsed(file)
    node: ast.AST | None = tree
    for scope in scopes:
        body = getattr(node, "body", [])
        node = next((n for n in body if isinstance(n, (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
                     and n.name == scope), None)
    if node is None or tree is None:
        return []
    tops, lasts = {m.split(".")[0] for m in modules}, {m.rsplit(".", 1)[-1] for m in modules}
    imports = [n for n in ast.walk(tree) if isinstance(n, (ast.Import, ast.ImportFrom))]
    # the package's modules as the test names them: `import boltons.x as b`, `from boltons import x as b`
    aliases = lasts | {a.asname or a.name.split(".")[0] for n in imports for a in n.names
                       if (a.name.split(".")[0] in tops if isinstance(n, ast.Import) else a.name in lasts)}
    nodes = sorted(ast.walk(node), key=lambda n: (getattr(n, "lineno", 0), getattr(n, "col_offset", 0)))
    calls = [n.func for n in nodes if isinstance(n, ast.Call)]
    called = [f.id if isinstance(f, ast.Name) else f.attr for f in calls if isinstance(f, ast.Name) or
              isinstance(f, ast.Attribute) and isinstance(f.value, ast.Name) and f.value.id in aliases]
    return called + [n.id for n in nodes if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)]


@functools.lru_cache(maxsize=64)
def _parsed(file: Path) -> ast.Module | None:
    try:
        return parse_python(file.read_text(errors="replace"))
    except (OSError, SyntaxError, ValueError):
        return None
