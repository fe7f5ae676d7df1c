"""The training stages on the tiny offline model: DPO (full and LoRA), the ActGuide objective's parts, and a
Pipes launch that reports back to its asset."""

from __future__ import annotations

import json

import dagster as dg
import polars as pl
import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from assets.resources import Credentials, HandholdSettings
from assets.training import actguide_model
from pipeline.datasets import DatasetConfig, build_rows
from pipeline.datasets.card import CardInfo
from pipeline.datasets.export import export_dataset
from pipeline.core.records import Action
from tests.test_datasets_build import TASK_T1, traj
from training.actguide import ActGuideTrainer, train_actguide
from training.actguide_examples import group_advantages, prepare_examples, training_group
from training.common import TrainingDataError, load_model, read_run, read_split
from training.config import ActGuideTrainingConfig, DPOTrainingConfig, LoraSettings
from training.dpo import train_dpo
from training.logprobs import response_logps
from training.masking import to_template_row
from training.tiny_model import IM_END, LAYERS

ACTIONS = (Action("bash", '{"command": "grep -n add pkg"}'), Action("submit", "{}"))


def actguide_attempts() -> list:
    """t3: an unguided success among failures (its unguided group trains); t4: every unguided attempt
    failed, so its action-guided attempts (one success, one failure) join the group."""
    return ([traj("t3u0", iid="t3", sample=0, steps=2), traj("t3u1", iid="t3", reward=1.0, sample=1, steps=1),
             traj("t3a0", iid="t3", kind="action", reward=1.0, guidance_actions=ACTIONS, guidance_k=1, group_id="g1")]
            + [traj(f"t4u{i}", iid="t4", sample=i, steps=2) for i in range(2)]
            + [traj(f"t4a{i}", iid="t4", kind="action", reward=float(i), sample=i, steps=1 + i,
                    guidance_actions=ACTIONS, guidance_k=1, group_id="g2") for i in range(2)])


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    """An exported dataset folder with dpo and actguide rows, everything in the train split."""
    config = DatasetConfig(pairs_per_task=50, test_fraction=0.0)
    dpo, actguide = build_rows(TASK_T1, config).dpo, build_rows(actguide_attempts(), config).actguide
    out = tmp_path_factory.mktemp("export") / "hf"
    export_dataset(out, {"dpo": dpo, "actguide": actguide}, CardInfo("test", run_id="b1"))
    return out


@pytest.fixture(scope="module")
def tiny(tiny_model):
    return str(tiny_model)


def dpo_config(**changes) -> DPOTrainingConfig:
    """Every row in one batch, the same batch each step: loss must fall, margins must rise."""
    return DPOTrainingConfig(**{"learning_rate": 2e-3, "lr_scheduler": "constant", "warmup": 0,
                                "per_device_batch_size": 8, "gradient_accumulation_steps": 1, "max_steps": 4,
                                "max_length": 4096, **changes})


def test_dpo_trains_the_tiny_model_and_saves_what_it_used(folder, tiny, tmp_path):
    result = train_dpo(dpo_config(), tiny, folder, tmp_path / "run")
    summary, metrics = read_run(result.run_dir)
    assert summary["rows"] == summary["rows_trained"] == 6 and summary["steps"] == 4 == len(metrics)
    assert metrics[0]["loss"] == pytest.approx(0.6931, abs=1e-3)  # policy == reference at step 1
    assert metrics[-1]["loss"] < metrics[0]["loss"] and metrics[-1]["rewards/margins"] > metrics[0]["rewards/margins"]
    assert {"rewards/accuracies", "learning_rate"} <= set(metrics[0])
    # Every step trains the same 6 pairs: the timed steps, 2 to 4, saw three quarters of the tokens
    assert summary["tokens_per_second_excludes"] == "first step"
    assert summary["timed_tokens"] * 4 == summary["tokens"] * 3
    assert summary["tokens_per_second"] == pytest.approx(summary["timed_tokens"] / summary["timed_seconds"], rel=1e-3)
    assert summary["truncation"]["dropped"] == summary["rows_cut_before_last_edit"] == 0
    assert not list(result.run_dir.rglob("events.out.tfevents*"))  # training.report_to is empty: no tracker
    trained = AutoModelForCausalLM.from_pretrained(result.checkpoint)
    start = AutoModelForCausalLM.from_pretrained(tiny)
    changed = sum(not torch.equal(a, b) for a, b in zip(trained.state_dict().values(), start.state_dict().values()))
    assert changed > 0
    assert AutoTokenizer.from_pretrained(result.checkpoint).chat_template
    used = json.loads((result.run_dir / "config.json").read_text())
    assert used["settings"]["beta"] == 0.1 and used["starting_model"] == tiny
    assert (result.run_dir / "loss.png").read_bytes().startswith(b"\x89PNG")


