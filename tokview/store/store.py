"""The DuckDB store: one file holds every run, sample, finding, failure and verdict.

Shared live: DuckDB lets one process at a time open a file, so a Store never keeps it open. Every
operation opens the file, runs one short transaction or query and closes it again (`hold()` keeps
it open across a few related calls); a process that finds it taken waits, and says which tokview
command holds it if the wait gets long. Batches do not write samples here directly: they append
crash-safe parts beside the file (see `parts.py`) that `ingest()` lands in one transaction, so
`ui`, `stats`, `show`, `export` and further batches all work on a store while a batch fills it.
Within a process, threads (the UI's workers, a batch's writer) share one lock.
"""

from __future__ import annotations

import fcntl
import os
import re
import sys
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import duckdb

from tokview.core.findings import Finding
from tokview.core.record import Capture
from tokview.errors import describe_error, first_line
from tokview.store import bulk_review, parts, queries
from tokview.store.part_sink import PartSink, StoreError, StoreFull, is_disk_full
from tokview.store.records import (
    ALIGN_STATUS,
    SAMPLE_COLUMNS,
    STATUSES,
    SampleFilter,
    SampleRow,
    StoredSample,
    UnknownSample,
    capture_from_row,
    from_json,
    known_secrets,
    metadata_json,
    sample_params,
    scrub_optional,
    scrub_text,
    to_json,
)
from tokview.store.schema import migrate, refuse_foreign, refuse_unmigrated

DEFAULT_DB = "tokview.duckdb"
_INSERT = f"INSERT INTO samples ({', '.join(SAMPLE_COLUMNS)}) VALUES ({', '.join('?' * len(SAMPLE_COLUMNS))})"
_UPSERT = (
    _INSERT
    + " ON CONFLICT (sample_id) DO UPDATE SET "
    + ", ".join(f"{c} = EXCLUDED.{c}" for c in SAMPLE_COLUMNS if c != "sample_id")
)


LOCK_TIMEOUT_S = 120.0
"""How long an operation waits for another process to release the file before it gives up."""
LOCK_SAY_AFTER_S = 1.0
"""Waits longer than this are announced (once) with the holder's tokview command."""
LINGER_S = 0.2
"""After an operation the file stays open this long for the next one (the app's count, page and sample
of one keypress reuse one warm connection); then it is closed for other processes."""
MAX_HOLD_S = 1.0
"""Never longer than this in one stretch, however busy: other processes always get their turn."""
_LOCK_WORDS = ("Could not set lock", "Conflicting lock")
_PID = re.compile(r"\(PID (\d+)\)")
_DATA_ERRORS = (duckdb.ConversionException, duckdb.InvalidInputException, duckdb.ConstraintException)
"""What DuckDB raises for a part line that cannot land (`"prompt_ids": "oops"`, a cut line, a null id)."""


