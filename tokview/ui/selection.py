"""The marked samples of the list: ids, and the sample the last mark was set on (where a range starts).

Why ids and not row numbers: a mark must survive a reload, a new order or a filter change (a curator marks
under one filter, narrows it, marks more). No Textual here: the list renders from it, the app acts on it.
"""

from __future__ import annotations

from collections.abc import Iterable


class Marks:
    def __init__(self) -> None:
        self._ids: set[str] = set()
        self.anchor: int | None = None
        """The row index the last mark was set on: `mark range` runs from it to the cursor, while that row still
        holds `anchor_id` (a new filter or order moves it: the list then finds where that sample is now)."""
        self.anchor_id: str | None = None

    def __len__(self) -> int:
        return len(self._ids)

    def __contains__(self, sample_id: object) -> bool:
        return sample_id in self._ids

    def toggle(self, sample_id: str, index: int) -> bool:
        """Mark or unmark one sample; True when it is marked now."""
        self.set_anchor(index, sample_id)
        if sample_id in self._ids:
            self._ids.discard(sample_id)
            return False
        self._ids.add(sample_id)
        return True

    def add(self, sample_ids: Iterable[str]) -> None:
        self._ids.update(sample_ids)

    def set_anchor(self, index: int, sample_id: str | None) -> None:
        self.anchor, self.anchor_id = index, sample_id

    def clear(self) -> None:
        self._ids.clear()
        self.anchor = self.anchor_id = None

    def ids(self) -> list[str]:
        return sorted(self._ids)