def test_dpo_refuses_before_the_first_step_when_no_pair_fits_naming_the_longest(folder, tiny, tmp_path):
    tokenizer = AutoTokenizer.from_pretrained(tiny)
    stored = read_split(folder, "dpo")

    def length(row, side) -> int:
        return len(tokenizer.apply_chat_template(row["prompt"] + row[side], tools=row["tools"], tokenize=True,
                                                 return_dict=True)["input_ids"])

    lengths = [max(length(row, "chosen"), length(row, "rejected")) for row in map(to_template_row, stored)]
    longest = lengths.index(max(lengths))
    with pytest.raises(TrainingDataError) as refused:
        train_dpo(dpo_config(max_length=20), tiny, folder, tmp_path / "run")
    message = str(refused.value)
    assert "every one of 6 DPO rows was dropped" in message
    assert (f"row {longest} (instance_id t1, chosen_rollout_id {stored['chosen_rollout_id'][longest]}, "
            f"rejected_rollout_id {stored['rejected_rollout_id'][longest]}), is {max(lengths)} tokens") in message
    assert (f"raise training.dpo.max_length above 20 ({max(lengths)} keeps that row whole), or lower "
            "training.dpo.min_assistant_turns (1)") in message
    assert not (tmp_path / "run" / "metrics.jsonl").exists()  # no step ran


def test_a_right_padded_batch_runs_without_its_mask_and_scores_its_tokens_the_same(tiny):
    hooked, plain = load_model(tiny, "fp32"), AutoModelForCausalLM.from_pretrained(tiny)
    lengths = [40, 25, 3]
    ids = torch.randint(5, 200, (len(lengths), max(lengths)), generator=torch.Generator().manual_seed(0))
    right = torch.tensor([[1] * n + [0] * (max(lengths) - n) for n in lengths])
    seen = []
    hooked.base_model.register_forward_pre_hook(lambda m, a, kw: seen.append(kw.get("attention_mask")),
                                                with_kwargs=True)
    with torch.no_grad():
        ours = hooked(input_ids=ids, attention_mask=right).logits
        theirs = plain(input_ids=ids, attention_mask=right).logits
        assert seen[-1] is None
        for row, n in enumerate(lengths):
            torch.testing.assert_close(ours[row, :n], theirs[row, :n])
        left = right.flip(1)  # left padding changes what a real token attends to: the mask stays
        torch.testing.assert_close(hooked(input_ids=ids, attention_mask=left).logits,
                                   plain(input_ids=ids, attention_mask=left).logits)
        assert seen[-1] is not None and torch.equal(seen[-1], left)


def test_the_fused_head_scores_only_the_labelled_positions_on_a_cpu_and_as_scoring_all_does(tiny, monkeypatch):
    import trl.trainer.utils as fused
    from trl.kernels.chunked_logprob import _use_triton as scoring_all  # TRL's own switch, left as it is

    def run(model):
        """The fused head's per-token outputs, loss and gradients, and the rows its kernel was given."""
        rows, kernel = [], fused._ChunkedLogProbFunction.apply
        monkeypatch.setattr(fused._ChunkedLogProbFunction, "apply", lambda h, *a: rows.append(len(h)) or kernel(h, *a))
        model.zero_grad()
        out = model(input_ids=ids, labels=labels, fused_lm_head=True)
        out.loss.backward()
        monkeypatch.undo()
        return out, {n: p.grad.clone() for n, p in model.named_parameters()}, rows

    ids = torch.randint(5, 200, (2, 48), generator=torch.Generator().manual_seed(1))
    labels = ids.clone()
    labels[:, :30] = -100  # a prompt: 18 of each row's 47 next-token labels count
    model = load_model(tiny, "fp32")  # switches TRL's head to the labelled positions on a CPU
    fused.add_fused_lm_head(model, outputs=("log_probs", "entropy", "is_top1"))
    ours, our_grads, our_rows = run(model)
    monkeypatch.setattr(fused, "_use_triton", scoring_all)
    theirs, their_grads, their_rows = run(model)
    assert our_rows == [2 * 18] and their_rows == [2 * 47]
    for field in ("loss", "log_probs", "entropy", "is_top1", "label_mask"):
        torch.testing.assert_close(getattr(ours, field), getattr(theirs, field))
    for name, grad in their_grads.items():
        torch.testing.assert_close(our_grads[name], grad)


