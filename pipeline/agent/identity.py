"""A model's identity from its files: the weights' revision and the chat template's hash; and whether the
sampling settings stored with it let its log-probs stand for what it sampled.

Rollouts store it with every turn's token ids; training compares it with the starting model's, and asks
`sampling_refusal`, before it uses stored log-probs as the behaviour policy's (`training.actguide`).
"""

from __future__ import annotations

import hashlib
import re
from functools import lru_cache
from pathlib import Path

from pipeline.agent.policy import PolicyIdentity

WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".gguf")
HUB_SNAPSHOT = re.compile(r"/snapshots/([0-9a-f]{40})(/|$)")  # huggingface_hub's cache layout
CHUNK = 1 << 20  # bytes read at a time


def template_hash(template: str | None) -> str:
    """sha256 of a chat template's text; '' without one."""
    return hashlib.sha256(template.encode()).hexdigest() if template else ""


def weights_revision(model_path: str | Path) -> str:
    """The Hub commit of a cached snapshot, else 'sha256:<hex>' over the weight files' names and bytes;
    '' when the path holds no weight files (a Hub name not on disk)."""
    path = Path(model_path).resolve()
    commit = HUB_SNAPSHOT.search(path.as_posix() + "/")
    if commit:
        return commit.group(1)
    files = sorted(p for p in path.glob("*") if p.is_file() and p.name.endswith(WEIGHT_SUFFIXES)) \
        if path.is_dir() else []
    if not files:
        return ""
    return _files_hash(tuple((str(p), p.stat().st_size, p.stat().st_mtime_ns) for p in files))


@lru_cache(maxsize=16)
def _files_hash(files: tuple[tuple[str, int, int], ...]) -> str:
    """Keyed on (path, size, mtime): a model read twice in one process is hashed once."""
    digest = hashlib.sha256()
    for name, _, _ in files:
        digest.update(Path(name).name.encode() + b"\0")
        with open(name, "rb") as f:
            while block := f.read(CHUNK):
                digest.update(block)
    return "sha256:" + digest.hexdigest()


def local_identity(model: str, model_path: str | Path, chat_template: str | None, **sampling) -> PolicyIdentity:
    """The identity of the model whose files are at `model_path`, rendering with `chat_template`, sampled with
    `sampling` (PolicyIdentity's temperature, top_p, top_k)."""
    return PolicyIdentity(model, weights_revision(model_path), template_hash(chat_template), **sampling)


def mismatch(stored: PolicyIdentity, starting: PolicyIdentity) -> str:
    """What differs between a stored turn's identity and the starting model's; '' when they match."""
    problems = []
    if not stored.revision or stored.revision != starting.revision:
        problems.append(f"weights {stored.revision or 'unknown'} (policy {stored.model or 'unknown'}) "
                        f"vs {starting.revision or 'unknown'} ({starting.model})")
    if not stored.chat_template_hash or stored.chat_template_hash != starting.chat_template_hash:
        problems.append(f"chat template {stored.chat_template_hash[:12] or 'unknown'} "
                        f"vs {starting.chat_template_hash[:12] or 'unknown'}")
    return "; ".join(problems)


SAMPLING_FIX = ("set training.actguide.behaviour_logprobs: recompute, or sample at temperature 1 and top-p 1 "
                "with top-k off")


def sampling_refusal(member: dict) -> str:
    """'' when an ActGuide member's stored log-probs can be the behaviour policy's in an importance ratio, else why
    not and the fix. A server (vLLM) and the local policy return the raw model's log-probs, at temperature 1 before
    top-p and top-k; they are those of the distribution sampled only at temperature 1, top-p 1 and top-k off (0).
    Unknown settings (-1: stored before they were recorded, or left to the server's defaults) are refused."""
    temperature, top_p, top_k = (_number(member, name) for name in ("temperature", "top_p", "top_k"))
    if temperature == 0:
        why = ("it was decoded greedily (temperature 0): its tokens had probability 1 under the policy that chose "
               "them, so a ratio against the raw log-probs is undefined")
    elif min(temperature, top_p, top_k) < 0:
        why = "its sampling settings are not all known, so its log-probs cannot be shown to be those it sampled from"
    elif (temperature, top_p, top_k) == (1, 1, 0):
        return ""
    else:
        why = ("its log-probs are the raw distribution's at temperature 1 before top-p and top-k, not the one it "
               "sampled from, so a ratio against them is wrong")
    settings = (f"temperature {_shown(temperature)}, top-p {_shown(top_p)}, "
                f"top-k {'off' if top_k == 0 else _shown(top_k)}")
    return f"trajectory {member['rollout_id']} was sampled at {settings}: {why}; {SAMPLING_FIX}"


def _number(member: dict, name: str) -> float:
    """A stored sampling setting; -1 (unknown) when the member has none."""
    value = member.get(name)
    return -1 if value is None else value


def _shown(value: float) -> str:
    return "unknown" if value < 0 else f"{value:g}"
