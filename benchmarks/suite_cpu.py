"""Where the test suite's CPU goes: the suite run one test at a time (no pytest-xdist workers), each test's
setup, call and teardown timed by the wall clock and by the machine's busy CPU seconds (/proc/stat: the
containers, the engine and every subprocess included), then per file, the heaviest first.

The suite is CPU-bound on a small machine: with N cores, parallel workers cannot bring `make test` under
(total CPU seconds / N), whatever the scheduling. This says which files hold those seconds.

    python benchmarks/suite_cpu.py [pytest arguments, e.g. tests/test_rollouts.py] [--top 25]
Needs what `make test` needs (a Docker engine, Chromium, Redis); takes about as long as the suite on one
worker (35 min on 2 cores). Run it on an otherwise idle machine: the CPU is the machine's.
"""

from __future__ import annotations

import argparse
import collections
import os
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
TICK = os.sysconf("SC_CLK_TCK")


def busy_seconds() -> float:
    """CPU seconds the whole machine has been busy since boot (every state but idle and iowait)."""
    with open("/proc/stat") as f:
        fields = [int(x) for x in f.readline().split()[1:]]
    return (sum(fields[:8]) - fields[3] - fields[4]) / TICK


class SuiteCpu:
    """A pytest plugin adding up each test phase's wall and busy CPU seconds by file."""

    def __init__(self):
        self.wall, self.cpu = collections.Counter(), collections.Counter()

    def _timed(self, item):
        wall, cpu = time.monotonic(), busy_seconds()
        yield
        name = item.nodeid.split("::")[0]
        self.wall[name] += time.monotonic() - wall
        self.cpu[name] += busy_seconds() - cpu

    pytest_runtest_setup = pytest.hookimpl(hookwrapper=True)(_timed)
    pytest_runtest_call = pytest.hookimpl(hookwrapper=True)(_timed)
    pytest_runtest_teardown = pytest.hookimpl(hookwrapper=True)(_timed)

    def table(self, top: int) -> str:
        total_cpu, total_wall = sum(self.cpu.values()), sum(self.wall.values())
        lines = [f"{'file':45} {'CPU s':>8} {'wall s':>8} {'share':>6}"]
        for name, cpu in self.cpu.most_common(top):
            lines.append(f"{name:45} {cpu:8.1f} {self.wall[name]:8.1f} {cpu / max(total_cpu, 1e-9):6.1%}")
        cores = os.cpu_count() or 1
        lines.append(f"{'all ' + str(len(self.cpu)) + ' files':45} {total_cpu:8.1f} {total_wall:8.1f}")
        lines.append(f"floor on {cores} cores, every core busy all the time: {total_cpu / cores / 60:.1f} min")
        return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--top", type=int, default=25)
    args, pytest_args = parser.parse_known_args()
    os.chdir(ROOT)
    os.environ.setdefault("HANDHOLD_REQUIRE_DOCKER", "1")
    plugin = SuiteCpu()
    code = pytest.main(["-q", "-n", "0", *pytest_args], plugins=[plugin])
    print(plugin.table(args.top))
    return int(code)


if __name__ == "__main__":
    sys.exit(main())
