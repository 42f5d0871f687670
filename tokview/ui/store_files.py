"""Whether a store's files changed since the last look: how the live screens poll without opening the store.

Why: DuckDB lets one process at a time hold a store file. A screen that opened the store every tick to ask
"anything new?" had other programs' connections refused while the app sat idle (38 of 300 for the samples
list; the proxy's landings and a batch's are such programs). `os.stat` of the file, its write-ahead log and
its parts folder costs microseconds and locks nothing; the store is read only after one of them changed.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Protocol


class _StoreFiles(Protocol):
    @property
    def path(self) -> str: ...

    @property
    def parts_dir(self) -> Path: ...


RETRY_S = 30.0
"""After a read met a held store, how long until the next read even when no file changed (a program holding
the store only to read it changes nothing, and the screen would wait for the next write)."""


class StoreFilesWatch:
    """`changed()` is True once per change of the store's files (and once `RETRY_S` after a failed read)."""

    def __init__(self, store: _StoreFiles, retry_s: float = RETRY_S) -> None:
        self.store = store
        self.retry_s = retry_s
        self._seen: tuple[int, ...] | None = None
        self._retry_at: float | None = None

    def changed(self) -> bool:
        """Whether the files differ from the last call's look (the first call: True). The caller reads the
        store when it is; a change during that read is seen at the next call."""
        now = self.signature()
        retry = self._retry_at is not None and time.monotonic() >= self._retry_at
        if now == self._seen and not retry:
            return False
        self._seen, self._retry_at = now, None
        return True

    def reading(self) -> None:
        """The caller is about to read the whole store (a load, ctrl+r): the files as they are now need no poll.
        Called before the read, from any thread: a change during the read is still seen at the next look."""
        self._seen, self._retry_at = self.signature(), None

    def read_failed(self) -> None:
        """The read after a change could not open the store (held, moved): look again in `retry_s` at most,
        not every tick (a read waiting on a holder keeps a thread busy for its whole wait)."""
        self._retry_at = time.monotonic() + self.retry_s

    def signature(self) -> tuple[int, ...]:
        """The modification times and sizes of the store file, its log and its parts folder (0s for a missing
        one); () for an in-memory store, which no other program can write."""
        if self.store.path == ":memory:":
            return ()
        path = Path(self.store.path).expanduser()
        seen: list[int] = []
        for file in (path, path.with_name(path.name + ".wal"), self.store.parts_dir):
            try:
                info = file.stat()
                seen += [info.st_mtime_ns, info.st_size]
            except OSError:
                seen += [0, 0]
        return tuple(seen)
