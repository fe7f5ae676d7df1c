"""Find secrets in dataset tables before they leave the machine.

Every string of every column is scanned, strings nested in lists, structs and maps included:
API keys and tokens by their published shapes, private-key blocks, and high-entropy values
assigned to key/token/secret names (`OPENAI_API_KEY=...`, `"token": "..."`). A finding names
where the secret is (config, split, row, column path) and which pattern matched, with an
excerpt in which every secret is redacted: a finding can be logged, a secret never is.

The patterns are written in the regex dialect both Python and RE2 (Arrow's compute kernels)
accept, so Arrow pre-filters the strings in C++ and Python only looks at the few that hit.
"""

from __future__ import annotations

import math
import re
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator, Mapping, Union

import polars as pl
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

Frame = Union[pl.DataFrame, pa.Table]

MIN_ENTROPY = 3.5
"""Bits per character a value assigned to a secret-looking name needs to count as a secret;
random base62 keys score 4.5-5.5, hex digests ~3.8, words and dotted names mostly below 3.5."""

# A secret-looking name: SHOUTING env-var style may take a bare value (`API_KEY=abc`, `TOKEN: abc`);
# any other case must quote it (`api_key = "abc"`, `"token": "abc"`), since bare values there are code.
# A lone `key` is a dict key or a sort key far more often than a secret, so KEY needs a prefix.
_CAPS_NAME = r"(?:[A-Z0-9]+_)*(?:APIKEY|TOKEN|SECRET|PASSWORD|PASSWD|CREDENTIALS?)|(?:[A-Z0-9]+_)+KEY"
_ANY_NAME = (r"(?:[A-Za-z0-9]+_)*(?i:apikey|token|secret|password|passwd|credentials?)"
             r"|(?:[A-Za-z0-9]+_)+(?i:key)")
_ENV_KEEP = (rf"\b(?:(?:{_CAPS_NAME})\b[\"']?\s*[:=]\s*[\"']?"
             rf"|(?:{_ANY_NAME})\b[\"']?\s*[:=]\s*[\"'])")
_KEY_HEAD = r"-----BEGIN [A-Z0-9 ]*PRIVATE KEY(?: BLOCK)?-----"

PATTERNS: dict[str, tuple[str, str]] = {
    "anthropic_key": (r"\bsk-ant-[A-Za-z0-9_\-]{20,}", "sk-ant-"),
    "openai_key": (r"\bsk-(?:proj|svcacct|admin)-[A-Za-z0-9_\-]{20,}|\bsk-[A-Za-z0-9]{32,}",
                   r"sk-(?:proj-|svcacct-|admin-)?"),
    "huggingface_token": (r"\bhf_[A-Za-z0-9]{30,}", "hf_"),
    "github_token": (r"\bgh[pousr]_[A-Za-z0-9]{36,}|\bgithub_pat_[A-Za-z0-9_]{40,}", r"gh[pousr]_|github_pat_"),
    "aws_access_key": (r"\b(?:AKIA|ASIA)[0-9A-Z]{16}\b", "AKIA|ASIA"),
    "slack_token": (r"\bxox[abposr]-[A-Za-z0-9\-]{10,}", r"xox[abposr]-"),
    "bearer_token": (r"\b[Bb]earer\s+[A-Za-z0-9\-._~+/]{20,}=*", r"[Bb]earer\s+"),
    # a header with a body (optional 'Proc-Type: ...' lines, then base64), newlines raw or JSON-escaped
    "private_key": (_KEY_HEAD + r"(?:\s|\\[rn])*(?:[A-Za-z-]+: [^\n\\]*(?:\s|\\[rn])+)*[A-Za-z0-9+/=]{16,}"
                    r"[\s\S]*?(?:-----END [A-Z0-9 ]*-----|$)", _KEY_HEAD),
    "env_assignment": (_ENV_KEEP + r"[A-Za-z0-9+/=_\-.~]{16,}", _ENV_KEEP),
}
"""Pattern name -> (regex of a secret, regex of its public head that excerpts keep readable)."""

