"""Landing what was written elsewhere: batches' parts (`ingest`) and other tokview stores (`merge`).

Both land in one transaction and are idempotent by sample id: a sample id already stored is stored once,
and landing the same parts or the same store again adds nothing. A part that cannot land (cut short by a
power loss, or a line whose values do not fit the table) is found by trial landings that are rolled back
(`salvage`); what a merge refuses (another model, tokenizer or profile) is decided in `merge.py`.
"""

from __future__ import annotations

import itertools
import os
import shutil
import threading
from pathlib import Path

import duckdb

from tokview.store import merged_review, parts, prompt_refs, queries
from tokview.store.connection import LOCK_WORDS, LockWait, StoreFile, is_duckdb_file, transaction
from tokview.store.errors import StoreError, is_disk_full
from tokview.store.merge import refuse_unmergeable, shared_columns
from tokview.store.merged_scores import take_scores
from tokview.store.parts import sql_list
from tokview.store.sample_rows import SAMPLE_COLUMNS, servers_union
from tokview.store.tool_call_text import fill_tool_calls_text

_DATA_ERRORS = (duckdb.ConversionException, duckdb.InvalidInputException, duckdb.ConstraintException)
"""What DuckDB raises for a part line that cannot land (`"prompt_ids": "oops"`, a cut line, a null id)."""
_FINDINGS_TYPE = "STRUCT(code VARCHAR, severity VARCHAR, detail VARCHAR, positions INTEGER[])[]"


class Landing:
    """Ingest and merge for one store file (the repository of what arrives from outside the process)."""

    def __init__(self, file: StoreFile) -> None:
        self.file = file
        self._column_types: dict[str, str] | None = None

    def _columns(self, conn: duckdb.DuckDBPyConnection) -> tuple[list[str], dict[str, str]]:
        """(the sample columns this file has, in part order; every column's type), read once per store."""
        if self._column_types is None:
            rows = conn.execute(
                "SELECT column_name, data_type FROM duckdb_columns() "
                "WHERE table_name = 'samples' AND schema_name = 'main' AND database_name = current_database()"
            ).fetchall()
            self._column_types = {name: kind for name, kind in rows}
        types = self._column_types
        return [c for c in SAMPLE_COLUMNS if c in types], types

    def land_parts(self) -> tuple[int, int]:
        """Land every complete part in one transaction: (new samples, failures recorded)."""
        with self.file.writing() as conn:
            sample_files, failure_files = parts.complete_parts(
                self.file.parts_dir, said=self.file.on_wait, landing=True
            )
            if not sample_files and not failure_files:
                return 0, 0
            columns, types = self._columns(conn)
            # One DuckDB thread: for a landing's few MB of JSON lines, its parallel reader cost more
            # than it saved (300 rows: 66 -> 55 ms and 65 -> 52 ms of CPU; 1,200 rows: 217 -> 182 ms),
            # and the other core is the batch's, analysing. Queries keep every thread.
            conn.execute("SET threads = 1")
            joined = one_file(sample_files, self.file.parts_dir)  # removed below; the parts themselves once landed
            read = [joined] if joined is not None else sample_files
            try:
                with transaction(conn):
                    new = land_samples(conn, read, columns, types) if sample_files else 0
                    failed = land_failure_parts(conn, failure_files) if failure_files else 0
            finally:
                if joined is not None:
                    joined.unlink(missing_ok=True)
                try:
                    conn.execute("RESET threads")
                except duckdb.Error:  # a connection a full disk invalidated: the first error is the one to tell
                    pass
            # Removed while the file is still held: another ingest (a thread here, or a process that
            # opens the file the moment it is free) must never list a part that is about to vanish.
            parts.remove(sample_files + failure_files)
        return new, failed

    def salvage(self) -> tuple[int, int]:
        """Set aside the parts (and their lines) that cannot land, found by trial landings rolled back with the
        file held: (damaged parts, whole lines of them kept)."""
        with self.file.writing() as conn:
            sample_files, failure_files = parts.complete_parts(self.file.parts_dir, landing=True)
            landed = _part_names(landed_failure_parts(conn))  # nothing to salvage, and never to land again
            failure_files = [f for f in failure_files if f.name not in landed]
            columns, types = self._columns(conn)
            trial = 0

            def lands(part: Path, lines: list[bytes] | None) -> bool:
                nonlocal trial
                if lines is None:
                    return _trial_landing(conn, part, part, columns, types)
                trial += 1
                probe = part.with_name(f".trial-{os.getpid()}-{trial}{part.name[part.name.index('.') :]}.tmp")
                try:
                    probe.write_bytes(b"".join(line + b"\n" for line in lines))
                    return _trial_landing(conn, part, probe, columns, types)
                finally:
                    probe.unlink(missing_ok=True)

            return parts.salvage(sample_files + failure_files, lands)

    def merge(self, source: Path) -> dict[str, int]:
        """Land `source` (checked by `merge_source`), waiting while a batch writing it holds it."""
        wait = LockWait(str(source), self.file.lock_timeout, self.file.on_wait)
        while True:
            try:
                with self.file.writing(f"cannot merge {source}") as conn:
                    return merge_into(conn, source, self.file.path)
            except StoreError as exc:  # the source is held by a batch writing it: wait as for our own file
                if not any(w in str(exc) for w in LOCK_WORDS):
                    raise
                wait.again(str(exc))


