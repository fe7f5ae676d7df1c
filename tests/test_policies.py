"""OpenAIPolicy and AnthropicPolicy through the real SDKs over HTTP to loopback servers."""

from __future__ import annotations

import json

import openai
import pytest

from pipeline.agent.anthropic_policy import (
    AnthropicPolicy,
    AnthropicPolicyConfig,
    to_anthropic_messages,
    to_anthropic_tools,
)
from pipeline.agent.openai_policy import OpenAIPolicy, OpenAIPolicyConfig
from pipeline.agent.policy import Policy, PolicyError
from tests.loopback import DEFAULT_LOGPROB, AnthropicServer, OpenAIServer, Reply, ToolCall

OPENAI_KEY = "sk-loopback-openai-secret"
ANTHROPIC_KEY = "sk-ant-loopback-secret"
FAST = dict(retry_initial_delay=0.001, retry_max_delay=0.01, timeout=10.0)
BASH = {"type": "function", "function": {
    "name": "bash", "description": "Run a shell command.",
    "parameters": {"type": "object", "properties": {"cmd": {"type": "string"}}, "required": ["cmd"]}}}
ARGS = {"cmd": "grep -rn 'def f' src/ | head -5", "nested": {"list": [1, 2.5, None], "ü": "✓"}}
CHAT = [{"role": "system", "content": "You fix bugs."}, {"role": "user", "content": "Fix it."}]


@pytest.fixture(autouse=True)
def keys(monkeypatch):
    monkeypatch.setenv("OPENAI_API_KEY", OPENAI_KEY)
    monkeypatch.setenv("ANTHROPIC_API_KEY", ANTHROPIC_KEY)


def openai_policy(base_url: str, **overrides) -> OpenAIPolicy:
    return OpenAIPolicy(OpenAIPolicyConfig(model="Qwen2.5-7B", base_url=base_url, **{**FAST, **overrides}))


def anthropic_policy(base_url: str, **overrides) -> AnthropicPolicy:
    return AnthropicPolicy(AnthropicPolicyConfig(model="claude-test", base_url=base_url, **{**FAST, **overrides}))


def test_openai_text_reply_sends_sampling_settings_seed_and_key():
    server = OpenAIServer(["I will look at the code."])
    with server as base_url:
        policy = openai_policy(base_url, temperature=0.7, top_p=0.9, max_tokens=123)
        turn = policy.act(CHAT, [BASH], seed=42)
    assert isinstance(policy, Policy) and policy.name == "openai:Qwen2.5-7B" and policy.native_tools
    assert turn.message == {"role": "assistant", "content": "I will look at the code."}
    assert turn.finish_reason == "stop" and turn.logprobs is None and turn.latency > 0
    assert turn.usage.completion_tokens == 6 and turn.usage.prompt_tokens > 0
    request = server.requests[0]
    assert request["messages"] == CHAT and request["tools"] == [BASH] and request["seed"] == 42
    assert (request["temperature"], request["top_p"], request["max_tokens"]) == (0.7, 0.9, 123)
    assert "logprobs" not in request
    assert server.headers[0]["authorization"] == f"Bearer {OPENAI_KEY}"
    assert not server.errors


@pytest.mark.parametrize("settings,sent_top_k,stored", [
    (dict(temperature=0.7, top_p=0.9), None, (0.7, 0.9, -1)),  # top-k not sent: the server's default, unknown
    (dict(top_k=-1), -1, (1.0, 1.0, 0)),  # vLLM's 'off' is stored as 0
    (dict(top_k=0), 0, (1.0, 1.0, 0)),  # llama.cpp's 'off'
    (dict(temperature=0.0, top_k=20), 20, (0.0, 1.0, 20)),
])
def test_openai_identity_holds_the_sampling_settings_it_sent(settings, sent_top_k, stored):
    server = OpenAIServer(["ok"])
    with server as base_url:
        turn = openai_policy(base_url, request_logprobs=True, **settings).act(CHAT, [])
    identity, request = turn.identity, server.requests[0]
    assert (identity.temperature, identity.top_p, identity.top_k) == stored
    assert (request["temperature"], request["top_p"]) == stored[:2] and request.get("top_k") == sent_top_k
    assert request["return_token_ids"] is True  # the other extra parameters still go


@pytest.mark.parametrize("temperature,stored", [(None, -1.0), (0.2, 0.2)])
def test_anthropic_identity_holds_what_it_sent_and_unknown_for_the_rest(temperature, stored):
    with AnthropicServer(["ok"]) as base_url:
        identity = anthropic_policy(base_url, temperature=temperature).act(CHAT, []).identity
    assert (identity.model, identity.temperature, identity.top_p, identity.top_k) == ("claude-test", stored, -1.0, -1)


