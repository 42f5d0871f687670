"""`ExportError`, in a module of its own so that every part of an export (the format registry, its
pre-flight checks, the writer) raises it where the problem is found, without importing the writer."""

from __future__ import annotations

from tokview.errors import TokviewError


class ExportError(TokviewError):
    """The export cannot be made (unknown format, nothing selected, unwritable path)."""

    title = "export"
