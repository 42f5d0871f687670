"""The DuckDB store (contract 3): `Store`, `SampleFilter`, `SampleRow`, `StoredSample`."""

from tokview.store.records import STATUSES, SampleFilter, SampleRow, StoredSample, UnknownSample
from tokview.store.schema import LATEST_VERSION, SchemaError
from tokview.store.store import DEFAULT_DB, PartSink, Store, StoreError, StoreFull

__all__ = [
    "DEFAULT_DB",
    "LATEST_VERSION",
    "STATUSES",
    "PartSink",
    "SampleFilter",
    "SampleRow",
    "SchemaError",
    "Store",
    "StoreError",
    "StoreFull",
    "StoredSample",
    "UnknownSample",
]
