"""The DuckDB store: one file holds every run, sample, finding, failure and verdict.

DuckDB allows one writer per process, and the UI calls the store from worker threads while a batch
may be writing in the same process; so the store owns exactly one connection and serialises every
use of it with a lock. Writes are short transactions (one sample with its findings at a time), so a
kill at any moment loses at most the samples whose requests were still in flight.
"""

from __future__ import annotations

import threading
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterable, Iterator, Sequence

import duckdb

from tokview.core.findings import Finding
from tokview.core.record import Capture
from tokview.store import queries
from tokview.store.records import (ALIGN_STATUS, SAMPLE_COLUMNS, STATUSES, SampleFilter, SampleRow, StoredSample,
                                   UnknownSample, capture_from_row, from_json, known_secrets, metadata_json,
                                   sample_params, scrub_optional, scrub_text, to_json, url_secrets)
from tokview.store.schema import migrate

DEFAULT_DB = "tokview.duckdb"
_INSERT = f"INSERT INTO samples ({', '.join(SAMPLE_COLUMNS)}) VALUES ({', '.join('?' * len(SAMPLE_COLUMNS))})"
_UPSERT = (_INSERT + " ON CONFLICT (sample_id) DO UPDATE SET "
           + ", ".join(f"{c} = EXCLUDED.{c}" for c in SAMPLE_COLUMNS if c != "sample_id"))


class StoreError(ValueError):
    """The database cannot be opened, read or written (locked, not DuckDB, disk full, unwritable COPY target…)."""


@contextmanager
def _duckdb_errors(what: str) -> Iterator[None]:
    """Turn a DuckDB error into a one-line StoreError: callers and the CLI never see duckdb's types."""
    try:
        yield
    except duckdb.Error as exc:
        first = scrub_text(str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__)
        raise StoreError(f"{what}: {first}") from None


