"""`run_score`: stored samples → a live target's logprob of every output token → the store.

Why it is shaped like `run_batch`: scoring a store of 100,000 samples is another long job against
the same servers, so it uses the same pool (retries, eviction, per-server caps), the same progress
line, the same one-writer-thread commits and the same resume rule: a sample already scored by this
target (same served model, at least this top-K) is skipped, so re-running the command continues.
Nothing is generated and nothing the sample already holds changes except its target columns and its
`off_policy` finding (core/logprobs.py documents the threshold).
"""

from __future__ import annotations

import asyncio
import json
import math
import re
import time
from collections import Counter, deque
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from functools import partial
from typing import TYPE_CHECKING, Any

from tokview.batch.config import BatchProgress, group_reasons, reason_examples
from tokview.batch.inputs import InputError
from tokview.batch.tasks import run_workers
from tokview.batch.vocabulary_probe import check_vocabulary
from tokview.core import logprobs as lp
from tokview.core.findings import off_policy_finding
from tokview.core.record import Capture
from tokview.errors import ExitCode
from tokview.secrets import scrub, scrub_text
from tokview.store import Store
from tokview.store.errors import StoreError
from tokview.store.export_rows import (
    SELECTIONS,
    Selection,
    score_candidates,
    token_ids,
    without_output_count,
)
from tokview.store.token_data import put_target_scores
from tokview.untrusted_text import clipped, printable_line
from tokview.wording import first_of

if TYPE_CHECKING:
    from tokview.servers import ServerPool
    from tokview.servers.score import TargetScore

CHUNK = 256
"""Samples read per query (one short read of the shared store each)."""
TICK_S = 0.1
"""How often the progress line is offered a snapshot while samples are scored (the printer throttles it)."""
FLUSH = 64
"""Scored samples written per transaction."""


@dataclass
class ScoreConfig:
    servers: list[str]
    backend: str = "auto"
    run: str | None = None
    select: str = "all"
    top_k: int = 0
    off_policy_nll: float = lp.DEFAULT_OFF_POLICY_NLL
    low_prob: float = lp.DEFAULT_LOW_PROB
    concurrency: int = 8
    timeout: float = 60.0
    retries: int = 3
    limit: int | None = None
    rescore: bool = False
    rescore_before: str | None = None
    """Score again the samples whose stored `scored_at` is older than this (an interrupted --rescore's start)."""
    any_vocabulary: bool = False
    """Score even when the target reads the samples' output ids as other text (`check_vocabulary`)."""
    max_consecutive_failures: int = 20
    """Stop (with the reason) after this many failed samples in a row; 0 never stops. As batch's: a target that
    died mid-run failed every sample left, each after its retries (hours on a big store)."""

    def validate(self) -> None:
        checks = [
            (bool(self.servers), "give at least one --server"),
            (self.select in SELECTIONS, f"unknown --select {self.select!r} (choose from {', '.join(SELECTIONS)})"),
            (0 <= self.top_k <= 20, "--top-k must be between 0 and 20"),
            (0 < self.off_policy_nll < math.inf, "--off-policy-nll must be a number more than 0 (nats per token)"),
            (0 < self.low_prob < 1, "--low-prob must be between 0 and 1"),
            (self.concurrency >= 1, "--concurrency must be at least 1"),
            (0 < self.timeout < math.inf, "--timeout must be a number of seconds more than 0"),
            (self.retries >= 0, "--retries must be 0 or more"),
            (self.max_consecutive_failures >= 0, "--max-consecutive-failures must be 0 or more"),
            (self.limit is None or self.limit >= 1, "--limit must be at least 1"),
            (not (self.rescore and self.rescore_before), "give --rescore or --rescore-before, not both"),
            (
                self.rescore_before is None or re.fullmatch(SCORED_AT, self.rescore_before) is not None,
                f"--rescore-before takes a time as scores record it, YYYY-MM-DDTHH:MM:SSZ (UTC), "
                f"not {str(self.rescore_before)[:40]!r}",
            ),
        ]
        for ok, message in checks:
            if not ok:
                raise InputError(message)


