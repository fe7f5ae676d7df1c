"""A step whose model server does not answer, or does not serve the model, stops before its first attempt, saying
which URL, which model and how to start it. Real HTTP to loopback servers and to a port nothing listens on."""

from __future__ import annotations

import json
import socket
from http.server import BaseHTTPRequestHandler

import pytest

from pipeline.agent.anthropic_policy import AnthropicPolicy, AnthropicPolicyConfig
from pipeline.agent.heuristic import HeuristicPolicy
from pipeline.agent.openai_policy import OpenAIPolicy, OpenAIPolicyConfig
from pipeline.agent.server_check import ServerCheckError, check_server
from assets.cli import main
from pipeline.guidance.teacher import LLMTeacher, RuleTeacher
from pipeline.core.layout import Layout
from tests.loopback import AnthropicServer, OpenAIServer, ThreadedServer


def closed_port() -> int:
    """A loopback port nothing listens on (a connection is refused)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class _Answer(BaseHTTPRequestHandler):
    owner: "Answers"
    protocol_version = "HTTP/1.1"

    def do_GET(self) -> None:
        self.owner.paths.append(f"GET {self.path}")
        data = json.dumps(self.owner.body).encode()
        self.send_response(self.owner.status)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    do_POST = do_GET

    def log_message(self, *args: object) -> None:
        pass


class Answers(ThreadedServer):
    """Answers every request with one status and JSON body; `paths` holds what was asked."""

    handler = _Answer

    def __init__(self, status: int, body: dict):
        self.status, self.body, self.paths = status, body, []


def openai_policy(url: str, model: str = "Qwen/Qwen2.5-Coder-7B-Instruct") -> OpenAIPolicy:
    return OpenAIPolicy(OpenAIPolicyConfig(model=model, base_url=url), api_key="k")


def anthropic_policy(url: str | None, model: str = "claude-sonnet-4-5") -> AnthropicPolicy:
    return AnthropicPolicy(AnthropicPolicyConfig(model=model, base_url=url), api_key="k")


VLLM = "`vllm serve Qwen/Qwen2.5-Coder-7B-Instruct --enable-auto-tool-choice --tool-call-parser hermes`"


def test_an_openai_server_that_lists_the_model_passes_with_one_request():
    server = OpenAIServer([])
    with server as url:
        check_server(openai_policy(url, model="loopback"), "policy")
    assert server.requests == []  # a GET of the list only: no completion asked, no token spent


@pytest.mark.parametrize("where, message", [
    ("refused", r"the policy server at http://127\.0\.0\.1:\d+/v1 does not answer \(APIConnectionError: "
                r"Connection error\.\); it must serve Qwen/Qwen2\.5-Coder-7B-Instruct: start it, e\.g\. "
                + VLLM.replace(".", r"\.")),
    ("no /v1", r"the policy server at http://127\.0\.0\.1:\d+ has no /models \(404\); http://127\.0\.0\.1:\d+ "
               r"should be the server's root including /v1"),
    ("other model", r"does not serve 'Qwen/Qwen2\.5-Coder-7B-Instruct' \(it lists \['loopback'\]\): start it, e\.g\. "
                    r"`vllm serve Qwen/Qwen2\.5-Coder-7B-Instruct .*or set policy\.base_url to where it runs and "
                    r"policy\.model to a model it serves; nothing ran"),
])
def test_an_openai_server_that_does_not_serve_the_model_stops_the_step(where, message):
    if where == "refused":
        with pytest.raises(ServerCheckError, match=message):
            check_server(openai_policy(f"http://127.0.0.1:{closed_port()}/v1"), "policy")
        return
    server = OpenAIServer([])
    with server as url:
        with pytest.raises(ServerCheckError, match=message):
            check_server(openai_policy(server.url if where == "no /v1" else url), "policy")


def test_a_refused_key_names_the_setting_that_holds_it():
    server = Answers(401, {"error": {"message": "invalid api key", "type": "invalid_request_error"}})
    with server as url:
        with pytest.raises(ServerCheckError, match=r"the teacher server at .* refused the key \(401: .*invalid "
                                                   r"api key.*\); set the environment variable "
                                                   r"guidance\.teacher_api_key_env"):
            check_server(LLMTeacher(openai_policy(url + "/v1")), "teacher")
    assert server.paths == ["GET /v1/models"]  # asked once, not retried


def test_the_anthropic_api_resolves_the_model_with_one_request():
    server = Answers(200, {"id": "claude-sonnet-4-5-20250929", "type": "model", "display_name": "Claude Sonnet 4.5",
                           "created_at": "2025-09-29T00:00:00Z"})
    with server as url:
        check_server(anthropic_policy(url), "teacher")
    assert server.paths == ["GET /v1/models/claude-sonnet-4-5"]


def test_an_anthropic_compatible_server_is_asked_for_its_list():
    """vLLM's Messages API has no route per model (404): its list says which it serves."""
    with AnthropicServer([]) as url:
        check_server(anthropic_policy(url, model="loopback"), "teacher")
        with pytest.raises(ServerCheckError, match=r"the teacher server at http://127\.0\.0\.1:\d+ does not serve "
                                                   r"'claude-sonnet-4-5' \(it lists \['loopback'\]\): start it"):
            check_server(LLMTeacher(anthropic_policy(url)), "teacher")