def test_no_dpo_forward_materializes_an_attention_mask(folder, tiny, tmp_path, monkeypatch):
    """Policy and reference alike (TRL loads the reference itself): every attention call of a DPO step over
    rows of different lengths takes the causal kernel."""
    masks, attention = [], torch.nn.functional.scaled_dot_product_attention

    def spy(*args, **kwargs):
        masks.append(kwargs.get("attn_mask"))
        return attention(*args, **kwargs)

    monkeypatch.setattr(torch.nn.functional, "scaled_dot_product_attention", spy)
    train_dpo(dpo_config(max_steps=1), tiny, folder, tmp_path / "run")
    assert len(masks) >= 2 * LAYERS and all(mask is None for mask in masks)  # each layer of policy and reference


def test_dpo_with_lora_saves_an_adapter_that_loads(folder, tiny, tmp_path):
    from peft import PeftModel

    result = train_dpo(dpo_config(max_steps=2, lora=LoraSettings(enabled=True, r=4, alpha=8)), tiny, folder,
                       tmp_path / "run")
    files = {p.name for p in result.checkpoint.iterdir()}
    assert {"adapter_config.json", "adapter_model.safetensors"} <= files and "model.safetensors" not in files
    adapted = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(tiny), result.checkpoint)
    ids = torch.tensor([[5, 6, 7, 8]])
    base = AutoModelForCausalLM.from_pretrained(tiny)
    assert not torch.allclose(adapted(ids).logits, base(ids).logits)  # the adapter learned something


def test_group_advantages_and_which_attempts_form_a_group():
    for rewards in ([0.0, 1.0, 1.0, 0.0, 0.0], [1.0, 0.0], [0.2, 0.5, 0.9]):
        assert sum(group_advantages(rewards)) == pytest.approx(0.0, abs=1e-9)
    assert group_advantages([1.0, 1.0, 1.0]) == [0.0, 0.0, 0.0] == group_advantages([0.0, 0.0, 0.0])
    assert group_advantages([0.0, 1.0]) == [-0.5 / (0.5 ** 0.5 + 1e-6), 0.5 / (0.5 ** 0.5 + 1e-6)]  # std ddof 1
    members = [{"sampled_under": "unguided", "resolved": False, "id": "u"},
               {"sampled_under": "guided", "resolved": True, "id": "g"}]
    assert [m["id"] for m in training_group(members)] == ["g"]  # ActGuide-RL's code: G+ replaces G
    assert [m["id"] for m in training_group(members, "merge")] == ["u", "g"]  # its Algorithm 1: merged into G
    solved = [{**members[0], "resolved": True}, members[1]]
    assert [m["id"] for m in training_group(solved)] == ["u"]  # no guidance needed: the unguided group


@pytest.fixture(scope="module")
def trainer(folder, tiny):
    tokenizer = AutoTokenizer.from_pretrained(tiny)
    torch.manual_seed(0)
    config = ActGuideTrainingConfig(learning_rate=1e-3, batch_size=3, max_steps=4, kl_weight=0.01,
                                    guided_group="merge")  # t4's unguided failures kept beside its guided attempts
    examples, counts = prepare_examples(read_split(folder, "actguide"), tokenizer, config)
    return ActGuideTrainer(AutoModelForCausalLM.from_pretrained(tiny), tokenizer, examples, config), tokenizer, counts


def test_actguide_examples_are_the_groups_with_signal(trainer):
    t, _, counts = trainer
    assert counts == {"groups": 2, "guided_groups": 1, "equal_reward_groups": 0, "zero_advantage_members": 0,
                      "rerender_mismatch": 0, "too_long": 0, "cut_before_last_edit": 0, "stored_tokens": 0,
                      "rendered_tokens": 6}  # the heuristic's trajectories have no ids: all re-rendered
    by_id = {e.rollout_id: e for e in t.examples}
    assert sorted(by_id) == ["t3u0", "t3u1", "t4a0", "t4a1", "t4u0", "t4u1"]  # t3's guided attempt is not used
    assert sum(e.advantage for e in t.examples if e.group_id == by_id["t4u0"].group_id) == pytest.approx(0.0)
    for e in t.examples:  # the two prompts differ only by the hint; the response tokens are shared
        (segment,) = e.segments  # the tiny template renders earlier turns as they were sampled: one forward
        longer = len(segment.sampled_prompt_ids) > len(segment.prompt_ids)
        assert longer == (e.sampled_under == "guided") and len(segment.mask) == len(segment.response_ids)


