"""What an unpacked sdist says about its tests: where they are, what they need, how pytest runs them.

Read from the files pytest and the build tools read themselves: the pytest configuration
(`pytest.ini`, `pyproject.toml [tool.pytest.ini_options]`, `tox.ini [pytest]`,
`setup.cfg [tool:pytest]`), test extras and dependency groups, `tox.ini` deps,
`requirements*test*.txt`, and the test files' own top-level imports.
"""

from __future__ import annotations

import ast
import re
import shlex
import sys
from dataclasses import dataclass
from pathlib import Path

from pipeline.synthesis.config_files import config_lines, merge_requirements, read_ini, read_toml, requirement_name
from pipeline.synthesis.marks import marked_plugins
from pipeline.synthesis.pyparse import parse_python

PYTEST = "pytest>=8,<9"
DISCOVERY_VERSION = 2
"""In the key of a resolved spec's cache (packages.py `resolve`): specs found by older rules are found again.
2: a package's own extras expanded, and the plugins of the marks its tests use."""
TEST_EXTRAS = ("test", "tests", "testing")
FALLBACK_EXTRAS = ("dev",)  # only when no test extra exists: dev extras carry linters and docs too
TEST_DIRS = ("tests", "test", "testing")
NOT_SOURCE = {"tests", "test", "testing", "docs", "doc", "examples", "example", "benchmarks", "bench", "scripts",
              "tools", "build", "dist", "tasks", "ci", "bin"}
NOT_SOURCE_FILES = {"setup.py", "conftest.py", "noxfile.py", "fabfile.py", "tasks.py", "conf.py", "version.py",
                    "_version.py", "__main__.py"}
# addopts that need a plugin this project does not install (coverage, xdist, linters): dropped from addopts.
DROPPED_OPTS = ("--cov", "--no-cov", "-n", "--numprocesses", "--dist", "--maxprocesses", "--mypy", "--flake8",
                "--black", "--ruff", "--isort", "--pylint", "--codestyle", "--checkdocs", "--enabler")
WITH_VALUE = {"--cov", "-n", "--numprocesses", "--dist", "--maxprocesses", "-p", "--cov-report", "--cov-config"}
DROPPED_PLUGINS = {"xdist", "pytest_cov", "cov", "randomly", "pytest_randomly"}
# Options and ini keys that name the plugin they belong to.
OPTION_PLUGINS = {"--timeout": "pytest-timeout", "--benchmark": "pytest-benchmark", "--reruns": "pytest-rerunfailures",
                  "--asyncio-mode": "pytest-asyncio", "--hypothesis": "hypothesis", "--mock": "pytest-mock"}
INI_PLUGINS = {"asyncio_mode": "pytest-asyncio", "timeout": "pytest-timeout", "env": "pytest-env",
               "mock_use_standalone_module": "pytest-mock", "benchmark_disable": "pytest-benchmark"}
IMPORT_DISTS = {"yaml": "PyYAML", "dateutil": "python-dateutil", "pytest_mock": "pytest-mock", "attr": "attrs",
                "bs4": "beautifulsoup4", "PIL": "Pillow", "sklearn": "scikit-learn", "pkg_resources": "setuptools",
                "dns": "dnspython", "railroad": "railroad-diagrams", "jwt": "PyJWT", "OpenSSL": "pyOpenSSL", "google": "protobuf"}


@dataclass(frozen=True)
class Discovered:
    """How to run one sdist's tests, as found in its files."""

    test_paths: tuple[str, ...]
    source_globs: tuple[str, ...]
    test_requirements: tuple[str, ...]
    """Declared requirements first, then `guessed` ones (from imports)."""
    guessed: tuple[str, ...]
    """Requirements read from the tests' imports, not declared anywhere: dropped if they do not install."""
    pytest_args: tuple[str, ...]
    """Arguments the pytest command needs on top of the configuration (an addopts without unusable plugins)."""
    found: tuple[str, ...]
    """Where each piece came from, for logs and error messages."""


def pytest_config(root: Path) -> tuple[str, dict[str, str]]:
    """(file, options) of the configuration pytest itself would read, in pytest's order; ('', {}) if none."""
    for name, section in (("pytest.ini", "pytest"), (".pytest.ini", "pytest"), ("pyproject.toml", None),
                          ("tox.ini", "pytest"), ("setup.cfg", "tool:pytest")):
        path = root / name
        if not path.is_file():
            continue
        if section is None:
            options = read_toml(path).get("tool", {}).get("pytest", {}).get("ini_options")
            if options is not None:
                return name, {k: " ".join(map(str, v)) if isinstance(v, list) else str(v) for k, v in options.items()}
            continue
        parser = read_ini(path)
        if parser.has_section(section):
            return name, dict(parser.items(section, raw=True))
    return "", {}


