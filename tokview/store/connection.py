"""The store's file: opening it under other processes' locks, keeping it open for a burst, and transactions.

DuckDB lets one process at a time open a file, so the store never keeps it open: every operation opens it,
runs one short transaction or query and closes it again (`StoreFile.connection()` nested keeps it open across
related calls); a process that finds it taken waits, and says which tokview command holds it if the wait gets
long. Within a process, threads (the UI's workers, a batch's writer) share one lock. `transaction()` is the
one place BEGIN, COMMIT and ROLLBACK are written: every write of the store package goes through it.
"""

from __future__ import annotations

import atexit
import fcntl
import os
import re
import signal
import stat
import sys
import threading
import time
import weakref
from collections import OrderedDict
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Protocol

import duckdb

from tokview.errors import first_line
from tokview.secrets import scrub_text
from tokview.store import parts
from tokview.store.errors import StoreError, StoreFull, StoreHeld, is_disk_full, no_room_said
from tokview.store_log import DUCKDB_MAGIC, database_as_log, log_refusal

Statement = tuple[str, Sequence[Any]]
"""One SQL statement and its parameters (DuckDB takes any JSON-like value, lists of ids, None)."""

LOCK_TIMEOUT_S = 120.0
"""How long an operation waits for another process to release the file before it gives up (`TOKVIEW_STORE_WAIT_S`
sets another)."""
WAIT_ENV = "TOKVIEW_STORE_WAIT_S"


def store_wait_s() -> float:
    """The wait for a store another program holds: `TOKVIEW_STORE_WAIT_S` seconds, else `LOCK_TIMEOUT_S`. A team
    whose notebooks hold the store for minutes waits longer; a test, shorter. StoreError for a value that is not a
    number of seconds."""
    given = os.environ.get(WAIT_ENV, "").strip()
    if not given:
        return LOCK_TIMEOUT_S
    try:
        seconds = float(given)
    except ValueError:
        seconds = -1.0
    if not 0 <= seconds < float("inf"):
        raise StoreError(f"{WAIT_ENV} must be a number of seconds (0 or more), not {given[:40]!r}")
    return seconds


LOCK_SAY_AFTER_S = 1.0
"""Waits longer than this are announced (once) with the holder's tokview command."""
LINGER_S = 0.2
"""After an operation the file stays open this long for the next one (the app's count, page and sample
of one keypress reuse one warm connection); then it is closed for other processes."""
MAX_HOLD_S = 1.0
"""Never longer than this in one stretch, however busy: other processes always get their turn."""
LOCK_WORDS = ("Could not set lock", "Conflicting lock", "Unique file handle conflict")
"""What DuckDB's message says when another process holds the file, or (the last) when another DuckDB instance of this
process still has it open: DuckDB puts off a DETACH while a statement refers to the database, so a file closed a moment
ago may still be attached; it is waited for like another process's lock."""
_PID = re.compile(r"\(PID (\d+)\)")
_NOT_A_DATABASE = "not a valid DuckDB database file"
_OPEN_HERE: dict[str, int] = {}
"""Store files this process has open in DuckDB, by real path: how many connections (read and changed under
_OPEN_HERE_LOCK).

Why: DuckDB locks its file with a POSIX (fcntl) lock, and the kernel drops every such lock a process holds on a
file the moment that process closes *any* descriptor of it. The header checks below open and close the file, so
one made while a connection of this process had it open (a second Store of the same path while the first one
lingered open: the proxy recording in a thread, a test) left the file unlocked, and another process (the proxy's
recorder child, a batch) opened and wrote it beside this one: a landing lost, or a file DuckDB refused to open
("the WAL checkpoint iteration does not match the database file"). A file open here is not read by them again."""
_OPEN_HERE_LOCK = threading.Lock()
"""Held while a connection is made or closed and while a header check reads the file: no check opens it between."""
UNFINISHED_AFTER_S = 0.5
"""A 0-byte file younger than this may be a store another process is creating this instant (DuckDB creates the
file, locks it at once and then writes its header): it is waited for, never removed. Shorter than
LOCK_SAY_AFTER_S, so a re-run right after a failed creation waits without announcing a holder that is gone."""


