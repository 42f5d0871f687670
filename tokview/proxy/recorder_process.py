"""The proxy's recorder in a child process of its own, so recording never takes the forwarding process's CPU.

Why: in one process the analysis (≈0.4–3 ms a generation), the capture parsing and the landings hold the
GIL the event loop needs, so a request arriving meanwhile waited (the benchmark's added p50 and p99) and the
proxy's CPU per request was 2–3× a bare forwarder's. Here the proxy's loop only pickles a `Finished` onto a
non-blocking pipe (`take`), and a spawned child runs the same `Recorder` (its threads, writer and Lander, the
store) as the in-process mode does. The child reports back what the parent says and counts: its lines
(STOPPED RECORDING among them) and its counters.

Spawned like the batch's `--workers` children (never forked: the parent holds threads and a tokenizer by
then), with SIGINT blocked during the spawn and ignored after: a Ctrl-C on the terminal reaches the parent,
which stops serving and closes the pipe; the child then records what it was handed, lands it and exits.
When the parent is SIGKILLed the pipe ends the same way, so what was answered before the kill is still
recorded: only the requests in flight are lost.

The child runs at a lower priority (`serve.lower_priority`): under a burst the harness and the upstream get
the cores and the recorder catches up after. Its backlog never blocks the forwarding loop and is bounded in
the loop's memory: what the pipe cannot take (past SPOOL_OVER_BYTES waiting in memory, none by default) is
appended to a spool file (`_Spool`) with only a small `Spooled` note queued in its place; the child reads the
answer back from the file when it comes to the note. Nothing is dropped: a spool that cannot be written keeps
the answer in memory instead, and a child whose parent was killed records the spooled answers it had no note
for yet (they are whole on disk) before it exits.
"""

from __future__ import annotations

import asyncio
import fcntl
import os
import pickle
import select
import shutil
import signal
import struct
import termios
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from tokview.errors import TokviewError, UserError
from tokview.proxy import spool_folder
from tokview.proxy.recorder import Failed, Finished, without_secrets

if TYPE_CHECKING:
    from multiprocessing.connection import Connection
    from multiprocessing.process import BaseProcess

READY_TIMEOUT_S = 300.0
"""How long the parent waits for the child to load its tokenizer and open the store."""
COUNTS_EVERY_S = 0.25
"""The child reports its counters when it is idle this long (not after every item: each report woke a
thread of the forwarding process)."""
SPOOL_OVER_BYTES = 0
"""How many bytes of answers the forwarding process keeps in memory for a recorder that is behind (a burst on
busy cores): past that they are spooled to a file, so a long burst never grows the proxy's memory. At 0, the
default, an answer the pipe cannot take whole goes to the spool file at once (~30 µs of a write to the page cache), so a
SIGKILL of the forwarding process loses only the requests in flight (`RecorderProcess.take` never cuts an answer in the
pipe); held in memory up to 16 MB, a burst's answers the clients already had were lost with it (2-4 MB in the
benchmark)."""
PIPE_PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096
"""A pipe buffer's page (`_pipe_room`)."""
GATHER_S = 0.15
GATHER_MAX = 64
"""The child takes what its pipe brings for up to GATHER_S after an answer (at most GATHER_MAX answers) and then
records them in a row: handed over one at a time as they came (~13 ms apart at 77 streams/s), each woke the
writer's and the re-encoder's threads on its own, GIL hand-overs that were ~30% of the child's Python time
(a replay at 77 streams/s: 4.2 -> 3.1 ms CPU per 256-token stream). An answer reaches the store at most
GATHER_S later, against the LAND_BUSY_S between landings under load."""
GC_THRESHOLDS = (100_000, 20, 100)
"""The child's cyclic collector runs every 100,000 allocations instead of 700: a stream's few hundred parsed
chunks, its capture and its record are acyclic (freed by their counts), and the young collections that
walked them were ~10% of the recorder's CPU per stream (a replay of 160 streams: 2.9 -> 2.5-2.7 ms)."""