_COMPILED = {name: (re.compile(rx, re.ASCII), re.compile(keep, re.ASCII)) for name, (rx, keep) in PATTERNS.items()}
_PREFILTER = "|".join(f"(?:{rx})" for rx, _ in PATTERNS.values())
_GATED = {"bearer_token": 3.0, "env_assignment": None}  # None: MIN_ENTROPY (or the caller's)
GENERIC = ("env_assignment",)  # reported only where no specific pattern matched the same text
EXCERPT_CONTEXT = 24  # characters kept on each side of a secret in an excerpt


@dataclass(frozen=True)
class SecretFinding:
    """One secret found in a table cell (or in a text file of an exported folder)."""

    config: str
    """Dataset config; for a text file, its path in the folder."""
    split: str
    """Split; '' for a text file."""
    row: int
    """Row index in the split (0-based); for a text file, the line number (1-based)."""
    column: str
    """Column path to the string, e.g. 'messages[].content'; '' for a text file."""
    pattern: str
    """Name in PATTERNS."""
    excerpt: str
    """The surrounding text with every secret replaced by '[REDACTED n chars]'."""

    def describe(self) -> str:
        where = f"{self.config}/{self.split} row {self.row} column {self.column}" if self.split \
            else f"{self.config} line {self.row}"
        return f"{where}: {self.pattern}: {self.excerpt}"


def shannon_entropy(text: str) -> float:
    """Bits per character of `text`'s character distribution."""
    counts, total = Counter(text), len(text)
    return -sum(n / total * math.log2(n / total) for n in counts.values()) if total else 0.0


def _is_secret(pattern: str, secret: str, min_entropy: float) -> bool:
    """Entropy gate for the generic patterns; placeholders and words are not secrets."""
    if pattern not in _GATED:
        return True
    threshold = _GATED[pattern] or min_entropy
    letters_and_digits = any(c.isdigit() for c in secret) and any(c.isalpha() for c in secret)
    return letters_and_digits and shannon_entropy(secret) >= threshold


def _head(pattern: str, text: str, start: int, end: int) -> int:
    """Where the secret proper starts in text[start:end] (after the public head)."""
    head = _COMPILED[pattern][1].match(text, start, end)
    return head.end() if head else start


def _overlaps(span: tuple[str, int, int], spans: list[tuple[str, int, int]]) -> bool:
    return any(span[1] < end and start < span[2] for _, start, end in spans)


def find_secrets(text: str, min_entropy: float = MIN_ENTROPY) -> list[tuple[str, int, int]]:
    """(pattern, start, end) of each secret in `text`, in order; overlapping matches count once."""
    specific: list[tuple[str, int, int]] = []
    generic: list[tuple[str, int, int]] = []
    for name, (rx, _) in _COMPILED.items():
        for match in rx.finditer(text):
            span = (name, match.start(), match.end())
            if _is_secret(name, text[_head(name, text, *span[1:]):span[2]], min_entropy):
                (generic if name in GENERIC else specific).append(span)
    kept: list[tuple[str, int, int]] = []
    for span in sorted(specific, key=lambda s: (s[1], -s[2])) + sorted(generic, key=lambda s: s[1]):
        if not _overlaps(span, kept):
            kept.append(span)
    return sorted(kept, key=lambda s: s[1])


def redact(text: str, spans: list[tuple[str, int, int]]) -> tuple[str, list[tuple[int, int]]]:
    """`text` with each span's secret replaced (its public head stays), and where each span now lies."""
    out, where, at, length = [], [], 0, 0
    for name, start, end in spans:
        cut = _head(name, text, start, end)
        pieces = [text[at:start], text[start:cut], f"[REDACTED {end - cut} chars]"]
        where.append((length + len(pieces[0]), length + sum(map(len, pieces))))
        out += pieces
        length += sum(map(len, pieces))
        at = end
    return "".join(out + [text[at:]]), where


def excerpt(text: str, spans: list[tuple[str, int, int]], focus: int) -> str:
    """A one-line window of the redacted text around spans[focus]."""
    redacted, where = redact(text, spans)
    start, end = where[focus]
    window = redacted[max(0, start - EXCERPT_CONTEXT):end + EXCERPT_CONTEXT]
    return window.replace("\r", "\\r").replace("\n", "\\n")


