"""The store work of the app's curation keys, made in key order on a thread of its own; a key waits for it briefly.

Why: a verdict, note, tag or undo was written on the UI thread. While another program held the store (a notebook's
DuckDB connection, a long landing), the store waited up to its lock timeout (15 s) for it, and the whole app froze
without a word: no repaint, no key. Now each key's store work goes to one thread, in the order the keys were pressed
(a verdict and then `u` stay in that order), and the key waits for it at most `wait_s`: long enough that a free store
answers within the key (its change shows at once, as before), short enough that a held one leaves the app usable.
The app then says it waits; the change, and what the key does after it (a dialog, the list's new status), come once
the store answers, and a store held past its timeout is the usual notification. Quitting waits for what is queued
(`close`), so a change the app said it would make is made.
"""

from __future__ import annotations

import asyncio
import threading
import traceback
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import TYPE_CHECKING, Any, TypeVar

from tokview.ui.worker_errors import WORDED, failure_notice

if TYPE_CHECKING:
    from textual.app import App

T = TypeVar("T")

WAIT_S = 1.0
"""How long a key waits for its store work before the app goes on without it (a free store answers in ms)."""


class StoreKeys:
    """One thread for the keys' store work, and what happens after it on the UI thread."""

    def __init__(self, app: App[Any], wait_s: float = WAIT_S) -> None:
        self._app = app
        self.wait_s = wait_s
        self._pool: ThreadPoolExecutor | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._lock = threading.Lock()
        self.pending = 0
        """Store work the app went on without, not answered yet."""

    def run(self, work: Callable[[], T], then: Callable[[T], None], failed: Callable[[BaseException], bool]) -> None:
        """Do `work` on the store thread, then `then(result)` on the UI thread: within this call when the store
        answers within `wait_s`, else once it does. `failed(error)`: True when it told the person (a store error
        worded for them); any other error is a bug, notified as one (and raised, within the call)."""
        self._loop = asyncio.get_running_loop()
        with self._lock:
            if self._pool is None:
                self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="tokview-store-keys")
            future = self._pool.submit(work)
        try:
            result = future.result(timeout=self.wait_s)
        except TimeoutError:
            if not future.done():  # else the work itself raised TimeoutError: a failure like any other
                self.pending += 1
                self._app.notify(
                    "another program holds the store: this change is made once it lets go (the app stays usable)",
                    title="store",
                    timeout=4,
                )
                future.add_done_callback(lambda done: self._answered(done, then, failed))
                return
            if not failed(future.exception() or TimeoutError()):
                raise
            return
        except Exception as exc:
            if not failed(exc):
                raise
            return
        then(result)

    def close(self) -> None:
        """Wait for the work queued (the app is quitting: every change it said it would make is made)."""
        with self._lock:
            pool, self._pool = self._pool, None
        if pool is not None:
            pool.shutdown(wait=True)

    def _answered(self, future: Future[T], then: Callable[[T], None], failed: Callable[[BaseException], bool]) -> None:
        loop = self._loop
        try:
            if loop is not None:
                loop.call_soon_threadsafe(self._finish, future, then, failed)
        except RuntimeError:  # the app has ended: the work is done, there is nothing left to show
            pass

    def _finish(self, future: Future[T], then: Callable[[T], None], failed: Callable[[BaseException], bool]) -> None:
        self.pending -= 1
        try:
            error = future.exception()
            if error is None:
                then(future.result())
            elif not failed(error):
                self._bug(error)
        except Exception as exc:  # raised by what the key does after its work: a bug, notified, the app goes on
            self._bug(exc)

    def _bug(self, error: BaseException) -> None:
        if not isinstance(error, WORDED):
            self._app.log.error("".join(traceback.format_exception(error)))
        title, message = failure_notice(error)
        self._app.notify(message, title=title, severity="error", timeout=8)