@dataclass(frozen=True)
class ChildSpec:
    """What the child needs to open the same recorder (plain data: it is pickled to the child)."""

    config: Any
    """The ProxyConfig, without its tokenizer object and its `say` callable."""
    upstreams: list[Any]
    tokenizer_dir: str | None
    spool_dir: str | None = None
    """Where the parent spools the answers the pipe cannot take (`_Spool`); the child removes it when it ends."""


@dataclass(frozen=True)
class Spooled:
    """In the pipe in place of an answer: read it from the spool file `path`, `length` bytes at `offset`."""

    path: str
    offset: int
    length: int


@dataclass(frozen=True)
class SpoolDone:
    """Every answer of the spool file `path` is noted before this in the pipe: the child removes the file."""

    path: str


class _Spool:
    """One spool file: answers appended as `!i`-length-prefixed pickles, each whole in one write. The parent's are
    `spool-NNNNNN`, the recorder child's journals `spool-cNNNNNN` (`kind="c"`: numbered apart)."""

    def __init__(self, directory: str, number: int, kind: str = "") -> None:
        self.path = os.path.join(directory, f"{spool_folder.SPOOL_PREFIX}{kind}{number:06d}")
        self.fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        self.size = 0

    def append(self, data: bytes) -> Spooled:
        """The answer on disk (OSError when it is not: a full disk), and the note that finds it."""
        record = struct.pack("!i", len(data)) + data
        written = os.write(self.fd, record)
        if written != len(record):
            os.ftruncate(self.fd, self.size)  # a short write on a full disk: the answer stays in memory instead
            raise OSError("the spool file took only part of an answer")
        note = Spooled(self.path, self.size + 4, len(data))
        self.size += len(record)
        return note

    def close(self) -> None:
        os.close(self.fd)


