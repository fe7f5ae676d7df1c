"""Whole attempts: the real OpenAI and Anthropic policies over HTTP to scripted loopback servers,
the local tiny model, and a LocalSandbox over a small buggy repository."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from pipeline.agent.anthropic_policy import AnthropicPolicy, AnthropicPolicyConfig
from pipeline.agent.loop import AgentConfig, Attempt, run_attempt, step_seed, unguided_prompt
from pipeline.agent.openai_policy import OpenAIPolicy, OpenAIPolicyConfig
from pipeline.core.records import Task
from sandbox.base import SandboxError
from sandbox.local_sandbox import LocalSandbox
from tests.loopback import DEFAULT_LOGPROB, AnthropicServer, OpenAIServer, Reply, ToolCall

FAST = dict(retry_initial_delay=0.001, retry_max_delay=0.01, timeout=30.0)
TEST_CMD = f"{sys.executable} -m pytest -q -p no:cacheprovider test_calc.py"
ISSUE = "add(2, 3) returns -1 instead of 5."


def make_repo(path):
    """A git repository whose add() subtracts, with a test that catches it."""
    path.mkdir()
    (path / "calc.py").write_text("def add(a, b):\n    return a - b\n")
    (path / "test_calc.py").write_text("from calc import add\n\n\ndef test_add():\n    assert add(2, 3) == 5\n")
    git = ["git", "-c", "user.name=t", "-c", "user.email=t@t", "-c", "init.defaultBranch=main"]
    for command in (["init", "-q"], ["add", "-A"], ["commit", "-qm", "init"]):
        subprocess.run([*git, *command], cwd=path, check=True)
    return path


@pytest.fixture
def sandbox(tmp_path):
    with LocalSandbox(make_repo(tmp_path / "repo"), timeout=60) as box:
        yield box


@pytest.fixture
def task(sandbox):
    return Task(instance_id="calc-1", repo="demo/calc", base_commit=sandbox.base_commit, patch="", test_patch="",
                problem_statement=ISSUE, FAIL_TO_PASS=("test_calc.py::test_add",), PASS_TO_PASS=(), image="",
                workdir=sandbox.workdir, test_cmd="pytest", log_parser="pytest", source="synth")


@pytest.fixture(autouse=True)
def keys(monkeypatch):
    monkeypatch.setenv("OPENAI_API_KEY", "sk-loopback")
    monkeypatch.setenv("ANTHROPIC_API_KEY", "sk-ant-loopback")


def openai_policy(base_url, **overrides):
    return OpenAIPolicy(OpenAIPolicyConfig(model="m", base_url=base_url, **{**FAST, **overrides}))


def anthropic_policy(base_url, **overrides):
    return AnthropicPolicy(AnthropicPolicyConfig(model="claude-test", base_url=base_url, **{**FAST, **overrides}))


def edit(**arguments):
    return ToolCall("edit", arguments)


SOLVE = [
    Reply("Let me read the code.", (edit(command="view", path="calc.py"),)),
    Reply(tool_calls=(edit(command="str_replace", path="calc.py", old_str="a - b", new_str="a + b"),)),
    Reply(tool_calls=(ToolCall("bash", {"command": TEST_CMD}),)),
    Reply("Fixed.", (ToolCall("submit"),)),
]


def tool_outputs(attempt: Attempt) -> list[str]:
    return [m["content"] for m in attempt.messages if m["role"] == "tool"]


@pytest.mark.parametrize("server_class, make_policy", [(OpenAIServer, openai_policy),
                                                       (AnthropicServer, anthropic_policy)])
def test_solving_script_submits_the_fix(sandbox, task, server_class, make_policy):
    server = server_class(SOLVE)
    with server as base_url:
        attempt = run_attempt(task, make_policy(base_url), sandbox, AgentConfig(), seed=7)
    assert not server.errors
    assert attempt.exit_status == "submitted" and attempt.error == "" and attempt.format_errors == 0
    assert "-    return a - b\n+    return a + b" in attempt.patch
    outputs = tool_outputs(attempt)
    assert "     2\t    return a - b" in outputs[0] and "return a + b" in outputs[1]
    assert outputs[2].startswith("exit code: 0") and "1 passed" in outputs[2] and outputs[3] == "Submitted."
    assert [s.tool for s in attempt.steps] == ["edit", "edit", "bash", "submit"]
    assert not any(s.error for s in attempt.steps) and attempt.steps[2].tool_time > 0
    assert attempt.total_tokens == sum(s.prompt_tokens + s.completion_tokens for s in attempt.steps) > 0
    assert attempt.prompt == attempt.unguided_prompt == tuple(unguided_prompt(task, AgentConfig()))
    assert attempt.messages[:2] == attempt.prompt and attempt.tools
    assert server.requests[0]["tools"] and len(server.requests) == 4


def test_messages_are_openai_format_with_json_string_arguments(sandbox, task):
    server = OpenAIServer(SOLVE)
    with server as base_url:
        attempt = run_attempt(task, openai_policy(base_url, request_logprobs=True), sandbox, AgentConfig(), seed=7)
    assistant = [m for m in attempt.messages if m["role"] == "assistant"]
    call = assistant[1]["tool_calls"][0]
    assert json.loads(call["function"]["arguments"])["new_str"] == "a + b"
    answer = attempt.messages[attempt.messages.index(assistant[1]) + 1]
    assert answer == {"role": "tool", "tool_call_id": call["id"], "content": tool_outputs(attempt)[1]}
    assert server.requests[1]["messages"] == [*attempt.messages[:4]]  # the policy saw the tool result
    assert len(attempt.logprobs) == 4 and all(set(lp) == {DEFAULT_LOGPROB} for lp in attempt.logprobs)
    seeds = [request["seed"] for request in server.requests]
    assert seeds == [step_seed(7, step) for step in range(4)] and len(set(seeds)) == 4


def test_failing_script_ends_without_the_fix(sandbox, task):
    server = OpenAIServer([
        Reply(tool_calls=(edit(command="str_replace", path="calc.py", old_str="a-b", new_str="a+b"),)),
        Reply(tool_calls=(ToolCall("bash", {"command": TEST_CMD}),)),
        Reply(tool_calls=(ToolCall("submit"),)),
    ])
    with server as base_url:
        attempt = run_attempt(task, openai_policy(base_url), sandbox, AgentConfig())
    assert attempt.exit_status == "submitted" and attempt.patch == ""
    outputs = tool_outputs(attempt)
    assert "does not occur verbatim" in outputs[0] and outputs[1].startswith("exit code: 1")
    assert [s.error for s in attempt.steps] == [True, False, False] and attempt.format_errors == 0


def test_garbage_in_text_format_ends_with_format_errors(sandbox, task):
    server = OpenAIServer(["I am not sure what to do here."], repeat_last=True)
    config = AgentConfig(tool_format="text", max_format_errors=3)
    with server as base_url:
        attempt = run_attempt(task, openai_policy(base_url), sandbox, config)
    assert attempt.exit_status == "format_errors" and attempt.format_errors == 3 and len(server.requests) == 3
    assert "tools" not in server.requests[0] and not attempt.tools
    assert "<tool_call>" in attempt.prompt[0]["content"] and '"name": "edit"' in attempt.prompt[0]["content"]
    answers = [m for m in attempt.messages[2:] if m["role"] == "user"]
    assert len(answers) == 3 and all("no tool call found" in m["content"] for m in answers)
    assert attempt.patch == "" and all(s.error and s.tool == "" for s in attempt.steps)


def test_text_format_solves_and_wraps_results(sandbox, task):
    def call(name, **arguments):
        return f'Next step.\n<tool_call>{json.dumps({"name": name, "arguments": arguments})}</tool_call>'

    server = OpenAIServer([
        call("edit", command="str_replace", path="calc.py", old_str="a - b", new_str="a + b"),
        call("bash", command=TEST_CMD),
        '<tool_call>{"name": "bash", "arguments": {"command": "ls"}</tool_call>',  # one brace short
        call("submit"),
    ])
    with server as base_url:
        attempt = run_attempt(task, openai_policy(base_url), sandbox, AgentConfig(tool_format="text"))
    assert attempt.exit_status == "submitted" and "+    return a + b" in attempt.patch
    users = [m["content"] for m in attempt.messages[2:] if m["role"] == "user"]
    assert users[0].startswith("<tool_response>\nEdited") and "1 passed" in users[1]
    assert users[2].startswith("Format error: invalid JSON") and attempt.format_errors == 1
    assert not any(m.get("tool_calls") for m in attempt.messages)


def test_unknown_tool_bad_json_and_parallel_calls_are_answered_and_counted(sandbox, task):
    server = OpenAIServer([
        Reply(tool_calls=(ToolCall("grep", {"pattern": "add"}),)),
        Reply(tool_calls=(ToolCall("bash", '{"command": "ls"'),)),
        Reply(tool_calls=(ToolCall("bash", {"command": "ls"}), ToolCall("bash", {"command": "pwd"}))),
        Reply("I give up."),
        Reply(tool_calls=(ToolCall("submit"),)),
    ])
    with server as base_url:
        attempt = run_attempt(task, openai_policy(base_url), sandbox, AgentConfig(max_format_errors=5))
    assert attempt.exit_status == "submitted" and attempt.format_errors == 4
    answers = [m for m in attempt.messages[2:] if m["role"] != "assistant"]
    assert "unknown tool 'grep'. Available tools: bash, edit, submit" in answers[0]["content"]
    assert "arguments of bash are not valid JSON" in answers[1]["content"]
    assert [m["role"] for m in answers[2:4]] == ["tool", "tool"] and "2 tool calls" in answers[2]["content"]
    assert answers[4] == {"role": "user", "content": answers[4]["content"]} and "no tool call" in answers[4]["content"]
    assert [s.tool for s in attempt.steps] == ["grep", "bash", "", "", "submit"]


def test_max_steps(sandbox, task):
    server = OpenAIServer([Reply(tool_calls=(ToolCall("bash", {"command": "echo hi > note.txt"}),))],
                          repeat_last=True)
    with server as base_url:
        attempt = run_attempt(task, openai_policy(base_url), sandbox, AgentConfig(max_steps=3))
    assert attempt.exit_status == "max_steps" and len(attempt.steps) == 3 and len(server.requests) == 3
    assert "+hi" in attempt.patch  # the patch is taken at the limit too


def test_max_total_tokens(sandbox, task):
    server = OpenAIServer([Reply(tool_calls=(ToolCall("bash", {"command": "ls"}),))], repeat_last=True)
    with server as base_url:
        attempt = run_attempt(task, openai_policy(base_url), sandbox, AgentConfig(max_total_tokens=10))
    assert attempt.exit_status == "max_tokens" and len(attempt.steps) == 1 and attempt.total_tokens >= 10


def test_max_wall_time(sandbox, task):
    server = OpenAIServer([Reply(tool_calls=(ToolCall("bash", {"command": "sleep 5"}),))], repeat_last=True)
    with server as base_url:
        attempt = run_attempt(task, openai_policy(base_url), sandbox, AgentConfig(max_wall_time=1.0))
    assert attempt.exit_status == "max_wall_time" and len(attempt.steps) == 1
    assert "timed out" in tool_outputs(attempt)[0] and attempt.wall_time < 5


@pytest.mark.parametrize("server_class, make_policy", [(OpenAIServer, openai_policy),
                                                       (AnthropicServer, anthropic_policy)])
def test_server_failing_forever_is_a_policy_error(sandbox, task, server_class, make_policy):
    server = server_class([], fail_first=1000, fail_status=500)
    with server as base_url:
        attempt = run_attempt(task, make_policy(base_url, max_retries=2), sandbox, AgentConfig())
    assert attempt.exit_status == "policy_error" and "failed after 3 attempts" in attempt.error
    assert len(server.requests) == 3 and attempt.steps == () and attempt.patch == ""


@pytest.mark.parametrize("status, exit_status", [(400, "context_error"), (401, "policy_error")])
def test_non_retryable_api_errors(sandbox, task, status, exit_status):
    server = AnthropicServer([Reply(status=status, error="prompt is too long: 300000 tokens > 200000")])
    with server as base_url:
        attempt = run_attempt(task, anthropic_policy(base_url), sandbox, AgentConfig())
    assert attempt.exit_status == exit_status and "prompt is too long" in attempt.error


class DyingSandbox(LocalSandbox):
    """A LocalSandbox whose engine goes away once `dead` is set."""

    dead = False

    def run(self, command, timeout=None):
        if self.dead:
            raise SandboxError("container 1234 is exited; the sandbox is gone")
        return super().run(command, timeout)


def test_sandbox_failure_is_a_sandbox_error(tmp_path, task):
    with DyingSandbox(make_repo(tmp_path / "other")) as box:
        box.dead = True
        server = OpenAIServer([Reply(tool_calls=(ToolCall("bash", {"command": "ls"}),))])
        with server as base_url:
            attempt = run_attempt(task, openai_policy(base_url), box, AgentConfig())
    assert attempt.exit_status == "sandbox_error" and "sandbox is gone" in attempt.error
    assert attempt.patch == "" and len(attempt.steps) == 1 and attempt.steps[0].error


def test_guidance_and_tests_in_the_prompt(sandbox, task):
    server = OpenAIServer([Reply(tool_calls=(ToolCall("submit"),))])
    with server as base_url:
        attempt = run_attempt(task, openai_policy(base_url), sandbox, AgentConfig(),
                              guidance_text="Hint: look at the operator in add().")
    user, unguided = attempt.prompt[1]["content"], attempt.unguided_prompt[1]["content"]
    assert user == unguided + "\n\nHint: look at the operator in add()."
    assert server.requests[0]["messages"][1]["content"] == user
    assert ISSUE in unguided and sandbox.workdir in unguided and "test_add" not in unguided
    shown = unguided_prompt(task, AgentConfig(show_tests=True))[1]["content"]
    assert "- test_calc.py::test_add" in shown
    assert attempt.prompt[0] == attempt.unguided_prompt[0]


def test_native_format_needs_a_native_policy(task):
    with pytest.raises(ValueError, match="no native tool calling"):
        unguided_prompt(task, AgentConfig(tool_format="native"), native_tools=False)
    with pytest.raises(ValueError, match="AgentConfig.max_steps is 0; it must be at least 1"):
        AgentConfig(max_steps=0)


@pytest.mark.slow
def test_tiny_local_model_runs_an_attempt_with_logprobs(tiny_model, tmp_path, sandbox, task):
    from pipeline.agent.hf_policy import LocalHFPolicy, LocalHFPolicyConfig

    policy = LocalHFPolicy(LocalHFPolicyConfig(model_path=str(tiny_model),
                                               max_new_tokens=24))
    attempt = run_attempt(task, policy, sandbox, AgentConfig(max_steps=2, max_format_errors=5), seed=0)
    assert attempt.exit_status == "max_steps"  # random weights write no valid call: 2 format errors of 5 allowed
    assert policy.native_tools and [t["function"]["name"] for t in attempt.tools] == ["bash", "edit", "submit"]
    assert '"name": "bash"' in policy.tokenizer.decode(attempt.prompt_token_ids[0])  # the template renders the schemas
    turns = [m for m in attempt.messages if m["role"] == "assistant"]
    assert len(attempt.logprobs) == len(turns) == len(attempt.steps) >= 1
    assert all(lp and all(value <= 0 for value in lp) for lp in attempt.logprobs)
    assert [len(ids) for ids in attempt.token_ids] == [len(lp) for lp in attempt.logprobs]
    first, second = attempt.prompt_token_ids[:2]
    assert second[:len(first)] == first  # turn 2's context holds turn 1's, then turn 1 re-rendered from its text,
    # which need not be the ids it sampled: why each turn's own context is stored
    assert attempt.identity == policy.identity and attempt.identity.revision.startswith("sha256:")
    stored = to_stored_trajectory(attempt, policy, tmp_path)
    assert stored.token_ids == attempt.token_ids and stored.prompt_token_ids == attempt.prompt_token_ids
    assert all(a == pytest.approx(b, abs=1e-6) for a, b in zip(stored.logprobs, attempt.logprobs))  # float32 on disk
    assert (stored.policy_model, stored.policy_revision, stored.chat_template_hash) == (
        policy.identity.model, policy.identity.revision, policy.identity.chat_template_hash)


def to_stored_trajectory(attempt, policy, tmp_path):
    """The attempt through `to_trajectory`, a Parquet file and back."""
    from pipeline.core.records import TRAJECTORY_SCHEMA, Trajectory
    from pipeline.rollouts.batch_metrics import token_id_coverage
    from pipeline.rollouts.batch import NO_GUIDANCE, Job, to_trajectory
    from pipeline.core.store import read_records, write_rows

    task = Task(instance_id="calc-1", repo="demo/calc", base_commit="", patch="", test_patch="", problem_statement="",
                FAIL_TO_PASS=(), PASS_TO_PASS=(), image="", workdir="", test_cmd="", log_parser="", source="synth")

    traj = to_trajectory(Job(task, 0, 0, NO_GUIDANCE, "g", "r"), policy, "b", attempt, None, "", 0)
    path = write_rows(tmp_path / "t.parquet", [traj.to_row()], TRAJECTORY_SCHEMA)
    (stored,) = [Trajectory.from_row(r) for r in read_records(path, TRAJECTORY_SCHEMA)]
    turns = len(attempt.token_ids)
    assert token_id_coverage([stored]) == {"turns_with_token_ids": turns, "turns_without_token_ids": 0}
    return stored


def test_breaking_the_repository_is_the_attempts_fault(sandbox, task):
    script = [Reply(tool_calls=(ToolCall("bash", {"command": "rm -rf .git"}),)), Reply(tool_calls=(ToolCall("submit"),))]
    with OpenAIServer(script) as base_url:
        attempt = run_attempt(task, openai_policy(base_url), sandbox, AgentConfig())
    assert attempt.exit_status == "repo_broken" and attempt.patch == ""
