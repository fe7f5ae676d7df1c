"""LocalHFPolicy: a transformers model directory run in this process, with token log-probs."""

from __future__ import annotations

import json
import re
import threading
import time
from dataclasses import asdict, dataclass
from typing import Literal

from pipeline.agent.identity import local_identity
from pipeline.agent.policy import AssistantTurn, Usage

TOOL_CALL = re.compile(r"<tool_call>\s*(\{.*?\})\s*</tool_call>", re.DOTALL)


@dataclass(frozen=True)
class LocalHFPolicyConfig:
    """Which local model to load and how to sample from it."""

    model_path: str
    """A directory holding a causal LM and its tokenizer (save_pretrained layout)."""
    temperature: float = 1.0
    """0: greedy decoding."""
    top_p: float = 1.0
    max_new_tokens: int = 512
    device: str = "auto"
    """'cpu', 'cuda', 'cuda:1', ...; 'auto': 'cuda' when torch sees a GPU, else 'cpu'."""
    dtype: Literal["float32", "bfloat16", "float16"] = "float32"
    chat_template: str | None = None
    """Jinja template replacing the tokenizer's own (None: keep it)."""


class LocalHFPolicy:
    """A chat model in process. Log-probs are the raw model's (before temperature and top-p).

    `native_tools` is True when the chat template renders `tools`; the schemas then go in
    through the template and Hermes-style `<tool_call>{"name", "arguments"}</tool_call>`
    blocks in the output come back as tool_calls. Otherwise the reply is content text only
    and the agent parses its own text tool format.
    """

    def __init__(self, config: LocalHFPolicyConfig):
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer

        self.config = config
        self.name = f"hf:{config.model_path}"
        self.tokenizer = AutoTokenizer.from_pretrained(config.model_path)
        if config.chat_template is not None:
            self.tokenizer.chat_template = config.chat_template
        if not self.tokenizer.chat_template:
            raise ValueError(f"{config.model_path} has no chat template; set LocalHFPolicyConfig.chat_template")
        self.native_tools = "tools" in self.tokenizer.chat_template
        self.model = AutoModelForCausalLM.from_pretrained(
            config.model_path, dtype=getattr(torch, config.dtype)).to(_device(config.device)).eval()
        self.identity = local_identity(config.model_path, config.model_path, self.tokenizer.chat_template,
                                       **sampling(config))
        self._lock = threading.Lock()  # one generate at a time: seeded sampling stays reproducible

    def settings(self) -> dict:
        """The config, plus whether tools go through the template."""
        return {**asdict(self.config), "native_tools": self.native_tools}

    def act(self, messages: list[dict], tools: list[dict], *, seed: int | None = None) -> AssistantTurn:
        """Sample one reply; `token_ids` and `logprobs` have one entry per generated token (end-of-turn included),
        `prompt_ids` are the ids the model was given."""
        start = time.monotonic()
        prompt = self.tokenizer.apply_chat_template(
            template_messages(messages), tools=(tools or None) if self.native_tools else None,
            add_generation_prompt=True, tokenize=False)
        inputs = self.tokenizer(prompt, return_tensors="pt", add_special_tokens=False).to(self.model.device)
        with self._lock:
            generated, logprobs = self._generate(inputs, seed)
        reasoning, text = split_reasoning(self.tokenizer.decode(generated, skip_special_tokens=True))
        message = parse_tool_calls(text) if self.native_tools else {"role": "assistant", "content": text}
        if reasoning is not None:
            message["reasoning_content"] = reasoning
        stopped = bool(generated) and generated[-1] in self._stop_ids()
        return AssistantTurn(
            message=message,
            usage=Usage(inputs["input_ids"].shape[1], len(generated)),
            logprobs=logprobs,
            latency=time.monotonic() - start,
            finish_reason="stop" if stopped else "length",
            prompt_ids=tuple(inputs["input_ids"][0].tolist()),
            token_ids=tuple(generated),
            identity=self.identity,
        )

    def _generate(self, inputs, seed: int | None) -> tuple[list[int], tuple[float, ...]]:
        import torch

        sampling = self.config.temperature > 0
        options = dict(max_new_tokens=self.config.max_new_tokens, do_sample=sampling,
                       output_logits=True, return_dict_in_generate=True,
                       pad_token_id=self.tokenizer.pad_token_id, eos_token_id=self._stop_ids())
        if sampling:
            options.update(temperature=self.config.temperature, top_p=self.config.top_p, top_k=0)
        cuda = [self.model.device] if self.model.device.type == "cuda" else []
        with torch.random.fork_rng(devices=cuda), torch.inference_mode():  # the global RNG is left alone
            if seed is not None:
                torch.manual_seed(seed)
            out = self.model.generate(**inputs, **options)
        tokens = out.sequences[0, inputs["input_ids"].shape[1]:]  # (new,)
        logits = torch.stack(out.logits, dim=1)[0, : len(tokens)].float()  # (new, vocab), raw
        logprobs = torch.log_softmax(logits, dim=-1).gather(-1, tokens[:, None])[:, 0]
        return tokens.tolist(), tuple(logprobs.tolist())

    def _stop_ids(self) -> list[int]:
        ids = self.model.generation_config.eos_token_id
        ids = [] if ids is None else [ids] if isinstance(ids, int) else list(ids)
        return ids or [self.tokenizer.eos_token_id]


def sampling(config: LocalHFPolicyConfig) -> dict:
    """The settings `_generate` samples with, as PolicyIdentity stores them: top-k always off (0)."""
    return dict(temperature=max(float(config.temperature), 0.0), top_p=float(config.top_p), top_k=0)


def split_reasoning(text: str) -> tuple[str | None, str]:
    """(reasoning, answer) of a reply holding `<think>...</think>` (Qwen3, DeepSeek-R1), split as their
    templates split it; (None, text) without a closing tag."""
    if "</think>" not in text:
        return None, text
    thought, answer = text.split("</think>", 1)
    return thought.split("<think>")[-1].strip("\n"), answer.lstrip("\n")


def template_messages(messages: list[dict]) -> list[dict]:
    """Tool-call arguments as objects, the form chat templates (Qwen, Llama, Hermes) expect."""
    converted = []
    for message in messages:
        if message.get("tool_calls"):
            message = {**message, "tool_calls": [_with_object_arguments(c) for c in message["tool_calls"]]}
        converted.append(message)
    return converted


def _with_object_arguments(call: dict) -> dict:
    arguments = call["function"].get("arguments")
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments)
        except json.JSONDecodeError:
            pass  # left as the model wrote it
    return {**call, "function": {**call["function"], "arguments": arguments}}


def parse_tool_calls(text: str) -> dict:
    """An assistant message from text with Hermes-style <tool_call> blocks; malformed ones stay text."""
    calls, kept = [], text
    for match in TOOL_CALL.finditer(text):
        try:
            call = json.loads(match.group(1))
            name, arguments = call["name"], call.get("arguments", {})
        except (json.JSONDecodeError, KeyError, TypeError):
            continue
        calls.append({"id": f"call_{len(calls)}", "type": "function", "function": {
            "name": name, "arguments": arguments if isinstance(arguments, str) else json.dumps(arguments)}})
        kept = kept.replace(match.group(0), "", 1)
    message: dict = {"role": "assistant", "content": kept.strip() or (None if calls else "")}
    if calls:
        message["tool_calls"] = calls
    return message


def _device(name: str) -> str:
    import torch

    return ("cuda" if torch.cuda.is_available() else "cpu") if name == "auto" else name
