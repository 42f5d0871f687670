"""`--workers N`: capture and analysis spread over N processes that feed one store.

Analysis is Python and holds the GIL, so one process tops out at one core. The parent plans the
run (same sample ids, same resume anti-join) and serves the work from one feed (`WorkFeed`: the
streamed work list, read as it is taken); it takes its own work from the feed too, and each of the
N-1 spawned children asks it for the next chunk over a pipe when its buffer runs low. Whoever is
ready takes work, so all finish together: a split fixed up front left the parent idle while a child
that started a second late (spawn, imports, tokenizer load) still worked through its share.

Children are spawned only when the plan is big enough to pay for their start-up (`worker_count`:
~0.5 s of CPU each, imports and a tokenizer; `config.MIN_PROMPTS_PER_WORKER` items a process), and only once the parent's first requests are out
(`runner._Spawn`): spawned earlier, they took the CPU the parent's own start-up needed on a 2-core
box, and a small run's first answers came later. A resume with nothing to do spawns none.
Spawned, not forked: by then the parent may hold tokenizer thread pools, DuckDB connections and
threads that a fork would copy half-held.

A child only writes parts (it never opens the DuckDB file); the parent's `Lander` lands everyone's
parts, and the children's counts come back into the one progress line. Before a child writes a
part it names the part's sample ids to the parent, so when a child dies the parent knows which of
its chunks' items were never written: those go back to the feed for the others, and only the ids
of a part that was being written when it died are left for a resume (neither counted nor retried,
so nothing is duplicated). Children die with the parent (PDEATHSIG) and stop taking work on
SIGINT/SIGTERM, like the parent.
"""

from __future__ import annotations

import asyncio
import os
import signal
import threading
import time
from collections import Counter, deque
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import replace
from typing import TYPE_CHECKING, Any, NamedTuple, cast

from tokview.batch.config import min_prompts_per_worker
from tokview.batch.tasks import INTERRUPTED
from tokview.batch.writer_thread import COUNT_FIELDS, failure_reason

if TYPE_CHECKING:
    from multiprocessing.connection import Connection
    from typing import Protocol

    from tokview.batch.config import BatchConfig
    from tokview.servers import ServerPool

    class Queue(Protocol):
        """What a feed hands out from: the streamed `TodoQueue` (a deque in tests)."""

        def __len__(self) -> int: ...
        def popleft(self) -> Any: ...

    class Landable(Protocol):
        """What the lander lands into: a `Store` (its `ingest` lands every complete part)."""

        def ingest(self) -> tuple[int, int]: ...


