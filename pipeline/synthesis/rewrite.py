"""Bug candidates written by the teacher LLM: one function rewritten with the same signature and
docstring so that it is subtly wrong (SWE-smith's LM rewrites). A reply that does not compile,
changes the signature or docstring, or changes nothing is rejected with its reason."""

from __future__ import annotations

import ast
import copy
import hashlib
import logging
import random
import re
import textwrap
from dataclasses import dataclass
from importlib.resources import files
from pathlib import Path
from string import Template

from pipeline.agent.policy import Policy
from pipeline.synthesis.candidates import BugCandidate, _read_module, _round_robin, eligible, functions, source_files
from pipeline.synthesis.pyparse import parse_python
from pipeline.synthesis.splice import FuncNode, normal_dump, source_lines, style_of

log = logging.getLogger(__name__)

KIND = "rewrite"
MAX_LINES = 80
"""Longest function (lines, docstring included) offered to the teacher: keeps prompts and replies short."""
CODE_BLOCK = re.compile(r"```(?:python|py)?[ \t]*\n(.*?)```", re.DOTALL)
REASONS = ("no_reply", "does_not_compile", "not_one_function", "signature_changed", "docstring_changed",
           "unchanged")
"""Why a rewrite is rejected, as counted in the report (`rejected_<reason>`)."""


@dataclass(frozen=True)
class Target:
    """One function offered to the teacher."""

    file: str
    function: str
    source: str
    """The module's whole text."""
    func: FuncNode


@dataclass(frozen=True)
class Rejection:
    file: str
    function: str
    reason: str
    """One of REASONS."""
    detail: str


def rewrite_targets(root: Path, include: list[str], seed: int, limit: int) -> list[Target]:
    """Up to `limit` eligible functions, files alternating, in a seeded order."""
    per_file = []
    for file in source_files(root, include):
        module = _read_module(root / file)
        if module is None:
            continue
        found = [Target(file, name, module.text, func) for name, _, func in functions(module.tree)
                 if eligible(func) and func.end_lineno - func.lineno < MAX_LINES]
        random.Random(f"{seed}:{file}").shuffle(found)
        per_file.append(found)
    random.Random(seed).shuffle(per_file)
    return _round_robin(per_file)[:limit]


def function_text(target: Target) -> str:
    """The function's own lines (decorators included), dedented."""
    lines = [line.rstrip("\r\n") for line in source_lines(target.source)]
    start = min([d.lineno for d in target.func.decorator_list] + [target.func.lineno]) - 1
    return textwrap.dedent("\n".join(lines[start:target.func.end_lineno]))


def rewrite_prompt(target: Target, repo: str) -> str:
    template = Template(files("pipeline.synthesis").joinpath("prompts/rewrite.txt").read_text())
    return template.substitute(repo=repo, function=target.function, file=target.file, source=function_text(target))


def reply_code(text: str) -> str:
    """The code of a reply: its first ```python block, else the whole text."""
    match = CODE_BLOCK.search(text)
    return textwrap.dedent(match.group(1) if match else text).strip("\n")


def _signature(func: FuncNode) -> str:
    parts = [func.args, func.returns, *func.decorator_list]
    return f"{type(func).__name__} {func.name} " + " ".join(ast.dump(p) if p else "-" for p in parts)


def _code(func: FuncNode) -> str:
    """The function's structure with its docstring cleaned (the reply is dedented, the original not)."""
    func = copy.deepcopy(func)
    if ast.get_docstring(func) is not None:
        func.body[0].value.value = ast.get_docstring(func)
    return normal_dump(func)


def rewritten_source(target: Target, code: str) -> tuple[str | None, str, str]:
    """(the module text with the function replaced, "", "") or (None, reason, detail)."""
    try:
        tree = parse_python(code)
    except (SyntaxError, ValueError) as exc:
        return None, "does_not_compile", f"the reply does not parse: {exc}"
    if len(tree.body) != 1 or not isinstance(tree.body[0], (ast.FunctionDef, ast.AsyncFunctionDef)):
        return None, "not_one_function", f"the reply holds {len(tree.body)} statements, not one function"
    new, old = tree.body[0], target.func
    new.decorator_list = new.decorator_list or old.decorator_list  # a reply may leave the decorators out
    if _signature(new) != _signature(old):
        return None, "signature_changed", f"def {new.name}(...) differs from the original signature"
    if ast.get_docstring(new) != ast.get_docstring(old):  # cleaned: the reply is dedented
        return None, "docstring_changed", "the docstring differs from the original"
    if _code(new) == _code(old):
        return None, "unchanged", "the rewrite is the same code as the original"
    lines = source_lines(target.source)
    newline = style_of(lines, old).newline
    indent = lines[old.lineno - 1][: len(lines[old.lineno - 1]) - len(lines[old.lineno - 1].lstrip())]
    body = code.splitlines()[new.lineno - 1:new.end_lineno]  # from `def`: the file keeps its decorators
    text = "".join(indent + line + newline if line.strip() else newline for line in body)
    source = "".join(lines[:old.lineno - 1]) + text + "".join(lines[old.end_lineno:])
    try:
        compile(source, target.file, "exec", dont_inherit=True)
    except (SyntaxError, ValueError) as exc:
        return None, "does_not_compile", f"the file does not compile with the rewrite: {exc}"
    return source, "", ""


def rewrite_candidate(target: Target, writer: Policy, repo: str, seed: int) -> BugCandidate | Rejection:
    """The teacher's rewrite of one function as a bug candidate, or why it is rejected."""
    try:
        turn = writer.act([{"role": "user", "content": rewrite_prompt(target, repo)}], [], seed=seed)
        reply = (turn.message.get("content") or "").strip()
    except Exception as exc:  # any client failure loses this rewrite, never the package
        log.warning("%s: the rewriter failed on %s: %s", repo, target.function, exc)
        return Rejection(target.file, target.function, "no_reply", str(exc)[:300])
    if not reply:
        return Rejection(target.file, target.function, "no_reply", "the reply is empty")
    code = reply_code(reply)
    source, reason, detail = rewritten_source(target, code)
    if source is None:
        return Rejection(target.file, target.function, reason, detail)
    key = f"{target.file}:{target.function}:{KIND}:{hashlib.sha256(code.encode()).hexdigest()}"
    return BugCandidate(target.file, target.function, KIND, target.func.lineno, target.source, source,
                        f"{KIND} of {target.function} by {writer.name}", hashlib.sha256(key.encode()).hexdigest()[:16])


def rewrite_candidates(root: Path, include: list[str], writer: Policy, repo: str, seed: int, limit: int
                       ) -> tuple[list[BugCandidate], list[Rejection]]:
    """The teacher's rewrites of up to `limit` functions, and the rejected ones with their reasons."""
    made, rejected = [], []
    for target in rewrite_targets(root, include, seed, limit):
        result = rewrite_candidate(target, writer, repo, seed)
        (rejected if isinstance(result, Rejection) else made).append(result)
    return made, rejected
