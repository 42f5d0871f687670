"""Live progress on stderr: a self-redrawing line on a terminal, periodic plain lines in logs.

stdout stays free for data; a CI log gets one readable line every `interval` seconds instead of a
megabyte of carriage returns.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from typing import TextIO

from tokview.batch.config import BatchProgress
from tokview.untrusted_text import printable_line


def _eta(seconds: float | None) -> str:
    if seconds is None:
        return "--:--"
    seconds = int(seconds)
    h, rem = divmod(seconds, 3600)
    m, s = divmod(rem, 60)
    return f"{h}:{m:02d}:{s:02d}" if h else f"{m:02d}:{s:02d}"


RETRY_REASON_CHARS = 60
"""How much of the last retry's reason the progress line shows (the summary has the failures' whole reasons)."""


def _retries(p: BatchProgress) -> str:
    """` | retried N (reason)` once a request was sent again: while every request waits on its backoff, the line
    otherwise stood at 0/N with nothing to say why."""
    if not p.retried:
        return ""
    reason = printable_line(p.last_retry or "")
    if len(reason) > RETRY_REASON_CHARS:
        reason = reason[: RETRY_REASON_CHARS - 1] + "…"
    return f" | retried {p.retried}" + (f" ({reason})" if reason else "")


def progress_line(p: BatchProgress) -> str:
    pct = 100.0 * p.done / p.total if p.total else 100.0
    return (
        f"{p.done}/{p.total} {pct:5.1f}% | ok {p.ok} failed {p.failed} skipped {p.skipped} "
        f"flagged {p.flagged} truncated {p.truncated} | {p.req_per_s:.1f} req/s {p.tok_per_s:.0f} tok/s "
        f"| ETA {_eta(p.eta_s)}{_retries(p)}"
    )


def score_progress_line(p: BatchProgress) -> str:
    """`tokview score`'s line: its `flagged` counts the samples it found off_policy, and it truncates nothing (the
    batch's labels said "flagged 2 truncated 0" of a store holding truncated samples)."""
    pct = 100.0 * p.done / p.total if p.total else 100.0
    return (
        f"{p.done}/{p.total} {pct:5.1f}% | ok {p.ok} failed {p.failed} skipped {p.skipped} off_policy {p.flagged} "
        f"| {p.req_per_s:.1f} req/s {p.tok_per_s:.0f} tok/s | ETA {_eta(p.eta_s)}{_retries(p)}"
    )


class ProgressPrinter:
    """Callable handed to `run_batch(on_progress=...)`."""

    def __init__(
        self,
        stream: TextIO | None = None,
        *,
        tty: bool | None = None,
        interval: float | None = None,
        line: Callable[[BatchProgress], str] = progress_line,
    ) -> None:
        self.stream = stream or sys.stderr
        self.line = line
        self.tty = self.stream.isatty() if tty is None else tty
        self.interval = interval if interval is not None else (0.1 if self.tty else 10.0)
        self._last = float("-inf")  # the first progress line shows at once
        self._drawn = False
        self._final_shown = False

    def __call__(self, p: BatchProgress) -> None:
        now = time.monotonic()
        final = p.done >= p.total
        if (final and self._final_shown) or not (final or p.ok or p.failed or p.retried):
            return
        if not final and now - self._last < self.interval:
            return
        self._final_shown = final
        self._last = now
        line = self.line(p)
        if self.tty:
            self.stream.write("\r" + line + "\x1b[K")
            self._drawn = True
        else:
            self.stream.write(line + "\n")
        self.stream.flush()

    def finish(self) -> None:
        """End the redrawn line so the summary starts on its own line."""
        if self.tty and self._drawn:
            self.stream.write("\n")
            self.stream.flush()
            self._drawn = False
