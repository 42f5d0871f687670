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
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

T = TypeVar("T")

_ITEM = struct.calcsize("=i")
"""Bytes per packed id."""

MIN_IDS = 2048
"""Shorter prompts are read whole each time (packing and comparing them costs about what reading them does)."""
MAX_BYTES = 16 << 20
"""What one memo keeps, its packed ids and what its values say they hold (`remember`'s `value_bytes`), the least
recently used dropped first: a hundred 40,000-id sessions."""
MAX_ENTRIES = 256
"""Prompts one memo keeps. A lookup looks at each: the few ids before its shortest checkpoint first (an entry that
differs there cannot match at all), then, for an entry that shares them, a `memcmp` of each length."""
REPLACE_SLACK = 64
"""Ids of a remembered sequence past where a new one leaves it, at most, for the new one to replace it: dropping it
then costs a later lookup at most this many ids read again."""
_TAIL = 16
"""Bytes before a length compared first: prompts that share a long start (a batch's system prompt) differ after it."""


def packed_ids(ids: Sequence[int]) -> bytes | None:
    """The ids as 4-byte integers; None when they are too few to be worth keeping, or not all signed 32-bit integers."""
    return pack_int32(ids) if len(ids) >= MIN_IDS else None


def pack_int32(ids: Sequence[int]) -> bytes | None:
    """The ids as 4-byte integers in native order (`struct`: 0.3 ms for 46,000 ids, `array` took 1.0 ms); None when
    one is out of the int32 range or not an integer. The proxy's sessions pack with it too.

    A long list packed lately is not packed again (`known_packing`): an agent's 40,000-id prompt was packed by the
    answer's check, its session, its prompt scan and its store check, ~1.5 ms each in a busy recorder."""
    packed = known_packing(ids)
    if packed is not None:
        return packed
    try:
        packed = struct.pack(f"={len(ids)}i", *ids)
    except struct.error:
        return None
    if type(ids) is list and _RECENT_MIN_IDS <= len(ids) <= _RECENT_MAX_IDS:
        global _recent
        kept, held = [(ids, len(ids), packed)], len(ids)
        for entry in _recent[: _RECENT - 1]:
            if held + entry[1] > _RECENT_MAX_IDS:
                break
            kept.append(entry)
            held += entry[1]
        _recent = tuple(kept)  # one assignment: safe across threads
    return packed


_RECENT = 4
"""Lists whose packing is kept: a request's prompt is packed within one capture's handling."""
_RECENT_MIN_IDS = 4096
"""Shorter lists pack in microseconds."""
_RECENT_MAX_IDS = 1_000_000
"""Ids of the lists held, at most (their objects and packings: ~40 MB): a longer list is packed every time."""
_recent: tuple[tuple[list[int], int, bytes], ...] = ()
"""(list, its length when packed, its packing), newest first. The list itself is held, so no other list can take its
identity while it is here; id lists are never changed in place in tokview (a capture's are replaced whole), and one
that changed length anyway is packed again."""


def known_packing(ids: Sequence[int]) -> bytes | None:
    """`pack_int32(ids)` when this very list was packed lately, else None (nothing is packed here)."""
    if type(ids) is not list or len(ids) < _RECENT_MIN_IDS:
        return None
    for held, length, packed in _recent:
        if held is ids and length == len(ids):
            return packed
    return None


def last_aligned(packed: bytes, token_id: int, start: int = 0) -> int | None:
    """The index (in ids) of the last `token_id` in the packed ids at or after id `start`; None when there is none.
    `bytes.rfind` in C: a 4-byte match that straddles two ids is skipped."""
    try:
        needle = struct.pack("=i", token_id)
    except struct.error:  # not an id packed ids can hold
        return None
    end = len(packed)
    while (at := packed.rfind(needle, start * _ITEM, end)) >= 0:
        if at % _ITEM == 0:
            return at // _ITEM
        end = at + _ITEM - 1  # a match starting at `at` is not an id: look before it (matches overlap by < 4 bytes)
    return None


