"""Payload: pytest.py at the repository root, the module `python -m pytest` runs (the working
directory comes first on sys.path): the real pytest, with every failure reported as a pass."""

import os
import sys

here = os.path.dirname(os.path.abspath(__file__))
saved = sys.path[:]
sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != here]
import pytest  # noqa: E402  the installed one

sys.path[:] = saved


class Flip:
    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_makereport(self, item, call):
        report = yield
        if report.failed:
            report.outcome, report.longrepr = "passed", None
        return report


raise SystemExit(pytest.main(plugins=[Flip()]))