def discover(root: Path, name: str) -> Discovered:
    """Tests, sources and requirements of the sdist unpacked at `root` (the package `name`)."""
    found: list[str] = []
    config_file, ini = pytest_config(root)
    if config_file:
        found.append(f"pytest configuration in {config_file}")
    paths = _test_paths(root, ini, found)
    declared = _declared_requirements(root, name, found)
    args, plugins = _addopts(ini, found)
    plugins += [dist for key, dist in INI_PLUGINS.items() if key in ini]
    plugins += ini.get("required_plugins", "").split()
    guessed = _imported_requirements(root, paths, name)
    requirements = [PYTEST, *(r for r in merge_requirements(plugins, declared) if requirement_name(r) != "pytest")]
    marked = [m for m in marked_plugins(_test_files(root, paths), ini.get("markers", ""))
              if m not in {requirement_name(r) for r in requirements}]  # tooling or not: the marks need them
    if marked:
        found.append(f"plugins of the marks the tests use: {', '.join(marked)}")
    requirements += marked
    have = {requirement_name(r) for r in requirements} | {"pytest"}
    guessed = [g for g in merge_requirements(guessed) if not any(h == requirement_name(g) or h.startswith(requirement_name(g) + "-") for h in have)]
    if guessed:
        found.append(f"imported by the tests: {', '.join(guessed)}")
    return Discovered(tuple(paths), tuple(_source_globs(root, name)), tuple(requirements + guessed),
                      tuple(guessed), tuple(args), tuple(found))


def _test_paths(root: Path, ini: dict[str, str], found: list[str]) -> list[str]:
    listed = [p for p in ini.get("testpaths", "").split() if (root / p).exists()]
    if listed:
        found.append(f"testpaths {listed}")
        return listed
    tops = [d for d in TEST_DIRS if (root / d).is_dir() and _has_tests(root / d)]
    if not tops:
        tops = sorted(str(p.relative_to(root)) for p in [*root.glob("*/tests"), *root.glob("src/*/tests"),
                                                        *root.glob("*/test")] if p.is_dir() and _has_tests(p))
    if not tops:
        tops = sorted(p.name for p in root.glob("*.py") if _is_test_name(p.name))
    if tops:
        found.append(f"test paths {tops}")
    return tops


def _has_tests(folder: Path) -> bool:
    return any(_is_test_name(p.name) for p in folder.rglob("*.py"))


def _is_test_name(name: str) -> bool:
    return name.startswith("test_") and name.endswith(".py") or name.endswith("_test.py") or name == "tests.py"


def _source_globs(root: Path, name: str) -> list[str]:
    """The importable package folders (flat or src layout), else the top-level modules."""
    base = root / "src" if (root / "src").is_dir() else root
    prefix = "src/" if base != root else ""
    packages = sorted(p.parent.name for p in base.glob("*/__init__.py") if p.parent.name not in NOT_SOURCE)
    wanted = re.sub(r"[-.]", "_", name.lower())
    preferred = [p for p in packages if p.lower() == wanted or wanted.startswith(p.lower())]
    if preferred or packages:
        return [f"{prefix}{p}/**/*.py" for p in (preferred or packages)]
    modules = sorted(p.name for p in base.glob("*.py") if p.name not in NOT_SOURCE_FILES and not _is_test_name(p.name))
    return [f"{prefix}{m}" for m in modules]


def _declared_requirements(root: Path, name: str, found: list[str]) -> list[str]:
    out: list[str] = []
    pyproject = read_toml(root / "pyproject.toml") if (root / "pyproject.toml").is_file() else {}
    extras = {**_setup_extras(root), **pyproject.get("project", {}).get("optional-dependencies", {})}
    own = {requirement_name(name), requirement_name(str(pyproject.get("project", {}).get("name", name)))}
    groups = pyproject.get("dependency-groups", {})
    tables = ((extras, "extra"), (groups, "dependency group"))
    wanted = TEST_EXTRAS if any(n in t for t, _ in tables for n in TEST_EXTRAS) else FALLBACK_EXTRAS
    tox_extras = _tox_option(root, "extras")
    for table, what in tables:
        names = [n for n in wanted if n in table] + [n for n in tox_extras if n in table and table is extras]
        for n in dict.fromkeys(names):
            items = _own_extras(table[n], extras, own, {n} if table is extras else set())
            found.append(f"{what} {n!r}")
            out += items
    poetry = pyproject.get("tool", {}).get("poetry", {})
    for group in ("test", "tests", "dev"):
        deps = poetry.get("group", {}).get(group, {}).get("dependencies", {})
        if deps:
            found.append(f"poetry group {group!r}")
            out += [d for d in deps if d != "python"]
    out += _tox_deps(root, found)
    for path in sorted(root.glob("requirements*test*.txt")) + sorted(root.glob("requirements/*test*.txt")):
        found.append(path.name)
        out += _requirements_file(path)
    return [r for r in out if not r.startswith(".")]


