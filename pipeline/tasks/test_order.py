"""The test command of a task run in a shuffled order, for the certificate's shuffled grades.

Containers reach no package index and environment images hold no ordering plugin (pytest-randomly,
pytest-random-order), so the command starts pytest itself (`python -c`, `pytest.main`) with a plugin object of a
few lines that reorders the collected items: the modules in a shuffled order, the tests of each module shuffled
among themselves, and a list the shuffle left as it was reversed, so that a module of two tests never runs in file
order (a test that passes only after another of its module ran first fails here). Collection, options and
arguments stay the command's own: the same tests run, and the grader reads the same report.
"""

from __future__ import annotations

import re
import shlex
import zlib

SHUFFLER = """import random, sys, pytest
rng = random.Random({seed})
def moved(xs):
    ys = xs[:]
    rng.shuffle(ys)
    return ys[::-1] if ys == xs else ys
class Shuffled:
    def pytest_collection_modifyitems(self, items):
        modules = {{}}
        for item in items:
            modules.setdefault(item.nodeid.split("::")[0], []).append(item)
        items[:] = [item for tests in moved(list(modules.values())) for item in moved(tests)]
sys.exit(pytest.main(sys.argv[1:], plugins=[Shuffled()]))"""
_PYTEST = re.compile(r"(?P<lead>^|[\s;&|(])(?:(?P<python>\S*python[\d.]*)\s+-m\s+pytest|pytest)(?=\s|$)")


def shuffle_seed(instance_id: str) -> int:
    """The seed of a task's shuffled order: its own, so a re-validation runs the same order."""
    return zlib.crc32(instance_id.encode()) % 100_000


def shuffled_command(test_cmd: str, seed: int) -> str | None:
    """`test_cmd` with its pytest run in an order shuffled by `seed`; None when it starts no pytest this can find
    (`python -m pytest ...` or `pytest ...`): such a task's grades all run in its runner's own order."""
    match = _PYTEST.search(test_cmd)
    if match is None:
        return None
    start = match.start() + len(match.group("lead"))
    python = match.group("python") or "python"
    return f"{test_cmd[:start]}{python} -c {shlex.quote(SHUFFLER.format(seed=seed))}{test_cmd[match.end():]}"
