"""The spool folder beside the store (`recorder_process`), and the leftovers of proxies that died with theirs.

Why: when both proxy processes die (SIGKILL, power loss) the answers spooled to disk are whole there but nobody
records them; the rule is that nothing already answered and stored on disk is lost. So the next proxy start on
the store records them (`record_leftovers`) and removes the folder.

Which folder belongs to a live proxy: each holds `owner.lock`, locked shared (flock) by the forwarding process from
before the folder has its final name, and by the recorder child from its start: the kernel drops both locks when
the processes die, however they die, and a pid cannot be reused into holding one. A start takes the lock
exclusive without waiting: it gets it only when no owner is left. The folder is made under `.new-` and renamed
once locked, so a start never sees an unlocked folder of a proxy being born.

Each answer once: a spooled answer's sample id is its place in the spool (`spooled_id`), the same when its child
recorded it before the crash and when the next start records it again, and landing skips a sample id already
stored (`store.landing`).
"""

from __future__ import annotations

import fcntl
import os
import pickle
import shutil
import struct
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from tokview.proxy.recorder import Failed, Finished

PREFIX = ".tokview-proxy-spool-"
NEW_PREFIX = ".tokview-proxy-spool.new-"
LOCK_NAME = "owner.lock"
RUN_NAME = "run_id"
STORE_NAME = "store"
"""The store the folder's answers belong to (its real path): a start records only its own store's leftovers (two
stores in one folder: one's start took the other's answers into itself, under a run it has no row for)."""
SPOOL_PREFIX = "spool-"
NEW_STALE_S = 60.0
"""A `.new-` folder this old belongs to a proxy that died while making it (it holds no answers yet)."""
_held: dict[str, int] = {}
"""The lock of each spool folder this process owns, by path."""


def make(db: str, run_id: str) -> str | None:
    """A new spool folder beside the store, locked as this process's; None when it cannot be made there."""
    folder = os.path.dirname(os.path.abspath(os.path.expanduser(db)))
    try:
        new = tempfile.mkdtemp(prefix=NEW_PREFIX, dir=folder)
    except OSError:
        return None
    try:
        with open(os.path.join(new, RUN_NAME), "w", encoding="utf-8") as f:
            f.write(run_id)
        with open(os.path.join(new, STORE_NAME), "w", encoding="utf-8", errors="surrogateescape", newline="") as f:
            f.write(_store_path(db) + "\0" + _file_id(db))
        fd = _lock(new, fcntl.LOCK_SH)
        final = os.path.join(folder, PREFIX + os.path.basename(new)[len(NEW_PREFIX) :])
        os.rename(new, final)
    except OSError:
        shutil.rmtree(new, ignore_errors=True)
        return None
    _held[final] = fd
    return final


def hold(directory: str) -> int | None:
    """The recorder child's share of its folder's lock (its parent may die first), or None without a folder."""
    try:
        return _lock(directory, fcntl.LOCK_SH)
    except OSError:
        return None


def release(directory: str) -> None:
    """This process is done with its folder (removed by its recorder child, or kept for the next start when the
    child died or stopped recording): its lock is dropped."""
    fd = _held.pop(directory, None)
    if fd is not None:
        os.close(fd)


def discard(directory: str) -> None:
    """A folder made for a start that failed (its recorder never came up: the store is no DuckDB file, or held):
    released and removed when it holds no spooled answer, so a refused start leaves nothing beside the store."""
    release(directory)
    if not spool_files(directory):
        shutil.rmtree(directory, ignore_errors=True)


def _lock(directory: str, how: int) -> int:
    fd = os.open(os.path.join(directory, LOCK_NAME), os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, how)
    except OSError:
        os.close(fd)
        raise
    return fd


def spooled_id(run_id: str, path: str, offset: int) -> str:
    """The sample id of the answer at `offset` of the spool file `path`: the same whoever records it."""
    return f"proxy:{run_id}:{os.path.basename(path)}.{offset:012d}"


def records(path: str, start: int = 0) -> Iterator[tuple[int, Finished | Failed]]:
    """(offset, item) of each whole `!i`-length-prefixed pickle of a spool file from `start` (a cut one ends it; one
    that does not load is passed over: it kept every later start from recording, and from starting)."""
    with open(path, "rb") as f:
        f.seek(start)
        data = f.read()
    at = 0
    while at + 4 <= len(data):
        (n,) = struct.unpack_from("!i", data, at)
        if n < 0 or at + 4 + n > len(data):
            return
        try:
            item = pickle.loads(data[at + 4 : at + 4 + n])
        except Exception:
            item = None
        if item is not None:
            yield start + at + 4, item
        at += 4 + n


