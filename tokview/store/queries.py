"""Read-side SQL: the sample list, counts and the numbers `tokview stats` prints.

The list view reads only light columns (ids, status, lengths, the denormalised `codes` list), so a
page of 100,000 samples is a column scan, never a join or a fetch of id arrays.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from tokview.store.sample_rows import SampleFilter, SampleRow

if TYPE_CHECKING:
    from duckdb import DuckDBPyConnection

NO_REASON = "'(no reason recorded)'"
"""SQL for a failure that holds no reason (an older part landed it so): named, never a NULL to trip on."""

INT64_MAX = 2**63 - 1
"""The largest LIMIT or OFFSET DuckDB takes: a larger one from the command line means "all"."""

ORDERABLE = {
    "created_at",
    "sample_id",
    "prompt_id",
    "run_id",
    "status",
    "finish_reason",
    "prompt_len",
    "output_len",
    "n_errors",
    "valid",
    "acceptance_length",
    "mean_nll",
}
ROW_COLUMNS = (
    "sample_id, prompt_id, run_id, status, valid, finish_reason, prompt_len, output_len, codes, n_errors, "
    "acceptance_length, mean_nll"
)


@dataclass(frozen=True)
class ListFilter(SampleFilter):
    """The list's filter: a `SampleFilter` and a tag (any case), as `tokview review --with-tag` selects."""

    tag: str | None = None


@dataclass(frozen=True)
class TaggedRow(SampleRow):
    """A list row with the sample's live tags (one spelling each, as `caseless_tags`)."""

    tags: tuple[str, ...] = ()


def where_clause(filters: SampleFilter | None) -> tuple[str, list[Any]]:
    f = filters or SampleFilter()
    parts: list[str] = []
    params: list[Any] = []
    tag = getattr(f, "tag", None)
    if tag:
        parts.append(f"sample_id IN (SELECT DISTINCT v.sample_id FROM verdicts v WHERE {HAS_TAG} AND {LIVE_TAG_ROWS})")
        params.append(tag)
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
        clause, values = text_search(f.text)
        parts.append(clause)
        params.extend(values)
    return (" WHERE " + " AND ".join(parts)) if parts else "", params


SEARCHED_COLUMNS = ("sample_id", "prompt_id", "content", "reasoning", "text", "tool_calls_text")
"""`text` is the only answer a raw-mode capture keeps; `tool_calls_text` the answer's calls (tool_call_text.py)."""
PROMPT_TEXT = (
    "array_to_string(list_filter(json_extract_string(messages, '$[*].content'), "
    "lambda c: NOT starts_with(c, '[{\"type\"')), chr(10)) || chr(10) || "
    "array_to_string(json_extract_string(messages, '$[*].content[*].text'), chr(10))"
)
"""The prompt's text: each turn's content string, and the text of content given as parts (whose JSON, which
`$[*].content` also returns, is left out). Never the JSON itself: "user" or "role" would find every sample."""
LIVE_NOTES_AND_TAGS = (
    "sample_id IN (SELECT v.sample_id FROM verdicts v WHERE NOT v.undone AND (v.note ILIKE ? ESCAPE '\\' "
    "OR (array_to_string(v.tags, chr(31)) ILIKE ? ESCAPE '\\' AND (v.kind = 'note' OR v.seq = "
    "(SELECT max(w.seq) FROM verdicts w WHERE w.sample_id = v.sample_id AND w.kind = 'verdict' AND NOT w.undone)))))"
)
"""A sample whose live notes or tags hold the text, as `load_sample` reads them: every note not undone, the tags
of notes not undone and of the latest verdict not undone (tags joined by a character nobody types)."""


HAS_TAG = "list_contains(list_transform(coalesce(v.tags, []), lambda t: lower(t)), lower(?))"
"""A verdict row `v` carries the tag (one parameter), compared without case."""
LIVE_TAG_ROWS = (
    "NOT v.undone AND (v.kind = 'note' OR (v.sample_id, v.seq) IN "
    "(SELECT w.sample_id, max(w.seq) FROM verdicts w WHERE w.kind = 'verdict' AND NOT w.undone GROUP BY 1))"
)
"""The verdict rows whose tags are the sample's: live notes and the latest live verdict (as `load_sample`).
One grouping of the live verdicts, joined: the correlated `max(w.seq)` per row it was took twice as long (a tag
filter over 680,000 verdict rows)."""
TAG_COUNTS = (
    "SELECT min(t) AS tag, count(DISTINCT v.sample_id) FROM verdicts v, unnest(v.tags) AS u(t) "
    f"WHERE {LIVE_TAG_ROWS} GROUP BY lower(t) ORDER BY lower(min(t))"
)


