"""Loopback model servers for tests: the OpenAI and Anthropic protocols over real HTTP.

A server answers from a *script*: a list of replies consumed one per request, or a
callable that gets the request's JSON body and returns a reply. A reply is a `Reply`
(text and/or tool calls, or an error status) or a plain string (text only). Every request
is recorded, failed ones included. Use it as a context manager, which yields the base_url
the matching SDK expects::

    server = OpenAIServer(["hello", Reply(tool_calls=(ToolCall("bash", {"cmd": "ls"}),))])
    with server as base_url:            # "http://127.0.0.1:<port>/v1"
        OpenAI(base_url=base_url, api_key="x").chat.completions.create(...)
    assert server.requests[0]["messages"][-1]["content"] == "..."
    assert not server.errors

`AnthropicServer` is the same with `/v1/messages` and a base_url without `/v1`.
`fail_first=N, fail_status=429` answers the first N requests with that error, for retries.
Token counts and log-probs are made up but consistent: one token per whitespace-led word
of the reply's text and serialized tool calls, each with log-prob -0.25 unless given.
"""

from __future__ import annotations

import itertools
import json
import re
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Callable, Sequence, Union

DEFAULT_LOGPROB = -0.25


class ThreadedServer:
    """A ThreadingHTTPServer on 127.0.0.1 in a daemon thread; its handler finds this object as `owner`.

    `with server as url:` starts it and stops it again.
    """

    handler: type[BaseHTTPRequestHandler]
    _httpd: ThreadingHTTPServer | None = None

    @property
    def url(self) -> str:
        """http://127.0.0.1:<port>, once started."""
        assert self._httpd is not None, "start the server first"
        return f"http://127.0.0.1:{self._httpd.server_address[1]}"

    def start(self) -> "ThreadedServer":
        self._httpd = ThreadingHTTPServer(("127.0.0.1", 0), type("Handler", (self.handler,), {"owner": self}))
        self._httpd.daemon_threads = True
        threading.Thread(target=self._httpd.serve_forever, args=(0.02,), daemon=True).start()  # fast shutdown
        return self

    def close(self) -> None:
        if self._httpd is not None:
            self._httpd.shutdown()
            self._httpd.server_close()
            self._httpd = None

    @property
    def base_url(self) -> str:
        """What a client is given (`with server as base_url`): the URL, unless a subclass adds a path."""
        return self.url

    def __enter__(self) -> str:
        return self.start().base_url

    def __exit__(self, *exc: object) -> None:
        self.close()


@dataclass(frozen=True)
class ToolCall:
    """A tool call in a scripted reply."""

    name: str
    arguments: dict | str = field(default_factory=dict)
    """An object, or a raw string (to script malformed JSON; OpenAI only)."""
    id: str | None = None
    """None: a generated id."""


@dataclass(frozen=True)
class Reply:
    """One scripted response: text and/or tool calls, or an HTTP error."""

    text: str | None = None
    tool_calls: tuple[ToolCall, ...] = ()
    status: int = 200
    """Anything but 200 answers with that status and `error` as the message."""
    error: str = "scripted error"
    finish_reason: str | None = None
    """In the protocol's own words (OpenAI 'stop', Anthropic 'end_turn'); None: derived."""
    logprobs: tuple[float, ...] | None = None
    """Per-token log-probs to report; None: DEFAULT_LOGPROB for each made-up token."""
    delay: float = 0.0  # seconds to wait before answering (timeouts, concurrency)


Script = Union[Sequence[Union[Reply, str]], Callable[[dict], Union[Reply, str]]]


def tokens(text: str) -> list[str]:
    """The made-up tokenization: whitespace-led words, which join back to `text`."""
    return re.findall(r"\s*\S+|\s+$", text)


class LoopbackServer(ThreadedServer):
    """A threaded HTTP server on 127.0.0.1 speaking both protocols; see the module docstring."""

    def __init__(self, script: Script, *, fail_first: int = 0, fail_status: int = 500,
                 repeat_last: bool = False, models: tuple[str, ...] = ("loopback",)):
        self.script = script
        self.models = models
        """What GET /v1/models lists."""
        self.fail_first = fail_first
        self.fail_status = fail_status
        self.repeat_last = repeat_last
        self.requests: list[dict] = []
        """JSON body of every model request received, in order, failed ones included."""
        self.headers: list[dict[str, str]] = []
        """Headers of those requests (lower-case names)."""
        self.errors: list[str] = []
        """Problems on the server side: script exhausted, a callable raised."""
        self._lock = threading.Lock()
        self._next_reply = 0

    def answer(self, path: str, body: dict, headers: dict[str, str]) -> tuple[int, dict]:
        """Record the request and return (status, JSON body) in the protocol of `path`."""
        with self._lock:
            self.requests.append(body)
            self.headers.append(headers)
            if len(self.requests) <= self.fail_first:
                return _error(path, self.fail_status, f"loopback: failing request {len(self.requests)}")
            reply = self._reply(body)
        time.sleep(reply.delay)
        if reply.status != 200:
            return _error(path, reply.status, reply.error)
        render = _openai_completion if path.endswith("/chat/completions") else _anthropic_message
        return 200, render(body, reply, len(self.requests))

    def _reply(self, body: dict) -> Reply:
        if callable(self.script):
            try:
                reply = self.script(body)
            except Exception as error:  # reported, so the test sees it rather than a retry storm
                self.errors.append(f"script raised {error!r}")
                return Reply(status=500, error=f"loopback script raised {error!r}")
        elif self._next_reply < len(self.script):
            reply = self.script[self._next_reply]
            self._next_reply += 1
        elif self.repeat_last and self.script:
            reply = self.script[-1]
        else:
            self.errors.append(f"script exhausted after {len(self.script)} replies")
            return Reply(status=500, error="loopback script exhausted")
        return Reply(text=reply) if isinstance(reply, str) else reply


