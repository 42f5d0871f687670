"""The capture loop every process of a batch runs: take work, capture it over the pool, hand it to the writer.

Here rather than in `runner.py` because the `--workers` children (`workers.py`) and the Ray tasks
(`ray_shards.py`) run it too, and `runner.py` starts those: with the loop in the runner, each of
them imported the module that imports them.
"""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from tokview.batch.chains import ChainItem, run_chain
from tokview.batch.config import BatchConfig
from tokview.batch.limits import check_prompt, server_limit
from tokview.batch.tasks import INTERRUPTED, run_workers
from tokview.batch.vocabulary_guard import AnswerVocabularyCheck, tokenizer_name
from tokview.batch.writer_thread import GroupWriter, failure_reason
from tokview.secrets import scrub_text

if TYPE_CHECKING:
    from typing import Protocol

    from tokview.batch.worklist import WorkItem
    from tokview.servers import ServerPool

    class Todo(Protocol):
        """What the loop takes work from (a deque, the streamed `TodoQueue`, a `--workers` feed…); its
        truth is whether work is left (`__len__`, or its own `__bool__`)."""

        def __len__(self) -> int: ...
        def popleft(self) -> Any: ...


REFUSED_REQUEST = frozenset({400, 413, 422})
"""Statuses that refuse the request as it is (malformed, too large, unprocessable): a chain's later turn refused so
stops there, its turns kept. Not 401/403/404 and the like: a key rotated or a model reloading mid-run is the server's
state, and cut there, the chain was stopped for good (a re-run skipped it) though the next run could go on."""


@dataclass
class _Failures:
    """The loop's failures in a row, and why it stops early (None: it goes on), shared by its workers."""

    consecutive: int = 0
    stop: str | None = None


CAPTURE_SWITCH_INTERVAL_S = 0.0005
"""The GIL switch interval while captures run (see `capture_all`): 1.3x the samples/s of the default 5 ms."""