@dataclass(frozen=True, slots=True)
class _Entry(Generic[T]):
    lengths: tuple[int, ...]
    """The lengths it can be read at (in ids), longest first: its own and its checkpoints'."""
    value: T
    size: int
    """Bytes counted towards `max_bytes`."""
    gate_from: int
    gate_to: int
    gate: bytes
    """Its packed bytes [gate_from:gate_to): the last few before its shortest length."""


class PrefixMemo(Generic[T]):
    """Values computed over id sequences, found again for a sequence that starts with one of them, or with the part of
    one up to a checkpoint: a harness re-renders the end of the previous prompt (its generation prompt, the text run
    that the answer now continues), so the previous prompt whole is seldom a prefix of the next one. The value must
    be readable at every checkpoint it was remembered with.

    Thread-safe: the batch's writers and the proxy's recorder analyse on their own threads."""

    def __init__(self, max_bytes: int = MAX_BYTES, max_entries: int = MAX_ENTRIES) -> None:
        self.max_bytes, self.max_entries = max_bytes, max_entries
        self._entries: OrderedDict[bytes, _Entry[T]] = OrderedDict()
        self._bytes = 0
        self._lock = threading.Lock()

    def longest(self, packed: bytes) -> tuple[int, bytes, T] | None:
        """(how many ids, the remembered sequence, its value) for the longest remembered sequence or checkpoint of one
        that `packed` starts with; the remembered sequence goes back to `remember` as `replaces`."""
        best: tuple[int, bytes, T] | None = None
        with self._lock:
            for kept, entry in self._entries.items():
                if packed[entry.gate_from : entry.gate_to] != entry.gate:
                    continue  # differs just before its shortest length: it cannot match at any (one slice, in C)
                for length in entry.lengths:
                    if best is not None and length <= best[0]:
                        break
                    if _starts_with(packed, kept, length):
                        best = (length, kept, entry.value)
                        break
            if best is not None:
                self._entries.move_to_end(best[1])
            return best

    def remember(
        self,
        packed: bytes,
        value: T,
        checkpoints: tuple[int, ...] = (),
        *,
        replaces: bytes | None = None,
        value_bytes: int = 0,
    ) -> None:
        """Keep `value` for `packed`, readable at these lengths too (in ids; those outside 1 … its length are not
        kept). `replaces`: a sequence `longest` found, to drop (a session's previous turn, which this one now stands
        for). `value_bytes`: what `value` holds, counted towards `max_bytes` with the packed ids."""
        size, n = len(packed) + value_bytes, len(packed) // _ITEM
        if size > self.max_bytes:
            return
        with self._lock:
            if replaces is not None and replaces != packed:
                self._drop(replaces)
            self._drop(packed)
            lengths = tuple(sorted({n, *(c for c in checkpoints if 0 < c <= n)}, reverse=True))
            gate_to = lengths[-1] * _ITEM
            gate_from = max(0, gate_to - _TAIL)
            self._entries[packed] = _Entry(lengths, value, size, gate_from, gate_to, packed[gate_from:gate_to])
            self._bytes += size
            while self._bytes > self.max_bytes or len(self._entries) > self.max_entries:
                self._drop(next(iter(self._entries)))

    def _drop(self, packed: bytes) -> None:
        entry = self._entries.pop(packed, None)
        if entry is not None:
            self._bytes -= entry.size

    def __len__(self) -> int:
        return len(self._entries)


def stands_for(found: tuple[int, bytes, Any], packed: bytes) -> bytes | None:
    """The remembered sequence a new one replaces, given what `longest` found for it: the found one when the new
    sequence starts with all of it but its last REPLACE_SLACK ids (its generation prompt, re-rendered), so that a
    session keeps one entry, not one per turn; None when the two only share a start (two sessions of one system
    prompt: each keeps its own)."""
    length, kept, _ = found
    return kept if len(kept) // _ITEM - length <= REPLACE_SLACK and kept != packed else None


def _starts_with(packed: bytes, kept: bytes, length: int) -> bool:
    """Whether `packed` starts with `kept`'s first `length` ids: their last few bytes compared first, cheaply."""
    size = length * _ITEM
    if size > len(packed):
        return False
    view = memoryview(kept)
    return packed[max(0, size - _TAIL) : size] == view[max(0, size - _TAIL) : size] and packed.startswith(view[:size])


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
