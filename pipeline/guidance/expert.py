"""An expert action script derived from a task's gold patch: locate, view, edit, test, submit."""

from __future__ import annotations

import re
import shlex

from pipeline.core.records import Task

HUNK = re.compile(r"^@@ -(\d+)(?:,\d+)? \+\d+(?:,\d+)? @@.*$")


def patch_edits(patch: str) -> list[tuple[str, int, str, str]]:
    """(path, first line, old text, new text) of every hunk of a unified diff."""
    edits, path, start, old, new = [], "", 0, [], []

    def flush() -> None:
        if old or new:
            edits.append((path, start, "\n".join(old), "\n".join(new)))

    for line in patch.splitlines():
        if line.startswith("+++ "):
            path = line[4:].removeprefix("b/")
        elif match := HUNK.match(line):
            flush()
            start, old, new = int(match.group(1)), [], []
        elif line.startswith(("diff --git", "--- ", "index ", "\\ ")):
            continue
        elif line.startswith("-"):
            old.append(line[1:])
        elif line.startswith("+"):
            new.append(line[1:])
        elif line.startswith(" ") or line == "":
            old.append(line[1:])
            new.append(line[1:])
    flush()
    return edits


def expert_actions(task: Task) -> list[dict]:
    """Tool calls an expert would make to fix the task, as [{"name", "args"}] (no reasoning)."""
    edits = patch_edits(task.patch)
    actions: list[dict] = []
    for path in dict.fromkeys(e[0] for e in edits):
        stem = path.rsplit("/", 1)[-1].removesuffix(".py")
        actions.append({"name": "bash", "args": {"command": f"cd {shlex.quote(task.workdir)} && grep -rln "
                                                            f"{shlex.quote(stem)} --include='*.py' . | head -n 20"}})
    for path, start, old, new in edits:
        actions.append({"name": "edit", "args": {"command": "view", "path": path,
                                                 "view_range": [max(1, start - 5), start + 15]}})
        actions.append({"name": "edit", "args": {"command": "str_replace", "path": path, "old_str": old,
                                                 "new_str": new}})
    actions.append({"name": "bash", "args": {"command": f"cd {shlex.quote(task.workdir)} && (set -o pipefail; "
                                                        f"{task.test_cmd} 2>&1 | tail -n 20)"}})
    actions.append({"name": "submit", "args": {}})
    return actions