def holder_of(message: str) -> str:
    """Which program holds the file, from DuckDB's lock message: `tokview batch (pid 12)` when it is ours."""
    match = _PID.search(message)
    if not match:
        return "another process"
    pid = int(match.group(1))
    argv: list[str] = []
    try:
        argv = [a.decode("utf-8", "replace") for a in Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0") if a]
    except OSError:
        pass
    for i, arg in enumerate(argv):
        name = os.path.basename(arg)
        if name == "tokview" or (name == "-m" and i + 1 < len(argv) and argv[i + 1] == "tokview"):
            rest = argv[i + (2 if name == "-m" else 1) :]
            command = next((a for a in rest if not a.startswith("-")), "")
            return f"`tokview {command}`".replace(" `", "`") + f" (pid {pid})" if command else f"tokview (pid {pid})"
    return f"another program (pid {pid}{': ' + os.path.basename(argv[0]) if argv else ''})"


@contextmanager
def _duckdb_errors(what: str, path: str = "") -> Iterator[None]:
    """Turn a DuckDB error into a one-line StoreError: callers and the CLI never see duckdb's types."""
    try:
        yield
    except duckdb.Error as exc:
        if is_disk_full(exc):
            raise StoreFull(f"no space left on device ({path or what})") from None
        first = scrub_text(first_line(exc))
        raise StoreError(f"{what}: {first}") from None


class _LockWait:
    """Waiting for a DuckDB file another process holds: backing off, said once after a second, given up
    (one line naming the holder) after `timeout` seconds."""

    def __init__(self, path: str, timeout: float, on_wait: Callable[[str], None]) -> None:
        self.path, self.timeout, self.on_wait = path, timeout, on_wait
        self.started, self.said, self.delay = time.monotonic(), False, 0.005

    def again(self, message: str) -> None:
        """Sleep before the next try; StoreError when the wait is over."""
        waited = time.monotonic() - self.started
        if waited >= self.timeout:
            raise StoreError(
                f"the store {self.path} is in use by {holder_of(message)}: gave up after {waited:.0f}s "
                "(try again when it finishes)"
            ) from None
        if not self.said and waited >= LOCK_SAY_AFTER_S:
            self.said = True
            self.on_wait(f"waiting for {self.path}: in use by {holder_of(message)}")
        time.sleep(self.delay)
        self.delay = min(self.delay * 2, 0.1)


DUCKDB_MAGIC = b"DUCK"
"""What every DuckDB database file holds at bytes 8-11 of its header."""


def is_duckdb_file(path: str | Path) -> bool:
    """Whether `path` is a DuckDB database file (its header's magic bytes): False when absent or unreadable."""
    try:
        with open(Path(path).expanduser(), "rb") as f:
            return f.read(12)[8:12] == DUCKDB_MAGIC
    except OSError:
        return False


def _refuse_other_files(path: str) -> None:
    """A --db that is some other file (a prompts file given in the wrong place, a Parquet or CSV file)
    is named as such: DuckDB itself opens some of them as a database of their own and lists their tables."""
    try:
        with open(Path(path).expanduser(), "rb") as f:
            head = f.read(12)
    except (FileNotFoundError, IsADirectoryError, NotADirectoryError):
        return  # a new store, or a folder DuckDB names itself
    except OSError:
        return  # unreadable: DuckDB's own error says why
    if head and head[8:12] != DUCKDB_MAGIC:
        raise StoreError(f"{path} is not a DuckDB database (a tokview store is one): pass another --db")


_NOT_A_DATABASE = "not a valid DuckDB database file"
UNFINISHED_AFTER_S = 0.5
"""A 0-byte file younger than this may be a store another process is creating this instant (DuckDB creates the
file, locks it at once and then writes its header): it is waited for, never removed. Shorter than
LOCK_SAY_AFTER_S, so a re-run right after a failed creation waits without announcing a holder that is gone."""


def _clear_unfinished_file(path: str, wait: _LockWait) -> bool:
    """A 0-byte store file is what DuckDB leaves when it could not write a new file's header (a full disk): it
    holds nothing, so it is removed and the store created anew. True: try opening again (removed, or too young
    to tell and waited for); False: not such a file (it has bytes, a write-ahead log beside it, or another
    process holds its lock), left as it is for DuckDB's own error."""
    file = Path(path).expanduser()
    wal = Path(f"{file}.wal")
    try:
        if wal.exists() and wal.stat().st_size > 0:
            return False
        fd = os.open(file, os.O_RDWR)
    except OSError:
        return False
    try:
        seen = os.fstat(fd)
        if seen.st_size != 0:
            return False
        if time.time() - seen.st_mtime < UNFINISHED_AFTER_S:
            wait.again(f"{path} is being created")
            return True
        try:
            fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            return False  # held: DuckDB's next try waits for it
        now = os.stat(file)
        if (now.st_ino, now.st_dev, now.st_size) != (seen.st_ino, seen.st_dev, 0):
            return True  # replaced meanwhile: open what is there now
        file.unlink()
        return True
    except OSError:
        return False
    finally:
        os.close(fd)


class Store(PartSink):
    """Open (create, migrate) a tokview DuckDB file; `":memory:"` for a throwaway store.

    `server_urls`: the URLs the captures come from (may hold `user:password@`); their credentials
    are masked wherever they appear in a stored payload (`add_server_urls` adds more later)."""

    def __init__(
        self,
        path: str | Path = DEFAULT_DB,
        server_urls: Iterable[str] = (),
        *,
        lock_timeout: float = LOCK_TIMEOUT_S,
        on_wait: Callable[[str], None] | None = None,
        linger: float = LINGER_S,
    ) -> None:
        """`on_wait(message)` hears about a long wait for another process (default: one line on stderr);
        `linger`: seconds the file stays open after an operation (0: closed at once)."""
        self.path = str(path)
        self._secrets: tuple[str, ...] = ()
        self.add_server_urls(server_urls)
        self.lock_timeout = lock_timeout
        self.on_wait = on_wait if on_wait is not None else _say_on_stderr
        self._memory = self.path == ":memory:"
        self._lock = threading.RLock()
        self._conn: Any = None
        self._depth = 0
        self.linger = linger
        self._opened_at = 0.0
        self._release_seq = 0
        self._column_types: dict[str, str] | None = None
        self._memory_parts: Path | None = None
        self.read_only = False
        """Opened read-only: the file (or its file system) cannot be written; set by `_open` when it finds so."""
        if not self._memory:
            try:
                Path(self.path).expanduser().parent.mkdir(parents=True, exist_ok=True)
            except OSError as exc:  # the user's --db names a folder that cannot be made
                raise StoreError(describe_error(exc)) from None
            _refuse_other_files(self.path)
        with self._lock:
            try:
                self._conn = self._open()
                self._opened_at = time.monotonic()
                with _duckdb_errors(f"cannot migrate database {self.path}", self.path):
                    refuse_foreign(self._conn, self.path)
                    if self.read_only:
                        refuse_unmigrated(self._conn, self.path)
                    else:
                        migrate(self._conn)
            except BaseException:
                self._release(force=True)
                raise
            self._release()
        left = [] if self._memory else [p for kind in parts.complete_parts(self.parts_dir) for p in kind]
        if left and self.read_only:
            self.on_wait(
                f"{len(left)} part(s) beside {self.path} are not landed: the store is read-only "
                "(their samples are not shown until a command opens it where it can be written)"
            )
        elif left:
            try:
                self.ingest()  # parts a killed batch left behind
            except StoreError as exc:  # a full disk: what is landed can still be read, exported, reviewed
                self.on_wait(f"parts left beside {self.path} are not landed yet ({exc}); they are kept")

    @property
    def parts_dir(self) -> Path:
        """Where writers put parts: beside the file (a private temporary folder for `:memory:`)."""
        if self._memory:
            if self._memory_parts is None:
                import tempfile

                self._memory_parts = Path(tempfile.mkdtemp(prefix="tokview-parts-"))
            return self._memory_parts
        return parts.parts_dir(self.path)

    def _open(self) -> Any:
        """Open the file, waiting while another process holds it (announced after a second)."""
        wait = _LockWait(self.path, self.lock_timeout, self.on_wait)
        while True:
            try:
                return duckdb.connect(self.path, read_only=self.read_only)
            except duckdb.Error as exc:
                message = str(exc).strip()
                if any(w in message for w in _LOCK_WORDS):
                    wait.again(message)
                elif not self.read_only and _cannot_write(message) and Path(self.path).expanduser().is_file():
                    self.read_only = True  # read without writing: stats, show and export need no more
                elif not self.read_only and _NOT_A_DATABASE in message and _clear_unfinished_file(self.path, wait):
                    continue  # a 0-byte file a full disk left: removed (or given time to become a store)
                else:
                    raise StoreError(f"cannot open database {self.path}: {first_line(exc)}") from None

    def _release(self, force: bool = False) -> None:
        """Close the file now (`force`, or held MAX_HOLD_S already), or after LINGER_S unless used again."""
        if self._conn is None or (not force and (self._depth > 0 or self._memory)):
            return
        self._release_seq += 1
        if force or self.linger <= 0 or time.monotonic() - self._opened_at >= MAX_HOLD_S:
            try:
                self._conn.close()
            finally:
                self._conn = None
            return
        closer = threading.Timer(self.linger, self._close_if_idle, args=(self._release_seq,))
        closer.daemon = True
        closer.start()

    def _close_if_idle(self, seq: int) -> None:
        with self._lock:
            if seq == self._release_seq and self._depth == 0 and self._conn is not None:
                self._release(force=True)

    @contextmanager
    def _connection(self) -> Iterator[Any]:
        """The open connection for one operation: opened here unless a caller's `hold()` keeps one."""
        with self._lock:
            if self._conn is None:
                self._conn = self._open()
                self._opened_at = time.monotonic()
            self._depth += 1
            try:
                yield self._conn
            finally:
                self._depth -= 1
                self._release()

    @property
    def is_open(self) -> bool:
        """Whether this process has the database file open right now (it lingers open for a burst)."""
        return self._conn is not None

    @contextmanager
    def hold(self) -> Iterator[Store]:
        """Keep the file open across several calls (e.g. the dozen queries of `stats`); keep it short."""
        with self._connection():
            yield self

    # -- lifecycle --------------------------------------------------------------------------
    def close(self) -> None:
        with self._lock:
            self._release(force=True)
            if self._memory_parts is not None:
                import shutil

                shutil.rmtree(self._memory_parts, ignore_errors=True)
                self._memory_parts = None

    def __enter__(self) -> Store:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def _tx(self, statements: Iterable[tuple[str, Sequence[Any]]]) -> None:
        with self._connection() as conn, _duckdb_errors(f"cannot write to {self.path}", self.path):
            conn.execute("BEGIN TRANSACTION")
            try:
                for sql, params in statements:
                    conn.execute(sql, list(params))
                conn.execute("COMMIT")
            except BaseException:
                try:  # a failed COMMIT (disk full) has already ended the transaction: keep the real error
                    conn.execute("ROLLBACK")
                except duckdb.Error:
                    pass
                raise

    def query(self, sql: str, params: Sequence[Any] = ()) -> list[tuple]:
        """Run read-only SQL under the store's lock (exports and reports use it)."""
        with self._connection() as conn, _duckdb_errors(f"cannot read {self.path}", self.path):
            return conn.execute(sql, list(params)).fetchall()

    def execute(self, sql: str, params: Sequence[Any] = ()) -> None:
        """Run one statement under the lock (e.g. DuckDB's `COPY … TO` for Parquet exports)."""
        with self._connection() as conn, _duckdb_errors("database statement failed", self.path):
            conn.execute(sql, list(params))

    # -- writes -----------------------------------------------------------------------------
    def put_run(
        self,
        run_id: str,
        *,
        settings: dict | None = None,
        profile: str | None = None,
        tokenizer_dir: str | None = None,
        tokenizer_hash: str | None = None,
        template_hash: str | None = None,
        server_info: list | None = None,
        source: str | None = None,
        profile_def: dict | None = None,
    ) -> None:
        """Record (or refresh) a run's provenance: what the manifest of an export reports.

        `profile_def`: the profile's fields (`profiles.profile_fields`), so a profile read from a .toml
        file is the one `show`, the app and exports analyse the run's samples with, not a guess."""
        self._tx(
            [
                (
                    "INSERT INTO runs (run_id, started, settings, profile, tokenizer_dir, tokenizer_hash, "
                    "template_hash, server_info, source, profile_def) VALUES (?, now(), ?, ?, ?, ?, ?, ?, ?, ?) "
                    "ON CONFLICT (run_id) DO UPDATE SET "
                    "settings = EXCLUDED.settings, profile = EXCLUDED.profile, tokenizer_dir = EXCLUDED.tokenizer_dir, "
                    "tokenizer_hash = EXCLUDED.tokenizer_hash, template_hash = EXCLUDED.template_hash, "
                    "server_info = EXCLUDED.server_info, source = EXCLUDED.source, profile_def = EXCLUDED.profile_def",
                    [
                        run_id,
                        to_json(settings, known_secrets(self._secrets)),
                        profile,
                        tokenizer_dir,
                        tokenizer_hash,
                        template_hash,
                        metadata_json(server_info),
                        source,
                        metadata_json(profile_def),
                    ],
                )
            ]
        )

    def put_sample(
        self,
        sample_id: str,
        prompt_id: str,
        run_id: str | None,
        capture: Capture,
        analysis: Any,
        *,
        gen_index: int | None = None,
        turn: int | None = None,
        profile: str | None = None,
        new: bool | None = None,
    ) -> None:
        """Write one sample and its findings atomically; re-writing keeps its review status.

        `new=True` says the caller knows the id is not stored yet (the batch runner's anti-join did
        the check for every planned id): a plain INSERT, about half the cost of DuckDB's upsert, and
        no lookup. `None` looks it up; a re-written sample takes the upsert and loses its old findings.
        Earlier failures of the same sample id (a resumed run that now succeeded) go in the same
        transaction: stats and errors.jsonl list only requests that are still missing.
        """
        params = sample_params(sample_id, prompt_id, run_id, capture, analysis, gen_index, turn, profile, self._secrets)
        with self._connection():  # one open file: the check and the write see the same state
            exists = (not new) and (
                new is False or bool(self.query("SELECT 1 FROM samples WHERE sample_id = ?", [sample_id]))
            )
            statements: list[tuple[str, Sequence[Any]]] = [(_UPSERT if exists else _INSERT, params)]
            if exists:
                statements.append(("DELETE FROM findings WHERE sample_id = ?", [sample_id]))
            statements.append(("DELETE FROM failures WHERE sample_id = ?", [sample_id]))
            statements.append(("DELETE FROM failure_attempts WHERE sample_id = ?", [sample_id]))
            if analysis.findings:
                statements.append(
                    (
                        "INSERT INTO findings SELECT ?, f.code, f.severity, f.detail, f.positions FROM "
                        "(SELECT unnest(?::STRUCT(code VARCHAR, severity VARCHAR, detail VARCHAR, positions INTEGER[])[])"
                        " AS f)",
                        [
                            sample_id,
                            [
                                {
                                    "code": f.code,
                                    "severity": f.severity,
                                    "detail": f.detail,
                                    "positions": list(f.positions),
                                }
                                for f in analysis.findings
                            ],
                        ],
                    )
                )
            self._tx(statements)

    def put_failure(
        self, prompt_id: str, sample_id: str | None, run_id: str | None, reason: str, server: str | None = None
    ) -> None:
        """A request that failed after its retries: not a sample, so a resumed run tries it again.

        The reason may echo a server's 401 body (with the key) and the server URL may carry
        userinfo: both are scrubbed before they are written."""
        self.put_failures(
            [{"prompt_id": prompt_id, "sample_id": sample_id, "run_id": run_id, "reason": reason, "server": server}]
        )

    def put_failures(self, failures: list[dict[str, Any]]) -> None:
        """Record failed requests in one transaction: one current failure per sample id (the latest
        reason), its `failure_attempts` count going up by one per recorded attempt."""
        statements: list[tuple[str, Sequence[Any]]] = []
        for f in failures:
            sid = f.get("sample_id")
            row = [
                f.get("prompt_id"),
                sid,
                f.get("run_id"),
                scrub_text(str(f.get("reason") or "")),
                scrub_optional(f.get("server")),
            ]
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
                    row,
                )
            )
        if statements:
            self._tx(statements)

    # -- parts: what batches write instead of holding the file -------------------------------
    def _sample_types(self, conn: Any) -> dict[str, str]:
        if self._column_types is None:
            rows = conn.execute(
                "SELECT column_name, data_type FROM duckdb_columns() "
                "WHERE table_name = 'samples' AND schema_name = 'main' AND database_name = current_database()"
            ).fetchall()
            self._column_types = {name: kind for name, kind in rows}
        return self._column_types

    def ingest(self) -> tuple[int, int]:
        """Land every complete part in one transaction; returns (new samples, failures recorded).

        Idempotent: a sample id already stored (or twice in the parts) is stored once; a failure of a
        sample that is now stored is dropped; per sample id one failure row stays, with its attempts.
        A part that cannot land (cut short by a power loss, or a line whose values do not fit the
        table) is set aside with the lines that can land kept (`parts.salvage`), and the landing is
        tried again, once: one bad line never keeps the other parts out of the store."""
        if self.read_only:
            raise StoreError(f"cannot write to {self.path}: the store is read-only")
        try:
            return self._ingest_parts()
        except StoreFull:
            raise
        except StoreError:
            damaged, kept = self._salvage()
            if not damaged:
                raise
            self.on_wait(
                f"{damaged} damaged part(s) set aside in {self.parts_dir / parts.DAMAGED_DIR} "
                f"({kept} whole lines of them kept)"
            )
            return self._ingest_parts()

    def _salvage(self) -> tuple[int, int]:
        """Find the parts (and their lines) that cannot land by trial landings, rolled back, with the file held."""
        with self._connection() as conn, _duckdb_errors(f"cannot write to {self.path}", self.path):
            sample_files, failure_files = parts.complete_parts(self.parts_dir)
            types = self._sample_types(conn)
            columns = [c for c in SAMPLE_COLUMNS if c in types]
            trial = 0

            def lands(part: Path, lines: list[bytes] | None) -> bool:
                nonlocal trial
                if lines is None:
                    return self._trial_landing(conn, part, part, columns, types)
                trial += 1
                probe = part.with_name(f".trial-{os.getpid()}-{trial}{part.name[part.name.index('.') :]}.tmp")
                try:
                    probe.write_bytes(b"".join(line + b"\n" for line in lines))
                    return self._trial_landing(conn, part, probe, columns, types)
                finally:
                    probe.unlink(missing_ok=True)

            return parts.salvage(sample_files + failure_files, lands)

    def _trial_landing(self, conn: Any, part: Path, file: Path, columns: list[str], types: dict[str, str]) -> bool:
        """Whether `file` (lines of `part`) lands, in a transaction that is rolled back either way.

        Only an error in the data says no (a value of the wrong type, a missing required one, broken
        JSON); any other (a full disk, a lost file) is raised: it is no reason to set a part aside."""
        conn.execute("BEGIN TRANSACTION")
        try:
            if part.name.endswith(parts.SAMPLES_SUFFIX):
                self._ingest_samples(conn, [file], columns, types)
            else:
                self._ingest_failures(conn, [file])
            return True
        except _DATA_ERRORS as exc:
            if is_disk_full(exc):
                raise
            return False
        finally:
            try:
                conn.execute("ROLLBACK")
            except duckdb.Error:  # a connection the error invalidated: the error raised above says why
                pass

    def _ingest_parts(self) -> tuple[int, int]:
        with self._connection() as conn, _duckdb_errors(f"cannot write to {self.path}", self.path):
            sample_files, failure_files = parts.complete_parts(self.parts_dir)
            if not sample_files and not failure_files:
                return 0, 0
            types = self._sample_types(conn)
            columns = [c for c in SAMPLE_COLUMNS if c in types]
            # One DuckDB thread: for a landing's few MB of JSON lines, its parallel reader cost more
            # than it saved (300 rows: 66 -> 55 ms and 65 -> 52 ms of CPU; 1,200 rows: 217 -> 182 ms),
            # and the other core is the batch's, analysing. Queries keep every thread.
            conn.execute("SET threads = 1")
            conn.execute("BEGIN TRANSACTION")
            try:
                new = self._ingest_samples(conn, sample_files, columns, types) if sample_files else 0
                failed = self._ingest_failures(conn, failure_files) if failure_files else 0
                conn.execute("COMMIT")
            except BaseException:
                try:
                    conn.execute("ROLLBACK")
                except duckdb.Error:
                    pass
                raise
            finally:
                try:
                    conn.execute("RESET threads")
                except duckdb.Error:  # a connection a full disk invalidated: the first error is the one to tell
                    pass
            # Removed while the file is still held: another ingest (a thread here, or a process that
            # opens the file the moment it is free) must never list a part that is about to vanish.
            parts.remove(sample_files + failure_files)
        return new, failed

    def merge(self, source: str | Path) -> dict[str, int]:
        """Land another tokview store's samples, findings, verdicts, runs and open failures (see `merge.py`).

        Raises MergeRefused (another model/tokenizer/profile, not a store) or StoreError."""
        from tokview.store.merge import merge_into

        src = Path(source).expanduser()
        if src.is_dir():
            raise StoreError(f"{src} is a directory, not a store: name its .duckdb file")
        if not src.is_file():
            raise StoreError(f"database not found: {src}")
        if not is_duckdb_file(src):  # DuckDB would say "Cannot launch in-memory database in read-only mode!"
            raise StoreError(f"{src} is not a DuckDB database (a tokview store is one): nothing merged")
        if src.resolve() == Path(self.path).expanduser().resolve():
            raise StoreError(f"{src} is the store itself")
        if parts.complete_parts(parts.parts_dir(src)) != ([], []):
            # samples a killed (or running) batch left beside it: landed as opening it with any command
            # would, so the merge takes them too (the source is attached read-only below)
            Store(src, lock_timeout=self.lock_timeout, on_wait=self.on_wait).close()
        wait = _LockWait(str(src), self.lock_timeout, self.on_wait)
        while True:
            try:
                with self._connection() as conn, _duckdb_errors(f"cannot merge {src}", self.path):
                    return merge_into(conn, src, self.path)
            except StoreError as exc:  # the source is held by a batch writing it: wait as for our own file
                if not any(w in str(exc) for w in _LOCK_WORDS):
                    raise
                wait.again(str(exc))

    @staticmethod
    def _ingest_samples(conn: Any, files: list[parts.Path], columns: list[str], types: dict[str, str]) -> int:
        spec = ", ".join(f"'{c}': '{types[c]}'" for c in columns)
        spec += ", 'findings': 'STRUCT(code VARCHAR, severity VARCHAR, detail VARCHAR, positions INTEGER[])[]'"
        conn.execute(
            f"CREATE OR REPLACE TEMP TABLE _part_new AS SELECT * FROM read_json({parts.sql_list(files)}, "
            f"columns={{{spec}}}, format='newline_delimited', maximum_object_size=1073741824) p "
            "WHERE NOT EXISTS (SELECT 1 FROM samples s WHERE s.sample_id = p.sample_id)"
        )
        # A sample id twice in the parts keeps its first capture. Ranked over three narrow columns and
        # deleted by rowid: a window over the wide rows (2,000-id lists, raw bodies) cost 40% of a landing.
        conn.execute(
            "DELETE FROM _part_new WHERE rowid IN (SELECT rowid FROM (SELECT rowid, row_number() OVER "
            "(PARTITION BY sample_id ORDER BY created_at) AS n FROM _part_new) WHERE n > 1)"
        )
        cols = ", ".join(columns)
        conn.execute(f"INSERT INTO samples ({cols}) SELECT {cols} FROM _part_new")
        conn.execute(
            "INSERT INTO findings SELECT sample_id, f.code, f.severity, f.detail, f.positions FROM "
            "(SELECT sample_id, unnest(findings) AS f FROM _part_new)"
        )
        conn.execute("DELETE FROM failures WHERE sample_id IN (SELECT sample_id FROM _part_new)")
        conn.execute("DELETE FROM failure_attempts WHERE sample_id IN (SELECT sample_id FROM _part_new)")
        n = conn.execute("SELECT count(*) FROM _part_new").fetchone()[0]
        conn.execute("DROP TABLE _part_new")
        return int(n)

    @staticmethod
    def _ingest_failures(conn: Any, files: list[parts.Path]) -> int:
        conn.execute(
            f"CREATE OR REPLACE TEMP TABLE _part_fail AS SELECT * FROM read_json({parts.sql_list(files)}, "
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
        n = conn.execute("SELECT count(*) FROM _part_fail").fetchone()[0]
        conn.execute("DROP TABLE _part_fail")
        return int(n)

    def failures(self, run_id: str | None = None) -> list[dict[str, Any]]:
        """The current failures (one per sample id, the latest reason) with how many attempts failed:
        what errors.jsonl lists."""
        where, params = ("WHERE f.run_id = ?", [run_id]) if run_id else ("", [])
        rows = self.query(
            f'SELECT f.prompt_id, f.sample_id, f.run_id, coalesce(f.reason, {queries.NO_REASON}), f.server, f."at", '
            "coalesce(a.attempts, 1) FROM failures f LEFT JOIN failure_attempts a USING (sample_id) "
            f'{where} ORDER BY f.prompt_id, f.sample_id, f."at"',
            params,
        )
        names = ("prompt_id", "sample_id", "run_id", "reason", "server", "at", "attempts")
        return [dict(zip(names, r)) for r in rows]

    def existing_sample_ids(self, ids: Iterable[str]) -> set[str]:
        """The subset of `ids` already stored: the anti-join that makes re-runs resume."""
        wanted = list(dict.fromkeys(ids))
        if not wanted:
            return set()
        rows = self.query(
            "SELECT s.sample_id FROM samples s JOIN (SELECT unnest(?::VARCHAR[]) AS id) q ON s.sample_id = q.id",
            [wanted],
        )
        return {r[0] for r in rows}

    def stored_ids_with(self, fragment: str) -> set[str]:
        """Every stored sample id that contains `fragment` (a batch passes `@SETTINGS_gen`): one query
        returning one column, so resuming 100,000 samples costs milliseconds, not a join on a bound list."""
        with self._connection() as conn, _duckdb_errors(f"cannot read {self.path}", self.path):
            if conn.execute("SELECT NOT EXISTS (SELECT 1 FROM samples)").fetchone()[0]:
                return set()  # a new store: no numpy import (~60 ms of a short run's start-up)
            column = conn.execute("SELECT sample_id FROM samples WHERE contains(sample_id, ?)", [fragment]).fetchnumpy()
            return set(column["sample_id"].tolist())

    # -- verdicts ---------------------------------------------------------------------------
    def _status(self, sample_id: str) -> str:
        rows = self.query("SELECT status FROM samples WHERE sample_id = ?", [sample_id])
        if not rows:
            raise UnknownSample(sample_id)
        return rows[0][0]

    def record_verdict(
        self,
        sample_id: str,
        status: str,
        reason: str | None = None,
        note: str | None = None,
        tags: Sequence[str] = (),
        who: str | None = None,
        override: bool = False,
        source: str = "app",
    ) -> int:
        """`override`: the reviewer approved although the sample has an error finding (asked and confirmed).
        One action of one sample (see `bulk_review`); returns its id."""
        if status not in STATUSES:
            raise ValueError(f"unknown status {status!r} (choose from {', '.join(STATUSES)})")
        with self._connection():
            self._status(sample_id)
            action = bulk_review.new_action_id(self)
            self._tx(
                [
                    bulk_review.action_row(action, who, status, reason, 1, source),
                    (
                        'INSERT INTO verdicts (sample_id, "at", who, kind, status, reason, note, tags, override, '
                        "action_id) VALUES (?, now(), ?, 'verdict', ?, ?, ?, ?, ?, ?)",
                        [sample_id, who, status, reason, note, list(tags), override, action],
                    ),
                    ("UPDATE samples SET status = ? WHERE sample_id = ?", [status, sample_id]),
                ]
            )
            return action

    def undo_verdict(self, sample_id: str, who: str | None = None) -> str:
        """Take back the latest verdict; the status it had before comes back. Returns the new status."""
        with self._connection():
            current = self._status(sample_id)
            live = self.query(
                "SELECT seq, status FROM verdicts WHERE sample_id = ? AND kind = 'verdict' AND "
                "NOT undone ORDER BY seq DESC LIMIT 2",
                [sample_id],
            )
            if not live:
                return current
            restored = live[1][1] if len(live) > 1 else "pending"
            self._tx(
                [
                    ("UPDATE verdicts SET undone = true WHERE seq = ?", [live[0][0]]),
                    (
                        "INSERT INTO verdicts (sample_id, \"at\", who, kind, status) VALUES (?, now(), ?, 'undo', ?)",
                        [sample_id, who, restored],
                    ),
                    ("UPDATE samples SET status = ? WHERE sample_id = ?", [restored, sample_id]),
                ]
            )
            return restored

    def undo_latest(self, sample_id: str, who: str | None = None) -> str | None:
        """Take back the sample's latest verdict, note or tag, whichever came last (what `u` means in the app).

        Returns what was undone ("verdict" or "note"), or None when there was nothing to undo.
        """
        with self._connection():
            self._status(sample_id)
            last = self.query(
                "SELECT seq, kind FROM verdicts WHERE sample_id = ? AND kind IN ('verdict', 'note') "
                "AND NOT undone ORDER BY seq DESC LIMIT 1",
                [sample_id],
            )
            if not last:
                return None
            if last[0][1] == "note":
                self._tx(
                    [
                        ("UPDATE verdicts SET undone = true WHERE seq = ?", [last[0][0]]),
                        (
                            "INSERT INTO verdicts (sample_id, \"at\", who, kind) VALUES (?, now(), ?, 'undo')",
                            [sample_id, who],
                        ),
                    ]
                )
                return "note"
            self.undo_verdict(sample_id, who=who)
            return "verdict"

    def add_note(
        self, sample_id: str, note: str, who: str | None = None, tags: Sequence[str] = (), source: str = "app"
    ) -> int:
        """A note and/or tags on one sample: one action; returns its id."""
        with self._connection():
            self._status(sample_id)
            action = bulk_review.new_action_id(self)
            kind = "tag" if tags and not note else "note"
            self._tx(
                [
                    bulk_review.action_row(action, who, kind, note or ", ".join(tags), 1, source),
                    (
                        'INSERT INTO verdicts (sample_id, "at", who, kind, note, tags, action_id) '
                        "VALUES (?, now(), ?, 'note', ?, ?, ?)",
                        [sample_id, who, note, list(tags), action],
                    ),
                ]
            )
            return action

    def undo_action(
        self, action_id: int | None = None, who: str | None = None, source: str = "app"
    ) -> bulk_review.Undone | None:
        """Take back the latest action not undone (or `action_id`), a bulk one as one step, wherever it was made
        (what `u` means in the app); None when nothing is left to undo."""
        with self._connection():
            return bulk_review.undo_action(self, action_id, who=who, source=source)

    def actions(self, limit: int = 50) -> list[bulk_review.Action]:
        """The latest actions first: what `tokview review --history` and the app's undo list show."""
        return bulk_review.actions(self, limit)

    def tag_counts(self) -> list[tuple[str, int]]:
        """(tag, samples carrying it) for every live tag, tags compared without case (one spelling shown)."""
        return [(r[0], r[1]) for r in self.query(queries.TAG_COUNTS)]

    # -- reads ------------------------------------------------------------------------------
    def samples_page(
        self, filters: SampleFilter | None = None, order_by: str | None = None, offset: int = 0, limit: int = 100
    ) -> list[SampleRow]:
        with self._connection() as conn, _duckdb_errors(f"cannot read {self.path}", self.path):
            return queries.samples_page(conn, filters, order_by, offset, limit)

    def count_samples(self, filters: SampleFilter | None = None) -> int:
        with self._connection() as conn, _duckdb_errors(f"cannot read {self.path}", self.path):
            return queries.count_samples(conn, filters)

    def load_sample(self, sample_id: str) -> StoredSample:
        with self._connection() as conn, _duckdb_errors(f"cannot read {self.path}", self.path):
            cur = conn.execute("SELECT * FROM samples WHERE sample_id = ?", [sample_id])
            names = [d[0] for d in cur.description]
            found = cur.fetchone()
            if found is None:
                raise UnknownSample(sample_id)
            row = dict(zip(names, found))
            findings = [
                Finding(c, s, d, tuple(p or ()))
                for c, s, d, p in self.query(
                    "SELECT code, severity, detail, positions FROM findings WHERE sample_id = ? ORDER BY rowid",
                    [sample_id],
                )
            ]
            history = [
                dict(zip(("seq", "at", "who", "kind", "status", "reason", "note", "tags", "undone", "override"), h))
                for h in self.query(
                    'SELECT seq, "at", who, kind, status, reason, note, tags, undone, '
                    "override FROM verdicts WHERE sample_id = ? ORDER BY seq",
                    [sample_id],
                )
            ]
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

    def rows_for(self, sample_ids: Sequence[str]) -> list[dict[str, Any]]:
        """Full rows (ids, text, settings) for these samples, in the order asked: what exports read."""
        if not sample_ids:
            return []
        with self._connection() as conn, _duckdb_errors(f"cannot read {self.path}", self.path):
            cur = conn.execute(
                "SELECT s.* FROM samples s JOIN (SELECT unnest(?::VARCHAR[]) AS id) q ON s.sample_id = q.id",
                [list(sample_ids)],
            )
            names = [d[0] for d in cur.description]
            by_id = {r[0]: dict(zip(names, r)) for r in cur.fetchall()}
        return [by_id[i] for i in sample_ids if i in by_id]

    def stats(self) -> dict[str, Any]:
        with self._connection() as conn, _duckdb_errors(f"cannot read {self.path}", self.path):
            return queries.stats(conn)

    def runs(self) -> list[dict[str, Any]]:
        names = (
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
        rows = self.query(
            f"SELECT {', '.join('r.' + n for n in names)}, "
            "(SELECT count(*) FROM samples s WHERE s.run_id = r.run_id) AS samples, "
            "(SELECT count(*) FROM failures f WHERE f.run_id = r.run_id) AS failures "
            "FROM runs r ORDER BY started, run_id"
        )
        out = []
        for r in rows:
            d = dict(zip((*names, "samples", "failures"), r))
            for key in ("settings", "server_info", "profile_def"):
                d[key] = from_json(d[key])
            out.append(d)
        return out

    def run(self, run_id: str | None) -> dict[str, Any] | None:
        """One run's row of `runs()` (its settings, tokenizer folder and hash, profile), or None when it has none."""
        return next((r for r in self.runs() if r["run_id"] == run_id), None) if run_id else None

    def run_ids(self) -> list[str]:
        """Every run id: those with a runs row, then those only samples carry (imported data)."""
        known = [r["run_id"] for r in self.runs()]
        extra = [
            r[0]
            for r in self.query("SELECT DISTINCT run_id FROM samples WHERE run_id IS NOT NULL ORDER BY 1")
            if r[0] not in known
        ]
        return known + extra

    def stored_conversations(self) -> list[tuple[str, list[dict[str, Any]]]]:
        """One conversation per prompt id already in the store (to sample it again)."""
        rows = self.query(
            "SELECT prompt_id, any_value(messages) FROM samples WHERE messages IS NOT NULL "
            "GROUP BY prompt_id ORDER BY prompt_id"
        )
        return [(pid, from_json(m)) for pid, m in rows if m]

    def length_distribution(
        self,
        close_id: int | None,
        limit: int = 200_000,
        close_ids: dict[tuple[str | None, str | None], int | None] | None = None,
    ) -> tuple[list[int], list[int]]:
        """(output lengths, reasoning lengths = ids before the first closer) for the stats plots.

        `close_ids`: the closer per (run id, sample profile) of `profile_pairs()`, for a store holding
        several models (a Qwen3 sample's reasoning ends at Qwen3's closer, not Kimi's); a sample whose
        pair is not in it uses `close_id`."""
        pairs = list((close_ids or {}).items())
        table = (
            ", ".join(["(?::VARCHAR, ?::VARCHAR, ?::BIGINT)"] * len(pairs))
            or "(NULL::VARCHAR, NULL::VARCHAR, NULL::BIGINT)"
        )
        rows = self.query(
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

    def profile_pairs(self) -> list[tuple[str | None, str | None]]:
        """Every (run id, sample profile) the samples carry: what decides which model's rules a sample follows."""
        return [(r[0], r[1]) for r in self.query("SELECT DISTINCT run_id, profile FROM samples ORDER BY 1, 2")]

    def finish_reasons(self) -> dict[str, int]:
        return {
            str(k): v
            for k, v in self.query(
                "SELECT coalesce(finish_reason, 'none'), count(*) FROM samples GROUP BY 1 ORDER BY 2 DESC"
            )
        }

    def finding_codes(self) -> list[str]:
        return [r[0] for r in self.query("SELECT DISTINCT code FROM findings ORDER BY code")]


def _cannot_write(message: str) -> bool:
    """DuckDB's open failed because the file or its file system cannot be written (it may still be read)."""
    return "Read-only file system" in message or "Permission denied" in message


def _say_on_stderr(message: str) -> None:
    print(f"tokview: {message}", file=sys.stderr, flush=True)