class Database(Protocol):
    """What the store's SQL helpers (bulk review, side data, sessions, stats) need of a store: reads and one
    transaction of writes, under the store's lock. `Store` and `StoreFile` both are one."""

    def query(self, sql: str, params: Sequence[Any] = ()) -> list[tuple[Any, ...]]: ...

    def write(self, statements: Iterable[Statement]) -> None: ...


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
def duckdb_errors(what: str, path: str = "") -> Iterator[None]:
    """Turn a DuckDB error into a one-line StoreError: callers and the CLI never see duckdb's types."""
    try:
        yield
    except duckdb.Error as exc:
        if is_disk_full(exc):
            raise StoreFull(f"{no_room_said(exc)} ({path or what})") from None
        first = scrub_text(first_line(exc))
        raise StoreError(f"{what}: {first}") from None


@contextmanager
def transaction(conn: duckdb.DuckDBPyConnection, *, commit: bool = True) -> Iterator[duckdb.DuckDBPyConnection]:
    """BEGIN, the block, COMMIT; ROLLBACK when the block (or the COMMIT) raises. `commit=False` rolls back either
    way: a trial that only asks whether the block runs.

    A ROLLBACK that fails is passed over: a failed COMMIT (a full disk) has already ended the transaction, and
    the error that ended it is the one to tell."""
    conn.execute("BEGIN TRANSACTION")
    try:
        yield conn
        if commit:
            conn.execute("COMMIT")
            return
    except BaseException:
        _rollback(conn)
        raise
    _rollback(conn)


def _rollback(conn: duckdb.DuckDBPyConnection) -> None:
    try:
        conn.execute("ROLLBACK")
    except duckdb.Error:  # a connection the error invalidated, or a transaction a failed COMMIT ended
        pass


class LockWait:
    """Waiting for a DuckDB file another process holds: backing off, said once after a second, given up
    (one line naming the holder) after `timeout` seconds."""

    def __init__(self, path: str, timeout: float, on_wait: Callable[[str], None]) -> None:
        self.path, self.timeout, self.on_wait = path, timeout, on_wait
        self.started, self.said, self.delay = time.monotonic(), False, 0.005

    def again(self, message: str) -> None:
        """Sleep before the next try; StoreHeld when the wait is over."""
        waited = time.monotonic() - self.started
        if waited >= self.timeout:
            raise StoreHeld(
                f"the store {self.path} is in use by {holder_of(message)}: gave up after {waited:.0f}s "
                "(try again when it finishes)"
            ) from None
        if not self.said and waited >= LOCK_SAY_AFTER_S:
            self.said = True
            self.on_wait(f"waiting for {self.path}: in use by {holder_of(message)}")
        time.sleep(self.delay)
        self.delay = min(self.delay * 2, 0.1)


def _real(path: str | Path) -> str:
    return os.path.realpath(Path(path).expanduser())


def _open_here(path: str | Path) -> bool:
    """Whether this process has `path` open in DuckDB (ask under _OPEN_HERE_LOCK)."""
    return _OPEN_HERE.get(_real(path), 0) > 0


def is_duckdb_file(path: str | Path) -> bool:
    """Whether `path` is a DuckDB database file (its header's magic bytes): False when absent or unreadable."""
    with _OPEN_HERE_LOCK:
        if _open_here(path):
            return True  # open in DuckDB here (and reading it would drop this process's lock on it)
        try:
            with open(Path(path).expanduser(), "rb") as f:
                return f.read(12)[8:12] == DUCKDB_MAGIC
        except OSError:
            return False


def refuse_other_files(path: str) -> None:
    """A --db that is some other file (a prompts file given in the wrong place, a Parquet or CSV file)
    is named as such: DuckDB itself opens some of them as a database of their own and lists their tables."""
    with _OPEN_HERE_LOCK:
        if _open_here(path):
            return  # a store open here already (and reading it would drop this process's lock on it)
        refuse_a_store_as_log(path)
        where = Path(path).expanduser()
        try:
            mode = where.stat().st_mode
        except OSError:
            return  # a new store (or unreachable: DuckDB's own error says why)
        if not (stat.S_ISREG(mode) or stat.S_ISDIR(mode)):  # a FIFO's open waits for a writer, past Ctrl-C
            raise StoreError(f"{path} is not a regular file (a tokview store is a DuckDB file): pass another --db")
        try:
            with open(where, "rb") as f:
                head = f.read(12)
        except (FileNotFoundError, IsADirectoryError, NotADirectoryError):
            return  # a new store, or a folder DuckDB names itself
        except OSError:
            return  # unreadable: DuckDB's own error says why
    if head and head[8:12] != DUCKDB_MAGIC:
        raise StoreError(f"{path} is not a DuckDB database (a tokview store is one): pass another --db")


