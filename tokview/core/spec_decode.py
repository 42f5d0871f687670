"""Speculative-decoding metrics in one shape, whichever server and version reported them.

Why one shape: a drafter's acceptance on a sample is what tells a person which samples are hard to
draft (the ones worth training on). vLLM (`--per-request-spec-decode-metrics summary|detailed`)
reports `metrics.speculative_decoding`; SGLang reports `spec_*` keys in `meta_info` under three
sets of names by version (≤ 0.5.10.post1, 0.5.11, ≥ 0.5.12). They are folded here into `SpecDecode`:
steps (verify steps), drafted and accepted draft tokens, the histogram of accepted drafts per step,
and the per-step lists when the server gave them. `mean_acceptance_length` is always tokens per
verify step counting the bonus token, 1 + accepted / steps (vLLM's definition), so numbers from
both servers compare; the server's own figures stay in `reported`.

Steps can be placed on output positions only when every decode step drafted (an EAGLE-style
drafter): then 1 + Σ(accepted + 1) over the steps equals the completion length (the first token
comes from prefill), the last step possibly clamped at a stop or `max_tokens`. ngram drafting skips
steps where the text does not repeat, and summary mode gives no per-step lists: `place_steps`
returns None then, and per-segment acceptance is "unavailable", never a guess.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from tokview.core import segments as seg
from tokview.core.profiles import ModelProfile

SGLANG_SCHEMAS: dict[str, tuple[str, str, str]] = {
    # schema: (accepted key, drafted key, histogram key), newest first: 0.5.12 keeps 0.5.11's names as aliases
    "sglang-0.5.12": ("spec_num_correct_drafts", "spec_num_proposed_drafts", "spec_correct_drafts_histogram"),
    "sglang-0.5.11": ("spec_accepted_drafts", "spec_proposed_drafts", "spec_accept_histogram"),
    # 0.5.10.post1 (tokenizer_manager._calculate_spec_decoding_metrics) sends the histogram when it is not empty
    "sglang-0.5.10": ("spec_accept_token_num", "spec_draft_token_num", "spec_accept_histogram"),
}
VLLM_KEYS = (
    "mean_acceptance_length",
    "draft_acceptance_rate",
    "acceptance_histogram",
    "num_spec_steps",
    "num_accepted_draft_tokens",
    "num_draft_tokens",
    "num_spec_tokens",
    "per_step_accepted",
    "per_step_drafted",
)
SEGMENTS = ("reasoning", "answer")
PREFILL = -1
"""`Placement.step_of` for output position 0: the token the prefill pass sampled, before any step."""


def _count(value: object) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else None


def _counts(value: object) -> list[int] | None:
    if not isinstance(value, list) or not all(_count(v) is not None for v in value):
        return None
    return list(value)


def _number(value: object) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value)


@dataclass(frozen=True)
class SpecDecode:
    """One request's speculative-decoding metrics, normalised (None = the server did not say)."""

    schema: str
    """`vllm`, `sglang-0.5.10`, `sglang-0.5.11`, `sglang-0.5.12` or `sglang` (only spec_verify_ct)."""
    steps: int | None
    drafted: int | None
    accepted: int | None
    histogram: list[int] | None = None
    """histogram[k] = verify steps that accepted k draft tokens."""
    per_step_accepted: list[int] | None = None
    per_step_drafted: list[int] | None = None
    num_spec_tokens: int | None = None
    reported: dict[str, Any] = field(default_factory=dict)
    """The server's own fields, verbatim (its acceptance length may count differently)."""

    @property
    def mean_acceptance_length(self) -> float | None:
        """Tokens per verify step, bonus token included: 1 + accepted / steps."""
        if self.steps and self.accepted is not None:
            return 1.0 + self.accepted / self.steps
        if self.steps == 0:
            return 1.0
        reported = self.reported.get("mean_acceptance_length", self.reported.get("spec_accept_length"))
        return _number(reported)

    @property
    def acceptance_rate(self) -> float | None:
        if self.drafted and self.accepted is not None:
            return self.accepted / self.drafted
        return None

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["mean_acceptance_length"] = self.mean_acceptance_length
        out["acceptance_rate"] = self.acceptance_rate
        return out

    @classmethod
    def from_dict(cls, data: dict[str, Any] | None) -> SpecDecode | None:
        if not isinstance(data, dict) or "schema" not in data:
            return None
        names = (
            "schema",
            "steps",
            "drafted",
            "accepted",
            "histogram",
            "per_step_accepted",
            "per_step_drafted",
            "num_spec_tokens",
            "reported",
        )
        return cls(**{k: data[k] for k in names if k in data})


def from_vllm(body: object) -> SpecDecode | None:
    """From a vLLM response (or its final usage chunk): top-level `metrics.speculative_decoding`."""
    metrics = body.get("metrics") if isinstance(body, dict) else None
    spec = metrics.get("speculative_decoding") if isinstance(metrics, dict) else None
    if not isinstance(spec, dict):
        return None
    accepted, drafted = _counts(spec.get("per_step_accepted")), _counts(spec.get("per_step_drafted"))
    return SpecDecode(
        schema="vllm",
        steps=_count(spec.get("num_spec_steps")),
        drafted=_count(spec.get("num_draft_tokens")),
        accepted=_count(spec.get("num_accepted_draft_tokens")),
        histogram=_counts(spec.get("acceptance_histogram")),
        per_step_accepted=accepted,
        per_step_drafted=drafted,
        num_spec_tokens=_count(spec.get("num_spec_tokens")),
        reported={k: spec[k] for k in VLLM_KEYS if k in spec and k not in ("per_step_accepted", "per_step_drafted")},
    )


