"""The sha256 of a file's bytes, remembered for the process while the file's status says it is unchanged.

A batch used to read and hash its tokenizer files several times before its first request: for the remembered run
identity (`batch.identity`), the equivalence verdict (`tokenizer_equivalence`) and the slice cache
(`vocab_slices`), each reading Qwen3's 16 MB of files again (~20 ms apiece on 2 cores). The status compared
includes the change time, which every write moves and no user call sets back, so an edited file is hashed again;
a file changed within `RACY_S` of its reading is hashed each time.
"""

from __future__ import annotations

import hashlib
import os
import stat
import threading
import time

_known: dict[str, tuple[tuple[int, ...], bytes]] = {}
_lock = threading.Lock()


RACY_S = 2.0
"""A file changed less than this before it was read is not remembered: on a file system with coarse timestamps
(1-2 s) a second write in the same tick would keep its status (git's "racily clean" rule)."""


def file_status(path: str | os.PathLike[str]) -> tuple[int, ...] | None:
    """What tells a file's content apart without reading it (size, mtime, ctime, inode, device); None when it is not
    a regular file (absent, a folder, a broken link)."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    if not stat.S_ISREG(st.st_mode):
        return None
    return (st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino, st.st_dev)


def settled(status: tuple[int, ...] | None) -> bool:
    """Whether a value computed from a file of this status may be remembered by it (not changed within `RACY_S`)."""
    return status is None or time.time_ns() - max(status[1], status[2]) > RACY_S * 1e9


def file_digest(path: str | os.PathLike[str]) -> bytes:
    """sha256 of the file's bytes (OSError as reading it raises)."""
    name = os.fspath(path)
    status = file_status(name)  # before the read: a file written meanwhile has another status next time
    with _lock:
        known = _known.get(name)
    if status is not None and known is not None and known[0] == status:
        return known[1]
    with open(name, "rb") as f:
        digest = hashlib.file_digest(f, "sha256").digest()
    if status is not None and settled(status):
        with _lock:
            _known[name] = (status, digest)
    return digest


def data_digest(data: bytes) -> bytes:
    """What `file_digest` gives for a file holding `data`."""
    return hashlib.sha256(data).digest()