def refuse_a_store_as_log(path: str) -> None:
    """A StoreError when `PATH.wal` is a whole database, which opening PATH would delete (`tokview.store_log`)."""
    log = database_as_log(path)
    if log is not None:
        raise StoreError(log_refusal(path, log))


def clear_unfinished_file(path: str, wait: LockWait) -> bool:
    """A 0-byte store file is what DuckDB leaves when it could not write a new file's header (a full disk): it
    holds nothing, so it is removed and the store created anew. True: try opening again (removed, or too young
    to tell and waited for); False: not such a file (it has bytes, a write-ahead log beside it, or another
    process holds its lock), left as it is for DuckDB's own error."""
    with _OPEN_HERE_LOCK:
        if _open_here(path):
            return False  # open here: DuckDB's error stands (and opening it would drop this process's lock)
        cleared = _clear_unfinished_file(path)
    if cleared is None:  # too young to tell: waited for (not under the lock), then tried again
        wait.again(f"{path} is being created")
        return True
    return cleared


def _clear_unfinished_file(path: str) -> bool | None:
    """`clear_unfinished_file` under _OPEN_HERE_LOCK; None: a file too young to tell."""
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
        if -UNFINISHED_AFTER_S < time.time() - seen.st_mtime < UNFINISHED_AFTER_S:  # far ahead of the clock (copied
            return None  # with its times from a box whose clock was ahead, a clock stepped back): no creation going on
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


def cannot_write(message: str) -> bool:
    """DuckDB's open failed because the file or its file system cannot be written (it may still be read)."""
    return "Read-only file system" in message or "Permission denied" in message


ALIAS = "tokview_store"
"""The name a store file is attached under in its host instance."""
MAX_IDLE_HOSTS = 4
"""Host instances kept for store files this process closed (each holds a thread pool): the oldest closes past it."""
HOST_ATTACHES = 256
"""A host instance is closed (and the next open starts a fresh one) once it has attached its file this many times: the
memory a query over the whole store took (a scan of a column, a hash table of every sample id) stays in a living
instance after the DETACH (four scans of a 240 MB store, each attached and detached: 316, 396, 468, 645 MB), and a
long-lived process (a proxy's recorder attaches its store for every landing) holds it for good; a closed instance
gives it back (the same four scans, the instance closed after each: 313 MB every time). A fresh one costs ~15 ms."""
_HOSTS: OrderedDict[str, duckdb.DuckDBPyConnection] = OrderedDict()
_ATTACHES: dict[str, int] = {}
"""Per store file, how many times its living host instance attached it."""
"""An in-memory DuckDB for each store file of this process, by real path, that the file is ATTACHed to while a
connection here uses it and DETACHed from after (under _OPEN_HERE_LOCK); the most recently used last.

Why: a store is opened and closed for every operation, so other processes get their turn (the module's
docstring), and `duckdb.connect(path)` starts a whole DuckDB instance each time: 13-20 ms of CPU however small the
operation, a third of a proxy landing's cost and a fixed cost of every `batch`, `stats` and app read. ATTACH on a
living instance takes the same file lock and DETACH releases it (checkpointing as a close does) in ~1 ms. One
instance per file, not one for all: a statement that reads the catalog (a table listed, a name looked up) refers to
every database of its instance, and DuckDB puts off the DETACH of one a statement refers to, so another store's
long query kept a closed store's file locked; and a landing's `SET threads` or a merge's `src` stays the file's own."""


def _attach(real: str, *, read_only: bool) -> duckdb.DuckDBPyConnection:
    """A connection of its own (its temporary tables are its own) to the store file at `real`, attached to the file's
    host instance unless it is already (another StoreFile of the same file shares it, as `duckdb.connect` shared one
    instance per file). Called under _OPEN_HERE_LOCK."""
    host = _HOSTS.pop(real, None) or _new_host(real)
    _HOSTS[real] = host  # the most recently used last
    _close_idle_hosts()
    try:
        attached = _attached(host)
    except duckdb.Error:  # an instance a fatal error invalidated (a store file cut short): a new one
        _close_quietly(_HOSTS.pop(real))
        host = _HOSTS[real] = _new_host(real)
        attached = False
    if not attached:
        literal = "'" + real.replace("'", "''") + "'"  # DuckDB keeps a relative path as given: a chdir re-aims it
        host.execute(f"ATTACH {literal} AS {ALIAS}{' (READ_ONLY)' if read_only else ''}")
        _ATTACHES[real] = _ATTACHES.get(real, 0) + 1
    conn = host.cursor()
    try:
        conn.execute(f"USE {ALIAS}")
    except BaseException:
        conn.close()
        if not _OPEN_HERE.get(real):
            _detach(real)
        raise
    return conn


