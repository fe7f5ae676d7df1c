"""The agent's tools (a shell, a file editor, submit) as OpenAI function-tool schemas, and their runner."""

from __future__ import annotations

import posixpath
import shlex
from dataclasses import dataclass

from sandbox.base import Sandbox

MAX_OUTPUT_CHARS = 16_000  # one observation must not fill the model's context
SNIPPET_CONTEXT = 4  # lines shown around an edit

BASH = {"type": "function", "function": {
    "name": "bash",
    "description": "Run a bash command in a persistent shell session (the working directory and exported "
                   "variables persist between calls). Returns the exit code and the combined stdout and "
                   "stderr. Commands cannot be interactive and are killed after a timeout.",
    "parameters": {"type": "object", "properties": {
        "command": {"type": "string", "description": "The bash command to run."}},
        "required": ["command"]}}}

EDIT = {"type": "function", "function": {
    "name": "edit",
    "description": "View, create and edit files. `view` shows a file with line numbers (optionally only "
                   "`view_range`) or lists a directory two levels deep. `create` writes a new file. "
                   "`str_replace` replaces `old_str`, which must occur exactly once, with `new_str`. "
                   "`insert` inserts `new_str` after line `insert_line` (0: at the top). "
                   "Relative paths are relative to the repository root.",
    "parameters": {"type": "object", "properties": {
        "command": {"type": "string", "enum": ["view", "create", "str_replace", "insert"],
                    "description": "The edit command."},
        "path": {"type": "string", "description": "File or directory path."},
        "view_range": {"type": "array", "items": {"type": "integer"},
                       "description": "view: [start, end] line numbers, 1-based and inclusive; end -1: "
                                      "to the end of the file."},
        "file_text": {"type": "string", "description": "create: the content of the new file."},
        "old_str": {"type": "string", "description": "str_replace: the exact text to replace."},
        "new_str": {"type": "string", "description": "str_replace: the replacement (default empty); "
                                                     "insert: the text to insert."},
        "insert_line": {"type": "integer", "description": "insert: the line after which to insert."}},
        "required": ["command", "path"]}}}

SUBMIT = {"type": "function", "function": {
    "name": "submit",
    "description": "Submit the current state of the repository as your solution and end the attempt.",
    "parameters": {"type": "object", "properties": {}, "required": []}}}

TOOLS = [BASH, EDIT, SUBMIT]
SCHEMAS = {tool["function"]["name"]: tool["function"]["parameters"] for tool in TOOLS}
EDIT_REQUIRED = {"view": (), "create": ("file_text",), "str_replace": ("old_str",),
                 "insert": ("insert_line", "new_str")}
JSON_TYPES = {"string": str, "integer": int, "array": list, "object": dict}


@dataclass(frozen=True)
class ToolResult:
    """What a tool call returned to the model."""

    output: str
    error: bool = False
    """The call could not do what was asked (bad arguments, no match, timeout); a non-zero exit is not one."""
    submitted: bool = False


def check_arguments(name: str, arguments: object) -> str | None:
    """Why this call cannot run (unknown tool, missing, unexpected or mistyped argument); None if it can."""
    if name not in SCHEMAS:
        return f"Error: unknown tool {name!r}. Available tools: {', '.join(SCHEMAS)}."
    if not isinstance(arguments, dict):
        return f"Error: the arguments of {name} must be a JSON object, got {type(arguments).__name__}."
    schema = SCHEMAS[name]
    properties = schema["properties"]
    for key, value in arguments.items():
        if key not in properties:
            return f"Error: {name} has no argument {key!r}; its arguments are: {', '.join(properties) or 'none'}."
        problem = _type_problem(value, properties[key])
        if problem:
            return f"Error: argument {key!r} of {name} {problem}."
    required = list(schema["required"])
    if name == "edit" and arguments.get("command") in EDIT_REQUIRED:
        required += EDIT_REQUIRED[arguments["command"]]
    missing = [key for key in required if key not in arguments]
    if missing:
        what = f"edit {arguments['command']}" if name == "edit" and "command" in arguments else name
        return f"Error: {what} needs the argument(s) {', '.join(missing)}."
    return None


