"""A pytest plugin that synthesis loads into its sandbox, never into a task's: which functions of the tree
each test runs. Loaded with `-p`, it traces function calls only (no line events): each code object a
test's setup, call and teardown enter is recorded under the test's id; what runs outside any test (imports,
collection) under "outside". At the end it writes {"tests": {id: [[file, first line], ...]}, "outside": [...]}
for the files under HANDHOLD_CALLMAP_ROOT (paths relative to it) to HANDHOLD_CALLMAP_OUT."""

import json
import os
import sys
import threading

import pytest

_ROOT = os.environ["HANDHOLD_CALLMAP_ROOT"].rstrip("/") + "/"
_OUTSIDE: set = set()
_per_test: dict = {}
_now = _OUTSIDE


def _tracer(frame, event, arg):
    _now.add(frame.f_code)  # code objects, not names: the hot path stays one set insertion
    return None  # no line events


sys.settrace(_tracer)
threading.settrace(_tracer)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    global _now
    _now = _per_test.setdefault(item.nodeid, set())
    try:
        yield
    finally:
        _now = _OUTSIDE


def _in_tree(codes) -> list:
    return sorted({(c.co_filename[len(_ROOT):], c.co_firstlineno) for c in codes if c.co_filename.startswith(_ROOT)})


def pytest_sessionfinish(session, exitstatus):
    sys.settrace(None)
    threading.settrace(None)
    with open(os.environ["HANDHOLD_CALLMAP_OUT"], "w") as out:
        json.dump({"tests": {t: _in_tree(c) for t, c in _per_test.items()}, "outside": _in_tree(_OUTSIDE)}, out)
