"""Issue-like problem statements written from failing tests, never from the fix."""

from __future__ import annotations

import random
import re
import textwrap
from collections.abc import Sequence

MAX_MESSAGE_LINES = 6
MAX_LINE_CHARS = 160
MAX_LISTED_TESTS = 8
MAX_QUOTED_ERRORS = 2
TEMPLATES_VERSION = 3
"""In the synthesized tasks' cache key (task_cache.py): tasks cached with older texts are made again.
2: subjects found in the package's source, no longer guessed from the tests' names; a seed per task.
3: object addresses in quoted errors masked (a task's text is the same in every synthesis)."""

SUMMARY_LINE = re.compile(r"^(?:FAILED|ERROR) (?P<test>\S+?(?:\[.*?\])?)(?= - |$)(?: - (?P<message>.*))?$")
SECTION_HEADER = re.compile(r"^_{3,} (?P<name>.+?) _{3,}$")
BANNER = re.compile(r"^={3,}.*={3,}$")
ERROR_LINE = re.compile(r"^E(?: (?P<text>.*))?$")
EXCEPTION_NAME = re.compile(r"\b(?P<name>[A-Z]\w*(?:Error|Exception|Warning)|StopIteration|KeyboardInterrupt)\b")
SECTION_PREFIX = re.compile(r"^ERROR (?:at (?:setup|teardown) of|collecting) ")
NOISE = re.compile(r"^\s*(?:Use -v to get|Full diff:|\.\.\.Full output truncated)")
ANSI_ESCAPE = re.compile(r"\x1b\[[0-9;]*m")
# an object's address: `<Obj at 0x7f66557b08d0>`, or in a repr pytest cut, `<Ob...x7f66557b08d0>`
ADDRESS = re.compile(r"(?:\b0|(?<=\.\.\.))x[0-9a-fA-F]{6,16}\b")


def failure_messages_from_log(log: str) -> dict[str, str]:
    """Short failure reasons per test id from a `pytest -rA` log (summary lines and `E` lines)."""
    log = ANSI_ESCAPE.sub("", log)
    sections = _error_lines_by_section(log)
    messages: dict[str, str] = {}
    for line in log.splitlines():
        match = SUMMARY_LINE.match(line.rstrip())
        if match is None:
            continue
        test = match["test"]
        section_name = test.split("::", 1)[-1].replace("::", ".")
        messages[test] = sections.pop(section_name, "") or (match["message"] or "").strip()
    if not messages:  # a log without the -rA summary: key by the section titles
        messages = dict(sections)
    return messages


def _error_lines_by_section(log: str) -> dict[str, str]:
    sections: dict[str, list[str]] = {}
    current: list[str] | None = None
    for line in log.splitlines():
        header = SECTION_HEADER.match(line.rstrip())
        if header is not None:
            current = sections.setdefault(SECTION_PREFIX.sub("", header["name"]), [])
        elif BANNER.match(line.rstrip()):
            current = None
        elif current is not None and (error := ERROR_LINE.match(line.rstrip())) is not None:
            current.append(error["text"] or "")
    return {name: textwrap.dedent("\n".join(lines)).strip() for name, lines in sections.items()}


def trimmed(message: str, patch: str = "") -> str:
    """At most a few short lines of message, none of them quoting the patch's source lines; object addresses
    masked (they differ in every run of the tests)."""
    quoted = _patch_contents(patch)
    message = ADDRESS.sub(lambda m: m[0][:m[0].index("x") + 1] + "…", message)
    lines = [line for line in message.strip().splitlines() if line.strip() and not NOISE.match(line)]
    lines = [line for line in lines if not any(q in line for q in quoted)]
    lines = [line if len(line) <= MAX_LINE_CHARS else line[: MAX_LINE_CHARS - 3] + "..." for line in lines]
    return "\n".join(lines[:MAX_MESSAGE_LINES] + (["..."] if len(lines) > MAX_MESSAGE_LINES else []))


def _patch_contents(patch: str) -> set[str]:
    contents = set()
    for line in patch.splitlines():
        if line.startswith(("+", "-")) and not line.startswith(("+++", "---")):
            content = line[1:].strip()
            if len(content) >= 4 and any(ch.isalnum() for ch in content):
                contents.add(content)
    return contents


def _symptom(message: str) -> str:
    exception = EXCEPTION_NAME.search(message)
    if exception is None or exception["name"] == "AssertionError":
        return "The results are not what the documentation describes."
    return f"It raises `{exception['name']}` on inputs that used to work."


def _test_list(failing_tests: list[str]) -> str:
    shown = [f"- `{test}`" for test in failing_tests[:MAX_LISTED_TESTS]]
    hidden = len(failing_tests) - len(shown)
    return "\n".join(shown + ([f"- … and {hidden} more"] if hidden > 0 else []))


def _quoted_errors(failing_tests: list[str], failure_messages: dict[str, str], patch: str) -> str:
    blocks = []
    for test in failing_tests:
        message = trimmed(failure_messages.get(test, ""), patch)
        if message:
            blocks.append(f"`{test}`:\n```\n{message}\n```")
        if len(blocks) == MAX_QUOTED_ERRORS:
            break
    return "\n\n".join(blocks)


TEMPLATES = (
    "{title}\n\nAfter upgrading {repo} to the latest commit, {subjects} no longer {behave} as expected. "
    "{symptom}\n\nThe following tests fail:\n\n{tests}\n\n{errors_heading}{errors}",
    "Bug: {subjects} {give} wrong results\n\n**Describe the bug**\n{symptom}\n\n**To reproduce**\n"
    "Run the test suite of {repo}; these tests fail:\n\n{tests}\n\n**Expected behaviour**\n"
    "The tests succeed, as they did on the previous release.\n\n{errors_heading}{errors}",
    "{title}\n\nI think there is a regression in {subjects}. {symptom} "
    "I hit this in my own code first and then saw that the project's tests catch it too:\n\n{tests}\n\n"
    "{errors_heading}{errors}",
)


def problem_statement(
    repo: str, failing_tests: list[str], failure_messages: dict[str, str], *, seed: int, patch: str = "",
    subjects: Sequence[str] = ()
) -> str:
    """An issue-like text from the failing tests and their errors; patch (the fix), if given, is never quoted.
    `subjects`: the package's dotted names the tests exercise (subjects.py); without any, the package's name."""
    if not failing_tests:
        raise ValueError(f"problem_statement for {repo} needs at least one failing test (FAIL_TO_PASS is empty)")
    rng = random.Random(seed)
    package = repo.rstrip("/").rsplit("/", 1)[-1]
    names = [f"`{name}`" for name in list(subjects)[:3] or [package]]
    subject_text = names[0] if len(names) == 1 else ", ".join(names[:-1]) + " and " + names[-1]
    errors = _quoted_errors(failing_tests, failure_messages, patch)
    first_message = next((failure_messages.get(t, "") for t in failing_tests if failure_messages.get(t)), "")
    text = rng.choice(TEMPLATES).format(
        title=f"{names[0]} misbehaves" if rng.random() < 0.5 else f"Regression in {names[0]}",
        repo=repo,
        subjects=subject_text,
        behave="behaves" if len(names) == 1 else "behave",
        give="gives" if len(names) == 1 else "give",
        symptom=_symptom(trimmed(first_message, patch)),
        tests=_test_list(failing_tests),
        errors_heading=("Error:\n\n" if rng.random() < 0.5 else "Output:\n\n") if errors else "",
        errors=errors,
    )
    return text.rstrip() + "\n"