def _type_problem(value: object, schema: dict) -> str:
    expected = JSON_TYPES[schema["type"]]
    if not isinstance(value, expected) or isinstance(value, bool):
        return f"must be a JSON {schema['type']}, got {type(value).__name__} {value!r:.80}"
    if "enum" in schema and value not in schema["enum"]:
        return f"must be one of {', '.join(schema['enum'])}, got {value!r:.80}"
    if schema["type"] == "array":
        for item in value:
            problem = _type_problem(item, schema["items"])
            if problem:
                return f"items {problem}"
    return ""


def execute(sandbox: Sandbox, name: str, arguments: dict, *, timeout: float = 120.0) -> ToolResult:
    """Run one tool call; model mistakes come back as error results, a SandboxError propagates."""
    problem = check_arguments(name, arguments)
    if problem:
        return ToolResult(problem, error=True)
    if name == "submit":
        return ToolResult("Submitted.", submitted=True)
    if name == "bash":
        return run_bash(sandbox, arguments["command"], timeout)
    path = posixpath.normpath(posixpath.join(sandbox.workdir, arguments["path"]))  # absolute stays absolute
    try:
        return EDIT_COMMANDS[arguments["command"]](sandbox, path, arguments)
    except FileNotFoundError:
        return ToolResult(f"Error: {path} does not exist.", error=True)
    except IsADirectoryError:
        return ToolResult(f"Error: {path} is a directory; only `view` works on directories.", error=True)
    except OSError as error:
        return ToolResult(f"Error: {path}: {error.strerror or error}.", error=True)


def run_bash(sandbox: Sandbox, command: str, timeout: float) -> ToolResult:
    """The command's exit code and output, with notes on a timeout or a restarted shell."""
    if not command.strip():
        return ToolResult("Error: the command is empty.", error=True)
    result = sandbox.run(command, timeout=timeout)
    notes = []
    if result.timed_out and not result.shell_restarted:
        notes.append(f"[the command timed out after {timeout:g} s and was killed; run long jobs in the "
                     "background or narrow them down]")
    output = _truncate(result.output.rstrip("\n"))
    return ToolResult("\n".join([f"exit code: {result.exit_code}", *notes, *([output] if output else [])]),
                      error=result.timed_out)


def _truncate(text: str) -> str:
    if len(text) <= MAX_OUTPUT_CHARS:
        return text
    half = MAX_OUTPUT_CHARS // 2
    return f"{text[:half]}\n[... {len(text) - 2 * half} characters cut ...]\n{text[-half:]}"


def _read(sandbox: Sandbox, path: str) -> str:
    # surrogateescape: bytes that are not UTF-8 survive a read-edit-write round trip
    return sandbox.read_file(path).decode("utf-8", errors="surrogateescape")


def _write(sandbox: Sandbox, path: str, text: str) -> None:
    sandbox.write_file(path, text.encode("utf-8", errors="surrogateescape"))


def _lines(text: str) -> list[str]:
    lines = text.split("\n")
    return lines[:-1] if text.endswith("\n") or not text else lines


def _join(lines: list[str]) -> str:
    return "\n".join(lines) + "\n" if lines else ""


def _numbered(lines: list[str], first: int) -> str:
    text = "\n".join(f"{first + i:6}\t{line}" for i, line in enumerate(lines))
    return _truncate(text.encode("utf-8", errors="surrogateescape").decode("utf-8", errors="replace"))


def _exists(sandbox: Sandbox, path: str) -> bool:
    return sandbox.run(f"test -e {shlex.quote(path)}", timeout=30).exit_code == 0


def view(sandbox: Sandbox, path: str, arguments: dict) -> ToolResult:
    """A file with line numbers, or a directory listed two levels deep (hidden entries left out)."""
    try:
        text = _read(sandbox, path)
    except IsADirectoryError:
        return _list_directory(sandbox, path, arguments)
    if "\0" in text:
        return ToolResult(f"Error: {path} is a binary file.", error=True)
    lines = _lines(text)
    start, end = 1, len(lines)
    if "view_range" in arguments:
        problem, start, end = _checked_range(arguments["view_range"], len(lines))
        if problem:
            return ToolResult(problem, error=True)
    header = f"Here is {path}, lines {start}-{end} of {len(lines)}:" if lines else f"{path} is empty."
    return ToolResult(f"{header}\n{_numbered(lines[start - 1:end], start)}".rstrip("\n"))


