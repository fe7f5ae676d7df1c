"""A package's time budget (`synth.package_budget`): a package whose candidates keep failing stops trying more
at it and says so, in the report (`budget_stopped`, `candidates_untried`), its rejects and the log, instead of
spending a quarter of an hour for nothing (pyparsing: 989 s, no task kept)."""

from __future__ import annotations

import logging
from collections import Counter

from pipeline.core.records import RejectedTask
from pipeline.synthesis.packages import PackageSpec
from pipeline.synthesis.synth_config import SynthConfig, SynthReport

log = logging.getLogger(__name__)


def over_budget(spec: PackageSpec, untried: int, found: int, config: SynthConfig, report: SynthReport) -> None:
    """Say that a package stopped at its time budget: in the report (`budget_stopped`, `candidates_untried`), in
    its rejects and in the log."""
    report.note(spec.key, "budget_stopped", 1)
    report.note(spec.key, "candidates_untried", untried)
    why = (f"stopped trying candidates at synth.package_budget ({config.package_budget:.0f} s) with {untried} "
           f"untried and {found} found; raise synth.package_budget to try them, or lower candidates_per_package")
    report.rejects.append(RejectedTask(spec.key, "budget", why))
    log.warning("%s: %s", spec.key, why)


def budget_note(counts: Counter, config: SynthConfig) -> str:
    """', stopped at the time budget with N candidates untried' when it did ('' otherwise)."""
    if not counts["budget_stopped"]:
        return ""
    return (f", stopped at synth.package_budget ({config.package_budget:.0f} s) with {counts['candidates_untried']} "
            "candidates untried (raise it to try them)")
