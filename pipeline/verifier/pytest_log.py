"""pytest's output as the harness reads it: what its own runs neutralise, and a parser of the rest.

Every pytest run of the harness (a package's suite in synthesis, a grade) gets `neutral_addopts` in PYTEST_ADDOPTS,
which pytest places after a package's ini `addopts` (so the package cannot override them; the command line still
can): colour off, the report-replacing pytest-pretty blocked and, for runs this module parses, every outcome in the
short summary (`-rA`). A grade keeps pytest-xdist in one process through its guard plugin (pytest_guard.py).
PY_COLORS=0 covers what the options cannot: a command that says `--color=auto` where FORCE_COLOR is set. NO_COLOR is
not set: the code under test reads it (rich, click), and a test of its colours would fail.

`summary_statuses` is the parser of synthesized tasks: it reads the last `short test summary info` section only, and
each id whole, so that neither a line a test prints (pyparsing's examples print `PASSED (307 tests)`, which `-rA`
shows in its PASSES section) nor a space, bracket, ` - `, tab or newline inside a parametrized id changes what it
reads; ANSI escapes are stripped first. swebench's parsers stay for the task rows that name them (their test lists
were made by those parsers), on a log stripped of escapes too.
"""

from __future__ import annotations

import re

SUMMARY_PARSER = "handhold_pytest_summary"
"""The log_parser name of `summary_statuses`, registered in swebench's PARSER_REGISTRY beside its own."""
REPORT_PLUGINS = ("pretty",)
"""pytest plugins that replace the short summary (pytest-pretty prints a table of failures, no PASSED lines), by
entry-point name; `-p no:NAME` blocks `NAME` and `pytest_NAME` (pytest-sugar is left: it is inert without a
terminal, and blocking it turns a package's `--force-sugar` into a usage error)."""
PY_COLORS = "PY_COLORS=0"
# CSI sequences (colours, bold: pytest's markup), OSC ones (hyperlinks) and the other two-byte escapes
ANSI = re.compile(r"\x1b\[[0-?]*[ -/]*[@-~]|\x1b\][^\x07\x1b]*(?:\x07|\x1b\\)|\x1b[@-Z\\-_]")
HEADER = re.compile(r"^=+ short test summary info =+$")
SECTION_END = re.compile(r"^(={3,}|!{3,})( |$)")  # the closing stats line, `!!! Interrupted ...`, a later section
WORD = re.compile(r"^([A-Z]+) (.*)$", re.DOTALL)
STATUSES = {"PASSED", "FAILED", "ERROR", "SKIPPED", "XFAIL", "XPASS"}
WITHOUT_MESSAGE = {"PASSED"}  # pytest appends ` - <message>` to every other kind of line


def strip_ansi(text: str) -> str:
    return ANSI.sub("", text)


def neutral_addopts(summary: bool = False) -> list[str]:
    """Options for PYTEST_ADDOPTS; `summary`: every outcome in the short summary (for `summary_statuses`)."""
    return ["--color=no", *(f"-p no:{p}" for p in REPORT_PLUGINS), *(["-rA"] if summary else [])]


def neutral_exports(summary: bool = False) -> str:
    """Shell exporting PY_COLORS and PYTEST_ADDOPTS for a run of the harness's own."""
    return f"export {PY_COLORS} PYTEST_ADDOPTS='{' '.join(neutral_addopts(summary))}'"


def report_plugins(plugins: list[str]) -> list[str]:
    """`plugins` (module names) less the ones that replace the short summary."""
    blocked = {name for p in REPORT_PLUGINS for name in (p, f"pytest_{p}")}
    return [p for p in plugins if p.split(".")[0] not in blocked]


def summary_statuses(log: str, test_spec=None) -> dict[str, str]:
    """Test id -> PASSED, FAILED, ERROR, SKIPPED, XFAIL or XPASS, from the last short test summary of `log` (a
    swebench log parser's signature; `test_spec` is not read). A test named twice keeps its last line: `-rA` prints
    errors and failures after passes, so a test whose teardown failed reads ERROR."""
    lines = strip_ansi(log).split("\n")  # not splitlines: an id may hold a \r, \v or \x1c that pytest prints raw
    starts = [i for i, line in enumerate(lines) if HEADER.match(line.rstrip("\r"))]
    if not starts:
        return {}
    records: list[list[str]] = []  # [status, text after the word]
    for line in lines[starts[-1] + 1:]:
        if SECTION_END.match(line):
            break
        word = WORD.match(line)
        open_id = records and records[-1][1].count("[") > records[-1][1].count("]")
        if word and (word.group(1) in STATUSES or not open_id):
            records.append([word.group(1), word.group(2)])  # another plugin's word (RERUN) is kept, then dropped
        elif open_id:
            records[-1][1] += "\n" + line  # an id pytest prints unescaped (its ini says so) went on past a newline
    statuses = {}
    for status, text in records:
        if status not in STATUSES or (status == "SKIPPED" and re.match(r"\[\d+\] ", text)):
            continue  # another plugin's word, or folded skips: `SKIPPED [2] tests/test_a.py:12: reason`
        test = node_id(re.sub(r"^at (setup|call|teardown) of ", "", text), status not in WITHOUT_MESSAGE)
        if test:
            statuses[test] = status
    return statuses


def node_id(text: str, message: bool) -> str:
    """The test id at the start of `text`, which may go on with ` - <message>`: the first cut at a ` - ` whose head
    closes every bracket it opens (`test_x[a - b] - assert 0`), and names a test or a file when the rest does; else
    the first head that ends with a bracket (a parameter `[` opens one for good); else all of it."""
    if not message or " - " not in text:
        return text.rstrip("\r")
    heads = [text[:m.start()] for m in re.finditer(" - ", text)]
    named = [h for h in heads if "::" in h or h.endswith(".py")] if "::" in text or ".py" in text else heads
    closed = [h for h in named if h.count("[") <= h.count("]")]
    ended = [h for h in heads if h.endswith("]")]
    return (closed or ended or [text])[0]


def register() -> None:
    """Make SUMMARY_PARSER a name swebench's grading looks up (get_logs_eval reads PARSER_REGISTRY)."""
    from swebench.harness.log_parsers import PARSER_REGISTRY

    PARSER_REGISTRY.setdefault(SUMMARY_PARSER, summary_statuses)