def _checked_range(view_range: list[int], count: int) -> tuple[str, int, int]:
    if len(view_range) != 2:
        return f"Error: view_range must be [start, end], got {view_range}.", 0, 0
    start, end = view_range
    end = count if end == -1 else end
    if not 1 <= start <= max(count, 1):
        return f"Error: view_range start {start} is outside the file's lines 1-{count}.", 0, 0
    if end < start:
        return f"Error: view_range end {end} is before its start {start}.", 0, 0
    return "", start, min(end, count)


def _list_directory(sandbox: Sandbox, path: str, arguments: dict) -> ToolResult:
    if "view_range" in arguments:
        return ToolResult(f"Error: {path} is a directory; view_range applies to files only.", error=True)
    listing = f"find {shlex.quote(path)} -mindepth 1 -maxdepth 2 -name '.*' -prune -o -print | sort"
    result = sandbox.run(listing, timeout=60)
    if result.exit_code != 0:
        return ToolResult(f"Error: listing {path} failed: {result.output}", error=True)
    return ToolResult(f"Files and directories up to 2 levels deep in {path} (hidden ones left out):\n"
                      + _truncate(result.output.rstrip("\n")))


def create(sandbox: Sandbox, path: str, arguments: dict) -> ToolResult:
    """A new file (parent directories made); an existing path is refused."""
    if _exists(sandbox, path):
        return ToolResult(f"Error: {path} already exists; `create` does not overwrite. "
                          "Use `str_replace` or `insert` to change it.", error=True)
    _write(sandbox, path, arguments["file_text"])
    return ToolResult(f"Created {path}.")


def str_replace(sandbox: Sandbox, path: str, arguments: dict) -> ToolResult:
    """Replace the one occurrence of old_str; zero or several occurrences change nothing."""
    old, new = arguments["old_str"], arguments.get("new_str", "")
    if not old:
        return ToolResult("Error: old_str is empty; give the exact text to replace.", error=True)
    text = _read(sandbox, path)
    starts = _occurrences(text, old)
    if not starts:
        return ToolResult(f"Error: no replacement was made: old_str does not occur verbatim in {path}. "
                          "View the file and copy the exact text, whitespace included.", error=True)
    if len(starts) > 1:
        lines = ", ".join(str(text.count("\n", 0, at) + 1) for at in starts)
        return ToolResult(f"Error: no replacement was made: old_str occurs {len(starts)} times in {path}, "
                          f"starting at lines {lines}. Include more surrounding lines to make it unique.",
                          error=True)
    _write(sandbox, path, text.replace(old, new, 1))
    first = text.count("\n", 0, starts[0]) + 1
    return _edited(sandbox, path, first, first + new.count("\n"))


def _occurrences(text: str, old: str) -> list[int]:
    starts, at = [], text.find(old)
    while at >= 0:
        starts.append(at)
        at = text.find(old, at + 1)  # overlapping matches count: each is ambiguous
    return starts


def insert(sandbox: Sandbox, path: str, arguments: dict) -> ToolResult:
    """Insert new_str after line insert_line (0: before the first line)."""
    after, new = arguments["insert_line"], arguments["new_str"]
    lines = _lines(_read(sandbox, path))
    if not 0 <= after <= len(lines):
        return ToolResult(f"Error: insert_line {after} is outside 0-{len(lines)} (the file has "
                          f"{len(lines)} lines).", error=True)
    added = _lines(new) or [""]
    _write(sandbox, path, _join(lines[:after] + added + lines[after:]))
    return _edited(sandbox, path, after + 1, after + len(added))


def _edited(sandbox: Sandbox, path: str, first: int, last: int) -> ToolResult:
    lines = _lines(_read(sandbox, path))
    start = max(first - SNIPPET_CONTEXT, 1)
    end = min(last + SNIPPET_CONTEXT, len(lines))
    return ToolResult(f"Edited {path}. Lines {start}-{end} now read:\n{_numbered(lines[start - 1:end], start)}\n"
                      "Check that the change is what you intended.")


EDIT_COMMANDS = {"view": view, "create": create, "str_replace": str_replace, "insert": insert}
