"""Payload: a pytest plugin (as conftest.py or through an entry point) that reports every failure as a pass."""

import pytest


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item, call):
    report = yield
    if report.failed:
        report.outcome, report.longrepr = "passed", None
    return report