def from_sglang(meta: object) -> SpecDecode | None:
    """From SGLang's `meta_info` (the final chunk's when streaming); None when it ran no drafter."""
    if not isinstance(meta, dict):
        return None
    reported = {k: v for k, v in meta.items() if k.startswith("spec_")}
    if not reported:
        return None
    schema = next((name for name, (acc, _, _) in SGLANG_SCHEMAS.items() if acc in meta), "sglang")
    acc_key, draft_key, hist_key = SGLANG_SCHEMAS.get(schema, (None, None, None))
    return SpecDecode(
        schema=schema,
        steps=_count(meta.get("spec_verify_ct")),
        drafted=_count(meta.get(draft_key)) if draft_key else None,
        accepted=_count(meta.get(acc_key)) if acc_key else None,
        histogram=_counts(meta.get(hist_key)) if hist_key else None,
        reported=reported,
    )


@dataclass(frozen=True)
class Placement:
    """Which verify step produced each output position (only when steps can be placed)."""

    step_of: list[int]
    """Per output position: the step index, or PREFILL for position 0."""
    run: list[int]
    """Per output position: the accepted-draft count of its step (the run it belongs to); 0 for prefill."""
    accepted: list[bool]
    """Per output position: True for an accepted draft token, False for a target-sampled one."""


def place_steps(spec: SpecDecode | None, n_output: int, finish_reason: str | None) -> Placement | None:
    """Map steps onto output positions, or None when the numbers do not prove the mapping."""
    if spec is None or spec.per_step_accepted is None or n_output <= 0:
        return None
    acc, drafted = spec.per_step_accepted, spec.per_step_drafted
    if spec.steps is not None and spec.steps != len(acc):
        return None
    if drafted is not None and (len(drafted) != len(acc) or any(d <= 0 or a > d for a, d in zip(acc, drafted))):
        return None  # a step without a draft: not every decode step drafted
    total = 1 + sum(a + 1 for a in acc)
    if total != n_output:
        clamped = bool(acc) and finish_reason in ("stop", "length") and total - (acc[-1] + 1) < n_output < total
        if not clamped:
            return None
    step_of, run, accepted = [PREFILL], [0], [False]
    for index, a in enumerate(acc):
        for k in range(a + 1):
            if len(step_of) == n_output:
                break
            step_of.append(index)
            run.append(a)
            accepted.append(k < a)
    return Placement(step_of, run, accepted)


def segment_of_kind(kind: str) -> str:
    """reasoning (opener, reasoning, closer) or answer (answer, stop)."""
    return "reasoning" if kind in (seg.OPENER, seg.REASONING, seg.CLOSER) else "answer"


def segment_acceptance(
    spec: SpecDecode | None, placement: Placement | None, output_kinds: Sequence[str]
) -> dict[str, dict[str, Any]] | None:
    """Acceptance per segment (a step counts where its first token is); None when steps are not placed."""
    if spec is None or placement is None:
        return None
    out: dict[str, dict[str, Any]] = {name: {"tokens": 0, "steps": 0, "accepted": 0, "drafted": 0} for name in SEGMENTS}
    for kind in output_kinds:
        out[segment_of_kind(kind)]["tokens"] += 1
    drafted = spec.per_step_drafted
    seen: set[int] = set()
    for pos, step in enumerate(placement.step_of):
        if step == PREFILL or step in seen:
            continue
        seen.add(step)
        part = out[segment_of_kind(output_kinds[pos])]
        part["steps"] += 1
        part["accepted"] += spec.per_step_accepted[step]  # type: ignore[index]
        part["drafted"] += drafted[step] if drafted is not None else 0
    for part in out.values():
        part["mean_acceptance_length"] = 1.0 + part["accepted"] / part["steps"] if part["steps"] else None
        part["acceptance_rate"] = part["accepted"] / part["drafted"] if part["drafted"] else None
        if drafted is None:
            part["drafted"] = None
    return out


def summary(
    spec_data: dict[str, Any] | None,
    prompt_ids: Sequence[int],
    output_ids: Sequence[int],
    finish_reason: str | None,
    profile: ModelProfile | None,
) -> dict[str, Any] | None:
    """What `show --json` and the UI print for one sample: totals, per-position runs, segments (or null)."""
    spec = SpecDecode.from_dict(spec_data)
    if spec is None:
        return None
    placement = place_steps(spec, len(output_ids), finish_reason)
    kinds = seg.token_kinds(prompt_ids, output_ids, profile)[len(prompt_ids) :] if profile is not None else None
    out = spec.to_dict()
    out["placed"] = placement is not None
    out["runs"] = placement.run if placement is not None else None
    out["segments"] = segment_acceptance(spec, placement, kinds) if kinds is not None else None
    if placement is None:
        out["segments_unavailable"] = unavailable_reason(spec, len(output_ids))
    return out


def unavailable_reason(spec: SpecDecode, n_output: int) -> str:
    if spec.steps == 0:
        return "no step drafted (the drafter proposed nothing for this output)"
    if spec.per_step_accepted is None:
        return "the server gave totals only (no per-step accepted counts)"
    total = 1 + sum(a + 1 for a in spec.per_step_accepted)
    return (
        f"steps do not cover the output (1 + Σ(accepted+1) = {total}, {n_output} output tokens): "
        f"not every decode step drafted (ngram drafting skips steps)"
    )
