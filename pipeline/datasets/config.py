"""How graded trajectories become datasets: the settings every dataset module reads."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from pipeline.core.config_tree import check_ranges
from pipeline.core.setting_ranges import Count, CountOrZero, Fraction, Seed

DpoPairAt = Literal["start", "divergence"]
"""Where a DPO pair's completions start: at the unguided prompt, or at the first turn its two attempts differ."""
DPO_FORMS: dict[str, str] = {"start": "dpo", "divergence": "dpo_divergence"}
"""The exported config (and built shard kind) of each DPO form."""


@dataclass(frozen=True)
class DatasetConfig:
    """How graded trajectories become DPO pairs, ActGuide groups and SFT examples."""

    pairs_per_task: Count = 4
    """Most DPO pairs per task and batch."""
    dpo_pair_at: tuple[DpoPairAt, ...] = ("start",)
    """DPO forms the export holds (the build makes both): 'start' (config `dpo`: whole completions under the unguided
    prompt) and 'divergence' (config `dpo_divergence`: each pair cut at the first turn its attempts differ, the
    shared turns in the prompt; pipeline/datasets/divergence.py). 'start' is always one: the others are cut from
    its pairs."""
    rejected: Literal["all", "shortest", "random"] = "all"
    """Which unguided failures pair: 'all' (each distinct one), the 'shortest' one, or one drawn at 'random' (seed)."""
    chosen_sources: Literal["guided_and_unguided", "guided_only", "unguided_only"] = "guided_and_unguided"
    """Which successes are chosen (and SFT rows): guided ones, their prompt without the guidance (Agent-RLVR),
    unguided ones, or both."""
    include_probes: bool = True
    """Successful action-prefix probes count as guided successes (they are never ActGuide group members)."""
    max_prompt_tokens: CountOrZero = 8192
    """Attempts whose unguided prompt counts more tokens are left out, and counted; 0: no limit."""
    max_completion_tokens: CountOrZero = 32768
    """Attempts whose completion counts more tokens are left out, and counted; 0: no limit."""
    tokenizer: str = ""
    """Tokenizer (local path or Hub name) that counts tokens; '': ceil(characters / 4) + 4 per message,
    reported as such."""
    test_fraction: Fraction = 0.1
    """Share of tasks in the test split, by a hash of the instance id (stable across rebuilds)."""
    seed: Seed = 0
    """Seed of the 'random' rejected draw (the splits do not depend on it)."""
    skip_bad_files: bool = False
    """Build on without trajectory files that cannot be read (each reported with why) instead of stopping."""
    guidance_references: Literal["drop", "rewrite"] = "drop"
    """A guided success whose prose refers to its guidance ('Following the reference action.', a hint's own
    term): 'drop' it from the chosen and SFT rows, or 'rewrite' that prose (tool calls untouched, recorded)."""
    keep_ungrounded: bool = False
    """Keep guided successes that edit a file no tool output had shown (they knew where from the hint alone)
    as chosen and SFT rows; they are counted per guidance kind either way."""
    max_disagreement_rate: Fraction = 1.0
    """Tasks whose re-validations and rollout grades disagreed on more than this share of their graded runs
    are left out (quarantined tasks always are); 1.0: no task for this reason."""

    def __post_init__(self) -> None:
        if "start" not in self.dpo_pair_at or len(set(self.dpo_pair_at)) != len(self.dpo_pair_at):
            raise ValueError(f"DatasetConfig.dpo_pair_at is {list(self.dpo_pair_at)}; list each form once, 'start' "
                             "among them (the divergence form is cut from the start pairs): [start] or "
                             "[start, divergence]")
        check_ranges(self)
        if self.max_prompt_tokens < 0 or self.max_completion_tokens < 0:
            raise ValueError("DatasetConfig.max_prompt_tokens / max_completion_tokens must be >= 0 (0: no limit)")
