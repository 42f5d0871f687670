"""The kept turns a new prompt may extend, among those that share its first ids: found without a Python step per turn.

Turns of sessions that share a start (a harness's system prompt) all land in one group. Placing a prompt that extends
none of them (a re-rendered history, a new conversation longer than the system prompt) walked every such turn no
longer than it: over a day's run the book fills to 2,000 sessions (~8,000 turns) and each such request cost 2-19 ms
of the recorder's CPU, growing with the run. Here a group keeps each turn's length and last TAIL_IDS ids in numpy
arrays: one vectorised compare of the prompt's ids at every turn's end picks the few whose end matches, which are then
compared whole (memcmp): 0.04 ms to place a prompt among 2,000 such sessions (was 5 ms). A small group (fewer than
VECTOR_FROM turns) is scanned in Python, which costs less there.
"""

from __future__ import annotations

from typing import Generic, Protocol, TypeVar

import numpy as np

TAIL_IDS = 4
"""A turn's last ids compared before its whole sequence: turns that share a start differ near their end."""
VECTOR_FROM = 128
"""Groups this large are searched with numpy (~20-30 us up to 8,000 turns); smaller ones in Python (~0.2 us a turn)."""
_GONE = np.iinfo(np.int64).max
"""The length of a removed slot: past any prompt, so never a candidate."""


class Turn(Protocol):
    """What the index reads of a kept turn (`sessions._Head`)."""

    sequence: bytes | memoryview
    order: int
    slot: int


T = TypeVar("T", bound=Turn)


class PrefixGroup(Generic[T]):
    """The kept turns whose ids begin with one key; `extended_by(packed)` gives those `packed` starts with."""

    def __init__(self) -> None:
        self.turns: list[T | None] = []
        """Per slot its turn (None once removed)."""
        self._ends: list[bytes] = []
        """Per slot its turn's last TAIL_IDS ids as bytes: the small group's scan compares them in place first."""
        self._lengths = np.empty(16, dtype=np.int64)
        """Per slot its turn's length in ids (`_GONE` once removed)."""
        self._tails = np.empty((TAIL_IDS, 16), dtype=np.uint32)
        """Per slot its turn's last TAIL_IDS ids, one row per position (each row contiguous: gathered alone)."""
        self.odd: list[T] = []
        """Turns not in the arrays, compared whole: shorter than TAIL_IDS ids, or not 4-byte ids (`sessions._pack`'s
        JSON for ids that are not 32-bit ints)."""
        self.alive = 0
        self._shortest = _GONE
        """No turn in the arrays is shorter (in ids; a removal leaves it lower than it may be): a new conversation's
        prompt, shorter than every kept turn of the sessions that share its system prompt, is then done at once."""

    def __len__(self) -> int:
        return self.alive + len(self.odd)

    def add(self, turn: T) -> None:
        size = len(turn.sequence)
        if size % 4 or size < TAIL_IDS * 4:
            turn.slot = -1
            self.odd.append(turn)
            return
        n = len(self.turns)
        if n == len(self._lengths):
            self._lengths = np.concatenate([self._lengths, np.empty(n, dtype=np.int64)])
            self._tails = np.concatenate([self._tails, np.empty((TAIL_IDS, n), dtype=np.uint32)], axis=1)
        self._lengths[n] = size // 4
        self._shortest = min(self._shortest, size // 4)
        end = bytes(turn.sequence[size - TAIL_IDS * 4 :])
        self._tails[:, n] = np.frombuffer(end, dtype=np.uint32)
        turn.slot = n
        self.turns.append(turn)
        self._ends.append(end)
        self.alive += 1

    def remove(self, turn: T) -> None:
        slot = turn.slot
        if slot < 0:
            self.odd = [t for t in self.odd if t is not turn]
        elif slot < len(self.turns) and self.turns[slot] is turn:
            self.turns[slot] = None
            self._lengths[slot] = _GONE
            self.alive -= 1
            if len(self.turns) > VECTOR_FROM and self.alive * 2 < len(self.turns):
                self._compact()

    def _compact(self) -> None:
        kept = [t for t in self.turns if t is not None]
        self.turns, self._ends, self.alive, self._shortest = [], [], 0, _GONE
        self._lengths = np.empty(max(16, len(kept)), dtype=np.int64)
        self._tails = np.empty((TAIL_IDS, len(self._lengths)), dtype=np.uint32)
        for turn in kept:
            self.add(turn)

    def extended_by(self, packed: bytes) -> list[T]:
        """The turns whose ids `packed` starts with (in no particular order)."""
        whole = [t for t in self.odd if packed.startswith(t.sequence)]
        if len(packed) % 4 or len(packed) < TAIL_IDS * 4:
            return whole + [t for t in self.turns if t is not None and packed.startswith(t.sequence)]
        if len(self.turns) < VECTOR_FROM:  # its last ids at its end, compared in place, then the whole turn
            size, tail = len(packed), TAIL_IDS * 4
            pairs = zip(self.turns, self._ends, strict=True)
            return whole + [
                t
                for t, end in pairs
                if t is not None
                and len(t.sequence) <= size
                and packed.startswith(end, len(t.sequence) - tail)
                and packed.startswith(t.sequence)
            ]
        if len(packed) // 4 < self._shortest:
            return whole
        ids = np.frombuffer(packed, dtype=np.uint32)
        n = len(self.turns)
        lengths = self._lengths[:n]
        # a turn longer than the prompt (a removed slot's is) is read at the prompt's end, then left by its length
        ends = np.minimum(lengths, len(ids))
        # The id before each turn's last (its last is mostly the stop id every turn ends with) first: a few turns
        # pass, whose other tail ids and length are then checked.
        slots = np.flatnonzero(ids[ends - 2] == self._tails[TAIL_IDS - 2, :n])
        if len(slots):
            at = ends[slots]
            keep = lengths[slots] <= len(ids)
            for k in (1, 3, 4):
                keep &= ids[at - k] == self._tails[TAIL_IDS - k, slots]
            slots = slots[keep]
        found = [self.turns[s] for s in slots.tolist()]
        return whole + [t for t in found if t is not None and packed.startswith(t.sequence)]