class OpenAIServer(LoopbackServer):
    """Yields the base_url the OpenAI SDK expects: http://127.0.0.1:<port>/v1."""

    @property
    def base_url(self) -> str:
        return self.url + "/v1"


class AnthropicServer(LoopbackServer):
    """Yields the base_url the Anthropic SDK expects: http://127.0.0.1:<port>."""


class _Handler(BaseHTTPRequestHandler):
    owner: LoopbackServer
    protocol_version = "HTTP/1.1"  # keep-alive, as the SDKs' pools expect
    # TCP_NODELAY, as a real server (uvicorn: vLLM) sets it: the body, written after the headers, otherwise waits
    # for the client's delayed ACK of them, ~40 ms a reply
    disable_nagle_algorithm = True

    def do_POST(self) -> None:
        length = int(self.headers.get("content-length") or 0)
        body = json.loads(self.rfile.read(length) or b"{}")
        if self.path not in ("/v1/chat/completions", "/v1/messages"):
            return self._send(404, {"error": {"message": f"no route {self.path}"}})
        headers = {name.lower(): value for name, value in self.headers.items()}
        self._send(*self.owner.answer(self.path, body, headers))

    def do_GET(self) -> None:
        if self.path == "/v1/models":
            return self._send(200, {"object": "list",
                                    "data": [{"id": name, "object": "model"} for name in self.owner.models]})
        self._send(404, {"error": {"message": f"no route {self.path}"}})

    def _send(self, status: int, payload: dict) -> None:
        data = json.dumps(payload).encode()
        self.send_response(status)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args: object) -> None:
        pass


ANTHROPIC_ERROR_TYPES = {400: "invalid_request_error", 401: "authentication_error",
                         429: "rate_limit_error", 529: "overloaded_error"}


def _error(path: str, status: int, message: str) -> tuple[int, dict]:
    if path.endswith("/messages"):
        kind = ANTHROPIC_ERROR_TYPES.get(status, "api_error")
        return status, {"type": "error", "error": {"type": kind, "message": message}}
    return status, {"error": {"message": message, "type": "loopback_error", "code": status}}


def _arguments_json(call: ToolCall) -> str:
    return call.arguments if isinstance(call.arguments, str) else json.dumps(call.arguments)


def _completion_tokens(reply: Reply) -> list[str]:
    serialized = [f"{c.name} {_arguments_json(c)}" for c in reply.tool_calls]
    return tokens(" ".join([reply.text or "", *serialized]).strip())


def _prompt_tokens(body: dict) -> int:
    return len(tokens(json.dumps([body.get("system", ""), body.get("messages", [])])))


def _openai_completion(body: dict, reply: Reply, number: int) -> dict:
    message: dict = {"role": "assistant", "content": reply.text if reply.text is not None
                     else (None if reply.tool_calls else "")}
    if reply.tool_calls:
        message["tool_calls"] = [
            {"id": call.id or f"call_{number}_{i}", "type": "function",
             "function": {"name": call.name, "arguments": _arguments_json(call)}}
            for i, call in enumerate(reply.tool_calls)
        ]
    generated = _completion_tokens(reply)
    choice = {"index": 0, "message": message, "logprobs": None,
              "finish_reason": reply.finish_reason or ("tool_calls" if reply.tool_calls else "stop")}
    if body.get("logprobs"):
        values = reply.logprobs or itertools.repeat(DEFAULT_LOGPROB)
        choice["logprobs"] = {"content": [
            {"token": token, "logprob": value, "bytes": list(token.encode()), "top_logprobs": []}
            for token, value in zip(generated, values)
        ]}
    prompt = _prompt_tokens(body)
    return {"id": f"chatcmpl-loopback-{number}", "object": "chat.completion",
            "created": int(time.time()), "model": body.get("model", "loopback"), "choices": [choice],
            "usage": {"prompt_tokens": prompt, "completion_tokens": len(generated),
                      "total_tokens": prompt + len(generated)}}


def _anthropic_message(body: dict, reply: Reply, number: int) -> dict:
    content: list[dict] = [{"type": "text", "text": reply.text}] if reply.text else []
    for i, call in enumerate(reply.tool_calls):
        arguments = json.loads(call.arguments) if isinstance(call.arguments, str) else call.arguments
        content.append({"type": "tool_use", "id": call.id or f"toolu_{number}_{i}",
                        "name": call.name, "input": arguments})
    return {"id": f"msg_loopback_{number}", "type": "message", "role": "assistant",
            "model": body.get("model", "loopback"), "content": content,
            "stop_reason": reply.finish_reason or ("tool_use" if reply.tool_calls else "end_turn"),
            "stop_sequence": None,
            "usage": {"input_tokens": _prompt_tokens(body), "output_tokens": len(_completion_tokens(reply))}}


LoopbackServer.handler = _Handler
