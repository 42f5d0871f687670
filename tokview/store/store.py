"""The DuckDB store: one file holds every run, sample, finding, failure and verdict.

Shared live: DuckDB lets one process at a time open a file, so a Store never keeps it open. Every
operation opens the file, runs one short transaction or query and closes it again (`hold()` keeps
it open across a few related calls); a process that finds it taken waits, and says which tokview
command holds it if the wait gets long. Batches do not write samples here directly: they append
crash-safe parts beside the file (see `parts.py`) that `ingest()` lands in one transaction, so
`ui`, `stats`, `show`, `export` and further batches all work on a store while a batch fills it.

`Store` is the one object callers hold; it is a facade over the pieces that do the work: the file and its
lock (`connection.py`), the parts writer (`part_sink.py`) and the repositories of samples (`sample_repo.py`),
review (`review_repo.py`, `bulk_review.py`), landing parts and other stores (`landing.py`) and reads
(`query_repo.py`).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

import duckdb

from tokview.core.record import Capture
from tokview.default_store import DEFAULT_DB as DEFAULT_DB
from tokview.store import bulk_review, parts
from tokview.store.connection import LINGER_S as LINGER_S
from tokview.store.connection import LOCK_TIMEOUT_S as LOCK_TIMEOUT_S
from tokview.store.connection import MAX_HOLD_S as MAX_HOLD_S
from tokview.store.connection import UNFINISHED_AFTER_S as UNFINISHED_AFTER_S
from tokview.store.connection import Statement, StoreFile, say_on_stderr, store_wait_s
from tokview.store.connection import holder_of as holder_of
from tokview.store.connection import is_duckdb_file as is_duckdb_file
from tokview.store.errors import StoreError as StoreError
from tokview.store.errors import StoreFull as StoreFull
from tokview.store.errors import StoreHeld as StoreHeld
from tokview.store.landing import Landing, has_parts, merge_source
from tokview.store.part_sink import PartSink
from tokview.store.query_repo import CloserKey, QueryRepository
from tokview.store.review_repo import ReviewRepository
from tokview.store.run_files import land_run_files
from tokview.store.sample_repo import RunProvenance, SampleRepository
from tokview.store.sample_rows import SampleFilter, SampleIdentity, SampleRow, StoredSample
from tokview.store.schema import migrate, refuse_foreign, refuse_unmigrated

if TYPE_CHECKING:
    from tokview.core.analysis import Analysis


_NOT_SHOWN = "(their samples are not shown until a command opens it where it can be written)"


class Store:
    """Open (create, migrate) a tokview DuckDB file; `":memory:"` for a throwaway store.

    `server_urls`: the URLs the captures come from (may hold `user:password@`); their credentials
    are masked wherever they appear in a stored payload (`add_server_urls` adds more later)."""

    def __init__(
        self,
        path: str | Path = DEFAULT_DB,
        server_urls: Iterable[str] = (),
        *,
        lock_timeout: float | None = None,
        on_wait: Callable[[str], None] | None = None,
        linger: float = LINGER_S,
    ) -> None:
        """`lock_timeout`: how long to wait for a file another program holds (default `store_wait_s()`);
        `on_wait(message)` hears about a long wait for another process (default: one line on stderr);
        `linger`: seconds the file stays open after an operation (0: closed at once)."""
        self.path = str(path)
        if not self.path.strip():  # DuckDB opens "" as a throwaway in-memory database: nothing would be kept
            raise StoreError("no store named: give a .duckdb file path (the path given is empty)")
        if self.path.endswith(("/", os.sep)):  # DuckDB made a file named like the folder ("newdir/" -> newdir)
            raise StoreError(f"{self.path} names a folder: give a .duckdb file path (e.g. {self.path}{DEFAULT_DB})")
        self._file = StoreFile(
            self.path,
            lock_timeout=lock_timeout if lock_timeout is not None else store_wait_s(),
            on_wait=on_wait if on_wait is not None else say_on_stderr,
            linger=linger,
        )
        self._sink = PartSink(self.path, server_urls, parts_dir=lambda: self._file.parts_dir)
        self._samples = SampleRepository(self._file, self._sink)
        self._review = ReviewRepository(self._file)
        self._landing = Landing(self._file)
        self._reads = QueryRepository(self._file)
        self._file.prepare()
        self._file.open_checked(self._check_schema)
        self._land_leftover_parts()

    def _check_schema(self, conn: duckdb.DuckDBPyConnection) -> None:
        """Another program's database is refused; a read-only file must already hold this tokview's schema
        (upgrading writes); a writable one is created or migrated."""
        refuse_foreign(conn, self.path)
        if self.read_only:
            refuse_unmigrated(conn, self.path)
        else:
            migrate(conn)

    def _land_leftover_parts(self) -> None:
        """Land the parts a killed batch left behind; a read-only or full store keeps them for later."""
        left = (
            []
            if self._file.memory
            else [p for kind in parts.complete_parts(self.parts_dir, self._file.on_wait) for p in kind]
        )
        kept = "the store is read-only" if self.read_only else parts.unwritable(self.parts_dir)
        if left and kept:
            self._file.on_wait(f"{len(left)} part(s) beside {self.path} are not landed: {kept} {_NOT_SHOWN}")
        elif left:
            try:
                self.ingest()
            except StoreError as exc:  # a full disk: what is landed can still be read, exported, reviewed
                self._file.on_wait(f"parts left beside {self.path} are not landed yet ({exc}); they are kept")

    # -- the file -------------------------------------------------------------------------------------
    @property
    def read_only(self) -> bool:
        """Opened read-only: the file (or its file system) cannot be written."""
        return self._file.read_only

    @property
    def is_open(self) -> bool:
        """Whether this process has the database file open right now (it lingers open for a burst)."""
        return self._file.is_open

    @property
    def _depth(self) -> int:
        return self._file.depth

    @property
    def parts_dir(self) -> Path:
        """Where writers put parts: beside the file (a private temporary folder for `:memory:`)."""
        return self._file.parts_dir

    @contextmanager
    def hold(self) -> Iterator[Store]:
        """Keep the file open across several calls (e.g. the dozen queries of `stats`); keep it short."""
        with self._file.connection():
            yield self

    def close(self) -> None:
        self._file.close()

    def __enter__(self) -> Store:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def query(self, sql: str, params: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
        """Run read-only SQL under the store's lock (exports and reports use it)."""
        return self._file.query(sql, params)

    def execute(self, sql: str, params: Sequence[Any] = ()) -> None:
        """Run one statement under the lock (e.g. DuckDB's `COPY … TO` for Parquet exports)."""
        self._file.execute(sql, params)

    def write(self, statements: Iterable[Statement]) -> None:
        """Run these statements in one transaction under the lock: all of them land, or none."""
        self._file.write(statements)

    # -- parts ----------------------------------------------------------------------------------------
    def add_server_urls(self, urls: Iterable[str]) -> None:
        """Mask these URLs' user names and passwords in every payload written from now on."""
        self._sink.add_server_urls(urls)

    def sample_record(
        self,
        key: SampleIdentity,
        capture: Capture,
        analysis: Analysis,
    ) -> dict[str, Any]:
        """One sample as a part line (see `PartSink.sample_record`)."""
        return self._sink.sample_record(key, capture, analysis)

    def write_part(self, samples: Sequence[dict[str, Any] | bytes], failures: Sequence[dict[str, Any]] = ()) -> None:
        """Hand finished samples and failures to the store without holding the file (see `parts.py`)."""
        self._sink.write_part(samples, failures)

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
            land_run_files(self, self._file.on_wait)  # a run a writer could not record: its row before its samples
            return self._ingest_parts()
        except (StoreFull, StoreHeld):  # held: nothing was read, and a salvage would wait for the file once more
            raise
        except StoreError:
            damaged, kept = self._landing.salvage()
            if not damaged:
                raise
            self._file.on_wait(
                f"{damaged} damaged part(s) set aside in {self.parts_dir / parts.DAMAGED_DIR} "
                f"({kept} whole lines of them kept)"
            )
            return self._ingest_parts()

    def _ingest_parts(self) -> tuple[int, int]:
        return self._landing.land_parts()

    def merge(self, source: str | Path) -> dict[str, int]:
        """Land another tokview store's samples, findings, verdicts, runs and open failures (see `landing.py`).

        Raises MergeRefused (another model/tokenizer/profile, not a store) or StoreError."""
        src = merge_source(source, self.path)
        if has_parts(src):
            # samples a killed (or running) batch left beside it: landed as opening it with any command
            # would, so the merge takes them too (the source is attached read-only)
            Store(src, lock_timeout=self._file.lock_timeout, on_wait=self._file.on_wait).close()
        return self._landing.merge(src)

    # -- samples, runs, failures ----------------------------------------------------------------------
    def put_run(
        self,
        run_id: str,
        *,
        settings: dict[str, Any] | None = None,
        profile: str | None = None,
        tokenizer_dir: str | None = None,
        tokenizer_hash: str | None = None,
        template_hash: str | None = None,
        server_info: list[Any] | None = None,
        source: str | None = None,
        profile_def: dict[str, Any] | None = None,
    ) -> None:
        """Record (or refresh) a run's provenance: what the manifest of an export reports.

        `profile_def`: the profile's fields (`profiles.profile_fields`), so a profile read from a .toml
        file is the one `show`, the app and exports analyse the run's samples with, not a guess."""
        run = RunProvenance(
            settings=settings,
            profile=profile,
            tokenizer_dir=tokenizer_dir,
            tokenizer_hash=tokenizer_hash,
            template_hash=template_hash,
            server_info=server_info,
            source=source,
            profile_def=profile_def,
        )
        self._samples.put_run(run_id, run)

    def reviewed_ids(self, run_id: str) -> dict[str, tuple[list[int], list[int]]]:
        """The run's reviewed samples (approved or rejected): sample id → (prompt ids, output ids). What an audit of
        a dataset again compares each row with (a review of other ids goes back to pending)."""
        rows = self.query(
            "SELECT sample_id, prompt_ids, output_ids FROM samples WHERE run_id = ? AND status <> 'pending' "
            "AND prompt_from IS NULL",
            [run_id],
        )
        return {r[0]: (list(r[1]), list(r[2])) for r in rows}

    def forget_empty_run(self, run_id: str) -> None:
        """Remove a run's row when no sample or failure is stored under it (an audit of a dataset with no readable
        row: nothing of it is in the store, and the run would be listed as if it were)."""
        self._file.write(
            [
                (
                    "DELETE FROM runs WHERE run_id = ? AND NOT EXISTS (SELECT 1 FROM samples WHERE run_id = ?) "
                    "AND NOT EXISTS (SELECT 1 FROM failures WHERE run_id = ?)",
                    [run_id, run_id, run_id],
                )
            ]
        )

    def put_sample(
        self,
        sample_id: str,
        prompt_id: str,
        run_id: str | None,
        capture: Capture,
        analysis: Analysis,
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
        record = self.sample_record(
            SampleIdentity(sample_id, prompt_id, run_id, gen_index=gen_index, turn=turn, profile=profile),
            capture,
            analysis,
        )
        self._samples.put_sample(record, new=new)

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
        self._samples.put_failures(failures)

    def failures(self, run_id: str | None = None) -> list[dict[str, Any]]:
        """The current failures (one per sample id, the latest reason, how many attempts failed): errors.jsonl's."""
        return self._samples.failures(run_id)

    def existing_sample_ids(self, ids: Iterable[str]) -> set[str]:
        """The subset of `ids` already stored: the anti-join that makes re-runs resume."""
        return self._samples.existing_sample_ids(ids)

    def stored_ids_with(self, fragment: str) -> set[str]:
        """Every stored sample id holding `fragment` (`@SETTINGS_gen`): one query, not a join on a bound list."""
        return self._samples.stored_ids_with(fragment)

    def stored_prompts_with(self, fragment: str, each: Callable[[str, str], None]) -> None:
        """`each(prompt id, stored messages)` of the single-turn samples whose id holds `fragment`: a resume's check."""
        self._samples.stored_prompts_with(fragment, each)

    def load_sample(self, sample_id: str) -> StoredSample:
        return self._samples.load_sample(sample_id)

    def rows_for(self, sample_ids: Sequence[str], where: tuple[str, list[Any]] | None = None) -> list[dict[str, Any]]:
        """Full rows for these samples in the order asked (exports'); with `where`, those matching it only."""
        return self._samples.rows_for(list(sample_ids), where)

    # -- review ---------------------------------------------------------------------------------------
    def record_verdict(
        self,
        sample_id: str,
        status: str,
        reason: str | None = None,
        *,
        note: str | None = None,
        tags: Sequence[str] = (),
        who: str | None = None,
        override: bool = False,
        source: str = "app",
    ) -> int:
        """`override`: the reviewer approved although the sample has an error finding (asked and confirmed).
        One action of one sample (see `bulk_review`); returns its id."""
        return self._review.record_verdict(
            sample_id, status, reason=reason, note=note, tags=tags, who=who, override=override, source=source
        )

    def undo_verdict(self, sample_id: str, who: str | None = None) -> str:
        """Take back the latest verdict; the status it had before comes back. Returns the new status."""
        return self._review.undo_verdict(sample_id, who=who)

    def undo_latest(self, sample_id: str, who: str | None = None) -> str | None:
        """Take back the sample's latest verdict, note or tag, whichever came last (what `u` means in the app).

        Returns what was undone ("verdict" or "note"), or None when there was nothing to undo.
        """
        return self._review.undo_latest(sample_id, who=who)

    def add_note(
        self, sample_id: str, note: str, who: str | None = None, tags: Sequence[str] = (), source: str = "app"
    ) -> int:
        """A note and/or tags on one sample: one action; returns its id."""
        return self._review.add_note(sample_id, note, who=who, tags=tags, source=source)

    def undo_action(
        self, action_id: int | None = None, who: str | None = None, source: str = "app"
    ) -> bulk_review.Undone | None:
        """Take back the latest action not undone (or `action_id`), a bulk one as one step, wherever it was made
        (what `u` means in the app); None when nothing is left to undo."""
        return self._review.undo_action(action_id, who=who, source=source)

    def actions(self, limit: int = 50) -> list[bulk_review.Action]:
        """The latest actions first: what `tokview review --history` and the app's undo list show."""
        return bulk_review.actions(self._file, limit)

    def tag_counts(self) -> list[tuple[str, int]]:
        """(tag, samples carrying it) for every live tag, tags compared without case (one spelling shown)."""
        return self._reads.tag_counts()

    # -- reads ----------------------------------------------------------------------------------------
    def samples_page(
        self, filters: SampleFilter | None = None, order_by: str | None = None, offset: int = 0, limit: int = 100
    ) -> list[SampleRow]:
        return self._reads.samples_page(filters, order_by, offset, limit)

    @property
    def reads(self) -> QueryRepository:
        """Reads besides the ones above: a range's ids (`M`), the next pending sample (`]`), what a run holds."""
        return self._reads

    def count_samples(self, filters: SampleFilter | None = None) -> int:
        return self._reads.count_samples(filters)

    def holds_nothing(self) -> bool:
        """No sample, failure or run in it: a store just made (a batch's landing child removes one whose run never
        began, unless opening it landed parts a concurrent batch had left)."""
        held = self.query(
            "SELECT (SELECT count(*) FROM samples) + (SELECT count(*) FROM failures) + (SELECT count(*) FROM runs)"
        )
        return bool(held) and held[0][0] == 0

    def stats(self) -> dict[str, Any]:
        return self._reads.stats()

    def runs(self) -> list[dict[str, Any]]:
        return self._reads.runs()

    def run(self, run_id: str | None) -> dict[str, Any] | None:
        """One run's row of `runs()` (its settings, tokenizer folder and hash, profile), or None when it has none."""
        return next((r for r in self.runs() if r["run_id"] == run_id), None) if run_id else None

    def run_ids(self) -> list[str]:
        """Every run id: those with a runs row, then those only samples carry (imported data)."""
        return self._reads.run_ids()

    def stored_conversations(self) -> list[tuple[str, list[dict[str, Any]], list[dict[str, Any]] | None]]:
        """One conversation per prompt id already in the store (to sample it again)."""
        return self._reads.stored_conversations()

    def length_distribution(
        self,
        close_id: int | None,
        limit: int = 200_000,
        close_ids: dict[CloserKey, int | None] | None = None,
    ) -> tuple[list[int], list[int]]:
        """(output lengths, reasoning lengths = ids before the first closer) for the stats plots.

        `close_ids`: the closer per (run id, sample profile) of `profile_pairs()`, for a store holding
        several models (a Qwen3 sample's reasoning ends at Qwen3's closer, not Kimi's); a sample whose
        pair is not in it uses `close_id`."""
        return self._reads.length_distribution(close_id, limit, close_ids or {})

    def profile_pairs(self) -> list[CloserKey]:
        """Every (run id, sample profile) the samples carry: what decides which model's rules a sample follows."""
        return self._reads.profile_pairs()

    def finish_reasons(self) -> dict[str, int]:
        return self._reads.finish_reasons()

    def finding_codes(self) -> list[str]:
        return self._reads.finding_codes()
