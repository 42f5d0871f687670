"""`--ray auto|ADDRESS`: prompt shards as Ray tasks, landed by the driver like a local run.

Why Ray: a team that outgrows one machine usually has a Ray cluster already; its scheduler,
retries and object store are better than anything we would write. The driver plans the run as
always (same sample ids, same resume anti-join), cuts the streamed work list into shards as it reads
it and keeps a few tasks per CPU in flight (bounded memory on a million prompts, like a local run).
A task loads the tokenizer, captures and analyses its shard against the server pool (the same
`capture_all` and writer a local run uses) and hands the shard back as part lines; the
driver writes each returned shard as a part and lands it in the store, so accounting, resume and
`ok + failed + skipped == input` are exactly a local run's. Ray is an optional extra
(`pip install -e '.[ray]'`), imported only here.
"""

from __future__ import annotations

import asyncio
import re
import signal
import threading
from collections import Counter, deque
from collections.abc import Callable, Iterable, Iterator, Sized
from dataclasses import replace
from itertools import islice
from typing import TYPE_CHECKING, Any, TypeAlias

from tokview.batch.tasks import INTERRUPTED
from tokview.errors import TokviewError, first_line

if TYPE_CHECKING:
    from typing import Protocol

    from ray import ObjectRef

    from tokview.batch.chains import ChainItem
    from tokview.batch.config import BatchConfig
    from tokview.batch.worklist import WorkItem
    from tokview.core.analysis import Analysis
    from tokview.core.record import Capture
    from tokview.store import PartWriter
    from tokview.store.sample_rows import SampleIdentity

    class SizedItems(Sized, Iterable["WorkItem | ChainItem"], Protocol):
        """The work a Ray run shards: a `TodoQueue`, or any sized iterable of items."""

    Shard: TypeAlias = "list[WorkItem | ChainItem]"
    """The items one Ray task captures."""
    ShardRef: TypeAlias = "ObjectRef[dict[str, Any]]"
    """A submitted shard: Ray's handle on what its `run_shard` returns."""

    class RemoteShard(Protocol):
        """`run_shard` as a Ray remote function."""

        def options(self, *, max_retries: int) -> RemoteShard: ...
        def remote(self, config: BatchConfig, run_id: str, items: Shard, /) -> ShardRef: ...

    class RayApi(Protocol):
        """What a run uses of the `ray` module (`connect` returns the module; a test can hand in a fake)."""

        def remote(self, function: Callable[[BatchConfig, str, Shard], dict[str, Any]], /) -> RemoteShard: ...
        def cluster_resources(self) -> dict[str, float]: ...
        def cancel(self, ray_waitable: ShardRef, /, *, force: bool = ...) -> None: ...
        def wait(
            self, ray_waitables: list[ShardRef], /, *, num_returns: int, timeout: float | None
        ) -> tuple[list[ShardRef], list[ShardRef]]: ...
        def get(self, object_refs: ShardRef, /) -> dict[str, Any]: ...


SHARD_MIN = 16
SHARD_MAX = 256
"""A returned shard is ~256 samples of part lines (a few MB at 2,000 tokens each)."""
SHARDS_IN_FLIGHT_PER_CPU = 2
"""Enough queued to keep every CPU busy while a finished shard is landed, and no more held at once."""


class RayUnavailable(TokviewError):
    """Ray is not installed or no cluster answered."""

    title = "Ray unavailable"


class CollectingSink:
    """A PartSink that keeps the parts in memory: what a Ray task hands back to the driver."""

    def __init__(self, server_urls: list[str]) -> None:
        from tokview.store.part_sink import PartSink

        self._sink = PartSink(":ray:", server_urls)
        self.samples: list[bytes] = []
        self.failures: list[dict[str, Any]] = []

    def sample_record(
        self,
        key: SampleIdentity,
        capture: Capture,
        analysis: Analysis,
    ) -> dict[str, Any]:
        return self._sink.sample_record(key, capture, analysis)

    def write_part(self, samples: list[bytes], failures: list[dict[str, Any]] | None = None) -> None:
        self.samples += samples
        self.failures += failures or []

    def ingest(self) -> tuple[int, int]:
        return 0, 0


def run_shard(config: BatchConfig, run_id: str, items: Shard) -> dict[str, Any]:
    """The body of one Ray task: capture + analyse `items`; return the part lines and the counts."""
    return asyncio.run(_shard(config, run_id, items))


