"""What a grade depends on besides the task and the patch, as one value."""

from __future__ import annotations

from dataclasses import dataclass, field

from sandbox.base import SandboxSpec


@dataclass(frozen=True)
class GradeRules:
    """The rules every grade of a run is made under: built once from the settings (`RolloutConfig.grade_rules`)
    and handed whole to each grade, re-grade, task validation and reference replay, so that a check which
    re-grades a stored patch (`rewards_reproduce`) or re-validates a task judges it by the rules it was graded
    under, never by defaults of its own. Its field defaults are the settings' (RolloutConfig takes them from here).
    Hashable: it keys the empty patch's known grade and the synthesized tasks' cache."""

    sandbox: SandboxSpec = field(default_factory=SandboxSpec)
    """Limits of the sandbox the tests run in (memory, CPUs, processes, network)."""
    test_timeout: float = 300.0
    """Seconds the test run may take; past it the grade is `tests_timed_out`."""
    zero_suspicious: bool = True
    """A resolving patch the grader flags as suspicious gets reward 0."""
