"""Combined bugs: two or three validated bugs of one module merged into one task (SWE-smith's
"combine" strategy). Only bugs whose edits touch disjoint, non-adjacent lines combine, so both
patches apply together; the combined task is validated as a whole like any other candidate."""

from __future__ import annotations

import difflib
import functools
import hashlib
import random
from collections import defaultdict
from itertools import combinations

from pipeline.synthesis.candidates import BugCandidate, _compiles
from pipeline.synthesis.splice import source_lines

KIND = "combined"
SIZES = (2, 3)
"""How many bugs one combined task holds."""

Edit = tuple[int, int, list[str]]
"""(first original line, end original line, lines replacing them): 0-based, end exclusive."""


@functools.lru_cache(maxsize=256)  # a kept bug is in many of the groups tried: its whole-file diff, once
def edits(candidate: BugCandidate) -> tuple[Edit, ...]:
    """The line edits that turn the original file into the mutated one."""
    before, after = source_lines(candidate.original_source), source_lines(candidate.mutated_source)
    matcher = difflib.SequenceMatcher(None, before, after, autojunk=False)
    return tuple((i1, i2, after[j1:j2]) for op, i1, i2, j1, j2 in matcher.get_opcodes() if op != "equal")


def merged_source(candidates: list[BugCandidate]) -> str | None:
    """The original file with every candidate's edits applied, or None when two edits overlap or touch
    (their patches would conflict) or the candidates are not of the same file."""
    if len({(c.file, c.original_source) for c in candidates}) != 1:
        return None
    merged = sorted((e for c in candidates for e in edits(c)), key=lambda e: (e[0], e[1]))
    if any(b[0] <= a[1] for a, b in zip(merged, merged[1:])):  # overlapping or adjacent
        return None
    lines, out, at = source_lines(candidates[0].original_source), [], 0
    for start, end, new in merged:
        out += lines[at:start] + new
        at = end
    return "".join(out + lines[at:])


def combined_candidate(candidates: list[BugCandidate]) -> BugCandidate | None:
    """One candidate holding all the bugs, or None when they do not combine."""
    source = merged_source(candidates)
    if source is None or not _compiles(source, candidates[0].file):
        return None
    ordered = sorted(candidates, key=lambda c: c.candidate_id)
    key = "+".join(c.candidate_id for c in ordered)
    return BugCandidate(
        ordered[0].file, "+".join(c.function for c in ordered), KIND, min(c.lineno for c in ordered),
        ordered[0].original_source, source, " | ".join(c.description for c in ordered),
        hashlib.sha256(f"{KIND}:{key}".encode()).hexdigest()[:16],
    )


def combinations_to_try(kept: list[BugCandidate], seed: int) -> list[tuple[BugCandidate, list[BugCandidate]]]:
    """(combined candidate, its parts) for every group of 2-3 kept bugs of one file that combine, in a
    seeded order that puts groups sharing no bug with an earlier one first (spreads bugs over tasks)."""
    by_file: dict[str, list[BugCandidate]] = defaultdict(list)
    for cand in sorted(kept, key=lambda c: c.candidate_id):
        by_file[cand.file].append(cand)
    groups = [list(g) for file in sorted(by_file) for size in SIZES for g in combinations(by_file[file], size)]
    random.Random(seed).shuffle(groups)
    used: set[str] = set()
    fresh, rest = [], []
    for group in groups:
        ids = {c.candidate_id for c in group}
        (rest if ids & used else fresh).append(group)
        used |= ids
    return [(combined, group) for group in fresh + rest if (combined := combined_candidate(group)) is not None]
