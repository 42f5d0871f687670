"""Whether a store's files changed since the last look: how the live screens poll without opening the store.

Why: DuckDB lets one process at a time hold a store file. A screen that opened the store every tick to ask
"anything new?" had other programs' connections refused while the app sat idle (38 of 300 for the samples
list; the proxy's landings and a batch's are such programs). `os.stat` of the file, its write-ahead log and
its parts folder costs microseconds and locks nothing; the store is read only after one of them changed.

A screen's whole read (its load, ctrl+r) takes the files' signature before it reads and marks it seen only once
the read succeeded (`read_done`); a read that failed (`read_failed`: a store held by another program) is tried
again `retry_s` later even if no file changed, since a program holding the store only to read it changes none.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Protocol


class _StoreFiles(Protocol):
    @property
    def path(self) -> str: ...

    @property
    def parts_dir(self) -> Path: ...


RETRY_S = 30.0
"""After a read met a held store, how long until the next read even when no file changed."""

Signature = tuple[int, ...]


class StoreFilesWatch:
    """`changed()` is True once per change of the store's files, and at the first look `retry_s` after a failed read.

    An in-memory store (no file, no other program: the app's own writes are all there is to see) is always
    "changed": reading it blocks nobody."""

    def __init__(self, store: _StoreFiles, retry_s: float = RETRY_S) -> None:
        self.store = store
        self.retry_s = retry_s
        self._seen: Signature | None = None
        self._retry_at: float | None = None

    def changed(self) -> bool:
        """Whether the files differ from the signature last seen (by this call or a `read_done`), or a retry is due;
        the caller reads the store when it is. A change during that read is seen at the next call."""
        if self.store.path == ":memory:":
            return True
        now = self.signature()
        retry_at = self._retry_at  # read once: a worker's read_done may clear it meanwhile
        if now == self._seen and (retry_at is None or time.monotonic() < retry_at):
            return False
        self._seen, self._retry_at = now, None
        return True

    def read_done(self, before: Signature) -> None:
        """A whole read (a load, ctrl+r) succeeded: the files as they were before it (`signature()` taken before the
        read, from any thread) need no poll. Never called for a failed read: its change is still to be shown."""
        self._seen, self._retry_at = before, None

    def read_failed(self) -> None:
        """A read could not open the store (held, moved): read again at the first look `retry_s` from now, even if no
        file changed, and not every tick (a read waiting on a holder keeps a thread busy for its whole wait)."""
        self._retry_at = time.monotonic() + self.retry_s

    def signature(self) -> Signature:
        """The store file's, its log's and its parts folder's inode, modification and change times and size (0s for
        a missing one), at the paths DuckDB writes (a symlinked store's log is beside its target)."""
        path = Path(os.path.realpath(Path(self.store.path).expanduser()))
        seen: list[int] = []
        for file in (path, path.with_name(path.name + ".wal"), self.store.parts_dir):
            try:
                info = file.stat()
                seen += [info.st_ino, info.st_mtime_ns, info.st_ctime_ns, info.st_size]
            except OSError:
                seen += [0, 0, 0, 0]
        return tuple(seen)
