"""Running a command's worker tasks until they finish or the user cancels: one loop for batch and score.

Why one place: the rules are easy to get subtly wrong (a worker's exception must surface at once, not
after every other worker has drained; a cancel must stop taking work without losing what was handed to
the writer; no task may outlive the run), and `tokview batch` and `tokview score` need exactly the same.
"""

from __future__ import annotations

import asyncio
import os
import signal
import threading
from collections.abc import Awaitable, Callable, Coroutine, Sequence
from typing import Any, Final, TypeVar

from tokview.errors import ExitCode, TokviewError

T = TypeVar("T")

INTERRUPTED: Final = "interrupted"
"""The outcome of a capture loop, a `--workers` child or a Ray shard that a cancel stopped (Ctrl-C, SIGTERM,
the app's cancel). Every other outcome is None (all its work was tried) or the reason it stopped early."""


class StartInterrupted(TokviewError):
    """Ctrl-C (or the app's cancel) while the servers were still being probed: nothing was written."""

    title = "interrupted"
    exit_code = ExitCode.INTERRUPTED


def sigterm_as_ctrl_c() -> None:
    """A SIGTERM outside the run's event loop (while the modules load, the server is probed before the loop's own
    handlers are set, or the summary prints after `asyncio.run` put back the default) ends the command as Ctrl-C
    does there: one line, exit 130. With the default action it died silently with -15, though Ctrl-C at the same
    moment was said. Main thread only (where signal handlers live)."""
    global _sigterm_taken
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, _raise_interrupt)
        _sigterm_taken = True


def sigterm_as_ctrl_c_again() -> None:
    """After `asyncio.run`, whose loop put SIGTERM's default back: as before it, when `sigterm_as_ctrl_c` ran (the
    `tokview` process, never a caller's own, such as a test runner's)."""
    if _sigterm_taken:
        sigterm_as_ctrl_c()


_sigterm_taken = False


def _raise_interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


def cancel_on_signals(cancel: asyncio.Event) -> None:
    """Ctrl-C and SIGTERM set `cancel` instead of raising inside a request, so the run can end cleanly; a second one
    leaves at once (`_leave_now`)."""
    loop = asyncio.get_running_loop()

    def first(number: int) -> None:
        cancel.set()
        try:  # the next one at the C level: the run's last landing may be waiting for a store another program holds
            signal.signal(number, _leave_now)
        except (ValueError, OSError):
            pass

    try:
        loop.add_signal_handler(signal.SIGINT, first, signal.SIGINT)
        loop.add_signal_handler(signal.SIGTERM, first, signal.SIGTERM)
    except (NotImplementedError, RuntimeError):  # not the main thread / platform without signals
        pass


def _leave_now(signum: int, frame: object) -> None:
    """A second Ctrl-C or SIGTERM while the run ends: leave now, exit 130 (143). What the writers wrote is in parts on
    disk, which the next command on the store lands (a kill at any point loses only requests in flight, and resumes
    redo them); the last landing waited up to TOKVIEW_STORE_WAIT_S for a store another program held, and a second
    Ctrl-C was taken as the first again, unanswered."""
    os.write(2, b"\ntokview: leaving now: what was already written is kept; the same command again does the rest\n")
    os._exit(ExitCode.INTERRUPTED if signum == signal.SIGINT else 128 + signal.SIGTERM)


async def run_workers(workers: Sequence[asyncio.Task[object]], cancel: asyncio.Event | None) -> bool:
    """Wait until every worker is done or `cancel` is set; return True when it was cancelled.

    A worker's exception is raised at once. Either way every worker still running is cancelled and
    awaited before this returns, so nothing keeps running behind the caller's summary."""
    stopper = asyncio.create_task(cancel.wait()) if cancel is not None else None
    try:
        waiting: set[asyncio.Task[object]] = set(workers) | ({stopper} if stopper else set())
        while any(not w.done() for w in workers):
            done, _ = await asyncio.wait(waiting, return_when=asyncio.FIRST_COMPLETED)
            for task in done:
                if task is not stopper and (failed := task.exception()) is not None:
                    raise failed
            if stopper is not None and stopper.done():
                return True
            waiting -= done
        return False
    finally:
        for task in [*workers, *([stopper] if stopper else [])]:
            task.cancel()
        await asyncio.gather(*workers, return_exceptions=True)


async def unless_cancelled(
    step: Coroutine[Any, Any, T],
    cancel: asyncio.Event | None,
    what: str,
    discard: Callable[[T], Awaitable[None]] | None = None,
) -> T:
    """`step` (probing the servers), abandoned the moment `cancel` is set.

    The probe waits on servers with timeouts and retries (minutes against one that accepts connections
    and never answers); before this, Ctrl-C and SIGTERM only set an event nobody read until it ended.
    `discard` is given what `step` returned when it ended as the cancel came, and is abandoned all the same
    (the resume shortcut's probed servers are closed: their connections were left open)."""
    task = asyncio.create_task(step)
    if await run_workers([task], cancel):
        if discard is not None and task.done() and not task.cancelled() and task.exception() is None:
            await discard(task.result())
        raise StartInterrupted(f"interrupted while {what}: nothing was written")
    return task.result()
