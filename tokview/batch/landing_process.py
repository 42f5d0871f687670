"""A new store is made and filled by a child process, so the batch's own process never imports DuckDB.

Why: for a store that did not exist yet, importing DuckDB and the store (~0.1 s of CPU, mostly under the GIL),
creating the file (~50 ms) and recording the run sat between the probe and the first generation, and every
landing (~50 ms of CPU however small) took the GIL that capturing and analysing need, the last one in the run's
tail. Here a child started as the batch starts does all of that on the other core: it imports the store while the
batch loads its tokenizer and probes the servers, and creates the file and records the run once a server has
answered (`begin_run`: an unreachable or stalled server still leaves no file). The batch's process only writes
parts (`PartSink`, as a `--workers` child does) and asks the child to land them (`LandingChild.ingest`, which the
`Lander` calls from its thread). Measured (bench_goals, 2 cores, the same rounds): the first generation went out
at 0.28-0.30 s instead of 0.36-0.38 s; 300 prompts 0.86 -> 0.79 s, 10 prompts 0.44 -> 0.40 s. A store that
exists is opened in the batch's process as before: its stored ids are read to plan the run anyway.

Nothing is lost however it ends. A part is whole on disk or absent, and landing is idempotent, so:
- the batch is killed: the child reads the end of its input, lands every part written and exits;
- the child is killed, dies or cannot start: the batch lands in its own process from then on, opening the store
  then (a part the child landed before it died is not doubled);
- Ctrl-C: the child runs in a session of its own, so the terminal's SIGINT reaches only the batch, whose
  shutdown asks for the last landing as it always did.

The child makes the new store's file before the run begins, as a spare beside it under a hidden name (`spare_path`):
creating a DuckDB file and its schema (~75-120 ms on 2 busy cores) then overlaps the batch's tokenizer load, and
`begin_run` only links the spare into place (never over a file made meanwhile) and opens it (~30 ms). Measured on
one prompt, the child's store was ready ~0.1 s after the run began, and the batch's first landing waited for it
(the wall's tail). A spare the run never takes is removed (a killed child's, by its batch or the next child). The
spare is a copy of a blank store kept in tokview's cache once DuckDB has made one (`store.blank_store`): one prompt,
median of 15 alternating runs, 0.565 -> 0.504 s.

When the resume shortcut's probe has seen the servers generate and its plan shows work left (a tokenizer identity
remembered from an earlier run), the batch has the child put the spare in place and open the store then
(`open_ahead`), as the tokenizer loads: the run's first landing no longer waits ~40 ms for the open. Measured on
one prompt, the wall from the answer to the batch's exit went from ~0.11 s to ~0.06 s, with the child's exit now
awaited on a pidfd instead of `Popen.wait`'s polling. A run that never begins then has the child remove the file
(`remove_unused_store`).

The protocol is JSON lines over the child's stdin and stdout. The batch writes `{"prepare": path}` at once, then
the spec (the store's path, the server URLs whose credentials are masked, the run to record: never on the command
line, where `ps` shows it; opened ahead, the spec without the run first and the run's spec later), then `"land"`
lines. The child answers `{"ready": true}` once the run is recorded,
then `{"landed": [samples, failures]}` per landing; or `{"error": kind, "message": …}`, and ends.
"""

from __future__ import annotations

import json
import os
import queue
import select
import signal
import subprocess
import sys
import threading
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

from tokview.batch.early_landing import SPARE_MARK, remove_database, spare_path
from tokview.batch.run_record import RunRecord
from tokview.errors import TokviewError, first_line

if TYPE_CHECKING:
    from tokview.batch.store_opener import StoreOpener
    from tokview.core.analysis import Analysis
    from tokview.core.record import Capture
    from tokview.store import Store
    from tokview.store.part_sink import PartSink
    from tokview.store.sample_rows import SampleIdentity

CLOSE_TIMEOUT_S = 180.0
"""How long the batch waits for the child's last landing and close: longer than a store's lock wait (120 s), so
a child waiting for another process's hold is not cut short; one past it is killed (its parts stay)."""


class ChildGone(Exception):
    """The child ended without answering (killed, crashed, never started)."""