def test_the_heuristic_is_stored_as_greedy():
    from pipeline.agent.heuristic import HeuristicPolicy

    identity = HeuristicPolicy().act(CHAT, []).identity
    assert (identity.model, identity.temperature, identity.top_p, identity.top_k) == ("", 0.0, 1.0, 0)


def test_openai_tool_call_arguments_round_trip_as_json_strings():
    server = OpenAIServer([Reply(text="Searching.", tool_calls=(ToolCall("bash", ARGS, id="call_a"),
                                                               ToolCall("bash", {"cmd": "ls"})))])
    with server as base_url:
        turn = openai_policy(base_url).act(CHAT, [BASH])
    calls = turn.message["tool_calls"]
    assert turn.message["content"] == "Searching." and turn.finish_reason == "tool_calls"
    assert [c["id"] for c in calls][0] == "call_a" and all(c["type"] == "function" for c in calls)
    assert all(isinstance(c["function"]["arguments"], str) for c in calls)
    assert [json.loads(c["function"]["arguments"]) for c in calls] == [ARGS, {"cmd": "ls"}]


def test_openai_malformed_arguments_are_passed_through_verbatim():
    with OpenAIServer([Reply(tool_calls=(ToolCall("bash", '{"cmd": "ls'),))]) as base_url:
        turn = openai_policy(base_url).act(CHAT, [BASH])
    assert turn.message["content"] is None
    assert turn.message["tool_calls"][0]["function"]["arguments"] == '{"cmd": "ls'


@pytest.mark.parametrize("status", [429, 500, 503])
def test_openai_retries_then_succeeds(status):
    server = OpenAIServer(["ok"], fail_first=2, fail_status=status)
    with server as base_url:
        turn = openai_policy(base_url, max_retries=2).act(CHAT, [])
    assert turn.message["content"] == "ok" and len(server.requests) == 3


def test_openai_raises_policy_error_after_last_retry():
    server = OpenAIServer(["never"], fail_first=100, fail_status=500)
    with server as base_url, pytest.raises(PolicyError, match="3 attempts"):
        openai_policy(base_url, max_retries=2).act(CHAT, [])
    assert len(server.requests) == 3  # the SDK's own retries are off: the count is ours


def test_openai_connection_refused_is_retried_then_policy_error():
    server = OpenAIServer([])
    with server as base_url:
        pass  # closed: nothing listens on the port any more
    with pytest.raises(PolicyError, match="2 attempts"):
        openai_policy(base_url, max_retries=1).act(CHAT, [])


def test_openai_bad_request_is_not_retried():
    server = OpenAIServer([Reply(status=400, error="context length exceeded")])
    with server as base_url, pytest.raises(PolicyError) as refused:
        openai_policy(base_url, max_retries=3).act(CHAT, [])
    assert len(server.requests) == 1
    assert refused.value.status == 400 and refused.value.request_rejected  # the provider's error, translated
    assert isinstance(refused.value.__cause__, openai.BadRequestError) and "context length exceeded" in str(refused.value)


def test_openai_records_logprobs_when_requested():
    server = OpenAIServer(["a b c", Reply(tool_calls=(ToolCall("bash", {"cmd": "ls"}),), logprobs=(-1.0, -2.0))])
    with server as base_url:
        policy = openai_policy(base_url, request_logprobs=True)
        text, call = policy.act(CHAT, []), policy.act(CHAT, [BASH])
    assert text.logprobs == (DEFAULT_LOGPROB,) * 3 == (DEFAULT_LOGPROB,) * text.usage.completion_tokens
    assert call.logprobs == (-1.0, -2.0)
    assert all(request["logprobs"] is True for request in server.requests)


def test_openai_falls_back_once_when_the_server_rejects_logprobs():
    def no_logprobs(request: dict) -> Reply:
        if request.get("logprobs"):
            return Reply(status=400, error="logprobs is not supported by this server")
        return Reply(text="fine")

    server = OpenAIServer(no_logprobs)
    with server as base_url:
        policy = openai_policy(base_url, request_logprobs=True, max_retries=0)
        first, second = policy.act(CHAT, []), policy.act(CHAT, [])
    assert first.message["content"] == second.message["content"] == "fine"
    assert first.logprobs is None and second.logprobs is None
    assert ["logprobs" in r for r in server.requests] == [True, False, False]  # remembered
    assert policy.settings()["logprobs_requested"] is False