@dataclass
class ScoreSummary:
    input: int
    ok: int = 0
    failed: int = 0
    skipped: int = 0
    """Already scored by this target."""
    without_output: int = 0
    """Selected, but with no output ids to score (not counted in `input`)."""
    off_policy: int = 0
    tokens: int = 0
    mean_nll: float | None = None
    """Over every token scored in this invocation."""
    interrupted: bool = False
    stopped: str | None = None
    """Why the run stopped early (`max_consecutive_failures` failures in a row)."""
    rescoring_since: str | None = None
    """A --rescore (or --rescore-before) run: the time that continues it (its start, or the time it was given)."""
    elapsed_s: float = 0.0
    failures_by_reason: dict[str, int] = field(default_factory=dict)
    servers: list[dict[str, Any]] = field(default_factory=list)
    vocabulary: str | None = None
    """Why the target's vocabulary was not checked against the samples' (None: checked and agreed, or nothing to
    score)."""
    other_thresholds: int = 0
    """Already scored with another --off-policy-nll or --low-prob: their findings keep the thresholds they were scored
    with (--rescore applies these)."""

    @property
    def exit_code(self) -> int:
        if self.interrupted:
            return ExitCode.INTERRUPTED
        if self.stopped:
            return ExitCode.USAGE
        return ExitCode.FAILURES if self.failed else ExitCode.OK

    def render(self) -> str:
        nll = "n/a" if self.mean_nll is None else f"{self.mean_nll:.3f}"
        lines = [
            f"scored {self.ok} + failed {self.failed} + already scored {self.skipped} of {self.input} selected; "
            f"off_policy {self.off_policy}; {self.tokens} tokens at NLL {nll} nats/token (over the tokens: "
            f"`stats` averages each sample's) in {self.elapsed_s:.1f}s"
        ]
        if self.other_thresholds:
            n = self.other_thresholds
            lines.append(
                f"  {n} already scored sample{'s' if n != 1 else ''} keep{'' if n != 1 else 's'} the --off-policy-nll "
                "and --low-prob they were scored with (off_policy above counts this run's): --rescore applies these"
            )
        if self.vocabulary is not None:
            lines.append(f"  vocabulary not checked: {printable_line(self.vocabulary)}")
        if self.without_output:
            n = self.without_output
            lines.append(f"  not scored: {n} selected sample{'s' if n != 1 else ''} without output ids")
        # grouped by class as a batch's summary is: one cause with a request id or length in each message was ten
        # lines adding up to a fraction of the failures
        examples = reason_examples(self.failures_by_reason)
        for cls, n in list(group_reasons(self.failures_by_reason).items())[:10]:  # a server's words: escapes shown
            example = printable_line(clipped(examples[cls], 200))
            lines.append(
                f"  failed x{n}: {printable_line(cls)}" + (f" (e.g. {example})" if examples[cls] != cls else "")
            )
        if self.stopped is not None:
            again = (
                f"re-run with --rescore-before {self.rescoring_since} in place of --rescore"
                if self.rescoring_since is not None
                else "re-run the same command"
            )
            lines.append(
                f"  stopped: {printable_line(self.stopped)}; scores written so far are kept, {again} to continue"
            )
        if self.interrupted and self.rescoring_since is not None:  # the same --rescore would start over
            lines.append(
                "  interrupted: scores written so far are kept; to continue, re-run with "
                f"--rescore-before {self.rescoring_since} in place of --rescore (the samples not scored again yet)"
            )
        elif self.interrupted:
            lines.append("  interrupted: scores written so far are kept; re-run the same command to continue")
        return "\n".join(lines)


def candidates(store: Store, config: ScoreConfig) -> list[tuple[str, Any]]:
    """(sample_id, stored target_score JSON) of the selected samples, oldest first.

    A `--run` the store does not hold is an InputError (a typo would otherwise score nothing, exit 0)."""
    if config.run is not None:
        known = [r["run_id"] for r in store.runs()]
        if config.run not in known:
            shown = first_of(known, 10)
            raise InputError(f"no run {config.run!r} in {store.path} (runs: {shown or 'none'})")
    return score_candidates(store, Selection(config.select, config.run), config.limit)


def already_scored(score: dict[str, Any] | None, model: str | None, top_k: int) -> bool:
    """Scored (its stored target_score, parsed) by the same served model with at least this many alternatives."""
    return score is not None and score.get("model") == model and int(score.get("top_k") or 0) >= top_k


SCORED_AT_FORMAT = "%Y-%m-%dT%H:%M:%SZ"
SCORED_AT = r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ"
"""A score's `scored_at` (UTC, to the second): ordered as text."""


def older(score: dict[str, Any] | None, before: str | None) -> bool:
    """Whether `--rescore-before` takes this sample: a score older than `before` (none given: never)."""
    return before is not None and score is not None and str(score.get("scored_at") or "") < before