def test_the_mask_covers_exactly_the_assistant_turns(trainer):
    t, tokenizer, _ = trainer
    e = next(e for e in t.examples if e.rollout_id == "t4u1")  # two tool calls, two observations, a last word
    (segment,) = e.segments
    spans, current = [], []
    for token, keep in zip(segment.response_ids, segment.mask):
        if keep:
            current.append(token)
        elif current:
            spans.append(tokenizer.decode(current))
            current = []
    spans += [tokenizer.decode(current)] if current else []
    assert len(spans) == 3 and all(span.endswith(IM_END) for span in spans)
    assert spans[0].startswith("step 0 of t4u1") and '"command": "echo t4u1 0"' in spans[0]
    assert spans[2] == f"done t4u1{IM_END}"
    assert not any("<|im_start|>" in span for span in spans)  # no observation, no turn header
    observations = tokenizer.decode([tok for tok, keep in zip(segment.response_ids, segment.mask) if not keep])
    assert "<|im_start|>tool\nt4u1 0" in observations and "<|im_start|>tool\nt4u1 1" in observations


def test_step_zero_ratio_is_one_unguided_and_the_guided_denominator_is_the_guided_prompt(trainer, tiny):
    t, tokenizer, _ = trainer
    first = t.batches[0]
    with torch.no_grad():
        log_ratios = t.log_ratios(first, t._logps(first, guided=False))
    unguided = [lr for i, lr in zip(first, log_ratios) if t.examples[i].sampled_under == "unguided"]
    assert unguided and all(torch.equal(lr, torch.zeros_like(lr)) for lr in unguided)
    independent = AutoModelForCausalLM.from_pretrained(tiny).eval()
    for i, e in enumerate(t.examples):
        if e.sampled_under != "guided":
            continue
        (s,) = e.segments
        ids = torch.tensor([s.sampled_prompt_ids + s.response_ids])
        with torch.no_grad():
            logits = independent(ids).logits[0, :-1].float()
        expected = torch.log_softmax(logits, -1).gather(-1, ids[0, 1:, None]).squeeze(-1)[len(s.sampled_prompt_ids) - 1:]
        mask = torch.tensor(s.mask, dtype=torch.bool)
        assert torch.allclose(t.behaviour[i], expected[mask], atol=1e-5)
        unguided_view = response_logps(independent, [s.prompt_ids], [s.response_ids], t.pad_id)[0][mask]
        assert not torch.allclose(t.behaviour[i], unguided_view, atol=1e-3)  # the hint changes the denominator


def test_actguide_loss_falls_on_a_repeated_batch(folder, tiny, tmp_path):
    config = ActGuideTrainingConfig(learning_rate=3e-4, batch_size=16, max_steps=5, kl_weight=0.0,
                                    behaviour_logprobs="recompute")
    result = train_actguide(config, tiny, folder, tmp_path / "run")
    summary, metrics = read_run(result.run_dir)
    # t4's two failed unguided attempts are replaced by its guided ones (guided_group: replace): 4 trajectories
    assert summary["behaviour_logprobs"] == "recompute" and summary["rendered_tokens"] == 4
    used = json.loads((result.run_dir / "config.json").read_text())
    assert used["behaviour_logprobs"] == "recompute" and used["starting_identity"]["revision"].startswith("sha256:")
    assert [m["step"] for m in metrics] == [1, 2, 3, 4, 5] and summary["trajectories"] == 4
    assert metrics[-1]["loss"] < metrics[0]["loss"]
    assert 0 < summary["forward_share"] < 1 and summary["tokens_per_second"] > 0
    assert (result.checkpoint / "model.safetensors").exists()


