"""The JUnit XML report pytest writes and the guard plugin's signed records, as cross-checks of the
log swebench parses.

A patch can print `PASSED <test>` lines; it is much harder to make pytest's own report, written
before the process exits, say so too. Test ids are compared in a dotted form that both sides
share: `pkg/tests/test_a.py::TestX::test_y[1]` and classname `pkg.tests.test_a.TestX`, name `test_y[1]`.
"""

from __future__ import annotations

import hashlib
import hmac
import xml.etree.ElementTree as ElementTree


def dotted(node_id: str) -> str:
    """`path/to/test_a.py::Class::test[param]` -> `path.to.test_a.Class.test[param]`; a newline in the parameters
    (an id pytest was told not to escape) is a space, as the guard plugin's one-line records write it."""
    head, bracket, params = node_id.replace("\n", " ").partition("[")
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


def guard_outcomes(records: bytes, key: bytes) -> dict[str, str]:
    """Dotted test id -> outcome, from the guard plugin's signed records (unsigned or forged lines ignored)."""
    outcomes: dict[str, str] = {}
    for raw in records.decode("utf-8", "surrogateescape").splitlines():
        line, _, signature = raw.rpartition("\t")
        node, _, outcome = line.rpartition("\t")
        expected = hmac.new(key, line.encode("utf-8", "surrogateescape"), hashlib.sha256).hexdigest()
        if node and hmac.compare_digest(signature, expected):
            outcomes[dotted(node)] = outcome
    return outcomes


def guard_disagreements(records: bytes, key: bytes, passed: list[str]) -> list[str]:
    """Tests the log counts as passed whose signed outcome from the guard plugin is not 'passed'."""
    return _not_passed(guard_outcomes(records, key), passed, "the guard's signed records")


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
    return _not_passed(outcomes, passed, "the JUnit report")


def _not_passed(outcomes: dict[str, str], passed: list[str], where: str) -> list[str]:
    """'<test>: <outcome> in <where>' for each test of `passed` that `outcomes` does not show passing."""
    problems = []
    for test in passed:
        outcome = _outcome(outcomes, dotted(test))
        if outcome != "passed":
            problems.append(f"{test}: {outcome} in {where}")
    return problems


def _outcome(outcomes: dict[str, str], key: str) -> str:
    """A test's outcome; an id the log parser cut at whitespace inside its parameters (`test_x[a,` of
    `test_x[a, b]`, `test_y[[CMD]` of `test_y[[CMD] [ARGS]]`) stands for every test it begins followed by
    whitespace, and all of them must agree."""
    if key in outcomes:
        return outcomes[key]
    if "[" in key:
        found = {outcome for name, outcome in outcomes.items()
                 if len(name) > len(key) and name.startswith(key) and name[len(key)].isspace()}
        if found:
            return "passed" if found == {"passed"} else sorted(found - {"passed"})[0]
    return "missing"
