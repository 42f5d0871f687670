"""What exports carry of the per-token side data, and the `--select` thresholds on it.

Why optional fields: only `input_ids` and `loss_mask` are read by speculators' training; extra keys
are ignored, so a row gains `output_logprobs` / `output_top_ids` / `output_top_logprobs` (the
sampled side, for top-K distillation) and `target_*` (a scoring pass) only when the sample has
them, aligned to the output positions (position k is input_ids[len(prompt) + k]). Parquet gets
the same as columns when any exported sample has them, plus `acceptance_length` and `mean_nll`
(`store/export_rows.py` holds the SQL for both the columns and the thresholds).
`--max-acceptance L` keeps samples whose mean acceptance length is at most L (the hard ones for
the deployed drafter); `--max-nll X` keeps samples whose target mean NLL is at most X (drops
off-policy ones). A sample without the measured value cannot be judged and is left out; the
manifest records the thresholds and how many were left out for lack of a value.
"""

from __future__ import annotations

from typing import Any

from tokview.core.record import Capture
from tokview.store import Store
from tokview.store.export_rows import Selection, threshold_counts

ROW_FIELDS = (
    "output_logprobs",
    "output_top_ids",
    "output_top_logprobs",
    "target_logprobs",
    "target_top_ids",
    "target_top_logprobs",
)


def speculators_fields(capture: Capture) -> dict[str, Any]:
    """The optional per-position fields of one speculators row (only those the sample has)."""
    out: dict[str, Any] = {name: getattr(capture, name) for name in ROW_FIELDS if getattr(capture, name) is not None}
    if capture.target_score:
        out["target_score"] = {
            k: capture.target_score.get(k) for k in ("model", "mean_nll", "low_prob_share", "off_policy")
        }
    return out


def thresholds_manifest(store: Store, selection: Selection) -> dict[str, Any] | None:
    """What the manifest says about the thresholds: values, and samples left out for lack of a value."""
    if selection.max_acceptance is None and selection.max_nll is None:
        return None
    out: dict[str, Any] = {"max_acceptance": selection.max_acceptance, "max_nll": selection.max_nll}
    out.update(threshold_counts(store, selection))
    out["rule"] = (
        "--max-acceptance keeps samples whose mean acceptance length (1 + accepted/steps) is at most L; "
        "--max-nll keeps samples whose target mean NLL (nats/token) is at most X; a sample without the "
        "value is left out"
    )
    return out
