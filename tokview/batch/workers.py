"""`--workers N`: capture and analysis spread over N processes that feed one store.

Analysis is Python and holds the GIL, so one process tops out at one core. The parent plans the
run (same sample ids, same resume anti-join), keeps one share of the work for itself and gives
each of N-1 spawned children another share (round robin). A child loads the tokenizer, probes the
servers and runs the same capture loop as a single-process run, but only writes parts (it never
opens the DuckDB file); the parent's writer lands everyone's parts, and the children's counts
come back over a queue into the one progress line. Children die with the parent (PDEATHSIG) and
stop taking work on SIGINT/SIGTERM, like the parent.
"""

from __future__ import annotations

import asyncio
import multiprocessing
import signal
import threading
from collections import Counter, deque
from dataclasses import replace
from typing import Any

MIN_ITEMS_PER_WORKER = 32
"""Spawning a worker costs a tokenizer load (~1 s of CPU): small runs stay in one process."""


def worker_count(requested: int, todo: int) -> int:
    return max(1, min(requested, todo // MIN_ITEMS_PER_WORKER))


class RemoteTally:
    """A child's counts as last reported: read by the parent's progress line and summary."""

    def __init__(self) -> None:
        self.ok = self.failed = self.flagged = self.truncated = self.output_tokens = 0
        self.reasons: Counter[str] = Counter()
        self.outcome: str | None = None
        self.error: str | None = None
        self.done = threading.Event()


def _counts(writer: Any) -> dict[str, Any]:
    return {
        "ok": writer.ok,
        "failed": writer.failed,
        "flagged": writer.flagged,
        "truncated": writer.truncated,
        "output_tokens": writer.output_tokens,
        "reasons": dict(writer.reasons),
    }


def _die_with_parent() -> None:
    try:
        import ctypes

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


def child_main(index: int, config: Any, db_path: str, run_id: str, items: list[Any], results: Any) -> None:
    """Entry point of a spawned worker: capture `items`, write parts, report counts on `results`."""
    _die_with_parent()
    try:
        asyncio.run(_child(index, config, db_path, run_id, items, results))
    except BaseException as exc:
        results.put((index, "error", f"worker {index}: {type(exc).__name__}: {exc}"))


async def _child(index: int, config: Any, db_path: str, run_id: str, items: list[Any], results: Any) -> None:
    from tokview.batch.capture_loop import capture_all, resolve_tokenizer_and_profile
    from tokview.batch.worklist import TodoQueue
    from tokview.batch.writer import GroupWriter
    from tokview.servers import ServerPool
    from tokview.store import PartSink

    cancel = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, cancel.set)
    tokenizer, profile = resolve_tokenizer_and_profile(config)
    pool = ServerPool(
        config.servers,
        backend=config.backend,
        tokenizer=tokenizer,
        profile=profile,
        concurrency=config.concurrency,
        timeout=config.timeout,
        retries=config.retries,
    )
    sink = PartSink(db_path, server_urls=config.servers)
    writer = GroupWriter(
        sink,
        profile=profile,
        tokenizer=tokenizer,
        run_id=run_id,
        ingest=False,
        on_commit=lambda w: results.put((index, "counts", _counts(w))),
    )
    try:
        await pool.start()
        todo = items if isinstance(items, TodoQueue) else deque(items)  # a share reads the prompts file itself
        outcome = await capture_all(config, pool, todo, writer, cancel, lambda: None)
    finally:
        await loop.run_in_executor(None, writer.close)
        await pool.aclose()
    if writer.error is not None:
        outcome = str(writer.error)
    results.put((index, "counts", _counts(writer)))
    results.put((index, "done", outcome))


class WorkerGroup:
    """The N-1 children of a `--workers N` run and the thread that collects their reports."""

    def __init__(self, config: Any, db_path: str, run_id: str, shares: list[Any]) -> None:
        ctx = multiprocessing.get_context("spawn")
        self.results = ctx.Queue()
        self.tallies = [RemoteTally() for _ in shares]
        child_config = replace(config, workers=1, tokenizer=None, model_profile=None, ray=None)
        self.procs = [
            ctx.Process(
                target=child_main,
                args=(i, child_config, db_path, run_id, share, self.results),
                daemon=True,
                name=f"tokview-worker-{i}",
            )
            for i, share in enumerate(shares)
        ]
        for proc in self.procs:
            proc.start()
        self._reader = threading.Thread(target=self._read, daemon=True, name="tokview-worker-reports")
        self._reader.start()

    def _read(self) -> None:
        import queue

        while not all(t.done.is_set() for t in self.tallies):
            try:
                index, kind, payload = self.results.get(timeout=0.2)
            except queue.Empty:
                for i, proc in enumerate(self.procs):  # a child that died without a word (SIGKILL)
                    if not proc.is_alive() and not self.tallies[i].done.is_set():
                        self.tallies[i].error = f"worker {i} exited with {proc.exitcode}"
                        self.tallies[i].done.set()
                continue
            tally = self.tallies[index]
            if kind == "counts":
                for key in ("ok", "failed", "flagged", "truncated", "output_tokens"):
                    setattr(tally, key, payload[key])
                tally.reasons = Counter(payload["reasons"])
            elif kind == "done":
                tally.outcome = payload
                tally.done.set()
            elif kind == "error":
                tally.error = payload
                tally.done.set()

    def cancel(self) -> None:
        for proc in self.procs:
            if proc.is_alive() and proc.pid:
                try:
                    import os

                    os.kill(proc.pid, signal.SIGTERM)
                except OSError:
                    pass

    def wait(self) -> None:
        """Block until every child reported its end (or died), then reap them."""
        for tally in self.tallies:
            tally.done.wait()
        for proc in self.procs:
            proc.join(timeout=30)
