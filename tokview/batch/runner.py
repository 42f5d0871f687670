"""`run_batch`: prompts → captures → analysis → store, resumable and interruptible.

Why it is shaped this way:
- Work is planned up front as sample ids (prompt id + settings + served model + tokenizer vocabulary +
  profile + index + turn), and the ids already in the store are skipped (an anti-join), so a re-run
  never re-generates or duplicates anything, and another model's run never "resumes" this one. The
  servers are probed first, since the served model name is part of the id: so even a resume of a
  fully stored run needs a server that answers, and an unreachable one exits 2 before the store is
  opened (the CLI passes a store opener, so no database file is left behind).
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
from tokview.batch.limits import check_prompt_length
from tokview.core.analysis import analyze
from tokview.core.prompts import PromptRow, generation_points
from tokview.core.record import Capture, sample_id_for
from tokview.store import Store, StoreError
from tokview.store.records import scrub, scrub_text


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


def plan(rows: list[PromptRow], config: BatchConfig, settings: dict[str, Any] | None = None
         ) -> tuple[list[WorkItem], int]:
    """Every sample slot the prompts ask for, and how many rows repeated an earlier prompt id.

    `settings` is what goes into the sample ids (`config.sample_settings(identity)`)."""
    settings = config.sample_settings() if settings is None else settings
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


def served_identity(pool: Any, tokenizer: Any, profile: Any) -> dict[str, Any]:
    """What sample ids must include besides the settings: model name, tokenizer vocabulary, profile.

    The tokenizer enters by its vocabulary (`vocab_fingerprint`: the id → token table), not by its
    files: an edited tokenizer_config.json or a rebuilt cache must not turn a resume into a second
    generation of every prompt. The full file hash stays in the runs table (`tokenizer_hash`). The
    model name enters only when the servers report one; a server that reports none adds no key.
    """
    models = sorted({str(d["model"]) for d in pool.server_info() if d.get("model")})
    if len(models) > 1:
        raise InputError(f"the servers serve different models ({', '.join(models)}): run each model separately")
    return {**({"model": models[0]} if models else {}), "tokenizer": tokenizer.vocab_fingerprint(),
            "profile": profile.name}


def check_run_provenance(store: Store, run_id: str, settings: dict[str, Any]) -> None:
    """Refuse to reuse a run name for other settings, another model or tokenizer: its provenance would be lost."""
    for run in store.runs():
        if run["run_id"] != run_id:
            continue
        old = run["settings"] or {}
        changed = sorted(k for k, v in settings.items() if k in old and old[k] != v)
        if changed:
            raise InputError(f"run {run_id} was made with other {', '.join(changed)} "
                             f"({', '.join(f'{k}={old[k]!r}' for k in changed)}): choose another --run name")


def failure_reason(exc: BaseException) -> str:
    """One line for an error that is not a CaptureFailed (a bug, a tokenizer error, an odd response)."""
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
    return f"unexpected error: {type(exc).__name__}" + (f": {text[:300]}" if text else "")


async def run_batch(config: BatchConfig, store: Store | Callable[[], Store],
                    prompts: list[PromptRow] | None = None,
                    on_progress: Callable[[BatchProgress], None] | None = None,
                    cancel: asyncio.Event | None = None) -> BatchSummary:
    """Generate every planned sample not yet in the store.

    `store` is an open Store, or a function that opens one: called only once a server has answered
    the probe, so an unreachable server never creates a database file (the caller closes it).
    Raises InputError (bad config or prompts), ServerUnreachable (no server answered the probe) or
    StoreError (the database cannot be written). Any other error on one sample is recorded as that
    sample's failure and the run goes on.
    """
    from tokview.servers import ServerPool

    config.validate()
    bad: list[str] = []
    if prompts is None:
        if config.prompts_path is None:
            raise InputError("no prompts given")
        prompts, bad = read_prompts(config.prompts_path, on_bad_row=config.on_bad_row, limit=config.limit)
    elif config.limit is not None:
        prompts = prompts[:config.limit]
    tokenizer, profile = resolve_tokenizer_and_profile(config)
    pool = ServerPool(config.servers, backend=config.backend, tokenizer=tokenizer, profile=profile,
                      concurrency=config.concurrency, timeout=config.timeout, retries=config.retries)
    try:
        await pool.start()  # ServerUnreachable propagates: exit code 2, nothing written
        if not isinstance(store, Store):
            store = store()
        return await _run(config, store, pool, prompts, bad, tokenizer, profile, on_progress, cancel)
    finally:
        await pool.aclose()


async def _run(config: BatchConfig, store: Store, pool: Any, prompts: list[PromptRow], bad: list[str],
               tokenizer: Any, profile: Any, on_progress: Callable[[BatchProgress], None] | None,
               cancel: asyncio.Event | None) -> BatchSummary:
    from tokview.servers import CaptureFailed, CaptureRequest

    identity = served_identity(pool, tokenizer, profile)
    sample_settings = config.sample_settings(identity)
    items, duplicates = plan(prompts, config, sample_settings)
    existing = store.existing_sample_ids(i.sample_id for i in items)
    todo = deque(i for i in items if i.sample_id not in existing)
    run_id = config.run_id(identity)
    summary = BatchSummary(run_id=run_id, input=len(items) + duplicates + len(bad), resumed=len(existing),
                           duplicates=duplicates, bad_rows=bad, servers=scrub(pool.server_info()))
    counters = _Counters(summary.input, len(existing) + duplicates + len(bad))
    report = (lambda: on_progress(counters.snapshot())) if on_progress else (lambda: None)
    report()
    if todo:
        store.add_server_urls(config.servers)  # their user/password are masked in the stored bodies
        check_run_provenance(store, run_id, sample_settings)
        store.put_run(run_id, settings=sample_settings, profile=profile.name,
                      tokenizer_dir=str(tokenizer.source) if tokenizer.source else None,
                      tokenizer_hash=tokenizer.fingerprint(), template_hash=tokenizer.template_hash(),
                      server_info=summary.servers, source=str(config.prompts_path) if config.prompts_path else None)
        settings = {k: v for k, v in config.generation_settings().items() if k != "mode"}
        writer = ThreadPoolExecutor(max_workers=1, thread_name_prefix="tokview-store")
        loop = asyncio.get_running_loop()

        def store_failure(item: WorkItem, reason: str, server: str | None) -> None:
            store.put_failure(item.prompt_id, item.sample_id, run_id, reason, server=server)
            counters.progress.failed += 1
            counters.reasons[scrub_text(reason)] += 1

        def store_sample(item: WorkItem, capture: Capture) -> None:
            try:
                analysis = analyze(capture, profile, tokenizer)
                store.put_sample(item.sample_id, item.prompt_id, run_id, capture, analysis, gen_index=item.index,
                                 turn=item.turn, profile=profile.name, new=True)  # the anti-join said so
            except StoreError as exc:
                # this sample's data (an id DuckDB cannot hold) or the database itself? Writing the
                # failure tells them apart: a failing database raises again and stops the run.
                store_failure(item, str(exc), capture.server_url)
                return
            except Exception as exc:  # this sample's analysis failed: record it, keep going
                store_failure(item, failure_reason(exc), capture.server_url)
                return
            p = counters.progress
            p.ok += 1
            p.output_tokens += len(capture.output_ids)
            p.flagged += 0 if analysis.valid else 1
            p.truncated += capture.finish_reason == "length"

        async def worker() -> None:
            while todo:
                item = todo.popleft()
                request = CaptureRequest(messages=item.messages, settings=dict(settings), mode=config.mode)
                try:
                    check_prompt_length(pool, request)  # over_max_length: failed before it is sent
                    capture = await pool.capture(request)
                    job = loop.run_in_executor(writer, store_sample, item, capture)
                except CaptureFailed as exc:
                    job = loop.run_in_executor(writer, store_failure, item, exc.reason, exc.url)
                except Exception as exc:  # a malformed response the servers layer did not classify
                    job = loop.run_in_executor(writer, store_failure, item, failure_reason(exc), None)
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
    p = counters.snapshot()
    summary.ok, summary.failed, summary.skipped = p.ok, p.failed, p.skipped
    summary.flagged, summary.truncated, summary.output_tokens, summary.elapsed_s = (
        p.flagged, p.truncated, p.output_tokens, p.elapsed_s)
    summary.failures_by_reason = dict(counters.reasons)
    summary.abandoned = summary.input - summary.ok - summary.failed - summary.skipped
    report()
    return summary
