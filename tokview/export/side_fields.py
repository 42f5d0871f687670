"""What exports carry of the per-token side data, and the `--select` thresholds on it.

Why optional fields: only `input_ids` and `loss_mask` are read by speculators' training; extra keys
are ignored, so a row gains `output_logprobs` / `output_top_ids` / `output_top_logprobs` (the
sampled side, for top-K distillation) and `target_*` (a scoring pass) only when the sample has
them, aligned to the output positions (position k is input_ids[len(prompt) + k]). Parquet gets
the same as columns when any exported sample has them, plus `acceptance_length` and `mean_nll`.
`--max-acceptance L` keeps samples whose mean acceptance length is at most L (the hard ones for
the deployed drafter); `--max-nll X` keeps samples whose target mean NLL is at most X (drops
off-policy ones). A sample without the measured value cannot be judged and is left out; the
manifest records the thresholds and how many were left out for lack of a value.
"""

from __future__ import annotations

from typing import Any

from tokview.core.record import Capture

ROW_FIELDS = (
    "output_logprobs",
    "output_top_ids",
    "output_top_logprobs",
    "target_logprobs",
    "target_top_ids",
    "target_top_logprobs",
)
PARQUET_GROUPS = {
    "output_logprobs": ("output_logprobs", "output_top_ids", "output_top_logprobs"),
    "target_logprobs": ("target_logprobs", "target_top_ids", "target_top_logprobs"),
    "acceptance_length": ("acceptance_length",),
    "mean_nll": ("mean_nll",),
}


def speculators_fields(capture: Capture) -> dict[str, Any]:
    """The optional per-position fields of one speculators row (only those the sample has)."""
    out: dict[str, Any] = {name: getattr(capture, name) for name in ROW_FIELDS if getattr(capture, name) is not None}
    if capture.target_score:
        out["target_score"] = {
            k: capture.target_score.get(k) for k in ("model", "mean_nll", "low_prob_share", "off_policy")
        }
    return out


def parquet_columns(store: Any, sample_ids: list[str], alias: str = "s") -> str:
    """`, s.col, …` for the side columns any of these samples has ('' when none has any)."""
    if not sample_ids:
        return ""
    checks = ", ".join(f"count({group}) > 0" for group in PARQUET_GROUPS)
    present = store.query(
        f"SELECT {checks} FROM samples JOIN (SELECT unnest(?::VARCHAR[]) AS sid) q ON samples.sample_id = q.sid",
        [sample_ids],
    )[0]
    cols = [c for (group, cols_), has in zip(PARQUET_GROUPS.items(), present) if has for c in cols_]
    return "".join(f", {alias}.{c}" for c in cols)


def threshold_where(max_acceptance: float | None, max_nll: float | None) -> tuple[str, list[Any]]:
    """The extra WHERE clause (` AND …`) and its parameters for the `--select` thresholds."""
    where, params = "", []
    if max_acceptance is not None:
        where += " AND acceptance_length <= ?"
        params.append(float(max_acceptance))
    if max_nll is not None:
        where += " AND mean_nll <= ?"
        params.append(float(max_nll))
    return where, params


def thresholds_manifest(
    store: Any, base_where: str, base_params: list[Any], max_acceptance: float | None, max_nll: float | None
) -> dict[str, Any] | None:
    """What the manifest says about the thresholds: values, and samples left out for lack of a value."""
    if max_acceptance is None and max_nll is None:
        return None
    out: dict[str, Any] = {"max_acceptance": max_acceptance, "max_nll": max_nll}
    if max_acceptance is not None:
        out["left_out_no_spec_decode"] = store.query(
            f"SELECT count(*) FROM samples WHERE {base_where} AND acceptance_length IS NULL", base_params
        )[0][0]
        out["left_out_above_max_acceptance"] = store.query(
            f"SELECT count(*) FROM samples WHERE {base_where} AND acceptance_length > ?",
            [*base_params, float(max_acceptance)],
        )[0][0]
    if max_nll is not None:
        out["left_out_not_scored"] = store.query(
            f"SELECT count(*) FROM samples WHERE {base_where} AND mean_nll IS NULL", base_params
        )[0][0]
        out["left_out_above_max_nll"] = store.query(
            f"SELECT count(*) FROM samples WHERE {base_where} AND mean_nll > ?", [*base_params, float(max_nll)]
        )[0][0]
    out["rule"] = (
        "--max-acceptance keeps samples whose mean acceptance length (1 + accepted/steps) is at most L; "
        "--max-nll keeps samples whose target mean NLL (nats/token) is at most X; a sample without the "
        "value is left out"
    )
    return out
