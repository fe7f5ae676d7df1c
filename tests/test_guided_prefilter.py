"""`may_flag`, the polars pass that spares the Python prose and edit checks most guided successes: it must keep
every completion those checks flag (a superset), and leave out plain ones."""

from __future__ import annotations

import json

import polars as pl
import pyarrow as pa
import pytest

from pipeline.datasets.formats import chat
from pipeline.datasets.guided import may_flag
from pipeline.guidance.references import guidance_references, ungrounded
from pipeline.core.records import TRAJECTORY_SCHEMA

HINT = "Guidance (plan):\n1. Where to look: `calc.py`, in `add`, around line 2."
PROMPT = "add(2, 3) returns -1."


def stored(content: str, name: str = "bash", arguments: str = '{"command": "ls"}') -> list[dict]:
    """A stored assistant turn (tool calls as JSON text, as trajectories keep them) and its tool output."""
    call = {"id": "c0", "type": "function", "function": {"name": name, "arguments": arguments}}
    return [{"role": "assistant", "content": content, "tool_calls": json.dumps([call])},
            {"role": "tool", "content": "ok", "tool_call_id": "c0"}]


def completions(*messages: list[dict]) -> pl.Series:
    """Stored messages in the chat form `prepare` gives the checks (`formats.chat`)."""
    column = pa.array(list(messages), type=TRAJECTORY_SCHEMA.field("messages").type)
    return pl.DataFrame({"m": pl.from_arrow(column)}).select(chat(pl.col("m"))).to_series()


EDIT = json.dumps({"command": "str_replace", "path": "calc.py", "old_str": "-", "new_str": "+"})
CASES = [  # (messages, hint, prompt, may_flag, flagged by the checks)
    (stored("Run the test suite to see what fails."), HINT, PROMPT, False, False),
    (stored("Look at the module."), "", PROMPT, False, False),
    (stored("Following the reference action."), HINT, PROMPT, True, True),
    (stored("Now step 2 of the PLAN: change it."), HINT, PROMPT, True, True),
    (stored("Open calc.py around line 2."), HINT, PROMPT, True, True),  # a hint term no output showed
    (stored("Open CALC.PY around line 2."), HINT, PROMPT, True, True),
    (stored("Open calc.py around line 2."), HINT, "calc.py: add(2, 3) returns -1.", False, False),  # the prompt's
    (stored("Open calc.py around line 2."), "", PROMPT, False, False),  # no hint, no hint terms
    (stored("Fix it.", "edit", EDIT), HINT, PROMPT, True, True),  # an edit before any output showed the file
    (stored("Fix it.", "bash", json.dumps({"command": "sed -i s/-/+/ calc.py"})), HINT, PROMPT, True, True),
    (stored("Fix it.", "bash", '{"command": "\\u0073ed -i s/-/+/ calc.py"}'), HINT, PROMPT, True, True),
    (stored('Fix it.\n<tool_call>{"name": "edit", "arguments": ' + EDIT + '}</tool_call>', "bash"), HINT, PROMPT,
     True, True),
    (stored("Done, as \u017fuggested."), HINT, PROMPT, True, True),  # re.I: the long s matches "s"
]


@pytest.mark.parametrize("messages,hint,prompt,maybe,flagged", CASES)
def test_may_flag_keeps_every_completion_the_checks_flag(messages, hint, prompt, maybe, flagged):
    completion = completions(messages)
    found = guidance_references(completion[0].to_list(), hint, prompt) or ungrounded(completion[0].to_list())
    assert bool(found) == flagged
    assert may_flag(completion, [hint], [prompt]).to_list() == [maybe]


def test_may_flag_answers_each_completion_of_a_series_in_order():
    series = completions(*(messages for messages, *_ in CASES))
    expected = [maybe for *_, maybe, _ in CASES]
    assert may_flag(series, [hint for _, hint, *_ in CASES], [prompt for _, _, prompt, *_ in CASES]).to_list() \
        == expected