JOIN_BYTES_PER_FILE = 8 << 20
"""A landing reads its sample parts as one file when they hold under this many bytes per file saved: DuckDB's
`read_json` costs ~3-4 ms for each file it is given, whatever the file holds, and copying costs ~0.4 ms a MiB. An
agent's turns, sent one after another, land a part each: 8 parts of 2 rows landed in 63 ms read apart, 22 ms read
as one (32 parts: 128 ms, 41 ms)."""
JOIN_MAX_BYTES = 256 << 20
"""Never a bigger copy (hundreds of parts a killed batch left are read as they are)."""
JOIN_FREE_MARGIN = 64 << 20
"""Room left beside the copy and what the landing writes: on a nearly full disk the parts are read as they are (a
copy that fit took the room DuckDB then needed, and every landing failed until someone freed space)."""
_joins = itertools.count()


def one_file(files: list[Path], directory: Path) -> Path | None:
    """The sample parts copied into one file of the parts folder (a `.tmp`, which no landing takes for a part and
    the next one removes if this process dies), or None: one part, parts too big to be worth copying, a disk without
    room to spare for the copy, or a copy that failed (the parts are then read as they are)."""
    if len(files) < 2:
        return None
    try:
        total = sum(f.stat().st_size for f in files)
        if total > min(JOIN_BYTES_PER_FILE * (len(files) - 1), JOIN_MAX_BYTES):
            return None
        if shutil.disk_usage(directory).free < 2 * total + JOIN_FREE_MARGIN:
            return None  # the copy must never take the room the landing itself needs
    except OSError:
        return None
    target = directory / f".landing-{os.getpid()}-{next(_joins)}{parts.SAMPLES_SUFFIX}.tmp"
    try:
        with open(target, "wb") as out:
            for f in files:
                with open(f, "rb") as part:
                    shutil.copyfileobj(part, out)
                    size = part.tell()
                    if size:
                        part.seek(size - 1)
                        if part.read(1) != b"\n":
                            out.write(b"\n")  # a part cut short: its last line stays a line of its own
        return target
    except OSError:
        target.unlink(missing_ok=True)
        return None


def _trial_landing(
    conn: duckdb.DuckDBPyConnection, part: Path, file: Path, columns: list[str], types: dict[str, str]
) -> bool:
    """Whether `file` (lines of `part`) lands, in a transaction that is rolled back either way.

    Only an error in the data says no (a value of the wrong type, a missing required one, broken
    JSON); any other (a full disk, a lost file) is raised: it is no reason to set a part aside."""
    try:
        with transaction(conn, commit=False):
            if part.name.endswith(parts.SAMPLES_SUFFIX):
                land_samples(conn, [file], columns, types)
            else:
                land_failures(conn, [file])
        return True
    except _DATA_ERRORS as exc:
        if is_disk_full(exc):
            raise
        return False


