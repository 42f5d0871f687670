"""The store's read-only questions: the sample list's pages and counts, the stats report, runs and their
provenance, and the few distributions the stats screen plots.

Every read runs under the store file's lock (`StoreFile.reading`), so its DuckDB errors become `StoreError`s;
the SQL of the list and of `stats` is in `queries.py`, shared with the exports' reads (`export_rows.py`).
"""

from __future__ import annotations

import re
from typing import Any

from tokview.store import queries
from tokview.store.connection import StoreFile
from tokview.store.errors import StoreError
from tokview.store.sample_rows import SampleFilter, SampleRow, from_json

RUN_FIELDS = (
    "run_id",
    "started",
    "settings",
    "profile",
    "tokenizer_dir",
    "tokenizer_hash",
    "template_hash",
    "server_info",
    "source",
    "profile_def",
)
_JSON_RUN_FIELDS = ("settings", "server_info", "profile_def")
CloserKey = tuple[str | None, str | None]
"""(run id, sample profile): which model's rules a sample follows (`profile_pairs`)."""


class QueryRepository:
    """Reads of one store file that return lists, counts and reports (never a whole sample)."""

    def __init__(self, file: StoreFile) -> None:
        self.file = file

    def samples_page(
        self, filters: SampleFilter | None, order_by: str | None, offset: int, limit: int
    ) -> list[SampleRow]:
        with self.file.reading() as conn:
            return queries.samples_page(conn, filters, order_by, offset, limit)

    def sample_ids_page(self, filters: SampleFilter | None, order_by: str | None, offset: int, limit: int) -> list[str]:
        with self.file.reading() as conn:
            return queries.sample_ids_page(conn, filters, order_by, offset, limit)

    def row_of(self, filters: SampleFilter | None, order_by: str | None, sample_id: str) -> int | None:
        with self.file.reading() as conn:
            return queries.row_of(conn, filters, order_by, sample_id)

    def first_pending_after(
        self, filters: SampleFilter | None, order_by: str | None, index: int, anchor: str | None = None
    ) -> tuple[int, str] | None:
        with self.file.reading() as conn:
            return queries.first_pending_after(conn, filters, order_by, index, anchor)

    def rows_by_ids(self, sample_ids: list[str]) -> dict[str, SampleRow]:
        """The list rows of these samples as stored now, by id (the samples list's rows after a verdict elsewhere)."""
        with self.file.reading() as conn:
            return queries.rows_by_ids(conn, sample_ids)

    def reviews_version(self) -> tuple[Any, ...]:
        """What changes with every verdict, note, tag and undo (each is an action, its rows appended): the samples
        list reads its rows again when it does, so a verdict made elsewhere shows (a cheap read, polled)."""
        return tuple(self.file.query("SELECT (SELECT count(*) FROM actions), (SELECT count(*) FROM verdicts)")[0])

    def count_samples(self, filters: SampleFilter | None) -> int:
        with self.file.reading() as conn:
            return queries.count_samples(conn, filters)

    def stats(self) -> dict[str, Any]:
        with self.file.reading() as conn:
            return queries.stats(conn)

    def tag_counts(self) -> list[tuple[str, int]]:
        """(tag, samples carrying it) for every live tag, tags compared without case (one spelling shown)."""
        return [(r[0], r[1]) for r in self.file.query(queries.TAG_COUNTS)]

    def runs(self) -> list[dict[str, Any]]:
        """Every run's provenance (JSON fields decoded) with its sample and failure counts, oldest first."""
        rows = self.file.query(
            f"SELECT {', '.join('r.' + n for n in RUN_FIELDS)}, "
            "(SELECT count(*) FROM samples s WHERE s.run_id = r.run_id) AS samples, "
            "(SELECT count(*) FROM failures f WHERE f.run_id = r.run_id) AS failures "
            "FROM runs r ORDER BY started, run_id"
        )
        out = []
        for r in rows:
            d = dict(zip((*RUN_FIELDS, "samples", "failures"), r))
            for key in _JSON_RUN_FIELDS:
                try:
                    d[key] = from_json(d[key])
                except ValueError:  # a hand-edited row: one line naming it (it was a JSONDecodeError, exit 70)
                    raise StoreError(
                        f"run {d['run_id']}: its stored {key} is not JSON (the row was edited or damaged)"
                    ) from None
            out.append(d)
        return out

    def run_holds(self, run_id: str, fragment: str, *, turns_only: bool = False) -> bool:
        """Whether the run holds a sample whose id contains `fragment` (a batch's `@SETTINGS_gen`); `turns_only`:
        one of a multi-turn row's turns, whose id has `#turnN` right before it (a one-turn row named like a turn,
        `x#turn1`, gets a `#` more: `core.record.sample_head`)."""
        if turns_only:
            sql = "SELECT 1 FROM samples WHERE run_id = ? AND regexp_matches(sample_id, ?) LIMIT 1"
            return bool(self.file.query(sql, [run_id, "#turn[0-9]+" + re.escape(fragment)]))
        sql = "SELECT 1 FROM samples WHERE run_id = ? AND contains(sample_id, ?) LIMIT 1"
        return bool(self.file.query(sql, [run_id, fragment]))

    def run_ids(self) -> list[str]:
        """Every run id: those with a runs row, then those only samples carry (imported data)."""
        known = [r["run_id"] for r in self.runs()]
        extra = [
            r[0]
            for r in self.file.query("SELECT DISTINCT run_id FROM samples WHERE run_id IS NOT NULL ORDER BY 1")
            if r[0] not in known
        ]
        return known + extra

    def stored_conversations(self) -> list[tuple[str, list[dict[str, Any]], list[dict[str, Any]] | None]]:
        """One conversation per prompt id already in the store (to sample it again): the messages its latest turn was
        generated from (a chain's whole history so far: any one turn's, taken at random, was often only the first
        user message) and the tools that turn declared (without them a prompt made to call tools was sampled as
        one that has none, and answered in plain text)."""
        rows = self.file.query(  # one struct: arg_max skips a NULL value, so the tools came from an earlier turn
            "SELECT prompt_id, arg_max(struct_pack(m := messages, t := json_extract(settings, '$.tools')), "
            "(coalesce(turn, 0), created_at)) AS latest "
            "FROM samples WHERE messages IS NOT NULL GROUP BY prompt_id ORDER BY prompt_id"
        )
        out = []
        for pid, latest in rows:
            messages, tools = latest["m"], latest["t"]
            if not messages:
                continue
            declared = from_json(tools) if tools else None
            out.append((pid, from_json(messages), declared if isinstance(declared, list) and declared else None))
        return out

    def length_distribution(
        self, close_id: int | None, limit: int, close_ids: dict[CloserKey, int | None]
    ) -> tuple[list[int], list[int]]:
        """(output lengths, reasoning lengths = ids before the first closer); see `Store.length_distribution`."""
        pairs = list(close_ids.items())
        table = (
            ", ".join(["(?::VARCHAR, ?::VARCHAR, ?::BIGINT)"] * len(pairs))
            or "(NULL::VARCHAR, NULL::VARCHAR, NULL::BIGINT)"
        )
        rows = self.file.query(
            f"WITH closers(run_id, profile, close_id) AS (VALUES {table}) "
            "SELECT s.output_len, coalesce(list_position(s.output_ids, coalesce(c.close_id, ?)), 0) FROM samples s "
            "LEFT JOIN closers c ON c.run_id IS NOT DISTINCT FROM s.run_id AND c.profile IS NOT DISTINCT FROM s.profile "
            "LIMIT ?",
            [
                *(v for (run_id, profile), cid in pairs for v in (run_id, profile, -1 if cid is None else cid)),
                close_id if close_id is not None else -1,
                limit,
            ],
        )
        return [r[0] for r in rows], [r[1] - 1 for r in rows if r[1]]

    def profile_pairs(self) -> list[CloserKey]:
        """Every (run id, sample profile) the samples carry: what decides which model's rules a sample follows."""
        return [(r[0], r[1]) for r in self.file.query("SELECT DISTINCT run_id, profile FROM samples ORDER BY 1, 2")]

    def finish_reasons(self) -> dict[str, int]:
        """How many samples ended for each reason (`none` for a capture that recorded none), most first."""
        return {
            str(k): v
            for k, v in self.file.query(
                "SELECT coalesce(finish_reason, 'none'), count(*) FROM samples GROUP BY 1 ORDER BY 2 DESC"
            )
        }

    def finding_codes(self) -> list[str]:
        """Every finding code any stored sample has, sorted."""
        return [r[0] for r in self.file.query("SELECT DISTINCT code FROM findings ORDER BY code")]
