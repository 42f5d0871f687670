"""Every row shape of a JSONL export inside the first read of a trainer's JSON loader.

speculators' `prepare_data.py` and SpecForge read a JSONL data file with `datasets.load_dataset("json")`, which
reads the file LOADER_CHUNK_BYTES at a time and fixes every column's type from the first read. A key a later row has
and no row of that read had ("column names don't match"), or a value whose rows there were all null or empty lists
("Couldn't cast array of type int64 to null"), fails the whole load. Rows differ in shape for good reasons: a chain's
turn numbers beside single-turn samples, logprobs on one run's samples only, tool calls in some conversations.

The writer notes each row's shape (`RowShapes.note`): the (path, JSON type) pairs of its non-null values. The first
row that brings a pair no row before it had is an exemplar; when one lies past the first read, the exemplars are
moved to the front of the file (`move_exemplars_first`), the other rows keep their order. Within one read the loader
takes the union of the rows' types, so the first read then covers every row. A file no longer than one read needs
nothing (its rows are all in it).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

LOADER_CHUNK_BYTES = 10 << 20
"""`datasets`' JSON builder's `chunksize` (10 MiB since 2.x): the read whose rows fix the columns' types."""


def shape_pairs(value: Any, path: str = "") -> Iterator[tuple[str, str]]:
    """(path, type) for every non-null value under `value`; a list of numbers or strings by its first item (the
    exports' id, mask and logprob lists hold one type), a list of lists by its first non-empty one (the top-K
    alternatives of each position: walked item by item, a 32,000-position row cost milliseconds), a list of objects
    by every item."""
    if isinstance(value, dict):
        yield path, "object"
        for key, item in value.items():
            if item is not None:
                yield from shape_pairs(item, f"{path}.{key}")
    elif isinstance(value, list):
        yield path, "list"
        if not value:
            return
        if isinstance(value[0], dict):  # messages, turns, calls: their keys differ from item to item
            for item in value:
                if item is not None:
                    yield from shape_pairs(item, f"{path}[]")
        elif isinstance(value[0], list):  # per-position alternatives: one shape, by the first item that has any
            first_full = next((item for item in value if item), value[0])
            yield from shape_pairs(first_full, f"{path}[]")
        else:
            first = next((item for item in value if item is not None), None)
            if first is not None:
                yield f"{path}[]", type(first).__name__
    elif value is not None:
        yield path, type(value).__name__


@dataclass
class RowShapes:
    """The exemplar rows of a file being written, as (byte offset, length)."""

    offset: int = 0
    seen: set[tuple[str, str]] = field(default_factory=set)
    exemplars: list[tuple[int, int]] = field(default_factory=list)

    def note(self, record: Any, length: int) -> None:
        """A row of `length` bytes written at the current end of the file."""
        pairs = set(shape_pairs(record))
        if not pairs <= self.seen:
            self.seen |= pairs
            self.exemplars.append((self.offset, length))
        self.offset += length

    def late_exemplars(self) -> bool:
        """Whether a row shape first appears past the loader's first read."""
        return self.late_count() > 0

    def late_count(self) -> int:
        """The rows whose shape first appears past the loader's first read."""
        return sum(1 for start, _ in self.exemplars if start >= LOADER_CHUNK_BYTES)

    def front_bytes(self) -> int:
        return sum(length for _, length in self.exemplars)


def move_exemplars_first(path: Path, shapes: RowShapes) -> int:
    """Rewrite `path` with its exemplar rows first, the rest in their order; the number of rows moved ahead (those
    that were past the first read). Written to a file beside it and renamed over it: an export's temp file
    `.NAME.PID.RANDOM.partial` gets `.NAME.PID.RANDOM.rows.partial`, which a later export removes if this one is
    killed (`output.clean_stale_partials`)."""
    moving = {start for start, _ in shapes.exemplars}
    moved = shapes.late_count()
    stem = path.name.removesuffix(".partial")
    temp = path.with_name(f"{stem}.rows.partial")
    try:
        with open(path, "rb") as src, open(temp, "wb") as out:
            for start, length in shapes.exemplars:
                src.seek(start)
                out.write(src.read(length))
            src.seek(0)
            offset = 0
            for line in src:
                if offset not in moving:
                    out.write(line)
                offset += len(line)
        os.replace(temp, path)
    finally:
        temp.unlink(missing_ok=True)
    return moved


def shapes_section(moved: int, shapes: RowShapes) -> dict[str, Any]:
    """The manifest's `row_shapes`: how many rows were moved ahead, and whether the front fits the first read."""
    front = shapes.front_bytes()
    last = shapes.exemplars[-1][1] if shapes.exemplars else 0
    return {
        "moved_first": moved,
        "front_rows": len(shapes.exemplars),
        "front_bytes": front,
        "loader_read_bytes": LOADER_CHUNK_BYTES,
        "fits": front - last < LOADER_CHUNK_BYTES,  # the read goes on to the end of the line it stops in
    }
