"""Acceptance statistics for the outcome benchmark: pooled means, per-position acceptance, bootstrap intervals.

Why pooled ratios: vLLM's mean acceptance length is tokens per verify step, 1 + accepted / steps, over all
steps. Averaging per-sample ratios would weigh a 5-step answer like a 60-step one; the pooled ratio is what
a server's throughput sees. Why a bootstrap over prompts: the held-out prompts are the unit that varies
(some are easy to draft, some are not), so resampling prompts, not steps, gives an honest interval. The
prompts are the same for every condition, so a difference between two conditions is resampled paired
(the same prompts drawn for both), which removes the prompt-to-prompt variance they share.

Inputs are `spec_decode` dicts as tokview stores them (`tokview.core.spec_decode.SpecDecode` as JSON:
`steps`, `accepted`, `drafted`, `histogram`, `num_spec_tokens`). Pure Python: no numpy, so the unit test
runs anywhere.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class SampleSpec:
    """One held-out sample's draft counts: verify steps, accepted drafts, and steps by drafts accepted."""

    prompt_id: str
    steps: int
    accepted: int
    histogram: tuple[int, ...]
    """histogram[k] = verify steps that accepted exactly k drafts (k = 0..num_spec_tokens)."""


def sample_spec(prompt_id: str, spec: Mapping[str, Any]) -> SampleSpec | None:
    """The counts of one stored `spec_decode` dict; None when the server reported no steps."""
    steps, accepted = spec.get("steps"), spec.get("accepted")
    if not isinstance(steps, int) or not isinstance(accepted, int) or steps <= 0:
        return None
    hist = spec.get("histogram")
    if not isinstance(hist, list):  # no histogram: build it from the per-step list when there is one
        per_step = spec.get("per_step_accepted")
        k = spec.get("num_spec_tokens") or (max(per_step) if per_step else 0)
        hist = [0] * (int(k) + 1)
        for a in per_step or []:
            hist[a] += 1
    return SampleSpec(prompt_id, steps, accepted, tuple(int(h) for h in hist))


def acceptance_length(samples: Sequence[SampleSpec]) -> float:
    """Tokens per verify step over all steps: 1 + Σ accepted / Σ steps (vLLM's mean acceptance length)."""
    steps = sum(s.steps for s in samples)
    return 1.0 + sum(s.accepted for s in samples) / steps if steps else float("nan")


def per_position(samples: Sequence[SampleSpec], positions: int) -> list[float]:
    """For draft position k = 1..positions: the share of verify steps that accepted at least k drafts."""
    totals = [0] * (positions + 1)
    for s in samples:
        for k, n in enumerate(s.histogram[: positions + 1]):
            totals[k] += n
    steps = sum(totals)
    if not steps:
        return [float("nan")] * positions
    return [sum(totals[k:]) / steps for k in range(1, positions + 1)]


@dataclass(frozen=True)
class Interval:
    value: float
    low: float
    high: float

    def text(self, digits: int = 3) -> str:
        return f"{self.value:.{digits}f} [{self.low:.{digits}f}, {self.high:.{digits}f}]"


def _percentile(sorted_values: Sequence[float], q: float) -> float:
    """Linear interpolation between the closest ranks (numpy's default)."""
    if not sorted_values:
        return float("nan")
    pos = q * (len(sorted_values) - 1)
    lo = int(pos)
    hi = min(lo + 1, len(sorted_values) - 1)
    return sorted_values[lo] + (sorted_values[hi] - sorted_values[lo]) * (pos - lo)


def bootstrap(
    groups: Sequence[Sequence[SampleSpec]],
    statistic: Callable[[list[Sequence[SampleSpec]]], float],
    *,
    draws: int = 2000,
    seed: int = 0,
    level: float = 0.95,
) -> Interval:
    """A percentile bootstrap over prompts of `statistic(groups)`.

    `groups` are one list of samples per condition, each in the same prompt order (the same held-out
    prompts): one draw picks prompt indices with replacement and applies them to every group, so a paired
    statistic (a difference between conditions) keeps its pairing.
    """
    n = len(groups[0])
    if any(len(g) != n for g in groups):
        raise ValueError("every condition needs the same prompts in the same order")
    value = statistic([list(g) for g in groups])
    if n == 0:
        return Interval(value, float("nan"), float("nan"))
    rng = random.Random(seed)
    values = []
    for _ in range(draws):
        picks = [rng.randrange(n) for _ in range(n)]
        values.append(statistic([[g[i] for i in picks] for g in groups]))
    values.sort()
    tail = (1.0 - level) / 2
    return Interval(value, _percentile(values, tail), _percentile(values, 1.0 - tail))


def paired(samples_by_condition: Mapping[str, Sequence[SampleSpec]]) -> dict[str, list[SampleSpec]]:
    """Each condition's samples restricted to the prompts every condition has, in one prompt order."""
    common = set.intersection(*(set(s.prompt_id for s in v) for v in samples_by_condition.values()))
    return {
        c: sorted((s for s in v if s.prompt_id in common), key=lambda s: s.prompt_id)
        for c, v in samples_by_condition.items()
    }