def sql_lower(text: str) -> str:
    """`text` in lower case as DuckDB's `lower` writes it, which every tag comparison in SQL uses: one character for
    one (Python's full mapping writes 'İ' as two, 'i̇', and a final 'Σ' as 'ς'; DuckDB writes 'i' and 'σ')."""
    return "".join("i" if ch == "\u0130" else ch.lower() for ch in text)


def caseless_tags(tags: Iterable[str]) -> list[str]:
    """Tags compared without case, as SQL compares them (`sql_lower`): one spelling each (the smallest, as
    `TAG_COUNTS` picks), sorted without case."""
    seen: dict[str, str] = {}
    for tag in tags:
        seen[sql_lower(tag)] = min(seen.get(sql_lower(tag), tag), tag)
    return sorted(seen.values(), key=sql_lower)


def like_pattern(text: str) -> str:
    """A case-insensitive substring pattern for ILIKE … ESCAPE '\\': `_` and `%` are literal (a pasted
    sample id holds `_`, and ILIKE has no escape character unless told)."""
    return "%" + text.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_") + "%"


def text_search(text: str) -> tuple[str, list[Any]]:
    """The search box's condition: ids, the answer fields, the prompt's text, the notes and the tags.

    The prompt is stored as JSON: a plain ILIKE on it (its text JSON-escaped) goes first, so the turns are
    read out of the JSON only for the few samples that can match (100,000 prompts: ~0.05 s, not ~0.2 s)."""
    like = like_pattern(text)
    escaped = like_pattern(json.dumps(text, ensure_ascii=False)[1:-1])
    columns = [f"{c} ILIKE ? ESCAPE '\\'" for c in SEARCHED_COLUMNS]
    prompt = f"(messages ILIKE ? ESCAPE '\\' AND {PROMPT_TEXT} ILIKE ? ESCAPE '\\')"
    clause = "(" + " OR ".join([*columns, prompt, LIVE_NOTES_AND_TAGS]) + ")"
    return clause, [*([like] * len(columns)), escaped, like, like, like]


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


def sample_ids_page(
    conn: DuckDBPyConnection, filters: SampleFilter | None, order_by: str | None, offset: int, limit: int
) -> list[str]:
    """The ids of rows `offset`… of the list, in its order, nothing else: what `M` marks (a range read page by page
    with every row and its tags took 54 s over 169,000 rows, on the UI thread)."""
    where, params = where_clause(filters)
    sql = f"SELECT sample_id FROM samples{where}{order_clause(order_by)} LIMIT ? OFFSET ?"
    rows = conn.execute(sql, [*params, min(int(limit), INT64_MAX), min(int(offset), INT64_MAX)]).fetchall()
    return [r[0] for r in rows]


def row_of(conn: DuckDBPyConnection, filters: SampleFilter | None, order_by: str | None, sample_id: str) -> int | None:
    """The row index of `sample_id` in the list, in its order; None when the filters leave it out."""
    where, params = where_clause(filters)
    order = order_clause(order_by).removeprefix(" ORDER BY ")
    listed = f"SELECT sample_id, row_number() OVER (ORDER BY {order}) - 1 AS n FROM samples{where}"
    row = conn.execute(f"SELECT n FROM ({listed}) WHERE sample_id = ?", [*params, sample_id]).fetchone()
    return int(row[0]) if row else None


