"""Every setting of the training and evaluation stages, in the pipeline's config dataclasses.

`HandholdConfig.training` composes `TrainingConfig`; a YAML experiment file sets any of these
(`handhold config` prints them all, documented).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Annotated, Literal

from annotated_types import Gt, Interval

from pipeline.core.config_tree import check_ranges
from pipeline.core.setting_ranges import (Also, Count, CountOrZero, Fraction, NonNegative, Positive, Seconds, Seed,
                                     StepLimit)

Precision = Literal["auto", "fp32", "bf16-mixed", "bf16", "fp16"]
Checkpointing = Literal["auto", "on", "off"]


@dataclass(frozen=True)
class LoraSettings:
    """LoRA adapters (peft) instead of full fine-tuning."""

    enabled: bool = False
    """Train LoRA adapters and save only the adapter; False: full fine-tuning, the whole model saved."""
    r: Count = 16
    """Rank of each adapter."""
    alpha: Count = 32
    """Scaling numerator (the update is scaled by alpha / r)."""
    dropout: Fraction = 0.05
    """Dropout on the adapter's input."""
    target_modules: tuple[str, ...] = ("all-linear",)
    """Module names to adapt; 'all-linear' is every linear layer but the output head."""


@dataclass(frozen=True)
class DPOTrainingConfig:
    """Offline DPO (TRL's DPOTrainer) on the exported `dpo` (or `dpo_divergence`) rows, tool observations masked
    out of the loss."""

    enabled: bool = True
    """Train; False: the dpo_model asset says it skipped."""
    pair_at: Literal["start", "divergence"] = "start"
    """Which exported DPO form to train on: 'start' (config `dpo`, whole completions) or 'divergence' (config
    `dpo_divergence`, each pair cut at the first turn its attempts differ; export it with datasets.dpo_pair_at)."""
    beta: Positive = 0.1
    """Strength of the KL-like pull to the reference model."""
    loss_type: str = "sigmoid"
    """A loss TRL's DPOTrainer knows: sigmoid, hinge, ipo, robust, bco_pair, sppo_hard, nca_pair, apo_zero, ..."""
    learning_rate: Positive = 5e-7
    """Peak learning rate."""
    lr_scheduler: str = "cosine"
    """transformers scheduler name: linear, cosine, constant, constant_with_warmup, ..."""
    warmup: NonNegative = 0.1
    """Warm-up steps, or a fraction of all steps when below 1."""
    per_device_batch_size: Count = 1
    """Pairs per device per forward pass."""
    gradient_accumulation_steps: Count = 8
    """Forward passes per optimizer step."""
    max_length: Count = 16384
    """Tokens of prompt plus one completion; longer completions are cut at an assistant-turn boundary."""
    min_assistant_turns: Count = 1
    """A pair keeping fewer whole assistant turns than this on either side after the cut is dropped."""
    epochs: Positive = 1.0
    """Passes over the training split."""
    max_steps: StepLimit = -1
    """Optimizer steps; -1: as many as `epochs` makes."""
    precision: Precision = "auto"
    """auto: bf16-mixed on a GPU that has bf16, else fp32 (a CPU); bf16-mixed: fp32 weights and optimizer state,
    bf16 compute; bf16 / fp16: weights and optimizer state in 16 bits too (half the memory, but updates below their
    resolution are lost: at learning rates near 1e-6 most are)."""
    precompute_ref_log_probs: bool = False
    """Compute the reference model's log-probs once before training, then free it (saves memory)."""
    gradient_checkpointing: Checkpointing = "auto"
    """Recompute activations in the backward pass (saves memory, costs time); auto: on when training on a GPU."""
    seed: Seed = 0
    """Seed of data order and initialisation of adapters."""
    lora: LoraSettings = field(default_factory=LoraSettings)
    """Adapters instead of full fine-tuning."""


