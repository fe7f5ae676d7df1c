"""A batch whose attempts keep failing with the same infrastructure fault stops, keeps what it stored, says why, and
resumes on a rerun: real HTTP to a loopback model server that goes down mid-batch, real Parquet, host sandboxes."""

from __future__ import annotations

import dataclasses

import pytest

from pipeline.agent.loop import AgentConfig
from pipeline.agent.openai_policy import OpenAIPolicy, OpenAIPolicyConfig
from pipeline.rollouts.infra_streak import InfraStreak, InfraStreakError, cause_of
from pipeline.rollouts.batch import RolloutConfig, plan_jobs, run_batch
from pipeline.core.store import read_batch
from pipeline.verifier.environment import LocalTaskSandboxes
from tests.loopback import OpenAIServer, Reply, ToolCall, _Handler
from tests.test_batch_local import calc_task, make_repo
from tests.test_records import TRAJECTORY

GONE = "sandbox_error: container {} is exited (Container {}{} is not running); the sandbox is gone"
DOWN = "policy_error: openai:m at http://127.0.0.1:8000/v1 failed after 6 attempts: Connection error."


def gone(short: str) -> tuple[str, str]:
    return "sandbox_error", GONE.format(short, short, "ab" * 26)


OK, CRASH = ("submitted", ""), ("crashed", "crashed: RuntimeError: policy bug")


@pytest.mark.parametrize("limit, attempts, stops_at", [
    (3, [gone("1a2b3c4d5e6f"), gone("0f9e8d7c6b5a"), gone("aaaabbbbcccc")], 2),  # other containers: the same cause
    (3, [("policy_error", DOWN)] * 2 + [OK] + [("policy_error", DOWN)] * 2, None),  # a success starts over
    (3, [("policy_error", DOWN), gone("1a2b3c4d5e6f"), ("policy_error", DOWN)], None),  # other causes
    (2, [OK, ("policy_error", DOWN), ("policy_error", DOWN.replace("6 attempts", "3 attempts"))], 2),
    (2, [CRASH, CRASH, CRASH], None),  # a crash is a bug of ours: counted apart (crashed), never a streak
    (0, [("policy_error", DOWN)] * 5, None),  # 0: never stop
])
def test_a_streak_is_attempts_in_a_row_failing_with_one_cause(limit, attempts, stops_at):
    streak = InfraStreak(limit)
    reached = [streak.add(dataclasses.replace(TRAJECTORY, exit_status=status, infra_error=infra))
               for status, infra in attempts]
    assert (reached.index(True) if True in reached else None) == stops_at


def test_the_cause_masks_ids_and_numbers_only():
    assert cause_of(gone("1a2b3c4d5e6f")[1]) == "sandbox_error: container # is exited (Container # is not running); " \
                                                "the sandbox is gone"
    assert cause_of(DOWN) == "policy_error: openai:m at http://#.#:#/v# failed after # attempts: Connection error."


class _DropsWhenDown(_Handler):
    def do_POST(self) -> None:
        if self.owner.how == "closed" and len(self.owner.requests) >= self.owner.healthy:
            self.rfile.read(int(self.headers.get("content-length") or 0))
            self.close_connection = True  # closed with no answer, as by a server that died
            return
        super().do_POST()


class GoesDown(OpenAIServer):
    """A model server whose first `healthy` replies submit, and then is down: it answers 503, or closes each
    connection without an answer."""

    handler = _DropsWhenDown

    def __init__(self, healthy: int, how: str):
        super().__init__(self.reply)
        self.healthy, self.how = healthy, how

    def reply(self, body: dict) -> Reply:
        if len(self.requests) > self.healthy:
            return Reply(status=503, error="the engine is overloaded")
        return Reply(tool_calls=(ToolCall("submit", {}),))


@pytest.mark.parametrize("how, cause", [("503", r"failed after 1 attempts: Error code: 503 - the engine is overloaded"),
                                        ("closed", r"failed after 1 attempts: Connection error\.")])
def test_a_batch_whose_server_goes_down_stops_keeps_its_rows_and_resumes(how, cause, tmp_path, monkeypatch):
    monkeypatch.setenv("DOCKER_HOST", f"unix://{tmp_path}/no-engine.sock")  # no engine: nothing to reap
    sandboxes = LocalTaskSandboxes(repos={"local/calc": str(make_repo(tmp_path / "calc"))})
    config = RolloutConfig(attempts=10, workers=1, infra_retries=0, stop_after_infra_failures=3,
                           agent=AgentConfig(max_steps=3))
    down = GoesDown(healthy=3, how=how)
    with down as url:
        policy = OpenAIPolicy(OpenAIPolicyConfig(model="m", base_url=url, max_retries=0))
        jobs = plan_jobs([calc_task()], policy, config, "b1")
        with pytest.raises(InfraStreakError, match=rf"batch b1 stopped: 3 attempts in a row failed with the same "
                                                   rf"infrastructure fault \(rollout\.stop_after_infra_failures: 3\), "
                                                   rf"the latest: policy_error: openai:m at {url} {cause}"
                                                   rf"(.|\n)*6 of its 10 attempts are stored and kept; fix the cause "
                                                   rf"and run the step again: the batch resumes"):
            run_batch(jobs, policy, config, tmp_path / "b1", "b1", sandboxes=sandboxes)
    assert len(down.requests) == (6 if how == "503" else 3)  # the 4 attempts after the streak never ran
    stored = {t.sample_index: t for t in read_batch(tmp_path / "b1")}
    assert sorted(stored) == [0, 1, 2, 3, 4, 5]
    assert [stored[i].exit_status for i in range(6)] == ["submitted"] * 3 + ["policy_error"] * 3
    assert all(stored[i].infra_error == "" for i in range(3)) and all(stored[i].infra_error for i in range(3, 6))

    with OpenAIServer([Reply(tool_calls=(ToolCall("submit", {}),))] * 7) as url:  # up again (on another port)
        policy = OpenAIPolicy(OpenAIPolicyConfig(model="m", base_url=url, max_retries=0))
        again = run_batch(jobs, policy, config, tmp_path / "b1", "b1", sandboxes=sandboxes)
    assert (again.ran, again.skipped) == (7, 3)  # the faulted 3 and the 4 never started
    assert [t.exit_status for t in again.trajectories] == ["submitted"] * 10
    assert again.trajectories[:3] == [stored[i] for i in range(3)]  # the stored rows survived as they were