def test_a_pipes_launch_reports_its_steps_and_summary_to_the_asset(folder, tiny, tmp_path):
    """The default launch command: `accelerate launch ... -m training.run actguide` in its own process."""
    data = tmp_path / "data"
    (data / "datasets").mkdir(parents=True)
    (data / "datasets" / "hf").symlink_to(folder)
    settings = HandholdSettings(data_dir=str(data), batch="b1", training={
        "model": tiny, "launcher": "pipes", "actguide": {"learning_rate": 1e-3, "batch_size": 8, "max_steps": 2,
                                                         "behaviour_logprobs": "recompute"}})
    instance = dg.DagsterInstance.ephemeral()
    result = dg.materialize([actguide_model], instance=instance,
                            resources={"settings": settings, "credentials": Credentials()})
    assert result.success
    meta = result.get_asset_materialization_events()[0].step_materialization_data.materialization.metadata
    assert meta["launcher"].value == "pipes" and meta["stage"].value == "actguide"  # reported by the subprocess
    assert meta["steps"].value == 2 and meta["checkpoint"].value.endswith("models/actguide/b1/checkpoint")
    assert meta["loss_curve"].value.startswith("![loss](data:image/png;base64,")
    logs = [entry.user_message for entry in instance.all_logs(result.run_id)]
    assert sum("actguide step {" in message for message in logs) == 2


def test_a_served_checkpoint_is_evaluated_through_its_endpoint_and_the_sandboxes(toolz_task, tmp_path):
    """`training.evaluation.base_url` set (vLLM): the model is asked for under its label, the attempt runs in
    a Docker sandbox and is graded like any rollout."""
    from assets.resources import Credentials
    from assets.training import evaluation_policy
    from training.evaluation import evaluate, evaluation_rollouts
    from pipeline.rollouts.batch import RolloutConfig
    from tests.loopback import OpenAIServer, Reply, ToolCall
    from training.config import EvaluationConfig

    server = OpenAIServer([Reply(tool_calls=(ToolCall("bash", {"command": "ls"}),)),
                           Reply(tool_calls=(ToolCall("submit", {}),))])
    with server as base_url:
        config = EvaluationConfig(base_url=base_url, max_steps=4, temperature=0.0)
        policy = evaluation_policy("dpo", "/unused/when/served", config, Credentials(policy_api_key="k"))
        result = evaluate("dpo", policy, [toolz_task], evaluation_rollouts(RolloutConfig(), config),
                          tmp_path / "eval", "b1", progress=lambda _: None)
    assert [r["model"] for r in server.requests] == ["dpo", "dpo"] and not server.errors
    assert (result["tasks"], result["attempts"], result["graded"], result["resolved"]) == (1, 1, 1, 0)
    assert result["pass@1"] == 0.0 and (result["ci95_low"], result["ci95_high"]) == (0.0, 1.0)  # one task: no spread
    assert result["per_task"][0]["ci95_high"] == pytest.approx(0.7935, abs=1e-4)  # Wilson over its one attempt
    stored = pl.read_parquet(result["path"])
    assert stored["policy"].to_list() == ["openai:dpo"] and stored["exit_status"].to_list() == ["submitted"]
    assert stored["grade_reason"][0] != "" and stored["guidance_kind"].to_list() == ["none"]


def test_each_model_is_scored_on_the_tasks_it_trained_on_beside_the_held_out_ones(toolz_task, tmp_path):
    """The memorization check: a second batch of attempts on the trained-on tasks, scored apart, stored apart."""
    import logging
    from types import SimpleNamespace

    from assets.training import evaluate_model
    from training.evaluation import evaluation_rollouts
    from pipeline.core.layout import Layout
    from pipeline.rollouts.batch import RolloutConfig
    from tests.loopback import OpenAIServer, Reply, ToolCall
    from training.config import EvaluationConfig

    replies = [Reply(tool_calls=(ToolCall("submit", {}),))] * 2  # one attempt on each list
    with OpenAIServer(replies, models=("sft",)) as base_url:
        config = EvaluationConfig(base_url=base_url, max_steps=2, temperature=0.0)
        context = SimpleNamespace(log=logging.getLogger("evaluation"))
        row = evaluate_model(context, "sft", "/unused/when/served", [toolz_task], [toolz_task],
                             evaluation_rollouts(RolloutConfig(), config), Layout(tmp_path), "b1", config,
                             Credentials(policy_api_key="k"))
    assert (row["model"], row["tasks"], row["attempts"], row["pass@1"]) == ("sft", 1, 1, 0.0)
    trained = row["trained"]
    assert (trained["tasks"], trained["resolved"], trained["pass@1"]) == (1, 0, 0.0)
    assert [t["instance_id"] for t in trained["per_task"]] == [toolz_task.instance_id]
    assert pl.read_parquet(trained["path"])["instance_id"].to_list() == [toolz_task.instance_id]
    assert "sft-on-trained" in trained["path"] and trained["path"] != row["path"]
