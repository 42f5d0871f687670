"""Retry policy: exponential backoff with jitter, and the server's `Retry-After` when it sends one.

Only `Retryable` failures are retried (connection errors, timeouts, 408/409/425/429/5xx, malformed
bodies); a `CaptureFailed` passes straight through, since asking again cannot change a 400.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import TypeVar

from tokview.servers.errors import CaptureFailed, Retryable

T = TypeVar("T")


@dataclass
class RetryPolicy:
    retries: int = 3
    """Extra attempts after the first."""
    backoff: float = 0.5
    """First delay in seconds; doubles each attempt."""
    max_backoff: float = 30.0
    max_retry_after: float = 120.0
    """Cap on a server's own Retry-After, so a wrong header cannot park a run for hours."""
    jitter: float = 0.25
    """± fraction of the delay, so many clients do not retry in lockstep."""
    rng: random.Random = field(default_factory=random.Random, repr=False)

    def delay(self, attempt: int, retry_after: float | None = None) -> float:
        if retry_after is not None:
            return min(max(retry_after, 0.0), self.max_retry_after)
        base = min(self.max_backoff, self.backoff * (2.0**attempt))  # 2.0: an int to an int power is typed Any
        return max(0.0, base * (1 + self.rng.uniform(-self.jitter, self.jitter)))

    async def run(
        self,
        attempt_fn: Callable[[], Awaitable[T]],
        on_retryable: Callable[[Retryable], None] | None = None,
        *,
        on_retry: Callable[[Retryable], None] | None = None,
    ) -> T:
        """Call `attempt_fn` until it succeeds, fails for good, or the retries are spent. `on_retryable`: each failed
        attempt; `on_retry`: each one another attempt follows (a progress line's "retried")."""
        last: Retryable | None = None
        for attempt in range(self.retries + 1):
            try:
                return await attempt_fn()
            except Retryable as exc:
                last = exc
                if on_retryable is not None:
                    on_retryable(exc)
                if attempt < self.retries:
                    if on_retry is not None:
                        on_retry(exc)
                    await asyncio.sleep(self.delay(attempt, exc.retry_after))
        assert last is not None
        tries = self.retries + 1
        raise GaveUp(f"{last.reason} (gave up after {tries} attempt{'s' if tries > 1 else ''})", last)


class GaveUp(CaptureFailed):
    """Retries spent; `.last` is the final Retryable (its `connection` flag says if the server is gone)."""

    def __init__(self, reason: str, last: Retryable) -> None:
        super().__init__(reason, status=last.status, url=last.url)
        self.last = last
