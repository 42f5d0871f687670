"""The inspect screen's heat view: output tokens coloured by acceptance run, sampled or target logprob.

Pure functions over a capture, so the screen only renders: `heat_levels` gives one level per
absolute position (None = no colour: the prompt, or no data), 0 = easy/likely … 4 = hard/unlikely;
`heat_detail` gives the token detail panel's extra rows. Acceptance runs are shown only when the
steps could be placed on positions (core.spec_decode); otherwise the mode says "unavailable".
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from tokview.core import spec_decode as sd
from tokview.wording import plural

if TYPE_CHECKING:
    from tokview.core.record import Capture

HEAT_MODES = ("segments", "acceptance", "sampled", "target")
"""`segments` is the usual colouring (no heat)."""
HEAT_LABELS = {
    "segments": "segments",
    "acceptance": "acceptance run",
    "sampled": "sampled logprob",
    "target": "target logprob",
}
LEVELS = 5
PROB_EDGES = (0.9, 0.5, 0.1, 0.01)
"""Probability at or above each edge → level 0, 1, 2, 3; below the last → 4."""


def probability(logprob: float) -> float:
    """exp(logprob), for a value a server really sent: a logprob above 0 (kept as served: a server that returns
    logits) is no probability, shown as 1, and `math.exp` of one above ~709 raised OverflowError and ended the app.
    (A NaN stays NaN: `min` keeps its first argument when the comparison fails.)"""
    return math.exp(min(logprob, 0.0))


def prob_level(logprob: float | None) -> int | None:
    if logprob is None:
        return None
    p = probability(logprob)
    return next((level for level, edge in enumerate(PROB_EDGES) if p >= edge), LEVELS - 1)


def _placement(capture: Capture) -> tuple[sd.SpecDecode | None, sd.Placement | None]:
    spec = sd.SpecDecode.from_dict(capture.spec_decode)
    return spec, sd.place_steps(spec, len(capture.output_ids), capture.finish_reason)


def output_values(capture: Capture, mode: str) -> Sequence[float | None] | None:
    """Per output position: the value the mode colours by (None when the sample has none)."""
    if mode == "sampled":
        return capture.output_logprobs
    if mode == "target":
        return capture.target_logprobs
    if mode == "acceptance":
        _spec, placed = _placement(capture)
        return None if placed is None else [float(r) for r in placed.run]
    return None


def heat_levels(capture: Capture, mode: str) -> list[int | None] | None:
    """One level per absolute position (prompt + output), or None when the mode has no data here."""
    values = output_values(capture, mode)
    if values is None or len(values) != len(capture.output_ids):
        return None
    if mode == "acceptance":
        spec, _ = _placement(capture)
        k = max(
            1,
            (spec.num_spec_tokens if spec and spec.num_spec_tokens else None)
            or max((v or 0 for v in values), default=1)
            or 1,
        )
        # long accepted runs are easy for the drafter (0); a rejected draft (run 0) is hard (4)
        _, placed = _placement(capture)
        out = [
            None
            if v is None or (placed and placed.step_of[i] == sd.PREFILL)  # the prefill token: no step
            else min(LEVELS - 1, round((1 - v / k) * (LEVELS - 1)))
            for i, v in enumerate(values)
        ]
    else:
        out = [prob_level(v) for v in values]
    return [None] * len(capture.prompt_ids) + out


def unavailable(capture: Capture, mode: str) -> str | None:
    """Why the mode shows nothing for this sample (None when it shows something)."""
    if mode == "segments" or heat_levels(capture, mode) is not None:
        return None
    if mode == "acceptance":
        spec = sd.SpecDecode.from_dict(capture.spec_decode)
        if spec is None:
            return "no spec-decode metrics captured"
        return "acceptance per position unavailable: " + sd.unavailable_reason(spec, len(capture.output_ids))
    if mode == "sampled":
        return "no logprobs captured (tokview batch --logprobs K, or a proxied client that asked for them)"
    return "not scored (tokview score)"


def _top(
    ids: Sequence[Sequence[int]] | None,
    lps: Sequence[Sequence[float]] | None,
    pos: int,
    piece: Callable[[int], str] | None,
) -> str | None:
    if not ids or not lps or pos >= len(ids):
        return None
    parts = []
    for tid, lp in zip(ids[pos], lps[pos]):
        name = f"{tid} {piece(tid)!r}" if piece else str(tid)
        parts.append(f"{name} {lp:.3f}")
    return ", ".join(parts) or None


def heat_detail(capture: Capture, position: int, piece: Callable[[int], str] | None = None) -> list[tuple[str, str]]:
    """Detail-panel rows for the token at an absolute position (nothing for prompt positions)."""
    p = position - len(capture.prompt_ids)
    if p < 0 or p >= len(capture.output_ids):
        return []
    rows: list[tuple[str, str]] = []
    spec, placed = _placement(capture)
    if spec is not None:
        if placed is None:
            rows.append(("acceptance run", "unavailable (steps not placed)"))
        elif placed.step_of[p] == sd.PREFILL:
            rows.append(("acceptance run", "prefill token (before any step)"))
        else:
            kind = "accepted draft" if placed.accepted[p] else "target token"
            drafted = spec.per_step_drafted[placed.step_of[p]] if spec.per_step_drafted else None
            rows.append(
                (
                    "acceptance run",
                    f"step {placed.step_of[p]}: {placed.run[p]} of {drafted} {'draft' if drafted == 1 else 'drafts'} "
                    f"accepted; this is the {kind}",
                )
            )
    if capture.output_logprobs is not None and p < len(capture.output_logprobs):
        # the sampled logprob itself is the panel's own "logprob" row; the alternatives are new here
        top = _top(capture.output_top_ids, capture.output_top_logprobs, p, piece)
        if top:
            rows.append(("sampled top-K", top))
    if capture.target_logprobs is not None and p < len(capture.target_logprobs):
        lp = capture.target_logprobs[p]
        if lp is not None:
            rows.append(("target logprob", f"{lp:.4f} (p {probability(lp):.3f})"))
        top = _top(capture.target_top_ids, capture.target_top_logprobs, p, piece)
        if top:
            rows.append(("target top-K", top))
    return rows


def acceptance_bars(side: dict[str, Any] | None) -> tuple[str, dict[str, float]]:
    """(title, bars) for the stats panel: mean acceptance length overall and per segment when placed."""
    spec = (side or {}).get("spec_decode")
    if not spec or spec.get("mean_acceptance_length") is None:
        return "acceptance length: no spec-decode metrics captured", {}
    bars = {"all": round(spec["mean_acceptance_length"], 3)}
    segments = spec.get("segments")
    if segments:
        bars.update(
            {
                name: round(v["mean_acceptance_length"], 3)
                for name, v in segments.items()
                if v.get("mean_acceptance_length") is not None
            }
        )
        return (
            f"mean acceptance length ({spec['placed_samples']:,} of {plural(spec['samples'], 'sample')} placed)",
            bars,
        )
    return "mean acceptance length (per segment unavailable: steps not placed)", bars


def nll_bars(side: dict[str, Any] | None) -> tuple[str, dict[str, int]]:
    """(title, bars) for the stats panel: how many scored samples fall in each mean-NLL bin."""
    target = (side or {}).get("target_logprobs")
    if not target:
        return "target mean NLL: not scored (tokview score)", {}
    edges, counts = target["nll_histogram"]["upper_edges"], target["nll_histogram"]["counts"]
    labels = [f"≤{e:g}" for e in edges] + [f">{edges[-1]:g}"]
    return (
        f"target mean NLL, nats/token ({target['samples']} scored, off_policy {target['off_policy']})",
        dict(zip(labels, counts)),
    )
