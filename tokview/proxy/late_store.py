"""The proxy's store when another program held it as the proxy started: opened at the first landing that finds it free.

Why: the proxy waited its 10 s for the store, then refused to start, so a harness pointed at it could not connect
at all; a notebook's open connection was enough. Recording needs no store file: the writer writes parts beside it
(`PartSink`, as a `--workers` child does) and only a landing opens it. So the proxy starts, forwards, writes parts,
and says loudly that nothing lands yet. The first landing that opens the store records the run (its row first,
as an open at start would have) and lands what came; from then on this is that store.

What a late start leaves out: the conversations of earlier runs are not restored (their next turns start sessions
of their own), and a killed proxy's leftover spool is recorded by the next start instead.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

from tokview.store.part_sink import PartSink

if TYPE_CHECKING:
    from tokview.core.analysis import Analysis
    from tokview.core.record import Capture
    from tokview.store.sample_rows import SampleIdentity
    from tokview.store.store import Store


class LateStore:
    """Stands in for the `Store` the recorder writes through until `open_store` succeeds (it raises StoreHeld
    while the store is held: the lander then says NOT LANDING and tries again later, as after a start)."""

    def __init__(self, path: str, server_urls: Sequence[str], open_store: Callable[[], Store]) -> None:
        self.path = path
        self._sink = PartSink(path, server_urls)
        self._open_store = open_store
        self._store: Store | None = None
        self._opening = threading.Lock()

    def _opened(self) -> Store:
        with self._opening:  # the lander and a key look may ask at once: one open, one run row
            if self._store is None:
                self._store = self._open_store()
            return self._store

    def sample_record(self, key: SampleIdentity, capture: Capture, analysis: Analysis) -> dict[str, Any]:
        return self._sink.sample_record(key, capture, analysis)

    def write_part(self, samples: Sequence[Any], failures: Sequence[Any] = ()) -> None:
        self._sink.write_part(samples, failures)

    def ingest(self) -> tuple[int, int]:
        return self._opened().ingest()

    @contextmanager
    def hold(self) -> Iterator[Store]:
        with self._opened().hold() as store:
            yield store

    def close(self) -> None:
        if self._store is not None:  # never opened: nothing to close (opening it to close it would wait on the holder)
            self._store.close()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._opened(), name)  # a query, close: the store itself
