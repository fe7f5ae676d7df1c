"""Whether a guided completion leans on guidance it will be trained without.

A chosen completion is trained under the unguided prompt, so it must read as if no guidance had been
given. Four checks, on completions in either tool format (native `tool_calls`, or the text format's
`<tool_call>` in the content and `<tool_response>` user turns):
- `quotes_guidance`: the assistant's prose shares a run of n words with the hint;
- `guidance_references`: an assistant turn's prose refers to guidance ("Following the reference
  action.", "as the hint suggests", "step 3 of the plan") or names a term of the hint's own that neither
  the task prompt nor any earlier tool output showed; `without_references` rewrites only that prose;
- `ungrounded`: a file is edited before any tool output showed it (its content, or its path);
- `hint_leaks_gold`: the hint shown (its text and the edits of its actions) holds a line the gold adds.
Prose never includes tool-call arguments: running a hinted command verbatim is acting, not quoting.
"""

from __future__ import annotations

import json
import re
from functools import lru_cache
from typing import Any, NamedTuple

from pipeline.agent.textformat import CLOSE, OPEN
from pipeline.guidance.teacher import leaks_patch

REFERENCE_PHRASES = (  # how a policy talks about help it was given (case-insensitive)
    r"\breference (actions?|trajectory|trajectories|steps?|solution|fix|hint|edit|command)",
    r"\b(the|a|this|that|your|given|provided|my) (hint|hints|guidance)\b",
    r"\b(as|like|what) (the |my )?(hint|guidance|plan|reference|teacher|instructions?) "
    r"(says?|said|suggests?|suggested|shows?|showed|indicates?|recommends?|describes?|tells?|told)\b",
    r"\b(following|follow|per|according to|as in) (the |my )?(hint|guidance|plan|reference|teacher)\b",
    r"\bstep \d+ of the (plan|hint|guidance|reference|trajectory)\b",
    r"\bas (suggested|instructed|advised|hinted)\b",
    r"\b(hinted|teacher)\b",
)
REFERENCE = re.compile("|".join(f"(?:{p})" for p in REFERENCE_PHRASES), re.I)
# Every phrase holds one of these words: on ASCII prose (where re.I is plain lower case) the pattern runs only
# when one is there; the build checks every turn of every guided success, and most turns hold none
REFERENCE_WORDS = ("reference", "hint", "guidance", "plan", "teacher", "instruct", "trajectory", "suggested",
                   "advised")
TOOL_CALL = re.compile(re.escape(OPEN) + r".*?(?:" + re.escape(CLOSE) + r"|$)", re.S)
CALL_BODY = re.compile(re.escape(OPEN) + r"(.*?)" + re.escape(CLOSE), re.S)
TERM = re.compile(r"`([^`\n]{3,80})`|([\w./-]+\.(?:py|cfg|toml|txt|json|yaml|yml|ini|rst|md))\b"
                  r"|\b([A-Za-z_]\w*_\w+|[a-z]+[A-Z]\w*)\b")
SENTENCE = re.compile(r"[^.!?\n]+(?:[.!?]+|$)\s*")
EDITS = {"str_replace", "insert"}


def prose(message: dict) -> str:
    """What an assistant turn says in words: its content less any text-format tool call."""
    if message.get("role") != "assistant":
        return ""
    content = message.get("content") or ""
    return TOOL_CALL.sub(" ", content) if OPEN in content else content


def calls(message: dict) -> list[tuple[str, dict]]:
    """(name, arguments) of an assistant turn's tool calls, native or in the text format."""
    if message.get("role") != "assistant":
        return []
    found = []
    for call in message.get("tool_calls") or []:
        found.append((call["function"]["name"], _arguments(call["function"].get("arguments"))))
    content = message.get("content") or ""
    for body in CALL_BODY.findall(content) if OPEN in content else ():
        parsed = _arguments(body)
        found.append((str(parsed.get("name", "")), parsed.get("arguments") or {}))
    return found