async def _shard(config: BatchConfig, run_id: str, items: Shard) -> dict[str, Any]:
    from tokview.batch.capture_loop import capture_all
    from tokview.batch.writer_thread import GroupWriter

    tokenizer, profile = config.tokenizer_and_profile(sliced=False)  # a shard has much to encode
    pool = config.server_pool(tokenizer, profile)
    sink = CollectingSink(config.servers)
    writer = GroupWriter(sink, profile=profile, tokenizer=tokenizer, run_id=run_id, ingest=False)
    loop = asyncio.get_running_loop()
    try:
        await pool.start()
        outcome = await capture_all(config, pool, deque(items), writer, cancel=None, report=lambda: None)
    finally:
        await loop.run_in_executor(None, writer.close)
        await pool.aclose()
    return {
        "samples": sink.samples,
        "failures": sink.failures,
        "outcome": outcome,
        **writer.counts(),
    }


RAY_CONNECT_S = 120.0
"""How long `ray.init` may take before the run says it cannot reach Ray: a local instance starts in seconds, and an
address nobody answers at made Ray retry forever (its GCS client logs a timeout every ~40 s and never gives up)."""


def _init(address: str) -> None:
    import ray

    if ray.is_initialized():
        return
    if address == "auto":
        try:
            ray.init(address="auto", log_to_driver=False)
        except ConnectionError:
            ray.init(log_to_driver=False)  # no cluster running: a local one on this machine
    else:
        ray.init(address=address, log_to_driver=False)


async def connect(address: str, cancel: asyncio.Event | None = None, timeout_s: float = RAY_CONNECT_S) -> RayApi:
    """The `ray` module, connected. `ray.init` runs on a daemon thread: on the loop it blocked Ctrl-C (the loop's
    handler never ran) for as long as Ray retried an address nobody answers, and from the main thread it replaced
    the run's SIGTERM handler with its own `sys.exit(15)` (no summary, a native stack dump). A cancel or
    `timeout_s` ends the wait; the thread dies with the process."""
    try:
        import ray
    except ImportError:
        raise RayUnavailable(
            "--ray needs Ray: install tokview's ray extra (pip install -e '.[ray]' in tokview's folder)"
        ) from None
    loop = asyncio.get_running_loop()
    done: asyncio.Future[None] = loop.create_future()

    def settle(exc: BaseException | None) -> None:
        if done.done():  # the wait ended already (a cancel, the timeout)
            return
        if exc is None:
            done.set_result(None)
        else:
            done.set_exception(exc)

    def init() -> None:
        try:
            _init(address)
        except BaseException as exc:  # handed to the loop, said there in one line
            loop.call_soon_threadsafe(settle, exc)
        else:
            loop.call_soon_threadsafe(settle, None)

    threading.Thread(target=init, name="ray-init", daemon=True).start()
    waits = [done] + ([asyncio.ensure_future(cancel.wait())] if cancel is not None else [])
    finished, _ = await asyncio.wait(waits, timeout=timeout_s, return_when=asyncio.FIRST_COMPLETED)
    for other in waits[1:]:
        other.cancel()
    if done not in finished:
        if cancel is not None and cancel.is_set():
            raise RayInterrupted()
        raise RayUnavailable(f"cannot reach Ray at {address}: no answer in {timeout_s:.0f} s")
    exc = done.exception()
    if exc is not None:
        raise RayUnavailable(f"cannot reach Ray at {address}: {first_line(exc)}") from None
    _take_back_signals()
    api: RayApi = ray  # checked against Ray's own annotations where Ray is installed (Any where it is not)
    return api


def _take_back_signals() -> None:
    """Put the run's own SIGTERM and SIGINT handling back: Ray's core worker installs a native handler for them as it
    connects (it prints "*** SIGTERM received" with a stack dump and exits 15), so a SIGTERM ended the run without its
    summary. Python still knows its handler (the loop's); installing it again takes the signal back."""
    if threading.current_thread() is not threading.main_thread():
        return
    for number in (signal.SIGTERM, signal.SIGINT):
        handler = signal.getsignal(number)
        if handler is not None:
            signal.signal(number, handler)


class RayInterrupted(Exception):
    """Ctrl-C or SIGTERM while Ray was still connecting: the run ends as interrupted, nothing sent."""


def task_error(exc: BaseException) -> str:
    """Why a Ray task failed, in one plain line: the exception the task raised (a `RayTaskError` wraps it under a
    coloured `ray::run_shard()` header), escape sequences removed (the line lands in the summary and its JSON)."""
    cause = getattr(exc, "cause", None)
    return _ANSI.sub("", first_line(cause if isinstance(cause, BaseException) else exc))


_ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")


class Tally:
    def __init__(self) -> None:
        self.ok = self.failed = self.flagged = self.truncated = self.output_tokens = 0
        self.reasons: Counter[str] = Counter()