def other_thresholds(score: dict[str, Any], config: ScoreConfig) -> bool:
    """Whether a stored score was judged with another --off-policy-nll or --low-prob than this run's."""
    return (score.get("off_policy_nll"), score.get("low_prob")) != (config.off_policy_nll, config.low_prob)


async def run_score(
    config: ScoreConfig,
    store: Store,
    on_progress: Callable[[BatchProgress], None] | None = None,
    cancel: asyncio.Event | None = None,
) -> ScoreSummary:
    """Score every selected sample not yet scored by this target; raises InputError / ServerUnreachable."""
    from tokview.servers import ServerPool

    config.validate()
    pool = ServerPool(
        config.servers,
        backend=config.backend,
        concurrency=config.concurrency,
        timeout=config.timeout,
        retries=config.retries,
    )
    await pool.start()
    try:
        return await _run(config, store, pool, on_progress, cancel)
    finally:
        await pool.aclose()


async def _run(
    config: ScoreConfig,
    store: Store,
    pool: ServerPool,
    on_progress: Callable[[BatchProgress], None] | None,
    cancel: asyncio.Event | None,
) -> ScoreSummary:
    from tokview.servers import CaptureFailed
    from tokview.servers.score import score_on

    servers = pool.server_info()
    models = sorted({str(d["model"]) for d in servers if d.get("model")})
    if len(models) > 1:
        raise InputError(f"the servers serve different models ({', '.join(models)}): score against one target")
    model = models[0] if models else None
    rows = candidates(store, config)
    if not rows and not without_output_count(store, Selection(config.select, config.run)):
        # as `export` says it: a selection that matches nothing is a mistake to be told of, not a run that scored all
        run = f" --run {config.run}" if config.run else ""
        raise InputError(f"no samples match --select {config.select}{run} in {store.path}: nothing to score")
    todo: deque[str] = deque()
    kept_thresholds = 0
    began = time.strftime(SCORED_AT_FORMAT, time.gmtime())  # before any score this run writes
    for sid, stored in rows:  # each stored score parsed once
        score = json.loads(stored) if stored else None
        if config.rescore or not already_scored(score, model, config.top_k) or older(score, config.rescore_before):
            todo.append(sid)
        elif score is not None and other_thresholds(score, config):
            kept_thresholds += 1
    summary = ScoreSummary(input=len(rows), skipped=len(rows) - len(todo), servers=scrub(servers))
    if config.rescore or config.rescore_before:
        summary.rescoring_since = config.rescore_before or began
    if todo and not config.any_vocabulary:  # before any score is written: a refusal leaves the store as it was
        summary.vocabulary = await check_vocabulary(store, pool, Selection(config.select, config.run), config.backend)
    summary.other_thresholds = kept_thresholds
    if config.limit is None:  # with --limit "selected" is the first N scoreable samples: none lack output ids
        summary.without_output = without_output_count(store, Selection(config.select, config.run))
    progress = BatchProgress(total=len(rows), skipped=summary.skipped)
    started = time.monotonic()
    reasons: Counter[str] = Counter()
    nll_sum = 0.0

    def report() -> None:
        if on_progress:
            progress.elapsed_s = time.monotonic() - started
            on_progress(
                BatchProgress(
                    progress.total,
                    progress.ok,
                    progress.failed,
                    progress.skipped,
                    progress.flagged,
                    0,
                    progress.output_tokens,
                    progress.elapsed_s,
                    retried=pool.retried,
                    last_retry=pool.last_retry,
                )
            )

    writer = ThreadPoolExecutor(max_workers=1, thread_name_prefix="tokview-score")
    loop = asyncio.get_running_loop()
    queue: asyncio.Queue[tuple[str, list[int], list[int]] | None] = asyncio.Queue(maxsize=2 * CHUNK)
    pending: list[tuple[str, Capture, Any]] = []
    flush_at = FLUSH
    n_workers = min(len(todo), config.concurrency * len(config.servers))

    def load(chunk: list[str]) -> list[tuple[str, list[int], list[int]]]:
        return token_ids(store, chunk)

    async def produce() -> None:
        """Read the ids a chunk at a time (one short read each), ahead of the workers."""
        ids = list(todo)
        for start in range(0, len(ids), CHUNK):
            for item in await loop.run_in_executor(writer, load, ids[start : start + CHUNK]):
                await queue.put(item)
        for _ in range(n_workers):
            await queue.put(None)

    def flush() -> None:
        """Write the scored samples gathered so far in one transaction; a write that fails leaves them pending (the
        next flush, or the last, writes them): cleared first, 64 scores were lost on one failed write."""
        items = pending[:]
        del pending[: len(items)]
        try:
            put_target_scores(store, items)
        except BaseException:
            pending[:0] = items
            raise

    def scored(sample_id: str, prompt: list[int], output: list[int], result: TargetScore) -> Capture | None:
        nonlocal nll_sum
        found = result.logprobs
        if output and not any(v is not None for v in found.logprobs):  # `{"rank": 1}` or null for every token
            failed("the answer holds no logprob for any output token")
            return None
        positive = lp.above_zero(found.logprobs)
        if positive is not None:
            failed(f"a logprob is {positive:g}, above 0: not a log-probability")
            return None
        score = {
            "server": scrub_text(result.server_url),
            "kind": result.server_kind,
            "model": result.model,
            "top_k": config.top_k,
            "scored_at": time.strftime(SCORED_AT_FORMAT, time.gmtime()),
            **lp.score_summary(found.logprobs, off_policy_nll=config.off_policy_nll, low_prob=config.low_prob),
        }
        capture = Capture(
            prompt_ids=prompt,
            output_ids=output,
            target_logprobs=found.logprobs,
            target_top_ids=found.top_ids,
            target_top_logprobs=found.top_logprobs,
            target_score=score,
        )
        finding = off_policy_finding(capture)
        pending.append((sample_id, capture, finding))
        progress.ok += 1
        progress.flagged += finding is not None
        progress.output_tokens += score["tokens"]
        nll_sum += (score["mean_nll"] or 0.0) * score["tokens"]
        return capture

    streak = [0]
    """Failed samples in a row (`max_consecutive_failures`)."""

    def failed(reason: str) -> None:
        progress.failed += 1
        reasons[scrub_text(reason)] += 1
        streak[0] += 1
        limit = config.max_consecutive_failures
        if limit and streak[0] >= limit and summary.stopped is None:
            summary.stopped = f"stopped after {streak[0]} consecutive failures (last: {scrub_text(reason)})"
            halt.set()  # the workers are stopped as a cancel stops them: what was scored is written

    async def worker() -> None:
        nonlocal flush_at
        while (item := await queue.get()) is not None:
            sample_id, prompt, output = item
            try:
                result = await pool.call(
                    partial(score_on, backend=config.backend, prompt_ids=prompt, output_ids=output, top_k=config.top_k)
                )
                if scored(sample_id, prompt, output, result) is not None:
                    streak[0] = 0
                if len(pending) >= flush_at:
                    try:
                        await asyncio.shield(loop.run_in_executor(writer, flush))  # a cancel never cuts a write
                        flush_at = FLUSH
                    except StoreError:  # a held or failing store: the scores stay pending for the next (or last) write,
                        flush_at = len(pending) + FLUSH  # tried again FLUSH samples later, not after every one
            except CaptureFailed as exc:
                failed(exc.reason)
            except Exception as exc:  # an answer the servers layer did not classify: this sample's failure
                failed(f"unexpected error: {type(exc).__name__}: {exc}"[:300])
            report()

    async def ticker() -> None:  # as batch's: a line while every request waits on its backoff, not only per sample
        while True:
            await asyncio.sleep(TICK_S)
            report()

    report()
    workers = [asyncio.create_task(worker()) for _ in range(n_workers)] + [asyncio.create_task(produce())]
    tick = asyncio.create_task(ticker())
    halt = asyncio.Event()
    """Set by the user's cancel or by too many failures in a row (`summary.stopped` tells which)."""
    watch = asyncio.create_task(cancel.wait()) if cancel is not None else None
    if watch is not None:
        watch.add_done_callback(lambda _: halt.set())
    try:
        summary.interrupted = await run_workers(workers, halt) and summary.stopped is None
    finally:
        tick.cancel()
        if watch is not None:
            watch.cancel()
        await loop.run_in_executor(writer, flush)  # what was scored before the end (or the interrupt)
        await loop.run_in_executor(None, writer.shutdown, True)
    summary.ok, summary.failed, summary.off_policy = progress.ok, progress.failed, progress.flagged
    summary.tokens = progress.output_tokens
    summary.mean_nll = nll_sum / summary.tokens if summary.tokens else None
    summary.failures_by_reason = dict(reasons)
    summary.elapsed_s = time.monotonic() - started
    report()
    return summary