def land_samples(conn: duckdb.DuckDBPyConnection, files: list[Path], columns: list[str], types: dict[str, str]) -> int:
    """Insert the parts' samples not stored yet (and their findings); their earlier failures go. Returns how many."""
    spec = ", ".join(f"'{c}': '{types[c]}'" for c in columns) + f", 'findings': '{_FINDINGS_TYPE}'"
    cuts = all(c in types for c in prompt_refs.REF_COLUMNS)  # a store from before prompt refs stores every row whole
    conn.execute(
        f"CREATE OR REPLACE TEMP TABLE _part_new AS SELECT * FROM read_json({sql_list(files)}, "
        f"columns={{{spec}{prompt_refs.PAST_SPEC if cuts else ''}}}, format='newline_delimited', "
        "maximum_object_size=1073741824) p WHERE NOT EXISTS (SELECT 1 FROM samples s WHERE s.sample_id = p.sample_id)"
    )
    # A sample id twice in the parts keeps its first capture. Ranked over three narrow columns and
    # deleted by rowid: a window over the wide rows (2,000-id lists, raw bodies) cost 40% of a landing.
    conn.execute(
        "DELETE FROM _part_new WHERE rowid IN (SELECT rowid FROM (SELECT rowid, row_number() OVER "
        "(PARTITION BY sample_id ORDER BY created_at) AS n FROM _part_new) WHERE n > 1)"
    )
    texts = "tool_calls_text" in columns
    proposed, untexted = conn.execute(  # one read of the new rows for both
        f"SELECT {f'count({prompt_refs.PAST_KEY})' if cuts else '0'}, "
        f"{'count(*) - count(tool_calls_text)' if texts else '0'} FROM _part_new"
    ).fetchone() or (0, 0)
    if proposed:  # only the proxy's lines propose keys: a batch's landing never runs the update
        conn.execute(prompt_refs.CUT_PAST_KEYS)
    cols = ", ".join(columns)
    conn.execute(f"INSERT INTO samples ({cols}) SELECT {cols} FROM _part_new")
    if untexted:  # lines an older tokview wrote (a part left by a killed run before an upgrade)
        fill_tool_calls_text(conn)
    conn.execute(
        "INSERT INTO findings SELECT sample_id, f.code, f.severity, f.detail, f.positions FROM "
        "(SELECT sample_id, unnest(findings) AS f FROM _part_new)"
    )
    conn.execute("DELETE FROM failures WHERE sample_id IN (SELECT sample_id FROM _part_new)")
    conn.execute("DELETE FROM failure_attempts WHERE sample_id IN (SELECT sample_id FROM _part_new)")
    n = _count(conn, "_part_new")
    conn.execute("DROP TABLE _part_new")
    return n


LANDED_FAILURE_PARTS = "landed_failure_parts"
"""The failures parts landed whose files may still be there (their real paths), in the landing's own transaction.

Samples land once by their id, but a failure line has no id of its own: a process killed between a landing's
commit and the removal of its parts (or a removal that failed) left the parts to land again, which counted each
failure's attempts twice and stored a second copy of every failure without a sample id. A landing skips (and
removes) the parts this table lists, and forgets an entry once its file is gone.

A part is known by its name (unique: creation time, pid, counter), so a store moved with its parts folder, or
listed by an older tokview (which kept bare names), still knows its landed parts. An entry is forgotten only by a
landing of its own folder (its real path's), once that folder no longer holds it: the same store opened through a
symlink has another parts folder, whose landings must never forget this folder's parts. What is never forgotten is
bounded: a moved folder's and the older tokview's entries, about one landing's parts each (a landing forgot the
rest).

Made by the first landing that needs it, not by a schema migration: an older tokview still opens the store, and
its landings only lack the skip, as before."""


