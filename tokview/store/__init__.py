"""The DuckDB store (contract 3): `Store`, `SampleFilter`, `SampleRow`, `StoredSample`, `SampleIdentity`.

`Store` (and `DEFAULT_DB`) and the schema's `LATEST_VERSION` and `SchemaError` load DuckDB, on first use: a
`--workers` child or a Ray task imports this package for `PartSink` and the store's errors, and never opens the
file (DuckDB's package costs ~50 ms and ~25 MB a process)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from tokview.store.errors import StoreError, StoreFull
from tokview.store.part_sink import PartSink, PartWriter
from tokview.store.sample_rows import STATUSES, SampleFilter, SampleIdentity, SampleRow, StoredSample, UnknownSample

if TYPE_CHECKING:
    from tokview.store.schema import LATEST_VERSION, SchemaError
    from tokview.store.store import DEFAULT_DB, Store

_FROM_SCHEMA = ("LATEST_VERSION", "SchemaError")
_LAZY = ("DEFAULT_DB", "Store", *_FROM_SCHEMA)
"""Names imported on first use (their modules import DuckDB)."""

__all__ = [
    "DEFAULT_DB",
    "LATEST_VERSION",
    "STATUSES",
    "PartSink",
    "PartWriter",
    "SampleFilter",
    "SampleIdentity",
    "SampleRow",
    "SchemaError",
    "Store",
    "StoreError",
    "StoreFull",
    "StoredSample",
    "UnknownSample",
]


def __dir__() -> list[str]:
    return sorted({*globals(), *_LAZY})


def __getattr__(name: str) -> Any:
    if name in _FROM_SCHEMA:
        from tokview.store import schema

        return getattr(schema, name)
    if name in _LAZY:
        from tokview.store import store

        return getattr(store, name)
    raise AttributeError(f"module 'tokview.store' has no attribute {name!r}")