@dataclass(frozen=True)
class SFTTrainingConfig:
    """Supervised fine-tuning (TRL's SFTTrainer) on the exported `sft` rows, loss on the assistant's tokens only."""

    enabled: bool = True
    """Train; False: the sft_model asset says it skipped."""
    learning_rate: Positive = 2e-5
    """Peak learning rate."""
    lr_scheduler: str = "cosine"
    """transformers scheduler name: linear, cosine, constant, constant_with_warmup, ..."""
    warmup: NonNegative = 0.1
    """Warm-up steps, or a fraction of all steps when below 1."""
    per_device_batch_size: Count = 1
    """Conversations per device per forward pass."""
    gradient_accumulation_steps: Count = 8
    """Forward passes per optimizer step."""
    max_length: Count = 16384
    """Tokens of a conversation; a longer one is cut at an assistant-turn boundary (its later turns dropped)."""
    epochs: Positive = 1.0
    """Passes over the training split."""
    max_steps: StepLimit = -1
    """Optimizer steps; -1: as many as `epochs` makes."""
    stop_at_token_accuracy: Fraction = 0.0
    """Stop once the teacher-forced token accuracy reaches this on `stop_patience` steps in a row; 0: never."""
    stop_patience: Count = 5
    """Steps in a row at `stop_at_token_accuracy` before stopping."""
    precision: Precision = "auto"
    """auto: bf16-mixed on a GPU that has bf16, else fp32 (a CPU); bf16-mixed: fp32 weights and optimizer state,
    bf16 compute; bf16 / fp16: weights and optimizer state in 16 bits too (half the memory, but updates below their
    resolution are lost: at learning rates near 1e-6 most are)."""
    gradient_checkpointing: Checkpointing = "auto"
    """Recompute activations in the backward pass (saves memory, costs time); auto: on when training on a GPU."""
    seed: Seed = 0
    """Seed of data order and initialisation of adapters."""
    lora: LoraSettings = field(default_factory=LoraSettings)
    """Adapters instead of full fine-tuning."""


@dataclass(frozen=True)
class ActGuideTrainingConfig:
    """ActGuide-RL's mixed-policy objective, offline, over the stored rollouts of the `actguide` rows."""

    enabled: bool = True
    """Train; False: the actguide_model asset says it skipped."""
    guided_group: Literal["replace", "merge"] = "replace"
    """A task whose unguided attempts all failed: its guided attempts replace the group (ActGuide-RL's reference code)
    or are merged into it (its Algorithm 1's wording)."""
    behaviour_logprobs: Literal["recompute", "stored"] = "recompute"
    """recompute: the starting model's log-probs, computed once before training (ActGuide-RL's reference). stored: the
    rollouts' own on their own token ids; refused unless every trajectory was sampled by the starting model (same
    weights and chat template) at temperature 1 and top-p 1."""
    learning_rate: Positive = 1e-6
    """Learning rate (AdamW)."""
    lr_scheduler: str = "constant"
    """transformers scheduler name: linear, cosine, constant, ..."""
    epochs: Count = 1
    """Passes over the trajectories."""
    max_steps: StepLimit = -1
    """Optimizer steps; -1: as many as `epochs` makes."""
    batch_size: Count = 8
    """Trajectories per optimizer step."""
    clip: Annotated[float, Interval(gt=0, le=1)] = 0.2
    """The ratio is clipped to [1 - clip, 1 + clip]."""
    dual_clip: Annotated[float, Gt(1), Also(0)] = 3.0
    """A negative-advantage token's loss is bounded by dual_clip * |advantage| (VeRL's dual clip, c); 0: no bound."""
    zero_advantage_tokens: Literal["count", "skip"] = "count"
    """count: the tokens of a group's zero-advantage members count in the token mean and the KL (ActGuide-RL's
    reference); skip: such members are left out."""
    kl_weight: NonNegative = 0.001
    """Weight of the KL (k3) to the starting model on the unguided prompt (ActGuide-RL: 0.001); 0: no KL term."""
    max_length: Count = 16384
    """Tokens of the longer (guided) prompt plus the response; later turns beyond it are cut at a turn boundary."""
    micro_batch_tokens: CountOrZero = 0
    """Most tokens (padded) in one forward; a batch is scored in micro-batches with gradients accumulated, the loss
    still the token mean over the whole batch. A segment longer than this is refused before the first step. 0: the
    longest segment of the batch (shorter ones packed up to it; a forward never holds more than that segment alone)."""
    logprob_chunk_tokens: Count = 4096
    """Positions whose logits exist at once when log-probs are computed, in tiles of this many x 16,384 vocabulary
    entries (fp32); the head's gradient is added into its .grad in place whatever this is."""
    max_grad_norm: Positive = 1.0
    """Gradients are clipped to this norm."""
    precision: Precision = "auto"
    """auto: bf16-mixed on a GPU that has bf16, else fp32 (a CPU); bf16-mixed: fp32 weights and optimizer state,
    bf16 compute; bf16 / fp16: weights and optimizer state in 16 bits too (half the memory, but updates below their
    resolution are lost: at learning rates near 1e-6 most are)."""
    gradient_checkpointing: Checkpointing = "auto"
    """Recompute activations in the backward pass (saves memory, costs time); auto: on when training on a GPU."""
    seed: Seed = 0
    """Seed of the trajectory order."""