def land_failure_parts(conn: duckdb.DuckDBPyConnection, files: list[Path]) -> int:
    """`land_failures` of the parts not landed before, in the caller's transaction; they are then listed in
    LANDED_FAILURE_PARTS until their files are gone."""
    conn.execute(f"CREATE TABLE IF NOT EXISTS {LANDED_FAILURE_PARTS} (name VARCHAR PRIMARY KEY)")
    here, folder = {f.name for f in files}, os.path.realpath(files[0].parent)
    listed = _ledger(conn)
    gone = [entry for entry in listed if os.path.dirname(entry) == folder and os.path.basename(entry) not in here]
    if gone:
        conn.execute(f"DELETE FROM {LANDED_FAILURE_PARTS} WHERE name IN (SELECT unnest(?::VARCHAR[]))", [gone])
    landed = _part_names(listed)
    fresh = [f for f in files if f.name not in landed]
    if not fresh:
        return 0
    conn.execute(
        f"INSERT INTO {LANDED_FAILURE_PARTS} SELECT unnest(?::VARCHAR[])", [[os.path.realpath(f) for f in fresh]]
    )
    return land_failures(conn, fresh)


def landed_failure_parts(conn: duckdb.DuckDBPyConnection) -> set[str]:
    """The entries LANDED_FAILURE_PARTS lists: real paths (bare names from an older tokview); none before the
    store's first failures landing made it."""
    made = conn.execute(
        "SELECT count(*) FROM duckdb_tables() WHERE table_name = ? AND schema_name = 'main' "
        "AND database_name = current_database()",
        [LANDED_FAILURE_PARTS],
    ).fetchone()
    if not made or not made[0]:  # (a failed query would abort the caller's transaction: asked, not tried)
        return set()
    return _ledger(conn)


def _ledger(conn: duckdb.DuckDBPyConnection) -> set[str]:
    """LANDED_FAILURE_PARTS's entries, the table made."""
    return {row[0] for row in conn.execute(f"SELECT name FROM {LANDED_FAILURE_PARTS}").fetchall()}


def _part_names(entries: set[str]) -> set[str]:
    """The part names the entries stand for (a part is known by its name, wherever its folder is now)."""
    return {os.path.basename(entry) for entry in entries}


def land_failures(conn: duckdb.DuckDBPyConnection, files: list[Path]) -> int:
    """Record the parts' failures of samples not stored: one current failure per sample id (the latest), its
    attempts counted. Returns how many failure lines there were."""
    conn.execute(
        f"CREATE OR REPLACE TEMP TABLE _part_fail AS SELECT * FROM read_json({sql_list(files)}, "
        "columns={'prompt_id': 'VARCHAR', 'sample_id': 'VARCHAR', 'run_id': 'VARCHAR', "
        "'reason': 'VARCHAR', 'server': 'VARCHAR', 'at': 'TIMESTAMP'}, format='newline_delimited') f "
        "WHERE f.sample_id IS NULL OR "
        "NOT EXISTS (SELECT 1 FROM samples s WHERE s.sample_id = f.sample_id)"
    )
    conn.execute(
        "INSERT INTO failure_attempts SELECT sample_id, count(*) FROM _part_fail WHERE sample_id IS NOT "
        "NULL GROUP BY sample_id ON CONFLICT (sample_id) DO UPDATE SET attempts = "
        "failure_attempts.attempts + EXCLUDED.attempts"
    )
    conn.execute("DELETE FROM failures WHERE sample_id IN (SELECT sample_id FROM _part_fail)")
    conn.execute(
        'INSERT INTO failures (prompt_id, sample_id, run_id, reason, "at", server) '
        f'SELECT prompt_id, sample_id, run_id, coalesce(reason, {queries.NO_REASON}), "at", server FROM _part_fail '
        'QUALIFY sample_id IS NULL OR row_number() OVER (PARTITION BY sample_id ORDER BY "at" DESC) = 1'
    )
    n = _count(conn, "_part_fail")
    conn.execute("DROP TABLE _part_fail")
    return n


def _count(conn: duckdb.DuckDBPyConnection, table: str) -> int:
    row = conn.execute(f"SELECT count(*) FROM {table}").fetchone()
    return int(row[0]) if row else 0


