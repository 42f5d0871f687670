"""The headless bulk producer (contract 4): `run_batch(config, store, prompts, on_progress, cancel)`.

The names below load on first use (PEP 562): `tokview batch` parses its flags and starts loading the
tokenizer (`preload.py`) before the capture machinery, the servers layer and DuckDB are imported.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from tokview.batch.config import BatchConfig, BatchProgress, BatchSummary
    from tokview.batch.inputs import InputError, read_prompts
    from tokview.batch.runner import plan, run_batch

_WHERE = {
    "BatchConfig": "config",
    "BatchProgress": "config",
    "BatchSummary": "config",
    "InputError": "inputs",
    "read_prompts": "inputs",
    "plan": "runner",
    "run_batch": "runner",
}

__all__ = ["BatchConfig", "BatchProgress", "BatchSummary", "InputError", "plan", "read_prompts", "run_batch"]


def __getattr__(name: str) -> Any:
    if name not in _WHERE:
        raise AttributeError(f"module 'tokview.batch' has no attribute {name!r}")
    return getattr(importlib.import_module(f"tokview.batch.{_WHERE[name]}"), name)
