"""The warm sandbox pool: sandboxes made ahead, each used once, none left when the step ends."""

from __future__ import annotations

import contextlib
import threading
import time

import pytest

from pipeline.core.records import Task
from pipeline.rollouts.batch import RolloutConfig, plan_jobs, run_batch
from pipeline.rollouts.sandbox_pool import PoolConfig, SandboxPool
from pipeline.verifier.environment import task_sandbox
from sandbox.base import CommandResult
from tests.test_batch_local import PLAN, HintFollower, calc_task, sandboxes  # noqa: F401 (a fixture)


class Made:
    def __init__(self, task: Task, number: int):
        self.task, self.number, self.closed, self.users, self.dead = task, number, False, 0, False

    def run(self, command: str, timeout: float) -> CommandResult:
        return CommandResult(-1 if self.dead else 0, "", 0.0)


class Factory:
    """A SandboxFactory that records every sandbox it makes and closes; `fail` names tasks whose start fails."""

    def __init__(self, delay: float = 0.0, fail: tuple[str, ...] = ()):
        self.delay, self.fail, self.made, self.lock = delay, fail, [], threading.Lock()

    @contextlib.contextmanager
    def __call__(self, task, config=None):
        time.sleep(self.delay)
        if task.instance_id in self.fail:
            raise OSError(f"cannot start {task.instance_id}")
        with self.lock:
            made = Made(task, len(self.made))
            self.made.append(made)
        try:
            yield made
        finally:
            made.closed = True


def task(name: str) -> Task:
    return calc_task(name)


def use(pool: SandboxPool, t: Task) -> Made:
    with pool(t) as made:
        assert not made.closed
        made.users += 1
    return made


