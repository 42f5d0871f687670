"""The headless bulk producer (contract 4): `run_batch(config, store, prompts, on_progress, cancel)`."""

from tokview.batch.config import BatchConfig, BatchProgress, BatchSummary
from tokview.batch.inputs import InputError, read_prompts
from tokview.batch.runner import plan, run_batch

__all__ = ["BatchConfig", "BatchProgress", "BatchSummary", "InputError", "plan", "read_prompts", "run_batch"]