def output(message: dict) -> str | None:
    """A tool's output carried by the message (a tool turn, or a text-format `<tool_response>`); else None."""
    content = message.get("content") or ""
    if message.get("role") == "tool":
        return content
    if message.get("role") == "user" and content.lstrip().startswith("<tool_response>"):
        return content
    return None


def _arguments(text: Any) -> dict:
    if isinstance(text, dict):
        return text
    try:
        value = json.loads(text or "{}")
    except (json.JSONDecodeError, TypeError):
        return {}
    return value if isinstance(value, dict) else {}


def quotes_guidance(messages: tuple[dict, ...] | list[dict], hint: str, n: int = 8) -> bool:
    """True when the assistant's prose (never its tool-call arguments) shares a run of n words with the hint."""
    grams = _ngrams(hint, n)
    said = " ".join(prose(m) for m in messages)
    return bool(grams & _ngrams(said, n))


def _ngrams(text: str, n: int) -> set[tuple[str, ...]]:
    words = re.findall(r"\w+", text.lower())
    return {tuple(words[i:i + n]) for i in range(len(words) - n + 1)}


@lru_cache(maxsize=256)  # the attempts of a group share their hint and prompt: the terms are found once
def hint_terms(hint: str, prompt: str) -> frozenset[str]:
    """The hint's own terms (quoted spans, file names, identifiers) that the task prompt does not hold."""
    terms, prompt = {next(g for g in match.groups() if g) for match in TERM.finditer(hint)}, prompt.lower()
    return frozenset(t for t in terms if t.lower() not in prompt and t not in ("old_str", "new_str", "view_range"))


def _lowered(terms: frozenset[str]) -> dict[str, str]:
    """Each term and its lower case, computed once: the checks below look for every term in every turn."""
    return {t: t.lower() for t in terms}


class Turn(NamedTuple):
    """A message as the checks read it, parsed once: whether it is the assistant's, its prose, its tool calls
    (name, arguments, the arguments as lower-case JSON) and the tool output it carries in lower case (or None)."""

    assistant: bool
    prose: str
    calls: list[tuple[str, dict, str]]
    output: str | None


def read_turns(messages: list[dict]) -> list[Turn]:
    """Each message parsed once for `guidance_references` and `ungrounded` (a build runs both on every guided
    success: parsing the calls and lower-casing the outputs once saves a tenth of the checks' time)."""
    turns = []
    for message in messages:
        text = output(message)
        turns.append(Turn(message.get("role") == "assistant", prose(message),
                          [(name, args, json.dumps(args).lower()) for name, args in calls(message)],
                          None if text is None else text.lower()))
    return turns


def guidance_references(messages: list[dict], hint: str, prompt: str, turns: list[Turn] | None = None
                        ) -> list[tuple[int, str]]:
    """(message index, what) of each assistant turn whose prose refers to guidance: a phrase of
    REFERENCE_PHRASES, or a hint term that neither the prompt, an earlier tool output, nor the turn's own tool
    call holds (narrating one's own action is not quoting the hint: the action is there either way).
    `turns`: the messages' `read_turns`, when the caller has them."""
    found, unseen = [], _lowered(hint_terms(hint, prompt) if hint else frozenset())
    for i, turn in enumerate(turns if turns is not None else read_turns(messages)):
        if turn.assistant:  # only assistant turns have prose
            reason = _reference(turn.prose, _not_in(unseen, _own(turn)) if unseen else unseen)
            if reason:
                found.append((i, reason))
        unseen = _not_in(unseen, turn.output or "") if unseen else unseen
    return found


def _own(turn: Turn) -> str:
    """The turn's own tool-call arguments, as lower-case text a hint term may be found in."""
    return " ".join(text for _, _, text in turn.calls)


def _not_in(terms: dict[str, str], text: str) -> dict[str, str]:
    """The terms (term: lower case) `text` (lower case) does not hold. Terms hold no line break, so checking each
    output on its own finds what checking all of them joined would."""
    return {t: low for t, low in terms.items() if low not in text} if text else terms


def _reference(text: str, unseen: dict[str, str]) -> str:
    lower = text.lower()
    if not text.isascii() or any(word in lower for word in REFERENCE_WORDS):
        match = REFERENCE.search(text)
        if match:
            return f"phrase: {match.group(0)}"
    terms = [t for t, low in unseen.items() if low in lower]
    return f"hint term: {min(terms)}" if terms else ""


