"""Prompt templates (string.Template, `$name` slots) and their rendering."""

from __future__ import annotations

from functools import cache
from importlib.resources import files
from string import Template

from pipeline.core.records import Task


@cache
def template(name: str) -> Template:
    """The template `name`.txt of this package."""
    return Template(files(__package__).joinpath(f"{name}.txt").read_text(encoding="utf-8"))


def system_prompt(tools_text: str = "") -> str:
    """The system prompt; `tools_text` describes the tools when they are not passed natively."""
    return template("system").substitute(tools=f"\n{tools_text}" if tools_text else "").rstrip("\n")


def task_prompt(task: Task, *, show_tests: bool = False, guidance: str = "") -> str:
    """The first user turn: the issue and where the repository is, then the tests and guidance if any."""
    tests = ""
    if show_tests and task.FAIL_TO_PASS:
        tests = "\n\nThese tests fail now and must pass after your change:\n" + "\n".join(
            f"- {name}" for name in task.FAIL_TO_PASS)
    return template("task").substitute(
        problem_statement=task.problem_statement.strip(),
        repo=task.repo,
        workdir=task.workdir,
        tests=tests,
        guidance=f"\n\n{guidance.strip()}" if guidance.strip() else "",
    ).rstrip("\n")
