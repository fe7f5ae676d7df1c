"""Config dataclasses as a tree of settings: each field's type, range and doc, built from and turned into plain
nested data with every key, type and range checked. No component config lives here, so anything (the training
subprocess too) can read settings without importing the pipeline's components."""

from __future__ import annotations

import ast
import dataclasses
import functools
import inspect
import re
import textwrap
import types
import typing
from typing import Annotated, Any, Literal

from pipeline.core.setting_ranges import out_of_range, range_of

NUMBER = re.compile(r"[-+]?(\d+\.?\d*|\.\d+)([eE][-+]?\d+)?")  # what float() reads, but no nan or inf


class SettingsError(ValueError):
    """A settings file or mapping that does not fit HandholdConfig: names the key, the file and the fix."""


@functools.cache
def field_docs(cls: type) -> dict[str, str]:
    """The docstring under each field of a dataclass (its one-line documentation)."""
    tree = ast.parse(textwrap.dedent(inspect.getsource(cls)))
    body = tree.body[0].body
    docs = {}
    for node, after in zip(body, body[1:]):
        if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) and isinstance(after, ast.Expr) \
                and isinstance(after.value, ast.Constant) and isinstance(after.value.value, str):
            docs[node.target.id] = " ".join(after.value.value.split())
    return docs


@functools.cache
def field_types(cls: type, extras: bool = False) -> dict[str, Any]:
    """Resolved type hints of a dataclass's fields; `extras`: with their ranges (`Annotated[int, Ge(1)]`)."""
    module = inspect.getmodule(cls)
    return typing.get_type_hints(cls, vars(module) if module else None, include_extras=extras)


def field_ranges(cls: type) -> dict[str, Any]:
    """The Range each numeric field of a dataclass declares (pipeline/core/setting_ranges.py); None for none."""
    return {name: range_of(kind) for name, kind in field_types(cls, extras=True).items()}


def check_ranges(record: Any) -> None:
    """Raises ValueError for the first numeric field of the dataclass `record` outside its declared range: the
    check settings get when they load, for a record built in code ('AgentConfig.max_steps is 0; it must be at
    least 1'). Config classes call it from `__post_init__`, so no range is written twice."""
    kinds = field_types(type(record), extras=True)
    for f in dataclasses.fields(record):
        value = getattr(record, f.name)
        wrong = out_of_range(value, kinds[f.name])
        if wrong:
            raise ValueError(f"{type(record).__name__}.{f.name} is {value!r}; {wrong}")


def default_of(f: dataclasses.Field) -> Any:
    return f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default


def from_mapping(cls: type, data: Any, where: str, prefix: str = "") -> Any:
    """A `cls` from a nested mapping; an unknown key or a wrong type raises SettingsError naming both."""
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise SettingsError(f"{where}: {prefix or 'the top level'} must be a mapping of settings, "
                            f"got {type(data).__name__}")
    fields = {f.name: f for f in dataclasses.fields(cls)}
    unknown = sorted(set(data) - set(fields))
    if unknown:
        key = f"{prefix}.{unknown[0]}" if prefix else unknown[0]
        raise SettingsError(f"{where}: unknown setting {key!r}; {cls.__name__} has {', '.join(fields)}")
    types_ = field_types(cls, extras=True)
    values = {name: _value(types_[name], value, where, f"{prefix}.{name}" if prefix else name)
              for name, value in data.items()}
    try:
        return cls(**values)
    except (TypeError, ValueError) as exc:
        raise SettingsError(f"{where}: {prefix or cls.__name__}: {exc}") from exc


def _value(kind: Any, value: Any, where: str, key: str) -> Any:
    if dataclasses.is_dataclass(kind):
        return from_mapping(kind, value, where, key)
    origin, args = typing.get_origin(kind), typing.get_args(kind)
    if origin is Annotated:  # a number and its range
        value = _value(args[0], value, where, key)
        wrong = out_of_range(value, kind)
        if wrong:
            raise SettingsError(f"{where}: {key} is {value!r}; {wrong}")
        return value
    if origin is Literal:
        if value not in args:
            raise SettingsError(f"{where}: {key} is {value!r}; choose one of {', '.join(map(repr, args))}")
        return value
    if origin is tuple:
        if not isinstance(value, (list, tuple)):
            raise SettingsError(f"{where}: {key} must be a list, got {type(value).__name__} {value!r:.60}")
        return tuple(_value(args[0], item, where, f"{key}[{i}]") for i, item in enumerate(value))
    if origin in (typing.Union, types.UnionType):
        raise SettingsError(f"{where}: {key} is not a setting (it has no single type)")
    ok = isinstance(value, kind) and not (kind is int and isinstance(value, bool))
    if kind is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if kind is float and isinstance(value, str) and NUMBER.fullmatch(value.strip()):
        return float(value)  # YAML 1.1 reads 5e-7 (no dot) as a string
    if not ok:
        raise SettingsError(f"{where}: {key} must be {kind.__name__}, got {type(value).__name__} {value!r:.60}")
    return value


def to_mapping(config: Any) -> dict:
    """A config as nested plain data (tuples as lists): what YAML and Dagster run config hold."""
    out = {}
    for f in dataclasses.fields(config):
        value = getattr(config, f.name)
        if dataclasses.is_dataclass(value):
            value = to_mapping(value)
        elif isinstance(value, tuple):
            value = list(value)
        out[f.name] = value
    return out


def json_copy(data: Any) -> Any:
    """A deep copy of plain nested data."""
    if isinstance(data, dict):
        return {k: json_copy(v) for k, v in data.items()}
    return [json_copy(v) for v in data] if isinstance(data, list) else data