def merge_source(source: str | Path, target: str) -> Path:
    """`source` as a path to merge into the store at `target`; StoreError when it is none (a folder, missing, not
    DuckDB, the store itself)."""
    src = Path(source).expanduser()
    if src.is_dir():
        raise StoreError(f"{src} is a directory, not a store: name its .duckdb file")
    if not src.is_file():
        raise StoreError(f"database not found: {src}")
    if not is_duckdb_file(src):  # DuckDB would say "Cannot launch in-memory database in read-only mode!"
        raise StoreError(f"{src} is not a DuckDB database (a tokview store is one): nothing merged")
    if src.resolve() == Path(target).expanduser().resolve():
        raise StoreError(f"{src} is the store itself")
    return src


def has_parts(store_file: Path) -> bool:
    """Whether a killed (or running) batch left parts beside this store file."""
    return parts.complete_parts(parts.parts_dir(store_file)) != ([], [])


_MERGING = threading.Lock()
"""One merge at a time in a process: its source is attached as `src` to the target's host instance
(`connection._attach`), where two merges into one target would collide."""


def merge_into(conn: duckdb.DuckDBPyConnection, source: Path, target_name: str) -> dict[str, int]:
    """Merge `source` into the open connection's store (attached read-only); returns what was added."""
    literal = sql_list([source])[1:-1]
    with _MERGING:
        conn.execute(f"ATTACH {literal} AS src (READ_ONLY)")
        try:
            tables = refuse_unmergeable(conn, source, target_name)
            with transaction(conn):
                return _merge_rows(conn, with_attempts="failure_attempts" in tables, source_name=source.name)
        finally:
            conn.execute("DETACH src")


def _union_run_servers(conn: duckdb.DuckDBPyConnection) -> None:
    """A run both stores hold keeps the store's record, listing the servers either met (`servers_union`): each
    shard of a run made against its own server, merged, listed one of them, by the merge's order."""
    both = conn.execute(
        "SELECT m.run_id, m.server_info, r.server_info FROM main.runs m JOIN src.runs r ON r.run_id = m.run_id "
        "WHERE r.server_info IS DISTINCT FROM m.server_info"
    ).fetchall()
    for run_id, stored, given in both:
        kept = servers_union(given, stored)  # the store's record first: it stands where both name a server
        conn.execute("UPDATE main.runs SET server_info = ? WHERE run_id = ?", [kept, run_id])


