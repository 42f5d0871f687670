"""The samples, runs and failures of one store: written one at a time (a sample with its findings, a run's
provenance, failed requests) and read back whole (the detail view, exports, a batch's resume).

Batches do not write samples here: they write parts (`part_sink.py`) that `landing.py` lands. What is written
here is what a command writes itself (`tokview audit`, imports, tests) and each write is one transaction.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from tokview.core.findings import Finding
from tokview.secrets import Secrets, known_secrets, scrub_optional, scrub_text
from tokview.store import queries
from tokview.store.connection import Statement, StoreFile
from tokview.store.part_sink import PartSink
from tokview.store.prompt_refs import whole_prompts
from tokview.store.sample_rows import (
    ALIGN_STATUS,
    SAMPLE_COLUMNS,
    StoredSample,
    UnknownSample,
    capture_from_row,
    metadata_json,
    servers_union,
    to_json,
)

_INSERT = f"INSERT INTO samples ({', '.join(SAMPLE_COLUMNS)}) VALUES ({', '.join('?' * len(SAMPLE_COLUMNS))})"
_UPSERT = (
    _INSERT
    + " ON CONFLICT (sample_id) DO UPDATE SET "
    + ", ".join(f"{c} = EXCLUDED.{c}" for c in SAMPLE_COLUMNS if c != "sample_id")
)
_RUN_COLUMNS = (
    "run_id, started, settings, profile, tokenizer_dir, tokenizer_hash, template_hash, server_info, source, profile_def"
)
_PUT_RUN = (
    f"INSERT INTO runs ({_RUN_COLUMNS}) VALUES (?, now(), ?, ?, ?, ?, ?, ?, ?, ?) ON CONFLICT (run_id) DO UPDATE SET "
    + ", ".join(f"{c} = EXCLUDED.{c}" for c in _RUN_COLUMNS.split(", ") if c not in ("run_id", "started"))
)
_HISTORY = ("seq", "at", "who", "kind", "status", "reason", "note", "tags", "undone", "override")
_FAILURE_FIELDS = ("prompt_id", "sample_id", "run_id", "reason", "server", "at", "attempts")


@dataclass(frozen=True)
class RunProvenance:
    """Where a run's samples come from: its settings, model profile, tokenizer and servers."""

    settings: dict[str, Any] | None = None
    profile: str | None = None
    tokenizer_dir: str | None = None
    tokenizer_hash: str | None = None
    template_hash: str | None = None
    server_info: list[Any] | None = None
    source: str | None = None
    profile_def: dict[str, Any] | None = None
    """The profile's fields (`profiles.profile_fields`), so a profile read from a .toml file is the one `show`,
    the app and exports analyse the run's samples with, not a guess."""


