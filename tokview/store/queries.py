"""Read-side SQL: the sample list, counts and the numbers `tokview stats` prints.

The list view reads only light columns (ids, status, lengths, the denormalised `codes` list), so a
page of 100,000 samples is a column scan, never a join or a fetch of id arrays.
"""

from __future__ import annotations

from typing import Any

from tokview.store.records import SampleFilter, SampleRow

ORDERABLE = {"created_at", "sample_id", "prompt_id", "run_id", "status", "finish_reason", "prompt_len",
             "output_len", "n_errors", "valid", "acceptance_length", "mean_nll"}
ROW_COLUMNS = ("sample_id, prompt_id, run_id, status, valid, finish_reason, prompt_len, output_len, codes, n_errors, "
               "acceptance_length, mean_nll")


def where_clause(filters: SampleFilter | None) -> tuple[str, list[Any]]:
    f = filters or SampleFilter()
    parts: list[str] = []
    params: list[Any] = []
    if f.status is not None:
        parts.append("status = ?")
        params.append(f.status)
    if f.code is not None:
        parts.append("list_contains(codes, ?)")
        params.append(f.code)
    if f.run_id is not None:
        parts.append("run_id = ?")
        params.append(f.run_id)
    if f.valid is not None:
        parts.append("valid = ?")
        params.append(bool(f.valid))
    if f.max_acceptance is not None:  # the hard samples for the deployed drafter (no metrics: left out)
        parts.append("acceptance_length <= ?")
        params.append(float(f.max_acceptance))
    if f.max_nll is not None:  # on-policy enough under the scoring target (not scored: left out)
        parts.append("mean_nll <= ?")
        params.append(float(f.max_nll))
    if f.text:
        parts.append("(sample_id ILIKE ? OR prompt_id ILIKE ? OR content ILIKE ? OR reasoning ILIKE ?)")
        like = "%" + f.text.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_") + "%"
        params.extend([like] * 4)
    return (" WHERE " + " AND ".join(parts)) if parts else "", params


def order_clause(order_by: str | None) -> str:
    """`"output_len desc"`, `"-output_len"` or a comma list of those; unknown columns are refused."""
    terms: list[str] = []
    for raw in (order_by or "created_at").split(","):
        term = raw.strip()
        if not term:
            continue
        desc = term.startswith("-")
        words = term.lstrip("-").split()
        column = words[0].lower()
        if column not in ORDERABLE:
            raise ValueError(f"cannot order samples by {column!r} (choose from {', '.join(sorted(ORDERABLE))})")
        if len(words) > 1:
            desc = words[1].lower() == "desc"
        terms.append(f"{column} {'DESC' if desc else 'ASC'}")
    terms.append("sample_id ASC")
    return " ORDER BY " + ", ".join(terms)


def samples_page(conn: Any, filters: SampleFilter | None, order_by: str | None, offset: int,
                 limit: int) -> list[SampleRow]:
    where, params = where_clause(filters)
    sql = f"SELECT {ROW_COLUMNS} FROM samples{where}{order_clause(order_by)} LIMIT ? OFFSET ?"
    rows = conn.execute(sql, [*params, int(limit), int(offset)]).fetchall()
    return [SampleRow(r[0], r[1], r[2], r[3], bool(r[4]), r[5], r[6], r[7], list(r[8] or []), r[9], r[10], r[11])
            for r in rows]


def count_samples(conn: Any, filters: SampleFilter | None) -> int:
    where, params = where_clause(filters)
    return int(conn.execute(f"SELECT count(*) FROM samples{where}", params).fetchone()[0])


def _percentiles(conn: Any, column: str) -> dict[str, Any]:
    row = conn.execute(
        f"SELECT quantile_disc({column}, 0.5), quantile_disc({column}, 0.9), quantile_disc({column}, 0.99), "
        f"max({column}), avg({column}) FROM samples").fetchone()
    p50, p90, p99, top, mean = row
    return {"p50": p50, "p90": p90, "p99": p99, "max": top, "mean": None if mean is None else round(mean, 1)}


def stats(conn: Any) -> dict[str, Any]:
    one = lambda sql: conn.execute(sql).fetchone()[0]  # noqa: E731
    pairs = lambda sql: {k: v for k, v in conn.execute(sql).fetchall()}  # noqa: E731
    by_code = {}
    for code, severity, n in conn.execute(
            "SELECT code, any_value(severity), count(DISTINCT sample_id) FROM findings GROUP BY code "
            "ORDER BY count(DISTINCT sample_id) DESC, code").fetchall():
        by_code[code] = {"severity": severity, "samples": n}
    return {
        "prompts": one("SELECT count(DISTINCT prompt_id) FROM samples"),
        "samples": one("SELECT count(*) FROM samples"),
        "by_status": {s: 0 for s in ("pending", "approved", "rejected")} | pairs(
            "SELECT status, count(*) FROM samples GROUP BY status"),
        "valid": one("SELECT count(*) FROM samples WHERE valid"),
        "invalid": one("SELECT count(*) FROM samples WHERE NOT valid"),
        "exportable_valid": one("SELECT count(*) FROM samples WHERE valid AND status <> 'rejected'"),
        "truncated": one("SELECT count(*) FROM samples WHERE finish_reason = 'length'"),
        "failures": {"total": one("SELECT count(*) FROM failures"),
                     "by_reason": pairs("SELECT reason, count(*) FROM failures GROUP BY reason ORDER BY 2 DESC")},
        "findings": by_code,
        "runs": one("SELECT count(*) FROM runs"),
        "prompt_len": _percentiles(conn, "prompt_len"),
        "output_len": _percentiles(conn, "output_len"),
    }