class RecorderProcess:
    """The parent's handle on the child: `take`, the counters and `close`, as `Recorder` has them."""

    def __init__(self, spec: ChildSpec, say: Callable[[str], None]) -> None:
        import multiprocessing

        from tokview.batch.workers import sigint_blocked

        self.say = say
        self.recorded = self.failed = self.not_recorded = 0
        self.recording = True
        self.taken = 0
        """Answers and failures handed over (`take`): with the child's counts, how far behind it is."""
        self.backlog_peak = 0
        """The most answers the child was behind by, as its counts showed (see `backlog`)."""
        self.memory_peak = self.spooled = 0
        """Bytes: the most the loop held in memory for the pipe, and all it spooled to disk."""
        self.spool_over = SPOOL_OVER_BYTES
        """Bytes held in memory for the pipe past which answers are spooled."""
        self._pending_bytes = 0
        self._spool: _Spool | None = None
        self._spools = 0
        self._spool_dir = spec.spool_dir
        self._spool_failed = False
        self._closing = False
        self._said_gone = threading.Lock()
        """Taken once the child's end was said (by the reader or a failed hand-over, whichever sees it first)."""
        self._relay = Relay(say)
        """The child's lines, said until the proxy says it leaves without its recorder."""
        ctx = multiprocessing.get_context("spawn")
        jobs_in, self._jobs = ctx.Pipe(duplex=False)
        self._said, said_out = ctx.Pipe(duplex=False)
        self.process = ctx.Process(target=child_main, args=(spec, jobs_in, said_out), name="tokview-proxy-recorder")
        with sigint_blocked():  # the child ignores SIGINT once it runs: the parent decides when it stops
            self.process.start()
        jobs_in.close()
        said_out.close()
        self._wait_ready()
        self._fd = self._jobs.fileno()
        self._writes_unread = 0
        """Writes to the pipe since it was last seen empty: each may hold a page partly filled (`_pipe_room`)."""
        os.set_blocking(self._fd, False)
        self._pending: deque[bytes] = deque()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._reader = threading.Thread(target=self._read, name="tokview-proxy-said", daemon=True)
        self._reader.start()

    def _wait_ready(self) -> None:
        if not self._said.poll(READY_TIMEOUT_S):
            self.process.kill()
            raise UserError("the proxy's recorder process did not start (tokenizer or store)")
        while True:
            try:
                message = self._said.recv()
            except EOFError:
                self.process.join()
                raise UserError("the proxy's recorder process ended as it started") from None
            if message[0] == "ready":
                return
            if message[0] == "said":
                self.say(message[1])
            elif message[0] == "failed":
                self.process.join()
                raise TokviewError(message[1], exit_code=message[2], title=message[3])

    @property
    def backlog(self) -> int:
        """Answers and failures handed over that the child has not recorded yet (as of its last counts)."""
        return max(0, self.taken - self.recorded - self.failed - self.not_recorded)

    def take(self, item: Finished | Failed) -> None:
        """Hand an item to the child, from the event loop: pickled (one copy of the answer's bytes) and written
        to the pipe as a `Connection.recv` frame, without blocking; what the pipe cannot take now is written
        when the loop says it can, from memory or, past SPOOL_OVER_BYTES, from a spool file (`_Spool`). No
        thread: a feeder thread cost a GIL hand-over per request."""
        self.taken += 1
        try:
            data = pickle.dumps(item, protocol=pickle.HIGHEST_PROTOCOL)
        except (RecursionError, pickle.PicklingError, TypeError, ValueError) as exc:  # a request nested too deep
            server, named, user = item.server, item.named, item.user
            reason = f"not recorded: the exchange could not be handed to the recorder ({type(exc).__name__})"
            data = pickle.dumps(Failed(reason, server, named, user), protocol=pickle.HIGHEST_PROTOCOL)
        if self._pending:
            self._queue(data)
            return
        frame = _frame(data)
        if len(frame) > self._pipe_room():
            # Cut in the pipe, the answer's tail would be in this process's memory only: a SIGKILL lost it (the first
            # answer of each backlog, 3 kill tests in 9). Spooled whole instead, as every answer behind it is.
            self._queue(data)
            self._wait_writable()
            return
        self._send(frame, data)

    def _pipe_room(self) -> int:
        """Bytes the pipe surely takes now without cutting a frame (the room only grows until this process writes).
        A Linux pipe holds pages, not bytes: what the child has not read takes its pages and one more (the page it is
        reading, partly consumed), and a write may need all-new pages. Where that cannot be asked, PIPE_BUF: a write
        up to it is whole or nothing."""
        try:
            size = int(fcntl.fcntl(self._fd, fcntl.F_GETPIPE_SZ))
            unread = int(struct.unpack("i", fcntl.ioctl(self._fd, termios.FIONREAD, b"\0\0\0\0"))[0])
        except (AttributeError, OSError):
            return select.PIPE_BUF
        if unread == 0:
            self._writes_unread = 0
        # each write not yet read may have left a page partly filled (only a write's tail merges into the last page)
        used = -(-unread // PIPE_PAGE) + self._writes_unread + 1
        return max(0, size // PIPE_PAGE - used) * PIPE_PAGE

    def _send(self, frame: bytes, data: bytes | None = None) -> None:
        """Write a frame to the pipe now, what it cannot take queued for `_flush` (the pipe is idle): an answer
        (`data`) the pipe took none of is spooled as `take` spools it; a cut frame's tail is held."""
        try:
            written = os.write(self._fd, frame)
        except BlockingIOError:
            written = 0
        except OSError:  # the child is gone: counted, never a broken forwarding loop
            self._lost()
            return
        self._writes_unread += written > 0
        if written == 0 and data is not None:
            self._queue(data)
            self._wait_writable()
        elif written < len(frame):
            self._hold(frame[written:])
            self._wait_writable()

    def _queue(self, data: bytes) -> None:
        """Behind frames already waiting: in memory, or spooled once the memory held passes SPOOL_OVER_BYTES."""
        if self._pending_bytes + len(data) > self.spool_over and self._spool_dir and not self._spool_failed:
            try:
                if self._spool is None:
                    self._spools += 1
                    self._spool = _Spool(self._spool_dir, self._spools)
                note = self._spool.append(data)
            except OSError as exc:  # a full disk: kept in memory instead, never dropped
                self._spool_failed = True
                self.say(f"tokview proxy: cannot spool the recorder's backlog ({exc}): it is kept in memory")
            else:
                self.spooled += len(data)
                self._hold(_frame(pickle.dumps(note, protocol=pickle.HIGHEST_PROTOCOL)))
                return
        self._hold(_frame(data))

    def _hold(self, frame: bytes) -> None:
        self._pending.append(frame)
        self._pending_bytes += len(frame)
        self.memory_peak = max(self.memory_peak, self._pending_bytes)

    def _spool_done(self) -> None:
        """The pipe took everything held: the spool file is closed and its removal queued behind its notes."""
        spool, self._spool = self._spool, None
        if spool is not None:
            spool.close()
            self._send(_frame(pickle.dumps(SpoolDone(spool.path), protocol=pickle.HIGHEST_PROTOCOL)))

    def _wait_writable(self) -> None:
        try:
            self._loop = asyncio.get_running_loop()
        except RuntimeError:  # not on a loop (a caller outside the server): write it out now
            self._drain_blocking()
            return
        self._loop.add_writer(self._fd, self._flush)

    def _flush(self) -> None:
        while self._pending:
            try:
                written = os.write(self._fd, self._pending[0])
            except BlockingIOError:
                return
            except OSError:  # the child is gone: nothing more goes to the pipe (spooled answers stay on disk)
                self._lost(len(self._pending))
                self._pending.clear()
                self._pending_bytes = 0
                if self._loop is not None:
                    self._loop.remove_writer(self._fd)
                return
            self._pending_bytes -= written
            self._writes_unread += written > 0
            if written < len(self._pending[0]):
                self._pending[0] = self._pending[0][written:]
                return
            self._pending.popleft()
        if self._loop is not None:
            self._loop.remove_writer(self._fd)
        self._spool_done()

    def _drain_blocking(self) -> None:
        os.set_blocking(self._fd, True)
        try:
            if self._spool is not None:
                self._spool.close()
                self._pending.append(_frame(pickle.dumps(SpoolDone(self._spool.path))))
                self._spool = None
            while self._pending:
                frame = self._pending[0]
                written = os.write(self._fd, frame)  # blocking: all of it, unless a signal cut it short
                if written < len(frame):
                    self._pending[0] = frame[written:]
                    continue
                self._pending.popleft()
        except OSError:
            self._lost(len(self._pending))
            self._pending.clear()
        finally:
            self._pending_bytes = 0
            os.set_blocking(self._fd, False)

    def _lost(self, frames: int = 1) -> None:
        """The child is gone with `frames` answers (or spool notes: those answers stay on disk) still to send."""
        self.not_recorded += max(1, frames)
        self.recording = False
        self._say_gone()

    def _say_gone(self) -> None:
        """Once, as the child's end is seen while the proxy runs: STOPPED RECORDING, loudly, as for a held store. A
        child killed (OOM, kill -9) while the proxy went on forwarding for hours was said only at its exit."""
        if self._closing or not self._said_gone.acquire(blocking=False):
            return
        # never `process.join` here: a second thread reaping the child left the closing thread's join an exit code of
        # None (its waitpid found no child); `close` says the exit code
        self.recording = False
        self.say(
            f"tokview proxy: STOPPED RECORDING: the recorder process (pid {self.process.pid}) ended. Requests are "
            "still forwarded, but nothing is stored from now on (what was written is kept); restart the proxy to "
            "record again."
        )

    def _read(self) -> None:
        while True:
            try:
                message = self._said.recv()
            except (EOFError, OSError):
                self._say_gone()  # nothing when the proxy is closing: the child ends then as it should
                return
            if message[0] == "said":
                self._relay.say(message[1])
            elif message[0] == "counts":
                self.recorded, self.failed, self.not_recorded, self.recording = message[1:]
                self.backlog_peak = max(self.backlog_peak, self.backlog)

    def close(self, leave: bool = False) -> None:
        """Let the child record and land what it was handed, and wait for it (the loop has stopped by now).

        `leave` (a second Ctrl-C came before this) or a Ctrl-C during the wait: KeyboardInterrupt without waiting,
        the child (which ignores Ctrl-C) finishing in the background."""
        self._closing = True
        try:
            self._drain_blocking()  # a backlog the child has not read yet: written out first
            self._jobs.close()  # the child reads to the end, records, lands and exits
            if leave:
                raise KeyboardInterrupt
            self.process.join()
        except KeyboardInterrupt:  # (a Terminated too: `serve.py`)
            lost = _answers_in(self._pending)  # the signal cut the hand-over short: these never reach the child
            self._pending.clear()
            if lost:
                self.not_recorded += lost
                self.say(f"tokview proxy: left before {lost} answer(s) reached the recorder: NOT recorded")
            self._jobs.close()  # else the child waits for more, and the exit for the child: a hang
            _not_joined_at_exit(self.process)
            self._relay.end()
            self.say(
                f"tokview proxy: no longer waiting for the recorder; it (pid {self.process.pid}) goes on recording "
                "what it was handed in the background, lands it once the store is free (a store held past the lock "
                "timeout: at its next open) and ends by itself"
            )
            raise
        self._reader.join(timeout=5)
        if self._spool_dir is not None:  # the child removed it once everything in it was written; a child that
            spool_folder.release(self._spool_dir)  # died or stopped recording left it for the next start
        if self.process.exitcode not in (0, None):
            self.recording = False
            self.say(f"tokview proxy: the recorder process ended with exit code {self.process.exitcode}")

    def backlog_said(self) -> str:
        """The recorder's backlog at its peak, for the proxy's last line (the README promises it there)."""
        if not self.backlog_peak and not self.spooled:
            return "the recorder kept up: no backlog"
        mb, n = 1024 * 1024, self.backlog_peak
        return (
            f"the recorder's backlog peaked at {n} answer{'s' * (n != 1)} ({self.memory_peak / mb:.1f} MB held in "
            f"memory, {self.spooled / mb:.1f} MB spooled to disk)"
        )


class Relay:
    """The child's lines said by the parent, until `end`: once the proxy says it leaves without its recorder, what
    the child says after (a "waiting for the store" a second into a held store's wait) is not said. Relayed by the
    reader thread while the interpreter was ending, such a line came after the proxy's own last line ("tokview:
    terminated"): a line on the user's terminal after the proxy had left, from a process it had said goes on by
    itself."""

    def __init__(self, say: Callable[[str], None]) -> None:
        self._say, self._lock, self._ended = say, threading.Lock(), False

    def say(self, line: str) -> None:
        with self._lock:
            if not self._ended:
                self._say(line)

    def end(self) -> None:
        """No line after this; one being said now is said whole first."""
        with self._lock:
            self._ended = True


def _not_joined_at_exit(process: BaseProcess) -> None:
    """Leave `process` out of the children multiprocessing joins when this interpreter exits: without this, the
    proxy left by a second Ctrl-C still waited for its recorder at exit, as long as the first would have (a store
    held by another program: its whole lock timeout), after saying it no longer waited."""
    import multiprocessing.process

    multiprocessing.process._children.discard(process)  # type: ignore[attr-defined]


def _answers_in(frames: deque[bytes]) -> int:
    """The answers among frames the pipe never took (a spool's notes are not: the child records a spool's answers
    at its end, noted or not). A first frame cut short is counted too: the child cannot read it."""
    answers = 0
    for frame in frames:
        try:
            item = pickle.loads(frame[4:])
        except Exception:  # the tail of a frame the pipe took part of
            answers += 1
            continue
        answers += not isinstance(item, (Spooled, SpoolDone))
    return answers


def _frame(data: bytes) -> bytes:
    """`data` as `Connection.recv` reads one message: its length, then the bytes."""
    return struct.pack("!i", len(data)) + data


class _Link:
    """The child's side of the report pipe, shared by its threads (a Connection is not thread-safe)."""

    def __init__(self, conn: Connection) -> None:
        self.conn, self.lock = conn, threading.Lock()

    def send(self, message: tuple[Any, ...]) -> None:
        with self.lock:
            try:
                self.conn.send(message)
            except (OSError, ValueError):  # the parent is gone: nobody to tell
                pass


RECORDER_COMM = "tokview-record"
"""The recorder child's name as `top`, `ps -e` and `pgrep` show it (a process name holds 15 bytes): its command line
is multiprocessing's `python -c from multiprocessing.spawn import …`, which named nothing."""


def name_process(name: str) -> None:
    """Set this process's name (`/proc/self/comm`, Linux); elsewhere, or where it cannot be written, nothing."""
    try:
        with open("/proc/self/comm", "w", encoding="ascii") as comm:
            comm.write(name[:15])
    except OSError:
        pass


def child_main(spec: ChildSpec, jobs: Connection, said: Connection) -> None:
    """The recorder process: open the recorder, record everything the pipe brings until it ends, land it.

    SIGINT and SIGTERM are ignored: a stop sent to the whole process group (a terminal's Ctrl-C, `timeout`,
    `kill -- -PGID`, systemd's stop) reaches the child too, and one that killed it lost every answer it had not
    landed yet (30 of 30 a moment after a burst). The parent stops serving and closes the pipe; the child then
    records what it was handed, lands it and exits. It leaves the group for a session of its own, as the batch's
    lander does: a SIGKILL to the whole group (`kill -9 -PGID`) killed it holding the answers clients already had
    (the last ~0.15 s of them, gathered or still in the pipe); the parent's death ends the pipe, and it lands them."""
    try:
        os.setsid()
    except OSError:  # already a session leader (started so by a service manager): no group of the parent's to leave
        pass
    name_process(RECORDER_COMM)
    for stop in (signal.SIGINT, signal.SIGTERM):
        signal.signal(stop, signal.SIG_IGN)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})
    link = _Link(said)
    held = None if spec.spool_dir is None else spool_folder.hold(spec.spool_dir)  # its folder is alive while we are
    recorder = _open(spec, link)
    if recorder is None:
        return
    link.send(("ready",))
    spools = _SpoolReader(spec.spool_dir)
    journal = _Journal(spec.spool_dir, spools)
    sent: tuple[Any, ...] = ()
    sent_at = time.monotonic()
    ended = False

    def journaled(data: bytes, message: object) -> tuple[object, str | None]:
        """A piped answer written to the journal as it arrives, under the id it is recorded with (kept too once
        recording stopped: the next start records it); a spool's note as it came."""
        if isinstance(message, (Finished, Failed)):
            return message, journal.add(recorder.next_id(), data, message)
        return message, None

    while not ended:
        messages, ended = gather(jobs, COUNTS_EVERY_S, keep=journaled)
        for message, journaled_as in messages:
            if journaled_as is not None:
                recorder.take(message, journaled_as)
                continue
            item, sample_id = spools.item(message, spec.config.run_id, recorder.writer.handed)
            if item is not None:
                recorder.take(item, sample_id)
        journal.close(recorder.writer.handed)
        spools.remove_written(recorder)
        if ended:  # the parent closed the pipe or died: what came is recorded
            break
        counts = (recorder.recorded, recorder.failed, recorder.not_recorded, recorder.recording)
        stopped = bool(sent) and counts[3] != sent[3]
        due = time.monotonic() - sent_at >= COUNTS_EVERY_S  # while behind too: the parent reads its backlog
        if counts != sent and (stopped or due or not jobs.poll(0)):  # idle, due, or at once when recording stopped
            link.send(("counts", *counts))
            sent, sent_at = counts, time.monotonic()
    for sample_id, item in spools.rest(spec.config.run_id):  # spooled before the parent died: whole on disk
        recorder.take(item, sample_id)
    recorder.close()  # written and landed before the folder goes (a kill before: the next start records it)
    if recorder.recording:  # else what it could not record stays for the next start (`record_leftovers`)
        spools.remove()
    if held is not None:
        os.close(held)
    link.send(("counts", recorder.recorded, recorder.failed, recorder.not_recorded, recorder.recording))