def first_pending_after(
    conn: DuckDBPyConnection,
    filters: SampleFilter | None,
    order_by: str | None,
    index: int,
    anchor: str | None = None,
) -> tuple[int, str] | None:
    """(row index, sample id) of the first pending sample after row `index` in list order, in one query (`]`: a walk
    page by page took 85 s to reach a pending sample 120,000 rows down).

    `anchor`: the sample the user is on, whose verdict may have moved it (sorted by status) or taken it out of the
    list (filtered to pending) since it was row `index`. Counted from `index` alone, the search skipped the pending
    sample that took that row. Where it went says where the rows after it are now: gone, or sorted further down
    (rejected), the rows after it moved up one, so the search starts at `index`; sorted further up (approved) or
    where it was, they did not, and it starts after `index`. The anchor itself is never the answer."""
    where, params = where_clause(filters)
    order = order_clause(order_by).removeprefix(" ORDER BY ")
    listed = f"SELECT sample_id, status, row_number() OVER (ORDER BY {order}) - 1 AS n FROM samples{where}"
    at = min(int(index), INT64_MAX - 1)
    if anchor is None:
        sql = f"SELECT n, sample_id FROM ({listed}) WHERE n > ? AND status = 'pending' ORDER BY n LIMIT 1"
        row = conn.execute(sql, [*params, at]).fetchone()
        return (int(row[0]), str(row[1])) if row else None
    sql = (
        f"WITH listed AS ({listed}), here AS (SELECT max(n) AS n FROM listed WHERE sample_id = ?) "
        "SELECT l.n, l.sample_id FROM listed l, here h WHERE l.n >= CASE WHEN h.n IS NULL OR h.n > ? THEN ? "
        "ELSE ? + 1 END AND l.status = 'pending' AND l.sample_id <> ? ORDER BY l.n LIMIT 1"
    )
    row = conn.execute(sql, [*params, anchor, at, at, at, anchor]).fetchone()
    return (int(row[0]), str(row[1])) if row else None


def samples_page(
    conn: DuckDBPyConnection, filters: SampleFilter | None, order_by: str | None, offset: int, limit: int
) -> list[SampleRow]:
    where, params = where_clause(filters)
    sql = f"SELECT {ROW_COLUMNS} FROM samples{where}{order_clause(order_by)} LIMIT ? OFFSET ?"
    rows = conn.execute(sql, [*params, min(int(limit), INT64_MAX), min(int(offset), INT64_MAX)]).fetchall()
    return _tagged_rows(conn, rows)


def rows_by_ids(conn: DuckDBPyConnection, sample_ids: list[str]) -> dict[str, SampleRow]:
    """These samples' list rows as they are now (a verdict made elsewhere changed some): id -> row."""
    if not sample_ids:
        return {}
    sql = f"SELECT {ROW_COLUMNS} FROM samples WHERE sample_id IN (SELECT unnest(?::VARCHAR[]))"
    return {row.sample_id: row for row in _tagged_rows(conn, conn.execute(sql, [sample_ids]).fetchall())}


def _tagged_rows(conn: DuckDBPyConnection, rows: list[Any]) -> list[SampleRow]:
    tags = page_tags(conn, [r[0] for r in rows])
    return [
        TaggedRow(
            sample_id=r[0],
            prompt_id=r[1],
            run_id=r[2],
            status=r[3],
            valid=bool(r[4]),
            finish_reason=r[5],
            prompt_len=r[6],
            output_len=r[7],
            codes=list(r[8] or []),
            n_errors=r[9],
            acceptance_length=r[10],
            mean_nll=r[11],
            tags=tuple(tags.get(r[0], ())),
        )
        for r in rows
    ]


def page_tags(conn: DuckDBPyConnection, sample_ids: list[str]) -> dict[str, list[str]]:
    """sample id -> its live tags, for one page of the list (one query over the page's ids)."""
    if not sample_ids:
        return {}
    # The page's own verdict rows first, then their latest live verdict: with LIVE_TAG_ROWS DuckDB groups and
    # unnests the whole verdicts table for every page (0.45-0.8 s a page at 680,000 verdict rows; 14 ms this way).
    rows = conn.execute(
        "WITH page AS (SELECT unnest(?::VARCHAR[]) AS sid), "
        "mine AS (SELECT * FROM verdicts WHERE sample_id IN (SELECT sid FROM page) AND NOT undone), "
        "latest AS (SELECT sample_id, max(seq) AS seq FROM mine WHERE kind = 'verdict' GROUP BY 1) "
        "SELECT m.sample_id, list(t) FROM mine m LEFT JOIN latest l USING (sample_id), unnest(m.tags) AS u(t) "
        "WHERE m.kind = 'note' OR m.seq = l.seq GROUP BY 1",
        [sample_ids],
    ).fetchall()
    return {sid: caseless_tags(tags) for sid, tags in rows}


def count_samples(conn: DuckDBPyConnection, filters: SampleFilter | None) -> int:
    where, params = where_clause(filters)
    return int(one_row(conn, f"SELECT count(*) FROM samples{where}", params)[0])