class _NoModelRoutes(AnthropicServer.handler):
    def do_GET(self) -> None:
        self._send(404, {"type": "error", "error": {"type": "not_found_error", "message": "no route"}})


def test_a_server_without_a_model_list_is_asked_for_one_token():
    server = AnthropicServer(["hello"])
    server.handler = _NoModelRoutes  # a Messages server with no model routes at all
    with server as url:
        check_server(anthropic_policy(url), "teacher")
    assert [r["max_tokens"] for r in server.requests] == [1] and not server.errors


@pytest.mark.parametrize("status, message", [
    (None, r"the teacher server at http://127\.0\.0\.1:\d+ does not answer \(APIConnectionError: Connection to "
           r"127\.0\.0\.1:\d+ failed: \[Errno 111\] Connection refused\); it must serve claude-sonnet-4-5: "
           r"start it, e\.g\. `vllm serve claude-sonnet-4-5` \(--served-model-name"),
    (401, r"refused the key \(401"),
])
def test_an_anthropic_server_that_does_not_answer_stops_the_step(status, message):
    if status is None:
        with pytest.raises(ServerCheckError, match=message):
            check_server(anthropic_policy(f"http://127.0.0.1:{closed_port()}"), "teacher")
        return
    refused = {"type": "error", "error": {"type": "authentication_error", "message": "invalid x-api-key"}}
    server = Answers(status, refused)
    with server as url:
        with pytest.raises(ServerCheckError, match=message):
            check_server(anthropic_policy(url), "teacher")
    assert server.paths == ["GET /v1/models/claude-sonnet-4-5"]


def test_clients_without_a_server_pass():
    for client in (HeuristicPolicy(), RuleTeacher(), None):
        check_server(client, "policy")


@pytest.fixture
def home(tmp_path, monkeypatch):
    monkeypatch.setenv("DAGSTER_HOME", str(tmp_path / "home"))
    monkeypatch.delenv("HANDHOLD_SANDBOX_POOL_LIMIT", raising=False)
    return tmp_path / "home"


def test_a_rollout_step_whose_server_is_down_exits_1_having_written_nothing(home, tmp_path, capsys):
    """configs/vllm-anthropic.yaml with no server started: the step fails at once, says what to start; no attempt,
    no round record."""
    data, port = tmp_path / "data", closed_port()
    code = main(["run", "--select", "key:unguided_rollouts", "--config", "configs/vllm-anthropic.yaml",
                 "--set", f"policy.base_url=http://127.0.0.1:{port}/v1", "--set", f"data_dir={data}",
                 "--set", "batch=b1"])
    out = capsys.readouterr().out
    assert code == 1
    assert (f"\nFAILED unguided_rollouts: pipeline.agent.server_check.ServerCheckError: the policy server at "
            f"http://127.0.0.1:{port}/v1 does not answer "
            f"(APIConnectionError: Connection error.); it must serve Qwen/Qwen2.5-Coder-7B-Instruct: start it, "
            f"e.g. {VLLM}") in out
    assert "retry 1 of" not in out  # not an infrastructure fault to retry the step on
    assert not Layout(data).trajectories("unguided", "b1").exists()


def test_an_evaluation_whose_served_checkpoint_is_not_there_stops_before_any_attempt(tmp_path):
    """`training.evaluation.base_url` set and the server not serving the stage's checkpoint: the evaluation step
    stops at its check, naming the URL, the checkpoint's name and how to serve it; no attempt runs."""
    import logging
    from types import SimpleNamespace

    from assets.resources import Credentials
    from assets.training import evaluate_model
    from pipeline.core.layout import Layout
    from pipeline.rollouts.batch import RolloutConfig
    from training.config import EvaluationConfig

    server = OpenAIServer([], models=("base",))
    with server as url:
        config = EvaluationConfig(base_url=url)
        context = SimpleNamespace(log=logging.getLogger("evaluation"))
        with pytest.raises(ServerCheckError, match=r"the evaluation server at .* does not serve 'dpo' .*vllm serve dpo "
                                                   r".*or set training\.evaluation\.base_url to where it runs, serving "
                                                   r"each checkpoint under its stage's name; nothing ran"):
            evaluate_model(context, "dpo", "/unused/when/served", [], [], RolloutConfig(), Layout(tmp_path), "b1",
                           config, Credentials(policy_api_key="k"))
    assert server.requests == [] and not (tmp_path / "evaluation").exists()
