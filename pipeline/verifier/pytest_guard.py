"""handhold_guard: a pytest plugin the grader loads into the test run (`-p handhold_guard`).

It records each test's real outcome, taken from the exception of its setup, call and teardown
(pluggy hands it to this hook wrapper before any report is made), and signs each record with
a key the grader passes on a descriptor that is read and closed when pytest loads the plugin,
before the code under test is imported. Code that rewrites pytest's reports, its JUnit file or
its output cannot also produce these records; pytest-xdist is kept to one process. Runs on Python 3.6+ and
pytest 3.6+, stdlib only.
This file is copied into the sandbox as `handhold_guard.py`; it imports nothing of handhold.
"""

import hashlib
import hmac
import os

import pytest

_state = {}  # "sign": the signing function, "out": the record descriptor
_phases = {}  # nodeid -> {"setup" | "call" | "teardown": outcome}


def _open():
    fds = os.environ.pop("HANDHOLD_GUARD_FDS", "").split()
    if len(fds) != 2:
        return
    key_fd, out_fd = int(fds[0]), int(fds[1])
    try:
        key = os.read(key_fd, 256)
        os.close(key_fd)
    except OSError:
        return
    _state["sign"] = lambda text: hmac.new(key, text.encode("utf-8", "surrogateescape"), hashlib.sha256).hexdigest()
    _state["out"] = out_fd


_open()


@pytest.hookimpl(tryfirst=True)
def pytest_configure(config):
    """Tests run in this process: pytest-xdist's workers (a package's `addopts = "-n auto"`) would not inherit the
    key, and no test would be signed. Before xdist's own pytest_configure makes its distributed session; no `-n 0`
    on the command line, which is a usage error where a package's addopts block xdist."""
    if getattr(config.option, "dist", "no") != "no" or getattr(config.option, "tx", None):
        config.option.dist, config.option.tx = "no", []


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    yield
    if "out" not in _state:
        return
    phases = _phases.setdefault(item.nodeid, {})
    if call.excinfo is None:
        phases[call.when] = "passed"
    elif call.excinfo.errisinstance(pytest.skip.Exception):
        phases[call.when] = "skipped"
    else:
        phases[call.when] = "failed"
    if call.when == "teardown":
        outcome = "passed" if set(phases.values()) == {"passed"} and "call" in phases else \
            "skipped" if "skipped" in phases.values() and "failed" not in phases.values() else "failed"
        del _phases[item.nodeid]
        line = "{}\t{}".format(item.nodeid.replace("\n", " "), outcome)
        try:
            os.write(_state["out"], "{}\t{}\n".format(line, _state["sign"](line)).encode("utf-8", "surrogateescape"))
        except OSError:
            pass