def test_settings_never_hold_the_api_key():
    with OpenAIServer([]) as openai_url, AnthropicServer([]) as anthropic_url:
        policies = [openai_policy(openai_url), anthropic_policy(anthropic_url)]
    for policy in policies:
        settings = json.dumps(policy.settings())
        assert OPENAI_KEY not in settings and ANTHROPIC_KEY not in settings
        assert "api_key" not in settings and policy.settings()["model"]


def test_openai_runs_without_a_key_for_local_servers(monkeypatch):
    monkeypatch.delenv("OPENAI_API_KEY")
    server = OpenAIServer(["ok"])
    with server as base_url:
        assert openai_policy(base_url).act(CHAT, []).message["content"] == "ok"
    assert server.headers[0]["authorization"] == "Bearer EMPTY"


def test_anthropic_text_reply():
    server = AnthropicServer(["Looking."])
    with server as base_url:
        policy = anthropic_policy(base_url, temperature=0.2, max_tokens=321)
        turn = policy.act(CHAT, [BASH], seed=7)
    assert isinstance(policy, Policy) and policy.name == "anthropic:claude-test"
    assert turn.message == {"role": "assistant", "content": "Looking."}
    assert turn.finish_reason == "stop" and turn.usage.completion_tokens == 1 and turn.logprobs is None
    request = server.requests[0]
    assert request["system"] == "You fix bugs." and request["messages"] == [
        {"role": "user", "content": [{"type": "text", "text": "Fix it."}]}]
    assert (request["temperature"], request["max_tokens"]) == (0.2, 321)
    assert request["tools"] == to_anthropic_tools([BASH]) and "seed" not in request
    sent = server.headers[0]  # older SDKs send x-api-key, 2.x a bearer token
    assert ANTHROPIC_KEY in (sent.get("x-api-key"), sent.get("authorization", "").removeprefix("Bearer "))


def test_anthropic_tool_use_becomes_openai_tool_calls():
    server = AnthropicServer([Reply(tool_calls=(ToolCall("bash", ARGS, id="toolu_1"),))])
    with server as base_url:
        turn = anthropic_policy(base_url).act(CHAT, [BASH])
    assert turn.finish_reason == "tool_calls" and turn.message["content"] is None
    (call,) = turn.message["tool_calls"]
    assert call["id"] == "toolu_1" and call["function"]["name"] == "bash"
    assert json.loads(call["function"]["arguments"]) == ARGS
    assert "temperature" not in server.requests[0]  # unset: the model's own


@pytest.mark.parametrize("status", [429, 500, 529])
def test_anthropic_retries_then_succeeds(status):
    server = AnthropicServer(["ok"], fail_first=1, fail_status=status)
    with server as base_url:
        assert anthropic_policy(base_url, max_retries=1).act(CHAT, []).message["content"] == "ok"
    assert len(server.requests) == 2


def test_anthropic_raises_policy_error_after_last_retry():
    server = AnthropicServer([], fail_first=100, fail_status=429)
    with server as base_url, pytest.raises(PolicyError, match="4 attempts"):
        anthropic_policy(base_url, max_retries=3).act(CHAT, [])
    assert len(server.requests) == 4


def test_anthropic_needs_its_key(monkeypatch):
    monkeypatch.delenv("ANTHROPIC_API_KEY")
    with pytest.raises(ValueError, match="ANTHROPIC_API_KEY"):
        anthropic_policy("http://127.0.0.1:1")


