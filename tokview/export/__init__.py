"""Exports every trainer reads: speculators (token-exact, default), SpecForge, ShareGPT, Kimi inline, Parquet."""

from tokview.export.formats import Refused
from tokview.export.registry import FORMATS
from tokview.export.writer import SELECTIONS, ExportError, ExportResult, export, sidecar

__all__ = ["FORMATS", "SELECTIONS", "ExportError", "ExportResult", "Refused", "export", "sidecar"]
