"""The store `tokview batch` opens only once a server has answered, and whether its file can hold anything yet.

Opening creates the database file, so `run_batch` calls the opener only after a probe: an unreachable or stalled
server leaves no file behind. `holds_nothing` tells the resume shortcut that a store not made yet holds nothing, so
it plans without opening one. Neither imports the store package until a store is opened: that import is start-up
time before the first request (which is also why `PARTS_SUFFIX` is not read from `store.parts`; a test holds the
two equal).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from tokview.store.store import Store

PARTS_SUFFIX = ".parts"
"""The folder beside a store file where batches write parts (`store.parts.parts_dir`)."""


class StoreOpener:
    def __init__(self, path: str | Path, server_urls: Sequence[str] = ()) -> None:
        self.path = str(path)
        self.server_urls = list(server_urls)
        self.opened: list[Store] = []
        """Every store this opener opened, for the caller to close."""

    def __call__(self) -> Store:
        from tokview.store.store import Store  # DuckDB is imported here, after the first probe request

        self.opened.append(Store(self.path, server_urls=self.server_urls))
        return self.opened[-1]

    def holds_nothing(self) -> bool:
        """True when neither the file nor a parts folder (a killed run's samples, not landed yet) is there."""
        if self.path == ":memory:":
            return False
        file = Path(self.path).expanduser()
        return not file.exists() and not Path(str(file) + PARTS_SUFFIX).exists()