HISTORY = [
    {"role": "system", "content": "You fix bugs."},
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": [{"type": "text", "text": "Fix "}, {"type": "text", "text": "it."}]},
    {"role": "assistant", "content": "Two looks.", "tool_calls": [
        {"id": "t1", "type": "function", "function": {"name": "bash", "arguments": '{"cmd": "ls"}'}},
        {"id": "t2", "type": "function", "function": {"name": "bash", "arguments": "not json"}}]},
    {"role": "tool", "tool_call_id": "t1", "content": "a.py"},
    {"role": "tool", "tool_call_id": "t2", "content": ""},
    {"role": "user", "content": "Go on."},
    {"role": "assistant", "content": None, "tool_calls": [
        {"id": "t3", "type": "function", "function": {"name": "bash", "arguments": "{}"}}]},
    {"role": "tool", "tool_call_id": "t3", "content": "done"},
    {"role": "assistant", "content": ""},
]
ANTHROPIC_HISTORY = [
    {"role": "user", "content": [{"type": "text", "text": "Fix it."}]},
    {"role": "assistant", "content": [
        {"type": "text", "text": "Two looks."},
        {"type": "tool_use", "id": "t1", "name": "bash", "input": {"cmd": "ls"}},
        {"type": "tool_use", "id": "t2", "name": "bash", "input": {"arguments": "not json"}}]},
    {"role": "user", "content": [
        {"type": "tool_result", "tool_use_id": "t1", "content": "a.py"},
        {"type": "tool_result", "tool_use_id": "t2", "content": "(empty)"},
        {"type": "text", "text": "Go on."}]},
    {"role": "assistant", "content": [{"type": "tool_use", "id": "t3", "name": "bash", "input": {}}]},
    {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t3", "content": "done"}]},
    {"role": "assistant", "content": [{"type": "text", "text": "(empty)"}]},
]


def test_openai_history_converts_to_anthropic_messages():
    assert to_anthropic_messages(HISTORY) == ("You fix bugs.\n\nBe brief.", ANTHROPIC_HISTORY)


def test_anthropic_receives_converted_history_over_http():
    server = AnthropicServer(["next"])
    with server as base_url:
        anthropic_policy(base_url).act(HISTORY + [{"role": "user", "content": "More."}], [BASH])
    request = server.requests[0]
    assert request["system"] == "You fix bugs.\n\nBe brief."
    assert request["messages"] == ANTHROPIC_HISTORY + [
        {"role": "user", "content": [{"type": "text", "text": "More."}]}]
    assert request["tools"] == [{"name": "bash", "description": "Run a shell command.",
                                 "input_schema": BASH["function"]["parameters"]}]


class VLLMServer(OpenAIServer):
    """The loopback OpenAI server plus what vLLM (>= 0.10.2) adds when asked: `prompt_token_ids` on the
    response, `token_ids` on the choice (one per made-up token), `reasoning_content` on the message, and
    log-prob tokens named 'token_id:<id>' under `return_tokens_as_token_ids`."""

    def __init__(self, script, *, reasoning: str | None = None, ids: bool = True, **options):
        super().__init__(script, **options)
        self.reasoning, self.ids = reasoning, ids

    def answer(self, path, body, headers):
        status, payload = super().answer(path, body, headers)
        if status != 200:
            return status, payload
        choice = payload["choices"][0]
        count = payload["usage"]["completion_tokens"]
        if self.reasoning is not None:
            choice["message"]["reasoning_content"] = self.reasoning
        if self.ids and body.get("return_token_ids"):
            payload["prompt_token_ids"] = list(range(100, 100 + payload["usage"]["prompt_tokens"]))
            choice["token_ids"] = list(range(7, 7 + count))
        if body.get("return_tokens_as_token_ids") and choice["logprobs"]:
            for i, token in enumerate(choice["logprobs"]["content"]):
                token["token"] = f"token_id:{7 + i}"
        return status, payload


def test_openai_asks_vllm_for_token_ids_and_stores_them_aligned_with_logprobs():
    server = VLLMServer([Reply("a b c", logprobs=(-0.5, -1.5, -0.125))], reasoning="The bug is in add.")
    with server as base_url:
        policy = openai_policy(base_url, request_logprobs=True)
        turn = policy.act(CHAT, [])
    request = server.requests[0]
    assert request["return_token_ids"] is True and request["return_tokens_as_token_ids"] is True
    assert turn.token_ids == (7, 8, 9) and turn.logprobs == (-0.5, -1.5, -0.125)
    assert turn.prompt_ids == tuple(range(100, 100 + turn.usage.prompt_tokens))
    assert turn.message == {"role": "assistant", "content": "a b c", "reasoning_content": "The bug is in add."}
    assert turn.identity.model == "Qwen2.5-7B" and turn.identity.revision == ""  # no local copy named
    assert policy.settings()["token_ids_missing"] == ""


def test_openai_without_token_ids_stores_none_and_says_why_once():
    server = VLLMServer(["a b", "c"], ids=False)
    with server as base_url:
        policy = openai_policy(base_url, request_logprobs=True)
        turns = [policy.act(CHAT, []), policy.act(CHAT, [])]
    assert all(t.token_ids is None and t.prompt_ids is None and t.logprobs for t in turns)
    assert policy.settings()["token_ids_missing"] == (
        f"openai:Qwen2.5-7B at {policy.config.base_url}: the server returned no prompt_token_ids/token_ids "
        "(vLLM >= 0.10.2 returns them)")


def test_openai_sampled_ids_from_token_id_names_when_token_ids_are_absent():
    class NamesOnly(VLLMServer):
        def answer(self, path, body, headers):
            status, payload = super().answer(path, body, headers)
            payload["choices"][0].pop("token_ids", None)
            return status, payload

    with NamesOnly([Reply("x y", logprobs=(-1.0, -2.0))]) as base_url:
        turn = openai_policy(base_url, request_logprobs=True).act(CHAT, [])
    assert turn.token_ids == (7, 8) and turn.prompt_ids is not None


def test_openai_drops_token_ids_for_good_when_the_server_rejects_them():
    def strict(request: dict) -> Reply:
        if request.get("return_token_ids"):
            return Reply(status=400, error="Unrecognized request argument supplied: return_token_ids")
        return Reply(text="fine")

    server = OpenAIServer(strict)
    with server as base_url:
        policy = openai_policy(base_url, request_logprobs=True, max_retries=0)
        first, second = policy.act(CHAT, []), policy.act(CHAT, [])
    assert first.logprobs == second.logprobs == (DEFAULT_LOGPROB,) and first.token_ids is None
    assert [("return_token_ids" in r, r.get("logprobs")) for r in server.requests] == [
        (True, True), (False, True), (False, True)]
    assert "refused return_token_ids" in policy.settings()["token_ids_missing"]


def test_openai_identity_from_a_local_copy_of_the_served_model(tiny_model):
    from pipeline.agent.identity import template_hash, weights_revision
    from training.tiny_model import CHAT_TEMPLATE

    with VLLMServer(["ok"]) as base_url:
        turn = openai_policy(base_url, identity_model_path=str(tiny_model)).act(CHAT, [])
    assert turn.identity.revision == weights_revision(tiny_model) and turn.identity.revision.startswith("sha256:")
    assert turn.identity.chat_template_hash == template_hash(CHAT_TEMPLATE)


def test_anthropic_thinking_is_kept_as_reasoning():
    class Thinking(AnthropicServer):
        def answer(self, path, body, headers):
            status, payload = super().answer(path, body, headers)
            payload["content"].insert(0, {"type": "thinking", "thinking": "add subtracts.", "signature": "sig"})
            return status, payload

    with Thinking(["Fixing."]) as base_url:
        turn = anthropic_policy(base_url).act(CHAT, [])
    assert turn.message == {"role": "assistant", "content": "Fixing.", "reasoning_content": "add subtracts."}
    assert turn.identity.model == "claude-test" and turn.token_ids is None


FIX = "set training.actguide.behaviour_logprobs: recompute, or sample at temperature 1 and top-p 1 with top-k off"
WRONG = ("its log-probs are the raw distribution's at temperature 1 before top-p and top-k, not the one it sampled "
         "from, so a ratio against them is wrong")
UNKNOWN = "its sampling settings are not all known, so its log-probs cannot be shown to be those it sampled from"
GREEDY = ("it was decoded greedily (temperature 0): its tokens had probability 1 under the policy that chose them, "
          "so a ratio against the raw log-probs is undefined")


@pytest.mark.parametrize("settings,shown,why", [
    ((1.0, 1.0, 0), None, None),
    ((0.7, 1.0, 0), "temperature 0.7, top-p 1, top-k off", WRONG),
    ((1.0, 0.95, 0), "temperature 1, top-p 0.95, top-k off", WRONG),
    ((1.0, 1.0, 20), "temperature 1, top-p 1, top-k 20", WRONG),
    ((1.0, 1.0, -1), "temperature 1, top-p 1, top-k unknown", UNKNOWN),  # not sent: the server's default
    ((-1.0, 1.0, 0), "temperature unknown, top-p 1, top-k off", UNKNOWN),
    ((1.0, -1.0, 0), "temperature 1, top-p unknown, top-k off", UNKNOWN),
    ((0.0, 1.0, 0), "temperature 0, top-p 1, top-k off", GREEDY),
    ((0.0, -1.0, -1), "temperature 0, top-p unknown, top-k unknown", GREEDY),
    ((None, None, None), "temperature unknown, top-p unknown, top-k unknown", UNKNOWN),  # a member without them
])
def test_stored_log_probs_are_behaviour_log_probs_only_at_temperature_1_top_p_1_top_k_off(settings, shown, why):
    from pipeline.agent.identity import sampling_refusal

    member = {"rollout_id": "r7", **dict(zip(("temperature", "top_p", "top_k"), settings))}
    expected = f"trajectory r7 was sampled at {shown}: {why}; {FIX}" if why else ""
    assert sampling_refusal(member) == expected