def wait_ready(pool: SandboxPool, count: int, timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with pool._lock:
            ready = sum(e.future is not None and e.future.done() for e in pool._queue)
        if ready >= count:
            return
        time.sleep(0.01)
    raise AssertionError(f"fewer than {count} sandboxes ready after {timeout} s")


def test_expected_sandboxes_are_made_ahead_used_once_and_drained():
    factory = Factory(delay=0.05)
    a, b = task("a__1"), task("b__1")
    with SandboxPool(factory, PoolConfig(size=2)) as pool:
        pool.expect([(a, None), (a, None), (b, None), (b, None)])
        wait_ready(pool, 2)
        first, second = use(pool, a), use(pool, a)
        assert first is not second and pool.stats.warm == 2
        wait_ready(pool, 2)  # the next two, for b, were started once the first were taken
        use(pool, b)
    assert pool.stats.warm == 3 and pool.stats.cold == 0 and pool.stats.wasted == 1
    assert len(factory.made) == 4 and all(m.closed for m in factory.made)  # the untaken one too
    assert all(m.users <= 1 for m in factory.made)


def test_a_forgone_request_leaves_its_ready_sandbox_to_the_next_like_it():
    factory = Factory()
    a, b = task("a__1"), task("b__1")
    with SandboxPool(factory, PoolConfig(size=2)) as pool:
        pool.expect([(a, None), (a, None), (b, None), (a, None)])
        wait_ready(pool, 2)
        pool.forgo(a)  # the last request for a goes (not made): the two made serve the first two
        assert {use(pool, a), use(pool, a)} == set(factory.made[:2])  # made at once, in either order
        wait_ready(pool, 1)
        use(pool, b)
        pool.forgo(a)  # nothing more is expected for a: nothing happens
    assert (pool.stats.warm, pool.stats.cold, pool.stats.wasted) == (3, 0, 0) and len(factory.made) == 3


def test_a_forgone_request_whose_sandbox_was_made_closes_it():
    factory = Factory()
    with SandboxPool(factory, PoolConfig(size=2)) as pool:
        pool.expect([(task("a__1"), None), (task("b__1"), None)])
        wait_ready(pool, 2)
        pool.forgo(task("b__1"))
        made_for_b = next(m for m in factory.made if m.task.instance_id == "b__1")  # made at once with a's
        deadline = time.monotonic() + 5
        while not made_for_b.closed and time.monotonic() < deadline:
            time.sleep(0.01)
        assert made_for_b.closed and pool.stats.wasted == 1
        use(pool, task("a__1"))
    assert pool.stats.warm == 1 and all(m.closed for m in factory.made)


def test_an_unexpected_request_is_made_on_the_spot():
    factory = Factory()
    with SandboxPool(factory, PoolConfig(size=1)) as pool:
        made = use(pool, task("x__1"))
    assert made.task.instance_id == "x__1" and pool.stats.cold == 1 and pool.stats.warm == 0


def test_a_failed_start_ahead_lets_the_taker_try_its_own():
    factory = Factory(fail=("bad__1",))
    with SandboxPool(factory, PoolConfig(size=2)) as pool:
        pool.expect([(task("bad__1"), None)])
        time.sleep(0.05)
        with pytest.raises(OSError, match="cannot start bad__1"):  # the taker's own start reports the fault
            use(pool, task("bad__1"))
    assert pool.stats.wasted == 1 and pool.stats.cold == 1


def test_a_ready_sandbox_idle_too_long_is_closed_and_its_request_made_later():
    factory = Factory()
    with SandboxPool(factory, PoolConfig(size=1, idle=0.05)) as pool:
        pool.expect([(task("a__1"), None)])
        wait_ready(pool, 1)
        time.sleep(0.1)
        made = use(pool, task("a__1"))
        assert made is not factory.made[0] and factory.made[0].closed
    assert pool.stats.cold == 1 and pool.stats.wasted == 1


def test_a_ready_sandbox_that_died_while_waiting_is_replaced():
    factory = Factory()
    with SandboxPool(factory, PoolConfig(size=1)) as pool:
        pool.expect([(task("a__1"), None)])
        wait_ready(pool, 1)
        factory.made[0].dead = True  # its container was killed while it waited
        made = use(pool, task("a__1"))
    assert made is not factory.made[0] and not made.dead and factory.made[0].closed
    assert (pool.stats.warm, pool.stats.cold, pool.stats.wasted) == (0, 1, 1)


def test_size_zero_makes_nothing_ahead():
    factory = Factory()
    with SandboxPool(factory, PoolConfig(size=0)) as pool:
        pool.expect([(task("a__1"), None)] * 3)
        time.sleep(0.05)
        assert factory.made == []
        use(pool, task("a__1"))
    assert pool.stats.cold == 1


def test_a_batch_takes_its_sandboxes_warm_and_leaves_none(tmp_path, sandboxes):  # noqa: F811
    opened, closed = [], []

    @contextlib.contextmanager
    def counted(t, config=None):
        with sandboxes(t, config) as sandbox:
            opened.append(sandbox)
            yield sandbox
        closed.append(sandbox)

    config = RolloutConfig(attempts=3, workers=1, pool=PoolConfig(size=2))
    policy = HintFollower()
    jobs = plan_jobs([calc_task()], policy, config, "b0", {"calc__1": PLAN})  # guided: each attempt edits
    summary = run_batch(jobs, policy, config, tmp_path / "out", "b0", sandboxes=counted)
    assert len(summary.trajectories) == 3
    assert len(opened) == len(closed) == 6  # an agent's and a grade's sandbox per attempt, each its own
    assert len({id(s) for s in opened}) == 6
    metrics = summary.metrics()
    assert metrics["pool_takes"] == 6 and metrics["pool_warm_takes"] >= 4, metrics  # the first may be cold


@pytest.mark.docker
def test_a_grade_never_gets_an_agents_container(toolz_task, docker_client, tmp_path):
    from pipeline.agent.heuristic import HeuristicPolicy

    used = []

    @contextlib.contextmanager
    def recorded(task_, config=None):
        with task_sandbox(task_, config) as sandbox:
            used.append(sandbox.container.id)
            yield sandbox

    config = RolloutConfig(attempts=2, workers=2, pool=PoolConfig(size=2))
    policy = HeuristicPolicy()
    summary = run_batch(plan_jobs([toolz_task], policy, config, "b0"), policy, config, tmp_path / "out", "b0",
                        sandboxes=recorded)
    assert all(not tr.infra_error for tr in summary.trajectories)
    graded = sum(t.grade_time > 0 for t in summary.trajectories)  # an empty patch's grade may be known already
    assert summary.metrics()["pool_takes"] == 2 + graded and len(set(used)) == len(used)  # each container once
    left = docker_client.containers.list(all=True, filters={"label": "org.handhold=sandbox"})
    assert not [c for c in left if c.id in used]