def _new_host(real: str) -> duckdb.DuckDBPyConnection:
    """A host instance for the store file at `real`, nothing attached yet."""
    host = duckdb.connect(":memory:")
    _ATTACHES[real] = 0
    # what does not fit in memory spills beside the store, as `duckdb.connect(path)` did, not into ./.tmp
    host.execute("SET temp_directory = ?", [real + ".tmp"])
    return host


def _close_idle_hosts() -> None:
    """Close the oldest host instances whose files are closed, past MAX_IDLE_HOSTS."""
    idle = [path for path in _HOSTS if not _OPEN_HERE.get(path)]
    for path in idle[: max(0, len(idle) - MAX_IDLE_HOSTS)]:
        _close_quietly(_HOSTS.pop(path))


def _detach(real: str) -> None:
    """Detach the file no connection here uses any more (DuckDB checkpoints it and releases its lock). Under
    _OPEN_HERE_LOCK. A checkpoint that fails (a full disk) leaves what it did not write in the WAL, as a close that
    could not checkpoint did, and DuckDB detaches the file anyway; were it still attached, it is detached once more
    without a checkpoint: a file left attached keeps every other process out of it until this one ends."""
    host = _HOSTS.get(real)
    try:
        if host is None or not _attached(host):
            return
    except duckdb.Error:  # invalidated by a fatal error (a store file cut short): the first error is the one told,
        _ATTACHES.pop(real, None)  # and the instance goes with its lock
        _close_quietly(_HOSTS.pop(real))
        return
    with _ctrl_c_after():
        try:
            host.execute(f"DETACH {ALIAS}")
        except duckdb.Error as exc:
            if _attached(host):
                host.execute("SET checkpoint_on_detach = 'DISABLED'")
                try:
                    host.execute(f"DETACH {ALIAS}")
                except duckdb.Error:
                    raise StoreError(f"cannot close {real}: {first_line(exc)}") from None
                finally:
                    host.execute("RESET checkpoint_on_detach")
        if _ATTACHES.get(real, 0) >= HOST_ATTACHES:  # the file is detached: its instance goes, with its memory
            _ATTACHES.pop(real, None)
            _close_quietly(_HOSTS.pop(real))


def _attached(host: duckdb.DuckDBPyConnection) -> bool:
    found = host.execute("SELECT count(*) FROM duckdb_databases() WHERE database_name = ?", [ALIAS]).fetchone()
    return bool(found and found[0])


def _close_quietly(host: duckdb.DuckDBPyConnection) -> None:
    try:
        host.close()
    except duckdb.Error:  # a daemon thread still inside a statement (at exit): the process ends around it
        pass


@contextmanager
def _ctrl_c_after() -> Iterator[None]:
    """Hold a Ctrl-C (SIGINT) that arrives during the block until it ends, then deliver it as it came.

    Why: DuckDB stops a statement the user interrupts, and ATTACH and DETACH are statements (DETACH writes the
    checkpoint `close()` wrote, which no signal stopped): an interrupted one left the file attached, its lock held,
    and surfaced as "Query interrupted" instead of the KeyboardInterrupt every command turns into exit 130. Only
    the main thread receives signals; elsewhere the block just runs."""
    if threading.current_thread() is not threading.main_thread() or signal.getsignal(signal.SIGINT) is None:
        yield  # no signal here, or a handler installed outside Python that could not be put back
        return
    held: list[int] = []
    previous = signal.signal(signal.SIGINT, lambda signum, frame: held.append(signum))
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)
        if held:
            signal.raise_signal(signal.SIGINT)


