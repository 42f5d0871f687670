"""Target scores a copy of the store made (`tokview score` on another machine), merged back into samples both hold.

A merge copied the source's new samples with their scores, but a sample the target already held kept its own
columns: scoring a copy of a store on the box that serves the target model and merging it back brought the review
and not one score (`export --max-nll` then left every sample out as not scored). A score comes across where the
sample is the same generation in both stores (its ids and prompt length) and the target has none; where both hold
one and they differ, the target's stands, and the merge says how many.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from tokview.store.token_data import TARGET_COLUMNS

if TYPE_CHECKING:
    from duckdb import DuckDBPyConnection

OFF_POLICY = "off_policy"
"""The one finding scoring adds or clears (`token_data.target_statements`): it comes across with the score."""

_SAME_GENERATION = (
    "FROM src.samples s JOIN main.samples m USING (sample_id) WHERE s.output_ids IS NOT DISTINCT FROM m.output_ids "
    "AND s.prompt_len IS NOT DISTINCT FROM m.prompt_len AND s.target_score IS NOT NULL"
)


def take_scores(conn: DuckDBPyConnection, shared: list[str]) -> tuple[int, int]:
    """Copy the source's scores of samples both hold that the target has not scored, their `off_policy` finding
    with them; returns (scores taken, samples scored otherwise in both: the target's kept). `shared`: the samples
    columns both stores have (a source from before scores has none to give)."""
    if not set(TARGET_COLUMNS) <= set(shared):
        return 0, 0
    kept = conn.execute(
        f"SELECT count(*) {_SAME_GENERATION} AND m.target_score IS NOT NULL AND s.target_score <> m.target_score"
    ).fetchone()
    conn.execute(
        f"CREATE OR REPLACE TEMP TABLE _merge_scored AS SELECT sample_id {_SAME_GENERATION} AND m.target_score IS NULL"
    )
    taken = conn.execute("SELECT count(*) FROM _merge_scored").fetchone()
    if taken and taken[0]:
        assignments = ", ".join(f"{c} = s.{c}" for c in TARGET_COLUMNS)
        conn.execute(
            f"UPDATE main.samples SET {assignments}, codes = list_concat(list_filter(main.samples.codes, "
            f"lambda c: c <> '{OFF_POLICY}'), CASE WHEN list_contains(s.codes, '{OFF_POLICY}') THEN ['{OFF_POLICY}'] "
            "ELSE []::VARCHAR[] END) FROM src.samples s WHERE main.samples.sample_id = s.sample_id "
            "AND s.sample_id IN (SELECT sample_id FROM _merge_scored)"
        )
        conn.execute(
            f"DELETE FROM main.findings WHERE code = '{OFF_POLICY}' AND sample_id IN (SELECT sample_id FROM "
            "_merge_scored)"
        )
        conn.execute(
            "INSERT INTO main.findings SELECT sample_id, code, severity, detail, positions FROM src.findings "
            f"WHERE code = '{OFF_POLICY}' AND sample_id IN (SELECT sample_id FROM _merge_scored) ORDER BY rowid"
        )
    conn.execute("DROP TABLE _merge_scored")
    return (int(taken[0]) if taken else 0), (int(kept[0]) if kept else 0)