def spool_files(directory: str) -> list[str]:
    """The folder's spool files in the order they were written: by their last write, then name (the parent's spool
    files and the child's journals are numbered apart, and a session's later turn recorded first split it)."""
    paths = [os.path.join(directory, n) for n in os.listdir(directory) if n.startswith(SPOOL_PREFIX)]

    def written(path: str) -> tuple[int, str]:
        try:
            return os.stat(path).st_mtime_ns, os.path.basename(path)
        except OSError:
            return 0, os.path.basename(path)

    return sorted(paths, key=written)


@dataclass(frozen=True)
class Journaled:
    """An answer the recorder child took from its pipe, as its journal keeps it (`recorder_process._Journal`): the
    sample id it is recorded under and the answer's pickled bytes, read back by `spooled` as that id and item."""

    sample_id: str
    data: bytes


def spooled(
    directory: str, run_id: str, start_of: Callable[[str], int] = lambda _path: 0
) -> Iterator[tuple[str, Finished | Failed]]:
    """(sample id, item) of every whole answer spooled in `directory`, in order, each file read from
    `start_of(its path)`: what a dead proxy left (`Leftover`), or what a child's parent spooled after its last
    note (`recorder_process`)."""
    for path in spool_files(directory):
        for offset, item in records(path, start_of(path)):
            if isinstance(item, Journaled):
                try:
                    yield item.sample_id, pickle.loads(item.data)
                except Exception:  # one that does not load is passed over (`records`)
                    continue
            else:
                yield spooled_id(run_id, path, offset), item


@dataclass
class Leftover:
    """A dead proxy's spool folder, locked by this process until `remove`."""

    path: str
    run_id: str
    fd: int

    def items(self) -> Iterator[tuple[str, Finished | Failed]]:
        """(sample id, item) of every answer spooled in it, in order."""
        return spooled(self.path, self.run_id)

    def remove(self) -> None:
        shutil.rmtree(self.path, ignore_errors=True)
        os.close(self.fd)


def leftovers(db: str) -> Iterator[Leftover]:
    """The spool folders beside the store whose proxies are gone; stale `.new-` folders are removed on the way."""
    folder = os.path.dirname(os.path.abspath(os.path.expanduser(db)))
    try:
        names = sorted(os.listdir(folder))
    except OSError:
        return
    store, file_id = _store_path(db), _file_id(db)
    for name in names:
        path = os.path.join(folder, name)
        if name.startswith(NEW_PREFIX):
            _remove_if_stale(path)
        elif name.startswith(PREFIX):
            found = _dead(path, store, file_id)
            if found is not None:
                yield found


def _store_path(db: str) -> str:
    return os.path.realpath(os.path.expanduser(db))


def _file_id(db: str) -> str:
    """The store file's device and inode ("" before it exists): what stays when the file is renamed or its folder
    moved on one file system, so the folder goes with its store and never to a neighbour."""
    try:
        st = os.stat(os.path.expanduser(db))
    except OSError:
        return ""
    return f"{st.st_dev}:{st.st_ino}"


def _dead(path: str, store: str, file_id: str) -> Leftover | None:
    if not os.path.exists(os.path.join(path, LOCK_NAME)):
        return None  # not one of ours as this version makes them: never guessed at
    try:
        with open(os.path.join(path, STORE_NAME), encoding="utf-8", errors="surrogateescape", newline="") as f:
            owner, _, owner_id = f.read().partition("\0")
        if owner != store and not (owner_id and owner_id == file_id):
            return None  # another store's (a store renamed or moved on its file system keeps its file id)
    except FileNotFoundError:
        pass  # made before folders named their store: whichever store starts first records it, as then
    except OSError:
        return None
    try:
        fd = _lock(path, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:  # held: its proxy (or its recorder) is alive; or gone meanwhile
        return None
    try:
        with open(os.path.join(path, RUN_NAME), encoding="utf-8") as f:
            run_id = f.read().strip()
    except OSError:
        run_id = ""
    return Leftover(path, run_id or "proxy-unknown", fd)


def _remove_if_stale(path: str) -> None:
    try:
        if time.time() - os.stat(path).st_mtime > NEW_STALE_S:
            shutil.rmtree(path, ignore_errors=True)
    except OSError:
        pass


def record_leftovers(db: str, open_recorder: Callable[[str], Any], say: Callable[[str], None]) -> int:
    """Record the answers of every dead proxy's spool folder (with a recorder of its run, `open_recorder(run_id)`,
    closed so they are landed) and remove the folder; the number recorded."""
    total = 0
    for leftover in leftovers(db):
        items = list(leftover.items())
        if items:
            recorder = open_recorder(leftover.run_id)
            for sample_id, item in items:
                recorder.take(item, sample_id)
            recorder.close()
            if recorder.error is not None:  # not all of it is stored: kept for the next start
                os.close(leftover.fd)
                continue
            say(
                f"tokview proxy: recorded {len(items)} answers that a proxy which died (run {leftover.run_id}) "
                "had spooled to disk"
            )
            total += len(items)
        leftover.remove()  # an empty folder too
    return total