def one_row(conn: DuckDBPyConnection, sql: str, params: list[Any] | None = None) -> tuple[Any, ...]:
    """The one row an aggregate query (count, max, a FILTER list) returns."""
    row = conn.execute(sql, params or []).fetchone()
    if row is None:  # never for an aggregate: a query that is not one
        raise LookupError(f"no row from {sql[:80]}")
    return row


def _percentiles(values: list[Any] | None, top: float | None, mean: float | None) -> dict[str, Any]:
    p50, p90, p99 = values if values else (None, None, None)
    return {"p50": p50, "p90": p90, "p99": p99, "max": top, "mean": None if mean is None else round(mean, 1)}


def stats(conn: DuckDBPyConnection) -> dict[str, Any]:
    """Everything `tokview stats` prints, in few scans: one pass over the light sample columns for
    the counts and percentiles (a million samples in ~0.1 s), one GROUP BY for distinct prompts."""

    def one(sql: str) -> int:
        """A count."""
        return int(one_row(conn, sql)[0])

    def pairs(sql: str) -> dict[str, int]:
        """A name → count GROUP BY."""
        return {k: v for k, v in conn.execute(sql).fetchall()}

    by_code = {}
    for code, severity, n in conn.execute(
        "SELECT code, any_value(severity), count(DISTINCT sample_id) FROM findings GROUP BY code "
        "ORDER BY count(DISTINCT sample_id) DESC, code"
    ).fetchall():
        by_code[code] = {"severity": severity, "samples": n}
    truncated = by_code["truncated"]["samples"] if "truncated" in by_code else 0  # (not finish_reason length: a
    # stop id at the limit is a whole turn, which SGLang says `length` for)
    (samples, valid, invalid, exportable, p_q, p_max, p_mean, o_q, o_max, o_mean) = one_row(
        conn,
        "SELECT count(*), count(*) FILTER (WHERE valid), count(*) FILTER (WHERE NOT valid), "
        "count(*) FILTER (WHERE valid AND status <> 'rejected'), "
        "quantile_disc(prompt_len, [0.5, 0.9, 0.99]), max(prompt_len), avg(prompt_len), "
        "quantile_disc(output_len, [0.5, 0.9, 0.99]), max(output_len), avg(output_len) FROM samples",
    )
    return {
        "prompts": one("SELECT count(*) FROM (SELECT prompt_id FROM samples GROUP BY prompt_id)"),
        # a store of failures alone said `prompts 0` above `failures 10`
        "prompts_failed_only": one(
            "SELECT count(*) FROM (SELECT DISTINCT prompt_id FROM failures WHERE prompt_id NOT IN "
            "(SELECT prompt_id FROM samples))"
        ),
        "samples": samples,
        "by_status": {s: 0 for s in ("pending", "approved", "rejected")}
        | pairs("SELECT status, count(*) FROM samples GROUP BY status"),
        "valid": valid,
        "invalid": invalid,
        "exportable_valid": exportable,
        "truncated": truncated,
        "failures": {
            "total": one("SELECT count(*) FROM failures"),
            "by_reason": pairs(
                f"SELECT coalesce(reason, {NO_REASON}) AS r, count(*) FROM failures GROUP BY r ORDER BY 2 DESC"
            ),
        },
        "findings": by_code,
        "runs": one("SELECT count(*) FROM runs"),
        "prompt_len": _percentiles(p_q, p_max, p_mean),
        "output_len": _percentiles(o_q, o_max, o_mean),
    }


def ids_in(sample_ids: Sequence[str], column: str = "s.sample_id") -> tuple[str, list[Any]]:
    """(`column IN (SELECT unnest(?))`, its parameter) for one chunk of ids: what an export reads chunk by chunk.
    DuckDB hashes the chunk's ids and probes them as it scans the column. Measured on DuckDB 2.0 (256 ids a chunk,
    1,300 ids a row): 25,000 samples read in 4.4 s, 100,000 in 19 s; a list of 256 constants, evaluated against
    every row, took 8.0 s and 75 s (superlinear: each chunk's scan grows with the store). An inner join with the
    unnested array once hashed the whole table for every chunk (a 169,000-sample export spent 54 s there); an
    IN subquery always builds on the subquery."""
    ids = list(sample_ids)
    if not ids:
        return "FALSE", []
    return f"{column} IN (SELECT unnest(?::VARCHAR[]))", [ids]