def worker_count(requested: int, todo: int) -> int:
    """Processes for `todo` work items: at most `requested`, one per `min_prompts_per_worker()` items."""
    return max(1, min(requested, todo // min_prompts_per_worker()))


# -- the messages over a child's pipe ----------------------------------------------------------
# Named tuples read by name on both sides. Their kind comes first, so a message is still the tuple it was
# for whatever reads its kind as message[0] (the tests' hooks): every field has a default (a tuple field
# without one cannot follow one with), and messages are built by keyword.


class Start(NamedTuple):
    """Parent → child: take work from the feed and write parts beside `db_path` for `run_id`."""

    kind: str = "start"
    db_path: str = ""
    run_id: str = ""


class Stop(NamedTuple):
    """Parent → child: a surplus child, not needed for this run (the parent counts it done)."""

    kind: str = "stop"


class Items(NamedTuple):
    """Parent → child: the chunk asked for (empty: the feed is done) and how much the feed still holds."""

    kind: str = "items"
    items: tuple[Any, ...] | list[Any] = ()
    remaining: int = 0


class Take(NamedTuple):
    """Child → parent: up to `n` more items, please."""

    kind: str = "take"
    n: int = 0


class Writing(NamedTuple):
    """Child → parent: the sample ids of the part it is about to write."""

    kind: str = "writing"
    sample_ids: tuple[str, ...] | list[str] = ()


class Counts(NamedTuple):
    """Child → parent: its counters once a part is on disk (`GroupWriter.counts`)."""

    kind: str = "counts"
    counts: dict[str, Any] | None = None


class Done(NamedTuple):
    """Child → parent, its last word: how its capture loop ended (None, INTERRUPTED or why it stopped)."""

    kind: str = "done"
    outcome: str | None = None


class Failed(NamedTuple):
    """Child → parent, its last word: the error that ended it."""

    kind: str = "error"
    error: str = ""


ToChild = Start | Stop | Items
ToParent = Take | Writing | Counts | Done | Failed


# -- the parent's side -----------------------------------------------------------------------


class WorkFeed:
    """The work every process of a run takes from: the streamed `TodoQueue`, plus items given back.

    Thread-safe (the parent's event loop and the thread serving the children both take). A closed
    feed hands out nothing more: a stop (cancel, full disk, too many failures) ends every worker's
    intake at once. A prompts file edited under the run closes it with that error."""

    def __init__(self, queue: Queue) -> None:
        self._queue = queue
        self._returned: deque[Any] = deque()
        self._lock = threading.Lock()
        self.closed = False
        self.error: BaseException | None = None

    def take(self, n: int) -> list[Any]:
        out: list[Any] = []
        with self._lock:
            while len(out) < n and not self.closed:
                if self._returned:
                    out.append(self._returned.popleft())
                elif self._queue:
                    try:
                        out.append(self._queue.popleft())
                    except Exception as exc:  # the prompts file changed under the run
                        self.error, self.closed = exc, True
                else:
                    break
        return out

    def give_back(self, items: list[Any]) -> None:
        """Items a worker took and never wrote (it died or was stopped alone): first in line again."""
        with self._lock:
            self._returned.extendleft(reversed(items))

    def close(self) -> None:
        with self._lock:
            self.closed = True

    def __len__(self) -> int:
        with self._lock:
            return 0 if self.closed else len(self._returned) + len(self._queue)


class FeedTodo:
    """The parent's own view of the feed: what `capture_all` pops (a deque's len/bool/popleft)."""

    def __init__(self, feed: WorkFeed) -> None:
        self.feed = feed
        self._next: list[Any] = []

    def __len__(self) -> int:
        return len(self._next) + len(self.feed)

    def __bool__(self) -> bool:
        if not self._next:
            self._next = self.feed.take(1)
        return bool(self._next)

    def popleft(self) -> Any:
        if not self:
            raise IndexError("pop from an empty feed")
        return self._next.pop()


DRAINED_WAIT = 2
"""Gaps a written part waits to land once every item is taken (the run's end usually lands it first)."""


class Lander:
    """Lands every process's parts in the store, on a thread of its own, woken by new parts.

    Why not the writer, as it once was: landing holds the writer thread (and so this process's
    analysis) for as long as it takes; here analysis never waits for it. Why woken, not a beat: a beat
    left a part written just after it unlanded for up to a second (the app showed a sample a second
    after its answer, and a run waited for the beat it had just missed); now every written part
    `poke`s it (the writer's `on_commit` here, a child's counts over its pipe) and it lands at once
    unless it landed less than `every_s` ago (then at the end of that gap), and at least as long
    after a landing as the landing took: each landing costs ~50 ms of CPU however small (measured:
    2,400 samples landed in 1 piece took 0.76 s of CPU, in 20 pieces 1.72 s), CPU the capturing
    processes need. The first gap counts from the start, so a short run lands once, at its end.
    Once the feed is `drained`, only `DRAINED_WAIT` gaps after the part (a landing then would mostly
    delay the last one, which is the tail; but answers may be slow), unless `live` (the app: a sample
    shows as soon as it can). `close` lands what is left the
    moment the last writer is closed; `flush` lands what is written now, once, whatever the gap (the
    runner calls it as the last answers are analysed, so the last landing holds only the last part).
    `on_landed` is told how many samples each landing stored."""

    def __init__(
        self,
        store: Landable,
        *,
        every_s: float = 1.0,
        on_error: Callable[[], None] = lambda: None,
        drained: Callable[[], bool] = lambda: False,
        live: bool = False,
        on_landed: Callable[[int], None] | None = None,
        on_held: Callable[[BaseException | None], None] = lambda _: None,
    ) -> None:
        self.store, self.every_s, self.on_error, self.drained = store, every_s, on_error, drained
        self.live, self.on_landed, self.on_held = live, on_landed, on_held
        self.error: BaseException | None = None
        self.held: BaseException | None = None
        """The store held by another program past the wait at the last landing (None once one lands again): the
        parts stay and the next landing tries again. Only the final landing's is an `error`."""
        self.landings = 0
        """Landings made (the final one included): what the tests read."""
        self.last_took = 0.0
        """How long the last landing took, in seconds of wall time (read by `on_landed`)."""
        self.ended_at = 0.0
        """When the last landing ended (`time.monotonic()`; 0 before the first)."""
        self._attempt_ended = threading.Condition()
        """Told each time a landing's attempt ends (`land_soon` waits on it): `_attempts_begun` is the number of the
        newest attempt begun, `_attempts_ended` of the newest ended, `_landed_number` of the newest that landed."""
        self._attempts_begun = self._attempts_ended = self._landed_number = 0
        self._cond = threading.Condition()
        self._poked_at: float | None = None  # the first part written since the last landing
        self._flushing = self._stopping = False
        self._next = time.monotonic() + every_s  # the earliest next landing
        self._lock = threading.Lock()  # one landing at a time: the thread's, or the final one
        self._thread = threading.Thread(target=self._loop, daemon=True, name="tokview-lander")
        self._thread.start()

    def poke(self) -> None:
        """A part was written (by this process or a child): land it soon."""
        with self._cond:
            if self._poked_at is None:
                self._poked_at = time.monotonic()
            self._cond.notify()

    def flush(self) -> None:
        """Land what is written now, once, without waiting for the gap (the run is ending, or a key turn lands now)."""
        with self._cond:
            self._flushing = True
            self._poked_at = self._poked_at or time.monotonic()
            self._cond.notify()

    @property
    def busy(self) -> bool:
        """Whether a landing is under way (on the lander's thread or a caller's)."""
        with self._attempt_ended:
            return self._attempts_begun > self._attempts_ended

    def land_soon(self, timeout: float) -> bool:
        """Land what is written now, whatever the gap, and wait up to `timeout` seconds for it: whether a landing
        begun after this call has landed by then (False: still under way, the store held, the lander stopped). The
        proxy's writer waits this long at most for a key turn, never a held store's whole wait."""
        with self._attempt_ended:
            after = self._attempts_begun  # a landing begun later lists the parts written before this call
        self.flush()
        with self._attempt_ended:
            self._attempt_ended.wait_for(
                lambda: self._attempts_ended > after or self._stopping or self.error is not None, timeout
            )
            return self._landed_number > after

    def _due(self, poked_at: float) -> float:
        """When a landing of what was poked at `poked_at` may start."""
        if self.drained() and not self.live:  # only the work in flight is left: its end lands it all,
            return max(self._next, poked_at + DRAINED_WAIT * self.every_s)  # unless its answers are slow
        return self._next

    def _loop(self) -> None:
        while True:
            with self._cond:
                self._cond.wait_for(lambda: self._poked_at is not None or self._stopping)
                while not self._stopping and not self._flushing:
                    wait = self._due(self._poked_at or 0.0) - time.monotonic()
                    if wait <= 0:
                        break
                    self._cond.wait(wait)  # parts written meanwhile land with this one
                if self._stopping:
                    return
                self._poked_at, self._flushing = None, False
            if not self._land():
                return

    def _land(self, *, final: bool = False) -> bool:
        with self._lock:
            with self._attempt_ended:
                self._attempts_begun += 1
                number = self._attempts_begun
            try:
                goes_on, landed = self._attempt(final, number)
            finally:
                with self._attempt_ended:
                    self._attempts_ended = number
                    self._attempt_ended.notify_all()
        if landed is not None:
            if self.on_landed is not None and landed:
                self.on_landed(landed)  # may set the gap after this landing (`every_s`: the proxy's recorder)
            self._next = self.ended_at + max(self.every_s, self.last_took)
        return goes_on

    def _attempt(self, final: bool, number: int) -> tuple[bool, int | None]:
        """One landing, under `_lock` (the `number`-th tried): whether the lander goes on (False: it stopped with
        `error`), and how many samples it landed (None: it landed nothing, the store held or failing)."""
        from tokview.errors import TokviewError
        from tokview.store.errors import StoreHeld

        if self.error is not None:
            return False, None
        started = time.monotonic()
        try:
            landed = self.store.ingest()
        except StoreHeld as exc:  # a notebook or the duckdb CLI kept the store past the wait: the parts are safe.
            # Stopping here made a proxy drop every later answer, the store free again or not: tried again later
            if final:
                self.error = exc
                return False, None
            self.held = exc
            self.on_held(exc)
            with self._cond:
                self._poked_at = self._poked_at or time.monotonic()
            self._next = time.monotonic() + self.every_s
            return True, None
        except TokviewError as exc:  # a full disk, or a landing child refused the run (`landing_process`):
            # every process stops taking work (what was written stays)
            self.error = exc
            self.on_error()
            return False, None
        except Exception as exc:  # an OS error no store layer named, or a bug: said and stopped as above, never a
            # dead thread that lands nothing more while the run goes on (the parts stay for the next landing)
            from tokview.store.errors import StoreError

            self.error = StoreError(f"landing failed: {failure_reason(exc)}")
            self.on_error()
            return False, None
        self.ended_at = time.monotonic()
        self.last_took = self.ended_at - started
        self.landings += 1
        self._landed_number = number
        if self.held is not None:
            self.held = None
            self.on_held(None)
        return True, landed[0] if landed else 0

    def close(self) -> None:
        """Stop and land what is left (every writer is closed by now). Blocks."""
        with self._cond:
            self._stopping = True
            self._cond.notify()
        self._thread.join()
        if self.error is None:
            self._land(final=True)


SAME_STOP_S = 1.0
"""How long before the parent saw a cancel a child's stop counts as the same one (the parent's loop looks every 20 ms;
a loaded machine may take far longer to run it)."""


def _with_retries(counts: dict[str, Any], pool: ServerPool) -> dict[str, Any]:
    """A child's counts with its pool's retries (`ServerPool.retried`): the parent's line counted its own only."""
    return {**counts, "retried": pool.retried, "last_retry": pool.last_retry}


class RemoteTally:
    """A child's counts as last reported: read by the parent's progress line and summary."""

    def __init__(self) -> None:
        self.ok = self.failed = self.flagged = self.truncated = self.output_tokens = self.retried = 0
        self.last_retry: str | None = None
        self.reasons: Counter[str] = Counter()
        self.outcome: str | None = None
        self.error: str | None = None
        self.died: str | None = None
        """How it ended when it died or was stopped alone: the others took up its work, so the run
        is whole unless that left samples for a resume (the runner decides)."""
        self.by_a_stop_signal = False
        """`died` came from a Ctrl-C or SIGTERM (its INTERRUPTED end, or its death by SIGTERM): one the run itself
        got too when the whole process group was signalled (`WorkerGroup.stopped_with_the_run`)."""
        self.ended_at: float | None = None
        """When its end came in (`time.monotonic()`)."""
        self.done = threading.Event()
        self.taken = 0
        """Items this child took from the feed (what the balancing tests read)."""
        self.leased: dict[str, Any] = {}
        """Items taken and not yet named in a part: given back to the feed if the child ends without them."""
        self.unconfirmed = 0
        """Items of the part being written: if the child dies now they are neither counted nor retried
        (the part may or may not have landed), so a resume settles them."""


class WorkerGroup:
    """The children of a `--workers N` run and the thread that serves them work and reads their reports."""

    def __init__(self, config: BatchConfig, children: int) -> None:
        import multiprocessing  # here: ~25 ms of imports a one-process run never needs

        ctx = multiprocessing.get_context("spawn")
        child_config = replace(config, workers=1, tokenizer=None, model_profile=None, ray=None)
        self.tallies = [RemoteTally() for _ in range(children)]
        self.conns: list[Connection] = []
        self.procs = []
        for i in range(children):
            mine, theirs = ctx.Pipe(duplex=True)
            proc = ctx.Process(
                target=child_main, args=(i, child_config, theirs), daemon=True, name=f"tokview-worker-{i}"
            )
            with sigint_blocked():  # the child starts with it blocked and takes it once its handlers are set
                proc.start()
            theirs.close()
            self.conns.append(mine)
            self.procs.append(proc)
        self.feed: WorkFeed | None = None
        self.cancelled = False
        """The run was cancelled: a child that ends now, however it ends, was stopped, not lost."""
        self.on_counts: Callable[[], None] = lambda: None
        """Called when a child reports a part written (the runner wakes its lander)."""
        self._closed = False
        self._surplus: list[Any] = []
        self._thread: threading.Thread | None = None

    @classmethod
    def spawn(cls, config: BatchConfig, children: int) -> WorkerGroup | None:
        return cls(config, children) if children > 0 else None

    def start(self, db_path: str, run_id: str, feed: WorkFeed, children: int) -> list[RemoteTally]:
        """Let the first `children` take work from `feed` (the others are told to stop); their tallies."""
        self.feed = feed
        for i in range(len(self.conns)):
            self._send(i, Start(db_path=db_path, run_id=run_id) if i < children else Stop())
            if i >= children:
                self.tallies[i].done.set()
        self._surplus = list(zip(self.procs[children:], self.conns[children:]))
        self.tallies, self.conns, self.procs = self.tallies[:children], self.conns[:children], self.procs[:children]
        self._thread = threading.Thread(target=self._serve, daemon=True, name="tokview-worker-feed")
        self._thread.start()
        return self.tallies

    def _send(self, index: int, message: ToChild) -> None:
        try:
            self.conns[index].send(message)
        except (OSError, ValueError):  # the child is gone: its end is noticed by the reader
            pass

    def _serve(self) -> None:
        from multiprocessing.connection import wait

        open_conns: dict[Any, int] = {conn: i for i, conn in enumerate(self.conns)}
        while open_conns:
            for conn, i in list(open_conns.items()):  # our end closed under us: we let the child go
                if conn.closed:
                    del open_conns[conn]
                    self._ended(i, Done(outcome=INTERRUPTED))  # not "died": nothing was heard, nothing to join
            try:
                ready_conns = wait(list(open_conns), timeout=0.5)
            except (OSError, ValueError):  # closed between the check above and the wait: the loop drops it
                continue
            for ready in ready_conns:
                conn = cast("Connection", ready)  # `wait` was given only connections
                i = open_conns[conn]
                try:
                    message = conn.recv()
                except (EOFError, OSError):
                    del open_conns[conn]
                    self._ended(i, None)
                    continue
                if self._handle(i, message):
                    del open_conns[conn]
            # A child that died without closing its pipe. Its sentinel says so without reaping it: a
            # waitpid here (`is_alive`) would race the thread that joins the process, whose join could
            # then see ECHILD and return with no exit code.
            exited = set(wait([self.procs[i].sentinel for i in open_conns.values()], timeout=0))
            for conn, i in list(open_conns.items()):
                if self.procs[i].sentinel in exited and not conn.closed and not conn.poll():
                    del open_conns[conn]
                    self._ended(i, None)

    def _handle(self, i: int, message: ToParent) -> bool:
        """One message of child `i`; True when it was its last."""
        tally = self.tallies[i]
        if isinstance(message, Take):
            assert self.feed is not None
            items = self.feed.take(message.n)
            tally.taken += len(items)
            tally.leased.update((item.sample_id, item) for item in items)
            self._send(i, Items(items=items, remaining=len(self.feed)))
        elif isinstance(message, Writing):
            for sample_id in message.sample_ids:
                tally.leased.pop(sample_id, None)
            tally.unconfirmed = len(message.sample_ids)
        elif isinstance(message, Counts):
            counts = message.counts or {}
            for key in COUNT_FIELDS:
                setattr(tally, key, counts[key])
            tally.reasons = Counter(counts["reasons"])
            tally.retried, tally.last_retry = counts.get("retried", 0), counts.get("last_retry")
            tally.unconfirmed = 0
            self.on_counts()
        elif isinstance(message, (Done, Failed)):
            self._ended(i, message)
            return True
        return False

    def _ended(self, i: int, how: Done | Failed | None) -> None:
        """Child `i` is finished (`how` None: it died without a word): what it took and never wrote goes back."""
        tally = self.tallies[i]
        if tally.done.is_set():
            return
        back = list(tally.leased.values())
        tally.leased.clear()
        if self.feed is not None and back:
            self.feed.give_back(back)
        if how is None and self.cancelled:  # SIGTERM'd mid start-up: stopped with the run, nothing to say
            tally.outcome = INTERRUPTED
        elif how is None:
            self.procs[i].join(timeout=5)
            tally.died = (
                f"worker {i + 1} exited with {self.procs[i].exitcode}: {len(back)} of its samples went back "
                f"to the others, {tally.unconfirmed} left for a resume"
            )
            tally.by_a_stop_signal = self.procs[i].exitcode in (-signal.SIGTERM, -signal.SIGINT)
        elif isinstance(how, Failed):
            tally.error = how.error
        elif how.outcome == INTERRUPTED and self.feed is not None and not self.feed.closed:
            tally.died = f"worker {i + 1} was stopped on its own: {len(back)} of its samples went back to the others"
            tally.by_a_stop_signal = True
        else:
            tally.outcome = how.outcome
            if how.outcome is not None and self.feed is not None:  # a full disk, too many failures: all stop taking
                self.feed.close()
        tally.ended_at = time.monotonic()
        tally.done.set()

    def all_done(self) -> bool:
        return all(t.done.is_set() for t in self.tallies)

    def stopped_with_the_run(self, cancelled_at: float) -> None:
        """The run was cancelled at `cancelled_at` (`time.monotonic()`, as the parent saw it): a child that a Ctrl-C
        or SIGTERM ended within `SAME_STOP_S` before that was stopped with it, not on its own. A signal to the whole
        process group reaches the children as soon as the parent, and a child's end often came in before the
        parent's loop cancelled the group: its note said it had stopped alone. One stopped earlier keeps its note."""
        for tally in self.tallies:
            ended = tally.ended_at
            if tally.died is not None and tally.by_a_stop_signal and (ended or 0.0) >= cancelled_at - SAME_STOP_S:
                tally.died, tally.outcome = None, INTERRUPTED

    def cancel(self) -> None:
        """Stop every child taking work: the feed closes and each gets SIGTERM (it writes what is in flight)."""
        self.cancelled = True
        if self.feed is not None:
            self.feed.close()
        for proc in self.procs:
            if proc.is_alive() and proc.pid:
                try:
                    os.kill(proc.pid, signal.SIGTERM)
                except OSError:
                    pass

    def close(self) -> None:
        """Block until every child reported its end (or died). Children never started (the run ended
        before its plan) hold nothing yet: they are killed. `reap` waits for the processes to exit."""
        if self._closed:
            return
        self._closed = True
        if self._thread is None:
            for proc in self.procs:
                proc.kill()
        else:
            for tally in self.tallies:
                tally.done.wait()
            self._thread.join()

    def reap(self) -> None:
        """Wait for the children to exit (after their last report they only tear down: the parent's
        last ingest need not wait for that)."""
        self.close()
        for proc, conn in [*zip(self.procs, self.conns), *self._surplus]:
            proc.join(timeout=30)
            conn.close()


# -- the child's side ------------------------------------------------------------------------


class _Link:
    """The child's end of its pipe: sends from any thread (the loop, the writer, the prefetcher).

    Once the parent is gone a send does nothing (`gone` is set): the writer thread, which reports
    each part, died of a BrokenPipeError with a traceback, and the parts it still had to write were
    lost to the resume. Asking for work then finds the pipe closed, so the child finishes what it
    holds, writes it (the parent's next run lands it) and ends."""

    def __init__(self, conn: Connection) -> None:
        self.conn = conn
        self.gone = False
        self._lock = threading.Lock()

    def send(self, message: ToParent) -> None:
        with self._lock:
            if self.gone:
                return
            try:
                self.conn.send(message)
            except (OSError, ValueError):  # a broken pipe, or our end closed
                self.gone = True


class RemoteTodo:
    """A child's work: chunks asked of the parent's feed, one chunk ahead, as a deque's len/bool/popleft.

    A thread keeps the buffer topped up while the event loop waits on the servers, so taking work
    rarely waits for the parent. Once the feed answers with nothing, the child's work is done."""

    def __init__(self, link: _Link, chunk: int) -> None:
        self._link, self._chunk = link, chunk
        self._buffer: deque[Any] = deque()
        self._remaining = 0
        self._exhausted = self._closed = False
        self._cond = threading.Condition()
        self._fetch()  # the first chunk now: `capture_all` sizes its tasks by len()
        self._thread = threading.Thread(target=self._prefetch, daemon=True, name="tokview-worker-prefetch")
        self._thread.start()

    def _fetch(self) -> None:
        self._link.send(Take(n=self._chunk))
        answer: Items = self._link.conn.recv()
        items, remaining = answer.items, answer.remaining
        with self._cond:
            self._buffer.extend(items)
            self._remaining = remaining
            self._exhausted = self._exhausted or not items
            self._cond.notify_all()

    def _prefetch(self) -> None:
        while True:
            with self._cond:
                self._cond.wait_for(lambda: self._closed or self._exhausted or len(self._buffer) < self._chunk)
                if self._closed or self._exhausted:
                    return
            try:
                self._fetch()
            except (EOFError, OSError):  # the parent is gone
                with self._cond:
                    self._exhausted = True
                    self._cond.notify_all()
                return

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify_all()
        self._thread.join(timeout=30)

    def __len__(self) -> int:
        return len(self._buffer) + self._remaining

    def __bool__(self) -> bool:
        with self._cond:
            self._cond.wait_for(lambda: self._buffer or self._exhausted)
            return bool(self._buffer)

    def popleft(self) -> Any:
        with self._cond:
            self._cond.wait_for(lambda: self._buffer or self._exhausted)
            item = self._buffer.popleft()
            self._cond.notify_all()
            return item


@contextmanager
def sigint_blocked() -> Iterator[None]:
    """SIGINT blocked in this thread while a child is spawned. A spawned child inherits the mask, so a
    Ctrl-C on the process group during its interpreter's start-up waits for `_child` to set its handlers
    instead of ending it with a KeyboardInterrupt traceback (or a fatal error while `site` imports). Only
    this thread blocks it: the parent's main thread still takes a Ctrl-C at once."""
    from multiprocessing import resource_tracker

    # The spawn starts multiprocessing's resource tracker first if it is not running, and that start unblocks
    # SIGINT in this thread when it is done: start it before blocking, or the child starts unprotected.
    resource_tracker.ensure_running()
    previous = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, previous)


def _die_with_parent() -> None:
    try:
        import ctypes

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


def child_main(index: int, config: BatchConfig, conn: Connection) -> None:
    """Entry point of a spawned worker: get ready, wait for the run, capture what the feed hands out."""
    _die_with_parent()
    link = _Link(conn)
    try:
        asyncio.run(_child(config, link))
    except KeyboardInterrupt:  # Ctrl-C on the process group before the child's handlers were set
        link.send(Done(outcome=INTERRUPTED))
    except BaseException as exc:
        link.send(Failed(error=f"worker {index + 1}: {type(exc).__name__}: {exc}"))


async def _child(config: BatchConfig, link: _Link) -> None:
    from tokview.batch.capture_loop import capture_all
    from tokview.batch.writer_thread import GroupWriter
    from tokview.store.part_sink import PartSink

    cancel = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, cancel.set)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})  # blocked since the spawn: a Ctrl-C now cancels
    tokenizer, profile = config.tokenizer_and_profile(sliced=False)  # while the parent loads its own and plans
    pool = config.server_pool(tokenizer, profile)
    try:
        await pool.start()
        while not await loop.run_in_executor(None, link.conn.poll, 0.2):
            if cancel.is_set():
                link.send(Done(outcome=INTERRUPTED))  # said, so the parent does not report a worker lost
                return
        start = link.conn.recv()
        if not isinstance(start, Start):
            return  # a surplus child: the parent counted it done
        if cancel.is_set():
            link.send(Done(outcome=INTERRUPTED))
            return
        writer = GroupWriter(
            PartSink(start.db_path, server_urls=config.servers),
            profile=profile,
            tokenizer=tokenizer,
            run_id=start.run_id,
            ingest=False,
            on_commit=lambda w: link.send(Counts(counts=_with_retries(w.counts(), pool))),
            on_part=lambda ids: link.send(Writing(sample_ids=ids)),  # named before the part is written
        )
        todo: Any = RemoteTodo(link, max(16, config.concurrency * len(config.servers)))
        try:
            outcome = await capture_all(config, pool, todo, writer, cancel=cancel, report=lambda: None)
        finally:
            todo.close()
            await loop.run_in_executor(None, writer.close)
    finally:
        await pool.aclose()
    if writer.error is not None:
        outcome = str(writer.error)
    link.send(Counts(counts=_with_retries(writer.counts(), pool)))
    link.send(Done(outcome=outcome))