def _string_leaves(array: pa.Array, rows: pa.Array, path: str) -> Iterator[tuple[str, pa.Array, pa.Array]]:
    """(column path, string values, row index of each value) for every string inside `array`."""
    kind = array.type
    if pa.types.is_string(kind) or pa.types.is_large_string(kind) or pa.types.is_string_view(kind):
        yield path, array.cast(pa.large_string()), rows
    elif pa.types.is_map(kind):
        parents = pc.take(rows, pc.list_parent_indices(array))
        yield from _string_leaves(array.keys, parents, path + "{key}")
        yield from _string_leaves(array.items, parents, path + "{value}")
    elif pa.types.is_list(kind) or pa.types.is_large_list(kind) or pa.types.is_fixed_size_list(kind) \
            or pa.types.is_list_view(kind) or pa.types.is_large_list_view(kind):
        parents = pc.take(rows, pc.list_parent_indices(array))
        yield from _string_leaves(array.flatten(), parents, path + "[]")
    elif pa.types.is_struct(kind):
        for field, child in zip(kind, array.flatten()):
            yield from _string_leaves(child, rows, f"{path}.{field.name}")
    elif pa.types.is_dictionary(kind):
        yield from _string_leaves(array.dictionary_decode(), rows, path)


def _as_arrow(frame: Frame) -> pa.Table:
    return frame.to_arrow() if isinstance(frame, pl.DataFrame) else frame


def scan_table(frame: Frame, config: str, split: str, min_entropy: float = MIN_ENTROPY) -> list[SecretFinding]:
    """Every secret in every string of one table, first by column then by row."""
    table = _as_arrow(frame)
    findings: list[SecretFinding] = []
    row_ids = pa.array(range(table.num_rows), pa.int64())
    for name in table.column_names:
        column = table.column(name).combine_chunks() if table.num_rows else pa.array([], table.schema.field(name).type)
        for path, values, rows in _string_leaves(column, row_ids, name):
            hits = pc.fill_null(pc.match_substring_regex(values, pattern=_PREFILTER), False)
            for value, row in zip(values.filter(hits).to_pylist(), rows.filter(hits).to_pylist()):
                spans = find_secrets(value, min_entropy)
                findings += [SecretFinding(config, split, row, path, spans[i][0], excerpt(value, spans, i))
                             for i in range(len(spans))]
    return findings


def scan_tables(tables: Mapping[str, Mapping[str, Frame]], min_entropy: float = MIN_ENTROPY) -> list[SecretFinding]:
    """scan_table over {config: {split: table}}."""
    return [f for config, splits in tables.items() for split, frame in splits.items()
            for f in scan_table(frame, config, split, min_entropy)]


def scan_text_file(path: Path, name: str, min_entropy: float = MIN_ENTROPY) -> list[SecretFinding]:
    """Secrets in a text file, by line; `name` is how findings call the file."""
    findings = []
    for number, line in enumerate(path.read_text(errors="replace").splitlines(), start=1):
        spans = find_secrets(line, min_entropy)
        findings += [SecretFinding(name, "", number, "", spans[i][0], excerpt(line, spans, i))
                     for i in range(len(spans))]
    return findings


TEXT_SUFFIXES = (".md", ".txt", ".json", ".jsonl", ".yaml", ".yml", ".csv")


def scan_folder(folder: Path, min_entropy: float = MIN_ENTROPY) -> list[SecretFinding]:
    """Secrets in an exported folder: Parquet shards (data/<config>/<split>-*.parquet) and text files."""
    findings: list[SecretFinding] = []
    for path in sorted(p for p in folder.rglob("*") if p.is_file()):
        relative = path.relative_to(folder).as_posix()
        if path.suffix == ".parquet":
            config = path.parent.name
            split = path.name.split("-", 1)[0]
            findings += scan_table(pq.read_table(path), config, split, min_entropy)
        elif path.suffix in TEXT_SUFFIXES:
            findings += scan_text_file(path, relative, min_entropy)
    return findings