@dataclass(frozen=True)
class EvaluationConfig:
    """Unguided pass@1 of the trained policy and of the starting model, on the held-out test tasks."""

    enabled: bool = True
    """Evaluate; False: the policy_evaluation asset says it skipped."""
    tasks: CountOrZero = 0
    """Most held-out tasks evaluated (0: all of the test split)."""
    train_tasks: CountOrZero = 3
    """Tasks the models trained on also evaluated (train-split tasks with a success in the `sft` rows, the first
    in task order): the memorization check, a model resolving none was not reached by its training; 0: none."""
    attempts: Count = 1
    """Attempts per task; pass@1 is the mean share of resolved attempts."""
    max_steps: Count = 20
    """Agent steps per attempt."""
    max_new_tokens: Count = 1024
    """Tokens per model turn."""
    temperature: NonNegative = 0.0
    """Sampling temperature; 0: greedy."""
    base_url: str = ""
    """An OpenAI-compatible server (vLLM) serving each model under its name here (starting, sft, dpo, actguide,
    e.g. `--served-model-name` or `--lora-modules dpo=...`); '': every model runs in process."""


@dataclass(frozen=True)
class K8sConfig:
    """The Kubernetes pod a `launcher: k8s` training stage runs in (through Dagster Pipes)."""

    image: str = ""
    """The pod's image, holding the project and a CUDA build of torch (required with launcher k8s)."""
    namespace: str = ""
    """Namespace of the pod; '': the kubeconfig context's, or the step's own when it runs in a pod."""
    gpus: CountOrZero = 1
    """GPUs the pod requests (limits nvidia.com/gpu); 0: none requested."""
    data_claim: str = ""
    """PersistentVolumeClaim holding data_dir, mounted in the pod where the step sees data_dir; '': no
    volume (the cluster's nodes already share data_dir at that path)."""
    kubeconfig: str = ""
    """Kubeconfig file of the cluster; '': in-cluster config when the step runs in a pod, else the default
    kubeconfig (~/.kube/config or $KUBECONFIG)."""
    context: str = ""
    """Kubeconfig context to use; '': its current context."""
    poll_seconds: Seconds = 10.0
    """Seconds between the client's reads of the pod's state while it starts and runs."""

    def __post_init__(self) -> None:
        check_ranges(self)


@dataclass(frozen=True)
class TrainingConfig:
    """Which model is trained, how the training process is launched, and each stage's settings."""

    model: str = ""
    """Starting policy (a local directory or Hub name); '': the tiny offline model, built under data_dir/models."""
    report_to: tuple[str, ...] = ()
    """Experiment trackers every stage also logs to (tensorboard, mlflow, wandb, trackio, ...); empty: none.
    metrics.jsonl and the Dagster metadata are written either way."""
    launcher: Literal["in_process", "pipes", "k8s"] = "in_process"
    """in_process: train inside the asset's process; pipes: launch `launch_command` as a Dagster Pipes subprocess;
    k8s: run it in a Kubernetes pod through Dagster Pipes (PipesK8sClient)."""
    launch_command: str = "python -m accelerate.commands.launch --num_processes 1 -m"
    """Command a pipes or k8s launch runs, followed by `training.run <stage>`; 'python' is this interpreter
    (pipes) or the image's (k8s)."""
    k8s: K8sConfig = field(default_factory=K8sConfig)
    """The pod of a k8s launch."""
    restart_from_base: bool = False
    """Every run starts from `model`; False: a batch of round 1 or later (policy.from_stage) trains on from the
    stage's latest checkpoint of an earlier batch, its DPO reference and ActGuide KL anchor that checkpoint too."""
    rounds_window: CountOrZero = 1
    """Rows a run trains on: those of the batches of the latest N rounds up to its own (1: its round's batches
    only, on-policy); 0: every batch's."""
    sft: SFTTrainingConfig = field(default_factory=SFTTrainingConfig)
    """Supervised fine-tuning on the successes."""
    dpo: DPOTrainingConfig = field(default_factory=DPOTrainingConfig)
    """Offline DPO."""
    actguide: ActGuideTrainingConfig = field(default_factory=ActGuideTrainingConfig)
    """ActGuide mixed-policy stage."""
    evaluation: EvaluationConfig = field(default_factory=EvaluationConfig)
    """Unguided evaluation of the trained policy."""

    def __post_init__(self) -> None:
        check_ranges(self)
        if self.launcher == "k8s" and not self.k8s.image.strip():
            raise ValueError("training.launcher is k8s but training.k8s.image is empty; set training.k8s.image to "
                             "an image holding the project and a CUDA torch, e.g. registry.example.com/handhold:cuda")