def without_references(messages: list[dict], hint: str, prompt: str) -> tuple[list[dict], list[dict]]:
    """(messages, rewrites): each referring turn's prose less its referring sentences, tool calls untouched;
    a rewrite per turn, {"message", "reason", "removed" (sentences)}."""
    unseen, out, rewrites = _lowered(hint_terms(hint, prompt) if hint else frozenset()), [], []
    for i, (message, turn) in enumerate(zip(messages, read_turns(messages))):
        now = _not_in(unseen, _own(turn))
        reason = _reference(turn.prose, now)
        if reason:
            kept, removed = _rewritten(message.get("content") or "", now)
            rewrites.append({"message": i, "reason": reason, "removed": removed})
            message = {**message, "content": kept}
        out.append(message)
        unseen = _not_in(unseen, turn.output or "")  # a rewritten turn is the assistant's: it carries no output
    return out, rewrites


def _rewritten(content: str, unseen: dict[str, str]) -> tuple[str, int]:
    """The content without its referring sentences (text-format tool calls kept as they are)."""
    parts, kept, removed, last = [], [], 0, 0
    for call in TOOL_CALL.finditer(content):
        parts += [(content[last:call.start()], True), (call.group(0), False)]
        last = call.end()
    parts.append((content[last:], True))
    for text, is_prose in parts:
        if not is_prose:
            kept.append(text)
            continue
        for sentence in SENTENCE.findall(text):
            if _reference(sentence, unseen):
                removed += 1
            else:
                kept.append(sentence)
    return "".join(kept).strip(), removed


def edited_paths(name: str, args: dict) -> list[str]:
    """Existing files a tool call changes: the edit tool's path (str_replace, insert), or `sed -i`'s files.
    Creating a file needs no knowledge of it, and a redirect mostly writes scratch output: neither counts."""
    if name == "edit" and args.get("command") in EDITS and args.get("path"):
        return [str(args["path"])]
    command = str(args.get("command", "")) if name == "bash" else ""
    if not re.search(r"\bsed\s+(-\w+\s+)*-i", command):
        return []
    return re.findall(r"[\w./-]+\.(?:py|cfg|toml|txt|json|ya?ml|ini)\b", command)


def _shows(path: str, shown: list[str]) -> bool:
    """Whether an output showed the path (paths hold no line break: each output is searched on its own)."""
    name = path.removeprefix("./").lstrip("/").lower()
    return any(name in text or name.rsplit("/", 1)[-1] in text for text in shown)


def ungrounded(messages: list[dict], turns: list[Turn] | None = None) -> list[str]:
    """Files edited before any tool output showed them: their path in an output (a listing, search or
    traceback), or their content (an earlier call naming the file whose output was not an error).
    `turns`: the messages' `read_turns`, when the caller has them."""
    shown, reads, found = [], "", []  # shown: what earlier outputs showed, lower case, one entry each
    for turn in turns if turns is not None else read_turns(messages):
        if turn.output is not None:
            failed = re.sub(r"^\s*(<tool_response>\s*)?", "", turn.output).startswith("error")
            shown += [turn.output] if failed else [turn.output, reads]
            continue
        reads = ""
        for name, args, text in turn.calls:
            writes = edited_paths(name, args)
            found += [p for p in writes if not _shows(p, shown) and p not in found]
            reads += "" if writes else " " + text
    return found


def action_edits(actions: list[dict]) -> str:
    """The text reference actions write into files (their new_str / file_text), decoded from JSON."""
    return "\n".join(str(a["args"].get(key, "")) for a in actions for key in ("new_str", "file_text")
                     if isinstance(a.get("args"), dict) and a["args"].get(key))


def hint_leaks_gold(text: str, actions: list[dict], patch: str) -> bool:
    """True when the hint shown (its text, and what its actions write) holds a line the gold patch adds."""
    return bool(patch) and leaks_patch(text + "\n" + action_edits(actions), patch)