class SampleRepository:
    """Writes and whole-sample reads of one store file; `sink` holds the server credentials to mask."""

    def __init__(self, file: StoreFile, sink: PartSink) -> None:
        self.file = file
        self.sink = sink

    # -- writes -------------------------------------------------------------------------------------------
    def put_run(self, run_id: str, run: RunProvenance) -> None:
        """Record (or refresh) a run's provenance: what the manifest of an export reports."""
        row = [
            run_id,
            to_json(run.settings, known_secrets(self.sink.secrets)),
            run.profile,
            run.tokenizer_dir,
            run.tokenizer_hash,
            run.template_hash,
            metadata_json(run.server_info),
            run.source,
            metadata_json(run.profile_def),
        ]
        with self.file.connection():  # the servers it met before stay listed (`servers_union`)
            stored = self.file.query("SELECT server_info FROM runs WHERE run_id = ?", [run_id])
            if stored:
                row[6] = servers_union(stored[0][0], row[6])
            self.file.write([(_PUT_RUN, row)])

    def put_sample(self, record: dict[str, Any], *, new: bool | None) -> None:
        """Write one sample (a `PartSink.sample_record`: its columns and findings) atomically; see
        `Store.put_sample` for `new`."""
        sample_id = record["sample_id"]
        with self.file.connection():  # one open file: the check and the write see the same state
            exists = (not new) and (
                new is False or bool(self.file.query("SELECT 1 FROM samples WHERE sample_id = ?", [sample_id]))
            )
            statements: list[Statement] = [(_UPSERT if exists else _INSERT, [record[c] for c in SAMPLE_COLUMNS])]
            if exists:
                statements.append(("DELETE FROM findings WHERE sample_id = ?", [sample_id]))
            statements.append(("DELETE FROM failures WHERE sample_id = ?", [sample_id]))
            statements.append(("DELETE FROM failure_attempts WHERE sample_id = ?", [sample_id]))
            if record["findings"]:
                statements.append(_findings_statement(sample_id, record["findings"]))
            self.file.write(statements)

    def put_failures(self, failures: list[dict[str, Any]]) -> None:
        """Record failed requests in one transaction: one current failure per sample id (the latest
        reason), its `failure_attempts` count going up by one per recorded attempt."""
        statements: list[Statement] = []
        for f in failures:
            sid = f.get("sample_id")
            if sid is not None:
                statements += [
                    (
                        "INSERT INTO failure_attempts VALUES (?, 1) ON CONFLICT (sample_id) DO UPDATE SET "
                        "attempts = failure_attempts.attempts + 1",
                        [sid],
                    ),
                    ("DELETE FROM failures WHERE sample_id = ?", [sid]),
                ]
            statements.append(
                (
                    'INSERT INTO failures (prompt_id, sample_id, run_id, reason, "at", server) '
                    "VALUES (?, ?, ?, ?, now(), ?)",
                    [
                        f.get("prompt_id"),
                        sid,
                        f.get("run_id"),
                        scrub_text(str(f.get("reason") or ""), Secrets.of(list(self.sink.secrets))),
                        scrub_optional(f.get("server")),
                    ],
                )
            )
        if statements:
            self.file.write(statements)

    # -- reads --------------------------------------------------------------------------------------------
    def load_sample(self, sample_id: str) -> StoredSample:
        """One sample in full: its capture, findings and review history (notes and tags as they stand)."""
        with self.file.reading() as conn:
            cur = conn.execute("SELECT * FROM samples WHERE sample_id = ?", [sample_id])
            names = [d[0] for d in cur.description or ()]
            found = cur.fetchone()
            if found is None:
                raise UnknownSample(sample_id)
            row = dict(zip(names, found))
            whole_prompts(self.file, [row])
            findings = [
                Finding(c, s, d, tuple(p or ()))
                for c, s, d, p in self.file.query(
                    "SELECT code, severity, detail, positions FROM findings WHERE sample_id = ? ORDER BY rowid",
                    [sample_id],
                )
            ]
            history = [
                dict(zip(_HISTORY, h))
                for h in self.file.query(
                    'SELECT seq, "at", who, kind, status, reason, note, tags, undone, '
                    "override FROM verdicts WHERE sample_id = ? ORDER BY seq",
                    [sample_id],
                )
            ]
        return _stored_sample(row, findings, history)

    def rows_for(
        self, sample_ids: list[str] | tuple[str, ...], where: tuple[str, list[Any]] | None = None
    ) -> list[dict[str, Any]]:
        """Full rows (ids, text, settings) for these samples, in the order asked: what exports read. `where` (a
        `Selection.where` clause and its parameters): only the samples matching it as they are read (a sample
        reviewed otherwise since it was selected is not read)."""
        if not sample_ids:
            return []
        clause, params = where if where is not None else ("TRUE", [])
        with self.file.reading() as conn:
            listed, ids = queries.ids_in(sample_ids)
            cur = conn.execute(f"SELECT s.* FROM samples s WHERE {listed} AND ({clause})", [*ids, *params])
            names = [d[0] for d in cur.description or ()]
            by_id = {r[0]: dict(zip(names, r)) for r in cur.fetchall()}
            whole_prompts(self.file, list(by_id.values()))
        return [by_id[i] for i in sample_ids if i in by_id]

    def failures(self, run_id: str | None = None) -> list[dict[str, Any]]:
        """The current failures (one per sample id, the latest reason) with how many attempts failed."""
        where, params = ("WHERE f.run_id = ?", [run_id]) if run_id else ("", [])
        rows = self.file.query(
            f'SELECT f.prompt_id, f.sample_id, f.run_id, coalesce(f.reason, {queries.NO_REASON}), f.server, f."at", '
            "coalesce(a.attempts, 1) FROM failures f LEFT JOIN failure_attempts a USING (sample_id) "
            f'{where} ORDER BY f.prompt_id, f.sample_id, f."at"',
            params,
        )
        return [dict(zip(_FAILURE_FIELDS, r)) for r in rows]

    def existing_sample_ids(self, ids: Iterable[str]) -> set[str]:
        """The subset of `ids` already stored: the anti-join that makes re-runs resume."""
        wanted = list(dict.fromkeys(ids))
        if not wanted:
            return set()
        rows = self.file.query(
            "SELECT s.sample_id FROM samples s JOIN (SELECT unnest(?::VARCHAR[]) AS id) q ON s.sample_id = q.id",
            [wanted],
        )
        return {r[0] for r in rows}

    def stored_prompts_with(self, fragment: str, each: Callable[[str, str], None]) -> None:
        """`each(prompt id, messages JSON)` for every stored single-turn sample whose id contains `fragment`, read a
        batch at a time (a store of long prompts holds gigabytes of them: never all at once). A callback, not a
        generator: one left suspended held the store's lock and shared connection (another query cut it short)."""
        with self.file.reading() as conn:
            cursor = conn.execute(
                "SELECT prompt_id, messages FROM samples WHERE turn IS NULL AND messages IS NOT NULL"
                " AND contains(sample_id, ?)",
                [fragment],
            )
            while rows := cursor.fetchmany(PROMPTS_BATCH):
                for prompt_id, messages in rows:
                    each(str(prompt_id), str(messages))

    def stored_ids_with(self, fragment: str) -> set[str]:
        """Every stored sample id that contains `fragment`: one query returning one column."""
        with self.file.reading() as conn:
            empty = conn.execute("SELECT NOT EXISTS (SELECT 1 FROM samples)").fetchone()
            if empty is None or empty[0]:
                return set()  # a new store: no numpy import (~60 ms of a short run's start-up)
            column = conn.execute("SELECT sample_id FROM samples WHERE contains(sample_id, ?)", [fragment]).fetchnumpy()
            return set(column["sample_id"].tolist())


