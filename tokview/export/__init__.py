"""Exports every trainer reads: speculators (token-exact, default), SpecForge, ShareGPT, Kimi inline, Parquet."""

from tokview.export.export_error import ExportError
from tokview.export.formats import Refused
from tokview.export.registry import FORMATS
from tokview.export.writer import ExportResult, export, sidecar
from tokview.store.export_rows import SELECTIONS

__all__ = ["FORMATS", "SELECTIONS", "ExportError", "ExportResult", "Refused", "export", "sidecar"]
