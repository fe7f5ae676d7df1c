"""The JUnit XML report pytest writes, as a cross-check of the log swebench parses.

A patch can print `PASSED <test>` lines; it is much harder to make pytest's own report, written
before the process exits, say so too. Test ids are compared in a dotted form that both sides
share: `pkg/tests/test_a.py::TestX::test_y[1]` and classname `pkg.tests.test_a.TestX`, name `test_y[1]`.
"""

from __future__ import annotations

import xml.etree.ElementTree as ElementTree


def dotted(node_id: str) -> str:
    """`path/to/test_a.py::Class::test[param]` -> `path.to.test_a.Class.test[param]`."""
    head, bracket, params = node_id.partition("[")
    head = head.replace(".py::", "::").replace("::", ".").replace("/", ".")
    return head + bracket + params


def junit_outcomes(report: bytes) -> dict[str, str]:
    """Dotted test id -> 'passed', 'failed', 'error' or 'skipped', from a JUnit XML report."""
    outcomes: dict[str, str] = {}
    for case in ElementTree.fromstring(report).iter("testcase"):
        key = dotted(f"{case.get('classname', '')}.{case.get('name', '')}".lstrip("."))
        kinds = {child.tag for child in case}
        outcome = ("failed" if "failure" in kinds else "error" if "error" in kinds
                   else "skipped" if "skipped" in kinds else "passed")
        if outcomes.get(key, "passed") == "passed":  # a failure anywhere (call, teardown) wins
            outcomes[key] = outcome
    return outcomes


def junit_disagreements(report: bytes | None, passed: list[str]) -> list[str]:
    """Tests the log counts as passed that the report does not show passing ([] when all agree)."""
    if not passed:
        return []
    if not report:
        return ["no JUnit report: the test run ended before pytest wrote it"]
    try:
        outcomes = junit_outcomes(report)
    except ElementTree.ParseError as exc:
        return [f"the JUnit report does not parse: {exc}"]
    problems = []
    for test in passed:
        outcome = outcomes.get(dotted(test), "missing")
        if outcome != "passed":
            problems.append(f"{test}: {outcome} in the JUnit report")
    return problems