PROMPTS_BATCH = 2_000
"""Stored prompts `stored_prompts_with` reads at once."""


def _findings_statement(sample_id: str, findings: list[dict[str, Any]]) -> Statement:
    """One INSERT of a sample's findings (code, severity, detail, positions), their list passed as one parameter."""
    return (
        "INSERT INTO findings SELECT ?, f.code, f.severity, f.detail, f.positions FROM "
        "(SELECT unnest(?::STRUCT(code VARCHAR, severity VARCHAR, detail VARCHAR, positions INTEGER[])[])"
        " AS f)",
        [sample_id, findings],
    )


def _stored_sample(row: dict[str, Any], findings: list[Finding], history: list[dict[str, Any]]) -> StoredSample:
    """A samples row, its findings and its verdict rows as one `StoredSample`: its notes and tags are those of
    the rows not undone (the tags of its notes and of its latest live verdict)."""
    live = [h for h in history if h["kind"] == "verdict" and not h["undone"]]
    notes_live = [h for h in history if h["kind"] == "note" and not h["undone"]]
    tags = queries.caseless_tags(t for h in notes_live + live[-1:] for t in (h["tags"] or []))
    return StoredSample(
        sample_id=row["sample_id"],
        prompt_id=row["prompt_id"],
        run_id=row["run_id"],
        capture=capture_from_row(row),
        findings=findings,
        status=row["status"],
        valid=bool(row["valid"]),
        n_errors=row["n_errors"],
        notes=[h["note"] for h in history if h["note"] and not h["undone"]],
        tags=tags,
        history=history,
        turn=row["turn"],
        gen_index=row["gen_index"],
        profile=row["profile"],
        alignment=None if row["alignment"] is None else [ALIGN_STATUS.get(ch, "?") for ch in row["alignment"]],
        created_at=row["created_at"],
    )