@atexit.register
def _close_hosts() -> None:
    """Close the host instances once the lingering files are closed (atexit runs `close_lingering_files`, registered
    after this, first)."""
    with _OPEN_HERE_LOCK:
        hosts = list(_HOSTS.values())
        _HOSTS.clear()  # an open after this starts anew
        _OPEN_HERE.clear()
        if hosts and threading.current_thread() is threading.main_thread():
            signal.signal(signal.SIGINT, signal.SIG_IGN)  # the command is done: a late Ctrl-C has nothing to stop, and
            # raised inside a close it printed a traceback from the exit hooks
        for host in hosts:
            _close_quietly(host)


_LINGERING: weakref.WeakSet[StoreFile] = weakref.WeakSet()
"""Files whose connection was left open to linger (closed by a daemon timer thread)."""
EXIT_CLOSE_WAIT_S = 5.0


@atexit.register
def close_lingering_files() -> None:
    """Close every lingering connection before the interpreter finalizes.

    Why: the linger timer is a daemon thread. When the process ended while it was inside DuckDB's close (C++ with
    the GIL released), Python 3.11's finalization stopped it with `pthread_exit` as it came back for the GIL; the
    forced unwinding through DuckDB's frames aborted the process ("FATAL: exception not rethrown", exit 134) after
    its work was done. Each file's lock is taken first (a close in progress finishes), for at most a few seconds."""
    for file in list(_LINGERING):
        if file.lock.acquire(timeout=EXIT_CLOSE_WAIT_S):
            try:
                file.release(force=True)
            finally:
                file.lock.release()


def say_on_stderr(message: str) -> None:
    print(f"tokview: {message}", file=sys.stderr, flush=True)