async def run_on_ray(
    config: BatchConfig,
    store: PartWriter,
    *,
    run_id: str,
    todo: SizedItems,
    tally: Tally,
    cancel: asyncio.Event | None,
    report: Callable[[], None],
) -> list[str | None]:
    """Submit the shards as they are read from `todo` (a `TodoQueue`, or any sized iterable of items),
    at most `SHARDS_IN_FLIGHT_PER_CPU` per CPU of the cluster at a time, and land each returned one.

    Bounded memory: the work list is never materialised, only the shards in flight and one returned
    shard are held. Returns the shards' outcomes (None: all tried); a task that failed (Ray retries a task whose
    worker died, not one that raised) leaves its shard to the resume and says so."""
    from tokview.batch.writer_thread import COUNT_FIELDS

    if config.ray is None:
        raise ValueError("run_on_ray needs config.ray: a Ray address or auto")
    try:
        ray = await connect(config.ray, cancel)
    except RayInterrupted:
        return [INTERRUPTED]
    remote = ray.remote(run_shard).options(max_retries=2)
    cpus = max(1, int(ray.cluster_resources().get("CPU", 1)))
    size = shard_size(len(todo), cpus)
    shard_config = replace(config, workers=1, tokenizer=None, model_profile=None, ray=None)
    shards = _shards(todo, size)
    pending: list[ShardRef] = []
    outcomes: list[str | None] = []
    streak = _Streak(config.max_consecutive_failures)
    loop = asyncio.get_running_loop()
    while True:
        stop = INTERRUPTED if cancel is not None and cancel.is_set() else streak.stop
        if stop is not None:  # the shards in flight are left to a resume, as a local run leaves its queue
            for ref in pending:
                ray.cancel(ref, force=True)
            if stop not in outcomes:  # a shard that stopped itself said it already
                outcomes.append(stop)
            break
        while len(pending) < SHARDS_IN_FLIGHT_PER_CPU * cpus and (shard := next(shards, None)) is not None:
            pending.append(remote.remote(shard_config, run_id, shard))
        if not pending:
            break

        def wait_for_one(waiting: list[ShardRef] = pending) -> tuple[list[ShardRef], list[ShardRef]]:
            return ray.wait(waiting, num_returns=1, timeout=0.2)

        done, pending = await loop.run_in_executor(None, wait_for_one)
        for ref in done:
            try:
                result = await loop.run_in_executor(None, ray.get, ref)
            except Exception as exc:  # the task failed: its shard is left to the resume
                outcomes.append(f"a Ray task failed: {task_error(exc)}")
                continue
            await loop.run_in_executor(None, store.write_part, result["samples"], result["failures"])
            await loop.run_in_executor(None, store.ingest)
            for key in COUNT_FIELDS:
                setattr(tally, key, getattr(tally, key) + result[key])
            tally.reasons.update(result["reasons"])
            outcomes.append(result["outcome"])
            streak.add(result)
        report()
    return outcomes


class _Streak:
    """`--max-consecutive-failures` across shards, in the order they come back: a shard with no answer adds its
    failures to the streak, one with an answer ends it; a shard that stopped itself (its own streak reached the
    limit) stops the run. Each task counted alone, so shards smaller than the limit never stopped, and a stopped
    shard did not stop the next ones: a dead server was sent the whole prompts file."""

    def __init__(self, limit: int) -> None:
        self.limit, self.failures = limit, 0
        self.stop: str | None = None

    def add(self, result: dict[str, Any]) -> None:
        self.failures = self.failures + int(result["failed"]) if not result["ok"] else 0
        if self.stop is not None:
            return
        if result["outcome"] is not None:
            self.stop = str(result["outcome"])
        elif self.limit and self.failures >= self.limit:
            failures = {r: n for r, n in result["reasons"].items() if not r.startswith("\x00")}  # not counts kept
            last = max(failures.items(), key=lambda kv: kv[1])[0] if failures else "unknown"  # beside (chains, codes)
            self.stop = f"stopped after {self.failures} consecutive failures (last: {last})"


def shard_size(todo: int, cpus: int) -> int:
    """About four shards per CPU (Ray balances them), never fewer than `SHARD_MIN` items nor more than
    `SHARD_MAX` (a shard's samples come back to the driver in one piece)."""
    return max(SHARD_MIN, min(SHARD_MAX, -(-todo // (4 * cpus))))


def _shards(todo: Iterable[WorkItem | ChainItem], size: int) -> Iterator[Shard]:
    items = iter(todo)
    while shard := list(islice(items, size)):
        yield shard