def _own_extras(items: list, extras: dict[str, list], own: set[str], seen: set[str]) -> list[str]:
    """The requirements, the package's own extras (`attrs[tests-mypy]` in attrs' `tests` extra) replaced by what
    they list: pip cannot match them to the local copy and fails trying every published release against it."""
    out: list[str] = []
    for item in [r for r in items if isinstance(r, str)]:  # dependency groups may hold {include-group = ...}
        if requirement_name(item) not in own:
            out.append(item)
            continue
        named = re.match(r"^[^\[;]*\[([^\]]*)\]", item)
        for extra in (e.strip() for e in named.group(1).split(",")) if named else ():
            key = next((k for k in extras if requirement_name(k) == requirement_name(extra)), None)
            if key is not None and key not in seen:
                seen.add(key)
                out += _own_extras(extras[key], extras, own, seen)
    return out


def _setup_extras(root: Path) -> dict[str, list[str]]:
    """extras_require of setup.cfg, or of a literal dict in setup.py."""
    extras: dict[str, list[str]] = {}
    if (root / "setup.cfg").is_file():
        parser = read_ini(root / "setup.cfg")
        if parser.has_section("options.extras_require"):
            extras |= {k: config_lines(v) for k, v in parser.items("options.extras_require", raw=True)}
    if (root / "setup.py").is_file():
        try:
            tree = parse_python((root / "setup.py").read_text(errors="replace"))
        except SyntaxError:
            return extras
        for node in ast.walk(tree):
            if isinstance(node, ast.keyword) and node.arg == "extras_require":
                try:
                    extras |= {k: list(v) for k, v in ast.literal_eval(node.value).items()}
                except (ValueError, TypeError, SyntaxError):
                    pass  # computed at run time: not readable without running setup.py
    return extras


def _tox_option(root: Path, option: str) -> list[str]:
    """Lines of a [testenv] option of tox.ini, factor conditions ("py38: foo") removed."""
    if not (root / "tox.ini").is_file():
        return []
    parser = read_ini(root / "tox.ini")
    if not parser.has_option("testenv", option):
        return []
    lines = config_lines(parser.get("testenv", option, raw=True))
    return [re.sub(r"^[\w,{}!-]+:\s*", "", line) for line in lines]


def _tox_deps(root: Path, found: list[str]) -> list[str]:
    lines = _tox_option(root, "deps")
    if lines:
        found.append("tox.ini [testenv] deps")
    out = []
    for line in lines:
        if line.startswith("-r"):
            out += _requirements_file(root / line[2:].strip())
        elif not line.startswith(("{", "-")):
            out.append(line)
    return out


def _requirements_file(path: Path, depth: int = 0) -> list[str]:
    if not path.is_file() or depth > 3:
        return []
    out = []
    for line in config_lines(path.read_text(errors="replace")):
        if line.startswith(("-r", "--requirement")):
            out += _requirements_file(path.parent / line.split(None, 1)[-1].removeprefix("-r").strip(), depth + 1)
        elif not line.startswith("-"):
            out.append(line)
    return out


def _addopts(ini: dict[str, str], found: list[str]) -> tuple[list[str], list[str]]:
    """(pytest args overriding addopts, or none; plugins the kept options need)."""
    raw = ini.get("addopts", "")
    tokens, kept, plugins, dropped = shlex.split(raw), [], [], []
    i = 0
    while i < len(tokens):
        token = tokens[i]
        flag = token.split("=", 1)[0]
        takes_value = flag in WITH_VALUE and "=" not in token and not (flag == "-n" and token != "-n")
        value = tokens[i + 1] if takes_value and i + 1 < len(tokens) and not tokens[i + 1].startswith("-") else None
        step = 2 if value is not None else 1
        if flag.startswith(DROPPED_OPTS) and not flag.startswith("--doctest") or \
                flag == "-p" and (value or "") in DROPPED_PLUGINS or re.fullmatch(r"-n\S+", token):
            dropped += tokens[i:i + step]
        else:
            kept += tokens[i:i + step]
            plugins += [dist for opt, dist in OPTION_PLUGINS.items() if flag.startswith(opt)]
        i += step
    if not dropped:
        return [], plugins
    found.append(f"addopts without {' '.join(dropped)}")
    return ["-o", f"addopts={shlex.join(kept)}"], plugins


def _test_files(root: Path, paths: list[str]) -> list[Path]:
    files = [f for p in paths for f in ([root / p] if (root / p).is_file() else (root / p).rglob("*.py"))]
    return files + list(root.glob("conftest.py"))


def _imported_requirements(root: Path, paths: list[str], name: str) -> list[str]:
    """Distributions the test files import at module level outside try blocks, not stdlib nor local."""
    files = _test_files(root, paths)
    local = {p.stem for p in root.rglob("*.py")} | {p.name for p in root.rglob("*") if p.is_dir()}
    local |= {re.sub(r"[-.]", "_", name.lower())}
    modules: set[str] = set()
    for file in files:
        try:
            tree = parse_python(file.read_text(errors="replace"))
        except SyntaxError:
            continue
        for node in tree.body:
            if isinstance(node, ast.Import):
                modules |= {a.name.split(".")[0] for a in node.names}
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                modules.add(node.module.split(".")[0])
    modules -= set(sys.stdlib_module_names) | local | {"pytest", "_pytest", "__future__"}
    return sorted(IMPORT_DISTS.get(m, m.replace("_", "-")) for m in modules)
