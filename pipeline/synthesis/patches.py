"""A synthesized bug as patches: the bug (original to mutated file) and the gold patch (back again), as
git-style unified diffs that `git apply` takes."""

from __future__ import annotations

import difflib

from pipeline.synthesis.candidates import BugCandidate


def _git_lines(text: str) -> list[str]:
    # git splits on \n only; a \r stays part of the line.
    lines = text.split("\n")
    return [line + "\n" for line in lines[:-1]] + ([lines[-1]] if lines[-1] else [])


def file_diff(path: str, before: str, after: str) -> str:
    """A git-style unified diff of one file (3 lines of context), applicable with `git apply`."""
    hunks = list(difflib.unified_diff(_git_lines(before), _git_lines(after), f"a/{path}", f"b/{path}", n=3))
    if not hunks:
        return ""
    out = [f"diff --git a/{path} b/{path}\n"]
    for line in hunks:
        out.append(line if line.endswith("\n") else line + "\n\\ No newline at end of file\n")
    return "".join(out)


def gold_patch(candidate: BugCandidate) -> str:
    """The fix: the diff that turns the mutated file back into the original."""
    return file_diff(candidate.file, candidate.mutated_source, candidate.original_source)


def bug_patch(candidate: BugCandidate) -> str:
    """The bug: the diff that turns the original file into the mutated one."""
    return file_diff(candidate.file, candidate.original_source, candidate.mutated_source)
