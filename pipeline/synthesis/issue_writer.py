"""Problem statements for synthesized bugs: written by the teacher LLM when one is configured,
from templates otherwise (or when the LLM's text fails, is too short, or quotes the fix)."""

from __future__ import annotations

import logging
from importlib.resources import files
from string import Template

from pipeline.agent.policy import Policy
from pipeline.guidance.teacher import leaks_patch
from pipeline.synthesis.statements import problem_statement

log = logging.getLogger(__name__)


def written_statement(writer: Policy | None, repo: str, failing_tests: list[str], messages: dict[str, str],
                      patch: str, seed: int, subjects: list[str] = ()) -> str:
    """The issue text for a bug, never revealing the fix; `subjects`: the package's names the tests exercise."""
    fallback = problem_statement(repo, failing_tests, messages, seed=seed, patch=patch, subjects=subjects)
    if writer is None:
        return fallback
    prompt = Template(files("pipeline.synthesis").joinpath("prompts/issue.txt").read_text()).substitute(
        repo=repo, tests="\n".join(failing_tests), subjects="\n".join(subjects) or f"the package {repo} itself",
        messages="\n".join(f"{t}: {m[:500]}" for t, m in messages.items() if t in failing_tests) or "(none)")
    try:
        text = (writer.act([{"role": "user", "content": prompt}], [], seed=seed).message.get("content") or "").strip()
    except Exception as exc:  # any client failure falls back to the template, never loses the task
        log.warning("%s: the statement writer failed (%s); using a template", repo, exc)
        return fallback
    if len(text) < 40 or leaks_patch(text, patch):
        log.warning("%s: the written statement is too short or quotes the fix; using a template", repo)
        return fallback
    return text + "\n"
