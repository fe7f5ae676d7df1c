"""How fast a stage trained: seconds that wait for the device, and tokens per second without the warm-up step.

The first optimizer step pays for allocation, kernel choice and the first batches loaded: on a short run it
under-reports the rate several times, so every stage's `tokens_per_second` is over the steps after the first when
there are two or more, and its summary says so (`tokens_per_second_excludes`).
"""

from __future__ import annotations

import time
from typing import Any


def clock(model) -> float:
    """Seconds now, once the device has finished what was queued (a GPU runs ahead of Python)."""
    import torch

    if next(model.parameters()).is_cuda:
        torch.cuda.synchronize()
    return time.monotonic()


def step_clock():
    """A TrainerCallback noting (monotonic seconds, input tokens seen) at the end of every optimizer step: `last`
    the latest, `first` step 1's."""
    from transformers import TrainerCallback

    class StepClock(TrainerCallback):
        first: tuple[float, int] | None = None
        last: tuple[float, int] | None = None

        def on_step_end(self, args, state, control, **kwargs):
            self.last = (time.monotonic(), int(state.num_input_tokens_seen))
            if state.global_step == 1:
                self.first = self.last

    return StepClock()


def throughput(clock, tokens: int, seconds: float) -> dict[str, Any]:
    """The summary's rate: tokens per second over the steps after the first when `clock` saw two or more (the
    first step's time is warm-up, not throughput), else over the whole run (`tokens` in `seconds`)."""
    timed = clock.first is not None and clock.last is not None and clock.last[0] > clock.first[0]
    if timed:
        tokens, seconds = clock.last[1] - clock.first[1], clock.last[0] - clock.first[0]
    return {"tokens_per_second": round(tokens / seconds, 1) if seconds else None,
            "tokens_per_second_excludes": "first step" if timed else "nothing",
            "timed_tokens": int(tokens), "timed_seconds": round(seconds, 4)}


def run_numbers(history: list[dict[str, Any]], timings: dict[str, float]) -> dict[str, Any]:
    """Steps, losses, time and throughput of a run: `seconds` all of it (the behaviour pass and every step),
    tokens per second over the steps after the first (warm-up: kernels chosen, memory allocated) when there are
    others."""
    total = sum(timings.values())
    timed = history[1:] if len(history) > 1 else history
    seconds = sum(m["seconds"] for m in timed)
    return {
        "steps": len(history), "first_loss": history[0]["loss"] if history else None,
        "final_loss": history[-1]["loss"] if history else None, "seconds": round(total, 2),
        "tokens": sum(m["tokens"] for m in history),
        "tokens_per_second": round(sum(m["tokens"] for m in timed) / seconds, 1) if seconds else None,
        "tokens_per_second_excludes": "first step" if len(history) > 1 else "nothing",
        "timed_tokens": int(sum(m["tokens"] for m in timed)), "timed_seconds": round(seconds, 4),
        "seconds_by_phase": {k: round(v, 3) for k, v in timings.items()},
        "forward_share": (round((timings["behaviour_forward"] + timings["policy_forward"]) / total, 3)
                          if total else None)}