def _merge_rows(conn: duckdb.DuckDBPyConnection, *, with_attempts: bool, source_name: str) -> dict[str, int]:
    """Copy the source's new samples (with findings and verdicts), runs and open failures into `main`, and the
    review the source added to samples both hold (`merged_review.take_review`, one action of this store)."""
    sample_cols = shared_columns(conn, "samples")
    col_list = ", ".join(sample_cols)
    conn.execute(
        "CREATE OR REPLACE TEMP TABLE _merge_new AS SELECT sample_id FROM src.samples s "
        "WHERE NOT EXISTS (SELECT 1 FROM main.samples m WHERE m.sample_id = s.sample_id)"
    )
    # One sample id, another generation (a shard run again against another server or seed): the store's stays, and
    # the merge says how many, not "+0 samples" alone.
    differ = conn.execute(
        "SELECT count(*) FROM src.samples s JOIN main.samples m ON m.sample_id = s.sample_id "
        "WHERE s.output_ids IS DISTINCT FROM m.output_ids OR s.prompt_len IS DISTINCT FROM m.prompt_len"
    ).fetchone()
    run_cols = ", ".join(shared_columns(conn, "runs"))  # an older source lacks the newer columns
    runs = _changed(
        conn,
        f"INSERT INTO main.runs ({run_cols}) SELECT {run_cols} FROM src.runs r WHERE NOT EXISTS "
        "(SELECT 1 FROM main.runs m WHERE m.run_id = r.run_id)",
    )
    _union_run_servers(conn)
    samples = _changed(
        conn,
        f"INSERT INTO main.samples ({col_list}) SELECT {col_list} FROM src.samples "
        "WHERE sample_id IN (SELECT sample_id FROM _merge_new)",
    )
    if "tool_calls_text" not in sample_cols:  # a source older than schema 12: its rows' calls read from their bodies
        fill_tool_calls_text(conn)
    conn.execute(
        "INSERT INTO main.findings SELECT sample_id, code, severity, detail, positions FROM "
        "src.findings WHERE sample_id IN (SELECT sample_id FROM _merge_new) ORDER BY rowid"
    )
    verdict_cols = merged_review.verdict_columns(conn)
    action = merged_review.MergedReview.begin(conn)
    conn.execute(
        f"INSERT INTO main.verdicts ({verdict_cols}) SELECT {verdict_cols} FROM src.verdicts "
        "WHERE sample_id IN (SELECT sample_id FROM _merge_new) ORDER BY seq"
    )
    conn.execute("DELETE FROM main.failures WHERE sample_id IN (SELECT sample_id FROM _merge_new)")
    conn.execute("DELETE FROM main.failure_attempts WHERE sample_id IN (SELECT sample_id FROM _merge_new)")
    failures = _merge_failures(conn, with_attempts=with_attempts)
    conn.execute("DROP TABLE _merge_new")
    taken, kept, noted, undone = merged_review.take_review(conn, verdict_cols, action)
    scores_taken, scores_kept = take_scores(conn, sample_cols)
    added = {
        "samples": samples,
        "runs": runs,
        "failures": failures,
        "verdicts_taken": taken,
        "verdicts_kept": kept,
        "notes_taken": noted,
        "verdicts_undone_here": undone,
        "other_ids": int(differ[0]) if differ else 0,
        "scores_taken": scores_taken,
        "scores_kept": scores_kept,
    }
    return {**added, **action.finish(conn, source_name)}


def _merge_failures(conn: duckdb.DuckDBPyConnection, *, with_attempts: bool) -> int:
    """Failures of samples stored nowhere yet: one per sample id, added once (with their attempts)."""
    failures = _changed(
        conn,
        'INSERT INTO main.failures SELECT prompt_id, sample_id, run_id, reason, "at", server FROM '
        f"({_ONE_FAILURE_EACH}) f WHERE (f.sample_id IS NULL OR (NOT EXISTS (SELECT 1 FROM main.samples s WHERE "
        "s.sample_id = f.sample_id) AND NOT EXISTS (SELECT 1 FROM main.failures g WHERE g.sample_id = "
        "f.sample_id))) AND NOT EXISTS (SELECT 1 FROM main.failures g WHERE g.sample_id IS NULL AND "
        "f.sample_id IS NULL AND g.prompt_id IS NOT DISTINCT FROM f.prompt_id AND g.reason IS NOT DISTINCT "
        "FROM f.reason)",
    )
    attempts = (
        "SELECT sample_id, attempts FROM src.failure_attempts"
        if with_attempts  # else a store from before the count: a row per attempt, counted as its migration does
        else "SELECT sample_id, count(*) AS attempts FROM src.failures WHERE sample_id IS NOT NULL GROUP BY sample_id"
    )
    conn.execute(
        f"INSERT INTO main.failure_attempts SELECT sample_id, attempts FROM ({attempts}) a "
        "WHERE EXISTS (SELECT 1 FROM main.failures f WHERE f.sample_id = a.sample_id) "
        "ON CONFLICT (sample_id) DO UPDATE SET attempts = greatest(failure_attempts.attempts, "
        "EXCLUDED.attempts)"
    )
    return failures


_ONE_FAILURE_EACH = (
    'SELECT * FROM src.failures QUALIFY sample_id IS NULL OR row_number() OVER (PARTITION BY sample_id ORDER BY "at" '
    "DESC, rowid DESC) = 1"
)
"""The source's failures, the latest of each sample id: a store from before failure counts (schema < 4) holds a row
per attempt, and every one of them was merged."""


def _changed(conn: duckdb.DuckDBPyConnection, sql: str) -> int:
    """Run an INSERT and return how many rows it added."""
    row = conn.execute(sql).fetchone()
    return int(row[0]) if row else 0
