"""The simulator's drafter and token distribution: spec-decode metrics and logprobs that agree.

Spec decoding: an imagined EAGLE-style drafter proposes `DRAFT_TOKENS` tokens at every decode step
and the target accepts a deterministic number of them (a hash of the position and token), so the
steps always cover the output (1 + Σ(accepted + 1), the last step clamped at the end) and tokview
can place them. Each `--spec-decode` mode reports those same steps the way one server build does:
vLLM `detailed` (per-step lists) or `summary` (totals only), SGLang 0.5.10 / 0.5.11 / 0.5.12 names.

Logprobs: the simulator writes only its own sentences, so it is "confident" about their tokens and
not about anything else. A token's logprob at absolute position i (in prompt + output) is a small
negative number when the token is in the simulator's vocabulary and about -6 to -11 when not; the
top-K at i are the token (when it is likely) and fixed alternatives. Because the value depends only
on (position, token), generating with logprobs and scoring the stored sample later give the same
numbers, and scoring text another pipeline wrote reads as off-policy.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from tokview.sim.model import ANSWER_SENTENCES, REASONING_SENTENCES

if TYPE_CHECKING:
    from tokview.core.tokenizer import TokenizerAdapter

SPEC_DECODE_MODES = ("vllm-summary", "vllm-detailed", "sglang-0.5.10", "sglang-0.5.11", "sglang-0.5.12")
DRAFT_TOKENS = 3
_SGLANG_NAMES = {
    "sglang-0.5.10": ("spec_accept_token_num", "spec_draft_token_num", "spec_accept_histogram"),
    "sglang-0.5.11": ("spec_accepted_drafts", "spec_proposed_drafts", "spec_accept_histogram"),
    "sglang-0.5.12": ("spec_num_correct_drafts", "spec_num_proposed_drafts", "spec_correct_drafts_histogram"),
}


def _hash(*parts: int) -> int:
    return int.from_bytes(hashlib.blake2b(",".join(map(str, parts)).encode(), digest_size=4).digest(), "big")


def accepted_steps(output_ids: Sequence[int]) -> list[int]:
    """Accepted drafts per verify step; position 0 is the prefill token, the last step may overshoot."""
    steps: list[int] = []
    pos = 1
    while pos < len(output_ids):
        accepted = _hash(output_ids[pos], pos) % (DRAFT_TOKENS + 1)
        steps.append(accepted)
        pos += accepted + 1
    return steps


def _histogram(steps: list[int]) -> list[int]:
    return [sum(1 for a in steps if a == k) for k in range(DRAFT_TOKENS + 1)]


def vllm_metrics(mode: str | None, output_ids: Sequence[int]) -> dict[str, Any] | None:
    """`metrics.speculative_decoding` as vLLM 0.32 reports it (None when the mode is not a vLLM one)."""
    if mode not in ("vllm-summary", "vllm-detailed"):
        return None
    steps = accepted_steps(output_ids)
    accepted, drafted = sum(steps), DRAFT_TOKENS * len(steps)
    detailed = mode == "vllm-detailed"
    return {
        "mean_acceptance_length": 1 + accepted / len(steps) if steps else 1.0,
        "draft_acceptance_rate": accepted / drafted if drafted else 0.0,
        "acceptance_histogram": _histogram(steps),
        "num_spec_steps": len(steps),
        "num_accepted_draft_tokens": accepted,
        "num_draft_tokens": drafted,
        "num_spec_tokens": DRAFT_TOKENS,
        "per_step_accepted": steps if detailed else None,
        "per_step_drafted": [DRAFT_TOKENS] * len(steps) if detailed else None,
    }


def sglang_meta(mode: str | None, output_ids: Sequence[int]) -> dict[str, Any]:
    """The `spec_*` meta_info keys of one SGLang build ({} when the mode is not an SGLang one)."""
    if mode not in _SGLANG_NAMES:
        return {}
    steps = accepted_steps(output_ids)
    accepted, drafted = sum(steps), DRAFT_TOKENS * len(steps)
    acc_key, draft_key, hist_key = _SGLANG_NAMES[mode]
    meta: dict[str, Any] = {
        "spec_verify_ct": len(steps),
        "spec_accept_rate": accepted / drafted if drafted else 0.0,
        "spec_accept_length": len(output_ids) / len(steps) if steps else 1.0,
        acc_key: accepted,
        draft_key: drafted,
    }
    if hist_key:
        meta[hist_key] = _histogram(steps)
    if mode == "sglang-0.5.12":  # the 0.5.11 names stay as aliases for one release
        meta.update(
            spec_accepted_drafts=accepted, spec_proposed_drafts=drafted, spec_accept_histogram=_histogram(steps)
        )
    return meta


class SimDistribution:
    """logprob(position, token) and top-K(position): a function of (position, token) only."""

    def __init__(self, tokenizer: TokenizerAdapter, special_ids: Sequence[int | None]) -> None:
        texts = [*REASONING_SENTENCES, *ANSWER_SENTENCES]
        ids: set[int] = {i for i in special_ids if i is not None}
        for text in texts:
            for prefix in ("", " ", "\n", "\n\n"):
                ids.update(tokenizer.encode(prefix + text + "\n"))
            for other in texts:
                ids.update(tokenizer.encode(text + " " + other))
        self.known = sorted(ids)
        self._known = ids

    def logprob(self, position: int, token: int) -> float:
        spread = (token * 31 + position * 7) % 97
        if token in self._known:
            return -round(spread / 200.0, 4)
        return -round(6.0 + spread / 20.0, 4)

    def alternatives(self, position: int, k: int) -> list[tuple[int, float]]:
        n = len(self.known)
        return [(self.known[(position * 131 + j * 17) % n], round(-0.6 - 0.5 * j, 4)) for j in range(k)]

    def top(self, position: int, token: int | None, k: int) -> list[tuple[int, float]]:
        """The k most likely ids at `position`, best first (the token itself when it is likely)."""
        pool = dict(self.alternatives(position, k))
        if token is not None:
            pool[token] = self.logprob(position, token)
        return sorted(pool.items(), key=lambda kv: (-kv[1], kv[0]))[:k]

    def rank(self, position: int, token: int, k: int) -> int:
        top = [t for t, _ in self.top(position, token, k)]
        return top.index(token) + 1 if token in top else k + 1