class LandingChild:
    """The batch's side: a `PartWriter` whose parts a child process lands in a store it creates.

    `for_new_store` starts the child; `begin_run` has it create the store and record the run; `ingest` (the
    `Lander`'s call) asks it to land and returns what it landed; `close` ends it after its last landing. Once
    the child is gone, the store is opened here (`opener`) and everything lands in this process."""

    def __init__(self, opener: StoreOpener) -> None:
        self.opener = opener
        self.path = opener.path
        self.landed_here: Store | None = None
        """The store opened in this process after the child was gone (closed by the opener's caller)."""
        self._sink: PartSink | None = None
        self._proc: subprocess.Popen[bytes] | None = None
        self._ready = False
        self._run: RunRecord | None = None
        self._opened_ahead = False
        self._lock = threading.Lock()  # one exchange with the child at a time

    @classmethod
    def for_new_store(cls, store: object, *, ray: bool = False) -> LandingChild | None:
        """A started child for a store the opener says holds nothing yet; None for any other store (opened in
        this process, which reads its stored ids to plan) and for Ray's runs (this process lands what their tasks
        hand back). Started this early so that its imports overlap the batch's own start-up: it creates nothing
        before `begin_run`."""
        from tokview.batch.store_opener import StoreOpener

        if ray or not isinstance(store, StoreOpener) or not store.holds_nothing():
            return None
        child = cls(store)
        child.start()
        return child

    def start(self) -> None:
        """Spawn the child; it imports the store and waits for `begin_run` (or the end of its input: it then ends
        having created nothing)."""
        from tokview.batch import early_landing

        # The one `cli.main` started as the process started, if it is for this store; None: land here
        self._proc = early_landing.take(self.path) or early_landing.spawn(self.path)

    @property
    def sink(self) -> PartSink:
        """Writes the parts (made on first use: `tokview.store` is imported after the first request is out)."""
        if self._sink is None:
            from tokview.store.part_sink import PartSink

            self._sink = PartSink(self.path, self.opener.server_urls)
        return self._sink

    # -- what the writer writes through (`PartWriter`) ----------------------------------------------
    def sample_record(self, key: SampleIdentity, capture: Capture, analysis: Analysis) -> dict[str, Any]:
        return self.sink.sample_record(key, capture, analysis)

    def write_part(self, samples: Sequence[dict[str, Any] | bytes], failures: Sequence[dict[str, Any]] = ()) -> None:
        self.wait_until_recorded()
        self.sink.write_part(samples, failures)

    def wait_until_recorded(self) -> None:
        """Block until the run is recorded in the store (by the child, or here once it is gone); InputError when
        the store's checks refuse it. Called before this process writes a part and before `--workers` children
        start: a part is landed by whichever process lands first, so two batches starting at once into a new
        store under one `--run` with other settings had the refused one's answers landed into the other's run.
        The requests still go out before it (the child records the run in ~0.1 s, as the tokenizer loads).

        A store another program held past the wait is no refusal: parts are written as before (the answers are
        kept), and the run is recorded by the first landing that gets the store (`_here`)."""
        from tokview.store.errors import StoreHeld

        with self._lock:
            if self._ready:
                return
            if self._proc is not None and self._proc.stdout is not None and self._run is not None:
                try:
                    self._reply(self._proc.stdout)
                    self._ready = True
                    return
                except ChildGone:
                    self._drop(kill=True)
                except StoreHeld:  # said before the run was recorded, the child has ended: land here from now on
                    self._drop(kill=False)
                    self._ready = True
                    return
            if self._run is not None:
                try:
                    self._here()  # the child is gone: the run is recorded here (or refused)
                except StoreHeld:
                    pass
                self._ready = True

    def add_server_urls(self, urls: Iterable[str]) -> None:
        """Mask these URLs' credentials in what is written here and in what the child (or this process) stores."""
        urls = list(urls)
        self.opener.server_urls = list(dict.fromkeys([*self.opener.server_urls, *urls]))
        self.sink.add_server_urls(urls)

    def stored_ids_with(self, suffix: str) -> set[str]:
        """The stored sample ids (ending with `suffix`) a plan skips: none, the store is not made yet."""
        return set()

    # -- the child ------------------------------------------------------------------------------------
    def open_ahead(self) -> None:
        """Have the child put its spare in place and open the store now, before the run is known: the servers have
        generated (the resume shortcut's probe) and its plan shows work left, so the store is due, and opening it
        (~40 ms on 2 busy cores) then overlaps the tokenizer's load instead of the first landing. A run that never
        begins (the load fails, a Ctrl-C, nothing left after all) has the child remove the file again."""
        with self._lock:
            if self._opened_ahead or self._proc is None or self._proc.stdin is None:
                return
            self._opened_ahead = True
            self._send({"path": self.path, "server_urls": self.opener.server_urls})

    def begin_run(self, run: RunRecord) -> None:
        """Have the child create the store (unless `open_ahead` had it) and record `run` while this process starts
        generating. Raises StoreError, as opening the store here would, when the store's folder cannot be made."""
        from tokview.store.parts import make_store_folder

        make_store_folder(self.path)  # before any part is written beside the store
        self._run = run
        spec = {"path": self.path, "server_urls": self.opener.server_urls, "run": run.to_json()}
        with self._lock:
            if self._proc is None or self._proc.stdin is None:
                return
            self._send(spec)

    def _send(self, message: dict[str, Any]) -> None:
        assert self._proc is not None and self._proc.stdin is not None
        try:
            self._proc.stdin.write(json.dumps(message).encode() + b"\n")
            self._proc.stdin.flush()
        except OSError:  # it is gone already: land here
            self._drop(kill=True)

    def ingest(self) -> tuple[int, int]:
        """Land every part written (in the child, or here once it is gone); raises what `Store.ingest` raises,
        or InputError when the child's checks refused the run."""
        with self._lock:
            if self._proc is not None:
                try:
                    return self._ask_to_land()
                except ChildGone:
                    self._drop(kill=True)
            return self._here().ingest()

    def close(self) -> None:
        """End the child: it lands what is left and closes the store. Blocks until it has (bounded)."""
        with self._lock:
            proc, self._proc = self._proc, None
        if proc is not None:
            self._reap(proc)

    def _ask_to_land(self) -> tuple[int, int]:
        proc = self._proc
        assert proc is not None and proc.stdin is not None and proc.stdout is not None
        try:
            if not self._ready:
                self._reply(proc.stdout)  # the store is open and the run recorded, or why not
                self._ready = True  # (`wait_until_recorded` reads it first when a part was written)
            proc.stdin.write(b'"land"\n')
            proc.stdin.flush()
        except OSError as exc:
            raise ChildGone from exc
        landed = self._reply(proc.stdout).get("landed")
        if not (isinstance(landed, list) and len(landed) == 2 and all(isinstance(n, int) for n in landed)):
            raise ChildGone  # not the answer asked for: it is not to be trusted with more
        return landed[0], landed[1]

    def _reply(self, stdout: IO[bytes]) -> dict[str, Any]:
        line = stdout.readline()
        try:
            reply = json.loads(line)
        except ValueError as exc:  # nothing (it ended) or not a reply: it is not to be trusted with more
            raise ChildGone from exc
        if not isinstance(reply, dict):
            raise ChildGone
        if "error" in reply:
            self._raise(reply)
        return reply

    def _raise(self, reply: dict[str, Any]) -> None:
        """The child's error, as the error the batch would have raised opening the store itself. A store another
        program held past the wait is StoreHeld, and the child goes on (the batch's lander asks again later)."""
        message = str(reply.get("message") or "the landing process failed")
        from tokview.store.errors import StoreError, StoreFull, StoreHeld

        if reply["error"] == "held":
            raise StoreHeld(message)
        self._drop(kill=False)  # it ends after an error: reap it

        if reply["error"] == "input":
            from tokview.batch.inputs import InputError

            raise InputError(message)
        raise (StoreFull if reply["error"] == "full" else StoreError)(message)

    def _drop(self, *, kill: bool) -> None:
        """Forget the child (killed first when `kill`) and reap it; landing happens here from now on."""
        proc, self._proc = self._proc, None
        if proc is not None:
            if kill:
                proc.kill()
            self._reap(proc)

    def _reap(self, proc: subprocess.Popen[bytes]) -> None:
        """Wait for the child's end (bounded), then remove a spare it had not taken (it died before the run began)."""
        _end(proc)
        remove_database(spare_path(self.path, proc.pid))

    def _here(self) -> Store:
        """The store opened in this process (once), with the run recorded in it: the child is gone."""
        if self.landed_here is None:
            store = self.opener()
            if self._run is not None:
                self._run.record(store)
            self.landed_here = store
        return self.landed_here