def gather(
    jobs: Connection,
    wait_s: float,
    window_s: float = GATHER_S,
    most: int = GATHER_MAX,
    *,
    keep: Callable[[bytes, Any], Any] | None = None,
) -> tuple[list[Any], bool]:
    """What the pipe brings within `wait_s`, and then within `window_s` of the first message (at most `most`
    messages); and whether the pipe ended (EOF: the parent closed it or died), with what came before kept.
    `keep(pickled bytes, message)`: what the list holds of each message, called as it arrives (the child's
    journal writes an answer then, not after the window)."""
    messages: list[Any] = []

    def receive() -> Any:
        if keep is None:
            return jobs.recv()
        data = jobs.recv_bytes()
        return keep(data, pickle.loads(data))

    try:
        if jobs.poll(wait_s):
            messages.append(receive())
            until = time.monotonic() + window_s
            while len(messages) < most and jobs.poll(max(0.0, until - time.monotonic())):
                messages.append(receive())
    except (EOFError, OSError):
        return messages, True
    return messages, False


class _SpoolReader:
    """The child's side of the parent's spool files: an answer read back for its note, and the answers a killed
    parent spooled without their notes reaching the pipe. A file whose answers were all read goes only once the
    writer has written them as parts: removed as its `SpoolDone` came, a kill of both processes before the
    writer's next part lost every answer of it (they were in the writer's queue only)."""

    def __init__(self, directory: str | None) -> None:
        self.directory = directory
        self.read_to: dict[str, int] = {}
        """How far each spool file's answers are recorded (bytes)."""
        self.read_whole: list[tuple[str, int]] = []
        """(spool file, the writer's `handed` count once its answers were all handed to it), oldest first."""

    def item(self, message: object, run_id: str, handed: int) -> tuple[Finished | Failed | None, str | None]:
        """The item a message brings and, for a spooled one, its sample id (`spool_folder.spooled_id`). `handed`:
        the writer's count of items handed to it so far (a `SpoolDone` marks its file with it)."""
        if isinstance(message, Spooled):
            with open(message.path, "rb") as f:
                f.seek(message.offset)
                data = f.read(message.length)
            self.read_to[message.path] = message.offset + message.length
            loaded: Finished | Failed = pickle.loads(data)
            return loaded, spool_folder.spooled_id(run_id, message.path, message.offset)
        if isinstance(message, SpoolDone):
            self.read_whole.append((message.path, handed))
            return None, None
        if isinstance(message, (Finished, Failed)):
            return message, None
        raise TypeError(f"the recorder's pipe brought a {type(message).__name__}")

    def rest(self, run_id: str) -> list[tuple[str, Finished | Failed]]:
        """(sample id, answer) of those spooled after the last note that came, in order (none unless the parent
        was killed)."""
        if self.directory is None or not os.path.isdir(self.directory):
            return []
        return list(spool_folder.spooled(self.directory, run_id, lambda path: max(0, self.read_to.get(path, 0))))

    def remove_written(self, recorder: Any) -> None:
        """Remove the files read whole whose answers the writer has written as parts; none once the recorder
        stopped recording (it dropped what came after: the next start records them from the files)."""
        while self.read_whole:
            written = recorder.writer.written  # read before the error: the writer sets its error, then counts a
            if recorder.error is not None or written < self.read_whole[0][1]:  # failed group as done with
                break
            path, _ = self.read_whole.pop(0)
            self.read_to.pop(path, None)
            try:
                os.unlink(path)
            except OSError:
                pass

    def remove(self) -> None:
        if self.directory is not None:
            shutil.rmtree(self.directory, ignore_errors=True)


