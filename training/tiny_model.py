"""An offline tiny chat model: a BPE tokenizer trained on this repo's text and a random Llama.

Nothing can be downloaded here, yet the policy, the dataset builders and the trainers want
a real tokenizer with a chat template and a real causal LM. This builds one in seconds on
a CPU; it produces noise, which is all the tests need.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
SKIPPED_DIRS = {"__pycache__", "node_modules", "build", "dist"}
MODEL_FILES = ("config.json", "tokenizer.json", "tokenizer_config.json", "model.safetensors")
SEED = 0
VOCAB_SIZE = 2048  # upper bound; a small corpus yields fewer merges
END_OF_TEXT, IM_START, IM_END = "<|endoftext|>", "<|im_start|>", "<|im_end|>"
CONTEXT = 16384  # tokens: an agent trajectory on a real repository runs to several thousand (rotary, no weights)
# One layer: the closed loop (tests/test_closed_loop.py) memorizes a 4.7k-token row in about as many steps as with two,
# each step costing about half (attention over the whole row is most of a step)
LAYERS = 1

# ChatML with Hermes-style tools, as Qwen2.5 renders them: the tool schemas (`tools`) close the system
# turn inside <tools></tools>, tool calls are <tool_call> text after the content, tool results are a
# `tool` turn. Taking `tools` makes a policy on this model native (LocalHFPolicy parses its
# <tool_call> blocks back into tool calls), so it is prompted exactly as the rows it trains on were
# rendered: the system prompt of a native-tools rollout, observations as `tool` turns. An assistant
# turn's body and end token sit in a `{% generation %}` span: what the trainers score
# (`return_assistant_tokens_mask`).
_BODY = (
    "{% if message['content'] is string %}{{ message['content'] }}"
    "{% elif message['content'] %}{% for part in message['content'] %}"
    "{% if part['type'] == 'text' %}{{ part['text'] }}{% endif %}{% endfor %}{% endif %}"
    "{% for call in message.get('tool_calls') or [] %}"
    "{% set function = call['function'] if call['function'] is defined else call %}"
    "{% set arguments = function['arguments'] %}"
    "{{ '\n<tool_call>{\"name\": \"' + function['name'] + '\", \"arguments\": ' }}"
    "{{ arguments if arguments is string else arguments | tojson }}{{ '}</tool_call>' }}"
    "{% endfor %}"
)
_TOOLS = (
    "{% set tool_text %}{% if tools %}{{ '# Tools\\n\\n<tools>' }}{% for tool in tools %}{{ '\\n' + tool | tojson }}"
    "{% endfor %}{{ '\\n</tools>' }}{% endif %}{% endset %}"
)
CHAT_TEMPLATE = (
    _TOOLS
    + "{% if tool_text and messages[0]['role'] != 'system' %}"
    "{{ '<|im_start|>system\n' + tool_text + '<|im_end|>\n' }}{% endif %}"
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' }}"
    "{% if message['role'] == 'assistant' %}"
    "{% generation %}" + _BODY + "{{ '<|im_end|>' }}{% endgeneration %}{{ '\n' }}"
    "{% else %}" + _BODY
    + "{% if loop.first and message['role'] == 'system' and tool_text %}{{ '\n\n' + tool_text }}{% endif %}"
    "{{ '<|im_end|>\n' }}{% endif %}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)


def build_tiny_model(out_dir: Path, corpus_files: list[Path] | None = None) -> Path:
    """Build the tokenizer and random model into `out_dir` (reused when already there); return it."""
    out_dir = Path(out_dir)
    if all((out_dir / name).exists() for name in MODEL_FILES):
        if is_current(out_dir):
            return out_dir
        shutil.rmtree(out_dir)  # built by an older version of this module: another template or context
    if out_dir.exists() and any(out_dir.iterdir()):
        raise FileExistsError(f"{out_dir} holds files but no complete tiny model; "
                              "remove it or pass an empty or new directory")
    files = sorted(corpus_files) if corpus_files is not None else repo_text_files()
    if not files:
        raise ValueError("build_tiny_model: no corpus files to train the tokenizer on")
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}-", dir=out_dir.parent))
    try:
        tokenizer = train_tokenizer(files)
        tokenizer.save_pretrained(staging)
        random_model(tokenizer).save_pretrained(staging)
        if out_dir.exists():
            out_dir.rmdir()  # empty, checked above
        os.replace(staging, out_dir)  # a half-built model is never seen under out_dir
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return out_dir


def is_current(model_dir: Path) -> bool:
    """Whether a built tiny model has this module's chat template, context length and depth."""
    import json

    template = model_dir / "chat_template.jinja"
    config = json.loads((model_dir / "config.json").read_text())
    return (template.exists() and template.read_text() == CHAT_TEMPLATE
            and config.get("max_position_embeddings") == CONTEXT and config.get("num_hidden_layers") == LAYERS)


def repo_text_files(root: Path = REPO_ROOT) -> list[Path]:
    """The *.py and *.md files of the repository, hidden and build directories skipped."""
    found = []
    for directory, subdirs, names in os.walk(root):
        subdirs[:] = [d for d in subdirs if not d.startswith(".") and d not in SKIPPED_DIRS
                      and not d.endswith(".egg-info")]
        found += [Path(directory) / n for n in names if n.endswith((".py", ".md"))]
    return sorted(found)


def train_tokenizer(files: list[Path]):
    """A byte-level BPE tokenizer with ChatML special tokens and CHAT_TEMPLATE."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE,
        min_frequency=2,
        special_tokens=[END_OF_TEXT, IM_START, IM_END],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),  # any byte can be encoded
        show_progress=False,
    )
    bpe.train([str(f) for f in files], trainer)
    return PreTrainedTokenizerFast(
        tokenizer_object=bpe,
        eos_token=IM_END,
        pad_token=END_OF_TEXT,
        additional_special_tokens=[IM_START],
        chat_template=CHAT_TEMPLATE,
        model_max_length=CONTEXT,
    )


def random_model(tokenizer):
    """A LAYERS-deep, 64-wide Llama over the tokenizer's vocabulary, initialised from SEED."""
    import torch
    from transformers import GenerationConfig, LlamaConfig, LlamaForCausalLM

    eos, pad = tokenizer.convert_tokens_to_ids([IM_END, END_OF_TEXT])
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=LAYERS,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=CONTEXT,
        tie_word_embeddings=True,
        bos_token_id=None,
        eos_token_id=eos,
        pad_token_id=pad,
    )
    torch.manual_seed(SEED)
    model = LlamaForCausalLM(config)
    model.generation_config = GenerationConfig(eos_token_id=eos, pad_token_id=pad, do_sample=True)
    return model