async def capture_all(
    config: BatchConfig,
    pool: ServerPool,
    todo: Todo,
    writer: GroupWriter,
    *,
    cancel: asyncio.Event | None,
    report: Callable[[], None],
) -> str | None:
    """Capture every item in `todo` and hand it to the writer; None when all were tried.

    Otherwise why it stopped early: INTERRUPTED (cancel), the writer's error (a full disk),
    `max_consecutive_failures` failures in a row (a server that fails every request would
    otherwise get every prompt with full retries), or first answers that read as other text with the run's
    tokenizer (`vocabulary_guard`; not with `any_vocabulary`), which a run that ends sooner returns too."""
    from tokview.servers import CaptureFailed, CaptureRequest

    settings = {k: v for k, v in config.generation_settings().items() if k != "mode"}
    context = server_limit(pool.server_info())
    if context is not None:  # over_max_length compares with the server's context, not the tokenizer's guess
        settings["max_model_len"] = context
    limit = config.max_consecutive_failures
    max_pending = 4 * max(config.concurrency * len(config.servers), 16)
    state = _Failures()
    vocabulary = (
        None
        if config.any_vocabulary
        else AnswerVocabularyCheck(tokenizer_name(config.tokenizer_dir, config.tokenizer or pool.tokenizer))
    )

    def fail(item: WorkItem | None, reason: str, url: str | None) -> None:
        if item is not None:  # None: a chain's failure, already handed to the writer with its chain
            writer.add_failure(item, reason, url)
        state.consecutive += 1
        if limit and state.consecutive >= limit and state.stop is None:
            state.stop = f"stopped after {state.consecutive} consecutive failures (last: {scrub_text(reason)})"

    async def attempt(
        item: WorkItem | ChainItem,
        messages: list[dict[str, Any]],
        extra_kwargs: dict[str, Any] | None = None,
        prefer: str | None = None,
    ) -> Any:
        """One request: the capture, or (failure reason, server, whether it was sent[, whether the server refused the
        request: a 4xx]) once it failed. `prefer`: the server to send it to while that one is healthy."""
        request = CaptureRequest(messages=messages, settings=request_settings(item, extra_kwargs), mode=config.mode)
        too_long, room = check_prompt(pool, request)
        if too_long is not None:  # never sent; not the server's fault
            return too_long, None, False
        if room is not None:  # what fits under the server's context length
            request.settings["max_new_tokens"] = room
        try:
            capture = await pool.capture(request, prefer=prefer)
        except CaptureFailed as exc:
            refused = exc.status in REFUSED_REQUEST  # the request itself, not the server: a chain stops there
            return exc.reason, exc.url, True, refused
        except Exception as exc:  # a malformed response the servers layer did not classify
            return failure_reason(exc), None, True
        if vocabulary is not None and (wrong := vocabulary.see(capture, pool.tokenizer)) and state.stop is None:
            state.stop = wrong
        return capture

    def request_settings(item: WorkItem | ChainItem, extra_kwargs: dict[str, Any] | None) -> dict[str, Any]:
        out = dict(settings)
        if getattr(item, "tools", None):
            out["tools"] = item.tools  # sent by the chat endpoints; read by the `tool_not_declared` check
        given = settings.get("chat_template_kwargs")
        if extra_kwargs or given:  # over the profile's own kwargs (thinking, a date), not instead of them
            profile = getattr(pool, "profile", None)
            base = profile.template_kwargs(config.thinking) if profile is not None else {}
            out["chat_template_kwargs"] = {**base, **(given or {}), **(extra_kwargs or {})}
        return out

    async def one(item: WorkItem) -> None:
        got = await attempt(item, item.messages)
        if isinstance(got, tuple):
            reason, url, sent = got[:3]
            if sent:
                fail(item, reason, url)
            else:  # never sent (too long): the prompt's fault, not the server's
                writer.add_failure(item, reason, None)
            return
        state.consecutive = 0
        writer.add_sample(item, got)  # handed over at once: a cancel can no longer lose it

    async def chain(item: ChainItem) -> None:
        served_by: list[str] = []
        """The server of the chain's last answer: its next turn is sent there first, so it finds the conversation so
        far in that server's prefix cache, and one chain is rendered by one server's template (turns split between a
        vLLM and an SGLang of a mixed fleet broke each prefix). After a failover the chain stays where it went."""

        async def turn(messages: list[dict[str, Any]], kw: dict[str, Any] | None) -> Any:
            got = await attempt(item, messages, kw, served_by[0] if served_by else None)
            if not isinstance(got, tuple) and got.server_url:
                served_by[:] = [got.server_url]
            return got

        result = await run_chain(item, turn, pool.tokenizer, getattr(pool, "profile", None))
        if result.failure is None:
            state.consecutive = 0
        writer.add_chain(item, result)  # the whole chain in one part: a resume never meets half of one
        if result.failure is not None and result.failure[2]:
            fail(None, *result.failure[:2])

    async def worker() -> None:
        while state.stop is None and writer.error is None and todo:  # `todo` last: testing it may take an item
            while writer.pending > max_pending and writer.error is None:  # analysis is behind: wait for it
                await asyncio.sleep(0.005)
            if not todo:
                break
            item = todo.popleft()
            if isinstance(item, ChainItem):
                await chain(item)
            else:
                await one(item)

    async def ticker() -> None:
        while True:
            await asyncio.sleep(0.1)
            report()

    workers = [asyncio.create_task(worker()) for _ in range(min(len(todo), config.concurrency * len(config.servers)))]
    tick = asyncio.create_task(ticker())
    # The writer thread analyses for milliseconds at a time and this thread only needs the GIL for a
    # moment per answer; at the default 5 ms switch interval each moment waits up to 5 ms behind it.
    switch = sys.getswitchinterval()
    sys.setswitchinterval(min(switch, CAPTURE_SWITCH_INTERVAL_S))
    try:
        interrupted = await run_workers(workers, cancel)
    finally:
        sys.setswitchinterval(switch)
        tick.cancel()
        await asyncio.gather(tick, return_exceptions=True)
    if interrupted:
        return INTERRUPTED
    if writer.error is not None:
        return str(writer.error)
    if state.stop is None and vocabulary is not None:  # a run done before `TOLD` answers were told
        state.stop = vocabulary.verdict()
    return state.stop