class _Journal:
    """The answers each gather brought over the pipe, written to a spool file of the child's own before they are
    recorded, and removed once the writer has written them as parts (`_SpoolReader.remove_written`).

    Why: a kill of the forwarding process and its recorder together (`docker kill`, a cgroup's out-of-memory kill)
    lost the answers the child had taken and not yet written as a part, though their clients had them (2-4 a kill).
    The next start on the store records a dead proxy's spool files (`spool_folder.record_leftovers`); an answer
    the child wrote before the kill is recorded again under the same sample id, which landing skips. A client's
    credentials in an answer are masked as the recorder masks them before it is written. Failures are not journaled
    (no training data, and the next start would count their attempts again).
    Nothing is written without a spool folder, or once writing failed (a full disk: recorded as before)."""

    def __init__(self, directory: str | None, spools: _SpoolReader) -> None:
        self.directory, self.spools = directory, spools
        self.number = 0
        self.file: _Spool | None = None
        self.failed = directory is None

    def add(self, sample_id: str, data: bytes, item: Finished | Failed) -> str:
        """Write the answer under `sample_id`; the id it is recorded under (the run's next, journaled or not)."""
        if self.failed or not isinstance(item, Finished):  # a failure is no training data: recorded, not journaled
            return sample_id
        if item.client_secrets:  # masked as the recorder masks them, the pickle made anew (bytes edited in place
            masked = replace(item, raw=without_secrets(item.raw, item.client_secrets), client_secrets=())  # broke it)
            data = pickle.dumps(masked, protocol=pickle.HIGHEST_PROTOCOL)
        record = pickle.dumps(spool_folder.Journaled(sample_id, data), protocol=pickle.HIGHEST_PROTOCOL)
        try:
            if self.file is None:
                assert self.directory is not None
                self.number += 1
                self.file = _Spool(self.directory, self.number, kind="c")
            self.file.append(record)
        except OSError:
            self.failed = True  # recorded all the same, as before the journal
        return sample_id

    def close(self, handed: int) -> None:
        """The gather's file is whole: removed once the writer has written `handed` items (its answers among them);
        the child's end-of-run read of spool files skips it (`read_to`: read to its end)."""
        if self.file is None:
            return
        self.file.close()
        self.spools.read_to[self.file.path] = self.file.size
        self.spools.read_whole.append((self.file.path, handed))
        self.file = None


def _open(spec: ChildSpec, link: _Link) -> Any:
    import gc

    from tokview.proxy.recorder_store import open_recorder_here

    try:
        tokenizer = None
        if spec.tokenizer_dir is not None:
            from tokview.core.tokenizer import load_tokenizer

            tokenizer = load_tokenizer(spec.tokenizer_dir)
        recorder = open_recorder_here(
            spec.config, spec.upstreams, tokenizer, lambda line: link.send(("said", line)), threaded=False
        )
    except TokviewError as exc:
        link.send(("failed", exc.message, int(exc.exit_code), exc.title))
        return None
    except Exception as exc:
        link.send(("failed", f"the proxy's recorder could not start: {type(exc).__name__}: {exc}", 1, "error"))
        return None
    gc.freeze()  # the tokenizer's vocabulary: never walked again by the collector
    gc.set_threshold(*GC_THRESHOLDS)
    return recorder