class StoreFile:
    """One store file shared with other processes: opened for an operation, left open `linger` seconds for the
    next one (never longer than MAX_HOLD_S in one stretch), read-only when it cannot be written.

    `":memory:"` is a throwaway database, kept open; its parts go to a private temporary folder."""

    def __init__(
        self, path: str, *, lock_timeout: float, on_wait: Callable[[str], None], linger: float = LINGER_S
    ) -> None:
        self.path = path
        self.lock_timeout = lock_timeout
        self.on_wait = on_wait
        self.linger = linger
        self.memory = path == ":memory:"
        self.lock = threading.RLock()
        self.depth = 0
        """How many operations of this process use the open connection now (it is closed only at 0)."""
        self.read_only = False
        """Opened read-only: the file (or its file system) cannot be written; set by `_connect` when it finds so."""
        self._conn: duckdb.DuckDBPyConnection | None = None
        self._counted_as: str | None = None
        """The real path `_OPEN_HERE` counts the open connection under (resolved when it was opened: a symlink
        re-pointed or a relative path after a chdir resolves otherwise by its close)."""
        self._opened_at = 0.0
        self._release_seq = 0
        self._memory_parts: Path | None = None
        self._made = False
        """Opened once (`open_checked`): a file missing since was deleted or moved, never one to create again."""

    @property
    def parts_dir(self) -> Path:
        """Where writers put parts: beside the file (a private temporary folder for `:memory:`)."""
        if self.memory:
            if self._memory_parts is None:
                import tempfile

                self._memory_parts = Path(tempfile.mkdtemp(prefix="tokview-parts-"))
            return self._memory_parts
        return parts.parts_dir(self.path)

    @property
    def is_open(self) -> bool:
        """Whether this process has the database file open right now (it lingers open for a burst)."""
        return self._conn is not None

    def prepare(self) -> None:
        """Make the file's folder and refuse a file that is not DuckDB's, before DuckDB opens it."""
        if self.memory:
            return
        parts.make_store_folder(self.path)
        refuse_other_files(self.path)

    def open_checked(self, check: Callable[[duckdb.DuckDBPyConnection], None]) -> None:
        """Open the file for the first time and run `check` (the schema's) on it; closed at once when it fails."""
        with self.lock:
            try:
                conn = self._connect()
                with duckdb_errors(f"cannot migrate database {self.path}", self.path):
                    check(conn)
            except BaseException:
                self.release(force=True)
                raise
            self._made = True
            self.release()

    def _connect(self) -> duckdb.DuckDBPyConnection:
        if self._conn is None:
            self._open()
        assert self._conn is not None
        return self._conn

    def _open(self) -> None:
        """Open the file, waiting while another process holds it (announced after a second).

        A Ctrl-C during the opening itself is delivered once the connection is this StoreFile's (`_ctrl_c_after`),
        so whatever it interrupts finds it counted and closable; during the waits it is delivered at once."""
        wait = LockWait(self.path, self.lock_timeout, self.on_wait)
        while True:
            try:
                with _ctrl_c_after(), _OPEN_HERE_LOCK:  # no header check opens the file while DuckDB takes its lock
                    if self.memory:
                        self._conn = duckdb.connect(self.path)
                    else:
                        if self._made and not os.path.exists(self.path):  # DuckDB would make an empty one there
                            raise StoreError(
                                f"{self.path} is gone (deleted or moved while tokview had it open): nothing was "
                                "created in its place"
                            )
                        real = _real(self.path)  # counted under the path it resolves to now, uncounted under it
                        self._conn = _attach(real, read_only=self.read_only)
                        self._counted_as = real
                        _OPEN_HERE[real] = _OPEN_HERE.get(real, 0) + 1
                    self._opened_at = time.monotonic()
                return
            except duckdb.Error as exc:
                message = str(exc).strip()
                if any(w in message for w in LOCK_WORDS):
                    wait.again(message)
                elif not self.read_only and cannot_write(message) and Path(self.path).expanduser().is_file():
                    self.read_only = True  # read without writing: stats, show and export need no more
                elif not self.read_only and _NOT_A_DATABASE in message and clear_unfinished_file(self.path, wait):
                    continue  # a 0-byte file a full disk left: removed (or given time to become a store)
                else:
                    raise StoreError(f"cannot open database {self.path}: {first_line(exc)}") from None

    def release(self, force: bool = False) -> None:
        """Close the file now (`force`, or held MAX_HOLD_S already), or after `linger` unless used again."""
        if self._conn is None or (not force and (self.depth > 0 or self.memory)):
            return
        self._release_seq += 1
        if force or self.linger <= 0 or time.monotonic() - self._opened_at >= MAX_HOLD_S:
            with _OPEN_HERE_LOCK:
                try:
                    self._conn.close()
                finally:
                    self._conn = None
                    key, self._counted_as = self._counted_as, None
                    if key is not None:
                        _OPEN_HERE[key] -= 1
                        if not _OPEN_HERE[key]:
                            del _OPEN_HERE[key]
                            _detach(key)
            return
        closer = threading.Timer(self.linger, self._close_if_idle, args=(self._release_seq,))
        closer.daemon = True
        _LINGERING.add(self)
        closer.start()

    def _close_if_idle(self, seq: int) -> None:
        with self.lock:
            if seq == self._release_seq and self.depth == 0 and self._conn is not None:
                self.release(force=True)

    @contextmanager
    def connection(self) -> Iterator[duckdb.DuckDBPyConnection]:
        """The open connection for one operation: opened here unless an enclosing operation keeps one."""
        with self.lock:
            conn = self._connect()
            self.depth += 1
            try:
                yield conn
            finally:
                self.depth -= 1
                self.release()

    @contextmanager
    def reading(self) -> Iterator[duckdb.DuckDBPyConnection]:
        """`connection()` whose DuckDB errors say `cannot read PATH: …`."""
        with self.connection() as conn, duckdb_errors(f"cannot read {self.path}", self.path):
            yield conn

    @contextmanager
    def writing(self, what: str = "") -> Iterator[duckdb.DuckDBPyConnection]:
        """`connection()` whose DuckDB errors say `cannot write to PATH: …` (or `what`)."""
        with self.connection() as conn, duckdb_errors(what or f"cannot write to {self.path}", self.path):
            yield conn

    def close(self) -> None:
        """Close the file now and remove a `:memory:` store's parts folder."""
        with self.lock:
            self.release(force=True)
            if self._memory_parts is not None:
                import shutil

                shutil.rmtree(self._memory_parts, ignore_errors=True)
                self._memory_parts = None

    def query(self, sql: str, params: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
        """Run read-only SQL under the lock."""
        with self.reading() as conn:
            return conn.execute(sql, list(params)).fetchall()

    def execute(self, sql: str, params: Sequence[Any] = ()) -> None:
        """Run one statement under the lock (e.g. DuckDB's `COPY … TO` for Parquet exports)."""
        with self.writing("database statement failed") as conn:
            conn.execute(sql, list(params))

    def write(self, statements: Iterable[Statement]) -> None:
        """Run these statements in one transaction under the lock: all of them land, or none."""
        with self.writing() as conn, transaction(conn):
            for sql, params in statements:
                conn.execute(sql, list(params))
