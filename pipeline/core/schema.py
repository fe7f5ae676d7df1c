"""Parquet schemas of dataclass records: derived from the fields (`fields_of`), stamped with the record's name
and `schema_version` (`record_schema`), and rows turned back into records (`from_row`)."""

from __future__ import annotations

import dataclasses
import types
import typing
from typing import Any, Mapping

import pyarrow as pa

STR, INT, FLOAT, BOOL, STRS = pa.string(), pa.int64(), pa.float64(), pa.bool_(), pa.list_(pa.string())
TURN_IDS = pa.list_(pa.list_(pa.int32()))  # (assistant turns, tokens); a turn's list null when it has none


def record_schema(fields: list[pa.Field], version: str, record: str) -> pa.Schema:
    """A schema whose metadata names the record kind and its version."""
    return pa.schema(fields, metadata={"schema_version": version, "record": record})


def fields_of(cls: type, stored_as: Mapping[str, pa.DataType] | None = None) -> list[pa.Field]:
    """The Arrow fields of a record, one per dataclass field in order: the type its annotation names,
    `stored_as[name]` for a column stored otherwise; a field whose annotation admits None is nullable."""
    hints, stored_as = typing.get_type_hints(cls), stored_as or {}
    return [pa.field(f.name, stored_as.get(f.name) or _arrow(hints[f.name], f"{cls.__name__}.{f.name}"),
                     nullable=_optional(hints[f.name])) for f in dataclasses.fields(cls)]


PLAIN = {str: pa.string(), int: pa.int64(), float: pa.float64(), bool: pa.bool_()}


def _optional(kind: Any) -> bool:
    return typing.get_origin(kind) in (typing.Union, types.UnionType) and type(None) in typing.get_args(kind)


def _arrow(kind: Any, where: str) -> pa.DataType:
    if _optional(kind):
        (kind,) = [k for k in typing.get_args(kind) if k is not type(None)]
    if kind in PLAIN:
        return PLAIN[kind]
    if typing.get_origin(kind) is tuple:
        item = typing.get_args(kind)[0]
        if item is str:
            return pa.list_(pa.string())
        if dataclasses.is_dataclass(item):
            return pa.list_(pa.struct(fields_of(item)))
    raise TypeError(f"{where}: {kind!r} has no Arrow type of its own; give the column's type in stored_as")


def columns(*pairs: tuple[str, pa.DataType], nullable: tuple[str, ...] = ()) -> list[pa.Field]:
    """Fields from (name, type) pairs; only the names in `nullable` may hold nulls."""
    return [pa.field(name, kind, nullable=name in nullable) for name, kind in pairs]


def schema_version(schema: pa.Schema) -> str:
    return (schema.metadata or {}).get(b"schema_version", b"").decode()


def schema_record(schema: pa.Schema) -> str:
    """The record kind a schema (or a file's schema) says it holds; '' when it says none."""
    return (schema.metadata or {}).get(b"record", b"").decode()


def flat(cls, row: dict[str, Any]):
    """A record from a row whose list columns become tuples (no nested records)."""
    return cls(**{f.name: tuple(row[f.name]) if isinstance(row[f.name], list) else row[f.name]
                  for f in dataclasses.fields(cls)})


def to_row(record: Any) -> dict[str, Any]:
    """Any record as a row of its schema."""
    return record.to_row() if hasattr(record, "to_row") else dataclasses.asdict(record)


def from_row(cls: type, row: dict[str, Any]) -> Any:
    """A record of type `cls` from a row of its schema."""
    return cls.from_row(row) if hasattr(cls, "from_row") else flat(cls, row)