def _end(proc: subprocess.Popen[bytes]) -> None:
    for pipe in (proc.stdin, proc.stdout):
        try:
            if pipe is not None:
                pipe.close()
        except OSError:
            pass
    try:
        wait_for_exit(proc, CLOSE_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def wait_for_exit(proc: subprocess.Popen[bytes], timeout: float) -> int:
    """`proc.wait(timeout)`, woken by the child's exit itself. Why: with a timeout, `Popen.wait` polls, sleeping
    up to 50 ms between looks; the batch waits for its landing child at the very end of every run, and measured
    it returned ~20 ms after the child had exited. A pidfd (Linux 5.3+) becomes readable at the exit; elsewhere,
    or when it cannot be had, this is `proc.wait(timeout)`."""
    if proc.poll() is not None:  # reaped already (`kill` polls first): its pid may be another process's by now
        return proc.returncode
    try:
        fd = os.pidfd_open(proc.pid)
    except (AttributeError, OSError):  # not Linux, or an old kernel
        return proc.wait(timeout=timeout)
    try:
        poller = select.poll()  # not select.select: it refuses descriptors past 1023 (a proxy's many connections)
        poller.register(fd, select.POLLIN)
        exited = poller.poll(timeout * 1000)
    finally:
        os.close(fd)
    if not exited:
        raise subprocess.TimeoutExpired(proc.args, timeout)
    return proc.wait()  # it has exited: this reaps it at once


# -- the spare ------------------------------------------------------------------------------------------
def make_spare(path: str) -> Path | None:
    """The store's schema in a new file beside `path`; None when there is nothing to prepare (the file exists, its
    folder does not: it is made when the run begins, so a run that never begins leaves no folder; a `~` path, which
    DuckDB reads its own way) or anything failed (the run then creates the store itself, and says why it cannot)."""
    try:
        file = Path(path).expanduser()
        _sweep(file)
        if path.startswith("~") or file.exists() or not file.parent.is_dir():
            return None
        spare = spare_path(path, os.getpid())
    except (OSError, ValueError):
        return None
    try:
        import duckdb

        from tokview.store.blank_store import copy_blank, keep_blank
        from tokview.store.schema import migrate

        remove_database(spare)  # a name left by an earlier process of this pid (a container's pids repeat)
        if copy_blank(spare):
            return spare
        with duckdb.connect(str(spare)) as conn:
            migrate(conn)
            conn.execute("CHECKPOINT")  # into the file that is linked: a full disk raises here, not silently later
        if spare.with_name(spare.name + ".wal").exists():
            raise OSError("the schema is not all in the file")
        keep_blank(spare)
    except Exception:  # a folder it cannot write, a full disk: the ordinary creation says what is wrong
        remove_database(spare)
        return None
    return spare


def take_spare(spare: Path | None, path: str) -> bool:
    """Put the spare in place as the store `path`, unless a file is there by now (another run made it: that one is
    opened); the spare's own name goes either way. True when the spare is in place."""
    if spare is None:
        return False
    file = Path(path).expanduser()
    try:
        if file.with_name(file.name + ".wal").exists():  # a deleted store's log: DuckDB may replay it into a copy
            linked = False
        else:
            os.link(spare, file)  # never over a file: a rename would replace one made meanwhile
            linked = True
    except OSError:
        linked = False
    remove_database(spare)
    return linked


def remove_unused_store(path: str) -> None:
    """Remove the store file a child put in place for a run that never began, unless another process has it open.

    Taken under a lock of its own: DuckDB holds the same kind of lock (`fcntl`) on a file it has open, so a process
    that opened the file since this child closed it keeps it, and one that tries to while the file goes waits,
    then finds no file and makes its own."""
    import fcntl

    file = Path(path).expanduser()
    try:
        fd = os.open(file, os.O_RDWR)
    except OSError:
        return
    try:
        fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        if os.path.samestat(os.fstat(fd), os.stat(file)):
            remove_database(file)
    except OSError:  # held by another process, or gone: not this child's any more
        pass
    finally:
        os.close(fd)


def _sweep(file: Path) -> None:
    """Remove spares of this store whose child is gone (killed with its batch before either could remove them)."""
    prefix = f".{file.name}{SPARE_MARK}"
    try:
        names = os.listdir(file.parent)
    except OSError:
        return
    for name in names:
        pid = name[len(prefix) :].removesuffix(".wal")
        if name.startswith(prefix) and pid.isascii() and pid.isdigit() and not _alive(int(pid)):
            remove_database(file.with_name(prefix + pid))


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except (OSError, OverflowError):  # another user's process, or no pid at all: left alone
        return True
    return True


# -- the child ------------------------------------------------------------------------------------------
def child_main() -> int:
    """Make a spare store, then (once the run begins) put it in place, record the run, land on each request, and on
    the end of input land and close."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    stdin, stdout = sys.stdin.buffer, sys.stdout.buffer
    store: Store | None = None
    spare: Path | None = None
    try:
        from tokview.store import Store  # while the batch loads its tokenizer and probes the servers

        line = stdin.readline()
        first = json.loads(line) if line else None
        if isinstance(first, dict) and isinstance(first.get("prepare"), str):
            try:
                spare = make_spare(first["prepare"])
            except Exception:  # never the run's error: the run creates the store itself
                spare = None
            line = stdin.readline()
        if not line:  # the run never began (nothing to do, an error, a kill): nothing is left
            return 0
        spec = json.loads(line)
        linked = take_spare(spare, spec["path"])
        spare = None
        if "run" not in spec and not linked:  # opened ahead, but no spare to put in place: the run's line makes it
            line = stdin.readline()
            if not line:
                return 0
            spec = json.loads(line)
        store = Store(spec["path"], server_urls=spec["server_urls"])
        if linked:
            from tokview.store.blank_store import restamp

            restamp(store)
        lines: Iterable[bytes] = stdin
        if "run" in spec:
            RunRecord.from_json(spec["run"]).record(store)
        else:  # opened ahead (`open_ahead`): the run's line comes once the batch's tokenizer has loaded
            lines = _Lines(stdin)
            if not _record_when_it_begins(store, lines):  # it never began: the file put in place here goes again
                empty = store.holds_nothing()
                store.close()
                store = None
                if empty:  # else it holds what it landed on opening (a concurrent batch's parts): kept
                    remove_unused_store(spec["path"])
                return 0
        _say(stdout, {"ready": True})
        from tokview.store.errors import StoreHeld

        for line in lines:
            if json.loads(line) == "land":
                try:
                    landed = list(store.ingest())
                except StoreHeld as exc:  # another program holds the file: the parts stay, the batch asks again
                    _say(stdout, {"error": "held", "message": str(exc)})
                    continue
                _say(stdout, {"landed": landed})
        store.ingest()  # the batch closed its end (done, or killed): what it wrote lands
        return 0
    except BaseException as exc:  # one line back to the batch, never a traceback on its terminal
        _say(stdout, {"error": _kind(exc), "message": _message(exc)})
        return 1
    finally:
        if spare is not None:
            remove_database(spare)
        if store is not None:
            store.close()


class _Lines:
    """The batch's lines, read by a thread of their own, so that waiting for one can end (`get`'s timeout)."""

    def __init__(self, stdin: IO[bytes]) -> None:
        self._queue: queue.SimpleQueue[bytes] = queue.SimpleQueue()
        threading.Thread(target=self._read, args=(stdin,), daemon=True).start()

    def _read(self, stdin: IO[bytes]) -> None:
        try:
            for line in stdin:
                self._queue.put(line)
        finally:
            self._queue.put(b"")  # the end of input

    def get(self, timeout: float | None = None) -> bytes | None:
        """The next line, b"" at the end of input, None when none came within `timeout` seconds."""
        try:
            return self._queue.get(timeout=timeout)
        except queue.Empty:
            return None

    def __iter__(self) -> Iterator[bytes]:
        while line := self._queue.get():
            yield line


def _record_when_it_begins(store: Store, lines: _Lines) -> bool:
    """Wait for the run's line and record the run; False when the input ended first (the run never began).

    The store is held open meanwhile (nobody else has a use for a store without a run), so that the run is recorded
    without opening the file again, but never longer than the store's MAX_HOLD_S in one stretch: a tokenizer that
    loads for long, or a server probed again, must not keep other processes from the file."""
    from tokview.store.connection import MAX_HOLD_S

    with store.hold():
        line = lines.get(timeout=MAX_HOLD_S)
        if line:
            _record(store, line)
    if line is None:  # held long enough: it closes, and opens again for the record
        line = lines.get()
        if line:
            _record(store, line)
    return bool(line)


def _record(store: Store, line: bytes) -> None:
    spec = json.loads(line)
    store.add_server_urls(spec["server_urls"])
    RunRecord.from_json(spec["run"]).record(store)


def _kind(exc: BaseException) -> str:
    from tokview.batch.inputs import InputError
    from tokview.store.errors import StoreFull, StoreHeld

    if isinstance(exc, StoreFull):
        return "full"
    if isinstance(exc, StoreHeld):
        return "held"
    if isinstance(exc, InputError):
        return "input"
    return "store"


def _message(exc: BaseException) -> str:
    if isinstance(exc, TokviewError):
        return str(exc)
    return f"the landing process failed: {type(exc).__name__}: {first_line(exc, 300)}"


def _say(stdout: IO[bytes], reply: dict[str, Any]) -> None:
    try:
        stdout.write(json.dumps(reply).encode() + b"\n")
        stdout.flush()
    except OSError:  # the batch is gone: what is landed stays landed
        pass


if __name__ == "__main__":
    code = child_main()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)  # the store is closed: tearing down the interpreter and DuckDB's module took ~50 ms of the tail
