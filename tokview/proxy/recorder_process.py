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
"""

from __future__ import annotations

import asyncio
import os
import pickle
import signal
import struct
import threading
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from tokview.errors import TokviewError, UserError
from tokview.proxy.recorder import Failed, Finished

if TYPE_CHECKING:
    from multiprocessing.connection import Connection

READY_TIMEOUT_S = 300.0
"""How long the parent waits for the child to load its tokenizer and open the store."""
COUNTS_EVERY_S = 0.25
"""The child reports its counters when it is idle this long (not after every item: each report woke a
thread of the forwarding process)."""
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


class RecorderProcess:
    """The parent's handle on the child: `take`, the counters and `close`, as `Recorder` has them."""

    def __init__(self, spec: ChildSpec, say: Callable[[str], None]) -> None:
        import multiprocessing

        from tokview.batch.workers import sigint_blocked

        self.say = say
        self.recorded = self.failed = self.not_recorded = 0
        self.recording = True
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

    def take(self, item: Finished | Failed) -> None:
        """Hand an item to the child, from the event loop: pickled (one copy of the answer's bytes) and written
        to the pipe as a `Connection.recv` frame, without blocking; what the pipe cannot take now is written
        when the loop says it can. No thread: a feeder thread cost a GIL hand-over per request."""
        data = pickle.dumps(item, protocol=pickle.HIGHEST_PROTOCOL)
        frame = struct.pack("!i", len(data)) + data
        if self._pending:
            self._pending.append(frame)
            return
        try:
            written = os.write(self._fd, frame)
        except BlockingIOError:
            written = 0
        except OSError:  # the child is gone: counted, never a broken forwarding loop
            self._lost()
            return
        if written < len(frame):
            self._pending.append(frame[written:])
            self._wait_writable()

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
            except OSError:
                self._pending.clear()
                self._lost()
                break
            if written < len(self._pending[0]):
                self._pending[0] = self._pending[0][written:]
                return
            self._pending.popleft()
        if self._loop is not None:
            self._loop.remove_writer(self._fd)

    def _drain_blocking(self) -> None:
        os.set_blocking(self._fd, True)
        try:
            while self._pending:
                os.write(self._fd, self._pending.popleft())  # blocking: writes it all
        except OSError:
            self._pending.clear()
            self._lost()
        finally:
            os.set_blocking(self._fd, False)

    def _lost(self) -> None:
        self.not_recorded += 1
        self.recording = False

    def _read(self) -> None:
        while True:
            try:
                message = self._said.recv()
            except (EOFError, OSError):
                return
            if message[0] == "said":
                self.say(message[1])
            elif message[0] == "counts":
                self.recorded, self.failed, self.not_recorded, self.recording = message[1:]

    def close(self) -> None:
        """Let the child record and land what it was handed, and wait for it (the loop has stopped by now)."""
        self._drain_blocking()
        self._jobs.close()  # the child reads to the end, records, lands and exits
        self.process.join()
        self._reader.join(timeout=5)
        if self.process.exitcode not in (0, None):
            self.recording = False
            self.say(f"tokview proxy: the recorder process ended with exit code {self.process.exitcode}")


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


def child_main(spec: ChildSpec, jobs: Connection, said: Connection) -> None:
    """The recorder process: open the recorder, record everything the pipe brings until it ends, land it."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})
    link = _Link(said)
    recorder = _open(spec, link)
    if recorder is None:
        return
    link.send(("ready",))
    sent: tuple[Any, ...] = ()
    while True:
        try:
            if jobs.poll(COUNTS_EVERY_S):
                recorder.take(jobs.recv())
        except (EOFError, OSError):  # the parent closed the pipe or died: what came is recorded
            break
        counts = (recorder.recorded, recorder.failed, recorder.not_recorded, recorder.recording)
        stopped = bool(sent) and counts[3] != sent[3]
        if counts != sent and (stopped or not jobs.poll(0)):  # when idle, or at once when recording stopped
            link.send(("counts", *counts))
            sent = counts
    recorder.close()
    link.send(("counts", recorder.recorded, recorder.failed, recorder.not_recorded, recorder.recording))


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
