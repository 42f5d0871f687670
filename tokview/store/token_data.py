"""Per-token side data stored with a sample: spec-decode metrics, logprobs, target scores.

Kept in its own module so the sample columns it adds (schema version 5) are listed once: the
writer (`sample_rows.sample_params`), the reader (`sample_rows.capture_from_row`) and `tokview score`'s
update all use these names. `acceptance_length` and `mean_nll` are plain columns so lists can sort
and filter on them and `--select` can threshold them in SQL without parsing JSON.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

from tokview.core.record import Capture
from tokview.core.spec_decode import SpecDecode

if TYPE_CHECKING:
    from tokview.core.findings import Finding
    from tokview.store.connection import Database

SIDE_COLUMNS = (
    "spec_decode",
    "acceptance_length",
    "output_top_ids",
    "output_top_logprobs",
    "target_logprobs",
    "target_top_ids",
    "target_top_logprobs",
    "target_score",
    "mean_nll",
)
SIDE_CAPTURE_FIELDS = (
    "spec_decode",
    "output_top_ids",
    "output_top_logprobs",
    "target_logprobs",
    "target_top_ids",
    "target_top_logprobs",
    "target_score",
)
SIDE_JSON = ("spec_decode", "target_score")
TARGET_COLUMNS = ("target_logprobs", "target_top_ids", "target_top_logprobs", "target_score", "mean_nll")

MIGRATION_SQL = (
    "ALTER TABLE samples ADD COLUMN spec_decode VARCHAR",  # JSON: core.spec_decode.SpecDecode
    "ALTER TABLE samples ADD COLUMN acceptance_length DOUBLE",  # mean acceptance length (sort/filter)
    "ALTER TABLE samples ADD COLUMN output_top_ids INTEGER[][]",
    "ALTER TABLE samples ADD COLUMN output_top_logprobs FLOAT[][]",
    "ALTER TABLE samples ADD COLUMN target_logprobs FLOAT[]",
    "ALTER TABLE samples ADD COLUMN target_top_ids INTEGER[][]",
    "ALTER TABLE samples ADD COLUMN target_top_logprobs FLOAT[][]",
    "ALTER TABLE samples ADD COLUMN target_score VARCHAR",  # JSON: server, model, thresholds, summary
    "ALTER TABLE samples ADD COLUMN mean_nll DOUBLE",  # the target's mean NLL (sort/filter/select)
)


def _dump(value: object) -> str | None:
    return None if value is None else json.dumps(value, ensure_ascii=False, default=str)


def acceptance_length(spec_data: dict[str, Any] | None) -> float | None:
    spec = SpecDecode.from_dict(spec_data)
    return None if spec is None else spec.mean_acceptance_length


def side_values(capture: Capture) -> dict[str, Any]:
    """The side columns of one capture, ready for an INSERT."""
    score = capture.target_score or {}
    return {
        "spec_decode": _dump(capture.spec_decode),
        "acceptance_length": acceptance_length(capture.spec_decode),
        "output_top_ids": capture.output_top_ids,
        "output_top_logprobs": capture.output_top_logprobs,
        "target_logprobs": capture.target_logprobs,
        "target_top_ids": capture.target_top_ids,
        "target_top_logprobs": capture.target_top_logprobs,
        "target_score": _dump(capture.target_score),
        "mean_nll": score.get("mean_nll"),
    }


def side_fields(row: dict[str, Any]) -> dict[str, Any]:
    """Capture fields from a samples row (absent columns: None, for rows read before migrating)."""
    out: dict[str, Any] = {}
    for name in SIDE_CAPTURE_FIELDS:
        value = row.get(name)
        if name in SIDE_JSON and value is not None:
            value = json.loads(value)
        elif isinstance(value, list):
            value = [list(v) if isinstance(v, (list, tuple)) else v for v in value]
        out[name] = value
    return out


def target_statements(sample_id: str, capture: Capture, finding: Finding | None) -> list[tuple[str, list[Any]]]:
    """The statements that write one sample's target scores and its `off_policy` finding (added or cleared).

    Only the target columns, the finding and the denormalised codes change: the sample's ids, its
    other findings, validity (off_policy is a warning) and review status stay as they were."""
    values = side_values(capture)
    code = "off_policy"
    statements: list[tuple[str, list[Any]]] = [
        (
            f"UPDATE samples SET {', '.join(f'{c} = ?' for c in TARGET_COLUMNS)}, "
            f"codes = list_concat(list_filter(codes, lambda c: c <> '{code}'), ?::VARCHAR[]) WHERE sample_id = ?",
            [*(values[c] for c in TARGET_COLUMNS), [code] if finding is not None else [], sample_id],
        ),
        (f"DELETE FROM findings WHERE sample_id = ? AND code = '{code}'", [sample_id]),
    ]
    if finding is not None:
        statements.append(
            (
                "INSERT INTO findings VALUES (?, ?, ?, ?, ?)",
                [sample_id, finding.code, finding.severity, finding.detail, list(finding.positions)],
            )
        )
    return statements


def put_target_scores(store: Database, items: list[tuple[str, Capture, Finding | None]]) -> None:
    """Write several samples' scores in one short transaction (the store is shared: keep it brief)."""
    statements = [st for sample_id, capture, finding in items for st in target_statements(sample_id, capture, finding)]
    if statements:
        store.write(statements)  # one transaction under the store's lock


def put_target_score(store: Database, sample_id: str, capture: Capture, finding: Finding | None) -> None:
    put_target_scores(store, [(sample_id, capture, finding)])