class Store:
    """Open (create, migrate) a tokview DuckDB file; `":memory:"` for a throwaway store.

    `server_urls`: the URLs the captures come from (may hold `user:password@`); their credentials
    are masked wherever they appear in a stored payload (`add_server_urls` adds more later)."""

    def __init__(self, path: str | Path = DEFAULT_DB, server_urls: Iterable[str] = ()) -> None:
        self.path = str(path)
        self._secrets: tuple[str, ...] = ()
        self.add_server_urls(server_urls)
        if self.path != ":memory:":
            Path(self.path).expanduser().parent.mkdir(parents=True, exist_ok=True)
        try:
            self._conn = duckdb.connect(self.path)
        except (duckdb.IOException, duckdb.Error) as exc:
            first = str(exc).strip().splitlines()[0]
            raise StoreError(f"cannot open database {self.path}: {first}") from None
        self._lock = threading.RLock()
        with self._lock, _duckdb_errors(f"cannot migrate database {self.path}"):
            migrate(self._conn)

    def add_server_urls(self, urls: Iterable[str]) -> None:
        """Mask these URLs' user names and passwords in every payload written from now on."""
        self._secrets = tuple(dict.fromkeys([*self._secrets, *(v for u in urls for v in url_secrets(u))]))

    # -- lifecycle --------------------------------------------------------------------------
    def close(self) -> None:
        with self._lock:
            if self._conn is not None:
                self._conn.close()
                self._conn = None  # type: ignore[assignment]

    def __enter__(self) -> "Store":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def _tx(self, statements: Iterable[tuple[str, Sequence[Any]]]) -> None:
        with self._lock, _duckdb_errors(f"cannot write to {self.path}"):
            self._conn.execute("BEGIN TRANSACTION")
            try:
                for sql, params in statements:
                    self._conn.execute(sql, list(params))
                self._conn.execute("COMMIT")
            except BaseException:
                self._conn.execute("ROLLBACK")
                raise

    def query(self, sql: str, params: Sequence[Any] = ()) -> list[tuple]:
        """Run read-only SQL under the store's lock (exports and reports use it)."""
        with self._lock, _duckdb_errors(f"cannot read {self.path}"):
            return self._conn.execute(sql, list(params)).fetchall()

    def execute(self, sql: str, params: Sequence[Any] = ()) -> None:
        """Run one statement under the lock (e.g. DuckDB's `COPY … TO` for Parquet exports)."""
        with self._lock, _duckdb_errors("database statement failed"):
            self._conn.execute(sql, list(params))

    # -- writes -----------------------------------------------------------------------------
    def put_run(self, run_id: str, *, settings: dict | None = None, profile: str | None = None,
                tokenizer_dir: str | None = None, tokenizer_hash: str | None = None,
                template_hash: str | None = None, server_info: list | None = None, source: str | None = None) -> None:
        """Record (or refresh) a run's provenance: what the manifest of an export reports."""
        self._tx([(
            "INSERT INTO runs VALUES (?, now(), ?, ?, ?, ?, ?, ?, ?) ON CONFLICT (run_id) DO UPDATE SET "
            "settings = EXCLUDED.settings, profile = EXCLUDED.profile, tokenizer_dir = EXCLUDED.tokenizer_dir, "
            "tokenizer_hash = EXCLUDED.tokenizer_hash, template_hash = EXCLUDED.template_hash, "
            "server_info = EXCLUDED.server_info, source = EXCLUDED.source",
            [run_id, to_json(settings, known_secrets(self._secrets)), profile, tokenizer_dir, tokenizer_hash, template_hash,
             metadata_json(server_info), source])])

    def put_sample(self, sample_id: str, prompt_id: str, run_id: str | None, capture: Capture, analysis: Any, *,
                   gen_index: int | None = None, turn: int | None = None, profile: str | None = None,
                   new: bool | None = None) -> None:
        """Write one sample and its findings atomically; re-writing keeps its review status.

        `new=True` says the caller knows the id is not stored yet (the batch runner's anti-join did
        the check for every planned id): a plain INSERT, about half the cost of DuckDB's upsert, and
        no lookup. `None` looks it up; a re-written sample takes the upsert and loses its old findings.
        Earlier failures of the same sample id (a resumed run that now succeeded) go in the same
        transaction: stats and errors.jsonl list only requests that are still missing.
        """
        params = sample_params(sample_id, prompt_id, run_id, capture, analysis, gen_index, turn, profile,
                               self._secrets)
        with self._lock:  # re-entrant: the check and the write see the same state
            exists = (not new) and (new is False or bool(self.query(
                "SELECT 1 FROM samples WHERE sample_id = ?", [sample_id])))
            statements: list[tuple[str, Sequence[Any]]] = [(_UPSERT if exists else _INSERT, params)]
            if exists:
                statements.append(("DELETE FROM findings WHERE sample_id = ?", [sample_id]))
            statements.append(("DELETE FROM failures WHERE sample_id = ?", [sample_id]))
            if analysis.findings:
                statements.append((
                    "INSERT INTO findings SELECT ?, f.code, f.severity, f.detail, f.positions FROM "
                    "(SELECT unnest(?::STRUCT(code VARCHAR, severity VARCHAR, detail VARCHAR, positions INTEGER[])[])"
                    " AS f)",
                    [sample_id, [{"code": f.code, "severity": f.severity, "detail": f.detail,
                                  "positions": list(f.positions)} for f in analysis.findings]]))
            self._tx(statements)

    def put_failure(self, prompt_id: str, sample_id: str | None, run_id: str | None, reason: str,
                    server: str | None = None) -> None:
        """A request that failed after its retries: not a sample, so a resumed run tries it again.

        The reason may echo a server's 401 body (with the key) and the server URL may carry
        userinfo: both are scrubbed before they are written."""
        self._tx([("INSERT INTO failures VALUES (?, ?, ?, ?, now(), ?)",
                   [prompt_id, sample_id, run_id, scrub_text(reason), scrub_optional(server)])])

    def existing_sample_ids(self, ids: Iterable[str]) -> set[str]:
        """The subset of `ids` already stored: the anti-join that makes re-runs resume."""
        wanted = list(dict.fromkeys(ids))
        if not wanted:
            return set()
        rows = self.query("SELECT s.sample_id FROM samples s JOIN (SELECT unnest(?::VARCHAR[]) AS id) q "
                          "ON s.sample_id = q.id", [wanted])
        return {r[0] for r in rows}

    # -- verdicts ---------------------------------------------------------------------------
    def _status(self, sample_id: str) -> str:
        rows = self.query("SELECT status FROM samples WHERE sample_id = ?", [sample_id])
        if not rows:
            raise UnknownSample(sample_id)
        return rows[0][0]

    def record_verdict(self, sample_id: str, status: str, reason: str | None = None, note: str | None = None,
                       tags: Sequence[str] = (), who: str | None = None, override: bool = False) -> None:
        """`override`: the reviewer approved although the sample has an error finding (asked and confirmed)."""
        if status not in STATUSES:
            raise ValueError(f"unknown status {status!r} (choose from {', '.join(STATUSES)})")
        with self._lock:
            self._status(sample_id)
            self._tx([
                ("INSERT INTO verdicts (sample_id, \"at\", who, kind, status, reason, note, tags, override) "
                 "VALUES (?, now(), ?, 'verdict', ?, ?, ?, ?, ?)",
                 [sample_id, who, status, reason, note, list(tags), override]),
                ("UPDATE samples SET status = ? WHERE sample_id = ?", [status, sample_id]),
            ])

    def undo_verdict(self, sample_id: str, who: str | None = None) -> str:
        """Take back the latest verdict; the status it had before comes back. Returns the new status."""
        with self._lock:
            current = self._status(sample_id)
            live = self.query("SELECT seq, status FROM verdicts WHERE sample_id = ? AND kind = 'verdict' AND "
                              "NOT undone ORDER BY seq DESC LIMIT 2", [sample_id])
            if not live:
                return current
            restored = live[1][1] if len(live) > 1 else "pending"
            self._tx([
                ("UPDATE verdicts SET undone = true WHERE seq = ?", [live[0][0]]),
                ("INSERT INTO verdicts (sample_id, \"at\", who, kind, status) VALUES (?, now(), ?, 'undo', ?)",
                 [sample_id, who, restored]),
                ("UPDATE samples SET status = ? WHERE sample_id = ?", [restored, sample_id]),
            ])
            return restored

    def undo_latest(self, sample_id: str, who: str | None = None) -> str | None:
        """Take back the sample's latest verdict, note or tag, whichever came last (what `u` means in the app).

        Returns what was undone ("verdict" or "note"), or None when there was nothing to undo.
        """
        with self._lock:
            self._status(sample_id)
            last = self.query("SELECT seq, kind FROM verdicts WHERE sample_id = ? AND kind IN ('verdict', 'note') "
                              "AND NOT undone ORDER BY seq DESC LIMIT 1", [sample_id])
            if not last:
                return None
            if last[0][1] == "note":
                self._tx([("UPDATE verdicts SET undone = true WHERE seq = ?", [last[0][0]]),
                          ("INSERT INTO verdicts (sample_id, \"at\", who, kind) VALUES (?, now(), ?, 'undo')",
                           [sample_id, who])])
                return "note"
        self.undo_verdict(sample_id, who=who)
        return "verdict"

    def add_note(self, sample_id: str, note: str, who: str | None = None, tags: Sequence[str] = ()) -> None:
        with self._lock:
            self._status(sample_id)
            self._tx([("INSERT INTO verdicts (sample_id, \"at\", who, kind, note, tags) VALUES (?, now(), ?, 'note', ?, ?)",
                       [sample_id, who, note, list(tags)])])

    # -- reads ------------------------------------------------------------------------------
    def samples_page(self, filters: SampleFilter | None = None, order_by: str | None = None, offset: int = 0,
                     limit: int = 100) -> list[SampleRow]:
        with self._lock, _duckdb_errors(f"cannot read {self.path}"):
            return queries.samples_page(self._conn, filters, order_by, offset, limit)

    def count_samples(self, filters: SampleFilter | None = None) -> int:
        with self._lock, _duckdb_errors(f"cannot read {self.path}"):
            return queries.count_samples(self._conn, filters)

    def load_sample(self, sample_id: str) -> StoredSample:
        with self._lock, _duckdb_errors(f"cannot read {self.path}"):
            cur = self._conn.execute("SELECT * FROM samples WHERE sample_id = ?", [sample_id])
            names = [d[0] for d in cur.description]
            found = cur.fetchone()
            if found is None:
                raise UnknownSample(sample_id)
            row = dict(zip(names, found))
            findings = [Finding(c, s, d, tuple(p or ())) for c, s, d, p in self.query(
                "SELECT code, severity, detail, positions FROM findings WHERE sample_id = ? ORDER BY rowid",
                [sample_id])]
            history = [dict(zip(("seq", "at", "who", "kind", "status", "reason", "note", "tags", "undone",
                                 "override"), h))
                       for h in self.query("SELECT seq, \"at\", who, kind, status, reason, note, tags, undone, "
                                           "override FROM verdicts WHERE sample_id = ? ORDER BY seq", [sample_id])]
        live = [h for h in history if h["kind"] == "verdict" and not h["undone"]]
        notes_live = [h for h in history if h["kind"] == "note" and not h["undone"]]
        tags = sorted({t for h in notes_live + live[-1:] for t in (h["tags"] or [])})
        return StoredSample(
            sample_id=row["sample_id"], prompt_id=row["prompt_id"], run_id=row["run_id"],
            capture=capture_from_row(row), findings=findings, status=row["status"], valid=bool(row["valid"]),
            n_errors=row["n_errors"], notes=[h["note"] for h in history if h["note"] and not h["undone"]], tags=tags,
            history=history,
            turn=row["turn"], gen_index=row["gen_index"], profile=row["profile"],
            alignment=None if row["alignment"] is None else [ALIGN_STATUS.get(ch, "?") for ch in row["alignment"]],
            created_at=row["created_at"])

    def rows_for(self, sample_ids: Sequence[str]) -> list[dict[str, Any]]:
        """Full rows (ids, text, settings) for these samples, in the order asked: what exports read."""
        if not sample_ids:
            return []
        with self._lock, _duckdb_errors(f"cannot read {self.path}"):
            cur = self._conn.execute("SELECT s.* FROM samples s JOIN (SELECT unnest(?::VARCHAR[]) AS id) q "
                                     "ON s.sample_id = q.id", [list(sample_ids)])
            names = [d[0] for d in cur.description]
            by_id = {r[0]: dict(zip(names, r)) for r in cur.fetchall()}
        return [by_id[i] for i in sample_ids if i in by_id]

    def stats(self) -> dict[str, Any]:
        with self._lock, _duckdb_errors(f"cannot read {self.path}"):
            return queries.stats(self._conn)

    def runs(self) -> list[dict[str, Any]]:
        rows = self.query("SELECT r.*, (SELECT count(*) FROM samples s WHERE s.run_id = r.run_id) AS samples, "
                          "(SELECT count(*) FROM failures f WHERE f.run_id = r.run_id) AS failures "
                          "FROM runs r ORDER BY started, run_id")
        names = ("run_id", "started", "settings", "profile", "tokenizer_dir", "tokenizer_hash", "template_hash",
                 "server_info", "source", "samples", "failures")
        out = []
        for r in rows:
            d = dict(zip(names, r))
            d["settings"], d["server_info"] = from_json(d["settings"]), from_json(d["server_info"])
            out.append(d)
        return out

    def run_ids(self) -> list[str]:
        """Every run id: those with a runs row, then those only samples carry (imported data)."""
        known = [r["run_id"] for r in self.runs()]
        extra = [r[0] for r in self.query("SELECT DISTINCT run_id FROM samples WHERE run_id IS NOT NULL ORDER BY 1")
                 if r[0] not in known]
        return known + extra

    def stored_conversations(self) -> list[tuple[str, list[dict[str, Any]]]]:
        """One conversation per prompt id already in the store (to sample it again)."""
        rows = self.query("SELECT prompt_id, any_value(messages) FROM samples WHERE messages IS NOT NULL "
                          "GROUP BY prompt_id ORDER BY prompt_id")
        return [(pid, from_json(m)) for pid, m in rows if m]

    def length_distribution(self, close_id: int | None, limit: int = 200_000) -> tuple[list[int], list[int]]:
        """(output lengths, reasoning lengths = ids before the first closer) for the stats plots."""
        rows = self.query("SELECT output_len, coalesce(list_position(output_ids, ?), 0) FROM samples LIMIT ?",
                          [close_id if close_id is not None else -1, limit])
        return [r[0] for r in rows], [r[1] - 1 for r in rows if r[1]]

    def finish_reasons(self) -> dict[str, int]:
        return {str(k): v for k, v in self.query(
            "SELECT coalesce(finish_reason, 'none'), count(*) FROM samples GROUP BY 1 ORDER BY 2 DESC")}

    def finding_codes(self) -> list[str]:
        return [r[0] for r in self.query("SELECT DISTINCT code FROM findings ORDER BY code")]

