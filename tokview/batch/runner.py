"""`run_batch`: prompts → captures → analysis → store, resumable and interruptible.

Why it is shaped this way:
- Work is planned up front as sample ids (prompt id + settings + index + turn), and the ids already in
  the store are skipped (an anti-join), so a re-run never re-generates or duplicates anything.
- Each finished capture is analysed and written in its own short transaction on one writer thread;
  a kill at any moment loses at most the requests still in flight.
- Cancelling (Ctrl-C, or the UI's cancel event) stops taking work and abandons in-flight requests;
  writes already handed to the writer thread still finish, so nothing half-written is left.
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter, deque
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Callable

from tokview.batch.config import BatchConfig, BatchProgress, BatchSummary
from tokview.batch.inputs import InputError, read_prompts
from tokview.core.analysis import analyze
from tokview.core.prompts import PromptRow, generation_points
from tokview.core.record import Capture, sample_id_for
from tokview.store import Store


@dataclass(frozen=True)
class WorkItem:
    sample_id: str
    prompt_id: str
    turn: int | None
    index: int
    messages: list[dict[str, Any]]


def resolve_tokenizer_and_profile(config: BatchConfig) -> tuple[Any, Any]:
    from tokview.core import resolve

    return resolve.resolve_tokenizer_and_profile(
        config.tokenizer_dir, config.profile, trust_remote_code=config.trust_remote_code,
        tokenizer=config.tokenizer, model_profile=config.model_profile)


def plan(rows: list[PromptRow], config: BatchConfig) -> tuple[list[WorkItem], int]:
    """Every sample slot the prompts ask for, and how many rows repeated an earlier prompt id."""
    settings = config.generation_settings()
    items: list[WorkItem] = []
    seen_prompts: set[str] = set()
    duplicates = 0
    for row in rows:
        points = generation_points(row)
        if row.prompt_id in seen_prompts:
            duplicates += len(points) * config.samples_per_prompt
            continue
        seen_prompts.add(row.prompt_id)
        for point in points:
            for index in range(config.samples_per_prompt):
                items.append(WorkItem(sample_id_for(row.prompt_id, settings, index, point.turn), row.prompt_id,
                                      point.turn, index, point.history))
    return items, duplicates


class _Counters:
    """Progress counters updated by the writer thread and read by the event loop."""

    def __init__(self, total: int, skipped: int) -> None:
        self.progress = BatchProgress(total=total, skipped=skipped)
        self.reasons: Counter[str] = Counter()
        self.started = time.monotonic()

    def snapshot(self) -> BatchProgress:
        p = self.progress
        return BatchProgress(p.total, p.ok, p.failed, p.skipped, p.flagged, p.truncated, p.output_tokens,
                             time.monotonic() - self.started)


async def run_batch(config: BatchConfig, store: Store, prompts: list[PromptRow] | None = None,
                    on_progress: Callable[[BatchProgress], None] | None = None,
                    cancel: asyncio.Event | None = None) -> BatchSummary:
    """Generate every planned sample not yet in the store. Raises InputError / ServerUnreachable."""
    from tokview.servers import CaptureFailed, CaptureRequest, ServerPool

    if config.samples_per_prompt < 1 or config.concurrency < 1:
        raise InputError("--samples-per-prompt and --concurrency must be at least 1")
    bad: list[str] = []
    if prompts is None:
        if config.prompts_path is None:
            raise InputError("no prompts given")
        prompts, bad = read_prompts(config.prompts_path, on_bad_row=config.on_bad_row, limit=config.limit)
    elif config.limit is not None:
        prompts = prompts[:config.limit]
    tokenizer, profile = resolve_tokenizer_and_profile(config)
    items, duplicates = plan(prompts, config)
    existing = store.existing_sample_ids(i.sample_id for i in items)
    todo = deque(i for i in items if i.sample_id not in existing)
    run_id = config.run_id()
    summary = BatchSummary(run_id=run_id, input=len(items) + duplicates + len(bad), resumed=len(existing),
                           duplicates=duplicates, bad_rows=bad)
    counters = _Counters(summary.input, len(existing) + duplicates + len(bad))
    report = (lambda: on_progress(counters.snapshot())) if on_progress else (lambda: None)
    report()
    if todo:
        pool = ServerPool(config.servers, backend=config.backend, tokenizer=tokenizer, profile=profile,
                          concurrency=config.concurrency, timeout=config.timeout, retries=config.retries)
        await pool.start()  # ServerUnreachable propagates: exit code 2, nothing written
        summary.servers = pool.server_info()
        store.put_run(run_id, settings=config.generation_settings(), profile=profile.name,
                      tokenizer_dir=str(tokenizer.source) if tokenizer.source else None,
                      tokenizer_hash=tokenizer.fingerprint(), template_hash=tokenizer.template_hash(),
                      server_info=summary.servers, source=str(config.prompts_path) if config.prompts_path else None)
        settings = {k: v for k, v in config.generation_settings().items() if k != "mode"}
        writer = ThreadPoolExecutor(max_workers=1, thread_name_prefix="tokview-store")
        loop = asyncio.get_running_loop()

        def store_sample(item: WorkItem, capture: Capture) -> None:
            analysis = analyze(capture, profile, tokenizer)
            store.put_sample(item.sample_id, item.prompt_id, run_id, capture, analysis, gen_index=item.index,
                             turn=item.turn, profile=profile.name)
            p = counters.progress
            p.ok += 1
            p.output_tokens += len(capture.output_ids)
            p.flagged += 0 if analysis.valid else 1
            p.truncated += capture.finish_reason == "length"

        def store_failure(item: WorkItem, exc: CaptureFailed) -> None:
            store.put_failure(item.prompt_id, item.sample_id, run_id, exc.reason, server=exc.url)
            counters.progress.failed += 1
            counters.reasons[exc.reason] += 1

        async def worker() -> None:
            while todo:
                item = todo.popleft()
                request = CaptureRequest(messages=item.messages, settings=dict(settings), mode=config.mode)
                try:
                    capture = await pool.capture(request)
                    job = loop.run_in_executor(writer, store_sample, item, capture)
                except CaptureFailed as exc:
                    job = loop.run_in_executor(writer, store_failure, item, exc)
                await asyncio.shield(job)  # a cancel abandons the wait, never the write
                report()

        workers = [asyncio.create_task(worker()) for _ in range(min(len(todo), config.concurrency *
                                                                    len(config.servers)))]
        stopper = asyncio.create_task(cancel.wait()) if cancel is not None else None
        try:
            waiting = set(workers) | ({stopper} if stopper else set())
            while any(not w.done() for w in workers):
                done, _ = await asyncio.wait(waiting, return_when=asyncio.FIRST_COMPLETED)
                for task in done:
                    if task is not stopper and task.exception() is not None:
                        raise task.exception()
                if stopper is not None and stopper.done():
                    summary.interrupted = True
                    break
                waiting -= done
        finally:
            for task in workers + ([stopper] if stopper else []):
                task.cancel()
            await asyncio.gather(*workers, return_exceptions=True)
            await loop.run_in_executor(None, writer.shutdown, True)  # let handed-over writes commit
            await pool.aclose()
    p = counters.snapshot()
    summary.ok, summary.failed, summary.skipped = p.ok, p.failed, p.skipped
    summary.flagged, summary.truncated, summary.output_tokens, summary.elapsed_s = (
        p.flagged, p.truncated, p.output_tokens, p.elapsed_s)
    summary.failures_by_reason = dict(counters.reasons)
    summary.abandoned = summary.input - summary.ok - summary.failed - summary.skipped
    report()
    return summary
