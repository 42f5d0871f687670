"""Facts the checks learned about a long prompt, kept so that a prompt extending it is read only past it.

An agent harness sends its whole conversation with every request: a 40,000-id prompt of which all but the newest
messages are the previous request's prompt and answer. Two checks read every prompt id: `literal_think_text` (the
bytes of every run of text ids) and `unknown_token_id` (every id against the vocabulary), 7.5 ms a request on such a
prompt. Both facts are exact on a prefix: the runs that end inside a prefix and the unknown ids inside it are the same
in every prompt that extends it. So a fact is remembered with the prompt's ids, and the next prompt that starts with
those ids is read from where they end.

The ids are kept packed (4 bytes each) and compared with `bytes.startswith` (a `memcmp`). Only prompts of at least
`MIN_IDS` ids are kept: below that, reading them again costs less than packing them.
"""

from __future__ import annotations

import struct
import threading
import weakref
from collections import OrderedDict
from collections.abc import Hashable, Sequence
from typing import Any, Generic, TypeVar

T = TypeVar("T")

_ITEM = struct.calcsize("i")
"""Bytes per packed id (4 on every platform CPython runs on)."""

MIN_IDS = 2048
"""Shorter prompts are read whole each time (packing and comparing them costs about what reading them does)."""
MAX_BYTES = 16 << 20
"""Packed ids one memo keeps (4M ids: a hundred 40,000-id sessions), the least recently used dropped first."""
MAX_ENTRIES = 256
"""Prompts one memo keeps: a lookup compares against each (a `memcmp` that stops at the first difference)."""


def packed_ids(ids: Sequence[int]) -> bytes | None:
    """The ids as 4-byte integers; None when they are too few to be worth keeping, or not all 32-bit integers."""
    if len(ids) < MIN_IDS:
        return None
    try:
        return struct.pack(f"{len(ids)}i", *ids)  # 0.3 ms for 46,000 ids; array("i", ids) takes 1.0 ms
    except struct.error:  # an id past 32 bits, or not an integer
        return None


class PrefixMemo(Generic[T]):
    """Values computed over id sequences, found again for a sequence that starts with one of them, or with the part of
    one up to a checkpoint: a harness re-renders the end of the previous prompt (its generation prompt, the text run
    that the answer now continues), so the previous prompt whole is seldom a prefix of the next one. The value must
    be readable at every checkpoint it was remembered with.

    Thread-safe: the batch's writers and the proxy's recorder analyse on their own threads."""

    def __init__(self, max_bytes: int = MAX_BYTES, max_entries: int = MAX_ENTRIES) -> None:
        self.max_bytes, self.max_entries = max_bytes, max_entries
        self._entries: OrderedDict[bytes, tuple[tuple[int, ...], T]] = OrderedDict()
        self._bytes = 0
        self._lock = threading.Lock()

    def longest(self, packed: bytes) -> tuple[int, bytes, T] | None:
        """(how many ids, the remembered sequence, its value) for the longest remembered sequence or checkpoint of one
        that `packed` starts with; the remembered sequence goes back to `remember` as `replaces`."""
        best: tuple[int, bytes, T] | None = None
        with self._lock:
            for kept, (checkpoints, value) in self._entries.items():
                for length in (len(kept) // _ITEM, *reversed(checkpoints)):
                    if best is not None and length <= best[0]:
                        break
                    size = length * _ITEM
                    if size <= len(packed) and packed.startswith(memoryview(kept)[:size]):
                        best = (length, kept, value)
                        break
            if best is not None:
                self._entries.move_to_end(best[1])
            return best

    def remember(
        self, packed: bytes, value: T, checkpoints: tuple[int, ...] = (), *, replaces: bytes | None = None
    ) -> None:
        """Keep `value` for `packed`, readable at these lengths too (ascending, in ids). `replaces`: the sequence
        `longest` found, dropped, so that a session keeps one entry, not one per turn."""
        if len(packed) > self.max_bytes:
            return
        with self._lock:
            if replaces is not None and replaces != packed and replaces in self._entries:
                del self._entries[replaces]
                self._bytes -= len(replaces)
            if packed in self._entries:
                self._entries.move_to_end(packed)
            else:
                self._bytes += len(packed)
            self._entries[packed] = (checkpoints, value)
            while self._bytes > self.max_bytes or len(self._entries) > self.max_entries:
                dropped, _ = self._entries.popitem(last=False)
                self._bytes -= len(dropped)

    def __len__(self) -> int:
        return len(self._entries)


_memos: weakref.WeakKeyDictionary[Any, dict[Hashable, PrefixMemo[Any]]] = weakref.WeakKeyDictionary()
_memos_lock = threading.Lock()


def prefix_memo(owner: object, key: Hashable) -> PrefixMemo[Any]:
    """The memo of one fact (`key`: the fact's name and whatever it depends on besides the ids) for one tokenizer
    (`owner`), kept as long as the tokenizer is."""
    with _memos_lock:
        memos = _memos.setdefault(owner, {})
        memo = memos.get(key)
        if memo is None:
            memo = memos[key] = PrefixMemo()
        return memo
